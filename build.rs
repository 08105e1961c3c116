//! Build-time facts for `boxdesk --version`: the git commit, the target
//! triple and the backends this target compiles in, as `BOXDESK_*`
//! compile-time environment variables (`BOXDESK_LONG_VERSION` is the whole
//! line after the program name).
//!
//! It must never fail the build: without git, without `.git` (a crates.io
//! tarball, a source archive) or outside a checkout of this package, the
//! commit is the one `cargo package` recorded, else `unknown`.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let env = |k: &str| std::env::var(k).unwrap_or_default();
    let target = env("TARGET");
    let backends = backends(&env("CARGO_CFG_TARGET_OS"), &env("CARGO_CFG_TARGET_ARCH"));
    let manifest_dir = PathBuf::from(env("CARGO_MANIFEST_DIR"));
    let commit = git_commit(&manifest_dir)
        .or_else(|| packaged_commit(&manifest_dir))
        .unwrap_or_else(|| "unknown".to_owned());

    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-env=BOXDESK_COMMIT={commit}");
    println!("cargo:rustc-env=BOXDESK_TARGET={target}");
    println!("cargo:rustc-env=BOXDESK_BACKENDS={backends}");
    println!(
        "cargo:rustc-env=BOXDESK_LONG_VERSION={} (commit {commit}, target {target}, backends: {backends})",
        env("CARGO_PKG_VERSION")
    );
}

/// The backends `cfg(target_os, target_arch)` compiles in (docs/DESIGN.md:
/// namespace and KVM on Linux, Hypervisor.framework on Apple silicon).
fn backends(os: &str, arch: &str) -> &'static str {
    match (os, arch) {
        ("linux", _) => "namespace kvm",
        ("macos", "aarch64") => "hvf",
        _ => "none",
    }
}

/// Runs git in `dir`; `None` when git is missing or fails.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_OPTIONAL_LOCKS", "0")
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// Short hash of HEAD, `-dirty` when tracked files differ from it; only when
/// this package's directory is the top of the work tree (so a tarball
/// unpacked inside some other repository does not report that one's commit).
/// Watches HEAD and the ref it points to, so a commit or checkout reruns it.
fn git_commit(dir: &Path) -> Option<String> {
    let top = PathBuf::from(git(dir, &["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    let git_dir = PathBuf::from(git(dir, &["rev-parse", "--absolute-git-dir"])?);
    let common = git(dir, &["rev-parse", "--git-common-dir"]).map(|c| dir.join(c));
    let mut watch = vec![git_dir.join("HEAD")];
    if let Some(reference) = git(dir, &["symbolic-ref", "-q", "HEAD"]) {
        for base in [Some(&git_dir), common.as_ref()].into_iter().flatten() {
            watch.push(base.join(&reference));
            watch.push(base.join("packed-refs"));
        }
    }
    watch.sort();
    watch.dedup();
    // A path that does not exist would make cargo rerun this every build.
    for path in watch.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }

    let hash = git(dir, &["rev-parse", "--short=7", "HEAD"])?;
    let dirty =
        git(dir, &["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    Some(if dirty { format!("{hash}-dirty") } else { hash })
}

/// The commit `cargo package` wrote into `.cargo_vcs_info.json` (a crates.io
/// tarball has no `.git`).
fn packaged_commit(dir: &Path) -> Option<String> {
    let info = std::fs::read_to_string(dir.join(".cargo_vcs_info.json")).ok()?;
    let rest = &info[info.find("\"sha1\"")? + 6..];
    let start = rest.find('"')? + 1;
    let sha: String = rest[start..]
        .chars()
        .take_while(|c| c.is_ascii_hexdigit())
        .take(7)
        .collect();
    if sha.len() < 7 {
        return None;
    }
    let dirty = info.contains("\"dirty\": true") || info.contains("\"dirty\":true");
    Some(if dirty { format!("{sha}-dirty") } else { sha })
}
