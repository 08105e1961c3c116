//! `boxdesk cp [-r] SRC NAME:PATH` and `boxdesk cp [-r] NAME:PATH DST`.
//!
//! The protocol is `boxdesk_sandbox::client`'s (PutFile series, GetFile
//! reassembly, captured execs); this module is the host's file-system side.
//!
//! Host → sandbox: PutFile series (`client::Upload`) with the source's
//! mode; whether the target is an
//! existing directory (then the file keeps its name) is asked with an exec
//! of `test -d`. `-r` walks the host tree (symlinks and special files are
//! skipped with a warning; empty directories are made with an exec of
//! `mkdir -p`).
//! Sandbox → host: GetFile. `-r` lists the tree with execs of
//! `find PATH -type d -print0` and `find PATH -type f -print0`, then
//! fetches each file with GetFile on one session, one at a time.
//! A guest path may be any absolute path (the agent resolves it beneath
//! the sandbox root); a relative one is taken relative to `/work`.
//!
//! Exit codes: 0, 1 when a file could not be copied (each one reported),
//! 125 for usage errors or a missing sandbox. This module must never write
//! outside the destination a user named: paths from the sandbox are
//! checked to be plain relative paths, and everything created or written
//! beneath DST goes through `boxdesk_platform::beneath` (openat2
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, or a strict `O_NOFOLLOW` walk),
//! so a symlink already inside DST — for a directory on the way or for the
//! file itself — is refused, as GNU cp refuses it. DST itself is what the
//! user named and is opened as any program would open it: a DST that is a
//! symlink to a directory is that directory.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context as _};
use boxdesk_platform::beneath::{Beneath, PathError};
use boxdesk_platform::{names, SandboxPaths};
use boxdesk_sandbox::client::{AgentError, Connection, Fetched, Outcome};

use super::exec;

/// One side of a copy.
#[derive(Debug, PartialEq, Eq)]
enum Side {
    Host(PathBuf),
    Guest { name: String, path: Vec<u8> },
}

/// `NAME:PATH` when what is before the first `:` is a valid sandbox name;
/// anything else (`./a:b`, `/x:y`) is a host path.
fn parse_side(arg: &OsStr) -> Side {
    let b = arg.as_bytes();
    if let Some(i) = b.iter().position(|&c| c == b':') {
        if let Ok(name) = std::str::from_utf8(&b[..i]) {
            if names::validate_name(name).is_ok() {
                return Side::Guest {
                    name: name.to_owned(),
                    path: guest_abs(&b[i + 1..]),
                };
            }
        }
    }
    Side::Host(PathBuf::from(arg))
}

fn guest_abs(p: &[u8]) -> Vec<u8> {
    let mut out = if p.starts_with(b"/") {
        p.to_vec()
    } else {
        [exec::DEFAULT_CWD.as_bytes(), b"/", p].concat()
    };
    while out.len() > 1 && out.ends_with(b"/") {
        out.pop();
    }
    out
}

fn join(base: &[u8], rel: &[u8]) -> Vec<u8> {
    if base == b"/" {
        [b"/", rel].concat()
    } else {
        [base, b"/", rel].concat()
    }
}

fn basename(p: &[u8]) -> &[u8] {
    p.rsplit(|&c| c == b'/').next().unwrap_or(p)
}

/// `boxdesk cp`.
pub fn cp(src: &OsStr, dst: &OsStr, recursive: bool) -> anyhow::Result<i32> {
    let dst_trailing_slash = dst.as_bytes().ends_with(b"/");
    match (parse_side(src), parse_side(dst)) {
        (Side::Host(from), Side::Guest { name, path }) => {
            let (_, paths) = super::sandbox_paths(&name)?;
            put(&paths, &name, &from, &path, dst_trailing_slash, recursive)
        }
        (Side::Guest { name, path }, Side::Host(to)) => {
            let (_, paths) = super::sandbox_paths(&name)?;
            get(&paths, &name, &path, &to, recursive)
        }
        (Side::Host(_), Side::Host(_)) => bail!("one of SRC and DST must be NAME:PATH"),
        (Side::Guest { .. }, Side::Guest { .. }) => {
            bail!("copying between two sandbox paths is not supported; go through the host")
        }
    }
}

fn guest_is_dir(paths: &SandboxPaths, name: &str, path: &[u8]) -> anyhow::Result<bool> {
    Ok(exec::capture(paths, name, &[b"test", b"-d", path])?.outcome == Outcome::Exited(0))
}

fn put(
    paths: &SandboxPaths,
    name: &str,
    from: &Path,
    to: &[u8],
    to_is_dir_hint: bool,
    recursive: bool,
) -> anyhow::Result<i32> {
    let meta = fs::metadata(from).with_context(|| format!("cannot read {}", from.display()))?;
    if meta.is_dir() && !recursive {
        bail!("{} is a directory (use cp -r)", from.display());
    }
    let into_dir = to_is_dir_hint || guest_is_dir(paths, name, to)?;
    let src_name = from
        .file_name()
        .map(|n| n.as_bytes().to_vec())
        .unwrap_or_else(|| b"root".to_vec());
    let target = if into_dir {
        join(to, &src_name)
    } else {
        to.to_vec()
    };

    let mut files: Vec<(PathBuf, Vec<u8>)> = Vec::new();
    let mut empty_dirs: Vec<Vec<u8>> = Vec::new();
    if meta.is_dir() {
        walk(from, &target, &mut files, &mut empty_dirs)?;
    } else {
        files.push((from.to_owned(), target));
    }

    // Errors come back while we are still sending: the upload reads them
    // on a thread of its own, so neither side can stall the other.
    let mut upload = exec::connect(paths, name)?.upload()?;
    let mut failed = 0;
    for (host, guest) in &files {
        let sent = File::open(host)
            .and_then(|f| Ok((f.metadata()?.permissions().mode() & 0o7777, f)))
            .map_err(AgentError::Source)
            .and_then(|(mode, mut f)| upload.file(guest, mode, &mut f));
        if let Err(e) = sent {
            let session_lost = !matches!(e, AgentError::Source(_));
            eprintln!(
                "boxdesk: cp: {}: {:#}",
                host.display(),
                anyhow::Error::from(e)
            );
            failed += 1;
            if session_lost {
                break;
            }
        }
    }
    let errs = upload.finish();
    for e in &errs {
        eprintln!("boxdesk: cp: {e}");
    }
    if !empty_dirs.is_empty() {
        let mut argv: Vec<&[u8]> = vec![b"mkdir", b"-p", b"--"];
        argv.extend(empty_dirs.iter().map(Vec::as_slice));
        let made = exec::capture(paths, name, &argv)?;
        if made.outcome != Outcome::Exited(0) {
            eprintln!(
                "boxdesk: cp: mkdir: {}",
                String::from_utf8_lossy(&made.stderr).trim()
            );
            failed += 1;
        }
    }
    Ok(if failed == 0 && errs.is_empty() { 0 } else { 1 })
}

/// Lists regular files (and empty directories) under `dir`, mapping each
/// to its guest path under `target`.
fn walk(
    dir: &Path,
    target: &[u8],
    files: &mut Vec<(PathBuf, Vec<u8>)>,
    empty_dirs: &mut Vec<Vec<u8>>,
) -> anyhow::Result<()> {
    let mut entries: Vec<fs::DirEntry> = fs::read_dir(dir)
        .with_context(|| format!("cannot read {}", dir.display()))?
        .collect::<Result<_, _>>()?;
    entries.sort_by_key(fs::DirEntry::file_name);
    if entries.is_empty() {
        empty_dirs.push(target.to_vec());
    }
    for e in entries {
        let ft = e.file_type()?;
        let guest = join(target, e.file_name().as_bytes());
        if ft.is_dir() {
            walk(&e.path(), &guest, files, empty_dirs)?;
        } else if ft.is_file() {
            files.push((e.path(), guest));
        } else {
            eprintln!(
                "boxdesk: cp: skipping {} (not a regular file)",
                e.path().display()
            );
        }
    }
    Ok(())
}

fn get(
    paths: &SandboxPaths,
    name: &str,
    from: &[u8],
    to: &Path,
    recursive: bool,
) -> anyhow::Result<i32> {
    if !recursive {
        let root = if to.is_dir() {
            Some((open_root(to)?, plain_name(from)?))
        } else {
            None
        };
        let dst = match &root {
            Some((root, name)) => Dst::Beneath {
                root,
                comps: vec![name],
                shown: to.join(OsStr::from_bytes(name)),
            },
            None => Dst::Named(to.to_owned()),
        };
        let mut conn = exec::connect(paths, name)?;
        return match receive(&mut conn, from, &dst)? {
            Ok(()) => Ok(0),
            Err(msg) => {
                eprintln!("boxdesk: cp: {msg}");
                Ok(1)
            }
        };
    }
    let dirs = list(paths, name, from, b"d")?;
    let files = list(paths, name, from, b"f")?;
    if dirs.is_empty() {
        if files == [from.to_vec()] {
            return get(paths, name, from, to, false);
        }
        bail!(
            "{}: no such directory in sandbox {name}",
            String::from_utf8_lossy(from)
        );
    }
    let tree = Tree::at(to, from)?;
    tree.root
        .dir(&[tree.top.as_slice()], true)
        .map_err(|e| anyhow::anyhow!(refused(&tree.base, &e)))?;
    let mut failed = 0;
    for d in &dirs {
        let Some(rel) = relative(from, d) else {
            continue;
        };
        if let Err(e) = tree.root.dir(&tree.comps(&rel), true) {
            eprintln!("boxdesk: cp: {}", refused(&tree.base.join(&rel), &e));
            failed += 1;
        }
    }
    // One session, one file at a time: the agent answers each GetFile in
    // full before it reads the next frame.
    let mut conn = exec::connect(paths, name)?;
    for f in &files {
        let Some(rel) = relative(from, f) else {
            eprintln!(
                "boxdesk: cp: skipping odd path {}",
                String::from_utf8_lossy(f)
            );
            failed += 1;
            continue;
        };
        let dst = Dst::Beneath {
            root: &tree.root,
            comps: tree.comps(&rel),
            shown: tree.base.join(&rel),
        };
        if let Err(msg) = receive(&mut conn, f, &dst)? {
            eprintln!("boxdesk: cp: {msg}");
            failed += 1;
        }
    }
    Ok(if failed == 0 { 0 } else { 1 })
}

/// Where a received tree goes: `root` is what the user named (DST when it
/// is a directory, else DST's parent), opened as any program would open
/// it; `top` is the tree's own directory in it, and everything from `top`
/// down is resolved beneath `root` without following a symlink.
struct Tree {
    root: Beneath,
    top: Vec<u8>,
    /// `root/top`, for messages.
    base: PathBuf,
}

impl Tree {
    /// `cp -r NAME:FROM TO`: into `TO/basename(FROM)` when TO is a
    /// directory, else into TO itself.
    fn at(to: &Path, from: &[u8]) -> anyhow::Result<Tree> {
        if to.is_dir() {
            let top = plain_name(from)?.to_vec();
            return Ok(Tree {
                root: open_root(to)?,
                base: to.join(OsStr::from_bytes(&top)),
                top,
            });
        }
        let Some(top) = to.file_name() else {
            bail!("cannot copy a directory to {}", to.display());
        };
        let parent = match to.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Ok(Tree {
            root: open_root(parent)?,
            top: top.as_bytes().to_vec(),
            base: to.to_owned(),
        })
    }

    /// The components of `rel` (a plain relative path) below `top`.
    fn comps<'a>(&'a self, rel: &'a Path) -> Vec<&'a [u8]> {
        let mut v = vec![self.top.as_slice()];
        v.extend(rel.iter().map(|c| c.as_bytes()));
        v
    }
}

/// The last component of a sandbox path, to be created beneath DST: a
/// plain name, never empty, `.` or `..`.
fn plain_name(from: &[u8]) -> anyhow::Result<&[u8]> {
    match basename(from) {
        b"" | b"." | b".." => bail!(
            "{}: name a file or directory by its own name",
            String::from_utf8_lossy(from)
        ),
        name => Ok(name),
    }
}

/// Opens DST (or its parent) as the root of everything written below it.
fn open_root(dir: &Path) -> anyhow::Result<Beneath> {
    Beneath::open(dir).with_context(|| format!("cannot open {}", dir.display()))
}

/// A refused path, said plainly: a symlink is the one reason a user can
/// act on.
fn refused(path: &Path, e: &PathError) -> String {
    match e {
        PathError::Symlink => format!(
            "{}: refusing to write through a symlink inside the destination (the link itself or a directory on the way)",
            path.display()
        ),
        e => format!("{}: {e}", path.display()),
    }
}

/// `find PATH -type T -print0` in the sandbox.
fn list(
    paths: &SandboxPaths,
    name: &str,
    from: &[u8],
    kind: &[u8],
) -> anyhow::Result<Vec<Vec<u8>>> {
    let out = exec::capture(paths, name, &[b"find", from, b"-type", kind, b"-print0"])?;
    if out.outcome != Outcome::Exited(0) && out.stdout.is_empty() {
        bail!(
            "{}: {}",
            String::from_utf8_lossy(from),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out
        .stdout
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .map(<[u8]>::to_vec)
        .collect())
}

/// `p` relative to `base` when it is beneath it and every component is a
/// plain name; `Some("")` for `base` itself.
fn relative(base: &[u8], p: &[u8]) -> Option<PathBuf> {
    if p == base {
        return Some(PathBuf::new());
    }
    let prefix = if base == b"/" {
        b"/".to_vec()
    } else {
        [base, b"/"].concat()
    };
    let rel = Path::new(OsStr::from_bytes(p.strip_prefix(prefix.as_slice())?)).to_owned();
    rel.components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then_some(rel)
}

/// Where one received file goes.
enum Dst<'a> {
    /// A file path the user named: opened as any program would open it
    /// (a symlink there is the user's to choose).
    Named(PathBuf),
    /// A file beneath what the user named: created with no symlink
    /// followed on the way or at the end.
    Beneath {
        root: &'a Beneath,
        comps: Vec<&'a [u8]>,
        /// The path, for messages.
        shown: PathBuf,
    },
}

impl Dst<'_> {
    fn shown(&self) -> &Path {
        match self {
            Dst::Named(p) => p,
            Dst::Beneath { shown, .. } => shown,
        }
    }

    fn create(&self, mode: u32) -> Result<File, String> {
        match self {
            Dst::Named(p) => OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(mode)
                .open(p)
                .map_err(|e| format!("cannot create {}: {e}", p.display())),
            Dst::Beneath { root, comps, shown } => root
                .create_file(comps, mode)
                .map_err(|e| refused(shown, &e)),
        }
    }
}

/// Fetches `requested` into `dst`. The outer error is the session
/// failing; the inner one a file not copied (the session stays in step).
fn receive(
    conn: &mut Connection,
    requested: &[u8],
    dst: &Dst<'_>,
) -> Result<Result<(), String>, AgentError> {
    Ok(match conn.get_file(requested, |mode| dst.create(mode))? {
        Fetched::Copied => Ok(()),
        Fetched::Refused(msg) => Err(format!("{}: {msg}", String::from_utf8_lossy(requested))),
        Fetched::NotCreated(msg) => Err(msg),
        Fetched::WriteFailed(e) => Err(format!("writing {}: {e}", dst.shown().display())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn name_colon_path_is_a_sandbox_side_and_other_colons_are_host_paths() {
        assert_eq!(
            parse_side(OsStr::new("dev:/etc/x")),
            Side::Guest {
                name: "dev".into(),
                path: b"/etc/x".to_vec()
            }
        );
        assert_eq!(
            parse_side(OsStr::new("dev:rel/")),
            Side::Guest {
                name: "dev".into(),
                path: b"/work/rel".to_vec()
            }
        );
        assert_eq!(parse_side(OsStr::new("./a:b")), Side::Host("./a:b".into()));
        assert_eq!(parse_side(OsStr::new("/x:y")), Side::Host("/x:y".into()));
        assert_eq!(parse_side(OsStr::new("plain")), Side::Host("plain".into()));
    }

    #[test]
    fn only_plain_paths_beneath_the_base_are_accepted_from_the_sandbox() {
        assert_eq!(relative(b"/w", b"/w/a/b"), Some(PathBuf::from("a/b")));
        assert_eq!(relative(b"/w", b"/w"), Some(PathBuf::new()));
        assert_eq!(relative(b"/w", b"/w/../etc/passwd"), None);
        assert_eq!(relative(b"/w", b"/wx/a"), None);
        assert_eq!(relative(b"/", b"/etc"), Some(PathBuf::from("etc")));
    }

    #[test]
    fn only_a_plain_last_name_is_created_beneath_dst() {
        assert_eq!(plain_name(b"/w/tree").unwrap(), b"tree");
        for p in [&b"/"[..], b"/w/..", b"/w/."] {
            assert!(plain_name(p).is_err(), "{p:?}");
        }
    }

    #[test]
    fn guest_paths_join_without_doubled_slashes() {
        assert_eq!(join(b"/", b"a"), b"/a");
        assert_eq!(join(b"/w", b"a"), b"/w/a");
        assert_eq!(basename(b"/w/a.txt"), b"a.txt");
    }
}
