//! `boxdesk cowork install | uninstall | status`: the words around
//! `boxdesk_cowork::app::install`, which does the work (find the app, keep
//! its helper checksummed, put a link to this boxdesk in its place, check
//! it as the app starts it; and back).
//!
//! This module owns what is printed and which boxdesk path the link
//! points to; it never touches a file itself. Where AppArmor restricts
//! user namespaces, `install` also installs boxdesk's AppArmor profile as
//! root, or says the one command to run (`cli::apparmor`); it exits 1
//! when boxdesk still cannot make its namespaces.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use boxdesk_cowork::app::install::{self as inst, HelperFile, State, Uninstalled};
use boxdesk_cowork::app::layout::{self, AppDir, LayoutError};

/// The path the link points to: this boxdesk as it was invoked (an
/// `argv[0]` with a `/`, or the `PATH` entry that found it) when that is
/// the running binary — so a link through a stable path (a package
/// manager's `bin/`) survives upgrades —, else the running binary itself.
pub fn this_boxdesk() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe().context("locating the boxdesk binary")?;
    let real = std::fs::canonicalize(&exe).unwrap_or(exe);
    let argv0 = std::env::args_os().next().unwrap_or_default();
    let a0 = Path::new(&argv0);
    let mut candidates: Vec<PathBuf> = Vec::new();
    if argv0.as_encoded_bytes().contains(&b'/') {
        let dir = a0.parent().filter(|d| !d.as_os_str().is_empty());
        let dir = dir.and_then(|d| std::fs::canonicalize(d).ok());
        if let (Some(dir), Some(name)) = (dir, a0.file_name()) {
            candidates.push(dir.join(name));
        }
    } else if let Some(path) = std::env::var_os("PATH") {
        candidates.extend(
            std::env::split_paths(&path)
                .filter(|d| d.is_absolute())
                .map(|d| d.join(&argv0)),
        );
    }
    Ok(candidates
        .into_iter()
        .find(|c| std::fs::canonicalize(c).is_ok_and(|r| r == real))
        .unwrap_or(real))
}

/// The subcommand as the user would repeat it under sudo.
fn command(word: &str, app: Option<&Path>) -> String {
    match app {
        Some(a) => format!("{word} --app {}", quoted(a.as_os_str().to_owned())),
        None => word.to_owned(),
    }
}

/// A path as a shell word.
fn quoted(p: OsString) -> String {
    let s = p.to_string_lossy().into_owned();
    if s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-+:@".contains(&b))
    {
        s
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The app, found, or why not (an AppImage file gets its alternative).
fn find(app: Option<&Path>, boxdesk: &Path) -> anyhow::Result<AppDir> {
    match layout::find(app) {
        Ok(a) => Ok(a),
        Err(LayoutError::AppImageFile(f)) => anyhow::bail!(
            "{} is an AppImage, whose files are read-only: boxdesk cannot replace the app's helper inside it; {}",
            f.display(),
            inst::appimage_alternative(boxdesk)
        ),
        Err(e) => Err(e.into()),
    }
}

fn short(sha: &str) -> &str {
    sha.get(..16).unwrap_or(sha)
}

/// `boxdesk cowork install [--app DIR]`.
pub fn install(app: Option<&Path>) -> anyhow::Result<i32> {
    let boxdesk = this_boxdesk()?;
    let dir = find(app, &boxdesk)?;
    println!("app: {} ({})", dir.resources.display(), dir.kind);
    let done = inst::install(&dir, &boxdesk, &command("install", app))?;
    let m = &done.manifest;
    if done.already {
        println!("boxdesk was already installed; the app's own helper is kept, intact:");
    } else if done.kept_newer {
        println!(
            "an app update had replaced boxdesk; kept its new helper instead of the old copy:"
        );
    } else {
        println!("kept the app's own helper:");
    }
    println!(
        "  {} (sha256 {}…, {} bytes)",
        done.original.display(),
        short(&m.sha256),
        m.bytes
    );
    println!(
        "installed: {} -> {}",
        done.helper.display(),
        m.link.display()
    );
    println!(
        "checked: `{} -socket <a private socket>` answered a one-shot isRunning with {}",
        done.helper.display(),
        done.answer
    );
    let (lines, can_make_namespaces) = crate::cli::apparmor::for_cowork_install();
    for line in lines {
        println!("{line}");
    }
    println!("restart the app to use it; `boxdesk cowork doctor` says whether the app will start its helper here at all");
    Ok(i32::from(!can_make_namespaces))
}

/// `boxdesk cowork uninstall [--app DIR]`.
pub fn uninstall(app: Option<&Path>) -> anyhow::Result<i32> {
    let boxdesk = this_boxdesk()?;
    let dir = find(app, &boxdesk)?;
    println!("app: {} ({})", dir.resources.display(), dir.kind);
    match inst::uninstall(&dir, &boxdesk, &command("uninstall", app))? {
        Uninstalled::Restored { helper, sha256 } => println!(
            "restored the app's own helper: {} (sha256 {}…, as kept)",
            helper.display(),
            short(&sha256)
        ),
        Uninstalled::AlreadyReplaced { helper } => println!(
            "an app update had already put its own helper back at {}; removed boxdesk's stale copy of the old one",
            helper.display()
        ),
    }
    Ok(0)
}

/// `boxdesk cowork status [--app DIR] [--json]`: exit 0 when boxdesk is
/// installed and intact, 1 otherwise.
pub fn status(app: Option<&Path>, json: bool) -> anyhow::Result<i32> {
    let boxdesk = this_boxdesk()?;
    let dir = find(app, &boxdesk)?;
    let st = inst::status(&dir, &boxdesk)?;
    let code = i32::from(st.state != State::Installed);
    if json {
        println!("{}", serde_json::to_string_pretty(&st)?);
        return Ok(code);
    }
    println!("app: {} ({})", st.resources.display(), st.kind);
    for line in describe(&st) {
        println!("{line}");
    }
    Ok(code)
}

/// [`inst::Status`] in words, one line each.
pub fn describe(st: &inst::Status) -> Vec<String> {
    let helper = st.resources.join(boxdesk_cowork::app::HELPER);
    let mut out = Vec::new();
    let kept = st.manifest.as_ref().map(|m| {
        format!(
            "{} (sha256 {}…, {} bytes{})",
            st.resources.join(&m.original).display(),
            short(&m.sha256),
            m.bytes,
            match st.original_ok {
                Some(true) => ", intact",
                _ => ", MISSING OR CHANGED",
            }
        )
    });
    let app_file = |h: &HelperFile| match h {
        HelperFile::App { sha256, bytes } => {
            format!(
                "the app's own helper (sha256 {}…, {bytes} bytes)",
                short(sha256)
            )
        }
        HelperFile::Missing => "missing".to_owned(),
        HelperFile::Unreadable { why } => format!("unreadable: {why}"),
        HelperFile::Boxdesk { link } => format!("a link to {}", link.display()),
    };
    match st.state {
        State::Installed | State::Damaged => {
            out.push(format!(
                "{}: boxdesk ({})",
                helper.display(),
                app_file(&st.helper)
            ));
            match kept {
                Some(k) => out.push(format!("the app's own helper is kept as {k}")),
                None => out.push("no manifest: this link was not made by `boxdesk cowork install`, and the app's own helper is not kept".to_owned()),
            }
        }
        State::ReplacedByUpdate => {
            out.push(format!(
                "{}: {} — an app update replaced boxdesk",
                helper.display(),
                app_file(&st.helper)
            ));
            out.push("run `boxdesk cowork install` again to put boxdesk back (the app's new helper is kept, the old copy dropped)".to_owned());
        }
        State::NotInstalled => {
            out.push(format!(
                "{}: {} — boxdesk is not installed",
                helper.display(),
                app_file(&st.helper)
            ));
        }
    }
    let state = match st.state {
        State::Installed => "installed",
        State::Damaged => {
            "damaged: boxdesk is in place but the app's kept helper is not as it was kept"
        }
        State::ReplacedByUpdate => "replaced by an app update",
        State::NotInstalled => "not installed",
    };
    out.push(format!("state: {state}"));
    if !st.writable {
        out.push(format!(
            "changing it needs root (`sudo boxdesk cowork install`) or is impossible here (see `boxdesk cowork install`): {} is not writable by this user",
            st.resources.display()
        ));
    }
    out
}
