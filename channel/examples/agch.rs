//! A minimal channel client: runs one command through an agent and exits
//! with its status.
//!
//! ```text
//! cargo run -p boxdesk-channel --example agch -- unix:/path/agent.sock sh -c 'echo hi'
//! cargo run -p boxdesk-channel --example agch -- hybrid:/run/user/1000/boxdesk/x.agent uname -a
//! ```

use std::io::Write;
use std::process::ExitCode;

use boxdesk_channel::{Exec, Frame, Session, AGENT_PORT};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [target, command, rest @ ..] = &args[..] else {
        eprintln!("usage: agch unix:PATH|hybrid:PATH COMMAND [ARGS...]");
        return ExitCode::from(125);
    };
    let session = match target.split_once(':') {
        Some(("unix", p)) => Session::connect_unix(p),
        Some(("hybrid", p)) => Session::connect_hybrid(p, AGENT_PORT),
        _ => {
            eprintln!("agch: target must be unix:PATH or hybrid:PATH");
            return ExitCode::from(125);
        }
    };
    let mut session = match session {
        Ok(s) => s,
        Err(e) => {
            eprintln!("agch: {e}");
            return ExitCode::from(125);
        }
    };
    let exec = Exec::new(command.as_bytes(), rest.iter().map(|a| a.as_bytes()));
    if let Err(e) = session.send(&Frame::Exec(exec)).and_then(|()| {
        // No stdin: the command sees EOF at once.
        session.send(&Frame::Stdin(Default::default()))
    }) {
        eprintln!("agch: {e}");
        return ExitCode::from(125);
    }
    let mut status = 125u8;
    loop {
        match session.recv() {
            Ok(Some(Frame::Stdout(d))) => drop(std::io::stdout().write_all(&d)),
            Ok(Some(Frame::Stderr(d))) => drop(std::io::stderr().write_all(&d)),
            Ok(Some(Frame::Exit(code))) if code >= 0 => status = code as u8,
            Ok(Some(Frame::Exit(sig))) => status = 128u8.wrapping_add(sig.unsigned_abs() as u8),
            Ok(Some(Frame::TimedOut)) => status = 124,
            Ok(Some(Frame::Error(msg))) => eprintln!("agch: agent: {msg}"),
            Ok(Some(_)) => {}
            Ok(None) => break,
            Err(e) => {
                eprintln!("agch: {e}");
                return ExitCode::from(125);
            }
        }
    }
    ExitCode::from(status)
}
