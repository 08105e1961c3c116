//! An `input` stream of the control socket: each line one event for the
//! sandbox's keyboard or pointer ([`InputSink`]), and whatever the lines
//! left pressed released when the stream ends, however it ends.
//!
//! This module owns the pressed set: a key or button is down from an
//! accepted event with a non-zero value until an accepted one with value 0;
//! at the end every one still down gets a release. It must never let one
//! bad line end the stream (the line gets `err …`, the connection stays).

use std::collections::BTreeSet;
use std::sync::Arc;

use boxdesk_platform::screen::{InputDevice, InputEvent, InputSink, EV_KEY};

use super::protocol;

/// Most keys and buttons tracked as down at once (every key code of one
/// device fits).
const MAX_DOWN: usize = 1024;

/// One `input` stream.
pub struct InputStream {
    sink: Arc<dyn InputSink>,
    down: BTreeSet<(InputDevice, u16)>,
}

impl InputStream {
    /// A stream sending to `sink`.
    pub fn new(sink: Arc<dyn InputSink>) -> Self {
        Self {
            sink,
            down: BTreeSet::new(),
        }
    }

    /// Handles one line: `None` when the event was sent, else the `err`
    /// reply to write.
    pub fn line(&mut self, line: &[u8]) -> Option<String> {
        let event = match protocol::parse_input(line) {
            Ok(e) => e,
            Err(why) => return Some(format!("err {why}\n")),
        };
        if let Err(e) = self.sink.send(event) {
            return Some(format!("err {e}\n"));
        }
        if event.kind == EV_KEY {
            let key = (event.device, event.code);
            if event.value == 0 {
                self.down.remove(&key);
            } else if self.down.len() < MAX_DOWN {
                self.down.insert(key);
            }
        }
        None
    }
}

impl Drop for InputStream {
    /// Releases every key and button still down.
    fn drop(&mut self) {
        for (device, code) in std::mem::take(&mut self.down) {
            let release = InputEvent {
                device,
                kind: EV_KEY,
                code,
                value: 0,
            };
            if let Err(e) = self.sink.send(release) {
                tracing::debug!("input: releasing {code} at the end: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use boxdesk_platform::screen::InputError;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Record(Mutex<Vec<InputEvent>>);

    impl InputSink for Record {
        fn send(&self, event: InputEvent) -> Result<(), InputError> {
            if event.code == 999 {
                return Err(InputError::NotReady);
            }
            self.0.lock().unwrap().push(event);
            Ok(())
        }
    }

    #[test]
    fn keys_left_down_are_released_when_the_stream_ends_and_only_those() {
        let sink = Arc::new(Record::default());
        let mut s = InputStream::new(sink.clone());
        assert_eq!(s.line(b"kbd key 30 1"), None);
        assert_eq!(s.line(b"kbd key 31 1"), None);
        assert_eq!(s.line(b"kbd key 30 0"), None);
        assert_eq!(s.line(b"ptr key 272 1"), None);
        assert_eq!(s.line(b"ptr abs 0 100"), None);
        drop(s);
        let sent = sink.0.lock().unwrap();
        let tail: Vec<_> = sent[5..]
            .iter()
            .map(|e| (e.device, e.code, e.value))
            .collect();
        assert_eq!(
            tail,
            [
                (InputDevice::Keyboard, 31, 0),
                (InputDevice::Pointer, 272, 0)
            ]
        );
    }

    #[test]
    fn a_bad_line_or_a_refused_event_gets_err_and_the_stream_goes_on() {
        let sink = Arc::new(Record::default());
        let mut s = InputStream::new(sink.clone());
        assert!(s
            .line(b"garbage")
            .unwrap()
            .starts_with("err bad input line"));
        assert_eq!(
            s.line(b"kbd key 999 1").unwrap(),
            "err the guest's input driver is not ready\n"
        );
        assert_eq!(s.line(b"kbd key 2 1"), None);
        drop(s);
        assert_eq!(sink.0.lock().unwrap().len(), 2, "the press and its release");
    }
}
