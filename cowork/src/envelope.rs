//! The helper protocol's framing and envelopes: `u32` big-endian length +
//! UTF-8 JSON, both directions, bodies up to [`MAX_BODY`].
//!
//! Owns turning a frame body into a [`Request`] and results into reply
//! bodies. A length over the cap is refused by the codec from the 4 length
//! bytes alone, before anything is allocated for it. This module never
//! decides what a method does. (Named for what it frames: `wire` is
//! `boxdesk_channel::wire`, the agent channel's payload encodings.)

use bytes::{BufMut, Bytes, BytesMut};
use serde_json::{Map, Value};
use tokio_util::codec::LengthDelimitedCodec;

/// Largest frame body, both directions (10 MiB, as the client).
pub const MAX_BODY: usize = 10 << 20;

/// The framing codec: 4-byte big-endian length, body at most [`MAX_BODY`].
pub fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .big_endian()
        .length_field_length(4)
        .max_frame_length(MAX_BODY)
        .new_codec()
}

/// One request: `{method, id?, params?}`.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The client's id, echoed in the reply; absent for one-shot requests.
    pub id: Option<Value>,
    /// The method name.
    pub method: String,
    /// The parameters (`{}` when absent).
    pub params: Value,
}

/// Why a frame body is not a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EnvelopeError {
    /// The body is not JSON at all: the connection is closed after the reply.
    #[error("frame body is not JSON: {0}")]
    NotJson(String),
    /// The body has an object with a key twice (which one counts is the
    /// parser's guess): the connection is closed after the reply.
    #[error("frame body has {0}")]
    DuplicateKey(String),
    /// The body is JSON but not an object: the connection is closed after
    /// the reply.
    #[error("frame body is a JSON {0}, not an object")]
    NotObject(&'static str),
    /// An object without a string `method`: answered, the connection goes on.
    #[error("request has no method name")]
    NoMethod {
        /// The request's id, when it had one.
        id: Option<Value>,
    },
    /// `params` is present but not an object: answered, the connection goes on.
    #[error("params of {method} must be an object")]
    BadParams {
        /// The request's id, when it had one.
        id: Option<Value>,
        /// The method.
        method: String,
    },
}

impl EnvelopeError {
    /// Whether the connection must end after the error reply.
    pub fn closes(&self) -> bool {
        matches!(
            self,
            EnvelopeError::NotJson(_)
                | EnvelopeError::DuplicateKey(_)
                | EnvelopeError::NotObject(_)
        )
    }

    /// The id to answer with, when one is known.
    pub fn id(&self) -> Option<&Value> {
        match self {
            EnvelopeError::NoMethod { id } | EnvelopeError::BadParams { id, .. } => id.as_ref(),
            _ => None,
        }
    }
}

/// Parses one frame body.
pub fn parse(body: &[u8]) -> Result<Request, EnvelopeError> {
    let value = crate::strict::from_slice(body).map_err(|e| match e.classify() {
        // (the only data error a strict parse makes: see `strict`)
        serde_json::error::Category::Data => EnvelopeError::DuplicateKey(e.to_string()),
        _ => EnvelopeError::NotJson(e.to_string()),
    })?;
    let Value::Object(mut obj) = value else {
        return Err(EnvelopeError::NotObject(kind(&value)));
    };
    // A JSON null id is no id: the client never sends one.
    let id = obj.remove("id").filter(|v| !v.is_null());
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        _ => return Err(EnvelopeError::NoMethod { id }),
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(p @ Value::Object(_)) => p,
        Some(_) => return Err(EnvelopeError::BadParams { id, method }),
    };
    Ok(Request { id, method, params })
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// A reply body: `{success: true, result, id?}` or `{success: false,
/// error, id?}`.
pub fn reply(id: Option<&Value>, outcome: Result<Value, String>) -> Bytes {
    let mut obj = Map::with_capacity(3);
    match outcome {
        Ok(result) => {
            obj.insert("success".into(), Value::Bool(true));
            obj.insert("result".into(), result);
        }
        Err(error) => {
            obj.insert("success".into(), Value::Bool(false));
            obj.insert("error".into(), Value::String(error));
        }
    }
    if let Some(id) = id {
        obj.insert("id".into(), id.clone());
    }
    Bytes::from(serde_json::to_vec(&Value::Object(obj)).unwrap_or_default())
}

/// A whole frame (length prefix included) around a JSON value.
pub fn frame_json(value: &Value) -> Bytes {
    let mut out = BytesMut::with_capacity(64).writer();
    out.get_mut().put_u32(0);
    // Serialising a `Value` into memory cannot fail.
    let _ = serde_json::to_writer(&mut out, value);
    finish(out.into_inner())
}

/// Writes the length prefix of a frame built in `buf` behind 4 zero bytes.
pub fn finish(mut buf: BytesMut) -> Bytes {
    let len = (buf.len() - 4) as u32;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    buf.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_request_without_id_or_params_is_a_one_shot_with_empty_params() {
        let r = parse(br#"{"method":"isRunning"}"#).unwrap();
        assert_eq!(r.id, None);
        assert_eq!(r.method, "isRunning");
        assert_eq!(r.params, json!({}));
    }

    #[test]
    fn bodies_that_are_not_objects_close_the_connection_and_bad_fields_do_not() {
        assert!(parse(b"\xff{").unwrap_err().closes());
        assert!(parse(b"[1,2]").unwrap_err().closes());
        let e = parse(br#"{"id":7,"params":{}}"#).unwrap_err();
        assert!(!e.closes());
        assert_eq!(e.id(), Some(&json!(7)));
        let e = parse(br#"{"id":"a","method":"spawn","params":[1]}"#).unwrap_err();
        assert!(!e.closes());
        assert_eq!(e.id(), Some(&json!("a")));
    }

    #[test]
    fn a_key_given_twice_is_refused_with_its_name_and_closes_the_connection() {
        let e = parse(br#"{"method":"isRunning","method":"stopVM"}"#).unwrap_err();
        assert!(e.closes());
        assert!(
            matches!(&e, EnvelopeError::DuplicateKey(why) if why.contains("\"method\"")),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with("frame body has duplicate key"),
            "{e}"
        );
        // Not JSON stays not JSON.
        assert!(matches!(parse(b"{\"a\":"), Err(EnvelopeError::NotJson(_))));
    }

    #[test]
    fn replies_echo_the_id_only_when_there_was_one() {
        let v: Value = serde_json::from_slice(&reply(None, Ok(json!({"running": true})))).unwrap();
        assert_eq!(v, json!({"success": true, "result": {"running": true}}));
        let v: Value = serde_json::from_slice(&reply(Some(&json!(3)), Err("no".into()))).unwrap();
        assert_eq!(v, json!({"success": false, "error": "no", "id": 3}));
    }

    proptest::proptest! {
        #[test]
        fn no_body_makes_parse_panic(body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256)) {
            let _ = parse(&body);
        }

        #[test]
        fn any_object_with_a_string_method_parses(m in "[a-zA-Z]{1,20}", id in proptest::prelude::any::<u32>()) {
            let r = parse(format!(r#"{{"method":"{m}","id":{id}}}"#).as_bytes()).unwrap();
            proptest::prop_assert_eq!(r.method, m);
            proptest::prop_assert_eq!(r.id, Some(json!(id)));
        }
    }

    #[test]
    fn a_framed_value_carries_its_big_endian_length() {
        let f = frame_json(&json!({"a": 1}));
        assert_eq!(&f[..4], &(f.len() as u32 - 4).to_be_bytes());
        assert_eq!(&f[4..], br#"{"a":1}"#);
    }
}
