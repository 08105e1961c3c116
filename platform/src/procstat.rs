//! A process told apart from a later one with its pid: its start time
//! (field 22 of `/proc/<pid>/stat`, clock ticks since boot), and whether
//! it still runs (not a zombie). Linux's `/proc`; elsewhere every process
//! reads as gone.
//!
//! This module owns that parse and nothing else.

/// `(state, start time)` of `pid`.
fn stat(pid: i32) -> Option<(char, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces and
    // parentheses: the fields follow the last `)`.
    let rest = text.get(text.rfind(')')? + 2..)?;
    let mut fields = rest.split(' ');
    let state = fields.next()?.chars().next()?;
    // `rest` starts at field 3; field 22 is the 19th after the state.
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// `pid`'s start time, if it exists.
pub fn start_time(pid: i32) -> Option<u64> {
    stat(pid).map(|(_, t)| t)
}

/// Whether `pid` is still the process that started at `started`, and not
/// a zombie.
pub fn alive(pid: i32, started: u64) -> bool {
    matches!(stat(pid), Some((state, t)) if t == started && state != 'Z' && state != 'X')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn this_process_is_alive_by_its_own_start_time_and_another_time_is_not_it() {
        let me = std::process::id() as i32;
        let t = start_time(me).unwrap();
        assert!(alive(me, t));
        assert!(!alive(me, t + 1));
        assert!(!alive(-1, t));
    }
}
