//! `cell-compat yes` (redis-cell's `CL.THROTTLE` as a second name of TB.THROTTLE) and
//! redis-cell's keys read by TB.THROTTLE: a string holding a TAT (Unix ns) is the bucket it
//! stands for, converted to the module's hash by the first call that writes.
//!
//! Most tests write the TAT themselves (`SET key <ns>`), as redis-cell does; those that need
//! redis-cell itself load it beside the module (tests/it/harness/cell.rs: skipped with a loud
//! message when it cannot be built, a failure under `CI=true`).

use crate::harness::*;

const LOAD_FAILED: &str = "ERR Error loading the extension. Please check the server logs.";
const CONFLICT: &str = "<tb> tb: not loaded: cell-compat: CL.THROTTLE is already registered by another module (redis-cell?); load redis-tb without cell-compat or unload it";
/// 10 tokens (max_burst 9), one per 100 s: nothing refills noticeably during a test.
const SLOW: [i64; 3] = [9, 1, 100];

fn with_quantity(limit: [i64; 3], quantity: i64) -> [i64; 4] {
    [limit[0], limit[1], limit[2], quantity]
}

fn key_type(con: &mut redis::Connection, key: &str) -> String {
    redis::cmd("TYPE").arg(key).query(con).expect("TYPE")
}

fn set(con: &mut redis::Connection, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query(con)
        .expect("SET");
}

/// A TAT `ahead_ms` after the server's clock, in ns, as redis-cell stores it.
fn tat_ahead(con: &mut redis::Connection, ahead_ms: i64) -> String {
    ((server_time_ms(con) + ahead_ms) * 1_000_000).to_string()
}

#[test]
fn with_cell_compat_cl_throttle_is_tb_throttle() {
    let server = Server::start_with_module(module_path(), &["cell-compat", "yes"], &[]);
    let mut con = server.conn();
    assert_eq!(
        config_get(&mut con, "tb.cell-compat"),
        ["tb.cell-compat", "yes"]
    );
    let first = throttle(&mut con, "CL.THROTTLE", "k", &SLOW).expect("CL.THROTTLE");
    assert_eq!(first[..4], [0, 10, 9, -1]);
    // One bucket under two names: the module's hash.
    assert_eq!(key_type(&mut con, "k"), "hash");
    let second = throttle(&mut con, "TB.THROTTLE", "k", &SLOW).expect("TB.THROTTLE");
    assert_eq!(second[..4], [0, 10, 8, -1]);
    let third = throttle(&mut con, "CL.THROTTLE", "k", &with_quantity(SLOW, 9)).expect("CL");
    assert_eq!(third[..3], [1, 10, 8]);
    // The same command info as TB.THROTTLE, under the other name.
    let info: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("CL.THROTTLE")
        .query(&mut con)
        .expect("COMMAND INFO");
    let text = format!("{info:?}");
    assert!(text.contains("cl.throttle"), "{text}");
    let err = expect_error(&mut con, &[b"CL.THROTTLE", b"k", b"1", b"1"]);
    assert!(err.contains("wrong number of arguments"), "{err}");
    // Load-time only.
    let refused: redis::RedisResult<()> = redis::cmd("CONFIG")
        .arg("SET")
        .arg("tb.cell-compat")
        .arg("no")
        .query(&mut con);
    assert!(refused.is_err(), "tb.cell-compat is immutable");
}

#[test]
fn the_config_turns_cell_compat_on_too() {
    let server = Server::start_with(&["--tb.cell-compat", "yes"]);
    let mut con = server.conn();
    assert_eq!(
        config_get(&mut con, "tb.cell-compat"),
        ["tb.cell-compat", "yes"]
    );
    let reply = throttle(&mut con, "CL.THROTTLE", "k", &SLOW).expect("CL.THROTTLE");
    assert_eq!(reply[..3], [0, 10, 9]);
}

#[test]
fn without_cell_compat_there_is_no_cl_throttle() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(
        config_get(&mut con, "tb.cell-compat"),
        ["tb.cell-compat", "no"]
    );
    let err = expect_error(&mut con, &[b"CL.THROTTLE", b"k", b"9", b"1", b"100"]);
    assert!(err.starts_with("ERR unknown command"), "{err}");
    assert!(!exists(&mut con, "k"));
}

#[test]
fn cell_compat_yes_or_no_and_nothing_else() {
    let server = Server::start_without_module(&["--enable-module-command", "yes"]);
    let mut con = server.conn();
    let path = module_path().display().to_string();
    for bad in [&["cell-compat", "maybe"][..], &["cell-compat"]] {
        let mut cmd = redis::cmd("MODULE");
        cmd.arg("LOAD").arg(&path).arg(bad);
        let result: redis::RedisResult<String> = cmd.query(&mut con);
        assert_eq!(result.map_err(|e| error_text(&e)), Err(LOAD_FAILED.into()));
    }
    assert!(server
        .log()
        .contains("<tb> tb: not loaded: cell-compat must be followed by yes or no"));
    let ok: String = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(&path)
        .arg("cell-compat")
        .arg("no")
        .query(&mut con)
        .expect("MODULE LOAD cell-compat no");
    assert_eq!(ok, "OK");
    let err = expect_error(&mut con, &[b"CL.THROTTLE", b"k", b"9", b"1", b"100"]);
    assert!(err.starts_with("ERR unknown command"), "{err}");
}

/// docs/redis-cell.md suggests `MODULE LOADEX ... CONFIG tb.cell-compat yes`. A server with
/// the default `enable-module-command` refuses it, and the page says so where it suggests it;
/// one started with `enable-module-command yes` loads the module with CL.THROTTLE.
#[test]
fn module_loadex_with_cell_compat_needs_enable_module_command_as_the_docs_say() {
    let page = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/redis-cell.md");
    let page = std::fs::read_to_string(&page).expect("docs/redis-cell.md");
    let suggestion = page
        .split("\n\n")
        .find(|paragraph| paragraph.contains("MODULE LOADEX"))
        .expect("the page suggests MODULE LOADEX");
    assert!(
        suggestion.contains("enable-module-command"),
        "where the page suggests MODULE LOADEX it does not say it needs enable-module-command:\n{suggestion}"
    );
    let path = module_path().display().to_string();
    let loadex = |con: &mut redis::Connection| -> Result<String, String> {
        redis::cmd("MODULE")
            .arg("LOADEX")
            .arg(&path)
            .arg("CONFIG")
            .arg("tb.cell-compat")
            .arg("yes")
            .query(con)
            .map_err(|e| error_text(&e))
    };
    let default = Server::start_without_module(&[]);
    let refused = loadex(&mut default.conn()).expect_err("a default server refuses MODULE");
    assert!(
        refused.starts_with("ERR MODULE command not allowed"),
        "{refused}"
    );
    let allowing = Server::start_without_module(&["--enable-module-command", "yes"]);
    let mut con = allowing.conn();
    assert_eq!(loadex(&mut con), Ok("OK".to_owned()));
    throttle(&mut con, "CL.THROTTLE", "c", &SLOW).expect("CL.THROTTLE after MODULE LOADEX");
    assert_eq!(
        config_get(&mut con, "tb.cell-compat"),
        ["tb.cell-compat", "yes"]
    );
}

#[test]
fn cell_compat_after_redis_cell_fails_the_load_and_names_the_conflict() {
    let Some(cell) = redis_cell_module() else {
        return;
    };
    let cell = cell.display().to_string();
    let server =
        Server::start_without_module(&["--loadmodule", &cell, "--enable-module-command", "yes"]);
    let mut con = server.conn();
    let path = module_path().display().to_string();
    let refused: redis::RedisResult<String> = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(&path)
        .arg("cell-compat")
        .arg("yes")
        .query(&mut con);
    assert_eq!(refused.map_err(|e| error_text(&e)), Err(LOAD_FAILED.into()));
    let log = server.log();
    assert!(
        log.contains(CONFLICT),
        "server log lacks the conflict:\n{log}"
    );
    // Nothing of the failed load is left: no TB.* command; CL.THROTTLE is still redis-cell's
    // (it stores a string).
    let err = expect_error(&mut con, &[b"TB.TAKE", b"k", b"10", b"1", b"1"]);
    assert!(err.starts_with("ERR unknown command"), "{err}");
    throttle(&mut con, "CL.THROTTLE", "c", &SLOW).expect("redis-cell's CL.THROTTLE");
    assert_eq!(key_type(&mut con, "c"), "string");
    // Without cell-compat the two live side by side.
    let ok: String = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(&path)
        .query(&mut con)
        .expect("MODULE LOAD without cell-compat");
    assert_eq!(ok, "OK");
    let reply = throttle(&mut con, "TB.THROTTLE", "t", &SLOW).expect("TB.THROTTLE");
    assert_eq!(reply[..3], [0, 10, 9]);
}

#[test]
fn redis_cell_loaded_after_cell_compat_does_not_get_the_name() {
    let Some(cell) = redis_cell_module() else {
        return;
    };
    let server = Server::start_with_module(
        module_path(),
        &["cell-compat", "yes"],
        &["--enable-module-command", "yes"],
    );
    let mut con = server.conn();
    // redis-cell 0.2.2 ignores the server's refusal of the name and reports success.
    let _: redis::RedisResult<String> = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(cell.display().to_string())
        .query(&mut con);
    throttle(&mut con, "CL.THROTTLE", "k", &SLOW).expect("CL.THROTTLE");
    assert_eq!(
        key_type(&mut con, "k"),
        "hash",
        "CL.THROTTLE is still redis-tb's"
    );
}

#[test]
fn a_cell_key_is_read_as_its_bucket_and_converted_by_the_first_write() {
    let server = Server::start();
    let mut con = server.conn();
    // 3 tokens used (300 s of TAT ahead at one token per 100 s): 7 of 10 left.
    let tat = tat_ahead(&mut con, 300_000);
    set(&mut con, "k", &tat);
    let reply = throttle(&mut con, "TB.THROTTLE", "k", &SLOW).expect("TB.THROTTLE");
    assert_eq!(reply[..4], [0, 10, 6, -1]);
    assert_within("reset_after", reply[4], 399, 400);
    assert_eq!(key_type(&mut con, "k"), "hash");
    let fields = hgetall(&mut con, "k");
    let tokens: f64 = fields["tokens"].parse().expect("tokens");
    assert!((tokens - 6.0).abs() < 0.01, "{fields:?}");
    assert_within("PTTL", pttl(&mut con, "k"), 399_000 - 100, 400_000 + 100);
    // From now on the key is an ordinary bucket.
    let next = throttle(&mut con, "TB.THROTTLE", "k", &SLOW).expect("TB.THROTTLE");
    assert_eq!(next[..3], [0, 10, 5]);
    assert_eq!(take(&mut con, "k", "10", "0.01", "1")[..2], [1, 4]);
}

#[test]
fn a_tat_in_the_past_is_a_full_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    for (key, tat) in [("old", "1".to_string()), ("minus", "-1".to_string())] {
        set(&mut con, key, &tat);
        let reply = throttle(&mut con, "TB.THROTTLE", key, &SLOW).expect("TB.THROTTLE");
        assert_eq!(reply[..4], [0, 10, 9, -1], "{key}");
    }
    let now = tat_ahead(&mut con, -1);
    set(&mut con, "now", &now);
    let reply = throttle(&mut con, "TB.THROTTLE", "now", &SLOW).expect("TB.THROTTLE");
    assert_eq!(reply[..3], [0, 10, 9]);
}

#[test]
fn a_denial_leaves_the_cell_key_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    // All 10 tokens used, for another 1000 s.
    let tat = tat_ahead(&mut con, 1_000_000);
    set(&mut con, "k", &tat);
    let _: () = redis::cmd("PEXPIRE")
        .arg("k")
        .arg(1_000_000)
        .query(&mut con)
        .expect("PEXPIRE");
    let before = snapshot(&mut con, b"k");
    let reply = throttle(&mut con, "TB.THROTTLE", "k", &SLOW).expect("TB.THROTTLE");
    assert_eq!(reply[..3], [1, 10, 0]);
    assert_within("retry_after", reply[3], 99, 100);
    assert_eq!(snapshot(&mut con, b"k"), before);
    // A quantity that can never fit is denied the same way (retry_after -1).
    let never = throttle(&mut con, "TB.THROTTLE", "k", &with_quantity(SLOW, 11)).expect("TB");
    assert_eq!(never[..4], [1, 10, 0, -1]);
    assert_eq!(snapshot(&mut con, b"k"), before);
}

#[test]
fn a_string_that_is_not_a_tat_is_wrongtype_and_other_commands_never_read_strings() {
    let server = Server::start();
    let mut con = server.conn();
    for value in ["hello", "1.5", "", " 12", "99999999999999999999"] {
        set(&mut con, "s", value);
        let err = expect_error(&mut con, &[b"TB.THROTTLE", b"s", b"9", b"1", b"100"]);
        assert!(err.starts_with("WRONGTYPE"), "{value:?}: {err}");
        assert_eq!(key_type(&mut con, "s"), "string");
    }
    let tat = tat_ahead(&mut con, 0);
    set(&mut con, "cell", &tat);
    let before = snapshot(&mut con, b"cell");
    for args in [
        &[&b"TB.TAKE"[..], b"cell", b"10", b"1", b"1"][..],
        &[b"TB.PEEK", b"cell", b"10", b"1"],
        &[b"TB.REFUND", b"cell", b"10", b"1", b"1"],
        &[b"TB.CHARGE", b"cell", b"10", b"1", b"1"],
        &[b"TB.TAKEALL", b"cell", b"10", b"1", b"1"],
    ] {
        let err = expect_error(&mut con, args);
        assert!(err.starts_with("WRONGTYPE"), "{}: {err}", show_args(args));
    }
    assert_eq!(snapshot(&mut con, b"cell"), before);
    let _: i64 = redis::cmd("RPUSH")
        .arg("list")
        .arg("x")
        .query(&mut con)
        .expect("RPUSH");
    let err = expect_error(&mut con, &[b"TB.THROTTLE", b"list", b"9", b"1", b"100"]);
    assert!(err.starts_with("WRONGTYPE"), "{err}");
}

#[test]
fn a_conversion_reaches_replicas_and_the_aof_as_del_hset_pexpireat() {
    let mut master_args = QUIET_MASTER_ARGS.to_vec();
    master_args.extend_from_slice(AOF_ARGS);
    let master = Server::start_with(&master_args);
    let replica = start_replica_of(&master);
    let mut con = master.conn();
    let tat = tat_ahead(&mut con, 250_000);
    set(&mut con, "k", &tat);
    let reply = throttle(&mut con, "TB.THROTTLE", "k", &SLOW).expect("TB.THROTTLE");
    assert_eq!(reply[..3], [0, 10, 6]);
    assert_replica_holds_the_same_buckets(&master, &replica, &["k"]);
    let logged = aof_without_select(&master, &mut con);
    let [hset, pexpireat] = bucket_write(&mut con, "k");
    let effects: Vec<_> = logged
        .iter()
        .filter(|argv| {
            !argv[0].eq_ignore_ascii_case(b"MULTI") && !argv[0].eq_ignore_ascii_case(b"EXEC")
        })
        .cloned()
        .collect();
    let n = effects.len();
    assert!(n >= 3, "{effects:?}");
    assert_eq!(effects[n - 3..], [argv(&["DEL", "k"]), hset, pexpireat]);
    assert_no_tb_command(&logged);
    // After a restart from the AOF the bucket is the same.
    let mut master = master;
    let before = bucket(&mut con, "k");
    drop(con);
    master.restart();
    assert_eq!(bucket(&mut master.conn(), "k"), before);
}

#[test]
fn a_key_written_by_redis_cell_itself_is_converted() {
    let Some(cell) = redis_cell_module() else {
        return;
    };
    let cell = cell.display().to_string();
    let server = Server::start_with(&["--loadmodule", &cell]);
    let mut con = server.conn();
    for _ in 0..4 {
        throttle(&mut con, "CL.THROTTLE", "k", &SLOW).expect("CL.THROTTLE");
    }
    assert_eq!(key_type(&mut con, "k"), "string");
    let reply = throttle(&mut con, "TB.THROTTLE", "k", &SLOW).expect("TB.THROTTLE");
    assert_eq!(reply[..4], [0, 10, 5, -1]);
    assert_eq!(key_type(&mut con, "k"), "hash");
}

/// With the fault build (`fault hash-set|expire 1`: every bucket write refused), a
/// conversion that cannot store the hash puts redis-cell's string back as it was (value and
/// expiry), replies an error, and propagates nothing: the replica still holds the string.
#[test]
fn a_conversion_that_cannot_store_the_hash_puts_the_string_back() {
    for step in ["hash-set", "expire"] {
        let master = Server::start_with_module(
            fault_module_path(),
            &["fault", step, "1"],
            QUIET_MASTER_ARGS,
        );
        let replica = start_replica_of(&master);
        let mut con = master.conn();
        let tat = tat_ahead(&mut con, 300_000);
        set(&mut con, "k", &tat);
        let _: () = redis::cmd("PEXPIRE")
            .arg("k")
            .arg(500_000)
            .query(&mut con)
            .expect("PEXPIRE");
        wait_for_replica(&master, &replica);
        let before = snapshot(&mut con, b"k");
        let offset = repl_offset(&mut con);
        let err = throttle(&mut con, "TB.THROTTLE", "k", &SLOW).expect_err("a refused write");
        assert!(!error_text(&err).is_empty(), "{step}");
        assert_eq!(
            snapshot(&mut con, b"k"),
            before,
            "{step}: the string is back"
        );
        assert_eq!(repl_offset(&mut con), offset, "{step}: nothing propagated");
        wait_for_replica(&master, &replica);
        assert_eq!(
            snapshot(&mut replica.conn(), b"k"),
            before,
            "{step}: the replica"
        );
        // A denial on the same key still reads it.
        let denied = throttle(&mut con, "TB.THROTTLE", "k", &with_quantity(SLOW, 10)).expect("TB");
        assert_eq!(denied[..3], [1, 10, 7], "{step}");
    }
}
