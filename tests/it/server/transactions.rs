//! TB.TAKE with WATCH, MULTI/EXEC and EVAL.
//!
//! A write must signal WATCH (so optimistic transactions over a bucket stay
//! correct); a call that writes nothing must not (a denied request would
//! otherwise abort other clients' transactions for no reason). Inside MULTI
//! and Lua the command behaves as on its own, and from Lua its effects are
//! persisted as HSET/PEXPIREAT like any other TB.TAKE.

use crate::harness;
use crate::harness::{
    aof_commands, hgetall_bytes, pexpiretime, take, watch, watched_transaction_runs, Server,
    AOF_ARGS,
};

#[test]
fn an_allowed_take_from_another_client_aborts_a_watching_transaction() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut other = server.conn();
    assert_eq!(take(&mut other, "tb:w", "10", "1", "1")[0], 1);

    watch(&mut watcher, "tb:w");
    assert_eq!(take(&mut other, "tb:w", "10", "1", "1")[0], 1);
    assert!(!watched_transaction_runs(&mut watcher), "EXEC not aborted");
}

#[test]
fn an_allowed_take_creating_the_bucket_aborts_a_watching_transaction() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut other = server.conn();

    watch(&mut watcher, "tb:new");
    assert_eq!(take(&mut other, "tb:new", "10", "1", "1")[0], 1);
    assert!(!watched_transaction_runs(&mut watcher), "EXEC not aborted");
}

#[test]
fn a_denied_take_from_another_client_does_not_abort_a_watching_transaction() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut other = server.conn();
    // Empty bucket, one token per 1000 s.
    assert_eq!(take(&mut other, "tb:w", "1", "0.001", "1")[0], 1);

    watch(&mut watcher, "tb:w");
    assert_eq!(take(&mut other, "tb:w", "1", "0.001", "1")[0], 0);
    assert!(
        watched_transaction_runs(&mut watcher),
        "EXEC should have run the transaction"
    );
}

#[test]
fn a_take_of_zero_tokens_from_another_client_does_not_abort_a_watching_transaction() {
    let server = Server::start();
    let mut watcher = server.conn();
    let mut other = server.conn();
    // One token per 1000 s: the bucket cannot expire (which would also abort the EXEC)
    // while the test runs.
    assert_eq!(take(&mut other, "tb:w", "10", "0.001", "4")[0], 1);

    watch(&mut watcher, "tb:w");
    assert_eq!(take(&mut other, "tb:w", "10", "0.001", "0")[0], 1);
    assert!(
        watched_transaction_runs(&mut watcher),
        "EXEC should have run the transaction"
    );
}

#[test]
fn takes_inside_multi_exec_return_their_array_replies() {
    let server = Server::start();
    let mut con = server.conn();
    let mut tx = redis::pipe();
    tx.atomic();
    for n in ["2", "3", "6"] {
        tx.cmd("TB.TAKE").arg("tb:tx").arg("5").arg("0.001").arg(n);
    }
    let replies: Vec<Vec<i64>> = tx.query(&mut con).expect("MULTI/EXEC");

    assert_eq!(replies.len(), 3, "{replies:?}");
    // 5 tokens, 1 per 1000 s: take 2 (3 left), take 3 (0 left), take 6 > 5.
    // Wait times are 1000 s per token, less the few ms between the calls.
    let (allowed, remaining, retry_after_ms, reset_after_ms): (Vec<_>, Vec<_>, Vec<_>, Vec<_>) = (
        replies.iter().map(|r| r[0]).collect(),
        replies.iter().map(|r| r[1]).collect(),
        replies.iter().map(|r| r[2]).collect(),
        replies.iter().map(|r| r[3]).collect(),
    );
    assert_eq!(allowed, vec![1, 1, 0], "{replies:?}");
    assert_eq!(remaining, vec![3, 0, 0], "{replies:?}");
    assert_eq!(retry_after_ms, vec![0, 0, -1], "{replies:?}");
    assert_eq!(reset_after_ms[0], 2_000_000, "{replies:?}");
    for reset in &reset_after_ms[1..] {
        assert!(
            (4_999_000..=5_000_000).contains(reset),
            "reset_after_ms {reset}: {replies:?}"
        );
    }
}

#[test]
fn take_from_eval_replies_and_its_effects_reach_the_aof_as_hset_and_pexpireat() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    let script = "return redis.call('TB.TAKE', KEYS[1], ARGV[1], ARGV[2], ARGV[3])";
    let reply: Vec<i64> = redis::cmd("EVAL")
        .arg(script)
        .arg(1)
        .arg("tb:lua")
        .arg("10")
        .arg("0.01")
        .arg("4")
        .query(&mut con)
        .expect("EVAL");
    assert_eq!(reply, vec![1, 6, 0, 400_000]);

    let fields = hgetall_bytes(&mut con, "tb:lua");
    let deadline = pexpiretime(&mut con, "tb:lua");
    let tokens = fields
        .get(b"tokens".as_slice())
        .map(|t| String::from_utf8_lossy(t).parse::<f64>());
    assert!(matches!(tokens, Some(Ok(t)) if t == 6.0), "{fields:?}");

    // Acknowledged after the fsync (appendfsync always), so the AOF is complete.
    let _: String = redis::cmd("PING").query(&mut con).expect("PING");
    let commands = aof_commands(&server.dir);
    let names: Vec<String> = commands
        .iter()
        .map(|c| String::from_utf8_lossy(&c[0]).to_ascii_uppercase())
        .collect();
    assert!(
        !names
            .iter()
            .any(|n| n == "EVAL" || n == "EVALSHA" || n == "TB.TAKE"),
        "script or module command in the AOF: {names:?}"
    );
    let hset = commands
        .iter()
        .find(|c| {
            c[0].eq_ignore_ascii_case(b"hset")
                && c.get(1).map(Vec::as_slice) == Some(b"tb:lua".as_slice())
        })
        .unwrap_or_else(|| panic!("no HSET tb:lua in the AOF: {names:?}"));
    assert_eq!(hset.len() % 2, 0, "{hset:?}");
    let written: std::collections::BTreeMap<Vec<u8>, Vec<u8>> = hset[2..]
        .chunks(2)
        .map(|pair| (pair[0].clone(), pair[1].clone()))
        .collect();
    assert_eq!(written, fields, "HSET in the AOF");
    let pexpireat = commands
        .iter()
        .find(|c| {
            c[0].eq_ignore_ascii_case(b"pexpireat")
                && c.get(1).map(Vec::as_slice) == Some(b"tb:lua".as_slice())
        })
        .unwrap_or_else(|| panic!("no PEXPIREAT tb:lua in the AOF: {names:?}"));
    assert_eq!(
        pexpireat[2..].to_vec(),
        vec![deadline.to_string().into_bytes()],
        "PEXPIREAT in the AOF"
    );
}

/// Which clock the module reads, as `INFO tb` reports it: `cached` (the server's command time,
/// Redis 7.2+ and Valkey) or `wall` (Redis 7.0).
fn clock(con: &mut redis::Connection) -> String {
    harness::info_field(con, "tb", "tb_clock").expect("INFO tb tb_clock")
}

fn last_refill(con: &mut redis::Connection, key: &str) -> i64 {
    harness::stored_last_refill(con, key)
}

/// `MULTI; TB.TAKE a; DEBUG SLEEP 0.01; TB.TAKE b; EXEC`: with the cached command time every
/// call of the transaction sees the instant EXEC began; with the wall clock each sees its own.
#[test]
fn calls_in_one_transaction_share_an_instant_with_the_cached_clock_only() {
    let server = Server::start();
    let mut con = server.conn();
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("TB.TAKE")
        .arg(&["a", "10", "0.001", "1"])
        .cmd("DEBUG")
        .arg(&["SLEEP", "0.01"])
        .cmd("TB.TAKE")
        .arg(&["b", "10", "0.001", "1"]);
    let _: redis::Value = pipe.query(&mut con).expect("MULTI/EXEC");
    let gap_ms = last_refill(&mut con, "b") - last_refill(&mut con, "a");
    match clock(&mut con).as_str() {
        "cached" => assert_eq!(gap_ms, 0, "one instant for the whole transaction"),
        "wall" => assert!(gap_ms >= 10, "each call reads the clock: {gap_ms} ms apart"),
        other => panic!("tb_clock {other}"),
    }
}

/// Two takes in one script, with `busy_us` of busy waiting between them.
fn script_gap_ms(con: &mut redis::Connection, busy_us: i64, a: &str, b: &str) -> i64 {
    const SCRIPT: &str = r#"
        redis.call('TB.TAKE', KEYS[1], 10, 0.001, 1)
        local start = redis.call('TIME')
        local wait_us = tonumber(ARGV[1])
        -- TIME may itself be frozen until the server refreshes its clock: bounded anyway.
        for _ = 1, 200000000 do
            local t = redis.call('TIME')
            if (t[1] - start[1]) * 1000000 + (t[2] - start[2]) >= wait_us then break end
        end
        redis.call('TB.TAKE', KEYS[2], 10, 0.001, 1)
        return 1
    "#;
    let _: i64 = redis::Script::new(SCRIPT)
        .key(a)
        .key(b)
        .arg(busy_us)
        .invoke(con)
        .expect("script");
    last_refill(con, b) - last_refill(con, a)
}

/// A script shorter than `busy-reply-threshold` sees one instant with the cached clock. Past the
/// threshold the server starts answering other clients and refreshes that clock, so later calls
/// of the same script see a later instant; with the wall clock each call sees its own.
#[test]
fn calls_in_one_script_share_an_instant_until_it_runs_past_busy_reply_threshold() {
    let server = Server::start_with(&["--busy-reply-threshold", "50"]);
    let mut con = server.conn();
    let short = script_gap_ms(&mut con, 0, "short:a", "short:b");
    let long = script_gap_ms(&mut con, 200_000, "long:a", "long:b");
    match clock(&mut con).as_str() {
        "cached" => {
            assert_eq!(short, 0, "a short script sees one instant");
            assert!(long >= 50, "refreshed past the threshold: {long} ms apart");
        }
        "wall" => {
            assert!(short >= 0);
            assert!(long >= 200, "each call reads the clock: {long} ms apart");
        }
        other => panic!("tb_clock {other}"),
    }
}
