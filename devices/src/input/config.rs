//! What one virtio-input device reports ([`Caps`]): its identity, the
//! event types and codes it advertises, its absolute axes — and the
//! configuration space (virtio 1.2 §5.8.4) the driver reads them through.
//!
//! Owns: the check of a host event against what the device advertises, so
//! the guest is only ever sent events its driver was told about.
//!
//! Must never: report a code in the configuration space that the host side
//! refuses to send, or the other way round (both read the same bitmaps);
//! panic on any `select`/`subsel` a driver writes.

use boxdesk_platform::screen::{InputDevice, InputError, EV_ABS, EV_KEY, EV_REL};
pub use boxdesk_platform::screen::{
    ABS_X, ABS_Y, BTN_EXTRA, BTN_LEFT, BTN_MIDDLE, BTN_RIGHT, BTN_SIDE, REL_HWHEEL, REL_WHEEL,
};
use virtio_bindings::virtio_input::{
    virtio_input_absinfo, virtio_input_config,
    virtio_input_config_select_VIRTIO_INPUT_CFG_ABS_INFO as CFG_ABS_INFO,
    virtio_input_config_select_VIRTIO_INPUT_CFG_EV_BITS as CFG_EV_BITS,
    virtio_input_config_select_VIRTIO_INPUT_CFG_ID_DEVIDS as CFG_ID_DEVIDS,
    virtio_input_config_select_VIRTIO_INPUT_CFG_ID_NAME as CFG_ID_NAME,
    virtio_input_config_select_VIRTIO_INPUT_CFG_ID_SERIAL as CFG_ID_SERIAL, virtio_input_devids,
};

/// The length of the configuration space: `select`, `subsel`, `size`,
/// five reserved bytes and the 128-byte union.
pub const CONFIG_BYTES: usize = std::mem::size_of::<virtio_input_config>();
/// Where the union starts in the configuration space.
const UNION_OFFSET: usize = 8;
/// The length of the union: the largest bitmap (1024 codes).
const UNION_BYTES: usize = CONFIG_BYTES - UNION_OFFSET;

/// `EV_LED` (linux/input-event-codes.h): LEDs, set by the guest on statusq.
pub const EV_LED: u16 = 0x11;
/// `EV_REP`: the guest's input core repeats held keys itself.
pub const EV_REP: u16 = 0x14;
/// `SYN_REPORT`: the code of the `EV_SYN` ending each report.
pub const SYN_REPORT: u16 = 0;
/// `LED_NUML`.
pub const LED_NUML: u16 = 0;
/// `LED_CAPSL`.
pub const LED_CAPSL: u16 = 1;
/// `LED_SCROLLL`.
pub const LED_SCROLLL: u16 = 2;
/// The highest key code the keyboard advertises (`KEY_ESC` = 1 up to it).
pub const KEY_LAST: u16 = 255;

/// `BUS_VIRTUAL` (linux/input.h).
const BUS_VIRTUAL: u16 = 0x06;
/// The vendor id QEMU's virtio-input devices report.
const VENDOR: u16 = 0x0627;
/// The version in `ID_DEVIDS`.
const VERSION: u16 = 1;
/// `ID_SERIAL` of both devices.
const SERIAL: &str = "boxdesk";

/// A code bitmap as the configuration space carries it.
type Bitmap = [u8; UNION_BYTES];

/// One event type the device advertises.
#[derive(Debug, Clone)]
struct EventType {
    kind: u16,
    codes: Bitmap,
    /// Whether the host may send it (`EV_LED` only flows from the guest,
    /// `EV_REP` has no codes).
    host_sends: bool,
}

/// An absolute axis' range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Axis {
    code: u16,
    min: i32,
    max: i32,
}

/// What one device reports.
#[derive(Debug, Clone)]
pub(crate) struct Caps {
    pub(crate) device: InputDevice,
    name: &'static str,
    product: u16,
    types: Vec<EventType>,
    axes: Vec<Axis>,
}

fn bitmap(codes: impl IntoIterator<Item = u16>) -> Bitmap {
    let mut b = [0u8; UNION_BYTES];
    for code in codes {
        if let Some(byte) = b.get_mut(usize::from(code / 8)) {
            *byte |= 1 << (code % 8);
        }
    }
    b
}

fn has_bit(b: &Bitmap, code: u16) -> bool {
    b.get(usize::from(code / 8))
        .is_some_and(|byte| byte & (1 << (code % 8)) != 0)
}

impl Caps {
    /// A keyboard: keys 1..=255, software repeat, the three LEDs.
    pub(crate) fn keyboard() -> Caps {
        Caps {
            device: InputDevice::Keyboard,
            name: "boxdesk keyboard",
            product: 1,
            types: vec![
                EventType {
                    kind: EV_KEY,
                    codes: bitmap(1..=KEY_LAST),
                    host_sends: true,
                },
                EventType {
                    kind: EV_REP,
                    codes: bitmap([]),
                    host_sends: false,
                },
                EventType {
                    kind: EV_LED,
                    codes: bitmap([LED_NUML, LED_CAPSL, LED_SCROLLL]),
                    host_sends: false,
                },
            ],
            axes: Vec::new(),
        }
    }

    /// A tablet of `width` x `height` pixels: five buttons, two wheels,
    /// `ABS_X` in `0..width`, `ABS_Y` in `0..height`.
    pub(crate) fn tablet(width: u32, height: u32) -> Caps {
        let last = |side: u32| i32::try_from(side.saturating_sub(1)).unwrap_or(i32::MAX);
        Caps {
            device: InputDevice::Pointer,
            name: "boxdesk tablet",
            product: 3,
            types: vec![
                EventType {
                    kind: EV_KEY,
                    codes: bitmap([BTN_LEFT, BTN_RIGHT, BTN_MIDDLE, BTN_SIDE, BTN_EXTRA]),
                    host_sends: true,
                },
                EventType {
                    kind: EV_REL,
                    codes: bitmap([REL_HWHEEL, REL_WHEEL]),
                    host_sends: true,
                },
                EventType {
                    kind: EV_ABS,
                    codes: bitmap([ABS_X, ABS_Y]),
                    host_sends: true,
                },
            ],
            axes: vec![
                Axis {
                    code: ABS_X,
                    min: 0,
                    max: last(width),
                },
                Axis {
                    code: ABS_Y,
                    min: 0,
                    max: last(height),
                },
            ],
        }
    }

    /// `kbd` or `ptr`, as errors name the device.
    pub(crate) fn short_name(&self) -> &'static str {
        match self.device {
            InputDevice::Keyboard => "kbd",
            InputDevice::Pointer => "ptr",
        }
    }

    /// Whether the host may send `kind`/`code` with `value` to this device.
    pub(crate) fn check(&self, kind: u16, code: u16, value: i32) -> Result<(), InputError> {
        let unsupported = InputError::Unsupported {
            device: self.short_name(),
            kind,
            code,
        };
        let advertised = self
            .types
            .iter()
            .any(|t| t.kind == kind && t.host_sends && has_bit(&t.codes, code));
        if !advertised {
            return Err(unsupported);
        }
        let range = match kind {
            EV_KEY => Some((0, 2)),
            EV_ABS => self
                .axes
                .iter()
                .find(|a| a.code == code)
                .map(|a| (a.min, a.max)),
            _ => None,
        };
        match range {
            Some((min, max)) if !(min..=max).contains(&value) => Err(InputError::Value {
                kind,
                code,
                value,
                min,
                max,
            }),
            // An advertised axis always has a range; EV_REL takes any value.
            _ => Ok(()),
        }
    }

    /// The configuration space as it reads after the driver selected
    /// `select`/`subsel`: `size` 0 and an empty union when nothing matches.
    pub(crate) fn config_space(&self, select: u8, subsel: u8) -> [u8; CONFIG_BYTES] {
        let mut cfg = [0u8; CONFIG_BYTES];
        cfg[0] = select;
        cfg[1] = subsel;
        let size = self.fill_union(select, subsel, &mut cfg[UNION_OFFSET..]);
        // `size` <= UNION_BYTES (128) fits a byte.
        cfg[2] = u8::try_from(size).unwrap_or(u8::MAX);
        cfg
    }

    /// Writes what `select`/`subsel` names into `union`; returns its size.
    fn fill_union(&self, select: u8, subsel: u8, union: &mut [u8]) -> usize {
        let put = |union: &mut [u8], bytes: &[u8]| {
            let n = bytes.len().min(union.len());
            union[..n].copy_from_slice(&bytes[..n]);
            n
        };
        match u32::from(select) {
            CFG_ID_NAME => put(union, self.name.as_bytes()),
            CFG_ID_SERIAL => put(union, SERIAL.as_bytes()),
            CFG_ID_DEVIDS => {
                let ids = [BUS_VIRTUAL, VENDOR, self.product, VERSION];
                let bytes: Vec<u8> = ids.iter().flat_map(|v| v.to_le_bytes()).collect();
                debug_assert_eq!(bytes.len(), std::mem::size_of::<virtio_input_devids>());
                put(union, &bytes)
            }
            CFG_EV_BITS => {
                let Some(t) = self.types.iter().find(|t| t.kind == u16::from(subsel)) else {
                    return 0;
                };
                // Bytes up to the highest code; at least one, since a size
                // of 0 would say the type is not supported (EV_REP).
                let len = t.codes.iter().rposition(|&b| b != 0).map_or(1, |i| i + 1);
                put(union, &t.codes[..len])
            }
            CFG_ABS_INFO => {
                let Some(a) = self.axes.iter().find(|a| a.code == u16::from(subsel)) else {
                    return 0;
                };
                // min, max, fuzz, flat, res.
                let fields = [a.min, a.max, 0, 0, 0];
                let bytes: Vec<u8> = fields.iter().flat_map(|v| v.to_le_bytes()).collect();
                debug_assert_eq!(bytes.len(), std::mem::size_of::<virtio_input_absinfo>());
                put(union, &bytes)
            }
            // UNSET, PROP_BITS (no properties) and anything unknown.
            _ => 0,
        }
    }
}
