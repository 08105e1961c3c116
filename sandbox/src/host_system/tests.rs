use std::os::unix::fs::symlink;

use super::*;

/// A host root with a merged `/usr`, `/etc` and what `setup` adds.
fn host(setup: impl FnOnce(&Path)) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    fs::create_dir_all(r.join("usr/bin")).unwrap();
    fs::create_dir_all(r.join("usr/lib")).unwrap();
    fs::create_dir_all(r.join("etc")).unwrap();
    symlink("usr/bin", r.join("bin")).unwrap();
    symlink("usr/lib", r.join("lib")).unwrap();
    fs::write(r.join("etc/hosts"), "127.0.0.1 localhost\n").unwrap();
    setup(r);
    root
}

fn dir(p: &str) -> HostEntry {
    HostEntry::Dir(p.into())
}

fn link(p: &str, t: &str) -> HostEntry {
    HostEntry::Symlink {
        path: p.into(),
        target: t.into(),
    }
}

#[test]
fn the_system_and_the_toolchains_beside_it_are_shared_in_order() {
    let root = host(|r| {
        fs::create_dir_all(r.join("opt/tool/bin")).unwrap();
        fs::create_dir_all(r.join("nix/store")).unwrap();
        fs::create_dir_all(r.join("home/u")).unwrap();
        fs::create_dir_all(r.join("var/lib")).unwrap();
    });
    assert_eq!(
        scan(root.path()).unwrap(),
        vec![
            dir("/usr"),
            link("/bin", "usr/bin"),
            dir("/etc"),
            link("/lib", "usr/lib"),
            dir("/opt"),
            dir("/nix"),
        ]
    );
}

#[test]
fn a_snap_link_and_a_usr_local_elsewhere_bring_their_directories() {
    let root = host(|r| {
        fs::create_dir_all(r.join("var/lib/snapd/snap/bin")).unwrap();
        symlink("/var/lib/snapd/snap", r.join("snap")).unwrap();
        fs::create_dir_all(r.join("var/usrlocal/bin")).unwrap();
        symlink("../var/usrlocal", r.join("usr/local")).unwrap();
    });
    let entries = scan(root.path()).unwrap();
    assert!(
        entries.contains(&link("/snap", "/var/lib/snapd/snap")),
        "{entries:?}"
    );
    assert!(entries.contains(&dir("/var/lib/snapd/snap")), "{entries:?}");
    assert!(entries.contains(&dir("/var/usrlocal")), "{entries:?}");
    assert!(!entries.contains(&dir("/var")), "{entries:?}");
}

#[test]
fn nixos_profile_links_are_recreated_in_the_sandboxs_run() {
    let root = host(|r| {
        fs::create_dir_all(r.join("nix/store/abc-system/sw/bin")).unwrap();
        fs::create_dir_all(r.join("run")).unwrap();
        symlink("/nix/store/abc-system", r.join("run/current-system")).unwrap();
    });
    let entries = scan(root.path()).unwrap();
    let l = link("/run/current-system", "/nix/store/abc-system");
    assert!(entries.contains(&l), "{entries:?}");
    assert!(l.in_run() && !dir("/nix").in_run());
}

#[test]
fn a_systemd_resolved_link_gets_a_copy_where_it_leads_and_a_regular_hosts_none() {
    let root = host(|r| {
        fs::create_dir_all(r.join("run/systemd/resolve")).unwrap();
        fs::write(
            r.join("run/systemd/resolve/stub-resolv.conf"),
            "nameserver 127.0.0.53\n",
        )
        .unwrap();
        symlink(
            "../run/systemd/resolve/stub-resolv.conf",
            r.join("etc/resolv.conf"),
        )
        .unwrap();
    });
    let entries = scan(root.path()).unwrap();
    let copies = etc_copies(root.path(), &entries, None);
    assert_eq!(
        copies,
        vec![EtcCopy {
            name: "resolv.conf",
            inside: "/run/systemd/resolve/stub-resolv.conf".into(),
            own: None
        }]
    );
    let state = tempfile::tempdir().unwrap();
    let files = EtcFiles::prepare(root.path(), state.path(), &entries, copies).unwrap();
    let [Placement::Dir { host, inside }] = files.placements() else {
        panic!("{:?}", files.placements());
    };
    assert_eq!(inside, Path::new("/run/systemd/resolve"));
    assert_eq!(
        fs::read_to_string(host.join("stub-resolv.conf")).unwrap(),
        "nameserver 127.0.0.53\n"
    );
    // Nothing else of the host's directory (its varlink socket) is copied.
    assert_eq!(fs::read_dir(host).unwrap().count(), 1);
}

#[test]
fn a_copy_follows_the_hosts_file_when_it_changes_and_keeps_the_last_while_it_is_gone() {
    let root = host(|r| {
        fs::create_dir_all(r.join("run/NetworkManager")).unwrap();
        fs::write(
            r.join("run/NetworkManager/resolv.conf"),
            "nameserver 127.0.0.1\n",
        )
        .unwrap();
        symlink("/run/NetworkManager/resolv.conf", r.join("etc/resolv.conf")).unwrap();
    });
    let entries = scan(root.path()).unwrap();
    let state = tempfile::tempdir().unwrap();
    let copies = etc_copies(root.path(), &entries, None);
    let mut files = EtcFiles::prepare(root.path(), state.path(), &entries, copies).unwrap();
    let [Placement::Dir { host, .. }] = &files.placements().to_vec()[..] else {
        panic!("{:?}", files.placements());
    };
    let copy = host.join("resolv.conf");
    assert_eq!(files.refresh().unwrap(), 0);
    // Roaming: a new file renamed over the old, as NetworkManager does.
    let nm = root.path().join("run/NetworkManager");
    fs::write(nm.join("tmp"), "nameserver 127.0.0.2\n").unwrap();
    fs::rename(nm.join("tmp"), nm.join("resolv.conf")).unwrap();
    assert_eq!(files.refresh().unwrap(), 1);
    assert_eq!(fs::read_to_string(&copy).unwrap(), "nameserver 127.0.0.2\n");
    fs::remove_file(nm.join("resolv.conf")).unwrap();
    assert_eq!(files.refresh().unwrap(), 0);
    assert_eq!(fs::read_to_string(&copy).unwrap(), "nameserver 127.0.0.2\n");
}

#[test]
fn nixos_etc_links_into_the_store_resolve_inside_and_need_no_copy() {
    let root = host(|r| {
        fs::remove_file(r.join("etc/hosts")).unwrap();
        fs::create_dir_all(r.join("nix/store/x-etc/etc")).unwrap();
        fs::write(r.join("nix/store/x-etc/etc/hosts"), "127.0.0.1 localhost\n").unwrap();
        symlink("/nix/store/x-etc/etc", r.join("etc/static")).unwrap();
        symlink("/etc/static/hosts", r.join("etc/hosts")).unwrap();
        fs::write(r.join("etc/resolv.conf"), "nameserver 127.0.0.1\n").unwrap();
    });
    let entries = scan(root.path()).unwrap();
    assert_eq!(etc_copies(root.path(), &entries, None), vec![]);
    // Without /nix shared, the same link would dangle and get a copy.
    let no_nix: Vec<_> = entries
        .into_iter()
        .filter(|e| e.path() != Path::new("/nix"))
        .collect();
    let copies = etc_copies(root.path(), &no_nix, None);
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].inside, Path::new("/nix/store/x-etc/etc/hosts"));
}

#[test]
fn a_private_networks_resolver_replaces_a_regular_resolv_conf_in_place() {
    let root = host(|r| fs::write(r.join("etc/resolv.conf"), "nameserver 127.0.0.53\n").unwrap());
    let entries = scan(root.path()).unwrap();
    let copies = etc_copies(root.path(), &entries, Some("nameserver 127.0.0.1\n"));
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].inside, Path::new("/etc/resolv.conf"));
    let state = tempfile::tempdir().unwrap();
    let files = EtcFiles::prepare(root.path(), state.path(), &entries, copies).unwrap();
    let [Placement::File { host, inside }] = files.placements() else {
        panic!("{:?}", files.placements());
    };
    assert_eq!(inside, Path::new("/etc/resolv.conf"));
    assert_eq!(fs::read_to_string(host).unwrap(), "nameserver 127.0.0.1\n");
}

#[test]
fn a_link_into_proc_a_loop_or_a_dangling_host_link_gets_no_copy() {
    for target in ["/proc/self/net/resolv", "loop", "/run/gone/resolv.conf"] {
        let root = host(|r| {
            symlink("resolv.conf", r.join("etc/loop")).unwrap();
            let t = if target == "loop" { "loop" } else { target };
            symlink(t, r.join("etc/resolv.conf")).unwrap();
        });
        let entries = scan(root.path()).unwrap();
        let copies = etc_copies(root.path(), &entries, None);
        assert_eq!(copies, vec![], "{target}");
    }
}

#[test]
fn a_link_to_a_file_directly_in_run_is_placed_as_a_file_not_over_run() {
    let root = host(|r| {
        fs::create_dir_all(r.join("run")).unwrap();
        fs::write(r.join("run/resolv.conf"), "nameserver 127.0.0.1\n").unwrap();
        symlink("/run/resolv.conf", r.join("etc/resolv.conf")).unwrap();
    });
    let entries = scan(root.path()).unwrap();
    let copies = etc_copies(root.path(), &entries, None);
    let state = tempfile::tempdir().unwrap();
    let mut files = EtcFiles::prepare(root.path(), state.path(), &entries, copies).unwrap();
    let [Placement::File { host, inside }] = &files.placements().to_vec()[..] else {
        panic!("{:?}", files.placements());
    };
    assert_eq!(inside, Path::new("/run/resolv.conf"));
    // Refreshed in place: the inode the sandbox sees is the same.
    use std::os::unix::fs::MetadataExt;
    let ino = fs::metadata(host).unwrap().ino();
    fs::write(
        root.path().join("run/resolv.conf"),
        "nameserver 127.0.0.3\n",
    )
    .unwrap();
    assert_eq!(files.refresh().unwrap(), 1);
    assert_eq!(fs::metadata(host).unwrap().ino(), ino);
    assert_eq!(fs::read_to_string(host).unwrap(), "nameserver 127.0.0.3\n");
}

#[test]
fn doctor_says_which_resolver_a_sandbox_uses_and_what_is_shared() {
    let root = host(|r| {
        fs::create_dir_all(r.join("opt")).unwrap();
        fs::create_dir_all(r.join("run/systemd/resolve")).unwrap();
        fs::write(
            r.join("run/systemd/resolve/stub-resolv.conf"),
            "nameserver 127.0.0.53\n",
        )
        .unwrap();
        symlink(
            "../run/systemd/resolve/stub-resolv.conf",
            r.join("etc/resolv.conf"),
        )
        .unwrap();
    });
    let lines = doctor_lines(root.path());
    assert_eq!(
        lines[0],
        ("host system", "/usr /etc /opt shared read-only".to_owned())
    );
    assert_eq!(lines[1].0, "dns");
    let dns = &lines[1].1;
    assert!(dns.starts_with("/etc/resolv.conf -> ../run/systemd/resolve/stub-resolv.conf (nameserver 127.0.0.53): a sandbox's /run is its own, so it gets a copy at /run/systemd/resolve/stub-resolv.conf, kept current; a resolver on the host's loopback"), "{dns}");
    let plain = host(|r| fs::write(r.join("etc/resolv.conf"), "nameserver 127.0.0.2\n").unwrap());
    let dns = &doctor_lines(plain.path())[1].1;
    assert!(dns.starts_with("/etc/resolv.conf (nameserver 127.0.0.2): sandboxes read it as the host does, live; a resolver"), "{dns}");
    let none = host(|_| {});
    assert!(doctor_lines(none.path())[1]
        .1
        .contains("missing on the host"));
}
