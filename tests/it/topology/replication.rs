//! TB.TAKE through a real replica: a master and a replica, both `redis-server`
//! with the module loaded.
//!
//! What is checked: TB.TAKE replicates its *effects* (the hash fields and the
//! absolute deadline), so the replica ends up byte-identical; a call that
//! writes nothing (denied, or n = 0) puts nothing into the replication stream;
//! TB.PEEK is a read-only command a replica serves; TB.TAKE is a write command
//! a replica refuses.
//!
//! The master runs with `--repl-ping-replica-period 3600`: by default it sends
//! a PING down the replication stream every 10 s, which would move
//! `master_repl_offset` at a random moment and make the "offset does not move"
//! tests flaky.
//!
//! All waits are bounded polls (`harness::SYNC_TIMEOUT`).

use crate::harness;
use crate::harness::{
    exists, hgetall_bytes, peek, pexpiretime, pttl, repl_offset, start_replica_of, take, Server,
    QUIET_MASTER_ARGS,
};

/// A master and a replica that has finished its initial sync.
struct Pair {
    master: Server,
    replica: Server,
}

impl Pair {
    fn start() -> Pair {
        let master = Server::start_with(QUIET_MASTER_ARGS);
        let replica = start_replica_of(&master);
        Pair { master, replica }
    }

    /// Waits until the replica has applied everything the master has sent.
    fn wait_for_replica(&self) {
        harness::wait_for_replica(&self.master, &self.replica);
    }
}

#[test]
fn allowed_takes_reach_the_replica_as_identical_fields_and_deadline() {
    let pair = Pair::start();
    let mut m = pair.master.conn();
    let mut r = pair.replica.conn();

    // A bucket with a field of its own, which TB.TAKE must leave alone.
    harness::hset(
        &mut m,
        "tb:extra",
        &[("owner", "alice"), ("tokens", "100"), ("last_refill", "0")],
    );
    // Fractional rates make the stored tokens a non-trivial decimal text; slow ones (full
    // again in 400 s or more) keep every bucket from expiring before it is compared.
    for (key, capacity, rate, n) in [
        ("tb:a", "10", "0.005", "3"),
        ("tb:a", "10", "0.005", "2"),
        ("tb:b", "2.5", "0.003", "0.7"),
        ("tb:b", "2.5", "0.003", "1"),
        ("tb:extra", "100", "0.07", "33"),
    ] {
        let reply = take(&mut m, key, capacity, rate, n);
        assert_eq!(reply[0], 1, "take {key} {capacity} {rate} {n}: {reply:?}");
    }
    pair.wait_for_replica();

    for key in ["tb:a", "tb:b", "tb:extra"] {
        let master_fields = hgetall_bytes(&mut m, key);
        assert!(
            master_fields.contains_key(b"tokens".as_slice())
                && master_fields.contains_key(b"last_refill".as_slice()),
            "{key} on the master: {master_fields:?}"
        );
        assert_eq!(hgetall_bytes(&mut r, key), master_fields, "fields of {key}");

        let master_deadline = pexpiretime(&mut m, key);
        assert!(master_deadline > 0, "{key} has a deadline on the master");
        assert_eq!(
            pexpiretime(&mut r, key),
            master_deadline,
            "deadline of {key}"
        );

        // Same absolute deadline, so PTTL read on the replica falls between
        // two reads on the master (a few ms of slack for clock caching).
        let before = pttl(&mut m, key);
        let on_replica = pttl(&mut r, key);
        let after = pttl(&mut m, key);
        assert!(
            after - 5 <= on_replica && on_replica <= before + 5,
            "PTTL of {key}: master {before} then {after}, replica {on_replica}"
        );
    }
    assert_eq!(
        hgetall_bytes(&mut r, "tb:extra").get(b"owner".as_slice()),
        Some(&b"alice".to_vec()),
        "foreign field kept on the replica"
    );
}

/// Makes `key` an empty bucket that refills one token per 1000 s, so every
/// further TB.TAKE of one token within this test is denied.
fn exhaust(con: &mut redis::Connection, key: &str) {
    let reply = take(con, key, "1", "0.001", "1");
    assert_eq!(reply[0], 1, "first take empties the bucket: {reply:?}");
    let reply = take(con, key, "1", "0.001", "1");
    assert_eq!(reply[0], 0, "second take is denied: {reply:?}");
}

#[test]
fn denied_takes_do_not_move_the_master_replication_offset() {
    let pair = Pair::start();
    let mut m = pair.master.conn();
    exhaust(&mut m, "tb:denied");
    pair.wait_for_replica();
    let fields = hgetall_bytes(&mut m, "tb:denied");

    let before = repl_offset(&mut m);
    for _ in 0..100 {
        let reply = take(&mut m, "tb:denied", "1", "0.001", "1");
        assert_eq!(reply[0], 0, "denied: {reply:?}");
    }
    // A denied call on a key that does not exist yet must not create it.
    for _ in 0..10 {
        let reply = take(&mut m, "tb:never", "1", "0.001", "2");
        assert_eq!(reply[0], 0, "n > capacity is denied: {reply:?}");
    }
    assert_eq!(repl_offset(&mut m), before, "master_repl_offset moved");

    pair.wait_for_replica();
    let mut r = pair.replica.conn();
    assert_eq!(hgetall_bytes(&mut r, "tb:denied"), fields);
    assert!(hgetall_bytes(&mut r, "tb:never").is_empty());
}

#[test]
fn takes_of_zero_tokens_do_not_move_the_master_replication_offset() {
    let pair = Pair::start();
    let mut m = pair.master.conn();
    // One token per 1000 s: the bucket cannot expire (a DEL down the stream) meanwhile.
    let reply = take(&mut m, "tb:zero", "10", "0.001", "4");
    assert_eq!(reply[0], 1, "{reply:?}");
    pair.wait_for_replica();

    let before = repl_offset(&mut m);
    for _ in 0..100 {
        // n = 0 on an existing bucket and on a missing one: allowed, no write.
        let reply = take(&mut m, "tb:zero", "10", "0.001", "0");
        assert_eq!(reply[0], 1, "{reply:?}");
        let reply = take(&mut m, "tb:zero-missing", "10", "1", "0");
        assert_eq!(reply[0], 1, "{reply:?}");
    }
    assert_eq!(repl_offset(&mut m), before, "master_repl_offset moved");
    assert!(!exists(&mut m, "tb:zero-missing"), "n = 0 created the key");
}

#[test]
fn peek_on_the_replica_answers_like_the_master() {
    let pair = Pair::start();
    let mut m = pair.master.conn();
    let mut r = pair.replica.conn();
    // 1 token per 1000 s: nothing the test does takes long enough to change
    // `remaining`; only the millisecond counters move, and only downwards.
    take(&mut m, "tb:peek", "10", "0.001", "3");
    take(&mut m, "tb:peek", "10", "0.001", "6");
    pair.wait_for_replica();

    // (n, allowed, remaining) the master and the replica must agree on.
    for (n, allowed, remaining) in [("1", 1, 0), ("2", 0, 1), (".5", 1, 0)] {
        let first = peek(&mut m, "tb:peek", "10", "0.001", n);
        let on_replica = peek(&mut r, "tb:peek", "10", "0.001", n);
        let last = peek(&mut m, "tb:peek", "10", "0.001", n);
        assert_eq!(on_replica.len(), 4, "{on_replica:?}");
        assert_eq!(
            (on_replica[0], on_replica[1]),
            (allowed, remaining),
            "peek n={n} on the replica: {on_replica:?}"
        );
        // The same state read at a time between two master reads: every
        // field lies between the master's answers.
        for i in 0..4 {
            let (lo, hi) = (first[i].min(last[i]), first[i].max(last[i]));
            assert!(
                lo <= on_replica[i] && on_replica[i] <= hi,
                "peek n={n} field {i}: master {first:?} then {last:?}, replica {on_replica:?}"
            );
        }
    }
    // A missing bucket is full on both.
    assert_eq!(
        peek(&mut r, "tb:missing", "5", "1", "2"),
        peek(&mut m, "tb:missing", "5", "1", "2")
    );
    assert_eq!(
        peek(&mut r, "tb:missing", "5", "1", "2"),
        vec![1, 3, 0, 2000]
    );
}

#[test]
fn take_on_the_replica_is_refused_as_readonly() {
    let pair = Pair::start();
    let mut r = pair.replica.conn();
    let result: redis::RedisResult<Vec<i64>> = redis::cmd("TB.TAKE")
        .arg("tb:ro")
        .arg("10")
        .arg("1")
        .arg("1")
        .query(&mut r);
    let err = result.expect_err("TB.TAKE on a replica must fail");
    assert_eq!(err.code(), Some("READONLY"), "{err:?}");
    assert!(!exists(&mut r, "tb:ro"));
}
