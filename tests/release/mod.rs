//! Release assets in `dist/` that no build here exercises: the macOS
//! entitlements (a malformed plist, or a hypervisor key that is not
//! `<true/>`, only shows on a Mac as a failing `hv_vm_create`) and the
//! scripts `.cargo/config.toml` hands to cargo for `aarch64-apple-darwin`.
//! `scripts/test-dist.sh` checks cargo-dist's plan and archive.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// Read at compile time, so the unprivileged re-run needs no access to the
/// source tree.
const ENTITLEMENTS: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/dist/macos/boxdesk.entitlements"
));
const CARGO_CONFIG: &str = include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/.cargo/config.toml"));

/// The element children of `n`.
fn elements<'a, 'i>(n: roxmltree::Node<'a, 'i>) -> Vec<roxmltree::Node<'a, 'i>> {
    n.children().filter(|c| c.is_element()).collect()
}

#[test]
fn the_entitlements_plist_is_well_formed_and_grants_the_hypervisor() {
    let opts = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    let doc = roxmltree::Document::parse_with_options(ENTITLEMENTS, opts)
        .unwrap_or_else(|e| panic!("dist/macos/boxdesk.entitlements is not well-formed XML: {e}"));
    let plist = doc.root_element();
    assert_eq!(plist.tag_name().name(), "plist");
    assert_eq!(plist.attribute("version"), Some("1.0"));
    let top = elements(plist);
    assert_eq!(top.len(), 1, "a plist holds exactly one top-level value");
    let dict = top[0];
    assert_eq!(dict.tag_name().name(), "dict");

    // A dict is <key> then its value, pairwise.
    let entries = elements(dict);
    assert_eq!(entries.len() % 2, 0, "a <key> without a value");
    let mut hypervisor = None;
    for pair in entries.chunks(2) {
        assert_eq!(pair[0].tag_name().name(), "key", "a value without a <key>");
        if pair[0].text() == Some("com.apple.security.hypervisor") {
            assert!(hypervisor.is_none(), "the hypervisor key is there twice");
            hypervisor = Some(pair[1].tag_name().name());
        }
    }
    assert_eq!(
        hypervisor,
        Some("true"),
        "com.apple.security.hypervisor must be <true/>"
    );
}

#[test]
fn the_macos_linker_and_runner_cargo_is_given_exist_and_are_executable() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    if let Err(e) = std::fs::read_dir(root.join("dist/macos")) {
        // The unprivileged re-run may not see the source tree.
        println!("skipped: dist/macos is not readable here: {e}");
        return;
    }
    let mut seen = 0;
    for key in ["linker", "runner"] {
        let line = CARGO_CONFIG
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{key} =")))
            .unwrap_or_else(|| panic!(".cargo/config.toml has no {key}"));
        let script = line.split('"').nth(1).expect("a quoted path");
        assert!(script.starts_with("dist/macos/"), "{line}");
        let mode = std::fs::metadata(root.join(script))
            .unwrap_or_else(|e| panic!("{script}: {e}"))
            .permissions()
            .mode();
        assert!(mode & 0o111 != 0, "{script} is not executable");
        seen += 1;
    }
    assert_eq!(seen, 2);
    assert!(CARGO_CONFIG.contains("[target.aarch64-apple-darwin]"));
}
