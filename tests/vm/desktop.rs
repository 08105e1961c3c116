//! A VM on the desktops people run (inside L1, which is laid out for it:
//! it is a throwaway machine, restored after each test): a `--root host`
//! VM on a systemd-resolved host reads `/etc/resolv.conf` as a regular
//! file, runs `/opt` and `/nix/store` programs and NixOS's
//! `/run/current-system`; and a VM boots from the image `boxdesk images
//! fetch` installed from a release on loopback.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{can_boot, kvm_env};

/// Paths this test made or moved aside on the host, put back on drop.
#[derive(Default)]
struct Layout {
    made: Vec<PathBuf>,
    moved: Vec<(PathBuf, PathBuf)>,
}

impl Layout {
    fn file(&mut self, path: &str, text: &str, mode: u32) {
        let p = Path::new(path);
        self.dirs(p.parent().unwrap());
        std::fs::write(p, text).unwrap();
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        self.made.push(p.to_owned());
    }

    fn link(&mut self, path: &str, target: &str) {
        let p = Path::new(path);
        if std::fs::symlink_metadata(p).is_ok() {
            let aside = p.with_extension("boxdesk-test-aside");
            std::fs::rename(p, &aside).unwrap();
            self.moved.push((aside, p.to_owned()));
        } else {
            self.made.push(p.to_owned());
        }
        self.dirs(p.parent().unwrap());
        std::os::unix::fs::symlink(target, p).unwrap();
    }

    fn dirs(&mut self, dir: &Path) {
        let mut missing = Vec::new();
        let mut d = Some(dir);
        while let Some(p) = d.filter(|p| !p.exists()) {
            missing.push(p.to_owned());
            d = p.parent();
        }
        std::fs::create_dir_all(dir).unwrap();
        // Removed deepest first (made holds them in removal order).
        self.made.extend(missing);
    }
}

impl Drop for Layout {
    fn drop(&mut self) {
        for p in &self.made {
            let _ = std::fs::remove_file(p).or_else(|_| std::fs::remove_dir(p));
        }
        for (aside, p) in &self.moved {
            let _ = std::fs::remove_file(p);
            let _ = std::fs::rename(aside, p);
        }
    }
}

#[test]
fn a_root_host_vm_on_a_resolved_nixos_like_host_reads_resolv_conf_and_runs_opt_and_nix_programs() {
    let test =
        "a_root_host_vm_on_a_resolved_nixos_like_host_reads_resolv_conf_and_runs_opt_and_nix_programs";
    if !can_boot(test) {
        return;
    }
    if !crate::support::is_root() {
        println!("skipped: {test}: lays the host out as a desktop (root; L1 is throwaway)");
        return;
    }
    let mut l = Layout::default();
    l.file(
        "/run/systemd/resolve/stub-resolv.conf",
        "nameserver 127.0.0.53\nsearch .\n",
        0o644,
    );
    l.file(
        "/run/systemd/resolve/io.systemd.Resolve",
        "not for guests",
        0o644,
    );
    l.link(
        "/etc/resolv.conf",
        "../run/systemd/resolve/stub-resolv.conf",
    );
    l.file(
        "/opt/boxdesk-tool/bin/hello",
        "#!/bin/sh\necho hello from opt\n",
        0o755,
    );
    l.file(
        "/nix/store/1abc-hello/bin/hello",
        "#!/bin/sh\necho hello from the store\n",
        0o755,
    );
    l.link(
        "/nix/store/3abc-system/sw/bin/hello",
        "/nix/store/1abc-hello/bin/hello",
    );
    l.link("/run/current-system", "/nix/store/3abc-system");

    let env = kvm_env();
    let sb = env.start("desk", &["--backend", "kvm", "--root", "host"]);
    let info = env.info("desk");
    assert!(
        info["host_system"].contains("/opt") && info["host_system"].contains("/nix"),
        "{info:?}"
    );
    assert_eq!(info["etc_copies"], "/run/systemd/resolve", "{info:?}");
    let out = sb.sh(
        "test -L /etc/resolv.conf && cat /etc/resolv.conf; ls -A /run/systemd/resolve; \
         /opt/boxdesk-tool/bin/hello; /nix/store/1abc-hello/bin/hello; /run/current-system/sw/bin/hello",
    );
    assert_eq!(
        out.stdout,
        "nameserver 127.0.0.53\nsearch .\nstub-resolv.conf\nhello from opt\nhello from the store\nhello from the store\n",
        "{out}"
    );
}

/// Fetching needs `curl`, which only the x86_64 L1 can borrow from its
/// host: the test is not built for other arches (not skipped: absent).
#[cfg(target_arch = "x86_64")]
mod fetch {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    /// A `curl` for a boxdesk in L1, whose busybox has none: the host's own,
    /// run through the host's loader (x86_64 L1 only, whose host root is at
    /// /run/host).
    fn curl_in(dir: &Path) -> Option<String> {
        let path = std::env::var("PATH").unwrap_or_default();
        if path.split(':').any(|d| Path::new(d).join("curl").is_file()) {
            return Some(path);
        }
        let lib = Path::new("/run/host/usr/lib/x86_64-linux-gnu");
        let host_curl = Path::new("/run/host/usr/bin/curl");
        if !host_curl.is_file() || !lib.join("ld-linux-x86-64.so.2").is_file() {
            return None;
        }
        std::fs::create_dir_all(dir).unwrap();
        let shim = dir.join("curl");
        std::fs::write(
            &shim,
            format!(
                "#!/bin/sh\nexec {l}/ld-linux-x86-64.so.2 --library-path {l} {c} \"$@\"\n",
                l = lib.display(),
                c = host_curl.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
        Some(format!("{}:{path}", dir.display()))
    }

    #[test]
    fn a_vm_boots_from_the_image_images_fetch_installed_from_a_release_on_loopback() {
        let test = "a_vm_boots_from_the_image_images_fetch_installed_from_a_release_on_loopback";
        if !super::can_boot(test) {
            return;
        }
        let env = super::kvm_env();
        let Some(path) = curl_in(&env.root().join("curl")) else {
            println!("skipped: {test}: no curl here, nor the host's under /run/host");
            return;
        };
        // The release: this image's files as dist/images.sh packs them.
        let arch = "x86_64";
        let dir = super::super::image_dir();
        let mut manifest = std::fs::read_to_string(dir.join("manifest")).unwrap();
        manifest.push_str(&format!("boxdesk_version={}\n", env!("CARGO_PKG_VERSION")));
        let reg = tar::EntryType::Regular;
        let entries = vec![
            (
                format!("{arch}/initramfs.cpio.gz"),
                reg,
                std::fs::read(dir.join("initramfs.cpio.gz")).unwrap(),
            ),
            (format!("{arch}/manifest"), reg, manifest.into_bytes()),
            (
                format!("{arch}/vmlinux"),
                reg,
                std::fs::read(dir.join("vmlinux")).unwrap(),
            ),
        ];
        let release = crate::images::Release::serve();
        release.publish(arch, &crate::images::targz(&entries));
        // A copy of boxdesk outside any checkout (one in target/ also looks in
        // target/images), no image dir named: only the fetched image exists.
        let bin = env.root().join("bin/boxdesk");
        std::fs::create_dir_all(bin.parent().unwrap()).unwrap();
        std::fs::copy(crate::support::bin(), &bin).unwrap();
        let data = env.root().join("data");
        let run = |args: &[&str]| {
            let mut c = env.cmd(args);
            c.env("XDG_DATA_HOME", &data)
                .env("PATH", &path)
                .env_remove("BOXDESK_IMAGE_DIR")
                .env_remove("BOXDESK_RELEASE_URL")
                .env_remove("http_proxy")
                .env_remove("HTTP_PROXY");
            let mut c2 = std::process::Command::new(&bin);
            c2.args(c.get_args());
            for (k, v) in c.get_envs() {
                match v {
                    Some(v) => c2.env(k, v),
                    None => c2.env_remove(k),
                };
            }
            c2.stdin(std::process::Stdio::null());
            crate::support::output(c2)
        };
        let fetched = run(&["images", "fetch", "--from", &release.url(), "--arch", arch]);
        assert_eq!(fetched.code(), 0, "{fetched}");
        let installed = data.join("boxdesk/images").join(arch);
        assert!(installed.join("vmlinux").is_file(), "{fetched}");
        let out = run(&["run", "--backend", "kvm", "--", "echo", "booted"]);
        assert_eq!((out.code(), out.stdout.as_str()), (0, "booted\n"), "{out}");
    }
}
