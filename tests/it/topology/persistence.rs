//! TB.TAKE and persistence: the AOF (`--appendonly yes --appendfsync always`)
//! and RDB (`DEBUG RELOAD`).
//!
//! TB.TAKE depends on the clock, so the AOF must hold its *effects* (`HSET` of
//! the fields and `PEXPIREAT` of the absolute deadline), never the command:
//! replaying `TB.TAKE` at load time would refill against a later clock. A call
//! that writes nothing (denied, or n = 0) must add nothing to the AOF.

use std::collections::BTreeMap;

use crate::harness::{aof_commands, hgetall_bytes, pexpiretime, take, Server, AOF_ARGS};

/// Fields and absolute deadline of each key.
type Snapshot = Vec<(BTreeMap<Vec<u8>, Vec<u8>>, i64)>;

fn snapshot(con: &mut redis::Connection, keys: &[&str]) -> Snapshot {
    keys.iter()
        .map(|key| (hgetall_bytes(con, key), pexpiretime(con, key)))
        .collect()
}

/// Total size of the incremental AOF files. A PING first: with
/// `appendfsync always` the server writes and fsyncs the AOF before it
/// replies, so once PING is answered every earlier command is on disk.
fn aof_size(server: &Server, con: &mut redis::Connection) -> u64 {
    let _: String = redis::cmd("PING").query(con).expect("PING");
    let dir = server.dir.join("appendonlydir");
    let mut total = 0;
    for entry in std::fs::read_dir(&dir).expect("appendonlydir") {
        let entry = entry.expect("dir entry");
        if entry.file_name().to_string_lossy().ends_with(".incr.aof") {
            total += entry.metadata().expect("metadata").len();
        }
    }
    total
}

/// Buckets with small rates, so their deadlines are far away (>= 100 s) and
/// nothing expires while the server restarts.
fn take_some(con: &mut redis::Connection) -> Vec<&'static str> {
    for (key, capacity, rate, n) in [
        ("tb:a", "10", "0.01", "3"),
        ("tb:a", "10", "0.01", "2"),
        ("tb:b", "2.5", "0.003", "0.7"),
        ("tb:c", "1e3", "0.1", "999.5"),
    ] {
        let reply = take(con, key, capacity, rate, n);
        assert_eq!(reply[0], 1, "take {key} {capacity} {rate} {n}: {reply:?}");
    }
    vec!["tb:a", "tb:b", "tb:c"]
}

#[test]
fn allowed_takes_survive_an_aof_restart_with_identical_fields_and_deadline() {
    let mut server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    let keys = take_some(&mut con);
    let before = snapshot(&mut con, &keys);
    for (key, (fields, deadline)) in keys.iter().zip(&before) {
        assert_eq!(fields.len(), 2, "{key}: {fields:?}");
        assert!(*deadline > 0, "{key} has a deadline");
    }

    server.restart();
    let mut con = server.conn();
    assert_eq!(snapshot(&mut con, &keys), before);
}

#[test]
fn the_aof_holds_hset_and_pexpireat_effects_and_never_tb_take() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    let keys = take_some(&mut con);
    let _: String = redis::cmd("PING").query(&mut con).expect("PING");
    let commands = aof_commands(&server.dir);

    for command in &commands {
        let name = String::from_utf8_lossy(&command[0]);
        assert!(
            !name.eq_ignore_ascii_case("tb.take") && !name.eq_ignore_ascii_case("tb.peek"),
            "module command in the AOF: {command:?}"
        );
    }
    for key in keys {
        // The last HSET and PEXPIREAT of each key carry exactly the bytes the
        // server holds now.
        let fields = hgetall_bytes(&mut con, key);
        let last_hset = commands
            .iter()
            .rev()
            .find(|c| {
                c[0].eq_ignore_ascii_case(b"hset")
                    && c.get(1).map(Vec::as_slice) == Some(key.as_bytes())
            })
            .unwrap_or_else(|| panic!("no HSET {key} in the AOF: {commands:?}"));
        assert_eq!(last_hset.len() % 2, 0, "{last_hset:?}");
        let written: BTreeMap<Vec<u8>, Vec<u8>> = last_hset[2..]
            .chunks(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect();
        assert_eq!(written, fields, "HSET {key} in the AOF");

        let last_pexpireat = commands
            .iter()
            .rev()
            .find(|c| {
                c[0].eq_ignore_ascii_case(b"pexpireat")
                    && c.get(1).map(Vec::as_slice) == Some(key.as_bytes())
            })
            .unwrap_or_else(|| panic!("no PEXPIREAT {key} in the AOF: {commands:?}"));
        assert_eq!(last_pexpireat.len(), 3, "{last_pexpireat:?}");
        assert_eq!(
            String::from_utf8_lossy(&last_pexpireat[2]),
            pexpiretime(&mut con, key).to_string(),
            "PEXPIREAT {key} in the AOF"
        );
    }
}

#[test]
fn denied_takes_do_not_grow_the_aof() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    // One token per 1000 s: after the first take the bucket stays empty.
    assert_eq!(take(&mut con, "tb:denied", "1", "0.001", "1")[0], 1);
    let size = aof_size(&server, &mut con);
    assert!(size > 0, "the allowed take reached the AOF");

    for _ in 0..100 {
        assert_eq!(take(&mut con, "tb:denied", "1", "0.001", "1")[0], 0);
    }
    // n > capacity on a missing key: denied, and no key is created.
    assert_eq!(take(&mut con, "tb:never", "1", "0.001", "2")[0], 0);
    assert_eq!(
        aof_size(&server, &mut con),
        size,
        "denied calls grew the AOF"
    );
}

#[test]
fn takes_of_zero_tokens_do_not_grow_the_aof() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    // One token per 1000 s: the bucket cannot expire (which appends a DEL) during the loop.
    assert_eq!(take(&mut con, "tb:zero", "10", "0.001", "4")[0], 1);
    let size = aof_size(&server, &mut con);

    for _ in 0..100 {
        assert_eq!(take(&mut con, "tb:zero", "10", "0.001", "0")[0], 1);
        assert_eq!(take(&mut con, "tb:zero-missing", "10", "1", "0")[0], 1);
    }
    assert_eq!(aof_size(&server, &mut con), size, "n = 0 grew the AOF");
}

#[test]
fn debug_reload_keeps_fields_and_deadline() {
    let server = Server::start();
    let mut con = server.conn();
    let keys = take_some(&mut con);
    let before = snapshot(&mut con, &keys);

    let _: () = redis::cmd("DEBUG")
        .arg("RELOAD")
        .query(&mut con)
        .expect("DEBUG RELOAD");
    assert_eq!(snapshot(&mut con, &keys), before);
}
