//! What the root package's benches share: the binary under test and a
//! private (0700) scratch root for its XDG dirs.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

/// `$BOXDESK_BIN` (e.g. a static build), else this package's `boxdesk`.
pub fn bin() -> PathBuf {
    std::env::var_os("BOXDESK_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_boxdesk")))
}

/// `$TMPDIR/<prefix>-<pid>` with the sub-directories `dirs`, all 0700 (the
/// runtime dir must be ours and private before boxdesk trusts it).
pub fn private_root(prefix: &str, dirs: &[&str]) -> PathBuf {
    let root = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    for d in std::iter::once("").chain(dirs.iter().copied()) {
        let p = root.join(d);
        std::fs::create_dir_all(&p).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
    }
    root
}
