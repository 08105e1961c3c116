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
//! gets `error` (with `fatal: true`) and `exit` with `signal: "SIGKILL"` —
//! never an id stuck "running". Every `error` event says `fatal`: only a
//! sandbox's death (or, in [`crate::profile`], one that cannot start) is.
//! Output events wait for room in the profile's queue, which is what
//! back-pressures the process.

use boxdesk_platform::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use boxdesk_channel::{Exec, SecretBytes};
use boxdesk_sandbox::client::{self, AsyncInput, AsyncOutput, Control, Event, Outcome};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::envelope;
use super::events::Events;
use super::json::output_event;
use super::sandbox::Sandbox;
use super::signals::signal_name;
use super::utf8::Utf8Stream;

/// Stdin chunks queued for one process before `writeStdin` is refused.
const STDIN_QUEUE: usize = 64;
/// Largest Stdin frame sent (a frame's payload is at most 1 MiB).
pub const STDIN_CHUNK: usize = 256 * 1024;
/// How long a signal may wait behind stdin the process does not read;
/// then the channel is closed, and the agent kills the process group.
const KILL_GRACE: Duration = Duration::from_secs(2);
/// How long a process whose channel was lost waits to learn whether its
/// sandbox died (which makes its `error` event fatal).
const DEATH_GRACE: Duration = Duration::from_millis(500);
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
            // Fatal when the sandbox died under it (its end may be seen a
            // moment after the channel's); a lost channel alone is not.
            let died = tokio::time::timeout(DEATH_GRACE, r.sandbox.ended())
                .await
                .is_ok();
            r.events.push(envelope::frame_json(&json!({
                "type": "error", "id": r.id, "message": format!("lost the process: {msg}"),
                "fatal": died,
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
    events.push(envelope::frame_json(
        &json!({"type": "error", "id": id, "message": message, "fatal": false}),
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
    events.push(envelope::frame_json(&exit));
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
                events.push(envelope::frame_json(
                    &json!({"type": "error", "id": id, "message": msg, "fatal": false}),
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
}
