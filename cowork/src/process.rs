//! Spawned processes: the table behind `isProcessRunning`, `kill` and
//! `writeStdin`, and the task that runs one process as one channel session
//! with the sandbox's agent and turns its frames into events.
//!
//! Ids are the client's. An entry carries a generation, so the exit of an
//! old process can never touch the entry of a newer one with the same id.
//! The agent protocol is `boxdesk_sandbox::client`'s (one exec per process,
//! through its tokio flavour); an exit's code is the client's one mapping
//! ([`client::status`]): a process that fails to start gets an `error`
//! event and an `exit` event (127 for a missing program, 126 for one that
//! cannot run, 125 when the agent failed otherwise; 127 too for a spawn
//! refused before it started, e.g. for its allowlist); one killed by a
//! signal or its timeout gets the signal's name; one whose sandbox vanished
//! gets `error` and `exit` with `signal: "SIGKILL"` — never an id stuck
//! "running". Output events wait for room in the profile's queue, which is
//! what back-pressures the process.

use boxdesk_platform::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use boxdesk_channel::{Exec, SecretBytes};
use boxdesk_sandbox::client::{self, AsyncInput, AsyncOutput, Control, Event, Outcome};
use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::events::Events;
use super::sandbox::Sandbox;
use super::utf8::Utf8Stream;
use super::wire;

/// Stdin chunks queued for one process before `writeStdin` is refused.
const STDIN_QUEUE: usize = 64;
/// Largest Stdin frame sent (a frame's payload is at most 1 MiB).
pub const STDIN_CHUNK: usize = 256 * 1024;
/// How long a signal may wait behind stdin the process does not read;
/// then the channel is closed, and the agent kills the process group.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// Ended processes remembered per profile (for `isProcessRunning`).
const KEEP_ENDED: usize = 4096;

/// A running process's command channels.
#[derive(Debug, Clone)]
struct Channels {
    stdin: mpsc::Sender<SecretBytes>,
    signals: mpsc::Sender<i32>,
}

/// The receiving ends, for the process task.
#[derive(Debug)]
pub struct Inbox {
    stdin: mpsc::Receiver<SecretBytes>,
    signals: mpsc::Receiver<i32>,
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// Exited with this status.
    Code(i32),
    /// Killed by this signal.
    Signal(i32),
}

impl From<Outcome> for Ended {
    /// A cowork client sees a signal by its name, a timeout as the SIGKILL
    /// that ended it, and every number as the one mapping gives it.
    fn from(outcome: Outcome) -> Ended {
        match outcome {
            Outcome::Signaled(n) => Ended::Signal(n),
            Outcome::TimedOut => Ended::Signal(libc::SIGKILL),
            other => Ended::Code(other.exit_code()),
        }
    }
}

impl Ended {
    fn fields(self) -> (Value, Value) {
        match self {
            Ended::Code(c) => (json!(c), Value::Null),
            Ended::Signal(s) => (Value::Null, json!(signal_name(s))),
        }
    }
}

#[derive(Debug)]
enum State {
    Running(Channels),
    Exited(Ended),
}

#[derive(Debug)]
struct Entry {
    generation: u64,
    name: String,
    one_shot: bool,
    state: State,
}

/// A profile's processes by client id.
#[derive(Debug, Default)]
pub struct Procs {
    map: Mutex<HashMap<String, Entry>>,
    next: AtomicU64,
}

/// Why a process request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProcError {
    /// The id names no process.
    #[error("no process with id {0}")]
    Unknown(String),
    /// The id names a process that has exited.
    #[error("process {0} has exited")]
    Exited(String),
    /// A spawn reused the id of a running process.
    #[error("process id {0} is already running")]
    Running(String),
    /// Its stdin queue is full: it is not reading.
    #[error("process {0} is not reading its stdin fast enough; try again later")]
    Backlog(String),
}

/// What [`Procs::status`] reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Never seen (or a one-shot process that has been forgotten).
    Unknown,
    /// Running.
    Running,
    /// Ended.
    Exited(Ended),
}

impl Procs {
    /// Registers a new process under `id`; its commands arrive on the
    /// returned receiver. Refused while a process with that id runs.
    pub fn register(
        &self,
        id: &str,
        name: &str,
        one_shot: bool,
    ) -> Result<(u64, Inbox), ProcError> {
        let mut map = lock(&self.map);
        if matches!(
            map.get(id),
            Some(Entry {
                state: State::Running(_),
                ..
            })
        ) {
            return Err(ProcError::Running(id.into()));
        }
        if map.len() >= KEEP_ENDED {
            forget_oldest_ended(&mut map);
        }
        let generation = self.next.fetch_add(1, Ordering::Relaxed);
        let (stdin, stdin_rx) = mpsc::channel(STDIN_QUEUE);
        let (signals, signals_rx) = mpsc::channel(8);
        map.insert(
            id.into(),
            Entry {
                generation,
                name: name.into(),
                one_shot,
                state: State::Running(Channels { stdin, signals }),
            },
        );
        let inbox = Inbox {
            stdin: stdin_rx,
            signals: signals_rx,
        };
        Ok((generation, inbox))
    }

    /// Records the end of generation `generation` of `id`; a newer process
    /// with the same id is left alone. One-shot processes are forgotten.
    pub fn finish(&self, id: &str, generation: u64, ended: Ended) {
        let mut map = lock(&self.map);
        if let Some(e) = map.get_mut(id) {
            if e.generation == generation {
                if e.one_shot {
                    map.remove(id);
                } else {
                    e.state = State::Exited(ended);
                }
            }
        }
    }

    /// Whether `id` runs, and how it ended.
    pub fn status(&self, id: &str) -> Status {
        match lock(&self.map).get(id) {
            None => Status::Unknown,
            Some(Entry {
                state: State::Running(_),
                ..
            }) => Status::Running,
            Some(Entry {
                state: State::Exited(e),
                ..
            }) => Status::Exited(*e),
        }
    }

    /// The session name of process `id`.
    pub fn name_of(&self, id: &str) -> Option<String> {
        lock(&self.map).get(id).map(|e| e.name.clone())
    }

    /// Whether any process of session `name` is running.
    pub fn session_busy(&self, name: &str) -> bool {
        lock(&self.map)
            .values()
            .any(|e| e.name == name && matches!(e.state, State::Running(_)))
    }

    fn channels(&self, id: &str) -> Result<Channels, ProcError> {
        match lock(&self.map).get(id) {
            None => Err(ProcError::Unknown(id.into())),
            Some(Entry {
                state: State::Running(c),
                ..
            }) => Ok(c.clone()),
            Some(Entry {
                state: State::Exited(_),
                ..
            }) => Err(ProcError::Exited(id.into())),
        }
    }

    /// Queues `data` for the stdin of running process `id`, in chunks a
    /// frame can carry; refused, not waited for, when its queue is full.
    pub fn write_stdin(&self, id: &str, data: &[u8]) -> Result<(), ProcError> {
        let c = self.channels(id)?;
        let chunks = data.chunks(STDIN_CHUNK);
        if c.stdin.capacity() < chunks.len() {
            return Err(ProcError::Backlog(id.into()));
        }
        for chunk in chunks {
            c.stdin
                .try_send(SecretBytes::copy_from(chunk))
                .map_err(|e| match e {
                    mpsc::error::TrySendError::Full(_) => ProcError::Backlog(id.into()),
                    mpsc::error::TrySendError::Closed(_) => ProcError::Exited(id.into()),
                })?;
        }
        Ok(())
    }

    /// Sends signal `sig` to running process `id`; it overtakes queued
    /// stdin.
    pub fn signal(&self, id: &str, sig: i32) -> Result<(), ProcError> {
        let c = self.channels(id)?;
        match c.signals.try_send(sig) {
            // Eight signals are already on their way: one more adds nothing.
            Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(ProcError::Exited(id.into())),
        }
    }

    /// Signals every running process (stopVM, shutdown).
    pub fn signal_all(&self, sig: i32) {
        for e in lock(&self.map).values() {
            if let State::Running(c) = &e.state {
                let _ = c.signals.try_send(sig);
            }
        }
    }

    /// How many processes are running.
    pub fn running(&self) -> usize {
        lock(&self.map)
            .values()
            .filter(|e| matches!(e.state, State::Running(_)))
            .count()
    }
}

/// Drops the oldest ended entries so the table stays bounded.
fn forget_oldest_ended(map: &mut HashMap<String, Entry>) {
    let mut ended: Vec<(u64, String)> = map
        .iter()
        .filter(|(_, e)| matches!(e.state, State::Exited(_)))
        .map(|(k, e)| (e.generation, k.clone()))
        .collect();
    ended.sort_unstable();
    for (_, k) in ended.iter().take(KEEP_ENDED / 4) {
        map.remove(k);
    }
}

/// The name of signal `n` (`"SIGTERM"`), or `"SIG<n>"`.
pub fn signal_name(n: i32) -> String {
    match nix::sys::signal::Signal::try_from(n) {
        Ok(s) => s.as_str().to_owned(),
        Err(_) => format!("SIG{n}"),
    }
}

/// A signal given by name (`SIGTERM`, `TERM`, any case) or number.
pub fn parse_signal(v: &Value) -> Option<i32> {
    match v {
        Value::Number(n) => n
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .filter(|n| (1..=64).contains(n)),
        Value::String(s) => {
            if let Ok(n) = s.parse::<i32>() {
                return (1..=64).contains(&n).then_some(n);
            }
            let up = s.to_ascii_uppercase();
            let full = if up.starts_with("SIG") {
                up
            } else {
                format!("SIG{up}")
            };
            full.parse::<nix::sys::signal::Signal>()
                .ok()
                .map(|s| s as i32)
        }
        _ => None,
    }
}

/// An output event frame: `{"type":kind,"id":id,"data":text}`. This is
/// the hot path of process output, so the text is escaped here in runs
/// rather than character by character.
pub fn output_event(kind: &str, id: &Value, text: &str) -> Bytes {
    let mut w = BytesMut::with_capacity(text.len() + 64).writer();
    w.get_mut().put_u32(0);
    w.get_mut().put_slice(b"{\"type\":\"");
    w.get_mut().put_slice(kind.as_bytes());
    w.get_mut().put_slice(b"\",\"id\":");
    // Writing JSON into memory cannot fail.
    let _ = serde_json::to_writer(&mut w, id);
    let mut out = w.into_inner();
    out.put_slice(b",\"data\":\"");
    escape_json(text, &mut out);
    out.put_slice(b"\"}");
    wire::finish(out)
}

/// Each byte's escaped form, padded to 8 bytes, and its length: the
/// escaper stores 8 bytes per input byte unconditionally and advances by
/// the length, so the loop has no branch per byte.
const ESCAPES: ([[u8; 8]; 256], [u8; 256]) = {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut seq = [[0u8; 8]; 256];
    let mut len = [1u8; 256];
    let mut b = 0;
    while b < 256 {
        let (s, n): ([u8; 8], u8) = match b as u8 {
            b'"' => ([b'\\', b'"', 0, 0, 0, 0, 0, 0], 2),
            b'\\' => ([b'\\', b'\\', 0, 0, 0, 0, 0, 0], 2),
            b'\n' => ([b'\\', b'n', 0, 0, 0, 0, 0, 0], 2),
            b'\r' => ([b'\\', b'r', 0, 0, 0, 0, 0, 0], 2),
            b'\t' => ([b'\\', b't', 0, 0, 0, 0, 0, 0], 2),
            0..=0x1f => (
                [b'\\', b'u', b'0', b'0', HEX[b >> 4], HEX[b & 0xf], 0, 0],
                6,
            ),
            c => ([c, 0, 0, 0, 0, 0, 0, 0], 1),
        };
        seq[b] = s;
        len[b] = n;
        b += 1;
    }
    (seq, len)
};

/// Appends `s` escaped for the inside of a JSON string: `"`, `\\` and
/// control characters; everything else (UTF-8 included) as it is.
///
/// Process output is this path's whole load, so it works in 16-byte
/// blocks: a block with nothing to escape is one copy (the test is a
/// branch-free fold the compiler vectorises), a block of NULs — common in
/// binary output, each NUL being the 6-byte `\u0000` — is one 96-byte
/// copy, and only other blocks go byte by byte through the table.
pub fn escape_json(s: &str, out: &mut BytesMut) {
    const BLOCK: usize = 16;
    const NULS: [u8; 6 * BLOCK] = {
        let mut a = [0u8; 6 * BLOCK];
        let mut i = 0;
        while i < BLOCK {
            let e = *b"\\u0000";
            let mut k = 0;
            while k < 6 {
                a[i * 6 + k] = e[k];
                k += 1;
            }
            i += 1;
        }
        a
    };
    let needs = |b: u8| b < 0x20 || b == b'"' || b == b'\\';
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 8);
    let mut blocks = bytes.chunks_exact(BLOCK);
    for block in &mut blocks {
        if !block.iter().fold(false, |a, &b| a | needs(b)) {
            out.extend_from_slice(block);
        } else if block.iter().fold(0u8, |a, &b| a | b) == 0 {
            out.extend_from_slice(&NULS);
        } else {
            escape_bytes(block, out);
        }
    }
    escape_bytes(blocks.remainder(), out);
}

/// The byte-by-byte path of [`escape_json`].
fn escape_bytes(bytes: &[u8], out: &mut BytesMut) {
    let (seq, len) = &ESCAPES;
    out.reserve(bytes.len() * 6 + 8);
    let spare = out.spare_capacity_mut();
    let mut j = 0;
    for &b in bytes {
        let from = &seq[usize::from(b)];
        // Each byte needs at most 6 of the `6 * len + 8` reserved, so
        // `j + 8` stays within the spare capacity.
        let to = &mut spare[j..j + 8];
        for (t, f) in to.iter_mut().zip(from) {
            t.write(*f);
        }
        j += usize::from(len[usize::from(b)]);
    }
    // SAFETY: the loop initialised the first `j` bytes of the spare
    // capacity: every output byte was written by some store.
    unsafe { out.set_len(out.len() + j) };
}

/// What a running process needs.
pub struct Run {
    /// The profile's events.
    pub events: Arc<Events>,
    /// The profile's processes.
    pub procs: Arc<Procs>,
    /// The sandbox it runs in.
    pub sandbox: Arc<Sandbox>,
    /// Its client id, as a table key.
    pub key: String,
    /// Its client id as sent.
    pub id: Value,
    /// Its entry's generation.
    pub generation: u64,
    /// What to run.
    pub exec: Exec,
}

/// Runs one process to its end, emitting its events.
pub async fn run(r: Run, inbox: Inbox) {
    let oom_before = r.sandbox.oom_kills();
    let outcome = match r.sandbox.session().await {
        Ok(stream) => match client::exec_async(stream, r.exec, None).await {
            Ok((output, input)) => {
                let writer = tokio::spawn(write_commands(input, inbox, r.key.clone()));
                let outcome = pump(&r.events, &r.id, output).await;
                writer.abort();
                outcome
            }
            Err(e) => Err(e.to_string()),
        },
        Err(e) => Err(e.to_string()),
    };
    let ended = match outcome {
        Ok(outcome) => Ended::from(outcome),
        Err(msg) => {
            r.events.push(wire::frame_json(&json!({
                "type": "error", "id": r.id, "message": format!("lost the process: {msg}"),
            })));
            Ended::Signal(libc::SIGKILL)
        }
    };
    // The sandbox's OOM kills while this process ran (the cgroup counts
    // per sandbox, not per process).
    let oom = oom_before
        .zip(r.sandbox.oom_kills())
        .map(|(before, after)| after.saturating_sub(before));
    end(&r.events, &r.procs, &r.key, &r.id, r.generation, ended, oom);
}

/// Ends process `key` (generation `generation`) before anything ran: an
/// `error` event with `message`, then `exit` with 127, as for a program
/// that cannot be found, so the id never stays "running".
pub fn refuse(
    events: &Events,
    procs: &Procs,
    key: &str,
    id: &Value,
    generation: u64,
    message: &str,
) {
    events.push(wire::frame_json(
        &json!({"type": "error", "id": id, "message": message}),
    ));
    end(
        events,
        procs,
        key,
        id,
        generation,
        Ended::Code(client::EXIT_NOT_FOUND),
        None,
    );
}

/// Records the end in the table, then emits the `exit` event, with
/// `oomKillCount` where the sandbox's memory is accounted.
fn end(
    events: &Events,
    procs: &Procs,
    key: &str,
    id: &Value,
    generation: u64,
    ended: Ended,
    oom: Option<u64>,
) {
    procs.finish(key, generation, ended);
    let (code, signal) = ended.fields();
    let mut exit = json!({
        "type": "exit", "id": id, "exitCode": code, "signal": signal,
    });
    if let Some(n) = oom {
        exit["oomKillCount"] = json!(n);
    }
    events.push(wire::frame_json(&exit));
}

/// Sends the client's stdin and signals to the agent. A signal overtakes
/// queued stdin; one stuck behind stdin the process does not read waits
/// [`KILL_GRACE`], then the channel is closed, which makes the agent kill
/// the whole process group (the exit then says SIGKILL).
async fn write_commands(mut input: AsyncInput, mut inbox: Inbox, key: String) {
    loop {
        let control = tokio::select! {
            biased;
            Some(sig) = inbox.signals.recv() => Control::Signal(sig),
            Some(data) = inbox.stdin.recv() => Control::Stdin(data),
            else => return,
        };
        let is_stdin = matches!(control, Control::Stdin(_));
        let overtaking = {
            let send = input.send(control);
            tokio::pin!(send);
            if !is_stdin {
                if send.await.is_err() {
                    return;
                }
                continue;
            }
            tokio::select! {
                biased;
                r = &mut send => match r {
                    Ok(()) => None,
                    Err(_) => return,
                },
                Some(sig) = inbox.signals.recv() => match tokio::time::timeout(KILL_GRACE, &mut send).await {
                    Ok(Ok(())) => Some(sig),
                    _ => {
                        let key = super::logged(&key);
                        tracing::warn!("process {key}: a signal waited {KILL_GRACE:?} behind unread stdin; closing its channel, which kills it");
                        return;
                    }
                },
            }
        };
        if let Some(sig) = overtaking {
            if input.send(Control::Signal(sig)).await.is_err() {
                return;
            }
        }
    }
}

/// Turns the exec's output into events until it ends: its outcome, or why
/// the process was lost.
async fn pump(events: &Events, id: &Value, mut output: AsyncOutput) -> Result<Outcome, String> {
    let mut out = Utf8Stream::default();
    let mut err = Utf8Stream::default();
    let mut text = String::new();
    let outcome = loop {
        let (kind, dec, data) = match output.next_event().await {
            Ok(Event::Stdout(d)) => ("stdout", &mut out, d),
            Ok(Event::Stderr(d)) => ("stderr", &mut err, d),
            Ok(Event::Error(msg)) => {
                events.push(wire::frame_json(
                    &json!({"type": "error", "id": id, "message": msg}),
                ));
                continue;
            }
            Ok(Event::Ended(outcome)) => break Ok(outcome),
            Err(e) => break Err(e.to_string()),
        };
        text.clear();
        dec.push(&data, &mut text);
        if !text.is_empty() {
            events.push_output(output_event(kind, id, &text)).await;
        }
    };
    for (kind, dec) in [("stdout", &mut out), ("stderr", &mut err)] {
        text.clear();
        dec.finish(&mut text);
        if !text.is_empty() {
            events.push(output_event(kind, id, &text));
        }
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_accepted_by_name_short_name_or_number() {
        assert_eq!(parse_signal(&json!("SIGTERM")), Some(15));
        assert_eq!(parse_signal(&json!("kill")), Some(9));
        assert_eq!(parse_signal(&json!(2)), Some(2));
        assert_eq!(parse_signal(&json!("9")), Some(9));
        assert_eq!(parse_signal(&json!("SIGNOPE")), None);
        assert_eq!(parse_signal(&json!(0)), None);
        assert_eq!(signal_name(15), "SIGTERM");
    }

    #[test]
    fn an_old_generations_exit_never_touches_a_reused_id() {
        let p = Procs::default();
        let (g1, _in1) = p.register("a", "s", false).unwrap();
        assert_eq!(
            p.register("a", "s", false).unwrap_err(),
            ProcError::Running("a".into())
        );
        p.finish("a", g1, Ended::Code(0));
        let (g2, _in2) = p.register("a", "s", false).unwrap();
        p.finish("a", g1, Ended::Code(1));
        assert_eq!(p.status("a"), Status::Running);
        p.finish("a", g2, Ended::Signal(15));
        assert_eq!(p.status("a"), Status::Exited(Ended::Signal(15)));
    }

    #[test]
    fn stdin_beyond_the_queue_is_refused_not_waited_for() {
        let p = Procs::default();
        let (_g, _inbox) = p.register("s", "s", false).unwrap();
        let big = vec![b'x'; STDIN_CHUNK * (STDIN_QUEUE + 1)];
        assert_eq!(
            p.write_stdin("s", &big),
            Err(ProcError::Backlog("s".into()))
        );
        p.write_stdin("s", &big[..STDIN_CHUNK * 2]).unwrap();
        assert_eq!(p.signal("s", 15), Ok(()));
        assert_eq!(
            p.write_stdin("nope", b"x"),
            Err(ProcError::Unknown("nope".into()))
        );
    }

    #[test]
    fn the_table_of_ended_processes_stays_bounded() {
        let p = Procs::default();
        for i in 0..KEEP_ENDED + 10 {
            let (g, _inbox) = p.register(&i.to_string(), "s", false).unwrap();
            p.finish(&i.to_string(), g, Ended::Code(0));
        }
        assert!(lock(&p.map).len() <= KEEP_ENDED);
        assert_eq!(
            p.status(&(KEEP_ENDED + 9).to_string()),
            Status::Exited(Ended::Code(0))
        );
    }

    #[test]
    fn one_shot_processes_are_forgotten_after_their_exit() {
        let p = Procs::default();
        let (g, _rx) = p.register("o", "s", true).unwrap();
        p.finish("o", g, Ended::Code(0));
        assert_eq!(p.status("o"), Status::Unknown);
    }

    proptest::proptest! {
        #[test]
        fn escaped_text_parses_back_to_the_same_text(t in "\\PC*|[\\x00-\\x20\"\\\\]*") {
            let f = output_event("stderr", &json!(1), &t);
            let v: Value = serde_json::from_slice(&f[4..]).unwrap();
            proptest::prop_assert_eq!(v["data"].as_str().unwrap(), t.as_str());
        }
    }

    #[test]
    fn every_block_shape_escapes_exactly_like_serde_json() {
        let mut t = String::new();
        t.push_str(&"\0".repeat(40));
        t.push_str("plain text block over sixteen bytes, then \"quotes\" and \\ and \n\t\u{1}");
        t.push_str(&"€".repeat(20));
        t.push_str(&"\0a".repeat(20));
        for cut in 0..t.len() {
            if !t.is_char_boundary(cut) {
                continue;
            }
            let mut out = BytesMut::new();
            escape_json(&t[cut..], &mut out);
            let want = serde_json::to_string(&t[cut..]).unwrap();
            assert_eq!(&out[..], &want.as_bytes()[1..want.len() - 1], "from {cut}");
        }
    }

    #[test]
    fn output_events_are_framed_json_with_escaped_text() {
        let f = output_event("stdout", &json!("p1"), "a\"\u{0}€");
        let v: Value = serde_json::from_slice(&f[4..]).unwrap();
        assert_eq!(
            v,
            json!({"type": "stdout", "id": "p1", "data": "a\"\u{0}€"})
        );
        assert_eq!(
            u32::from_be_bytes([f[0], f[1], f[2], f[3]]) as usize,
            f.len() - 4
        );
    }
}
