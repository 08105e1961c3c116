//! Signal names as the client speaks them: `"SIGTERM"` in `exit` events
//! and `isProcessRunning`, and a name, short name or number in `kill`.
//!
//! Owns the translation only; it never sends a signal.

use serde_json::Value;

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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
