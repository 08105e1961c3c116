//! [`MethodError`]: why a method failed. Its `Display` is the `error`
//! string the client gets in a `success: false` reply, so the texts of
//! docs/COWORK.md (`Unknown method: <m>`) and those clients match on (`invalid
//! params for <method>`) are written here and nowhere else.
//!
//! Every message says its cause once: a variant wrapping another module's
//! error is `transparent`; one that adds context prints the cause as a
//! plain field (the client sees one string, so it is never also a
//! `source`). This module never decides when a method fails.

use std::io;
use std::path::PathBuf;

use serde_json::Value;

use crate::mounts::MountError;
use crate::names::NameError;
use crate::process::ProcError;
use crate::sessions::SessionError;

/// Why a method failed.
#[derive(Debug, thiserror::Error)]
pub enum MethodError {
    /// No method has this name.
    #[error("Unknown method: {0}")]
    UnknownMethod(String),
    /// The parameters do not fit the method's type.
    #[error("invalid params for {method}: {detail}")]
    BadParams {
        /// The method.
        method: String,
        /// What did not fit, as the decoder says it.
        detail: String,
    },
    /// `startVM`'s `memoryGB` is not a positive number.
    #[error("startVM: memoryGB must be a positive number, not {0}")]
    BadMemory(f64),
    /// A mount's `mode` is neither `ro` nor `rw`.
    #[error("mode must be \"ro\" or \"rw\", not {0:?}")]
    BadMode(String),
    /// A name that becomes one path component is not one.
    #[error("bad {what} {name:?}: {why}")]
    BadName {
        /// Whose name: "session name", "mount name"…
        what: &'static str,
        /// The name.
        name: String,
        /// What is wrong with it.
        why: NameError,
    },
    /// `kill` named a signal that does not exist.
    #[error("unknown signal {0}")]
    UnknownSignal(Value),
    /// `spawn` without a command.
    #[error("command is empty")]
    EmptyCommand,
    /// An environment variable name that cannot be one.
    #[error("bad environment variable name {0:?}")]
    BadEnvName(String),
    /// A mount's spec is not `{path, mode?}`.
    #[error("bad mount spec: {0}")]
    BadMountSpec(String),
    /// A path the client named is not in the part of the sandbox it may
    /// name.
    #[error("{path:?} is not under {}", root.display())]
    OutsideSession {
        /// The path asked for.
        path: String,
        /// Where it must be.
        root: PathBuf,
    },
    /// Refused by policy: a folder holding or inside boxdesk's own data
    /// or runtime directories is never mounted into a sandbox.
    #[error("{} holds or is inside boxdesk's own {}: not mountable", path.display(), own.display())]
    OwnDirectory {
        /// The folder asked for, resolved.
        path: PathBuf,
        /// boxdesk's directory it overlaps.
        own: PathBuf,
    },
    /// Refused by policy: an SDK that no sandbox could see.
    #[error("the SDK dir {} must be under the home directory {}", dir.display(), home.display())]
    SdkNotVisible {
        /// The SDK dir.
        dir: PathBuf,
        /// The user's home.
        home: PathBuf,
    },
    /// The SDK has no `claude` executable.
    #[error("no SDK at {}: {reason}", path.display())]
    NoSdk {
        /// The `claude` it looked for.
        path: PathBuf,
        /// What the OS said.
        reason: io::Error,
    },
    /// The SDK's `claude` is not an executable file.
    #[error("{} is not an executable file", .0.display())]
    NotExecutable(PathBuf),
    /// A mount source could not be inspected.
    #[error("cannot inspect {subpath:?}: {reason}")]
    Inspect {
        /// The client's path.
        subpath: String,
        /// What the OS said.
        reason: io::Error,
    },
    /// The process table refused (unknown id, exited, backlog…).
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// Attaching a folder failed.
    #[error(transparent)]
    Mount(#[from] MountError),
    /// A session dir could not be made or measured.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The profile's sandboxes cannot serve: not started, or one could
    /// not start, or folders cannot be mounted into them.
    #[error("{0}")]
    Sandbox(String),
    /// `readFile` could not read the file through the agent.
    #[error("{0}")]
    ReadFile(String),
    /// The blocking task running the method panicked or was cancelled.
    #[error("internal error: {0}")]
    Internal(tokio::task::JoinError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_texts_clients_match_on_are_unchanged() {
        assert_eq!(
            MethodError::UnknownMethod("noSuchMethod".into()).to_string(),
            "Unknown method: noSuchMethod"
        );
        assert_eq!(
            MethodError::Proc(ProcError::Exited("a".into())).to_string(),
            "process a has exited"
        );
        assert_eq!(
            MethodError::BadMemory(-1.0).to_string(),
            "startVM: memoryGB must be a positive number, not -1"
        );
        assert_eq!(
            MethodError::BadMode("rx".into()).to_string(),
            r#"mode must be "ro" or "rw", not "rx""#
        );
    }

    #[test]
    fn no_message_repeats_its_source() {
        use std::error::Error as _;
        let errors = [
            MethodError::Proc(ProcError::Unknown("x".into())),
            MethodError::NoSdk {
                path: "/sdk/claude".into(),
                reason: io::Error::from(io::ErrorKind::NotFound),
            },
            MethodError::BadName {
                what: "session name",
                name: "a/b".into(),
                why: NameError::Slash,
            },
        ];
        for e in errors {
            let text = e.to_string();
            let mut cause = e.source();
            while let Some(c) = cause {
                assert!(!text.contains(&c.to_string()), "{text} repeats {c}");
                cause = c.source();
            }
        }
    }
}
