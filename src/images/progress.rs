//! A download's progress on stderr: on a terminal, one line redrawn in
//! place (a bar, bytes so far of the total, percent) at most ten times a
//! second; otherwise (a log, a pipe, CI) plain lines, one every ten
//! seconds while bytes arrive and one at the end, so a log shows it moved
//! without filling up.
//!
//! This module owns the drawing only; it never fails (a stderr that cannot
//! be written to loses the progress, not the download).

use std::io::Write as _;
use std::time::{Duration, Instant};

/// How often a terminal's line is redrawn.
const TTY_EVERY: Duration = Duration::from_millis(100);
/// How often a plain line is written.
const PLAIN_EVERY: Duration = Duration::from_secs(10);
/// The bar's width in characters.
const BAR: u64 = 30;

/// One download's progress.
pub struct Progress {
    label: String,
    tty: bool,
    started: Instant,
    last: Option<Instant>,
    drawn: bool,
}

impl Progress {
    /// Progress of `label` (a file name), drawn for a terminal when `tty`.
    pub fn new(label: &str, tty: bool) -> Self {
        Progress {
            label: label.to_owned(),
            tty,
            started: Instant::now(),
            last: None,
            drawn: false,
        }
    }

    /// `done` bytes so far, of `total` when known.
    pub fn update(&mut self, done: u64, total: Option<u64>) {
        let every = if self.tty { TTY_EVERY } else { PLAIN_EVERY };
        let now = Instant::now();
        if self.last.is_some_and(|l| now.duration_since(l) < every) {
            return;
        }
        // Plain lines are for bytes still coming: none yet, or all of
        // them (`finish` says that), is no news.
        if !self.tty && (done == 0 || total.is_some_and(|t| done >= t)) {
            return;
        }
        self.last = Some(now);
        let line = self.line(done, total);
        let mut err = std::io::stderr().lock();
        let _ = if self.tty {
            write!(err, "\r{line}\x1b[K")
        } else {
            writeln!(err, "{line}")
        };
        let _ = err.flush();
        self.drawn = true;
    }

    /// The download ended with `done` bytes (or failed: `ok` false).
    pub fn finish(&mut self, done: u64, ok: bool) {
        let secs = self.started.elapsed().as_secs_f64();
        let mut err = std::io::stderr().lock();
        if self.tty && self.drawn {
            let _ = write!(err, "\r\x1b[K");
        }
        if ok {
            let _ = writeln!(err, "{}: {} in {secs:.1} s", self.label, human(done));
        }
        let _ = err.flush();
    }

    fn line(&self, done: u64, total: Option<u64>) -> String {
        match total.filter(|t| *t > 0) {
            Some(t) => {
                let done = done.min(t);
                let pct = done.saturating_mul(100) / t;
                if self.tty {
                    let full = done.saturating_mul(BAR) / t;
                    let bar: String = (0..BAR).map(|i| if i < full { '#' } else { '-' }).collect();
                    format!(
                        "{} [{bar}] {} / {} {pct:>3}%",
                        self.label,
                        human(done),
                        human(t)
                    )
                } else {
                    format!("{}: {} of {} ({pct}%)", self.label, human(done), human(t))
                }
            }
            None => format!("{}: {}", self.label, human(done)),
        }
    }
}

/// `1.5 MiB`, `900 B`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_say_them() {
        assert_eq!(human(0), "0 B");
        assert_eq!(human(1023), "1023 B");
        assert_eq!(human(1536), "1.5 KiB");
        assert_eq!(human(40 << 20), "40.0 MiB");
        assert_eq!(human(u64::MAX), "16777216.0 TiB");
    }

    #[test]
    fn a_line_shows_bytes_of_the_total_and_never_more_than_all_of_it() {
        let p = Progress::new("f.tar.gz", true);
        let l = p.line(5 << 20, Some(10 << 20));
        assert!(
            l.starts_with("f.tar.gz [###############---------------]"),
            "{l}"
        );
        assert!(l.ends_with("5.0 MiB / 10.0 MiB  50%"), "{l}");
        assert!(p.line(20, Some(10)).ends_with("100%"));
        assert_eq!(p.line(2048, None), "f.tar.gz: 2.0 KiB");
        let plain = Progress::new("f", false);
        assert_eq!(
            plain.line(1 << 20, Some(4 << 20)),
            "f: 1.0 MiB of 4.0 MiB (25%)"
        );
    }
}
