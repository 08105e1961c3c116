//! A request body parsed as JSON with every object's keys unique.
//!
//! serde_json keeps the last of two equal keys, so
//! `{"method":"isRunning","method":"stopVM"}` would run `stopVM` while a
//! log or a proxy in front of the server, keeping the first, saw
//! `isRunning`. RFC 8259 leaves duplicates to the parser; the helper refuses
//! them, at any depth, in the same single pass that builds the value.
//!
//! Owns that one rule; nesting depth stays serde_json's (128).

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Parses `body` as JSON, refusing an object with a key twice (the one
/// error of [`serde_json::error::Category::Data`] this parse gives).
pub fn from_slice(body: &[u8]) -> serde_json::Result<Value> {
    serde_json::from_slice::<Strict>(body).map(|s| s.0)
}

/// A [`Value`] whose objects had unique keys.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor).map(Strict)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        // JSON has no NaN or infinity, so every f64 parsed is a number.
        Ok(Value::from(v))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(4096));
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let Strict(value) = map.next_value()?;
            if out.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "duplicate key {key:?} in an object"
                )));
            }
            out.insert(key, value);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_body_without_duplicate_keys_parses_as_serde_json_would() {
        let body = br#"{"method":"spawn","id":7,"params":{"args":["-c","x"],"n":-3,"f":1.5,"u":18446744073709551615,"z":null,"b":true,"s":"\u00e9"}}"#;
        assert_eq!(
            from_slice(body).unwrap(),
            serde_json::from_slice::<Value>(body).unwrap()
        );
        assert_eq!(from_slice(b"[]").unwrap(), json!([]));
        assert_eq!(from_slice(b"\"x\"").unwrap(), json!("x"));
    }

    #[test]
    fn a_key_given_twice_is_refused_at_the_top_and_at_any_depth() {
        for body in [
            &br#"{"method":"isRunning","method":"stopVM"}"#[..],
            br#"{"method":"spawn","params":{"id":"a","id":"b"}}"#,
            br#"{"method":"spawn","params":{"env":[{"A":"1","A":"2"}]}}"#,
        ] {
            let e = from_slice(body).unwrap_err();
            assert_eq!(e.classify(), serde_json::error::Category::Data, "{e}");
            assert!(e.to_string().contains("duplicate key"), "{e}");
        }
    }

    #[test]
    fn nesting_is_still_capped_by_serde_json() {
        let deep = "[".repeat(100_000) + &"]".repeat(100_000);
        let e = from_slice(deep.as_bytes()).unwrap_err();
        assert_ne!(e.classify(), serde_json::error::Category::Data, "{e}");
        assert!(e.to_string().contains("recursion limit"), "{e}");
    }
}
