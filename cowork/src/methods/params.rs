//! The parameters of every method as the client sends them: one serde
//! type per method, [`params`] to decode them (naming the method when they
//! do not fit), and [`redacted`], the debug view of a request.
//!
//! Owns decoding and what counts as secret (tokens and stdin are wiped on
//! drop and never shown by `Debug` or the debug log); how loosely a value
//! may be written (any JSON number for a size or count, `null` for
//! absent) is `values`'. It never acts on a value: the handlers do.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use zeroize::Zeroizing;

use super::values;
use super::MethodError;

/// Decodes the parameters of `method`.
pub(super) fn params<T: DeserializeOwned>(method: &str, p: Value) -> Result<T, MethodError> {
    serde_json::from_value(p).map_err(|e| MethodError::BadParams {
        method: method.to_owned(),
        detail: e.to_string(),
    })
}

/// A string that may be a secret (a token, stdin): wiped when dropped and
/// never shown by `Debug`.
#[derive(Deserialize)]
#[serde(transparent)]
pub(super) struct Secret(pub(super) Zeroizing<String>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A process id: the client sends strings, numbers are accepted too.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum Id {
    S(String),
    N(serde_json::Number),
}

impl Id {
    pub(super) fn key(&self) -> String {
        match self {
            Id::S(s) => s.clone(),
            Id::N(n) => n.to_string(),
        }
    }
    pub(super) fn json(&self) -> Value {
        match self {
            Id::S(s) => json!(s),
            Id::N(n) => Value::Number(n.clone()),
        }
    }
}

/// `configure`: the resources of the profile's sandboxes, and where the
/// app keeps its logs.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ConfigureParams {
    #[serde(rename = "memoryMB", default, deserialize_with = "values::memory_mb")]
    pub(super) memory_mb: Option<u64>,
    #[serde(default, deserialize_with = "values::cpu_count")]
    pub(super) cpu_count: Option<u64>,
    pub(super) log_dir: Option<String>,
}

/// `createVM` and `startVM`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct StartParams {
    pub(super) bundle_path: Option<String>,
    #[serde(rename = "memoryGB", default, deserialize_with = "values::memory_gb")]
    pub(super) memory_gb: Option<f64>,
    #[serde(default, deserialize_with = "values::cpu_count")]
    pub(super) cpu_count: Option<u64>,
    #[serde(rename = "apiProbeURL")]
    pub(super) api_probe_url: Option<String>,
    #[serde(
        rename = "diskSizeGB",
        default,
        deserialize_with = "values::disk_size_gb"
    )]
    pub(super) disk_size_gb: Option<f64>,
}

/// One entry of `spawn`'s `additionalMounts`: a host folder and `ro`/`rw`.
#[derive(Debug, Deserialize)]
pub(super) struct MountSpec {
    pub(super) path: String,
    #[serde(default)]
    pub(super) mode: Option<String>,
}

/// `spawn`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SpawnParams {
    pub(super) id: Id,
    pub(super) name: String,
    pub(super) command: String,
    #[serde(default, deserialize_with = "values::strings")]
    pub(super) args: Vec<String>,
    pub(super) cwd: Option<String>,
    #[serde(default, deserialize_with = "values::string_map")]
    pub(super) env: BTreeMap<String, String>,
    /// Mount name → spec, in the client's order (the first visible one is
    /// the default cwd); a `null` spec is no mount.
    #[serde(default, deserialize_with = "values::object")]
    pub(super) additional_mounts: Map<String, Value>,
    #[serde(default, deserialize_with = "values::some_strings")]
    pub(super) allowed_domains: Option<Vec<String>>,
    #[serde(default, deserialize_with = "values::or_default")]
    pub(super) one_shot: bool,
    #[serde(default, deserialize_with = "values::or_default")]
    pub(super) mount_skeleton_home: bool,
    #[serde(default, deserialize_with = "values::or_default")]
    pub(super) is_resume: bool,
    pub(super) oauth_token: Option<Secret>,
}

/// Methods naming one process (or guest request) by id.
#[derive(Debug, Deserialize)]
pub(super) struct IdParams {
    pub(super) id: Id,
}

/// `kill`: a signal by name or number, SIGTERM when absent.
#[derive(Debug, Deserialize)]
pub(super) struct KillParams {
    pub(super) id: Id,
    #[serde(default)]
    pub(super) signal: Option<Value>,
}

/// `writeStdin`.
#[derive(Debug, Deserialize)]
pub(super) struct StdinParams {
    pub(super) id: Id,
    pub(super) data: Secret,
}

/// `mountPath`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct MountPathParams {
    pub(super) process_id: Id,
    pub(super) subpath: String,
    pub(super) mount_name: String,
    #[serde(default)]
    pub(super) mode: Option<String>,
}

/// `readFile`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ReadFileParams {
    pub(super) process_name: String,
    pub(super) file_path: String,
}

/// `deleteSessionDirs`.
#[derive(Debug, Deserialize)]
pub(super) struct NamesParams {
    #[serde(deserialize_with = "values::strings")]
    pub(super) names: Vec<String>,
}

/// `getSessionsDiskInfo`: `lowWaterBytes` is checked like every size and
/// otherwise unused (the result has no field it could drive).
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct DiskInfoParams {
    #[serde(default, deserialize_with = "values::low_water_bytes")]
    pub(super) low_water_bytes: Option<u64>,
}

/// `pruneSessionCaches`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct PruneParams {
    #[serde(default, deserialize_with = "values::only_if_free_bytes_below")]
    pub(super) only_if_free_bytes_below: Option<u64>,
    #[serde(default, deserialize_with = "values::or_default")]
    pub(super) include_session_tmp: bool,
    #[serde(default, deserialize_with = "values::session_tmp_older_than_seconds")]
    pub(super) session_tmp_older_than_seconds: Option<u64>,
}

/// `installSdk`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct SdkParams {
    pub(super) sdk_subpath: String,
    pub(super) version: String,
}

/// `addApprovedOauthToken`.
#[derive(Debug, Deserialize)]
pub(super) struct TokenParams {
    pub(super) token: Secret,
}

/// `setDebugLogging`.
#[derive(Debug, Deserialize)]
pub(super) struct DebugParams {
    #[serde(deserialize_with = "values::or_default")]
    pub(super) enabled: bool,
}

/// The debug view of a request: values that may hold secrets replaced.
pub fn redacted(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let hidden = matches!(
                        k.as_str(),
                        "token" | "oauthToken" | "env" | "data" | "resultJson"
                    );
                    (
                        k.clone(),
                        if hidden {
                            json!("<redacted>")
                        } else {
                            redacted(v)
                        },
                    )
                })
                .collect::<Map<String, Value>>(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(redacted).collect()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_logs_never_show_tokens_env_or_stdin() {
        let v = json!({"id": "1", "oauthToken": "sekrit", "env": {"A": "sekrit"}, "nested": [{"token": "sekrit"}], "data": "sekrit"});
        let shown = redacted(&v).to_string();
        assert!(!shown.contains("sekrit"), "{shown}");
        assert!(shown.contains("\"id\":\"1\""));
    }

    #[test]
    fn spawn_params_with_wrong_types_are_refused_with_the_method_name() {
        let e = params::<SpawnParams>("spawn", json!({"id": "1", "name": "s", "command": 5}))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("invalid params for spawn: invalid type"),
            "{e}"
        );
        let ok: SpawnParams = params("spawn", json!({"id": 7, "name": "s", "command": "true", "additionalMounts": {"p": {"path": "home/u/p", "mode": "rw"}}})).unwrap();
        assert_eq!(ok.id.key(), "7");
        assert_eq!(ok.additional_mounts["p"]["mode"], "rw");
    }

    #[test]
    fn a_secret_is_redacted_in_debug_output() {
        let t: TokenParams = params("addApprovedOauthToken", json!({"token": "sekrit"})).unwrap();
        assert!(!format!("{t:?}").contains("sekrit"));
    }
}
