//! Buckets outliving the process that wrote them: a replica promoted with `REPLICAOF NO
//! ONE`, RDB (`DEBUG RELOAD`, shutdown with save points, restart), AOF rewrite
//! (`BGREWRITEAOF`, restart), deadlines that pass while the server is down, and a replica
//! that does not load the module at all.
//!
//! The module stores a bucket as a plain hash `{tokens, last_refill}` with an absolute
//! deadline, and replicates/persists only those effects. So whatever server ends up holding
//! the data must hold the same bytes and the same PEXPIRETIME, and a take on it continues
//! from the same tokens. Buckets refill at 1 token per 1000 s, so the seconds a test takes
//! never change `remaining` and the numbers asserted are exact.
//!
//! Every wait is bounded (`SYNC_TIMEOUT`, `WAIT_TIMEOUT`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::harness::{
    aof_commands, error_text, exists, hgetall_bytes, info_field, module_path, peek, pexpiretime,
    promote, take, wait_for_replica, wait_until, Server, QUIET_MASTER_ARGS, SYNC_TIMEOUT,
};

/// Upper bound for a background rewrite or save.
const WAIT_TIMEOUT: Duration = Duration::from_secs(20);

/// A slow bucket: 10 tokens, 1 token back per 1000 s.
const CAPACITY: &str = "10";
const RATE: &str = "0.001";

/// Buckets at different fill levels, one of them fractional; returns their keys.
fn fill(con: &mut redis::Connection) -> Vec<&'static str> {
    let buckets = [
        ("tb:a", "1"),
        ("tb:b", "2.5"),
        ("tb:c", "7"),
        ("tb:d", "9.75"),
    ];
    for (key, n) in buckets {
        let reply = take(con, key, CAPACITY, RATE, n);
        assert_eq!(reply[0], 1, "take {key} {n}: {reply:?}");
    }
    buckets.iter().map(|(key, _)| *key).collect()
}

/// What a take of 1 token answers (allowed, remaining) on each `fill` bucket afterwards:
/// 9 -> 8, 7.5 -> 6, 3 -> 2, and 0.25 is not enough.
const AFTER_FILL: [[i64; 2]; 4] = [[1, 8], [1, 6], [1, 2], [0, 0]];

/// Each key's fields byte for byte and its absolute deadline (PEXPIRETIME).
type Snapshot = Vec<(BTreeMap<Vec<u8>, Vec<u8>>, i64)>;

fn snapshot(con: &mut redis::Connection, keys: &[&str]) -> Snapshot {
    keys.iter()
        .map(|key| (hgetall_bytes(con, key), pexpiretime(con, key)))
        .collect()
}

/// A snapshot of real buckets: two fields each and a deadline.
fn bucket_snapshot(con: &mut redis::Connection, keys: &[&str]) -> Snapshot {
    let snap = snapshot(con, keys);
    for (key, (fields, deadline)) in keys.iter().zip(&snap) {
        assert_eq!(fields.len(), 2, "{key}: {fields:?}");
        assert!(*deadline > 0, "{key} has no deadline");
    }
    snap
}

/// Takes 1 token from each `fill` bucket and checks it continues from the stored tokens.
fn assert_continues(con: &mut redis::Connection, keys: &[&str]) {
    for (key, expected) in keys.iter().zip(AFTER_FILL) {
        let reply = take(con, key, CAPACITY, RATE, "1");
        assert_eq!(reply[..2], expected, "{key}: {reply:?}");
    }
}

fn ok(con: &mut redis::Connection, cmd: &redis::Cmd) {
    let text = String::from_utf8_lossy(&cmd.get_packed_command()).replace("\r\n", " ");
    let reply: String = cmd.query(con).unwrap_or_else(|e| panic!("{text}: {e}"));
    assert_eq!(reply, "OK", "{text}");
}

fn role(con: &mut redis::Connection) -> String {
    info_field(con, "replication", "role").expect("role in INFO replication")
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as i64
}

/// Makes `replica` a replica of `master` and waits until it has caught up.
fn attach(master: &Server, replica: &Server) {
    let mut con = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query(&mut con)
        .expect("REPLICAOF");
    wait_until("master_link_status:up on the replica", SYNC_TIMEOUT, || {
        info_field(&mut con, "replication", "master_link_status").as_deref() == Some("up")
    });
    wait_for_replica(master, replica);
}

// --- replica failover outside cluster ---------------------------------------------------

#[test]
fn a_replica_promoted_with_replicaof_no_one_continues_from_the_replicated_tokens() {
    let mut master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = Server::start();
    let mut mcon = master.conn();
    // Some buckets reach the replica in the initial sync (RDB), the rest as a stream.
    let keys = fill(&mut mcon);
    attach(&master, &replica);
    let more = take(&mut mcon, "tb:streamed", CAPACITY, RATE, "4");
    assert_eq!(more[..2], [1, 6]);
    wait_for_replica(&master, &replica);
    let mut all = keys.clone();
    all.push("tb:streamed");
    let before = bucket_snapshot(&mut mcon, &all);

    let mut rcon = replica.conn();
    assert_eq!(
        snapshot(&mut rcon, &all),
        before,
        "the replica before failover"
    );
    // The replica answers TB.PEEK (read-only) and refuses TB.TAKE (a write).
    assert_eq!(peek(&mut rcon, "tb:a", CAPACITY, RATE, "1")[..2], [1, 8]);
    let refused = redis::cmd("TB.TAKE")
        .arg("tb:a")
        .arg(CAPACITY)
        .arg(RATE)
        .arg("1")
        .query::<Vec<i64>>(&mut rcon)
        .expect_err("TB.TAKE on a read-only replica");
    assert_eq!(refused.code(), Some("READONLY"), "{}", error_text(&refused));

    // The master goes away; the replica takes over.
    master.stop();
    promote(&mut rcon);
    assert_eq!(role(&mut rcon), "master");
    assert_eq!(
        snapshot(&mut rcon, &all),
        before,
        "fields and PEXPIRETIME on the promoted replica"
    );
    assert_continues(&mut rcon, &keys);
    assert_eq!(
        take(&mut rcon, "tb:streamed", CAPACITY, RATE, "1")[..2],
        [1, 5]
    );
}

// --- RDB ----------------------------------------------------------------------------------

#[test]
fn rdb_reload_and_a_restart_with_save_points_keep_fields_and_deadlines() {
    // Save points on, as in a typical production config.
    let mut server = Server::start_with(&["--save", "3600 1"]);
    let mut con = server.conn();
    let keys = fill(&mut con);
    let before = bucket_snapshot(&mut con, &keys);

    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut con)
        .expect("DEBUG RELOAD");
    assert_eq!(snapshot(&mut con, &keys), before, "after DEBUG RELOAD");

    // A plain SHUTDOWN saves because save points are configured; the restart loads the RDB.
    let _ = redis::cmd("SHUTDOWN").query::<redis::Value>(&mut con);
    assert!(
        server.dir.join("dump.rdb").is_file(),
        "SHUTDOWN wrote dump.rdb"
    );
    server.restart();
    let mut con = server.conn();
    assert_eq!(
        snapshot(&mut con, &keys),
        before,
        "after SHUTDOWN and restart"
    );
    assert_continues(&mut con, &keys);
}

// --- AOF rewrite ----------------------------------------------------------------------------

/// Runs BGREWRITEAOF and waits until it has finished successfully.
fn rewrite_aof(con: &mut redis::Connection) {
    wait_until("BGREWRITEAOF to be accepted", WAIT_TIMEOUT, || {
        // Refused while another rewrite (e.g. the one at startup) is running.
        redis::cmd("BGREWRITEAOF").query::<String>(con).is_ok()
    });
    wait_until("the AOF rewrite to finish", WAIT_TIMEOUT, || {
        info_field(con, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(con, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
    });
    assert_eq!(
        info_field(con, "persistence", "aof_last_bgrewrite_status").as_deref(),
        Some("ok")
    );
}

/// AOF rewrite, then restart, with the base file as commands (`aof-use-rdb-preamble no`)
/// or as an RDB (`yes`, the default).
fn aof_rewrite_and_restart_keep_fields_and_deadlines(rdb_preamble: &str) {
    let mut server = Server::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--aof-use-rdb-preamble",
        rdb_preamble,
    ]);
    let mut con = server.conn();
    let keys = fill(&mut con);
    let before = bucket_snapshot(&mut con, &keys);

    rewrite_aof(&mut con);
    // The buckets now live in the new base file only: the incremental files are fresh.
    let _: String = redis::cmd("PING").query(&mut con).expect("PING");
    let incr = aof_commands(&server.dir);
    assert!(
        !incr
            .iter()
            .any(|c| c.get(1).is_some_and(|k| k.starts_with(b"tb:"))),
        "bucket commands left in the incremental AOF after the rewrite: {incr:?}"
    );
    if rdb_preamble == "no" {
        // The rewritten base holds absolute deadlines (PEXPIREAT), never relative ones.
        let base = aof_base_text(&server);
        for (key, (_, deadline)) in keys.iter().zip(&before) {
            let expected = format!("PEXPIREAT\r\n${}\r\n{key}\r\n", key.len());
            let at = base
                .find(&expected)
                .unwrap_or_else(|| panic!("no PEXPIREAT {key} in the base AOF:\n{base}"));
            let rest = &base[at + expected.len()..];
            let value = rest.lines().nth(1).expect("PEXPIREAT value");
            assert_eq!(
                value,
                deadline.to_string(),
                "PEXPIREAT {key} in the base AOF"
            );
        }
    }

    server.restart();
    let mut con = server.conn();
    assert_eq!(snapshot(&mut con, &keys), before, "after the restart");
    assert_continues(&mut con, &keys);
}

/// The base file of the AOF (`appendonlydir/*.base.aof`), as text.
fn aof_base_text(server: &Server) -> String {
    let dir = server.dir.join("appendonlydir");
    let base = std::fs::read_dir(&dir)
        .expect("appendonlydir")
        .map(|e| e.expect("entry").path())
        .find(|p| p.to_string_lossy().ends_with(".base.aof"))
        .unwrap_or_else(|| panic!("no .base.aof in {}", dir.display()));
    String::from_utf8_lossy(&std::fs::read(&base).expect("read base AOF")).into_owned()
}

#[test]
fn an_aof_rewrite_as_commands_then_restart_keeps_fields_and_deadlines() {
    aof_rewrite_and_restart_keep_fields_and_deadlines("no");
}

#[test]
fn an_aof_rewrite_with_rdb_preamble_then_restart_keeps_fields_and_deadlines() {
    aof_rewrite_and_restart_keep_fields_and_deadlines("yes");
}

// --- deadlines passing while the server is down ---------------------------------------------

/// A bucket that refills completely in 2 s, and slow ones as a control. The server is
/// stopped, the fast bucket's deadline passes, the server comes back.
fn expired_while_down(persistence: &[&str], persist: impl Fn(&mut redis::Connection)) {
    let mut server = Server::start_with(persistence);
    let mut con = server.conn();
    let keys = fill(&mut con);
    let before = bucket_snapshot(&mut con, &keys);
    // Taken last, just before it is persisted: its 2 s only need to outlast the command or
    // two in between, also on a slow machine (the test then waits them out once).
    assert_eq!(take(&mut con, "tb:fast", "1", "0.5", "1")[..2], [1, 0]);
    let deadline = pexpiretime(&mut con, "tb:fast");
    assert!(deadline > 0);
    persist(&mut con);

    server.stop();
    // Same machine, same clock: wait until the deadline is well in the past.
    let wait = deadline + 200 - now_ms();
    if wait > 0 {
        std::thread::sleep(Duration::from_millis(wait as u64));
    }
    server.restart();
    let mut con = server.conn();

    // The expired bucket is gone, so it is full again: not the empty state it was saved in.
    assert!(!exists(&mut con, "tb:fast"), "the expired bucket came back");
    assert_eq!(pexpiretime(&mut con, "tb:fast"), -2);
    assert_eq!(
        peek(&mut con, "tb:fast", "1", "0.5", "1"),
        vec![1, 0, 0, 2000]
    );
    assert_eq!(take(&mut con, "tb:fast", "1", "0.5", "1")[..2], [1, 0]);
    // The others are intact.
    assert_eq!(snapshot(&mut con, &keys), before);
}

#[test]
fn a_bucket_whose_deadline_passed_while_down_comes_back_full_after_rdb_load() {
    expired_while_down(&[], |con| {
        let reply: String = redis::cmd("SAVE").query(con).expect("SAVE");
        assert_eq!(reply, "OK");
    });
}

#[test]
fn a_bucket_whose_deadline_passed_while_down_comes_back_full_after_aof_load() {
    expired_while_down(
        &["--appendonly", "yes", "--appendfsync", "always"],
        // appendfsync always: everything answered is already on disk.
        |_| {},
    );
}

// --- a replica without the module -------------------------------------------------------------

#[test]
fn a_replica_without_the_module_holds_the_buckets_byte_identical() {
    let mut master = Server::start_with(QUIET_MASTER_ARGS);
    let mut mcon = master.conn();
    // Before the replica attaches (full sync, RDB) ...
    let keys = fill(&mut mcon);
    let replica = Server::start_without_module(&["--enable-module-command", "yes"]);
    let mut rcon = replica.conn();
    let info: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("TB.TAKE")
        .query(&mut rcon)
        .expect("COMMAND INFO");
    assert_eq!(
        info,
        redis::Value::Array(vec![redis::Value::Nil]),
        "TB.TAKE does not exist on the replica"
    );
    attach(&master, &replica);
    // ... and after (the replication stream: HSET + PEXPIREAT, which need no module).
    assert_eq!(
        take(&mut mcon, "tb:streamed", CAPACITY, RATE, "4")[..2],
        [1, 6]
    );
    wait_for_replica(&master, &replica);
    let mut all = keys.clone();
    all.push("tb:streamed");
    let before = bucket_snapshot(&mut mcon, &all);
    assert_eq!(
        snapshot(&mut rcon, &all),
        before,
        "on the module-less replica"
    );
    let types: Vec<String> = all
        .iter()
        .map(|k| redis::cmd("TYPE").arg(*k).query(&mut rcon).expect("TYPE"))
        .collect();
    assert!(types.iter().all(|t| t == "hash"), "{types:?}");

    // The module's commands do not exist there; the data does not need them.
    let unknown = redis::cmd("TB.PEEK")
        .arg("tb:a")
        .arg(CAPACITY)
        .arg(RATE)
        .query::<redis::Value>(&mut rcon)
        .expect_err("TB.PEEK without the module");
    assert!(
        error_text(&unknown).starts_with("ERR unknown command"),
        "{}",
        error_text(&unknown)
    );

    // Promote it and load the module at runtime: the buckets continue where they were.
    master.stop();
    promote(&mut rcon);
    ok(
        &mut rcon,
        redis::cmd("MODULE")
            .arg("LOAD")
            .arg(module_path().display().to_string()),
    );
    assert_eq!(snapshot(&mut rcon, &all), before);
    assert_continues(&mut rcon, &keys);
}
