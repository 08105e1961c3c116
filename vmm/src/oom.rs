//! The guest kernel's OOM kills, counted from its console: every kill the
//! OOM killer makes is reported there (`Out of memory: Killed process N
//! (comm) …`, or `Memory cgroup out of memory: Killed process …`, at
//! `KERN_ERR`, which the VM's `quiet` console still prints). [`OomCounter`]
//! sits between the UART and the console log and counts those lines as
//! they pass, so the count costs the guest nothing and the host no round
//! trip.
//!
//! What it counts is what the guest printed: a process inside that writes
//! such a line to `/dev/console` or `/dev/kmsg` adds to its own VM's count
//! and nothing else. It never holds more than one line ([`LINE_MAX`]).

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The longest console line kept for matching; the rest of a longer line
/// is not looked at (the kernel's report begins well within it).
pub const LINE_MAX: usize = 256;

/// What every kill's report line holds, after `Out of memory` or `Memory
/// cgroup out of memory`.
const MARK: &[u8] = b"ut of memory: Killed process ";

/// A console writer that counts OOM kill reports and passes every byte on.
pub struct OomCounter<W> {
    out: W,
    line: Vec<u8>,
    kills: Arc<AtomicU64>,
}

impl<W: Write> OomCounter<W> {
    /// Counts into `kills` what passes to `out`.
    pub fn new(out: W, kills: Arc<AtomicU64>) -> Self {
        Self {
            out,
            line: Vec::with_capacity(LINE_MAX),
            kills,
        }
    }

    fn scan(&mut self, bytes: &[u8]) {
        for &b in bytes {
            if b == b'\n' {
                if self.line.windows(MARK.len()).any(|w| w == MARK) {
                    self.kills.fetch_add(1, Ordering::SeqCst);
                }
                self.line.clear();
            } else if self.line.len() < LINE_MAX {
                self.line.push(b);
            }
        }
    }
}

impl<W: Write> Write for OomCounter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.scan(buf);
        self.out.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(chunks: &[&[u8]]) -> (u64, Vec<u8>) {
        let kills = Arc::new(AtomicU64::new(0));
        let mut w = OomCounter::new(Vec::new(), kills.clone());
        for c in chunks {
            w.write_all(c).unwrap();
        }
        (kills.load(Ordering::SeqCst), w.out)
    }

    #[test]
    fn each_oom_kill_report_counts_once_even_a_byte_at_a_time_and_every_byte_passes() {
        let text = b"[  5.1] Out of memory: Killed process 81 (python3) total-vm:300000kB\r\n\
            boot noise\n\
            [  9.9] Memory cgroup out of memory: Killed process 90 (node) total-vm:1kB\n\
            Out of memory: Killed process 7 (x) but no newline yet";
        let bytes: Vec<&[u8]> = text.chunks(1).collect();
        let (n, out) = counted(&bytes);
        assert_eq!(n, 2);
        assert_eq!(out, text);
    }

    #[test]
    fn other_lines_and_overlong_lines_do_not_count() {
        let long = [b"x".repeat(LINE_MAX + 10).as_slice(), MARK, b"\n"].concat();
        let (n, _) = counted(&[
            b"oom_reaper: reaped process 81 (python3)\n",
            b"invoked oom-killer: gfp_mask=0x0\n",
            &long,
        ]);
        assert_eq!(n, 0);
    }
}
