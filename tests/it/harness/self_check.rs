//! The test harness itself: start, stop, restart, failure reporting and cleanup. If these fail,
//! every other integration test is suspect.

use crate::harness::*;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else {
        "<non-text panic>".to_string()
    }
}

fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn server_starts_with_the_module_loaded_and_answers() {
    let server = Server::start();
    assert!(server.is_alive());
    assert!(server.dir.is_dir());
    let mut con = server.conn();
    assert!(ping(&mut con));
    assert!(
        server.log().contains("Module 'tb' loaded"),
        "log does not show the module loaded:\n{}",
        server.log()
    );
    let port: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("port")
        .query(&mut con)
        .unwrap();
    assert_eq!(port[1], server.port.to_string());
}

#[test]
fn servers_get_their_own_ports_and_directories() {
    let a = Server::start();
    let b = Server::start();
    assert_ne!(a.port, b.port);
    assert_ne!(a.dir, b.dir);
    let _: () = redis::cmd("SET")
        .arg("x")
        .arg("a")
        .query(&mut a.conn())
        .unwrap();
    let x: Option<String> = redis::cmd("GET").arg("x").query(&mut b.conn()).unwrap();
    assert_eq!(x, None, "servers share data");
}

#[test]
fn stop_ends_the_process_and_restart_brings_it_back_on_the_same_port() {
    let mut server = Server::start_with(&["--appendonly", "yes"]);
    let port = server.port;
    let _: () = redis::cmd("SET")
        .arg("x")
        .arg("1")
        .query(&mut server.conn())
        .unwrap();
    let pid = server.pid().expect("running");
    server.stop();
    assert!(!server.is_alive());
    assert!(!process_exists(pid), "process {pid} still there after stop");
    server.restart();
    assert!(server.is_alive());
    assert_eq!(server.port, port);
    // Same dir and args: the AOF written before the stop is loaded again.
    let x: Option<String> = redis::cmd("GET")
        .arg("x")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(x.as_deref(), Some("1"));
    assert!(server.args().iter().any(|a| a == "yes"), "extra args kept");
}

#[test]
fn restart_of_a_running_server_works() {
    let mut server = Server::start();
    server.restart();
    server.restart();
    assert!(server.is_alive());
    assert_eq!(
        take(&mut server.conn(), "b", "10", "2", "3"),
        vec![1, 7, 0, 1500]
    );
}

#[test]
fn kill_is_a_crash() {
    let mut server = Server::start();
    let pid = server.pid().expect("running");
    server.kill();
    assert!(!server.is_alive());
    assert!(!process_exists(pid));
}

#[test]
fn drop_removes_the_directory_and_the_process() {
    let server = Server::start();
    let dir = server.dir.clone();
    let pid = server.pid().expect("running");
    drop(server);
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(!process_exists(pid), "process {pid} left behind");
}

#[test]
fn drop_cleans_up_after_a_panicking_test() {
    let mut seen: Option<(PathBuf, u32)> = None;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let server = Server::start();
        seen = Some((server.dir.clone(), server.pid().expect("running")));
        panic!("test failure inside a test");
    }));
    assert!(result.is_err());
    let (dir, pid) = seen.expect("server was started");
    assert!(!dir.exists(), "{} left behind", dir.display());
    assert!(!process_exists(pid), "process {pid} left behind");
}

#[test]
fn a_server_that_cannot_start_fails_the_test_with_its_log() {
    let result = catch_unwind(|| Server::start_with(&["--no-such-directive", "x"]));
    let message = panic_text(result.err().expect("start must panic, not skip"));
    assert!(
        message.contains("FATAL CONFIG FILE ERROR") || message.contains("no-such-directive"),
        "panic message does not carry the server's complaint:\n{message}"
    );
}

#[test]
fn module_path_points_at_an_existing_library() {
    let path = module_path();
    assert!(path.is_absolute(), "{}", path.display());
    assert!(path.is_file(), "{}", path.display());
}
