//! A [`Controlled`] made of a real [`Screen`] (or none) and an input sink
//! that records what it accepts: what the control socket's display and
//! input tests, and the display bench, serve — the real server, the real
//! screen, only the sandbox behind them left out. Not for production use.

use std::sync::{Arc, Mutex};

use boxdesk_platform::screen::{InputDevice, InputError, InputEvent, InputSink, Screen, EV_KEY};

use super::Controlled;

/// A sandbox that is only a screen and an input recorder.
#[derive(Debug)]
pub struct Desk {
    /// Its screen; `None`: a sandbox without a display.
    pub screen: Option<Arc<Screen>>,
    /// The input events accepted, in order.
    pub events: Arc<Mutex<Vec<InputEvent>>>,
}

impl Desk {
    /// A desk over `screen`.
    pub fn new(screen: Option<Screen>) -> Arc<Desk> {
        Arc::new(Desk {
            screen: screen.map(Arc::new),
            events: Arc::default(),
        })
    }

    /// Its screen (it must have one).
    pub fn screen(&self) -> &Screen {
        self.screen.as_deref().expect("a desk with a screen")
    }
}

impl Controlled for Desk {
    fn info(&self) -> Vec<(&'static str, String)> {
        vec![("proto", "1".into())]
    }

    fn stop(&self) {}

    fn screen(&self) -> Option<Arc<Screen>> {
        self.screen.clone()
    }

    fn input(&self) -> Option<Arc<dyn InputSink>> {
        self.screen.as_ref()?;
        Some(Arc::new(Recorder(self.events.clone())))
    }
}

/// Records what it accepts; refuses keyboard codes past 255, as the
/// guest's keyboard does.
struct Recorder(Arc<Mutex<Vec<InputEvent>>>);

impl InputSink for Recorder {
    fn send(&self, event: InputEvent) -> Result<(), InputError> {
        if event.device == InputDevice::Keyboard && event.kind == EV_KEY && event.code > 255 {
            return Err(InputError::Unsupported {
                device: "kbd",
                kind: event.kind,
                code: event.code,
            });
        }
        boxdesk_platform::sync::lock(&self.0).push(event);
        Ok(())
    }
}
