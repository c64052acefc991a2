//! Module lifecycle: MODULE UNLOAD / MODULE LOAD at run time, and bad load arguments.
//!
//! Redis 7 refuses the MODULE command unless `enable-module-command` allows it, so every
//! server here starts with `--enable-module-command yes`. Buckets are plain hashes, so they
//! outlive the module: unloading removes the commands, not the data.
//!
//! Load arguments are `shadow-mode yes|no`; anything else makes the module refuse to load,
//! with a `<tb> tb: not loaded: ...` line in the server log, and the server carries on.

use std::fs;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

const MODULE_ARGS: &[&str] = &["--enable-module-command", "yes"];
/// The server's reply to any failed MODULE LOAD; the reason is in its log.
const LOAD_FAILED: &str = "ERR Error loading the extension. Please check the server logs.";
/// One token per 1000 s: nothing refills noticeably during a test.
const SLOW: &str = "0.001";

fn module() -> String {
    module_path().display().to_string()
}

fn module_cmd(con: &mut redis::Connection, args: &[&str]) -> Result<String, String> {
    let mut cmd = redis::cmd("MODULE");
    for arg in args {
        cmd.arg(*arg);
    }
    cmd.query::<String>(con).map_err(|e| error_text(&e))
}

fn load(con: &mut redis::Connection, extra: &[&str]) -> Result<String, String> {
    let path = module();
    let mut args = vec!["LOAD", path.as_str()];
    args.extend_from_slice(extra);
    module_cmd(con, &args)
}

fn unload(con: &mut redis::Connection) -> Result<String, String> {
    module_cmd(con, &["UNLOAD", "tb"])
}

/// Names of the loaded modules (MODULE LIST), less Valkey 9's built-in
/// `lua` scripting engine, which it lists as a module.
fn loaded_modules(con: &mut redis::Connection) -> Vec<String> {
    module_list(con)
        .iter()
        .map(|module| match module.get("name") {
            Some(redis::Value::BulkString(name)) => String::from_utf8_lossy(name).into_owned(),
            other => panic!("MODULE LIST entry without a name: {other:?}"),
        })
        .filter(|name| name != "lua")
        .collect()
}

fn assert_log_mentions(server: &Server, needle: &str) {
    let log = server.log();
    assert!(
        log.contains(needle),
        "server log lacks {needle:?}:\n{}",
        log.lines().rev().take(15).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn unload_then_load_keeps_existing_buckets_working() {
    let server = Server::start_with(MODULE_ARGS);
    let mut con = server.conn();
    assert_eq!(take(&mut con, "kept", "10", SLOW, "3")[..2], [1, 7]);
    let deadline = pexpiretime(&mut con, "kept");
    let fields = hgetall(&mut con, "kept");

    assert_eq!(unload(&mut con), Ok("OK".into()));
    assert_log_mentions(&server, "Module tb unloaded");
    // Without the module the command is gone, the bucket is a plain hash with its expiry.
    let err = expect_error(
        &mut con,
        &[b"TB.TAKE", b"kept", b"10", SLOW.as_bytes(), b"1"],
    );
    assert!(err.starts_with("ERR unknown command"), "{err}");
    assert_eq!(hgetall(&mut con, "kept"), fields);
    assert_eq!(pexpiretime(&mut con, "kept"), deadline);

    assert_eq!(load(&mut con, &[]), Ok("OK".into()));
    // State read back: 7 stored, one more taken.
    assert_eq!(take(&mut con, "kept", "10", SLOW, "1")[..3], [1, 6, 0]);
    assert!(ping(&mut con));
}

#[test]
fn repeated_unload_and_load_cycles_keep_counting_from_the_stored_tokens() {
    let server = Server::start_with(MODULE_ARGS);
    let mut con = server.conn();
    for cycle in 0..20_i64 {
        let reply = take(&mut con, "cycled", "100", SLOW, "1");
        assert_eq!(reply[..2], [1, 99 - cycle], "cycle {cycle}");
        assert_eq!(unload(&mut con), Ok("OK".into()), "cycle {cycle}");
        assert_eq!(load(&mut con, &[]), Ok("OK".into()), "cycle {cycle}");
    }
    assert_eq!(peek(&mut con, "cycled", "100", SLOW, "1")[..2], [1, 79]);
    assert_eq!(loaded_modules(&mut con), vec!["tb".to_string()]);
}

#[test]
fn loading_twice_is_refused_and_the_loaded_module_keeps_working() {
    let server = Server::start_with(MODULE_ARGS);
    let mut con = server.conn();
    take(&mut con, "before", "10", SLOW, "1");
    assert_eq!(load(&mut con, &[]), Err(LOAD_FAILED.into()));
    // Redis says "... initialization failed. Module not loaded", Valkey
    // "... initialization failed. Module name is busy."
    assert_log_mentions(&server, "initialization failed.");
    assert!(server.is_alive());
    assert_eq!(loaded_modules(&mut con), vec!["tb".to_string()]);
    assert_eq!(take(&mut con, "before", "10", SLOW, "1")[..2], [1, 8]);
    // The failed attempt must not have disturbed the registered config either.
    assert_eq!(
        config_get(&mut con, "tb.shadow-mode"),
        ["tb.shadow-mode", "no"]
    );
}

#[test]
fn an_unknown_load_argument_is_refused_with_a_log_line() {
    let server = Server::start_without_module(MODULE_ARGS);
    let mut con = server.conn();
    assert_eq!(load(&mut con, &["nonsense"]), Err(LOAD_FAILED.into()));
    assert_log_mentions(
        &server,
        "<tb> tb: not loaded: unknown load argument 'nonsense'",
    );
    assert!(server.is_alive());
    assert!(loaded_modules(&mut con).is_empty());
    let err = expect_error(&mut con, &[b"TB.TAKE", b"k", b"10", b"1", b"1"]);
    assert!(err.starts_with("ERR unknown command"), "{err}");
}

#[test]
fn a_shadow_mode_value_other_than_yes_or_no_is_refused_with_a_log_line() {
    let server = Server::start_without_module(MODULE_ARGS);
    let mut con = server.conn();
    for args in [
        &["shadow-mode", "maybe"][..],
        &["shadow-mode"],
        &["shadow-mode", ""],
    ] {
        assert_eq!(load(&mut con, args), Err(LOAD_FAILED.into()), "{args:?}");
        assert!(loaded_modules(&mut con).is_empty(), "{args:?}");
    }
    assert_log_mentions(
        &server,
        "<tb> tb: not loaded: shadow-mode must be followed by yes or no",
    );
    assert!(server.is_alive());
}

#[test]
fn a_refused_load_leaves_nothing_behind_so_a_good_load_then_works() {
    let server = Server::start_without_module(MODULE_ARGS);
    let mut con = server.conn();
    for bad in [
        &["nonsense"][..],
        &["shadow-mode", "maybe"],
        &["shadow-mode", "yes", "x"],
    ] {
        assert_eq!(load(&mut con, bad), Err(LOAD_FAILED.into()), "{bad:?}");
    }
    // Commands and the config a refused load registered were taken back, so they can be
    // registered again.
    assert_eq!(load(&mut con, &[]), Ok("OK".into()));
    assert_eq!(take(&mut con, "k", "10", SLOW, "1")[..2], [1, 9]);
    assert_eq!(
        config_get(&mut con, "tb.shadow-mode"),
        ["tb.shadow-mode", "no"]
    );
}

#[test]
fn loading_with_shadow_mode_yes_turns_it_on() {
    let server = Server::start_without_module(MODULE_ARGS);
    let mut con = server.conn();
    assert_eq!(load(&mut con, &["shadow-mode", "yes"]), Ok("OK".into()));
    assert_eq!(
        config_get(&mut con, "tb.shadow-mode"),
        ["tb.shadow-mode", "yes"]
    );
    // A denial is reported as allowed, and nothing extra is taken.
    assert_eq!(take(&mut con, "k", "1", SLOW, "1")[..2], [1, 0]);
    let reply = take(&mut con, "k", "1", SLOW, "1");
    assert_eq!(
        reply[0], 1,
        "shadow mode reports a denial as allowed: {reply:?}"
    );
    assert!(reply[2] > 0, "the real wait is still reported: {reply:?}");
}

#[test]
fn unloading_and_loading_with_other_arguments_changes_the_config() {
    let server = Server::start_with(MODULE_ARGS);
    let mut con = server.conn();
    assert_eq!(
        config_get(&mut con, "tb.shadow-mode"),
        ["tb.shadow-mode", "no"]
    );
    assert_eq!(unload(&mut con), Ok("OK".into()));
    assert_eq!(load(&mut con, &["shadow-mode", "yes"]), Ok("OK".into()));
    assert_eq!(
        config_get(&mut con, "tb.shadow-mode"),
        ["tb.shadow-mode", "yes"]
    );
    assert_eq!(unload(&mut con), Ok("OK".into()));
    assert_eq!(load(&mut con, &[]), Ok("OK".into()));
    assert_eq!(
        config_get(&mut con, "tb.shadow-mode"),
        ["tb.shadow-mode", "no"]
    );
}

#[test]
fn a_bad_load_argument_on_the_command_line_stops_the_server_with_a_log_line() {
    let dir = std::env::temp_dir().join(format!("tb-lifecycle-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).expect("create a temp dir");
    let log = dir.join("server.log");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("local addr").port();
    drop(listener);
    let mut child = Command::new(server_binary())
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(&dir)
        .arg("--logfile")
        .arg(&log)
        .args(["--loadmodule", &module(), "nonsense"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run redis-server");
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("redis-server kept running with a bad module argument");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = fs::read_to_string(&log).unwrap_or_default();
    let _ = fs::remove_dir_all(&dir);
    assert!(!status.success(), "exit status {status}");
    assert!(
        text.contains("<tb> tb: not loaded: unknown load argument 'nonsense'"),
        "log:\n{text}"
    );
    assert!(
        text.contains("Module") && text.contains("failed"),
        "log:\n{text}"
    );
}

fn used_memory(con: &mut redis::Connection) -> i64 {
    info_field(con, "memory", "used_memory")
        .expect("used_memory")
        .parse()
        .expect("an integer")
}

/// Bytes of server memory (`used_memory`) one MODULE UNLOAD + MODULE LOAD cycle may leave
/// behind. Redis itself frees a module's commands, command info and configs on unload (a C
/// module with the same commands, info and config leaves 0 bytes per cycle); this module
/// keeps four name strings (`tokens`, `last_refill`, `seq`, `inc`: about 150 bytes; the
/// lock's field names are made by the calls that need them). Before it had its own OnLoad, the
/// redis-module crate's left about 18 KB per load.
const LEAK_PER_CYCLE_LIMIT: i64 = 256;

#[test]
fn unload_and_load_cycles_do_not_leak_server_memory() {
    const CYCLES: i64 = 50;
    let server = Server::start_with(MODULE_ARGS);
    let mut con = server.conn();
    // One cycle first, so one-time allocations on either side are not counted.
    assert_eq!(unload(&mut con), Ok("OK".into()));
    assert_eq!(load(&mut con, &[]), Ok("OK".into()));
    let before = used_memory(&mut con);
    for _ in 0..CYCLES {
        assert_eq!(unload(&mut con), Ok("OK".into()));
        assert_eq!(load(&mut con, &[]), Ok("OK".into()));
    }
    let per_cycle = (used_memory(&mut con) - before) / CYCLES;
    println!("used_memory grew {per_cycle} bytes per unload/load cycle");
    assert!(
        per_cycle < LEAK_PER_CYCLE_LIMIT,
        "each unload/load cycle leaks {per_cycle} bytes"
    );
}

#[test]
fn a_reload_starts_tb_top_empty_and_unloading_frees_its_summary() {
    const CYCLES: i64 = 20;
    let server = Server::start_with(MODULE_ARGS);
    let mut con = server.conn();
    let deny_many = |con: &mut redis::Connection| {
        for key in 0..300 {
            take(con, &format!("denied:{key}"), "1", "0.001", "2");
        }
    };
    deny_many(&mut con);
    let top: Vec<redis::Value> = redis::cmd("TB.TOP").query(&mut con).unwrap();
    assert_eq!(top.len(), 10);
    assert_eq!(unload(&mut con), Ok("OK".into()));
    assert_eq!(load(&mut con, &[]), Ok("OK".into()));
    let top: Vec<redis::Value> = redis::cmd("TB.TOP").query(&mut con).unwrap();
    assert!(top.is_empty(), "TB.TOP after a reload: {top:?}");
    // A summary of 300 keys (about 100 KB) each cycle: none of it may stay.
    let before = used_memory(&mut con);
    for _ in 0..CYCLES {
        deny_many(&mut con);
        assert_eq!(unload(&mut con), Ok("OK".into()));
        assert_eq!(load(&mut con, &[]), Ok("OK".into()));
    }
    let per_cycle = (used_memory(&mut con) - before) / CYCLES;
    println!("used_memory grew {per_cycle} bytes per cycle with a summary");
    assert!(
        per_cycle < LEAK_PER_CYCLE_LIMIT,
        "each cycle with a summary leaks {per_cycle} bytes"
    );
}

#[test]
fn refused_loads_do_not_leak_server_memory() {
    const ATTEMPTS: i64 = 50;
    let server = Server::start_without_module(&[]);
    let mut con = server.conn();
    assert!(load(&mut con, &["nonsense"]).is_err());
    let before = used_memory(&mut con);
    for _ in 0..ATTEMPTS {
        assert!(load(&mut con, &["shadow-mode", "maybe"]).is_err());
    }
    let per_attempt = (used_memory(&mut con) - before) / ATTEMPTS;
    println!("used_memory grew {per_attempt} bytes per refused load");
    assert!(
        per_attempt < LEAK_PER_CYCLE_LIMIT,
        "each refused load leaks {per_attempt} bytes"
    );
}

/// MODULE LIST's `ver` is the crate version as major * 10000 + minor * 100 +
/// patch, so 0.1.0 shows as 100.
#[test]
fn module_list_shows_the_crate_version_encoded() {
    let server = Server::start();
    let mut con = server.conn();
    let expected = encoded_version(env!("CARGO_PKG_VERSION"));
    assert_eq!(
        tb_module_version(&mut con),
        Some(redis::Value::Int(expected))
    );
    assert_eq!(expected, 100, "0.1.0");
}
