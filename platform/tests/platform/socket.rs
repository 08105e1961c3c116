use std::fs;
use std::io;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use boxdesk_platform::socket::{
    bind_exclusive, check_not_symlink, clear_if_stale, connect_within, ensure_same_uid, is_live,
    peer_pid, peer_uid,
};
use boxdesk_platform::{euid, SocketError, Staleness, SUN_PATH_MAX};

use crate::{is_root, NOBODY};

/// Leaves a socket file nobody listens on: dropping a std listener closes
/// it but does not unlink the path.
fn stale_socket(path: &Path) {
    drop(UnixListener::bind(path).unwrap());
    assert!(fs::symlink_metadata(path).unwrap().file_type().is_socket());
}

#[test]
fn is_live_is_true_for_a_listening_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.sock");
    let _listener = UnixListener::bind(&path).unwrap();
    assert!(is_live(&path));
}

#[test]
fn is_live_is_false_for_a_socket_file_left_after_its_listener_was_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stale.sock");
    stale_socket(&path);
    assert!(!is_live(&path));
}

#[test]
fn is_live_is_false_for_a_missing_path() {
    let dir = tempfile::tempdir().unwrap();
    assert!(!is_live(&dir.path().join("nothing.sock")));
}

#[test]
fn is_live_never_blocks_and_stays_true_when_the_backlog_is_full() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.sock");
    let _listener = UnixListener::bind(&path).unwrap(); // never accepts
    let start = Instant::now();
    // Each knock stays queued until accepted, so this overflows any backlog.
    for _ in 0..5000 {
        assert!(is_live(&path));
    }
    assert!(start.elapsed() < Duration::from_secs(10));
}

#[test]
fn clear_if_stale_removes_a_stale_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stale.sock");
    stale_socket(&path);
    assert_eq!(clear_if_stale(&path).unwrap(), Staleness::Removed);
    assert!(!path.exists());
}

#[test]
fn clear_if_stale_leaves_a_live_socket() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("live.sock");
    let _listener = UnixListener::bind(&path).unwrap();
    assert_eq!(clear_if_stale(&path).unwrap(), Staleness::Live);
    assert!(is_live(&path));
}

#[test]
fn clear_if_stale_reports_an_absent_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("none.sock");
    assert_eq!(clear_if_stale(&path).unwrap(), Staleness::Absent);
}

#[test]
fn clear_if_stale_refuses_a_regular_file_and_leaves_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("file.sock");
    fs::write(&path, "precious").unwrap();
    let err = clear_if_stale(&path).unwrap_err();
    assert!(matches!(err, SocketError::NotASocket { .. }), "{err:?}");
    assert_eq!(fs::read_to_string(&path).unwrap(), "precious");
}

#[test]
fn clear_if_stale_refuses_a_symlink_to_a_stale_socket_and_leaves_both() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("stale.sock");
    let link = dir.path().join("link.sock");
    stale_socket(&target);
    symlink(&target, &link).unwrap();
    let err = clear_if_stale(&link).unwrap_err();
    assert!(matches!(err, SocketError::Symlink { .. }), "{err:?}");
    assert!(fs::symlink_metadata(&link).is_ok());
    assert!(target.exists());
}

#[test]
fn bind_exclusive_refuses_when_a_live_listener_exists() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("taken.sock");
    let _listener = UnixListener::bind(&path).unwrap();
    let err = bind_exclusive(&path).unwrap_err();
    assert!(
        matches!(&err, SocketError::InUse(p) if p == &path),
        "{err:?}"
    );
    assert!(is_live(&path), "the live socket must survive");
}

#[test]
fn bind_exclusive_takes_over_a_stale_socket_file_with_mode_0600() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stale.sock");
    stale_socket(&path);
    let listener = bind_exclusive(&path).unwrap();
    assert_eq!(fs::metadata(&path).unwrap().mode() & 0o7777, 0o600);
    let _client = UnixStream::connect(&path).unwrap();
    listener.accept().unwrap();
}

#[test]
fn bind_exclusive_refuses_a_symlink_and_a_regular_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("file");
    let link = dir.path().join("link.sock");
    fs::write(&file, "").unwrap();
    symlink(&file, &link).unwrap();
    let err = bind_exclusive(&link).unwrap_err();
    assert!(matches!(err, SocketError::Symlink { .. }), "{err:?}");
    let err = bind_exclusive(&file).unwrap_err();
    assert!(matches!(err, SocketError::NotASocket { .. }), "{err:?}");
}

#[test]
fn bind_exclusive_binds_a_path_at_the_os_limit_and_refuses_one_byte_more() {
    let dir = tempfile::tempdir().unwrap();
    let at_limit = |extra: usize| {
        let len = SUN_PATH_MAX - 1 + extra - dir.path().as_os_str().len() - 1;
        dir.path().join("s".repeat(len))
    };
    bind_exclusive(&at_limit(0)).unwrap();
    let err = bind_exclusive(&at_limit(1)).unwrap_err();
    assert!(matches!(err, SocketError::Path(_)), "{err:?}");
}

#[test]
fn check_not_symlink_refuses_only_symlinks() {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("link");
    symlink(dir.path(), &link).unwrap();
    assert!(check_not_symlink(dir.path()).is_ok());
    assert!(check_not_symlink(&dir.path().join("missing")).is_ok());
    assert!(matches!(
        check_not_symlink(&link),
        Err(SocketError::Symlink { .. })
    ));
}

#[test]
fn peer_uid_of_a_socketpair_is_our_euid() {
    let (a, b) = UnixStream::pair().unwrap();
    assert_eq!(peer_uid(&a).unwrap(), euid());
    ensure_same_uid(&b).unwrap();
}

#[test]
fn peer_pid_of_a_connected_socket_is_the_connecting_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let client = UnixStream::connect(&path).unwrap();
    let (server, _) = listener.accept().unwrap();
    assert_eq!(peer_pid(&server).unwrap(), std::process::id() as i32);
    assert_eq!(peer_pid(&client).unwrap(), std::process::id() as i32);
}

#[test]
fn a_peer_running_as_another_uid_is_refused_naming_both_uids() {
    if !is_root("connect as another uid") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("s.sock");
    let listener = UnixListener::bind(&path).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o777)).unwrap();

    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let addr = UnixAddr::new(&path).unwrap();
    // Runs in the child after its setuid: socket(2) and connect(2) only,
    // on an address built before the fork; nothing allocates.
    let connect_as_child = move || -> io::Result<()> {
        let fd = socket(
            AddressFamily::Unix,
            SockType::Stream,
            SockFlag::empty(),
            None,
        )?;
        connect(fd.as_raw_fd(), &addr)?;
        Ok(())
    };
    let mut child = Command::new("true");
    child.uid(NOBODY).gid(NOBODY);
    // SAFETY: the hook only makes async-signal-safe syscalls and touches no
    // lock or allocator, so it is sound in the forked child of a threaded test.
    unsafe { child.pre_exec(connect_as_child) };
    assert!(child.status().unwrap().success());

    let (stream, _) = listener.accept().unwrap();
    assert_eq!(peer_uid(&stream).unwrap(), NOBODY);
    let err = ensure_same_uid(&stream).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("peer runs as uid {NOBODY}, not 0; refusing it")
    );
}

/// A listener that never accepts, its backlog already full: a backlog of
/// 0 and a few knocks, each of which stays queued until accepted.
fn full_listener(path: &Path) -> UnixListener {
    use std::os::fd::AsRawFd;
    let listener = UnixListener::bind(path).unwrap();
    // SAFETY: listen on a descriptor we own; it only changes the backlog.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 0) }, 0);
    for _ in 0..4 {
        assert!(is_live(path));
    }
    listener
}

/// Linux waits for backlog room (bounded by the send timeout); other
/// kernels refuse at once.
#[cfg(target_os = "linux")]
#[test]
fn connect_within_gives_up_on_a_listener_that_never_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("full.sock");
    let _full = full_listener(&path);
    let start = Instant::now();
    let err = connect_within(&path, Duration::from_millis(300)).unwrap_err();
    let took = start.elapsed();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(5),
        "{took:?}"
    );
}

#[test]
fn connect_within_connects_to_a_listener_and_says_not_found_for_none() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let s = connect_within(&path, Duration::from_secs(1)).unwrap();
    assert_eq!(s.write_timeout().unwrap(), None);
    drop(listener.accept().unwrap());
    let err = connect_within(&dir.path().join("none.sock"), Duration::from_secs(1)).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
    stale_socket(&dir.path().join("dead.sock"));
    let err = connect_within(&dir.path().join("dead.sock"), Duration::from_secs(1)).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
}
