use std::path::{Path, PathBuf};

use boxdesk_platform::names::{validate_name, NameError, SandboxPaths, SUN_PATH_MAX};

#[test]
fn names_follow_the_grammar_and_nothing_else() {
    let max = "a".repeat(64);
    let over = "a".repeat(65);
    let valid = ["a", "A", "0", "dev-1", "my_box.2", "x..y", "a-", &max];
    for name in valid {
        assert_eq!(validate_name(name), Ok(()), "{name:?} should be valid");
    }
    let invalid = [
        "", &over, ".", "..", ".hidden", "-rf", "_x", "a/b", "a\0b", "a b", "é", "boxé", "a\n",
        "a:b",
    ];
    for name in invalid {
        assert!(validate_name(name).is_err(), "{name:?} should be invalid");
    }
}

#[test]
fn an_error_quotes_the_name_escaped() {
    assert_eq!(
        validate_name("a\0b").unwrap_err().to_string(),
        r#"sandbox name "a\0b" contains '\0'; only A-Z a-z 0-9 _ . - are allowed"#
    );
    assert_eq!(
        validate_name("..").unwrap_err().to_string(),
        r#"sandbox name ".." must start with a letter or digit"#
    );
    assert!(matches!(
        validate_name(&"a".repeat(65)),
        Err(NameError::TooLong { len: 65, .. })
    ));
}

#[test]
fn sandbox_paths_are_the_name_with_sock_agent_and_log_suffixes() {
    let paths = SandboxPaths::new(Path::new("/run/user/1000/boxdesk"), "dev-1").unwrap();
    assert_eq!(paths.sock, Path::new("/run/user/1000/boxdesk/dev-1.sock"));
    assert_eq!(paths.agent, Path::new("/run/user/1000/boxdesk/dev-1.agent"));
    assert_eq!(paths.log, Path::new("/run/user/1000/boxdesk/dev-1.log"));
}

#[test]
fn sandbox_paths_refuse_an_invalid_name() {
    let err = SandboxPaths::new(Path::new("/run"), "../etc").unwrap_err();
    assert!(matches!(err, NameError::BadStart { .. }), "{err:?}");
}

/// A runtime dir whose `<name>.agent` path is exactly `len` bytes.
fn dir_for_agent_path_of(len: usize, name: &str) -> PathBuf {
    let fixed = "/".len() + name.len() + ".agent".len();
    PathBuf::from(format!("/{}", "d".repeat(len - fixed - 1)))
}

#[test]
fn a_socket_path_over_the_os_limit_is_refused_naming_the_path_and_the_limit() {
    let dir = dir_for_agent_path_of(SUN_PATH_MAX, "box");
    let err = SandboxPaths::new(&dir, "box").unwrap_err();
    let agent = dir.join("box.agent");
    assert_eq!(
        err,
        NameError::PathTooLong {
            path: agent.clone(),
            len: SUN_PATH_MAX,
            max: SUN_PATH_MAX - 1
        }
    );
    let msg = err.to_string();
    assert!(msg.contains(&agent.display().to_string()), "{msg}");
    assert!(
        msg.contains(&format!("limit of {}", SUN_PATH_MAX - 1)),
        "{msg}"
    );
}

#[test]
fn a_socket_path_exactly_at_the_os_limit_is_accepted() {
    let dir = dir_for_agent_path_of(SUN_PATH_MAX - 1, "box");
    assert!(SandboxPaths::new(&dir, "box").is_ok());
}
