//! `--share HOST[:GUEST][:ro]`: the flag's grammar, the same on every
//! backend, and its form on the helper's command line.
//!
//! `HOST` is resolved against the caller's cwd and canonicalised (it must
//! exist; symlinks in it are the caller's to follow). `GUEST` defaults to
//! that canonical host path; it must be absolute, must not be `/` or lie
//! under `/proc`, `/sys` or `/dev`, and is normalised (`.`, `//`); `..`
//! is refused. A trailing `:ro` or `:rw` sets the mode (default `rw`). A
//! host path with a `:` cannot be written here. Two shares may not land on
//! the same guest path.

use std::path::{Component, Path, PathBuf};

use boxdesk_platform::pathcode;

use crate::running::Share;

/// Why a `--share` cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ShareArgError {
    /// Not `HOST[:GUEST][:ro|rw]`.
    #[error("--share {0}: expected HOST[:GUEST][:ro] (a path with ':' cannot be shared)")]
    Syntax(String),
    /// The host path does not resolve.
    #[error("--share {arg}: {host}: {why}")]
    Host {
        /// The argument.
        arg: String,
        /// The host path.
        host: String,
        /// What the OS said.
        why: String,
    },
    /// The guest path is not one a share can take.
    #[error("--share {arg}: the guest path {guest} {why}")]
    Guest {
        /// The argument.
        arg: String,
        /// The guest path.
        guest: String,
        /// Why.
        why: &'static str,
    },
    /// Two shares on one guest path.
    #[error("--share: two shares at {0}")]
    Twice(String),
    /// A helper argument that [`to_helper`] did not write.
    #[error("--share {0}: not a helper share")]
    Helper(String),
}

/// Parses one `--share`, with relative host paths against `cwd`.
pub fn parse(arg: &str, cwd: &Path) -> Result<Share, ShareArgError> {
    let mut parts: Vec<&str> = arg.split(':').collect();
    let writable = match parts.last() {
        Some(&"ro") if parts.len() > 1 => false,
        Some(&"rw") if parts.len() > 1 => true,
        _ => true,
    };
    if parts.len() > 1 && matches!(parts.last(), Some(&"ro" | &"rw")) {
        parts.pop();
    }
    let (host, guest) = match parts[..] {
        [h] => (h, None),
        [h, g] => (h, Some(g)),
        _ => return Err(ShareArgError::Syntax(arg.into())),
    };
    if host.is_empty() || guest.is_some_and(str::is_empty) {
        return Err(ShareArgError::Syntax(arg.into()));
    }
    let host_path = cwd.join(host);
    let host_path = host_path.canonicalize().map_err(|e| ShareArgError::Host {
        arg: arg.into(),
        host: host.into(),
        why: e.to_string(),
    })?;
    let guest = match guest {
        Some(g) => g.into(),
        None => host_path.clone(),
    };
    let inside = guest_path(&guest).map_err(|why| ShareArgError::Guest {
        arg: arg.into(),
        guest: guest.display().to_string(),
        why,
    })?;
    Ok(Share {
        host: host_path,
        inside,
        writable,
        follows_mounts: false,
    })
}

/// Parses every `--share`, refusing two on one guest path.
pub fn parse_all(args: &[String], cwd: &Path) -> Result<Vec<Share>, ShareArgError> {
    let mut out: Vec<Share> = Vec::new();
    for a in args {
        let s = parse(a, cwd)?;
        if out.iter().any(|o| o.inside == s.inside) {
            return Err(ShareArgError::Twice(s.inside.display().to_string()));
        }
        out.push(s);
    }
    Ok(out)
}

/// `guest`, normalised, if a share may be mounted there.
fn guest_path(guest: &Path) -> Result<PathBuf, &'static str> {
    if !guest.is_absolute() {
        return Err("is not absolute");
    }
    let mut out = PathBuf::from("/");
    for c in guest.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(n) => out.push(n),
            Component::ParentDir => return Err("has `..` in it"),
            Component::Prefix(_) => return Err("is not a Unix path"),
        }
    }
    if out == Path::new("/") {
        return Err("is the root: share beneath it");
    }
    if ["/proc", "/sys", "/dev"].iter().any(|p| out.starts_with(p)) {
        return Err("is under /proc, /sys or /dev");
    }
    Ok(out)
}

/// The share as one helper argument (`HOST:GUEST:rw`, both encoded).
pub fn to_helper(s: &Share) -> String {
    let mode = if s.writable { "rw" } else { "ro" };
    format!(
        "{}:{}:{mode}",
        pathcode::encode(&s.host),
        pathcode::encode(&s.inside)
    )
}

/// The share [`to_helper`] wrote.
pub fn from_helper(arg: &str) -> Result<Share, ShareArgError> {
    let bad = || ShareArgError::Helper(arg.into());
    let mut it = arg.split(':');
    let (Some(h), Some(g), Some(mode), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return Err(bad());
    };
    let writable = match mode {
        "rw" => true,
        "ro" => false,
        _ => return Err(bad()),
    };
    Ok(Share {
        host: pathcode::decode(h).ok_or_else(bad)?,
        inside: pathcode::decode(g).ok_or_else(bad)?,
        writable,
        follows_mounts: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let canon = d.path().canonicalize().unwrap();
        (d, canon)
    }

    #[test]
    fn the_guest_path_defaults_to_the_host_path_and_the_mode_to_rw() {
        let (_d, host) = dir();
        let s = parse(host.to_str().unwrap(), Path::new("/")).unwrap();
        assert_eq!(
            (s.host.clone(), s.inside.clone(), s.writable),
            (host.clone(), host.clone(), true)
        );
        let s = parse(&format!("{}:ro", host.display()), Path::new("/")).unwrap();
        assert_eq!((s.inside.clone(), s.writable), (host.clone(), false));
        let s = parse(
            &format!("{}:/mnt//d/./x:rw", host.display()),
            Path::new("/"),
        )
        .unwrap();
        assert_eq!(s.inside, Path::new("/mnt/d/x"));
        assert!(s.writable);
    }

    #[test]
    fn a_relative_host_path_is_taken_from_the_cwd() {
        let (_d, host) = dir();
        std::fs::create_dir(host.join("sub")).unwrap();
        let s = parse("sub:/mnt/s:ro", &host).unwrap();
        assert_eq!(s.host, host.join("sub"));
    }

    #[test]
    fn bad_shares_are_refused_with_the_reason() {
        let (_d, host) = dir();
        let h = host.display();
        let cases = [
            (format!("{h}:/mnt/a:/b"), "expected HOST[:GUEST][:ro]"),
            (format!("{h}:"), "expected HOST[:GUEST][:ro]"),
            (":/mnt".to_owned(), "expected HOST[:GUEST][:ro]"),
            (format!("{h}/missing:/mnt"), "No such file"),
            (format!("{h}:mnt"), "is not absolute"),
            (format!("{h}:/mnt/../etc"), "has `..` in it"),
            (format!("{h}:/"), "is the root"),
            (format!("{h}:/proc/x"), "under /proc, /sys or /dev"),
            (format!("{h}:/dev"), "under /proc, /sys or /dev"),
        ];
        for (arg, want) in cases {
            let e = parse(&arg, Path::new("/")).unwrap_err().to_string();
            assert!(e.contains(want), "{arg}: {e}");
        }
        let twice = [format!("{h}:/mnt/a"), format!("{h}:/mnt/a/:ro")];
        assert_eq!(
            parse_all(&twice, Path::new("/")).unwrap_err(),
            ShareArgError::Twice("/mnt/a".into())
        );
    }

    #[test]
    fn the_helper_form_carries_odd_paths_unchanged() {
        let (_d, host) = dir();
        let odd = host.join("My Docs, \"x\"");
        std::fs::create_dir(&odd).unwrap();
        let arg = format!("{}:/mnt/My Docs:ro", odd.display());
        let s = parse(&arg, Path::new("/")).unwrap();
        let back = from_helper(&to_helper(&s)).unwrap();
        assert_eq!(back, s);
        for bad in ["a:b", "a:b:rx", "a b:/c:rw", "a:b:rw:x"] {
            assert!(from_helper(bad).is_err(), "{bad}");
        }
    }
}
