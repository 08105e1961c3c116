//! The host's system as a sandbox sees it, read-only: the one rule every
//! backend that shows the host's system (the namespace backend, a VM's
//! `--root host`) follows, so a tool that runs on the host runs inside.
//!
//! * [`scan`]: which of the host's top-level entries are shared. The
//!   system (`/usr`, `/bin`, `/sbin`, `/etc`, every `/lib*`), the
//!   toolchains people install beside it (`/opt`, `/nix`, `/snap`), a
//!   `/usr/local` that is a link out of `/usr` (Fedora Atomic's
//!   `/var/usrlocal`), and NixOS's profile links in `/run`
//!   (`/run/current-system`, `/run/booted-system`, into `/nix/store`). A
//!   directory is bound at its own path; a link is recreated, and where it
//!   leads to a directory nothing else shows (`/snap -> /var/lib/snapd/snap`)
//!   that directory is bound too.
//! * [`etc_copies`]: the host's `/etc/resolv.conf` and `/etc/hosts` where
//!   they are links that would dangle inside (systemd-resolved's
//!   `../run/systemd/resolve/stub-resolv.conf`, NetworkManager's
//!   `/run/NetworkManager/resolv.conf`: the sandbox has a `/run` of its
//!   own). The sandbox gets a regular file with the host's content at the
//!   place the link leads to ([`EtcFiles`] writes and refreshes it), so the
//!   host's `/etc` stays bound whole and its links resolve.
//!
//! Links are followed lexically, one component at a time, reading each
//! link from the host, exactly as the sandbox will; never more than
//! [`MAX_HOPS`] of them. Nothing under `/proc`, `/sys` or `/dev` is ever
//! made a copy's place. This module decides and writes copies; it never
//! mounts.

use std::collections::VecDeque;
use std::fs;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};

/// Links followed at most on one path (the kernel's own limit).
pub const MAX_HOPS: u32 = 40;

/// The host's system entries, in order.
const SYSTEM: [&str; 4] = ["usr", "bin", "sbin", "etc"];
/// Toolchains installed beside the system, shared where present.
const TOOLCHAINS: [&str; 3] = ["opt", "nix", "snap"];
/// NixOS's profile links (into `/nix/store`), recreated in the sandbox's
/// own `/run`.
const RUN_LINKS: [&str; 2] = ["run/current-system", "run/booted-system"];
/// The files of `/etc` a sandbox must find regular and current.
pub const ETC_FILES: [&str; 2] = ["resolv.conf", "hosts"];
/// Where no copy is ever placed: the kernel's filesystems.
const NEVER: [&str; 3] = ["/proc", "/sys", "/dev"];

/// One host entry the sandbox gets read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostEntry {
    /// A directory, bound read-only at the same path.
    Dir(PathBuf),
    /// A symlink, recreated with the same target.
    Symlink {
        /// Where it is (`/bin`).
        path: PathBuf,
        /// What it points to (`usr/bin`).
        target: PathBuf,
    },
}

impl HostEntry {
    /// The path inside.
    pub fn path(&self) -> &Path {
        match self {
            HostEntry::Dir(p) => p,
            HostEntry::Symlink { path, .. } => path,
        }
    }

    /// Whether it lives in `/run`, which a sandbox makes afresh: it must be
    /// recreated after that `/run` is.
    pub fn in_run(&self) -> bool {
        self.path().starts_with("/run")
    }
}

/// The entries of the host's system under `root` (`/` but in tests) a
/// sandbox shares, in mount order (see the module doc).
pub fn scan(root: &Path) -> io::Result<Vec<HostEntry>> {
    let mut names: Vec<String> = SYSTEM.map(String::from).into();
    let mut libs: Vec<String> = fs::read_dir(root)?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with("lib"))
        .collect();
    libs.sort();
    names.extend(libs);
    names.extend(TOOLCHAINS.map(String::from));
    let mut out: Vec<HostEntry> = Vec::new();
    for name in &names {
        let inside = Path::new("/").join(name);
        let Ok(meta) = fs::symlink_metadata(root.join(name)) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            out.push(HostEntry::Symlink {
                path: inside.clone(),
                target: fs::read_link(root.join(name))?,
            });
            linked_dir(root, &inside, &mut out);
        } else if meta.is_dir() {
            out.push(HostEntry::Dir(inside));
        }
    }
    // A `/usr/local` of its own elsewhere: the `/usr` bind shows the link.
    linked_dir(root, Path::new("/usr/local"), &mut out);
    for link in RUN_LINKS {
        if let Ok(target) = fs::read_link(root.join(link)) {
            out.push(HostEntry::Symlink {
                path: Path::new("/").join(link),
                target,
            });
        }
    }
    Ok(out)
}

/// Where `link` (a path inside) is a link whose end is a directory that
/// none of `out` shows yet, adds that directory.
fn linked_dir(root: &Path, link: &Path, out: &mut Vec<HostEntry>) {
    if !fs::symlink_metadata(host_path(root, link)).is_ok_and(|m| m.file_type().is_symlink()) {
        return;
    }
    let end = match walk(root, link, |_| true) {
        Walk::Visible(p) | Walk::Leaves(p) => p,
        Walk::Missing => return,
    };
    let shown = out
        .iter()
        .any(|e| matches!(e, HostEntry::Dir(d) if end.starts_with(d)));
    let kernel = NEVER.iter().any(|n| end.starts_with(n));
    if !shown
        && !kernel
        && end != Path::new("/")
        && fs::metadata(host_path(root, &end)).is_ok_and(|m| m.is_dir())
    {
        out.push(HostEntry::Dir(end));
    }
}

/// `inside` (absolute) as a path under `root`.
fn host_path(root: &Path, inside: &Path) -> PathBuf {
    root.join(inside.strip_prefix("/").unwrap_or(inside))
}

/// Where following a path ends.
#[derive(Debug, PartialEq, Eq)]
enum Walk {
    /// At this path, every component of it visible and present.
    Visible(PathBuf),
    /// It leaves what is visible at this path (the rest appended): inside,
    /// the path does not exist until someone makes it.
    Leaves(PathBuf),
    /// A component is missing on the host too, or too many links.
    Missing,
}

/// Follows `start` (absolute, inside) one component at a time, reading
/// links from the host under `root`, while `visible` says the path so far
/// is one the sandbox shows as the host's.
fn walk(root: &Path, start: &Path, visible: impl Fn(&Path) -> bool) -> Walk {
    let mut todo: VecDeque<PathBuf> = start
        .components()
        .map(|c| PathBuf::from(c.as_os_str()))
        .collect();
    let mut cur = PathBuf::from("/");
    let mut hops = 0;
    while let Some(c) = todo.pop_front() {
        match c.components().next() {
            Some(Component::RootDir) => cur = PathBuf::from("/"),
            Some(Component::ParentDir) => {
                cur.pop();
            }
            Some(Component::Normal(name)) => {
                let next = cur.join(name);
                if !visible(&next) {
                    let mut rest = next;
                    rest.extend(todo);
                    return Walk::Leaves(normalize(&rest));
                }
                match fs::symlink_metadata(host_path(root, &next)) {
                    Ok(m) if m.file_type().is_symlink() => {
                        hops += 1;
                        let Ok(target) = fs::read_link(host_path(root, &next)) else {
                            return Walk::Missing;
                        };
                        if hops > MAX_HOPS {
                            return Walk::Missing;
                        }
                        for (i, part) in target.components().enumerate() {
                            todo.insert(i, PathBuf::from(part.as_os_str()));
                        }
                    }
                    Ok(_) => cur = next,
                    Err(_) => return Walk::Missing,
                }
            }
            _ => {}
        }
    }
    Walk::Visible(cur)
}

/// Where `inside` leads on the host under `root`, every link followed
/// there; `None` when it does not exist.
fn on_host(root: &Path, inside: &Path) -> Option<PathBuf> {
    match walk(root, inside, |_| true) {
        Walk::Visible(p) => Some(host_path(root, &p)),
        Walk::Leaves(_) | Walk::Missing => None,
    }
}

/// `p` (absolute) without `.` and with each `..` taking the component
/// before it, lexically.
pub fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// One of [`ETC_FILES`] the sandbox needs a copy of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcCopy {
    /// Its name in `/etc`.
    pub name: &'static str,
    /// Where the copy goes inside: the end of the host's link chain
    /// (`/run/systemd/resolve/stub-resolv.conf`), or `/etc/<name>` itself
    /// when its content is the sandbox's own.
    pub inside: PathBuf,
    /// The sandbox's own content instead of the host's (a private network's
    /// resolver).
    pub own: Option<String>,
}

/// The copies of [`ETC_FILES`] a sandbox showing `entries` of the host's
/// system under `root` needs: those whose `/etc` link would dangle inside
/// and that the host has. `resolver`, when given, is the sandbox's own
/// `resolv.conf` content (a private network with boxdesk's resolver): it
/// is placed wherever `/etc/resolv.conf` leads, dangling or not.
pub fn etc_copies(root: &Path, entries: &[HostEntry], resolver: Option<&str>) -> Vec<EtcCopy> {
    let visible = |p: &Path| {
        entries.iter().any(|e| match e {
            HostEntry::Dir(d) => p.starts_with(d),
            HostEntry::Symlink { path, .. } => p == path,
        })
    };
    let mut out = Vec::new();
    for name in ETC_FILES {
        let start = Path::new("/etc").join(name);
        let own = (name == "resolv.conf").then_some(resolver).flatten();
        let inside = match walk(root, &start, visible) {
            Walk::Leaves(end) if own.is_some() || on_host(root, &start).is_some() => end,
            Walk::Visible(end) if own.is_some() => end,
            // A regular file (or a link to one) the sandbox sees live.
            Walk::Visible(_) | Walk::Leaves(_) => continue,
            // Nothing at the end on the host either, inside a tree the
            // sandbox shows read-only: no file can be placed there.
            Walk::Missing => continue,
        };
        if NEVER.iter().any(|n| inside.starts_with(n)) || inside.parent().is_none() {
            tracing::warn!(
                "/etc/{name} leads to {}: no copy is placed there",
                inside.display()
            );
            continue;
        }
        out.push(EtcCopy {
            name,
            inside,
            own: own.map(str::to_owned),
        });
    }
    out
}

/// `doctor`'s lines on what sandboxes see of the host under `root`: the
/// system entries shared, and which resolver a sandbox uses.
pub fn doctor_lines(root: &Path) -> Vec<(&'static str, String)> {
    let Ok(entries) = scan(root) else {
        return vec![("host system", "cannot read /".to_owned())];
    };
    let shown: Vec<String> = entries
        .iter()
        .filter(|e| matches!(e, HostEntry::Dir(_)))
        .map(|e| e.path().display().to_string())
        .collect();
    let resolv = Path::new("/etc/resolv.conf");
    let servers = on_host(root, resolv)
        .and_then(|p| fs::read_to_string(p).ok())
        .map(|t| {
            t.lines()
                .filter_map(|l| l.strip_prefix("nameserver"))
                .map(|a| a.trim().to_owned())
                .collect::<Vec<_>>()
        });
    let from = match fs::read_link(host_path(root, resolv)) {
        Ok(t) => format!("/etc/resolv.conf -> {}", t.display()),
        Err(_) => "/etc/resolv.conf".to_owned(),
    };
    let copy = etc_copies(root, &entries, None)
        .into_iter()
        .find(|c| c.name == "resolv.conf");
    let dns = match (servers, copy) {
        (None, _) => format!(
            "{from}: missing on the host, so names resolve only by /etc/hosts, here and in sandboxes"
        ),
        (Some(servers), copy) => {
            let list = if servers.is_empty() {
                "no nameserver".to_owned()
            } else {
                format!("nameserver {}", servers.join(", "))
            };
            let how = match copy {
                Some(c) => format!(
                    "a sandbox's /run is its own, so it gets a copy at {}, kept current",
                    c.inside.display()
                ),
                None => "sandboxes read it as the host does, live".to_owned(),
            };
            let loopback = servers.iter().any(|s| s.starts_with("127.") || s == "::1");
            let reach = if loopback {
                "; a resolver on the host's loopback answers only sandboxes on the host's network (`run --net`)"
            } else {
                ""
            };
            format!("{from} ({list}): {how}{reach}; cowork's private networks use boxdesk's resolver (the names their allowlist lists)")
        }
    };
    vec![
        (
            "host system",
            format!("{} shared read-only", shown.join(" ")),
        ),
        ("dns", dns),
    ]
}

/// How a copy is shown inside: its directory bound over the place's
/// directory (a rename in it shows at once), or, where that directory is
/// shallow or shared (`/run`, `/tmp`, `/etc`), the file alone (refreshed
/// in place).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Placement {
    /// Bind this host directory at this directory inside.
    Dir {
        /// The host directory holding the copies.
        host: PathBuf,
        /// Where it is bound.
        inside: PathBuf,
    },
    /// Bind this host file at this path inside.
    File {
        /// The copy.
        host: PathBuf,
        /// Where it is bound.
        inside: PathBuf,
    },
}

/// The copies of one sandbox, kept in a directory of its own on the host
/// and refreshed from the host's files ([`EtcFiles::refresh`]).
#[derive(Debug)]
pub struct EtcFiles {
    root: PathBuf,
    dir: PathBuf,
    /// Each copy with its file on the host and the content last written.
    copies: Vec<(EtcCopy, PathBuf, Vec<u8>)>,
    placements: Vec<Placement>,
}

/// The directories a copy's directory may not be bound over: they hold
/// more than the copy, inside.
fn shared_dir(dir: &Path, entries: &[HostEntry]) -> bool {
    dir.components().count() < 3
        || dir.starts_with("/tmp")
        || dir.starts_with("/var/tmp")
        || dir.starts_with("/run/boxdesk-exe")
        || entries.iter().any(|e| match e {
            HostEntry::Dir(d) => dir.starts_with(d),
            HostEntry::Symlink { path, .. } => dir.starts_with(path),
        })
}

impl EtcFiles {
    /// Writes the copies into `dir` (made, 0755: the sandbox's ids read
    /// it) and says where each is bound.
    pub fn prepare(
        root: &Path,
        dir: &Path,
        entries: &[HostEntry],
        copies: Vec<EtcCopy>,
    ) -> io::Result<EtcFiles> {
        if !copies.is_empty() {
            fs::create_dir_all(dir)?;
        }
        let mut placements: Vec<Placement> = Vec::new();
        let mut kept = Vec::with_capacity(copies.len());
        for (i, copy) in copies.into_iter().enumerate() {
            let parent = copy.inside.parent().unwrap_or(Path::new("/"));
            let file_name = copy
                .inside
                .file_name()
                .map(PathBuf::from)
                .unwrap_or_else(|| copy.name.into());
            let alone = shared_dir(parent, entries) || copy.inside.starts_with("/etc");
            let host_dir = if alone {
                // The file alone, in a directory of its own.
                let sub = dir.join(format!("f{i}"));
                fs::create_dir_all(&sub)?;
                placements.push(Placement::File {
                    host: sub.join(&file_name),
                    inside: copy.inside.clone(),
                });
                sub
            } else {
                // One directory per place, shared by the copies there.
                let existing = placements.iter().find_map(|p| match p {
                    Placement::Dir { host, inside } if inside == parent => Some(host.clone()),
                    _ => None,
                });
                match existing {
                    Some(h) => h,
                    None => {
                        let h = dir.join(format!("d{i}"));
                        fs::create_dir_all(&h)?;
                        placements.push(Placement::Dir {
                            host: h.clone(),
                            inside: parent.to_owned(),
                        });
                        h
                    }
                }
            };
            kept.push((copy, host_dir.join(&file_name), Vec::new()));
        }
        let mut files = EtcFiles {
            root: root.to_owned(),
            dir: dir.to_owned(),
            copies: kept,
            placements,
        };
        for i in 0..files.copies.len() {
            files.write(i, true)?;
        }
        Ok(files)
    }

    /// Where the copies are bound, in mount order.
    pub fn placements(&self) -> &[Placement] {
        &self.placements
    }

    /// Where each copy is seen inside, for `info`.
    pub fn shown(&self) -> Vec<(&'static str, &Path)> {
        self.copies
            .iter()
            .map(|(c, _, _)| (c.name, c.inside.as_path()))
            .collect()
    }

    /// The directory the copies are kept in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Rewrites each copy whose host file changed since (Wi-Fi roaming
    /// rewrites the resolver's file); returns how many were rewritten.
    pub fn refresh(&mut self) -> io::Result<usize> {
        let mut n = 0;
        for i in 0..self.copies.len() {
            if self.write(i, false)? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Writes copy `i` if its content changed (or `first`): a new file
    /// renamed over the old where its directory is bound (readers see one
    /// or the other), in place where the file alone is bound (its inode is
    /// what the sandbox sees).
    fn write(&mut self, i: usize, first: bool) -> io::Result<bool> {
        let (copy, at, last) = &mut self.copies[i];
        let content = match &copy.own {
            Some(text) => text.as_bytes().to_vec(),
            // A host file gone for now (a resolver restarting) keeps the
            // last content.
            None => match on_host(&self.root, &Path::new("/etc").join(copy.name))
                .map_or_else(|| Err(io::ErrorKind::NotFound.into()), fs::read)
            {
                Ok(c) => c,
                Err(_) if !first => return Ok(false),
                Err(_) => Vec::new(),
            },
        };
        if !first && content == *last {
            return Ok(false);
        }
        let whole_dir = self
            .placements
            .iter()
            .any(|p| matches!(p, Placement::Dir { host, .. } if at.starts_with(host)));
        if whole_dir {
            let tmp = at.with_extension("new");
            fs::write(&tmp, &content)?;
            set_readable(&tmp)?;
            fs::rename(&tmp, &*at)?;
        } else {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&*at)?;
            f.write_all(&content)?;
            drop(f);
            set_readable(at)?;
        }
        *last = content;
        Ok(true)
    }
}

/// Mode 0644: the sandbox's ids (another uid when boxdesk runs as root)
/// read the copies.
fn set_readable(p: &Path) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(p, fs::Permissions::from_mode(0o644))
}

#[cfg(test)]
mod tests;
