//! Output and input streams: completeness, bytes, back-pressure, EOF.

use std::time::{Duration, Instant};

use boxdesk_channel::{Exec, Frame, SecretBytes};
use sha2::{Digest, Sha256};

use crate::support::{collect, collect_with, sh, Agent};

#[test]
fn non_utf8_output_is_preserved_byte_for_byte() {
    let agent = Agent::start();
    let r = agent.run(sh(r"printf '\377\376'; printf '\000\001' >&2"));
    assert_eq!(r.stdout, b"\xff\xfe");
    assert_eq!(r.stderr, b"\x00\x01");
}

#[test]
fn a_burst_then_an_immediate_exit_loses_nothing() {
    let agent = Agent::start();
    let r = agent.run(Exec::new("seq", ["1", "200000"]));
    assert_eq!(r.exit, Some(0));
    let text = r.stdout_text();
    assert_eq!(text.lines().count(), 200_000);
    assert_eq!(text.lines().last(), Some("200000"));
    assert_eq!(r.order, ["out", "exit"], "Exit comes after all output");
}

#[test]
fn sixty_four_mib_on_stdout_and_on_stderr_at_once_arrive_complete() {
    let agent = Agent::start();
    let mut s = agent.session();
    // Deterministic, non-repeating data on both streams at the same time.
    let script = "seq 1 10000000 | head -c 67108864 | tee /dev/stderr";
    s.send(&Frame::Exec(sh(script))).unwrap();
    let (mut out, mut err) = (Sha256::new(), Sha256::new());
    let (mut n_out, mut n_err) = (0u64, 0u64);
    let mut sink = |is_out: bool, d: &[u8]| {
        if is_out {
            out.update(d);
            n_out += d.len() as u64;
        } else {
            err.update(d);
            n_err += d.len() as u64;
        }
    };
    let r = collect_with(&mut s, Some(&mut sink));
    assert_eq!(r.exit, Some(0), "{:?}", r.errors);
    assert_eq!((n_out, n_err), (67_108_864, 67_108_864));
    let expected = std::process::Command::new("sh")
        .args(["-c", "seq 1 10000000 | head -c 67108864 | sha256sum"])
        .output()
        .unwrap();
    let expected = String::from_utf8_lossy(&expected.stdout)[..64].to_string();
    assert_eq!(hex(&out.finalize()), expected);
    assert_eq!(hex(&err.finalize()), expected);
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn ten_mib_of_stdin_frames_reach_wc_and_eof_ends_it() {
    let agent = Agent::start();
    let mut s = agent.session();
    s.send(&Frame::Exec(Exec::new("wc", ["-c"]))).unwrap();
    // Frames of assorted sizes up to the 1 MiB maximum, 10 MiB in all.
    let sizes = [1 << 20, 1, 4095, 65536, 1 << 19];
    let mut left = 10usize << 20;
    for size in sizes.iter().cycle() {
        let n = (*size).min(left);
        s.send(&Frame::Stdin(SecretBytes::new(vec![b'x'; n])))
            .unwrap();
        left -= n;
        if left == 0 {
            break;
        }
    }
    s.send(&Frame::Stdin(SecretBytes::default())).unwrap();
    let r = collect(&mut s);
    assert_eq!((r.exit, r.stdout_text().trim()), (Some(0), "10485760"));
}

#[test]
fn cat_ends_when_stdin_reaches_eof() {
    let agent = Agent::start();
    let mut s = agent.session();
    s.send(&Frame::Exec(Exec::new("cat", Vec::<&str>::new())))
        .unwrap();
    s.send(&Frame::Stdin("hello ".into())).unwrap();
    s.send(&Frame::Stdin("world".into())).unwrap();
    s.send(&Frame::Stdin(SecretBytes::default())).unwrap();
    let r = collect(&mut s);
    assert_eq!((r.exit, r.stdout_text().as_str()), (Some(0), "hello world"));
}

#[test]
fn stdin_after_eof_is_answered_with_an_error_and_the_exec_goes_on() {
    let agent = Agent::start();
    let mut s = agent.session();
    s.send(&Frame::Exec(sh("cat; echo done"))).unwrap();
    s.send(&Frame::Stdin(SecretBytes::default())).unwrap();
    s.send(&Frame::Stdin("late".into())).unwrap();
    let r = collect(&mut s);
    assert_eq!((r.exit, r.stdout_text().as_str()), (Some(0), "done\n"));
    assert_eq!(r.errors.len(), 1, "{:?}", r.errors);
    assert!(r.errors[0].contains("after stdin EOF"), "{:?}", r.errors);
}

#[test]
fn resize_on_a_pipe_exec_is_an_error_and_the_exec_goes_on() {
    let agent = Agent::start();
    let mut s = agent.session();
    s.send(&Frame::Exec(sh("read x; echo got $x"))).unwrap();
    s.send(&Frame::Resize(boxdesk_channel::WinSize {
        cols: 10,
        rows: 5,
    }))
    .unwrap();
    s.send(&Frame::Stdin("it\n".into())).unwrap();
    let r = collect(&mut s);
    assert_eq!((r.exit, r.stdout_text().as_str()), (Some(0), "got it\n"));
    assert_eq!(r.errors.len(), 1);
    assert!(r.errors[0].contains("Resize"), "{:?}", r.errors);
}

#[test]
fn yes_piped_into_head_ends() {
    let agent = Agent::start();
    let r = agent.run(sh("yes | head -1"));
    assert_eq!((r.exit, r.stdout_text().as_str()), (Some(0), "y\n"));
}

#[test]
fn a_backgrounded_sleep_holding_the_pipes_does_not_delay_exit() {
    let agent = Agent::start();
    let start = Instant::now();
    let r = agent.run(sh("echo before; sleep 100.4242 &"));
    assert_eq!((r.exit, r.stdout_text().as_str()), (Some(0), "before\n"));
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "took {:?}",
        start.elapsed()
    );
    // And it ended with the exec: nothing of an exec's session outlives
    // its Exit.
    let left = crate::support::pids_with("sleep 100.4242");
    for &pid in &left {
        // SAFETY: kill has no memory arguments.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    }
    assert_eq!(
        left,
        Vec::<u32>::new(),
        "the background sleep outlived Exit"
    );
}

#[test]
fn a_slow_reader_bounds_the_agent_and_still_gets_everything() {
    let agent = Agent::start();
    let mut s = agent.session();
    s.send(&Frame::Exec(sh("head -c 8388608 /dev/zero")))
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    // The agent must not have read the child's whole output into memory.
    let rss = agent_rss_kib(agent.pid());
    assert!(
        rss < 64 * 1024,
        "agent RSS {rss} KiB while the host was not reading"
    );
    let r = collect(&mut s);
    assert_eq!((r.exit, r.stdout.len()), (Some(0), 8_388_608));
}

fn agent_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}
