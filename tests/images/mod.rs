//! `boxdesk images fetch` against a release served on loopback: the real
//! binary, the real curl, and image archives packed here as
//! `dist/images.sh` packs them (`<arch>/{kernel, initramfs.cpio.gz,
//! manifest}`, GNU tar, owner 0, mtime 0, gzip; a `.sha256` in `sha256sum`
//! format beside it). The release is a small HTTP server on 127.0.0.1 in
//! this process, which can also cut a response short. Every refusal must
//! leave `<data>/boxdesk` exactly as it was: the installed image untouched,
//! no temporary directory left.
//!
//! The images are fakes (a few bytes each): that one really boots is
//! `tests/nested/fetch-boot.sh`'s to show, in a nested L1.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::support::{Out, TestEnv};

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// What the server answers for a path.
#[derive(Clone)]
enum Reply {
    /// 200 with the whole body.
    Full(Vec<u8>),
    /// 200 announcing the whole body, then only its first `n` bytes and a
    /// closed connection.
    Cut(Vec<u8>, usize),
}

/// A release on `http://127.0.0.1:PORT/`: its files by name; anything
/// else is a 404.
pub(crate) struct Release {
    port: u16,
    files: Arc<Mutex<HashMap<String, Reply>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Release {
    pub(crate) fn serve() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let files: Arc<Mutex<HashMap<String, Reply>>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (files.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(conn) = conn {
                    let _ = answer(conn, &f);
                }
            }
        });
        Release {
            port,
            files,
            stop,
            thread: Some(thread),
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://127.0.0.1:{}/", self.port)
    }

    fn put(&self, name: &str, reply: Reply) {
        self.files.lock().unwrap().insert(name.to_owned(), reply);
    }

    /// Publishes `archive` as the arch's image archive with its `.sha256`.
    pub(crate) fn publish(&self, arch: &str, archive: &[u8]) {
        let name = archive_name(arch);
        self.put(&name, Reply::Full(archive.to_vec()));
        self.put(
            &format!("{name}.sha256"),
            Reply::Full(sha256sum_line(archive, &name).into_bytes()),
        );
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One request: `GET /NAME`, answered and the connection closed.
fn answer(mut conn: TcpStream, files: &Mutex<HashMap<String, Reply>>) -> std::io::Result<()> {
    conn.set_read_timeout(Some(std::time::Duration::from_secs(10)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 16 << 10 {
        let n = conn.read(&mut buf)?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let path = head.split_whitespace().nth(1).unwrap_or("/");
    let reply = files
        .lock()
        .unwrap()
        .get(path.trim_start_matches('/'))
        .cloned();
    match reply {
        None => conn.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 9\r\nConnection: close\r\n\r\nnot found",
        )?,
        Some(Reply::Full(body)) => {
            write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )?;
            conn.write_all(&body)?;
        }
        Some(Reply::Cut(body, n)) => {
            write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            )?;
            conn.write_all(&body[..n])?;
        }
    }
    conn.flush()
}

fn archive_name(arch: &str) -> String {
    format!("boxdesk-images-{arch}.tar.gz")
}

fn sha_hex(data: &[u8]) -> String {
    Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What `sha256sum NAME` prints.
fn sha256sum_line(data: &[u8], name: &str) -> String {
    format!("{}  {name}\n", sha_hex(data))
}

/// One archive entry: a path, its tar type, its bytes.
pub(crate) type Entry = (String, tar::EntryType, Vec<u8>);

/// A `.tar.gz` of `entries` as dist/images.sh's GNU tar writes it (the
/// names set as raw bytes, so `..` can be written too).
pub(crate) fn targz(entries: &[Entry]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (path, ty, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(*ty);
        h.set_mode(0o644);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(0);
        let data: &[u8] = if ty.is_file() {
            data
        } else {
            h.set_link_name("/etc/passwd").unwrap();
            &[]
        };
        h.set_size(data.len() as u64);
        let name = &mut h.as_old_mut().name;
        name[..path.len()].copy_from_slice(path.as_bytes());
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

/// An image's files for `arch`, its manifest saying `manifest_arch` and
/// boxdesk `version`, the kernel's bytes marked with `mark`.
fn image(arch: &str, manifest_arch: &str, version: &str, mark: &str) -> Vec<Entry> {
    let kernel = if arch == "aarch64" {
        "Image"
    } else {
        "vmlinux"
    };
    let k = format!("{arch} kernel {mark}").into_bytes();
    let i = format!("initramfs {mark}").into_bytes();
    let m = format!(
        "arch={manifest_arch}\nkernel_version=6.1.0-test\n{kernel}_sha256={}\ninitramfs_sha256={}\nboxdesk_version={version}\n",
        sha_hex(&k),
        sha_hex(&i)
    );
    let reg = tar::EntryType::Regular;
    vec![
        (format!("{arch}/initramfs.cpio.gz"), reg, i),
        (format!("{arch}/manifest"), reg, m.into_bytes()),
        (format!("{arch}/{kernel}"), reg, k),
    ]
}

/// The host arch's name as boxdesk's images have it.
fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "aarch64" => "aarch64",
        _ => "x86_64",
    }
}

fn other_arch() -> &'static str {
    match arch() {
        "aarch64" => "x86_64",
        _ => "aarch64",
    }
}

/// A test's world: its environment, its data home, its release.
struct World {
    env: TestEnv,
    data_home: PathBuf,
    release: Release,
}

impl World {
    fn new() -> Self {
        let env = TestEnv::new();
        let data_home = env.root().join("data");
        World {
            env,
            data_home,
            release: Release::serve(),
        }
    }

    /// `<data>/boxdesk`.
    fn data(&self) -> PathBuf {
        self.data_home.join("boxdesk")
    }

    /// Where the host arch's image is installed.
    fn installed(&self) -> PathBuf {
        self.data().join("images").join(arch())
    }

    /// `boxdesk images fetch --from <release> --arch <host> EXTRA…`.
    fn fetch(&self, extra: &[&str]) -> Out {
        let mut c = self.env.cmd(["images", "fetch", "--arch", arch()]);
        c.arg("--from")
            .arg(self.release.url())
            .args(extra)
            .env("XDG_DATA_HOME", &self.data_home)
            .env_remove("BOXDESK_RELEASE_URL")
            .env_remove("BOXDESK_IMAGE_DIR")
            .current_dir(self.env.root());
        for proxy in [
            "http_proxy",
            "HTTP_PROXY",
            "https_proxy",
            "HTTPS_PROXY",
            "all_proxy",
            "ALL_PROXY",
        ] {
            c.env_remove(proxy);
        }
        crate::support::output(c)
    }

    /// Installs a good image marked `mark` through a fetch.
    fn install(&self, mark: &str) {
        self.release
            .publish(arch(), &targz(&image(arch(), arch(), VERSION, mark)));
        let out = self.fetch(&["--force"]);
        assert_eq!(out.code(), 0, "{out}");
    }
}

/// Every path under `dir` with its kind and contents (a link's target):
/// what "exactly as before" compares. Missing and empty are the same.
fn snapshot(dir: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let meta = fs::symlink_metadata(&p).unwrap();
            let what = if meta.is_symlink() {
                format!("link -> {}", fs::read_link(&p).unwrap().display())
            } else if meta.is_dir() {
                walk(root, &p, out);
                format!("dir ino {}", meta.ino())
            } else {
                format!(
                    "file ino {} {}",
                    meta.ino(),
                    String::from_utf8_lossy(&fs::read(&p).unwrap())
                )
            };
            out.insert(rel, what);
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    out
}

/// Publishes what `publish` sets up and fetches it twice — into an empty
/// data home, and over an installed image with `--force` — asserting each
/// is refused with `expect` in its message and changes nothing.
fn assert_refused(publish: impl Fn(&Release), expect: &str) {
    let w = World::new();
    publish(&w.release);
    let out = w.fetch(&[]);
    assert_eq!(out.code(), 125, "{out}");
    assert!(out.stderr.contains(expect), "want {expect:?} in\n{out}");
    let left = snapshot(&w.data());
    assert!(left.is_empty(), "a refused fetch left {left:#?}\n{out}");

    let w = World::new();
    w.install("installed");
    let before = snapshot(&w.data());
    assert!(!before.is_empty());
    w.release.files.lock().unwrap().clear();
    publish(&w.release);
    let out = w.fetch(&["--force"]);
    assert_eq!(out.code(), 125, "{out}");
    assert!(out.stderr.contains(expect), "want {expect:?} in\n{out}");
    assert_eq!(
        snapshot(&w.data()),
        before,
        "a refused fetch changed the data dir\n{out}"
    );
}

#[test]
fn a_good_archive_is_installed_where_vms_look_and_nothing_else_is_left() {
    let w = World::new();
    w.release
        .publish(arch(), &targz(&image(arch(), arch(), VERSION, "one")));
    let out = w.fetch(&[]);
    assert_eq!(out.code(), 0, "{out}");
    let dir = w.installed();
    assert!(
        out.stdout
            .contains(&format!("installed the {} image", arch())),
        "{out}"
    );
    assert!(out.stdout.contains(&dir.display().to_string()), "{out}");
    let kernel = if arch() == "aarch64" {
        "Image"
    } else {
        "vmlinux"
    };
    assert_eq!(
        fs::read(dir.join(kernel)).unwrap(),
        format!("{} kernel one", arch()).as_bytes()
    );
    assert_eq!(
        fs::read(dir.join("initramfs.cpio.gz")).unwrap(),
        b"initramfs one"
    );
    assert!(fs::read_to_string(dir.join("manifest"))
        .unwrap()
        .contains(&format!("boxdesk_version={VERSION}")));
    let mut top: Vec<_> = fs::read_dir(w.data())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    top.sort();
    assert_eq!(top, ["images"], "only images/ is left in the data dir");
    let mode = fs::metadata(w.data()).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o700, "the data dir is created private");
}

#[test]
fn an_image_already_there_is_kept_and_force_replaces_it_in_one_rename() {
    let w = World::new();
    w.install("one");
    let kernel = if arch() == "aarch64" {
        "Image"
    } else {
        "vmlinux"
    };
    let old_ino = fs::metadata(w.installed()).unwrap().ino();

    w.release
        .publish(arch(), &targz(&image(arch(), arch(), VERSION, "two")));
    let out = w.fetch(&[]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(out.stdout.contains("already installed"), "{out}");
    assert!(out.stdout.contains("--force"), "{out}");
    assert!(
        !out.stderr.contains("fetching"),
        "nothing is downloaded: {out}"
    );
    assert_eq!(
        fs::read(w.installed().join(kernel)).unwrap(),
        format!("{} kernel one", arch()).as_bytes()
    );

    let out = w.fetch(&["--force"]);
    assert_eq!(out.code(), 0, "{out}");
    assert_eq!(
        fs::read(w.installed().join(kernel)).unwrap(),
        format!("{} kernel two", arch()).as_bytes()
    );
    // A new directory renamed in, not the old one written over.
    assert_ne!(fs::metadata(w.installed()).unwrap().ino(), old_ino);
    let names: Vec<_> = fs::read_dir(w.data().join("images"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [arch()], "the old image is gone");
    assert_eq!(fs::read_dir(w.data()).unwrap().count(), 1, "no temp dir");
}

#[test]
fn an_image_of_another_boxdesk_version_is_replaced_without_force() {
    let w = World::new();
    w.release
        .publish(arch(), &targz(&image(arch(), arch(), "0.0.1-old", "old")));
    // Installed by hand, as docs/INSTALL.md's fallback does.
    let dir = w.installed();
    fs::create_dir_all(&dir).unwrap();
    for (path, _, data) in image(arch(), arch(), "0.0.1-old", "old") {
        let name = path.rsplit('/').next().unwrap();
        fs::write(dir.join(name), data).unwrap();
    }
    w.release
        .publish(arch(), &targz(&image(arch(), arch(), VERSION, "new")));
    let out = w.fetch(&[]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(out.stderr.contains("boxdesk 0.0.1-old"), "{out}");
    assert!(fs::read_to_string(dir.join("manifest"))
        .unwrap()
        .contains(&format!("boxdesk_version={VERSION}")));
}

#[test]
fn a_corrupt_archive_is_refused_and_nothing_is_unpacked() {
    assert_refused(
        |r| {
            let good = targz(&image(arch(), arch(), VERSION, "x"));
            let name = archive_name(arch());
            let mut bad = good.clone();
            let at = bad.len() / 2;
            bad[at] ^= 0x55;
            r.put(&name, Reply::Full(bad));
            r.put(
                &format!("{name}.sha256"),
                Reply::Full(sha256sum_line(&good, &name).into_bytes()),
            );
        },
        "does not match its published sha256",
    );
}

#[test]
fn a_truncated_download_is_refused_and_nothing_is_unpacked() {
    assert_refused(
        |r| {
            let good = targz(&image(arch(), arch(), VERSION, "x"));
            r.publish(arch(), &good);
            let n = good.len() / 2;
            r.put(&archive_name(arch()), Reply::Cut(good, n));
        },
        // curl's "partial file": how it words it changes between releases.
        "(18)",
    );
}

#[test]
fn a_truncated_archive_with_a_matching_sum_is_refused_and_nothing_is_unpacked() {
    assert_refused(
        |r| {
            let good = targz(&image(arch(), arch(), VERSION, "x"));
            r.publish(arch(), &good[..good.len() - 20]);
        },
        "truncated or corrupt",
    );
}

#[test]
fn an_archive_of_the_other_arch_is_refused_and_nothing_is_unpacked() {
    assert_refused(
        |r| {
            let other = targz(&image(other_arch(), other_arch(), VERSION, "x"));
            r.publish(arch(), &other);
        },
        &format!("archive of the {} image", other_arch()),
    );
    // The right paths, but a manifest for the other arch.
    assert_refused(
        |r| r.publish(arch(), &targz(&image(arch(), other_arch(), VERSION, "x"))),
        &format!("manifest says arch=\"{}\"", other_arch()),
    );
}

#[test]
fn an_image_of_another_boxdesk_version_is_refused_and_nothing_is_unpacked() {
    assert_refused(
        |r| r.publish(arch(), &targz(&image(arch(), arch(), "0.0.0-other", "x"))),
        "image of boxdesk 0.0.0-other",
    );
}

#[test]
fn an_archive_with_a_link_or_a_dot_dot_entry_is_refused_and_nothing_is_unpacked() {
    assert_refused(
        |r| {
            let mut e = image(arch(), arch(), VERSION, "x");
            e.insert(
                0,
                (
                    format!("{}/evil", arch()),
                    tar::EntryType::Symlink,
                    Vec::new(),
                ),
            );
            r.publish(arch(), &targz(&e));
        },
        "is a symbolic link",
    );
    assert_refused(
        |r| {
            let mut e = image(arch(), arch(), VERSION, "x");
            e.push((
                format!("{}/../../escaped", arch()),
                tar::EntryType::Regular,
                b"out".to_vec(),
            ));
            r.publish(arch(), &targz(&e));
        },
        "`..`",
    );
    assert_refused(
        |r| {
            let mut e = image(arch(), arch(), VERSION, "x");
            let kernel = e.pop().unwrap().0;
            e.push((kernel, tar::EntryType::Link, Vec::new()));
            r.publish(arch(), &targz(&e));
        },
        "is a hard link",
    );
}

#[test]
fn the_sum_may_come_from_the_releases_sha256_sum_and_without_any_sum_nothing_is_fetched() {
    let w = World::new();
    let archive = targz(&image(arch(), arch(), VERSION, "x"));
    let name = archive_name(arch());
    w.release.put(&name, Reply::Full(archive.clone()));
    let all = format!(
        "{}{}",
        sha256sum_line(b"other", "boxdesk-x86_64-unknown-linux-musl.tar.xz"),
        sha256sum_line(&archive, &name)
    );
    w.release.put("sha256.sum", Reply::Full(all.into_bytes()));
    let out = w.fetch(&[]);
    assert_eq!(out.code(), 0, "{out}");
    assert!(w.installed().join("manifest").is_file());

    assert_refused(
        |r| r.put(&archive_name(arch()), Reply::Full(archive.clone())),
        "publishes no checksum",
    );
    // A sums file that is not one (an error page served with 200).
    assert_refused(
        |r| {
            r.publish(arch(), &archive);
            r.put(
                &format!("{name}.sha256"),
                Reply::Full(b"<html>rate limited</html>".to_vec()),
            );
        },
        "not a sha256sum file",
    );
}

#[test]
fn a_missing_archive_is_said_with_its_url() {
    let w = World::new();
    let out = w.fetch(&[]);
    assert_eq!(out.code(), 125, "{out}");
    assert!(out.stderr.contains("publishes no checksum"), "{out}");
    w.release.put(
        &format!("{}.sha256", archive_name(arch())),
        Reply::Full(sha256sum_line(b"x", &archive_name(arch())).into_bytes()),
    );
    let out = w.fetch(&[]);
    assert_eq!(out.code(), 125, "{out}");
    assert!(
        out.stderr.contains(&format!(
            "{}{}: not found (HTTP 404)",
            w.release.url(),
            archive_name(arch())
        )),
        "{out}"
    );
    assert!(snapshot(&w.data()).is_empty());
}

#[test]
fn without_curl_fetch_says_what_to_install_and_changes_nothing() {
    let w = World::new();
    w.release
        .publish(arch(), &targz(&image(arch(), arch(), VERSION, "x")));
    let empty = w.env.root().join("no-bin");
    fs::create_dir(&empty).unwrap();
    let mut c = w.env.cmd(["images", "fetch", "--arch", arch(), "--from"]);
    c.arg(w.release.url())
        .env("XDG_DATA_HOME", &w.data_home)
        .env("PATH", &empty);
    let out = crate::support::output(c);
    assert_eq!(out.code(), 125, "{out}");
    assert!(out.stderr.contains("curl is not installed"), "{out}");
    assert!(snapshot(&w.data()).is_empty());
}

#[test]
fn a_release_url_that_is_not_http_is_refused_before_anything_is_done() {
    let w = World::new();
    let mut c = w.env.cmd(["images", "fetch", "--from", "file:///etc/"]);
    c.env("XDG_DATA_HOME", &w.data_home);
    let out = crate::support::output(c);
    assert_eq!(out.code(), 125, "{out}");
    assert!(out.stderr.contains("only http:// and https://"), "{out}");
    assert!(!w.data_home.exists());
}
