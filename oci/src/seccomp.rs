//! A bundle's seccomp profile (`linux.seccomp`) compiled to BPF programs
//! the sandbox installs beside boxdesk's own.
//!
//! One seccompiler filter has one action for its matches and one for the
//! rest, while a profile gives each rule its own action. So the profile
//! becomes a stack, which the kernel evaluates as a whole, the most
//! restrictive answer winning:
//!
//! - one program per action other than allow (each `ERRNO` value its
//!   own) answers that action for the calls its rules match, and allows
//!   the rest;
//! - one program, installed last (it may refuse `seccomp` itself), answers
//!   the profile's default action for every call no rule names (with its
//!   arguments), and allows the rest.
//!
//! The programs apply to the whole sandbox, the agent included (runc
//! applies them to the container's process only): a profile that refuses
//! what the agent needs (`accept4`, `poll`, `execve`, …) makes a sandbox
//! whose agent fails, and `create` reports that.
//!
//! A call a rule allows passes every program; a call a rule answers with
//! `ERRNO(1)` gets `ERRNO(1)` from that rule's program; an unnamed call gets
//! the default. Where two rules for the same call disagree, the more
//! restrictive wins (libseccomp refuses such profiles). Names this
//! architecture does not have are skipped, as runc does; the programs
//! are for this host's architecture only (boxdesk's own programs kill any
//! other).
//!
//! This module owns that translation. It must never widen a profile: what
//! it cannot express (a notify listener, filter flags) is refused.

use std::collections::BTreeMap;
use std::str::FromStr;

use oci_spec::runtime::{LinuxSeccomp, LinuxSeccompAction, LinuxSeccompOperator, LinuxSyscall};
use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule,
};

/// Why a profile cannot be compiled.
#[derive(Debug, thiserror::Error)]
pub enum SeccompError {
    /// Something the profile asks that boxdesk cannot do.
    #[error("linux.seccomp.{field}: {why}")]
    Unsupported {
        /// The field.
        field: &'static str,
        /// Why.
        why: String,
    },
    /// seccompiler refused the filter.
    #[error("linux.seccomp: cannot compile the profile")]
    Compile(#[from] seccompiler::BackendError),
    /// The host's architecture has no seccomp support here.
    #[error(transparent)]
    Arch(#[from] boxdesk_sandbox::seccomp::SeccompError),
}

fn unsupported(field: &'static str, why: impl Into<String>) -> SeccompError {
    SeccompError::Unsupported {
        field,
        why: why.into(),
    }
}

/// An action with its data, as the programs are grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    KillProcess,
    KillThread,
    Trap,
    Errno(u32),
    Trace(u32),
    Log,
    Allow,
}

impl Action {
    fn of(action: LinuxSeccompAction, errno: Option<u32>) -> Result<Action, SeccompError> {
        Ok(match action {
            LinuxSeccompAction::ScmpActKill | LinuxSeccompAction::ScmpActKillThread => {
                Action::KillThread
            }
            LinuxSeccompAction::ScmpActKillProcess => Action::KillProcess,
            LinuxSeccompAction::ScmpActTrap => Action::Trap,
            LinuxSeccompAction::ScmpActErrno => Action::Errno(errno.unwrap_or(libc::EPERM as u32)),
            LinuxSeccompAction::ScmpActTrace => Action::Trace(errno.unwrap_or(0)),
            LinuxSeccompAction::ScmpActLog => Action::Log,
            LinuxSeccompAction::ScmpActAllow => Action::Allow,
            LinuxSeccompAction::ScmpActNotify => {
                return Err(unsupported(
                    "syscalls",
                    "SCMP_ACT_NOTIFY needs a seccomp listener, which boxdesk does not run",
                ))
            }
        })
    }

    fn seccompiler(self) -> SeccompAction {
        match self {
            Action::KillProcess => SeccompAction::KillProcess,
            Action::KillThread => SeccompAction::KillThread,
            Action::Trap => SeccompAction::Trap,
            Action::Errno(e) => SeccompAction::Errno(e),
            Action::Trace(e) => SeccompAction::Trace(e),
            Action::Log => SeccompAction::Log,
            Action::Allow => SeccompAction::Allow,
        }
    }
}

type Rules = BTreeMap<i64, Vec<SeccompRule>>;

/// Compiles `profile` to the programs to install, each as the
/// `struct sock_filter[]` bytes bwrap reads.
pub fn compile(profile: &LinuxSeccomp) -> Result<Vec<Vec<u8>>, SeccompError> {
    Ok(programs(profile)?
        .iter()
        .map(|p| boxdesk_sandbox::seccomp::to_bytes(p))
        .collect())
}

fn programs(profile: &LinuxSeccomp) -> Result<Vec<BpfProgram>, SeccompError> {
    if profile.flags().as_ref().is_some_and(|f| !f.is_empty()) {
        return Err(unsupported(
            "flags",
            "filter flags are not supported (boxdesk installs the filters itself)",
        ));
    }
    if profile.listener_path().is_some() {
        return Err(unsupported(
            "listenerPath",
            "seccomp notify listeners are not supported",
        ));
    }
    let arch = boxdesk_sandbox::seccomp::target_arch()?;
    let default = Action::of(profile.default_action(), profile.default_errno_ret())?;
    // Every named call with its conditions (for the default's program), and
    // the same per action.
    let mut named: Rules = BTreeMap::new();
    let mut by_action: BTreeMap<Action, Rules> = BTreeMap::new();
    for rule in profile.syscalls().iter().flatten() {
        let action = Action::of(rule.action(), rule.errno_ret())?;
        let conditions = conditions(rule)?;
        for name in rule.names() {
            let Some(nr) = number(name) else {
                continue;
            };
            add(&mut named, nr, &conditions)?;
            if action != Action::Allow {
                add(by_action.entry(action).or_default(), nr, &conditions)?;
            }
        }
    }
    // The default's program last: it may refuse `seccomp` itself, which
    // installing the others needs.
    let mut out = Vec::with_capacity(1 + by_action.len());
    for (action, rules) in by_action {
        out.push(
            SeccompFilter::new(rules, SeccompAction::Allow, action.seccompiler(), arch)?
                .try_into()?,
        );
    }
    if default != Action::Allow {
        out.push(
            SeccompFilter::new(named, default.seccompiler(), SeccompAction::Allow, arch)?
                .try_into()?,
        );
    }
    Ok(out)
}

/// This architecture's number of the call `name`, if it has one.
fn number(name: &str) -> Option<i64> {
    syscalls::Sysno::from_str(name).ok().map(|s| s.id() as i64)
}

/// Adds a rule for call `nr`: unconditional (an empty list, which
/// matches whatever the arguments) once any rule for it is.
fn add(rules: &mut Rules, nr: i64, conditions: &[SeccompCondition]) -> Result<(), SeccompError> {
    let entry = rules.entry(nr);
    match (entry, conditions.is_empty()) {
        (std::collections::btree_map::Entry::Vacant(v), true) => {
            v.insert(Vec::new());
        }
        (std::collections::btree_map::Entry::Vacant(v), false) => {
            v.insert(vec![SeccompRule::new(conditions.to_vec())?]);
        }
        (std::collections::btree_map::Entry::Occupied(mut o), true) => {
            o.get_mut().clear();
        }
        (std::collections::btree_map::Entry::Occupied(mut o), false) => {
            // Already unconditional: a narrower rule adds nothing.
            if !o.get().is_empty() {
                o.get_mut().push(SeccompRule::new(conditions.to_vec())?);
            }
        }
    }
    Ok(())
}

/// A rule's argument checks (all must hold), compared on 64 bits.
fn conditions(rule: &LinuxSyscall) -> Result<Vec<SeccompCondition>, SeccompError> {
    let mut out = Vec::new();
    for arg in rule.args().iter().flatten() {
        let index = u8::try_from(arg.index())
            .ok()
            .filter(|&i| i < 6)
            .ok_or_else(|| {
                unsupported("syscalls.args.index", format!("{} is not 0-5", arg.index()))
            })?;
        let (op, value) = match arg.op() {
            LinuxSeccompOperator::ScmpCmpNe => (SeccompCmpOp::Ne, arg.value()),
            LinuxSeccompOperator::ScmpCmpLt => (SeccompCmpOp::Lt, arg.value()),
            LinuxSeccompOperator::ScmpCmpLe => (SeccompCmpOp::Le, arg.value()),
            LinuxSeccompOperator::ScmpCmpEq => (SeccompCmpOp::Eq, arg.value()),
            LinuxSeccompOperator::ScmpCmpGe => (SeccompCmpOp::Ge, arg.value()),
            LinuxSeccompOperator::ScmpCmpGt => (SeccompCmpOp::Gt, arg.value()),
            // libseccomp: (arg & value) == valueTwo.
            LinuxSeccompOperator::ScmpCmpMaskedEq => (
                SeccompCmpOp::MaskedEq(arg.value()),
                arg.value_two().unwrap_or(0),
            ),
        };
        out.push(SeccompCondition::new(
            index,
            SeccompCmpArgLen::Qword,
            op,
            value,
        )?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
