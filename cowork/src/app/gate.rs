//! The support gate the app evaluates before it dials any Cowork helper,
//! item by item as the app does it: the arch's `qemu-system-*` on `PATH`,
//! OVMF (AAVMF on aarch64) firmware at the paths the app probes,
//! `virtiofsd` at `/usr/libexec/virtiofsd` or `/usr/bin/virtiofsd` (the
//! app's bundled copy only on Ubuntu 22.x), and `/dev/kvm` and
//! `/dev/vhost-vsock`, present and read-write for this user. When any item
//! fails the app reports Cowork as unsupported ("Cowork requires QEMU")
//! and never starts its helper — boxdesk or not.
//!
//! Where an item fails, [`Item::fix`] says what makes it pass: the
//! package, or a link where the thing is installed somewhere the app does
//! not look. A community package started with `COWORK_VM_BACKEND=bwrap`
//! skips the gate ([`bypass`]).
//!
//! This module only reads; every path can be looked up under another
//! root (a chroot, an image) with [`Probe::root`].

use std::ffi::{CString, OsString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// What and where to probe.
#[derive(Debug, Clone)]
pub struct Probe {
    /// Every absolute path is looked up under this (`/` for this machine).
    pub root: PathBuf,
    /// The `PATH` whose entries are searched for qemu.
    pub path: Option<OsString>,
    /// The CPU arch (`std::env::consts::ARCH`).
    pub arch: String,
    /// The app's resources directory, where its bundled `virtiofsd` is.
    pub resources: Option<PathBuf>,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            root: PathBuf::from("/"),
            path: std::env::var_os("PATH"),
            arch: std::env::consts::ARCH.to_owned(),
            resources: None,
        }
    }
}

/// One item of the gate.
#[derive(Debug, Clone, Serialize)]
pub struct Item {
    /// `qemu`, `firmware`, `virtiofsd`, `kvm` or `vhost-vsock`.
    pub name: &'static str,
    /// Whether it passes.
    pub ok: bool,
    /// What the app looks at, in its order.
    pub probed: Vec<String>,
    /// What passed, when one did.
    pub found: Option<PathBuf>,
    /// What was seen, in one line.
    pub detail: String,
    /// What makes it pass, when it fails.
    pub fix: Option<String>,
}

/// The whole gate.
#[derive(Debug, Clone, Serialize)]
pub struct Gate {
    /// The arch it was evaluated for.
    pub arch: String,
    /// Every item, in the app's order.
    pub items: Vec<Item>,
}

impl Gate {
    /// Whether the app will dial its helper (every item passes).
    pub fn passes(&self) -> bool {
        self.items.iter().all(|i| i.ok)
    }
}

/// Per-arch names: qemu binary, firmware paths, the Debian/Ubuntu, Fedora
/// and Arch packages of qemu and firmware.
struct Arch {
    qemu: &'static str,
    firmware: &'static [&'static str],
    /// Where other distributions put the same firmware.
    elsewhere: &'static [&'static str],
    qemu_packages: &'static str,
    firmware_packages: &'static str,
}

const X86_64: Arch = Arch {
    qemu: "qemu-system-x86_64",
    firmware: &[
        "/usr/share/OVMF/OVMF_CODE_4M.fd",
        "/usr/share/OVMF/OVMF_CODE.fd",
    ],
    elsewhere: &[
        "/usr/share/edk2/ovmf/OVMF_CODE.fd",
        "/usr/share/edk2/x64/OVMF_CODE.4m.fd",
        "/usr/share/edk2-ovmf/x64/OVMF_CODE.fd",
        "/usr/share/edk2/OvmfX64/OVMF_CODE.fd",
    ],
    qemu_packages: "Debian/Ubuntu `sudo apt install qemu-system-x86`, Fedora `sudo dnf install qemu-kvm`, Arch `sudo pacman -S qemu-full`",
    firmware_packages: "Debian/Ubuntu `sudo apt install ovmf`",
};

const AARCH64: Arch = Arch {
    qemu: "qemu-system-aarch64",
    firmware: &["/usr/share/AAVMF/AAVMF_CODE.fd"],
    elsewhere: &[],
    qemu_packages: "Debian/Ubuntu `sudo apt install qemu-system-arm`, Fedora `sudo dnf install qemu-system-aarch64`, Arch `sudo pacman -S qemu-full`",
    firmware_packages: "Debian/Ubuntu `sudo apt install qemu-efi-aarch64`",
};

/// Where the app looks for `virtiofsd`, in order (read access).
pub const VIRTIOFSD: [&str; 2] = ["/usr/libexec/virtiofsd", "/usr/bin/virtiofsd"];
/// Where distributions put `virtiofsd` that the app does not look.
const VIRTIOFSD_ELSEWHERE: [&str; 2] = ["/usr/lib/qemu/virtiofsd", "/usr/lib/virtiofsd"];
/// Qemu under another name, where the app does not look (Fedora, RHEL).
const QEMU_ELSEWHERE: [&str; 2] = ["/usr/libexec/qemu-kvm", "/usr/bin/qemu-kvm"];

impl Probe {
    /// `p` (absolute) under the root.
    fn at(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    /// Shows a probed path as the app sees it (without the root).
    fn shown(&self, p: &Path) -> PathBuf {
        match p.strip_prefix(&self.root) {
            Ok(rel) if self.root != Path::new("/") => Path::new("/").join(rel),
            _ => p.to_owned(),
        }
    }
}

/// `access(2)` by the effective ids (`mode`: `R_OK`, `W_OK`, `X_OK`).
fn can(path: &Path, mode: libc::c_int) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: c is a valid C string; faccessat only reads it.
    unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), mode, libc::AT_EACCESS) == 0 }
}

fn is_file(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file())
}

/// Evaluates every item of the gate.
pub fn evaluate(p: &Probe) -> Gate {
    let arch = match p.arch.as_str() {
        "x86_64" => Some(&X86_64),
        "aarch64" => Some(&AARCH64),
        _ => None,
    };
    let Some(a) = arch else {
        let item = Item {
            name: "arch",
            ok: false,
            probed: vec![p.arch.clone()],
            found: None,
            detail: format!(
                "the app's Cowork runs on x86_64 and aarch64, not {}",
                p.arch
            ),
            fix: None,
        };
        return Gate {
            arch: p.arch.clone(),
            items: vec![item],
        };
    };
    Gate {
        arch: p.arch.clone(),
        items: vec![
            qemu(p, a),
            firmware(p, a),
            virtiofsd(p),
            device(p, "kvm", "/dev/kvm"),
            device(p, "vhost-vsock", "/dev/vhost-vsock"),
        ],
    }
}

fn qemu(p: &Probe, a: &Arch) -> Item {
    let dirs: Vec<PathBuf> = p
        .path
        .as_ref()
        .map(|path| {
            std::env::split_paths(path)
                .filter(|d| d.is_absolute())
                .collect()
        })
        .unwrap_or_default();
    let shown_path = dirs
        .iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(":");
    let probed = vec![format!("{} on PATH ({shown_path})", a.qemu)];
    let found = dirs
        .iter()
        .map(|d| p.at(&d.join(a.qemu).to_string_lossy()))
        .find(|f| is_file(f) && can(f, libc::X_OK));
    if let Some(f) = found {
        let f = p.shown(&f);
        return Item {
            name: "qemu",
            ok: true,
            probed,
            detail: format!("{} (the app looks on its own session's PATH)", f.display()),
            found: Some(f),
            fix: None,
        };
    }
    let elsewhere = QEMU_ELSEWHERE.iter().find(|q| is_file(&p.at(q)));
    let fix = match elsewhere {
        Some(q) => format!("sudo ln -s {q} /usr/local/bin/{}", a.qemu),
        None => format!("install it: {}", a.qemu_packages),
    };
    let detail = match elsewhere {
        Some(q) => format!(
            "{} is not on PATH; qemu is installed as {q}, which the app does not look for",
            a.qemu
        ),
        None => format!("{} is not on PATH", a.qemu),
    };
    Item {
        name: "qemu",
        ok: false,
        probed,
        found: None,
        detail,
        fix: Some(fix),
    }
}

/// The variable-store template the app derives from a firmware path.
fn vars_of(code: &str) -> String {
    code.replace("_CODE", "_VARS")
}

fn firmware(p: &Probe, a: &Arch) -> Item {
    let probed: Vec<String> = a.firmware.iter().map(|f| (*f).to_owned()).collect();
    if let Some(f) = a.firmware.iter().find(|f| is_file(&p.at(f))) {
        let vars = vars_of(f);
        let has_vars = is_file(&p.at(&vars));
        return Item {
            name: "firmware",
            ok: true,
            probed,
            found: Some(PathBuf::from(f)),
            detail: format!(
                "{f}; its variable-store template {vars} is {}",
                if has_vars { "there too" } else { "missing" }
            ),
            fix: None,
        };
    }
    let elsewhere = a.elsewhere.iter().find(|f| is_file(&p.at(f)));
    let (detail, fix) = match elsewhere {
        Some(e) => {
            let want = a.firmware[a.firmware.len() - 1];
            let dir = Path::new(want).parent().map_or(Path::new("/"), |d| d);
            let mut fix = format!("sudo mkdir -p {} && sudo ln -s {e} {want}", dir.display());
            let (evars, wvars) = (vars_of(e), vars_of(want));
            if evars != *e && is_file(&p.at(&evars)) {
                fix.push_str(&format!(" && sudo ln -s {evars} {wvars}"));
            }
            (
                format!("none of the probed files exists; firmware is installed at {e}, where the app does not look"),
                fix,
            )
        }
        None => (
            "none of the probed files exists".to_owned(),
            format!("install it: {}", a.firmware_packages),
        ),
    };
    Item {
        name: "firmware",
        ok: false,
        probed,
        found: None,
        detail,
        fix: Some(fix),
    }
}

/// Whether `/etc/os-release` under the root says Ubuntu 22.x (where the
/// app also takes its bundled `virtiofsd`).
fn ubuntu_22(p: &Probe) -> bool {
    let text = std::fs::read_to_string(p.at("/etc/os-release")).unwrap_or_default();
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim_matches('"').to_owned())
    };
    field("ID=").as_deref() == Some("ubuntu")
        && field("VERSION_ID=").is_some_and(|v| v.starts_with("22."))
}

fn virtiofsd(p: &Probe) -> Item {
    let mut probed: Vec<String> = VIRTIOFSD.iter().map(|f| (*f).to_owned()).collect();
    let bundled = p.resources.as_ref().map(|r| r.join("virtiofsd"));
    if let Some(b) = &bundled {
        probed.push(format!("{} (Ubuntu 22.x only)", b.display()));
    }
    if let Some(f) = VIRTIOFSD
        .iter()
        .find(|f| p.at(f).exists() && can(&p.at(f), libc::R_OK))
    {
        return Item {
            name: "virtiofsd",
            ok: true,
            probed,
            found: Some(PathBuf::from(f)),
            detail: (*f).to_owned(),
            fix: None,
        };
    }
    if let Some(b) = bundled.filter(|b| ubuntu_22(p) && can(b, libc::X_OK)) {
        return Item {
            name: "virtiofsd",
            ok: true,
            probed,
            detail: format!("the app's own copy, {} (Ubuntu 22.x)", b.display()),
            found: Some(b),
            fix: None,
        };
    }
    let elsewhere = VIRTIOFSD_ELSEWHERE.iter().find(|f| is_file(&p.at(f)));
    let (detail, fix) = match elsewhere {
        Some(e) => (
            format!("not at the probed paths; it is installed at {e}, where the app does not look"),
            format!("sudo ln -s {e} /usr/bin/virtiofsd"),
        ),
        None => (
            "not at the probed paths".to_owned(),
            "install it: Debian/Ubuntu `sudo apt install virtiofsd`, Fedora `sudo dnf install virtiofsd`, Arch `sudo pacman -S virtiofsd`".to_owned(),
        ),
    };
    Item {
        name: "virtiofsd",
        ok: false,
        probed,
        found: None,
        detail,
        fix: Some(fix),
    }
}

fn device(p: &Probe, name: &'static str, dev: &str) -> Item {
    let at = p.at(dev);
    let probed = vec![dev.to_owned()];
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if std::fs::metadata(&at).is_err() {
        let fix = match name {
            "kvm" => "turn on virtualization (VT-x/AMD-V) in the firmware setup, then `sudo modprobe kvm_intel` (or kvm_amd)",
            _ => "`sudo modprobe vhost_vsock`, and `echo vhost_vsock | sudo tee /etc/modules-load.d/vhost_vsock.conf` to keep it",
        };
        return Item {
            name,
            ok: false,
            probed,
            found: None,
            detail: format!("{dev} does not exist"),
            fix: Some(fix.to_owned()),
        };
    }
    if can(&at, libc::R_OK | libc::W_OK) {
        return Item {
            name,
            ok: true,
            probed,
            found: Some(PathBuf::from(dev)),
            detail: format!("{dev}, read-write for uid {uid}"),
            fix: None,
        };
    }
    let fix = match name {
        "kvm" => "`sudo usermod -aG kvm $USER`, then log in again".to_owned(),
        _ => format!(
            "a udev rule such as `KERNEL==\"vhost-vsock\", GROUP=\"kvm\", MODE=\"0660\"` in /etc/udev/rules.d/ (and membership of kvm), then `sudo udevadm trigger {dev}`"
        ),
    };
    Item {
        name,
        ok: false,
        probed,
        found: None,
        detail: format!("{dev} exists but uid {uid} cannot read and write it"),
        fix: Some(fix),
    }
}

/// When a community package skips the gate: claude-desktop-debian's
/// launcher with `COWORK_VM_BACKEND=bwrap` (in the environment or in its
/// `~/.config/claude-desktop-debian/environment`) reports Cowork supported
/// and starts `$COWORK_NODE_PATH <resources>/cowork-vm-service.js -socket
/// PATH` instead of the helper. Returns where the setting was seen and
/// `COWORK_NODE_PATH` where set.
pub fn bypass(home: Option<&Path>) -> Option<(String, Option<String>)> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let file = home.map(|h| h.join(".config/claude-desktop-debian/environment"));
    let text = file
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok())
        .unwrap_or_default();
    let from_file = |k: &str| {
        text.lines()
            .filter_map(|l| l.trim().strip_prefix(k)?.strip_prefix('='))
            .map(|v| v.trim().trim_matches('"').to_owned())
            .next_back()
    };
    let node = env("COWORK_NODE_PATH").or_else(|| from_file("COWORK_NODE_PATH"));
    if env("COWORK_VM_BACKEND").as_deref() == Some("bwrap") {
        return Some((
            "COWORK_VM_BACKEND=bwrap in the environment".to_owned(),
            node,
        ));
    }
    if from_file("COWORK_VM_BACKEND").as_deref() == Some("bwrap") {
        let f = file.map(|f| f.display().to_string()).unwrap_or_default();
        return Some((format!("COWORK_VM_BACKEND=bwrap in {f}"), node));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root() -> (tempfile::TempDir, Probe) {
        let d = tempfile::tempdir().unwrap();
        let p = Probe {
            root: d.path().to_owned(),
            path: Some("/usr/local/bin:/usr/bin:relative".into()),
            arch: "x86_64".into(),
            resources: None,
        };
        (d, p)
    }

    fn put(p: &Probe, path: &str, mode: u32) {
        let f = p.at(path);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, b"x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn an_empty_root_fails_every_item_naming_what_the_app_probes() {
        let (_d, p) = root();
        let g = evaluate(&p);
        assert!(!g.passes());
        let names: Vec<_> = g.items.iter().map(|i| i.name).collect();
        assert_eq!(
            names,
            ["qemu", "firmware", "virtiofsd", "kvm", "vhost-vsock"]
        );
        assert!(g.items.iter().all(|i| !i.ok && i.fix.is_some()));
        assert!(g.items[0].probed[0].starts_with("qemu-system-x86_64 on PATH"));
        assert_eq!(g.items[1].probed, X86_64.firmware);
        assert_eq!(g.items[2].probed, VIRTIOFSD);
    }

    #[test]
    fn a_complete_root_passes() {
        let (_d, p) = root();
        put(&p, "/usr/bin/qemu-system-x86_64", 0o755);
        put(&p, "/usr/share/OVMF/OVMF_CODE_4M.fd", 0o644);
        put(&p, "/usr/share/OVMF/OVMF_VARS_4M.fd", 0o644);
        put(&p, "/usr/libexec/virtiofsd", 0o755);
        put(&p, "/dev/kvm", 0o666);
        put(&p, "/dev/vhost-vsock", 0o666);
        let g = evaluate(&p);
        assert!(g.passes(), "{g:#?}");
        assert_eq!(
            g.items[0].found,
            Some(PathBuf::from("/usr/bin/qemu-system-x86_64"))
        );
        assert!(
            g.items[1].detail.contains("OVMF_VARS_4M.fd is there too"),
            "{:?}",
            g.items[1]
        );
    }

    #[test]
    fn things_installed_where_the_app_does_not_look_get_a_link_as_their_fix() {
        let (_d, p) = root();
        put(&p, "/usr/libexec/qemu-kvm", 0o755);
        put(&p, "/usr/share/edk2/ovmf/OVMF_CODE.fd", 0o644);
        put(&p, "/usr/share/edk2/ovmf/OVMF_VARS.fd", 0o644);
        put(&p, "/usr/lib/qemu/virtiofsd", 0o755);
        let g = evaluate(&p);
        assert_eq!(
            g.items[0].fix.as_deref(),
            Some("sudo ln -s /usr/libexec/qemu-kvm /usr/local/bin/qemu-system-x86_64")
        );
        let fw = g.items[1].fix.as_deref().unwrap();
        assert!(
            fw.contains("ln -s /usr/share/edk2/ovmf/OVMF_CODE.fd /usr/share/OVMF/OVMF_CODE.fd"),
            "{fw}"
        );
        assert!(
            fw.contains("ln -s /usr/share/edk2/ovmf/OVMF_VARS.fd /usr/share/OVMF/OVMF_VARS.fd"),
            "{fw}"
        );
        assert_eq!(
            g.items[2].fix.as_deref(),
            Some("sudo ln -s /usr/lib/qemu/virtiofsd /usr/bin/virtiofsd")
        );
    }

    #[test]
    fn the_bundled_virtiofsd_counts_only_on_ubuntu_22() {
        let (d, mut p) = root();
        let res = d.path().join("app/resources");
        std::fs::create_dir_all(&res).unwrap();
        std::fs::write(res.join("virtiofsd"), b"x").unwrap();
        std::fs::set_permissions(
            res.join("virtiofsd"),
            std::fs::Permissions::from_mode(0o755),
        )
        .unwrap();
        p.resources = Some(res);
        put(&p, "/etc/os-release", 0o644);
        std::fs::write(p.at("/etc/os-release"), "ID=debian\nVERSION_ID=\"12\"\n").unwrap();
        assert!(!evaluate(&p).items[2].ok);
        std::fs::write(p.at("/etc/os-release"), "ID=ubuntu\nVERSION_ID=\"22.04\"\n").unwrap();
        assert!(evaluate(&p).items[2].ok);
    }

    #[test]
    fn an_arch_the_app_does_not_run_on_fails_the_gate() {
        let (_d, mut p) = root();
        p.arch = "riscv64".into();
        let g = evaluate(&p);
        assert!(!g.passes());
        assert_eq!(g.items[0].name, "arch");
    }
}
