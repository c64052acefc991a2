//! Out of memory: `maxmemory` reached, with and without an eviction policy.
//!
//! TB.TAKE, TB.REFUND and TB.TAKEALL are flagged `deny-oom`: with `noeviction` and memory over
//! the limit, Redis refuses them before the module runs (so they cannot half-write a bucket),
//! with its standard OOM error. TB.PEEK is read-only and keeps answering. With an eviction
//! policy, a bucket is evicted as a whole key, and a missing key is a full bucket.
//!
//! How the limit is reached, deterministically: a 32 MB string (`ballast`, made by one
//! SETRANGE) pushes memory use far above a `maxmemory` set 16 MB below the use measured with
//! it; deleting the ballast brings use 16 MB under the limit again.

use std::time::Duration;

use crate::harness::*;

const OOM_ERR: &str = "OOM command not allowed when used memory > 'maxmemory'.";
const BALLAST_BYTES: i64 = 32 << 20;
const MARGIN_BYTES: i64 = 16 << 20;
/// One token per 1000 s: nothing refills noticeably during a test.
const SLOW: &str = "0.001";

fn used_memory(con: &mut redis::Connection) -> i64 {
    info_field(con, "memory", "used_memory")
        .expect("used_memory in INFO memory")
        .parse()
        .expect("used_memory is an integer")
}

fn config_set(con: &mut redis::Connection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query(con)
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
}

/// A `noeviction` server holding one drained bucket, `existing` (7 tokens left, with an
/// expiry), whose memory use is then pushed 16 MB over `maxmemory`.
fn server_out_of_memory() -> (Server, redis::Connection) {
    let server = Server::start_with(&["--maxmemory-policy", "noeviction"]);
    let mut con = server.conn();
    assert_eq!(take(&mut con, "existing", "10", SLOW, "3")[..2], [1, 7]);
    let _: i64 = redis::cmd("SETRANGE")
        .arg("ballast")
        .arg(BALLAST_BYTES)
        .arg("x")
        .query(&mut con)
        .expect("SETRANGE ballast");
    let limit = used_memory(&mut con) - MARGIN_BYTES;
    config_set(&mut con, "maxmemory", &limit.to_string());
    assert!(
        used_memory(&mut con) > limit,
        "memory use is not over the limit"
    );
    (server, con)
}

/// Deletes the ballast; memory use falls well under `maxmemory`.
fn free_the_ballast(con: &mut redis::Connection) {
    let deleted: i64 = redis::cmd("DEL")
        .arg("ballast")
        .query(con)
        .expect("DEL ballast");
    assert_eq!(deleted, 1);
}

fn oom_refused(con: &mut redis::Connection, args: &[&str]) {
    let argv: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    assert_eq!(expect_error(con, &argv), OOM_ERR, "{args:?}");
}

#[test]
fn take_on_a_new_key_gets_the_standard_oom_error_and_creates_nothing() {
    let (_server, mut con) = server_out_of_memory();
    oom_refused(&mut con, &["TB.TAKE", "new", "10", SLOW, "1"]);
    // Even n = 0, which would write nothing: Redis refuses deny-oom commands up front.
    oom_refused(&mut con, &["TB.TAKE", "new", "10", SLOW, "0"]);
    assert!(!exists(&mut con, "new"));
    assert!(ping(&mut con));
}

#[test]
fn take_on_an_existing_bucket_is_refused_too_and_nothing_is_half_written() {
    let (_server, mut con) = server_out_of_memory();
    let fields = hgetall(&mut con, "existing");
    let deadline = pexpiretime(&mut con, "existing");
    let before = snapshot(&mut con, b"existing");
    oom_refused(&mut con, &["TB.TAKE", "existing", "10", SLOW, "1"]);
    assert_eq!(hgetall(&mut con, "existing"), fields);
    assert_eq!(pexpiretime(&mut con, "existing"), deadline);
    assert_eq!(snapshot(&mut con, b"existing"), before);
}

#[test]
fn refund_and_takeall_are_refused_too_and_touch_nothing() {
    let (_server, mut con) = server_out_of_memory();
    let before = snapshot(&mut con, b"existing");
    oom_refused(&mut con, &["TB.REFUND", "existing", "10", SLOW, "1"]);
    oom_refused(
        &mut con,
        &[
            "TB.TAKEALL",
            "existing",
            "10",
            SLOW,
            "1",
            "new",
            "5",
            SLOW,
            "1",
        ],
    );
    assert_eq!(snapshot(&mut con, b"existing"), before);
    assert!(!exists(&mut con, "new"));
}

#[test]
fn take_in_a_transaction_is_refused_when_queued_and_the_exec_aborts() {
    let (_server, mut con) = server_out_of_memory();
    let before = snapshot(&mut con, b"existing");
    let _: () = redis::cmd("MULTI").query(&mut con).expect("MULTI");
    oom_refused(&mut con, &["TB.TAKE", "existing", "10", SLOW, "1"]);
    let exec = redis::cmd("EXEC").query::<redis::Value>(&mut con);
    let err = exec.expect_err("EXEC after a refused command must abort");
    assert_eq!(err.code(), Some("EXECABORT"), "{err}");
    assert_eq!(snapshot(&mut con, b"existing"), before);
}

#[test]
fn take_from_a_script_is_refused_too() {
    let (_server, mut con) = server_out_of_memory();
    let before = snapshot(&mut con, b"existing");
    let err = redis::cmd("EVAL")
        .arg("return redis.call('TB.TAKE', KEYS[1], '10', '0.001', '1')")
        .arg(1)
        .arg("existing")
        .query::<redis::Value>(&mut con)
        .expect_err("a script calling TB.TAKE out of memory must fail");
    assert!(
        error_text(&err).starts_with(OOM_ERR),
        "unexpected error: {}",
        error_text(&err)
    );
    assert_eq!(snapshot(&mut con, b"existing"), before);
}

#[test]
fn peek_keeps_answering_while_out_of_memory() {
    let (_server, mut con) = server_out_of_memory();
    let reply = peek(&mut con, "existing", "10", SLOW, "1");
    assert_eq!(reply[..3], [1, 6, 0], "existing bucket: {reply:?}");
    let reply = peek_default_n(&mut con, "missing", "10", SLOW);
    assert_eq!(reply[..3], [1, 9, 0], "missing bucket: {reply:?}");
    assert!(!exists(&mut con, "missing"));
}

#[test]
fn freeing_memory_lets_takes_work_again_from_the_stored_tokens() {
    let (_server, mut con) = server_out_of_memory();
    oom_refused(&mut con, &["TB.TAKE", "existing", "10", SLOW, "1"]);
    free_the_ballast(&mut con);
    assert!(used_memory(&mut con) < BALLAST_BYTES - MARGIN_BYTES);
    // 7 left before the refused call, which charged nothing.
    assert_eq!(take(&mut con, "existing", "10", SLOW, "1")[..3], [1, 6, 0]);
    assert_eq!(take(&mut con, "new", "10", SLOW, "1")[..3], [1, 9, 0]);
}

// --- With an eviction policy ---

const BUCKETS: usize = 2_000;

fn bucket_key(index: usize) -> String {
    format!("bucket:{index}")
}

/// Drains `BUCKETS` buckets (capacity 10, all taken), in one pipeline.
fn drain_buckets(con: &mut redis::Connection) {
    let mut pipe = redis::pipe();
    for index in 0..BUCKETS {
        pipe.cmd("TB.TAKE")
            .arg(bucket_key(index))
            .arg("10")
            .arg(SLOW)
            .arg("10");
    }
    let replies: Vec<Vec<i64>> = pipe.query(con).expect("draining pipeline");
    assert!(replies.iter().all(|r| r[..2] == [1, 0]), "all drained");
}

fn evicted_keys(con: &mut redis::Connection) -> i64 {
    info_field(con, "stats", "evicted_keys")
        .expect("evicted_keys in INFO stats")
        .parse()
        .expect("evicted_keys is an integer")
}

/// Sets `allkeys-lru` and lowers `maxmemory` under the current use, 64 KB further each round
/// (the use measured first may still count a transient buffer), until the server has
/// evicted something. Bounded.
fn evict_some(con: &mut redis::Connection) {
    config_set(con, "maxmemory-policy", "allkeys-lru");
    let mut limit = used_memory(con);
    for _ in 0..50 {
        limit -= 64 << 10;
        config_set(con, "maxmemory", &limit.to_string());
        // Every command runs the eviction loop first; PING gives it a turn.
        assert!(ping(con));
        if evicted_keys(con) > 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    panic!("nothing evicted with maxmemory down to {limit}");
}

#[test]
fn an_evicted_bucket_comes_back_full_and_a_kept_one_intact() {
    let server = Server::start();
    let mut con = server.conn();
    drain_buckets(&mut con);
    let last_refill: Vec<i64> = (0..BUCKETS)
        .map(|i| stored_last_refill(&mut con, &bucket_key(i)))
        .collect();
    evict_some(&mut con);
    // No more pressure: what is checked now is what eviction left behind.
    config_set(&mut con, "maxmemory", "0");
    let evicted = evicted_keys(&mut con);

    let (mut gone, mut kept) = (0, 0);
    for (index, last) in last_refill.iter().enumerate() {
        let key = bucket_key(index);
        let fields = hgetall(&mut con, &key);
        let reply = take(&mut con, &key, "10", SLOW, "1");
        if fields.is_empty() {
            gone += 1;
            assert_eq!(reply, vec![1, 9, 0, 1_000_000], "{key}: not a fresh bucket");
        } else {
            kept += 1;
            assert_eq!(fields.len(), 2, "{key}: {fields:?}");
            assert_eq!(fields["tokens"], "0", "{key}");
            assert_eq!(fields["last_refill"], last.to_string(), "{key}");
            assert_eq!(reply[..2], [0, 0], "{key}: a kept bucket is still drained");
        }
    }
    assert_eq!(
        gone as i64, evicted,
        "evicted keys vs buckets found missing"
    );
    assert!(gone > 0, "nothing was evicted");
    println!("{gone} buckets evicted, {kept} kept");
}

#[test]
fn takes_under_constant_eviction_pressure_never_see_a_corrupt_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    drain_buckets(&mut con);
    evict_some(&mut con);
    let filler = vec![b'f'; 1024];
    let mut allowed = 0;
    for call in 0..4_000 {
        let key = bucket_key(call % BUCKETS);
        // Keep the pressure on: every filler write evicts something.
        let _: () = redis::cmd("SET")
            .arg(format!("filler:{call}"))
            .arg(&filler[..])
            .query(&mut con)
            .expect("SET filler under allkeys-lru");
        let reply: Vec<i64> = redis::cmd("TB.TAKE")
            .arg(&key)
            .arg("10")
            .arg(SLOW)
            .arg("1")
            .query(&mut con)
            .unwrap_or_else(|e| panic!("call {call} on {key}: {e}"));
        assert_eq!(reply.len(), 4);
        assert!(reply[0] == 0 || reply[0] == 1, "{reply:?}");
        assert!((0..=9).contains(&reply[1]), "{reply:?}");
        assert!(reply[2] >= 0 && reply[3] >= 0, "{reply:?}");
        allowed += reply[0];
    }
    assert!(allowed > 0, "evicted buckets must come back full");
    // Whatever survived is a whole bucket.
    for index in 0..BUCKETS {
        let fields = hgetall(&mut con, &bucket_key(index));
        if !fields.is_empty() {
            assert_eq!(fields.len(), 2, "{fields:?}");
            let tokens: f64 = fields["tokens"].parse().expect("tokens is a number");
            assert!((0.0..=10.0).contains(&tokens), "{fields:?}");
            let _: i64 = fields["last_refill"]
                .parse()
                .expect("last_refill is an integer");
        }
    }
    assert!(ping(&mut con));
}
