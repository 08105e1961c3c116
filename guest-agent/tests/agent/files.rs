//! PutFile and GetFile: writes beneath the root, refusals, round trips.

use std::os::unix::fs::PermissionsExt;

use boxdesk_channel::{Frame, SecretBytes, Session};

use crate::support::{collect, Agent, Run};

fn put(path: &str, mode: u32, offset: u64, data: &[u8]) -> Frame {
    Frame::PutFile {
        path: path.as_bytes().to_vec(),
        mode,
        offset,
        data: SecretBytes::copy_from(data),
    }
}

/// Sends `frames`, half-closes, and collects what comes back.
fn exchange(agent: &Agent, frames: &[Frame]) -> Run {
    let mut s = agent.session();
    for f in frames {
        s.send(f).unwrap();
    }
    s.close_write().unwrap();
    collect(&mut s)
}

fn mode_of(p: &std::path::Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn putfile_creates_the_file_with_its_mode_and_missing_parents() {
    let agent = Agent::start();
    let r = exchange(&agent, &[put("/deep/er/tool.sh", 0o750, 0, b"#!/bin/sh\n")]);
    assert!(r.errors.is_empty() && r.end.is_none(), "{r:?}");
    let file = agent.root.join("deep/er/tool.sh");
    assert_eq!(std::fs::read(&file).unwrap(), b"#!/bin/sh\n");
    assert_eq!(mode_of(&file), 0o750);
    assert!(std::fs::metadata(agent.root.join("deep/er"))
        .unwrap()
        .is_dir());
}

#[test]
fn a_putfile_of_mode_7777_lands_without_setuid_setgid_or_sticky_bits() {
    let agent = Agent::start();
    let r = exchange(
        &agent,
        &[
            put("all", 0o7777, 0, b"x"),
            put("suid", 0o4755, 0, b"y"),
            put("big", 0xffff_ffff, 0, b"z"),
        ],
    );
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(mode_of(&agent.root.join("all")), 0o777);
    assert_eq!(mode_of(&agent.root.join("suid")), 0o755);
    assert_eq!(mode_of(&agent.root.join("big")), 0o777);
}

#[test]
fn putfile_overwrites_an_existing_file_and_leaves_no_temporary_file() {
    let agent = Agent::start();
    std::fs::write(agent.root.join("f"), b"old contents, longer").unwrap();
    let r = exchange(&agent, &[put("f", 0o600, 0, b"new")]);
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(std::fs::read(agent.root.join("f")).unwrap(), b"new");
    assert_eq!(mode_of(&agent.root.join("f")), 0o600);
    let names: Vec<_> = std::fs::read_dir(&agent.root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(names, ["f"]);
}

#[test]
fn three_mib_in_chunks_arrive_intact_and_an_empty_file_is_created() {
    let agent = Agent::start();
    let data: Vec<u8> = (0..3 * 1024 * 1024u32)
        .map(|i| (i * 7 % 251) as u8)
        .collect();
    let mut frames: Vec<Frame> = data
        .chunks(700 * 1024)
        .scan(0u64, |off, c| {
            let f = put("big.bin", 0o644, *off, c);
            *off += c.len() as u64;
            Some(f)
        })
        .collect();
    frames.push(put("empty", 0o644, 0, b""));
    let r = exchange(&agent, &frames);
    assert!(r.errors.is_empty(), "{r:?}");
    assert!(std::fs::read(agent.root.join("big.bin")).unwrap() == data);
    assert_eq!(std::fs::read(agent.root.join("empty")).unwrap(), b"");
}

#[test]
fn a_gap_in_offsets_is_an_error_and_leaves_no_file() {
    let agent = Agent::start();
    let r = exchange(
        &agent,
        &[
            put("gappy", 0o644, 0, b"abc"),
            put("gappy", 0o644, 10, b"def"),
            put("gappy", 0o644, 13, b"g"),
        ],
    );
    assert_eq!(r.errors.len(), 1, "{r:?}");
    assert!(r.errors[0].contains("offset 10"), "{:?}", r.errors);
    assert!(
        std::fs::read_dir(&agent.root).unwrap().next().is_none(),
        "no file, no temp file"
    );
}

#[test]
fn an_overlap_is_an_error_and_a_series_not_starting_at_zero_too() {
    let agent = Agent::start();
    let r = exchange(
        &agent,
        &[
            put("o", 0o644, 0, b"abc"),
            put("o", 0o644, 2, b"x"),
            put("late", 0o644, 5, b"x"),
        ],
    );
    assert_eq!(r.errors.len(), 2, "{r:?}");
    assert!(std::fs::read_dir(&agent.root).unwrap().next().is_none());
}

#[test]
fn traversal_paths_are_refused_and_nothing_is_written() {
    let agent = Agent::start();
    let r = exchange(
        &agent,
        &[
            put("../x", 0o644, 0, b"x"),
            put("a/../../x", 0o644, 0, b"x"),
        ],
    );
    assert_eq!(r.errors.len(), 2, "{r:?}");
    assert!(
        r.errors.iter().all(|e| e.contains("'..'")),
        "{:?}",
        r.errors
    );
    assert!(!agent.base.join("x").exists());
    assert!(std::fs::read_dir(&agent.root).unwrap().next().is_none());
}

#[test]
fn a_symlinked_directory_component_is_refused_and_nothing_is_written() {
    let agent = Agent::start();
    let outside = agent.base.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::os::unix::fs::symlink(&outside, agent.root.join("link")).unwrap();
    let r = exchange(
        &agent,
        &[
            put("link/x", 0o644, 0, b"x"),
            put("/link/new/y", 0o644, 0, b"y"),
        ],
    );
    assert_eq!(r.errors.len(), 2, "{r:?}");
    assert!(
        r.errors.iter().all(|e| e.contains("ELOOP")),
        "{:?}",
        r.errors
    );
    assert!(std::fs::read_dir(&outside).unwrap().next().is_none());
}

#[test]
fn a_symlink_at_the_target_is_replaced_and_its_target_left_alone() {
    let agent = Agent::start();
    let victim = agent.base.join("victim");
    std::fs::write(&victim, b"untouched").unwrap();
    std::os::unix::fs::symlink(&victim, agent.root.join("t")).unwrap();
    let r = exchange(&agent, &[put("t", 0o644, 0, b"replaced")]);
    assert!(r.errors.is_empty(), "{r:?}");
    assert_eq!(std::fs::read(&victim).unwrap(), b"untouched");
    let meta = std::fs::symlink_metadata(agent.root.join("t")).unwrap();
    assert!(meta.file_type().is_file());
    assert_eq!(std::fs::read(agent.root.join("t")).unwrap(), b"replaced");
}

fn get(s: &mut Session, path: &str) {
    s.send(&Frame::GetFile(path.as_bytes().to_vec())).unwrap();
}

#[test]
fn getfile_round_trips_and_a_missing_file_is_an_error_then_the_session_goes_on() {
    let agent = Agent::start();
    let data: Vec<u8> = (0..1_500_000u32).map(|i| (i % 256) as u8).collect();
    let mut s = agent.session();
    for (i, chunk) in data.chunks(512 << 10).enumerate() {
        s.send(&put("/dir/rt.bin", 0o640, (i << 19) as u64, chunk))
            .unwrap();
    }
    get(&mut s, "/dir/rt.bin");
    get(&mut s, "/dir/missing");
    get(&mut s, "/dir/../etc/passwd");
    s.send(&Frame::Exec(crate::support::sh("exit 5"))).unwrap();
    let r = collect(&mut s);
    let got = &r.files["/dir/rt.bin"];
    assert_eq!((got.mode, got.total), (0o640, data.len() as u64));
    assert!(got.data == data);
    assert_eq!(r.errors.len(), 2, "{:?}", r.errors);
    assert!(r.errors[0].contains("ENOENT"), "{:?}", r.errors);
    assert_eq!(r.exit, Some(5), "the session went on to its exec");
}

#[test]
fn getfile_of_an_empty_file_is_one_file_frame_and_a_symlink_is_refused() {
    let agent = Agent::start();
    std::fs::write(agent.root.join("empty"), b"").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", agent.root.join("l")).unwrap();
    let mut s = agent.session();
    get(&mut s, "empty");
    assert_eq!(
        s.recv().unwrap(),
        Some(Frame::File {
            path: b"empty".to_vec(),
            mode: 0o644,
            offset: 0,
            total_size: 0,
            data: vec![]
        })
    );
    get(&mut s, "l");
    s.close_write().unwrap();
    let r = collect(&mut s);
    assert!(r.files.is_empty());
    assert!(
        r.errors.len() == 1 && r.errors[0].contains("ELOOP"),
        "{:?}",
        r.errors
    );
}
