//! How loosely a parameter may be written, as clients we did not write
//! write them: a size or a count is any JSON number (a fraction rounds
//! down; negative is refused, naming the field), and `null` anywhere
//! optional — the value itself, an item of a list, a value of a map — is
//! the same as absent.
//!
//! Owns those rules and the error texts that name the field; the types in
//! `params` use them through `#[serde(deserialize_with)]`. Nothing here
//! acts on a value.

use std::collections::BTreeMap;

use serde::de::{Deserializer, Error as _};
use serde::Deserialize;
use serde_json::{Map, Value};

/// Why a number is not a size or count (without the field, which the
/// caller prefixes).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NumberError {
    /// Not a number at all.
    #[error("expected a number, got {0}")]
    NotANumber(String),
    /// Below zero.
    #[error("must not be negative, got {0}")]
    Negative(String),
    /// Infinite or NaN (not JSON, but a `Value` built in code can hold
    /// one as `null`; a float handed over directly can).
    #[error("must be finite, got {0}")]
    NotFinite(String),
}

/// At most this much of a refused value is quoted back.
const SHOWN: usize = 40;

/// `v` as JSON, cut short: a peer's 10 MiB string is not echoed back.
fn shown(v: &Value) -> String {
    let mut s = v.to_string();
    if s.len() > SHOWN {
        let mut cut = SHOWN;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push('…');
    }
    s
}

/// A non-negative finite amount from `v` (`null` is absent).
pub fn amount(v: &Value) -> Result<Option<f64>, NumberError> {
    let n = match v {
        Value::Null => return Ok(None),
        Value::Number(n) => n,
        other => return Err(NumberError::NotANumber(shown(other))),
    };
    if n.as_u64().is_some() {
        // Exact below 2^53; a larger count is rounded, never refused.
        return Ok(n.as_f64());
    }
    let f = n.as_f64().unwrap_or(f64::NAN);
    check(f).map(Some)
}

/// `f` when it is finite and not negative.
pub fn check(f: f64) -> Result<f64, NumberError> {
    if !f.is_finite() {
        return Err(NumberError::NotFinite(f.to_string()));
    }
    if f < 0.0 {
        return Err(NumberError::Negative(f.to_string()));
    }
    Ok(f)
}

/// A size or count from `v`: any non-negative JSON number, a fraction
/// rounded down, one past `u64::MAX` held at it; `null` is absent.
pub fn count(v: &Value) -> Result<Option<u64>, NumberError> {
    if let Value::Number(n) = v {
        if let Some(u) = n.as_u64() {
            return Ok(Some(u));
        }
    }
    // `as` saturates a float at the integer's bounds and truncates the
    // fraction: rounding down, as promised.
    Ok(amount(v)?.map(|f| f.floor() as u64))
}

/// `bytes` of `f` units of `unit` bytes, rounded down, saturating.
pub fn scaled(f: f64, unit: u64) -> u64 {
    (f * unit as f64).floor() as u64
}

/// [`count`] of the field `field`, for `deserialize_with`.
pub fn count_of<'de, D: Deserializer<'de>>(
    field: &'static str,
    d: D,
) -> Result<Option<u64>, D::Error> {
    let v = Value::deserialize(d)?;
    count(&v).map_err(|e| D::Error::custom(format!("{field}: {e}")))
}

/// [`amount`] of the field `field`, for `deserialize_with`.
pub fn amount_of<'de, D: Deserializer<'de>>(
    field: &'static str,
    d: D,
) -> Result<Option<f64>, D::Error> {
    let v = Value::deserialize(d)?;
    amount(&v).map_err(|e| D::Error::custom(format!("{field}: {e}")))
}

// One function per field, so each error names its field.

/// `memoryMB`.
pub fn memory_mb<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    count_of("memoryMB", d)
}

/// `cpuCount`.
pub fn cpu_count<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    count_of("cpuCount", d)
}

/// `lowWaterBytes`.
pub fn low_water_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    count_of("lowWaterBytes", d)
}

/// `onlyIfFreeBytesBelow`.
pub fn only_if_free_bytes_below<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    count_of("onlyIfFreeBytesBelow", d)
}

/// `sessionTmpOlderThanSeconds`.
pub fn session_tmp_older_than_seconds<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<u64>, D::Error> {
    count_of("sessionTmpOlderThanSeconds", d)
}

/// `diskSizeGB` (an amount: 1.5 GB is 1.5 GiB, not 1).
pub fn disk_size_gb<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    amount_of("diskSizeGB", d)
}

/// `memoryGB` (an amount, as `diskSizeGB`).
pub fn memory_gb<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    amount_of("memoryGB", d)
}

/// A value whose `null` is its default (`false`, empty).
pub fn or_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A list of strings: `null` is empty, a `null` item is left out.
pub fn strings<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let items = Option::<Vec<Option<String>>>::deserialize(d)?;
    Ok(items.into_iter().flatten().flatten().collect())
}

/// An optional list of strings: `null` is absent, a `null` item left out.
pub fn some_strings<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<String>>, D::Error> {
    let items = Option::<Vec<Option<String>>>::deserialize(d)?;
    Ok(items.map(|v| v.into_iter().flatten().collect()))
}

/// A map of strings: `null` is empty, a `null` value leaves its key out.
pub fn string_map<'de, D: Deserializer<'de>>(d: D) -> Result<BTreeMap<String, String>, D::Error> {
    let map = Option::<BTreeMap<String, Option<String>>>::deserialize(d)?;
    Ok(map
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| v.map(|v| (k, v)))
        .collect())
}

/// A JSON object kept in the client's order: `null` is empty, a `null`
/// value leaves its key out.
pub fn object<'de, D: Deserializer<'de>>(d: D) -> Result<Map<String, Value>, D::Error> {
    let mut map = Option::<Map<String, Value>>::deserialize(d)?.unwrap_or_default();
    map.retain(|_, v| !v.is_null());
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn any_json_number_is_a_count_and_a_fraction_rounds_down() {
        assert_eq!(count(&json!(512)), Ok(Some(512)));
        assert_eq!(count(&json!(512.9)), Ok(Some(512)));
        assert_eq!(count(&json!(2.0)), Ok(Some(2)));
        assert_eq!(count(&json!(0.5)), Ok(Some(0)));
        assert_eq!(count(&json!(1e300)), Ok(Some(u64::MAX)));
        assert_eq!(count(&json!(u64::MAX)), Ok(Some(u64::MAX)));
        assert_eq!(count(&json!(null)), Ok(None));
    }

    #[test]
    fn a_negative_non_finite_or_non_number_is_refused() {
        assert_eq!(count(&json!(-1)), Err(NumberError::Negative("-1".into())));
        assert_eq!(
            count(&json!(-0.5)),
            Err(NumberError::Negative("-0.5".into()))
        );
        assert!(matches!(
            count(&json!("2")),
            Err(NumberError::NotANumber(_))
        ));
        assert!(matches!(
            count(&json!([1])),
            Err(NumberError::NotANumber(_))
        ));
        assert_eq!(
            check(f64::INFINITY),
            Err(NumberError::NotFinite("inf".into()))
        );
        assert!(matches!(check(f64::NAN), Err(NumberError::NotFinite(_))));
    }

    #[test]
    fn a_refused_value_is_quoted_short() {
        let long = "x".repeat(10_000);
        let Err(e) = count(&json!(long)) else {
            panic!("a string is no count")
        };
        assert!(e.to_string().len() < 80, "{e}");
    }

    #[test]
    fn an_amount_keeps_its_fraction_until_scaled() {
        assert_eq!(amount(&json!(1.5)), Ok(Some(1.5)));
        assert_eq!(scaled(1.5, 1 << 30), 3 << 29);
        assert_eq!(scaled(1e30, 1 << 30), u64::MAX);
    }

    #[derive(Debug, Deserialize)]
    struct Nullable {
        #[serde(default, deserialize_with = "strings")]
        args: Vec<String>,
        #[serde(default, deserialize_with = "string_map")]
        env: BTreeMap<String, String>,
        #[serde(default, deserialize_with = "object")]
        mounts: Map<String, Value>,
        #[serde(default, deserialize_with = "or_default")]
        flag: bool,
        #[serde(default, deserialize_with = "memory_mb")]
        mem: Option<u64>,
    }

    #[test]
    fn null_is_absent_as_a_value_an_item_or_a_map_value() {
        let n: Nullable = serde_json::from_value(json!({
            "args": ["a", null, "b"], "env": {"A": "1", "B": null},
            "mounts": {"m": null, "n": {"path": "p"}}, "flag": null, "mem": null,
        }))
        .unwrap();
        assert_eq!(n.args, ["a", "b"]);
        assert_eq!(n.env.len(), 1);
        assert_eq!(n.mounts.keys().collect::<Vec<_>>(), ["n"]);
        assert!(!n.flag && n.mem.is_none());
        let n: Nullable =
            serde_json::from_value(json!({"args": null, "env": null, "mounts": null})).unwrap();
        assert!(n.args.is_empty() && n.env.is_empty() && n.mounts.is_empty());
        let e = serde_json::from_value::<Nullable>(json!({"mem": -3})).unwrap_err();
        assert_eq!(e.to_string(), "memoryMB: must not be negative, got -3");
    }
}
