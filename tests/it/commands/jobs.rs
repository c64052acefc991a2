//! The jobs the options and new commands do, on real servers: locks (`BLOCK ms [MAXBLOCK
//! ms]` on TB.TAKE and TB.TAKEALL, TB.UNBLOCK), reservations (`MAXWAIT ms`), post-paid
//! costs (TB.CHARGE with `MAXDEBT`), and TB.THROTTLE's routing, each through replication,
//! the AOF, a failover and a cluster, and every bad option's error.
//!
//! The contracts are in docs/commands.md; the arithmetic is core/src/bucket.rs
//! (`take_with`, `locked`, `lock_on_denial`, `reserve`, `debit`, `deadline_ms`) and
//! core/src/lockout.rs; the hash and what is replicated, src/bucket/hash.rs.
//!
//! Timing: the figures that can be exact are asserted exactly, from the fields the server
//! stored (`locked_until`, `probation_until`) and the server's own clock (TIME), never from
//! the test's sleeps; where a reply depends on the instant of the call, it is bounded by
//! the server clock read before and after it. Every wait is a bounded poll.

use std::net::TcpListener;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::harness;
use crate::harness::{
    aof_without_select, argv, assert_no_tb_command, assert_replica_holds_the_same_buckets, bucket,
    drain, error_text, exists, hgetall, pexpiretime, promote, repl_offset, server_time_ms,
    snapshot, start_cluster_node, start_replica_of, tb_field, wait_for_replica, wait_for_waiting,
    wait_until, RawClient, Resp, Server, AOF_ARGS, CAPACITY_ERROR, N_ERROR, QUIET_MASTER_ARGS,
    RATE_ERROR, WRONGTYPE_ERROR,
};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{ConnectionLike, Value};

// ---------------------------------------------------------------------------------------
// Calls and readings
// ---------------------------------------------------------------------------------------

/// A command from its words.
fn command(args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd
}

/// The integer reply of `args` (the command name first); panics, naming the call, on an
/// error.
fn call(con: &mut impl ConnectionLike, args: &[&str]) -> Vec<i64> {
    command(args)
        .query(con)
        .unwrap_or_else(|e| panic!("{} failed: {e}", args.join(" ")))
}

/// The exact error text of `args`; panics if the call succeeds.
fn error(con: &mut impl ConnectionLike, args: &[&str]) -> String {
    match command(args).query::<Value>(con) {
        Ok(v) => panic!("expected an error from {}, got {v:?}", args.join(" ")),
        Err(e) => error_text(&e),
    }
}

/// TB.UNBLOCK's reply.
fn unblock(con: &mut impl ConnectionLike, key: &str) -> i64 {
    command(&["TB.UNBLOCK", key])
        .query(con)
        .unwrap_or_else(|e| panic!("TB.UNBLOCK {key} failed: {e}"))
}

/// A lock as the hash stores it: `(locked_until, strikes, probation_until)`.
fn stored_lock(con: &mut redis::Connection, key: &str) -> (i64, i64, i64) {
    let fields = hgetall(con, key);
    let number = |name: &str| -> i64 {
        fields
            .get(name)
            .unwrap_or_else(|| panic!("{key} has no {name}: {fields:?}"))
            .parse()
            .unwrap_or_else(|e| panic!("{key} {name} is not an integer: {e}"))
    };
    (
        number("locked_until"),
        number("strikes"),
        number("probation_until"),
    )
}

/// Whether the hash has any of the three lock fields.
fn has_lock_fields(con: &mut redis::Connection, key: &str) -> bool {
    let fields = hgetall(con, key);
    ["locked_until", "strikes", "probation_until"]
        .iter()
        .any(|name| fields.contains_key(*name))
}

/// The stored `tokens` as a number (may be below zero: debt).
fn tokens(con: &mut redis::Connection, key: &str) -> f64 {
    harness::stored_tokens(con, key)
}

/// Runs `args` between two readings of the server clock: `(before, reply, after)`.
fn timed(con: &mut redis::Connection, args: &[&str]) -> (i64, Vec<i64>, i64) {
    let before = server_time_ms(con);
    let reply = call(con, args);
    let after = server_time_ms(con);
    (before, reply, after)
}

/// Polls until the server clock reads `at_ms` or later (bounded: `at_ms` must be near).
fn wait_for_server_time(con: &mut redis::Connection, at_ms: i64) {
    let now = server_time_ms(con);
    assert!(at_ms - now < 120_000, "{at_ms} is {} ms away", at_ms - now);
    while server_time_ms(con) < at_ms {
        sleep(Duration::from_millis(5));
    }
}

/// An `INFO tb` counter as an integer.
fn counter(con: &mut redis::Connection, name: &str) -> i64 {
    tb_field(con, name)
        .parse()
        .unwrap_or_else(|e| panic!("INFO tb {name}: {e}"))
}

/// A drained bucket of one token refilled at one per 1000 s, locked by a denial with
/// `BLOCK block_ms`: every call on it is denied for the whole test. Returns the stored
/// lock.
fn locked_slow_bucket(con: &mut redis::Connection, key: &str, block_ms: &str) -> (i64, i64, i64) {
    drain(con, key, "1", "0.001");
    let reply = call(con, &["TB.TAKE", key, "1", "0.001", "1", "BLOCK", block_ms]);
    assert_eq!(reply[0], 0, "the denial that locks: {reply:?}");
    stored_lock(con, key)
}

// ---------------------------------------------------------------------------------------
// Locks: BLOCK, MAXBLOCK, TB.UNBLOCK
// ---------------------------------------------------------------------------------------

#[test]
fn a_denial_with_block_locks_the_key_until_the_lock_ends_while_tokens_keep_refilling() {
    let server = Server::start();
    let mut con = server.conn();
    // 5 tokens, 10 per second: empty now, full again in 500 ms.
    drain(&mut con, "tb:lock", "5", "10");
    let (before, reply, after) = timed(
        &mut con,
        &["TB.TAKE", "tb:lock", "5", "10", "1", "BLOCK", "3000"],
    );
    // A token would be back within 100 ms; the lock is the later, so it is the wait.
    assert_eq!(reply[..3], [0, 0, 3000], "{reply:?}");
    let (until, strikes, probation) = stored_lock(&mut con, "tb:lock");
    harness::assert_within("locked_until", until, before + 3000, after + 3000);
    assert_eq!(strikes, 1);
    assert_eq!(
        probation,
        until + 3000,
        "probation: as long again as the lock"
    );
    assert_eq!(counter(&mut con, "tb_locks_started"), 1);

    // The bucket fills up meanwhile (500 ms), and still every call is denied.
    sleep(Duration::from_millis(700));
    let checks: [&[&str]; 7] = [
        &["TB.PEEK", "tb:lock", "5", "10", "1"],
        &["TB.PEEK", "tb:lock", "5", "10"],
        &["TB.TAKE", "tb:lock", "5", "10", "1"],
        &["TB.TAKE", "tb:lock", "5", "10", "0"],
        &["TB.TAKE", "tb:lock", "5", "10", "1", "MAXWAIT", "100000"],
        &["TB.TAKE", "tb:lock", "5", "10", "1", "BLOCK", "3000"],
        &[
            "TB.TAKEALL",
            "tb:lock",
            "5",
            "10",
            "1",
            "tb:other",
            "5",
            "10",
            "1",
        ],
    ];
    for args in checks {
        let (before, reply, after) = timed(&mut con, args);
        assert!(
            after < until,
            "the lock ended before the check; machine too slow"
        );
        assert_eq!(
            reply[..2],
            [0, 5],
            "{}: denied, the bucket full: {reply:?}",
            args.join(" ")
        );
        harness::assert_within("retry_after_ms", reply[2], until - after, until - before);
        assert_eq!(reply[3], 0, "full: reset_after_ms 0");
        if args[0] == "TB.TAKEALL" {
            assert_eq!(reply[4], 0, "the locked bucket decides");
        }
    }
    assert!(!exists(&mut con, "tb:other"), "TB.TAKEALL took nothing");
    // TB.BTAKE does not wait on a locked key: it is denied at once.
    let started = Instant::now();
    let reply = call(&mut con, &["TB.BTAKE", "tb:lock", "5", "10", "1", "10000"]);
    assert_eq!(reply[..2], [0, 5], "{reply:?}");
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "TB.BTAKE waited {:?}",
        started.elapsed()
    );
    assert_eq!(
        stored_lock(&mut con, "tb:lock"),
        (until, 1, probation),
        "no new strike"
    );

    // Once it ends, the bucket serves again; the lock's fields stay for the probation.
    wait_for_server_time(&mut con, until);
    let reply = call(&mut con, &["TB.TAKE", "tb:lock", "5", "10", "1"]);
    assert_eq!(reply[..3], [1, 4, 0], "{reply:?}");
    assert_eq!(stored_lock(&mut con, "tb:lock"), (until, 1, probation));
}

#[test]
fn a_locked_denial_waits_for_the_later_of_the_lock_end_and_the_tokens() {
    let server = Server::start();
    let mut con = server.conn();
    // Tokens later than the lock: one token per 1000 s, a lock of 2 s.
    let (until, _, _) = locked_slow_bucket(&mut con, "tb:slow", "2000");
    let reply = call(&mut con, &["TB.PEEK", "tb:slow", "1", "0.001", "1"]);
    assert_eq!(reply[..2], [0, 0]);
    harness::assert_within("retry_after_ms (the token)", reply[2], 990_000, 1_000_000);
    assert!(server_time_ms(&mut con) < until, "still locked");
    // More than the capacity can never succeed, lock or not.
    let reply = call(&mut con, &["TB.TAKE", "tb:slow", "1", "0.001", "2"]);
    assert_eq!(reply[..3], [0, 0, -1], "{reply:?}");
    let reply = call(
        &mut con,
        &["TB.TAKE", "tb:fresh", "1", "0.001", "2", "BLOCK", "10"],
    );
    assert_eq!(
        reply[..3],
        [0, 1, -1],
        "a lock does not shorten never: {reply:?}"
    );

    // The lock later than the tokens: 10 per second, a lock of 2 s.
    drain(&mut con, "tb:fast", "10", "10");
    let reply = call(
        &mut con,
        &["TB.TAKE", "tb:fast", "10", "10", "1", "BLOCK", "2000"],
    );
    assert_eq!(reply[..3], [0, 0, 2000], "{reply:?}");
}

#[test]
fn with_maxblock_each_lock_within_the_probation_doubles_up_to_maxblock_and_after_it_starts_over() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "tb:esc", "1", "0.001");
    let deny = |con: &mut redis::Connection| {
        let reply = call(
            con,
            &[
                "TB.TAKE", "tb:esc", "1", "0.001", "1", "BLOCK", "300", "MAXBLOCK", "1000",
            ],
        );
        assert_eq!(reply[0], 0, "{reply:?}");
        stored_lock(con, "tb:esc")
    };
    let first = deny(&mut con);
    assert_eq!((first.1, first.2 - first.0), (1, 300));
    // A denial during the lock neither extends it nor counts a strike.
    assert_eq!(deny(&mut con), first);

    // Denied again the moment each lock ends, inside its probation: 300, 600, 1000 (not
    // 1200: MAXBLOCK), 1000.
    let mut lock = first;
    for (strikes, length) in [(2, 600), (3, 1000), (4, 1000)] {
        wait_for_server_time(&mut con, lock.0);
        let at = server_time_ms(&mut con);
        let next = deny(&mut con);
        assert!(at < lock.2, "denied after the probation; machine too slow");
        assert_eq!((next.1, next.2 - next.0), (strikes, length), "{next:?}");
        harness::assert_within(
            "locked_until",
            next.0,
            at + length,
            server_time_ms(&mut con) + length,
        );
        lock = next;
    }
    // After the probation, the next lock is a first one again.
    wait_for_server_time(&mut con, lock.2);
    let fresh = deny(&mut con);
    assert_eq!((fresh.1, fresh.2 - fresh.0), (1, 300), "{fresh:?}");
    assert_eq!(counter(&mut con, "tb_locks_started"), 5);
}

#[test]
fn tb_takeall_with_block_locks_each_denying_bucket_and_no_other() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "{u}:empty", "1", "0.001");
    let reply = call(
        &mut con,
        &[
            "TB.TAKEALL",
            "{u}:full",
            "5",
            "0.001",
            "1",
            "{u}:empty",
            "1",
            "0.001",
            "1",
            "BLOCK",
            "60000",
        ],
    );
    assert_eq!(
        (reply[0], reply[4]),
        (0, 1),
        "denied by the empty bucket: {reply:?}"
    );
    let (until, strikes, probation) = stored_lock(&mut con, "{u}:empty");
    assert_eq!((strikes, probation - until), (1, 60_000));
    assert!(
        !exists(&mut con, "{u}:full"),
        "the allowing bucket is not written"
    );
    // The lock now denies the whole call, whatever the other bucket holds.
    let reply = call(
        &mut con,
        &[
            "TB.TAKEALL",
            "{u}:full",
            "5",
            "0.001",
            "1",
            "{u}:empty",
            "1",
            "0.001",
            "0",
        ],
    );
    assert_eq!((reply[0], reply[4]), (0, 1), "{reply:?}");
    assert_eq!(counter(&mut con, "tb_locks_started"), 1);
}

#[test]
fn tb_btake_waiters_queued_before_a_lock_are_served_as_their_tokens_come() {
    let server = Server::start();
    let mut con = server.conn();
    // 1 token, 2 per second: the waiter's token is back 500 ms after the drain.
    drain(&mut con, "tb:queued", "1", "2");
    let drained_at = harness::stored_last_refill(&mut con, "tb:queued");
    let mut waiter = RawClient::connect(&server);
    waiter.send(&["TB.BTAKE", "tb:queued", "1", "2", "1", "10000"]);
    wait_for_waiting(&mut con, 1);
    // A denial with BLOCK locks the key for 5 s while the waiter waits.
    let reply = call(
        &mut con,
        &["TB.TAKE", "tb:queued", "1", "2", "1", "BLOCK", "5000"],
    );
    assert_eq!(reply[0], 0, "{reply:?}");
    let (until, _, probation) = stored_lock(&mut con, "tb:queued");
    // The waiter is served when its token is back, long before the lock ends.
    match waiter.reply_within(Duration::from_secs(4)) {
        Some(Resp::Ints(reply)) => assert_eq!(reply[..3], [1, 0, 0], "{reply:?}"),
        other => panic!("the waiter got {other:?}"),
    }
    let served_at = harness::stored_last_refill(&mut con, "tb:queued");
    assert!(
        served_at >= drained_at + 500 && served_at < until,
        "served at {served_at}"
    );
    // Its write keeps the lock, and the deadline that covers the probation.
    assert_eq!(stored_lock(&mut con, "tb:queued").0, until);
    assert!(pexpiretime(&mut con, "tb:queued") >= probation);
    // A new TB.BTAKE is turned away at once.
    let reply = call(&mut con, &["TB.BTAKE", "tb:queued", "1", "2", "1", "10000"]);
    assert_eq!(reply[0], 0, "{reply:?}");
}

#[test]
fn a_refund_does_not_lift_a_lock() {
    let server = Server::start();
    let mut con = server.conn();
    let lock = locked_slow_bucket(&mut con, "tb:refunded", "60000");
    let reply = call(&mut con, &["TB.REFUND", "tb:refunded", "1", "0.001", "1"]);
    assert_eq!(reply[..2], [1, 1], "the token is back: {reply:?}");
    assert_eq!(
        stored_lock(&mut con, "tb:refunded"),
        lock,
        "the lock is kept"
    );
    assert!(
        pexpiretime(&mut con, "tb:refunded") >= lock.2,
        "the TTL still covers it"
    );
    let reply = call(&mut con, &["TB.TAKE", "tb:refunded", "1", "0.001", "1"]);
    assert_eq!(reply[..2], [0, 1], "a full bucket, still locked: {reply:?}");
}

#[test]
fn tb_unblock_lifts_the_lock_answering_1_then_0_and_writes_only_when_it_answers_1() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    // 5 tokens, 1 per 1000 s: 1 left, and a denial of 2 locks the key.
    assert_eq!(
        call(&mut con, &["TB.TAKE", "tb:u", "5", "0.001", "4"])[0],
        1
    );
    let reply = call(
        &mut con,
        &["TB.TAKE", "tb:u", "5", "0.001", "2", "BLOCK", "60000"],
    );
    assert_eq!(reply[0], 0);
    assert_eq!(
        call(&mut con, &["TB.TAKE", "tb:u", "5", "0.001", "1"])[0],
        0,
        "locked"
    );
    let deadline = pexpiretime(&mut con, "tb:u");
    let logged = aof_without_select(&server, &mut con);

    assert_eq!(unblock(&mut con, "tb:u"), 1);
    let mut expected = logged.clone();
    expected.push(argv(&[
        "HDEL",
        "tb:u",
        "locked_until",
        "strikes",
        "probation_until",
    ]));
    assert_eq!(aof_without_select(&server, &mut con), expected, "one HDEL");
    assert!(
        !has_lock_fields(&mut con, "tb:u"),
        "{:?}",
        hgetall(&mut con, "tb:u")
    );
    assert_eq!(pexpiretime(&mut con, "tb:u"), deadline, "the TTL stays");
    let reply = call(&mut con, &["TB.TAKE", "tb:u", "5", "0.001", "1"]);
    assert_eq!(
        reply[..2],
        [1, 0],
        "the last token, the lock gone: {reply:?}"
    );

    // Nothing to lift: 0, and nothing written; a missing key is not created.
    let logged = aof_without_select(&server, &mut con);
    let before = snapshot(&mut con, b"tb:u");
    assert_eq!(unblock(&mut con, "tb:u"), 0);
    assert_eq!(unblock(&mut con, "tb:missing"), 0);
    assert_eq!(
        call(&mut con, &["TB.TAKE", "tb:plain", "5", "0.001", "1"])[0],
        1
    );
    let plain = aof_without_select(&server, &mut con);
    assert_eq!(unblock(&mut con, "tb:plain"), 0, "a bucket never locked");
    assert_eq!(aof_without_select(&server, &mut con), plain);
    assert!(
        plain[logged.len()..]
            .iter()
            .all(|c| c[0].eq_ignore_ascii_case(b"MULTI")
                || c[0].eq_ignore_ascii_case(b"EXEC")
                || c[1] == b"tb:plain"),
        "only the take of tb:plain was written: {:?}",
        &plain[logged.len()..]
    );
    assert_eq!(snapshot(&mut con, b"tb:u"), before);
    assert!(!exists(&mut con, "tb:missing"));

    // The strikes are forgotten too: the next lock is a first one.
    let reply = call(
        &mut con,
        &[
            "TB.TAKE", "tb:u", "5", "0.001", "1", "BLOCK", "500", "MAXBLOCK", "8000",
        ],
    );
    assert_eq!(reply[0], 0);
    let (until, strikes, probation) = stored_lock(&mut con, "tb:u");
    assert_eq!((strikes, probation - until), (1, 500));
    // TB.UNBLOCK on another type is refused like every command.
    let _: () = redis::cmd("SET")
        .arg("tb:string")
        .arg("x")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        error(&mut con, &["TB.UNBLOCK", "tb:string"]),
        WRONGTYPE_ERROR
    );
}

#[test]
fn a_denial_during_a_lock_writes_nothing_to_the_replication_stream() {
    let master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    let mut m = master.conn();
    // 5 tokens, 1 per 1000 s, locked for a minute: nothing expires while the test runs.
    drain(&mut m, "tb:quiet", "5", "0.001");
    let reply = call(
        &mut m,
        &["TB.TAKE", "tb:quiet", "5", "0.001", "1", "BLOCK", "60000"],
    );
    assert_eq!(reply[0], 0);
    wait_for_replica(&master, &replica);
    let offset = repl_offset(&mut m);
    let before = snapshot(&mut m, b"tb:quiet");

    let denied: [&[&str]; 9] = [
        &["TB.TAKE", "tb:quiet", "5", "0.001", "1"],
        &["TB.TAKE", "tb:quiet", "5", "0.001", "0"],
        &[
            "TB.TAKE", "tb:quiet", "5", "0.001", "1", "BLOCK", "60000", "MAXBLOCK", "600000",
        ],
        &[
            "TB.TAKE",
            "tb:quiet",
            "5",
            "0.001",
            "1",
            "MAXWAIT",
            "100000000",
        ],
        &["TB.PEEK", "tb:quiet", "5", "0.001", "1"],
        &["TB.BTAKE", "tb:quiet", "5", "0.001", "1", "1000"],
        &[
            "TB.TAKEALL",
            "tb:quiet",
            "5",
            "0.001",
            "1",
            "tb:full",
            "5",
            "0.001",
            "1",
        ],
        &[
            "TB.TAKEALL",
            "tb:full",
            "5",
            "0.001",
            "1",
            "tb:quiet",
            "5",
            "0.001",
            "1",
            "BLOCK",
            "1000",
        ],
        &["TB.THROTTLE", "tb:quiet", "4", "1", "1000"],
    ];
    for _ in 0..20 {
        for args in denied {
            let reply = call(&mut m, args);
            let limited = if args[0] == "TB.THROTTLE" { 1 } else { 0 };
            assert_eq!(reply[0], limited, "{} is denied: {reply:?}", args.join(" "));
        }
    }
    assert_eq!(repl_offset(&mut m), offset, "master_repl_offset moved");
    assert_eq!(
        snapshot(&mut m, b"tb:quiet"),
        before,
        "the key is as it was"
    );
    assert!(!exists(&mut m, "tb:full"), "TB.TAKEALL took nothing");
    assert_replica_holds_the_same_buckets(&master, &replica, &["tb:quiet"]);
}

#[test]
fn a_denial_during_a_lock_leaves_a_watch_alone_and_tb_unblock_signals_it_only_when_it_answers_1() {
    let server = Server::start();
    let mut con = server.conn();
    locked_slow_bucket(&mut con, "tb:watched", "60000");
    let denied = |other: &mut redis::Connection| {
        for args in [
            &["TB.TAKE", "tb:watched", "1", "0.001", "1", "BLOCK", "60000"][..],
            &[
                "TB.TAKEALL",
                "tb:watched",
                "1",
                "0.001",
                "0",
                "MAXWAIT",
                "5",
            ],
            &["TB.THROTTLE", "tb:watched", "0", "1", "1000"],
        ] {
            call(other, args);
        }
    };
    assert!(harness::watch_survives(
        &server,
        &mut con,
        "tb:watched",
        denied
    ));
    assert!(harness::watch_survives(
        &server,
        &mut con,
        "tb:never-locked",
        |other| {
            assert_eq!(unblock(other, "tb:never-locked"), 0);
        }
    ));
    assert!(!harness::watch_survives(
        &server,
        &mut con,
        "tb:watched",
        |other| {
            assert_eq!(unblock(other, "tb:watched"), 1);
        }
    ));
    assert!(harness::watch_survives(
        &server,
        &mut con,
        "tb:watched",
        |other| {
            assert_eq!(unblock(other, "tb:watched"), 0);
        }
    ));
}

#[test]
fn the_keys_ttl_covers_the_locks_probation() {
    let server = Server::start();
    let mut con = server.conn();
    // 10 tokens, 100 per second: full again 100 ms after a drain, long before the
    // probation (a lock of 800 ms, its probation 800 ms more) ends.
    drain(&mut con, "tb:ttl", "10", "100");
    let reply = call(
        &mut con,
        &["TB.TAKE", "tb:ttl", "10", "100", "5", "BLOCK", "800"],
    );
    assert_eq!(reply[0], 0);
    let (until, _, probation) = stored_lock(&mut con, "tb:ttl");
    assert_eq!(
        pexpiretime(&mut con, "tb:ttl"),
        probation,
        "the TTL ends with the probation"
    );

    // A take after the lock writes the bucket again, and keeps that deadline (not the
    // 10 ms to full).
    wait_for_server_time(&mut con, until);
    assert_eq!(
        call(&mut con, &["TB.TAKE", "tb:ttl", "10", "100", "1"])[0],
        1
    );
    assert_eq!(pexpiretime(&mut con, "tb:ttl"), probation);
    // Then the key goes, strikes and all, when the probation ends.
    wait_until(
        "the key to expire after its probation",
        Duration::from_secs(10),
        || !exists(&mut con, "tb:ttl"),
    );
    assert!(server_time_ms(&mut con) >= probation);
    call(&mut con, &["TB.TAKE", "tb:ttl", "10", "100", "10"]);
    let reply = call(
        &mut con,
        &[
            "TB.TAKE", "tb:ttl", "10", "100", "5", "BLOCK", "800", "MAXBLOCK", "9000",
        ],
    );
    assert_eq!(reply[0], 0);
    assert_eq!(stored_lock(&mut con, "tb:ttl").1, 1, "a first strike again");
}

// ---------------------------------------------------------------------------------------
// Reservations: MAXWAIT
// ---------------------------------------------------------------------------------------

#[test]
fn a_reservation_is_allowed_into_debt_and_retry_after_ms_is_its_wait() {
    let server = Server::start();
    let mut con = server.conn();
    // 10 tokens, 10 per second: 5 more take 500 ms to come.
    drain(&mut con, "tb:res", "10", "10");
    let (before, reply, _) = timed(
        &mut con,
        &["TB.TAKE", "tb:res", "10", "10", "5", "MAXWAIT", "1000"],
    );
    assert_eq!(reply[..2], [1, 0], "allowed, nothing left: {reply:?}");
    harness::assert_within("retry_after_ms", reply[2], 450, 500);
    let debt = tokens(&mut con, "tb:res");
    assert!(
        (-5.0..-4.5).contains(&debt),
        "stored tokens {debt}: a debt of about 5"
    );
    // Full again after the debt and the capacity: 15 tokens, 1.5 s.
    harness::assert_within(
        "reset_after_ms",
        reply[3],
        reply[2] + 1000 - 1,
        reply[2] + 1000 + 1,
    );
    assert_eq!(counter(&mut con, "tb_reservations_waited"), 1);
    // While the debt is being repaid a plain take is denied, and its wait counts the debt.
    let reply = call(&mut con, &["TB.TAKE", "tb:res", "10", "10", "1"]);
    assert_eq!(reply[0], 0, "{reply:?}");
    assert!(reply[2] > 400, "one token after the debt: {reply:?}");
    // Acting when told, the reserved tokens are there: the debt is repaid.
    wait_for_server_time(&mut con, before + 700);
    assert!(tokens(&mut con, "tb:res") < 0.0, "stored as it was");
    let reply = call(&mut con, &["TB.PEEK", "tb:res", "10", "10", "0"]);
    assert_eq!(reply[0], 1);
    assert!(reply[1] >= 1, "the debt is repaid: {reply:?}");
}

#[test]
fn reservations_are_served_in_arrival_order() {
    let server = Server::start();
    let mut con = server.conn();
    // 10 tokens, 10 per second, drained: each reservation waits behind the ones before.
    drain(&mut con, "tb:order", "10", "10");
    let drained_at = harness::stored_last_refill(&mut con, "tb:order");
    // Each caller acts when every token reserved before it, and its own, has been
    // refilled since the drain: 2, 3, 6, 7 and 9 tokens, 100 ms each.
    for (n, ahead) in [("2", 2), ("1", 3), ("3", 6), ("1", 7), ("2", 9)] {
        let (before, reply, after) = timed(
            &mut con,
            &["TB.TAKE", "tb:order", "10", "10", n, "MAXWAIT", "5000"],
        );
        assert_eq!(reply[..2], [1, 0], "reserved: {reply:?}");
        let go = drained_at + ahead * 100;
        // The call ran between `before` and `after`; 1 ms of rounding.
        harness::assert_within(
            "when it may act",
            go,
            before + reply[2] - 1,
            after + reply[2] + 1,
        );
    }
    assert!(
        tokens(&mut con, "tb:order") < -5.0,
        "a debt of 9 less the refill"
    );
}

#[test]
fn a_reservation_that_cannot_be_served_within_maxwait_is_denied_and_writes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    // 10 tokens, 1 per second, drained: 5 tokens take 5 s, more than MAXWAIT 2000.
    drain(&mut con, "tb:far", "10", "1");
    let drained_at = harness::stored_last_refill(&mut con, "tb:far");
    let before = snapshot(&mut con, b"tb:far");
    let (t0, reply, t1) = timed(
        &mut con,
        &["TB.TAKE", "tb:far", "10", "1", "5", "MAXWAIT", "2000"],
    );
    assert_eq!(reply[..2], [0, 0], "{reply:?}");
    // Denied with the soonest a call with the same MAXWAIT is allowed: when 5 tokens are
    // 2 s away, 3 s after the drain.
    let go = drained_at + 3000;
    harness::assert_within("retry_after_ms", reply[2], go - t1, go - t0 + 1);
    assert_eq!(snapshot(&mut con, b"tb:far"), before, "nothing written");
    assert_eq!(counter(&mut con, "tb_reservations_waited"), 0);
    // More than the capacity is never reserved.
    let reply = call(
        &mut con,
        &["TB.TAKE", "tb:far", "10", "1", "11", "MAXWAIT", "100000000"],
    );
    assert_eq!(reply[..3], [0, 0, -1], "{reply:?}");
    assert_eq!(snapshot(&mut con, b"tb:far"), before, "nothing written");
}

#[test]
fn tb_takeall_with_maxwait_reserves_in_every_bucket_or_in_none_and_waits_for_the_longest() {
    let server = Server::start();
    let mut con = server.conn();
    // Two drained buckets: 1 token in 100 ms at 10/s, in 500 ms at 2/s.
    drain(&mut con, "{w}:fast", "10", "10");
    drain(&mut con, "{w}:slow", "10", "2");
    let reply = call(
        &mut con,
        &[
            "TB.TAKEALL",
            "{w}:fast",
            "10",
            "10",
            "1",
            "{w}:slow",
            "10",
            "2",
            "1",
            "MAXWAIT",
            "2000",
        ],
    );
    assert_eq!(
        (reply[0], reply[1], reply[4]),
        (1, 0, 1),
        "the slow bucket decides: {reply:?}"
    );
    harness::assert_within("retry_after_ms", reply[2], 400, 500);
    assert!(tokens(&mut con, "{w}:fast") < 0.0 && tokens(&mut con, "{w}:slow") < 0.0);
    assert_eq!(counter(&mut con, "tb_reservations_waited"), 1, "one call");

    // One bucket cannot reserve in time: the call is denied and neither is written.
    let before = [
        snapshot(&mut con, b"{w}:fast"),
        snapshot(&mut con, b"{w}:slow"),
    ];
    let reply = call(
        &mut con,
        &[
            "TB.TAKEALL",
            "{w}:fast",
            "10",
            "10",
            "1",
            "{w}:slow",
            "10",
            "2",
            "4",
            "MAXWAIT",
            "1000",
        ],
    );
    assert_eq!((reply[0], reply[4]), (0, 1), "{reply:?}");
    let after = [
        snapshot(&mut con, b"{w}:fast"),
        snapshot(&mut con, b"{w}:slow"),
    ];
    assert_eq!(after, before, "all or nothing");
}

#[test]
fn maxwait_0_is_a_plain_take() {
    let server = Server::start();
    let mut con = server.conn();
    // On a full bucket: the same reply and the same stored tokens.
    let with = call(
        &mut con,
        &["TB.TAKE", "tb:zero", "10", "1", "3", "MAXWAIT", "0"],
    );
    let plain = call(&mut con, &["TB.TAKE", "tb:plain", "10", "1", "3"]);
    assert_eq!(with, plain);
    assert_eq!(with, [1, 7, 0, 3000]);
    assert_eq!(tokens(&mut con, "tb:zero"), tokens(&mut con, "tb:plain"));
    // On an empty one: denied, nothing written, where a reservation would be allowed.
    drain(&mut con, "tb:empty", "1", "1");
    let before = snapshot(&mut con, b"tb:empty");
    let reply = call(
        &mut con,
        &["TB.TAKE", "tb:empty", "1", "1", "1", "MAXWAIT", "0"],
    );
    assert_eq!(reply[0], 0, "{reply:?}");
    assert_eq!(snapshot(&mut con, b"tb:empty"), before);
    let reply = call(
        &mut con,
        &["TB.TAKE", "tb:empty", "1", "1", "1", "MAXWAIT", "000"],
    );
    assert_eq!(reply[0], 0, "000 is 0 too: {reply:?}");
    let reply = call(
        &mut con,
        &["TB.TAKE", "tb:empty", "1", "1", "1", "MAXWAIT", "10000"],
    );
    assert_eq!(reply[0], 1, "{reply:?}");
}

// ---------------------------------------------------------------------------------------
// Post-paid costs: TB.CHARGE
// ---------------------------------------------------------------------------------------

#[test]
fn a_charge_goes_into_debt_down_to_maxdebt_and_later_takes_wait_until_it_is_repaid() {
    let server = Server::start();
    let mut con = server.conn();
    // 10 tokens, 10 per second: a cost of 25 on a full bucket is 15 more than it holds,
    // and MAXDEBT 5 stops the debt at 5 (500 ms of refill).
    let reply = call(
        &mut con,
        &["TB.CHARGE", "tb:llm", "10", "10", "25", "MAXDEBT", "5"],
    );
    assert_eq!(reply, [1, 0, 500, 1500], "always allowed; repaid in 500 ms");
    assert_eq!(tokens(&mut con, "tb:llm"), -5.0);
    assert_eq!(counter(&mut con, "tb_charges"), 1);
    // INFO counts what was taken (10 held, down to -5), not the 25 asked.
    assert_eq!(tb_field(&mut con, "tb_tokens_charged"), "15");
    let charged_at = harness::stored_last_refill(&mut con, "tb:llm");
    // A take is denied until the debt and its own token are back: 600 ms.
    let (before, reply, after) = timed(&mut con, &["TB.TAKE", "tb:llm", "10", "10", "1"]);
    assert_eq!(reply[..2], [0, 0], "{reply:?}");
    let go = charged_at + 600;
    harness::assert_within("retry_after_ms", reply[2], go - after, go - before + 1);
    wait_for_server_time(&mut con, go + 10);
    let reply = call(&mut con, &["TB.TAKE", "tb:llm", "10", "10", "1"]);
    assert_eq!(reply[0], 1, "repaid: {reply:?}");
}

/// `tb_tokens_charged` counts what was really charged, as `tb_tokens_refunded` counts what was
/// added: 150,000 asked of a full bucket of 10,000 with MAXDEBT 10,000 is 20,000 taken, and a
/// charge on a balance already below its floor takes nothing.
#[test]
fn tb_tokens_charged_counts_what_maxdebt_let_a_charge_take_not_what_was_asked() {
    let server = Server::start();
    let mut con = server.conn();
    call(
        &mut con,
        &[
            "TB.CHARGE",
            "tb:big",
            "10000",
            "0.001",
            "150000",
            "MAXDEBT",
            "10000",
        ],
    );
    assert_eq!(tokens(&mut con, "tb:big"), -10000.0);
    assert_eq!(tb_field(&mut con, "tb_tokens_charged"), "20000");
    call(
        &mut con,
        &["TB.CHARGE", "tb:big", "10000", "0.001", "7", "MAXDEBT", "5"],
    );
    assert_eq!(tb_field(&mut con, "tb_tokens_charged"), "20000");
    call(&mut con, &["TB.CHARGE", "tb:small", "10", "0.001", "3"]);
    assert_eq!(tb_field(&mut con, "tb_tokens_charged"), "20003");
    assert_eq!(counter(&mut con, "tb_charges"), 3);
}

#[test]
fn a_charge_defaults_maxdebt_to_the_capacity_and_never_raises_a_deeper_debt() {
    let server = Server::start();
    let mut con = server.conn();
    // 10 tokens, 1 per 1000 s.
    let reply = call(&mut con, &["TB.CHARGE", "tb:deep", "10", "0.001", "100"]);
    assert_eq!(reply[..3], [1, 0, 10_000_000], "{reply:?}");
    assert_eq!(
        tokens(&mut con, "tb:deep"),
        -10.0,
        "MAXDEBT defaults to the capacity"
    );
    // A smaller MAXDEBT afterwards keeps the debt as it is, never raised.
    let reply = call(
        &mut con,
        &["TB.CHARGE", "tb:deep", "10", "0.001", "1", "MAXDEBT", "2"],
    );
    assert_eq!(reply[0], 1);
    let debt = tokens(&mut con, "tb:deep");
    assert!((-10.0..-9.99).contains(&debt), "{debt}");
    // A fractional MAXDEBT is a limit like any other; MAXDEBT 0 stops at empty.
    let reply = call(
        &mut con,
        &[
            "TB.CHARGE",
            "tb:frac",
            "10",
            "0.001",
            "12",
            "MAXDEBT",
            "0.5",
        ],
    );
    assert_eq!(reply[0], 1);
    assert_eq!(tokens(&mut con, "tb:frac"), -0.5);
    call(
        &mut con,
        &["TB.CHARGE", "tb:floor", "10", "0.001", "12", "MAXDEBT", "0"],
    );
    assert_eq!(tokens(&mut con, "tb:floor"), 0.0);
    // A charge of 0 writes nothing.
    let before = snapshot(&mut con, b"tb:deep");
    call(&mut con, &["TB.CHARGE", "tb:deep", "10", "0.001", "0"]);
    assert_eq!(snapshot(&mut con, b"tb:deep"), before);
    call(&mut con, &["TB.CHARGE", "tb:none", "10", "0.001", "0"]);
    assert!(!exists(&mut con, "tb:none"));
}

#[test]
fn a_bucket_in_debt_denies_even_n_0_until_the_debt_is_repaid() {
    let server = Server::start();
    let mut con = server.conn();
    // 10 tokens, 10 per second, charged 15: a debt of 5, repaid in 500 ms.
    assert_eq!(
        call(&mut con, &["TB.CHARGE", "tb:debt0", "10", "10", "15"])[..3],
        [1, 0, 500]
    );
    let charged_at = harness::stored_last_refill(&mut con, "tb:debt0");
    let before = snapshot(&mut con, b"tb:debt0");
    for args in [
        &["TB.PEEK", "tb:debt0", "10", "10", "0"][..],
        &["TB.TAKE", "tb:debt0", "10", "10", "0"],
        &["TB.TAKEALL", "tb:debt0", "10", "10", "0"],
    ] {
        let (t0, reply, t1) = timed(&mut con, args);
        assert_eq!(reply[..2], [0, 0], "{}: {reply:?}", args.join(" "));
        let repaid = charged_at + 500;
        harness::assert_within("retry_after_ms", reply[2], repaid - t1, repaid - t0 + 1);
    }
    assert_eq!(snapshot(&mut con, b"tb:debt0"), before, "nothing written");
    wait_for_server_time(&mut con, charged_at + 510);
    assert_eq!(
        call(&mut con, &["TB.TAKE", "tb:debt0", "10", "10", "0"])[0],
        1
    );
}

#[test]
fn a_charge_is_allowed_on_a_locked_key_and_keeps_the_lock() {
    let server = Server::start();
    let mut con = server.conn();
    let lock = locked_slow_bucket(&mut con, "tb:locked", "60000");
    let reply = call(&mut con, &["TB.CHARGE", "tb:locked", "1", "0.001", "1"]);
    assert_eq!(reply[0], 1, "the work is done already: {reply:?}");
    assert_eq!(stored_lock(&mut con, "tb:locked"), lock);
    assert!(tokens(&mut con, "tb:locked") < 0.0, "in debt");
    assert!(
        pexpiretime(&mut con, "tb:locked") >= lock.2,
        "the TTL covers the probation"
    );
}

// ---------------------------------------------------------------------------------------
// Replicas, the AOF, a failover
// ---------------------------------------------------------------------------------------

/// Locks, charges and reservations on slow buckets (1 token per 1000 s: nothing expires
/// or refills visibly while a test runs); returns the keys.
fn jobs(con: &mut redis::Connection) -> Vec<&'static str> {
    // A lock: the hash holds all five fields.
    locked_slow_bucket(con, "tb:j:lock", "60000");
    // A lock lifted: only tokens and last_refill are left.
    locked_slow_bucket(con, "tb:j:lifted", "60000");
    assert_eq!(unblock(con, "tb:j:lifted"), 1);
    // A charge into debt, a refund on top of it.
    assert_eq!(
        call(
            con,
            &[
                "TB.CHARGE",
                "tb:j:debt",
                "10",
                "0.001",
                "13.5",
                "MAXDEBT",
                "2.25"
            ]
        )[0],
        1
    );
    assert_eq!(
        call(con, &["TB.REFUND", "tb:j:debt", "10", "0.001", "0.75"])[0],
        1
    );
    // Reservations in a row.
    drain(con, "tb:j:res", "4", "0.001");
    for n in ["1", "0.5"] {
        let reply = call(
            con,
            &[
                "TB.TAKE", "tb:j:res", "4", "0.001", n, "MAXWAIT", "10000000",
            ],
        );
        assert_eq!(reply[0], 1, "{reply:?}");
    }
    // TB.TAKEALL with options: one reservation, one lock from a denial.
    call(
        con,
        &[
            "TB.TAKEALL",
            "{t}:a",
            "4",
            "0.001",
            "1",
            "{t}:b",
            "4",
            "0.001",
            "1",
            "MAXWAIT",
            "10000000",
        ],
    );
    drain(con, "{t}:c", "1", "0.001");
    call(
        con,
        &[
            "TB.TAKEALL",
            "{t}:a",
            "4",
            "0.001",
            "1",
            "{t}:c",
            "1",
            "0.001",
            "1",
            "BLOCK",
            "60000",
            "MAXBLOCK",
            "120000",
        ],
    );
    // TB.THROTTLE writes the same bucket.
    assert_eq!(
        call(con, &["TB.THROTTLE", "tb:j:cell", "9", "1", "1000", "3"])[0],
        0
    );
    vec![
        "tb:j:lock",
        "tb:j:lifted",
        "tb:j:debt",
        "tb:j:res",
        "{t}:a",
        "{t}:b",
        "{t}:c",
        "tb:j:cell",
    ]
}

#[test]
fn a_replica_ends_with_the_masters_fields_and_deadlines_after_locks_charges_and_reservations() {
    let master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    let mut m = master.conn();
    let keys = jobs(&mut m);
    assert!(has_lock_fields(&mut m, "tb:j:lock") && has_lock_fields(&mut m, "{t}:c"));
    assert!(!has_lock_fields(&mut m, "tb:j:lifted"));
    assert!(tokens(&mut m, "tb:j:debt") < 0.0 && tokens(&mut m, "tb:j:res") < 0.0);
    assert_replica_holds_the_same_buckets(&master, &replica, &keys);
    // The replica answers from the lock: TB.PEEK is denied there too.
    let mut r = replica.conn();
    assert_eq!(
        call(&mut r, &["TB.PEEK", "tb:j:lock", "1", "0.001", "0"])[0],
        0
    );
}

#[test]
fn an_aof_reload_ends_with_the_masters_fields_and_deadlines_after_locks_charges_and_reservations() {
    let mut server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    let keys = jobs(&mut con);
    let logged = aof_without_select(&server, &mut con);
    assert_no_tb_command(&logged);
    // A lock starts with one HSET of all five fields, then the PEXPIREAT.
    let fields = hgetall(&mut con, "tb:j:lock");
    let lock_start = logged
        .iter()
        .position(|c| c[0].eq_ignore_ascii_case(b"HSET") && c[1] == b"tb:j:lock" && c.len() == 12)
        .unwrap_or_else(|| panic!("no HSET of five fields for tb:j:lock: {logged:?}"));
    let mut expected = vec![b"HSET".to_vec(), b"tb:j:lock".to_vec()];
    for name in [
        "tokens",
        "last_refill",
        "locked_until",
        "strikes",
        "probation_until",
    ] {
        expected.push(name.as_bytes().to_vec());
        expected.push(fields[name].as_bytes().to_vec());
    }
    let mut hset = logged[lock_start].clone();
    hset[0] = b"HSET".to_vec();
    assert_eq!(hset, expected);
    assert_eq!(
        logged[lock_start + 1],
        argv(&[
            "PEXPIREAT",
            "tb:j:lock",
            &pexpiretime(&mut con, "tb:j:lock").to_string()
        ])
    );
    let before: Vec<_> = keys.iter().map(|key| bucket(&mut con, key)).collect();

    server.restart();
    let mut con = server.conn();
    let after: Vec<_> = keys.iter().map(|key| bucket(&mut con, key)).collect();
    assert_eq!(after, before, "fields and PEXPIRETIME after the reload");
    assert_eq!(
        call(&mut con, &["TB.TAKE", "tb:j:lock", "1", "0.001", "0"])[0],
        0,
        "still locked"
    );
}

#[test]
fn a_lock_survives_a_failover_to_the_promoted_replica() {
    let mut master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    let mut m = master.conn();
    let lock = locked_slow_bucket(&mut m, "tb:fo", "60000");
    // A refund makes the bucket hold a token: only the lock denies it.
    assert_eq!(
        call(&mut m, &["TB.REFUND", "tb:fo", "1", "0.001", "1"])[0],
        1
    );
    wait_for_replica(&master, &replica);
    let held = bucket(&mut m, "tb:fo");
    master.stop();

    let mut r = replica.conn();
    promote(&mut r);
    assert_eq!(
        bucket(&mut r, "tb:fo"),
        held,
        "fields and deadline on the promoted replica"
    );
    let (before, reply, after) = timed(&mut r, &["TB.TAKE", "tb:fo", "1", "0.001", "1"]);
    assert_eq!(
        reply[..2],
        [0, 1],
        "locked there too, with the token in it: {reply:?}"
    );
    harness::assert_within("retry_after_ms", reply[2], lock.0 - after, lock.0 - before);
    assert_eq!(bucket(&mut r, "tb:fo"), held, "the denial wrote nothing");
    // It can be lifted there.
    assert_eq!(unblock(&mut r, "tb:fo"), 1);
    assert_eq!(
        call(&mut r, &["TB.TAKE", "tb:fo", "1", "0.001", "1"])[..2],
        [1, 0]
    );
}

// ---------------------------------------------------------------------------------------
// Bad options
// ---------------------------------------------------------------------------------------

const UNKNOWN: &str = "ERR unknown option (TB.TAKE and TB.TAKEALL take MAXWAIT, BLOCK and MAXBLOCK; TB.CHARGE takes MAXDEBT)";
const MAXWAIT_ERROR: &str =
    "ERR MAXWAIT must be a whole number of ms from 0 to 9007199254740992 (2^53)";
const BLOCK_ERROR: &str =
    "ERR BLOCK must be a whole number of ms from 1 to 9007199254740992 (2^53)";
const MAXBLOCK_ERROR: &str =
    "ERR MAXBLOCK must be a whole number of ms from BLOCK to 9007199254740992 (2^53)";
const MAXBLOCK_WITHOUT_BLOCK: &str = "ERR MAXBLOCK needs BLOCK";
const MAXDEBT_ERROR: &str =
    "ERR MAXDEBT must be a non-negative finite number, at most 9007199254740992 (2^53)";

#[test]
fn each_bad_option_is_refused_with_its_own_error_and_the_key_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    // A bucket in use (6 of 10 left, 1 per 1000 s) and a missing key.
    call(&mut con, &["TB.TAKE", "tb:opt", "10", "0.001", "4"]);
    let before = snapshot(&mut con, b"tb:opt");
    let cases: &[(&[&str], &str)] = &[
        (&["FOO", "1"], UNKNOWN),
        (&["maxwait", "1", "NOPE"], UNKNOWN),
        (&["MAXDEBT", "1"], UNKNOWN),
        (
            &["MAXWAIT", "1", "MAXWAIT", "2"],
            "ERR MAXWAIT is given twice",
        ),
        (&["BLOCK", "1", "block", "2"], "ERR BLOCK is given twice"),
        (
            &["BLOCK", "5", "MAXBLOCK", "9", "maxblock", "9"],
            "ERR MAXBLOCK is given twice",
        ),
        (&["MAXWAIT"], "ERR MAXWAIT needs a value"),
        (&["BLOCK"], "ERR BLOCK needs a value"),
        (&["BLOCK", "10", "MAXBLOCK"], "ERR MAXBLOCK needs a value"),
        (&["MAXWAIT", "-1"], MAXWAIT_ERROR),
        (&["MAXWAIT", "1.5"], MAXWAIT_ERROR),
        (&["MAXWAIT", "1e3"], MAXWAIT_ERROR),
        (&["MAXWAIT", ""], MAXWAIT_ERROR),
        (&["MAXWAIT", "9007199254740993"], MAXWAIT_ERROR),
        (&["BLOCK", "0"], BLOCK_ERROR),
        (&["BLOCK", "-5"], BLOCK_ERROR),
        (&["BLOCK", "2.5"], BLOCK_ERROR),
        (&["BLOCK", "9007199254740993"], BLOCK_ERROR),
        (&["BLOCK", "10", "MAXBLOCK", "9"], MAXBLOCK_ERROR),
        (&["BLOCK", "10", "MAXBLOCK", "0"], MAXBLOCK_ERROR),
        (&["MAXBLOCK", "9", "BLOCK", "10"], MAXBLOCK_ERROR),
        (
            &["BLOCK", "10", "MAXBLOCK", "9007199254740993"],
            MAXBLOCK_ERROR,
        ),
        (&["MAXBLOCK", "100"], MAXBLOCK_WITHOUT_BLOCK),
        (&["MAXWAIT", "5", "MAXBLOCK", "100"], MAXBLOCK_WITHOUT_BLOCK),
    ];
    for (options, message) in cases {
        for key in ["tb:opt", "tb:missing"] {
            let mut args = vec!["TB.TAKE", key, "10", "0.001", "1"];
            args.extend_from_slice(options);
            assert_eq!(error(&mut con, &args), *message, "{}", args.join(" "));
            // TB.TAKEALL's options follow its last group (two groups, one slot).
            let mut all = vec![
                "TB.TAKEALL",
                key,
                "10",
                "0.001",
                "1",
                "{x}:b",
                "1",
                "1",
                "1",
            ];
            if ["FOO", "MAXDEBT"].contains(&options[0]) {
                // Not a keyword of TB.TAKEALL, it would start another group: after a
                // real option, it is refused as unknown.
                all.extend_from_slice(&["MAXWAIT", "1"]);
            }
            all.extend_from_slice(options);
            assert_eq!(error(&mut con, &all), *message, "{}", all.join(" "));
        }
    }
    // The largest values are accepted.
    let reply = call(
        &mut con,
        &[
            "TB.TAKE",
            "tb:big",
            "10",
            "0.001",
            "0",
            "MAXWAIT",
            "9007199254740992",
            "BLOCK",
            "9007199254740992",
            "MAXBLOCK",
            "9007199254740992",
        ],
    );
    assert_eq!(reply[0], 1, "{reply:?}");

    // TB.CHARGE takes MAXDEBT only.
    let charge_cases: &[(&[&str], &str)] = &[
        (&["MAXWAIT", "1"], UNKNOWN),
        (&["BLOCK", "1"], UNKNOWN),
        (&["MAXDEBT", "1", "FOO"], UNKNOWN),
        (
            &["MAXDEBT", "1", "MAXDEBT", "2"],
            "ERR MAXDEBT is given twice",
        ),
        (&["maxdebt"], "ERR MAXDEBT needs a value"),
        (&["MAXDEBT", "-1"], MAXDEBT_ERROR),
        (&["MAXDEBT", "nan"], MAXDEBT_ERROR),
        (&["MAXDEBT", "inf"], MAXDEBT_ERROR),
        (&["MAXDEBT", "1e400"], MAXDEBT_ERROR),
        (&["MAXDEBT", "9007199254740994"], MAXDEBT_ERROR),
        (&["MAXDEBT", "1e16"], MAXDEBT_ERROR),
        (&["MAXDEBT", ""], MAXDEBT_ERROR),
    ];
    for (options, message) in charge_cases {
        for key in ["tb:opt", "tb:missing"] {
            let mut args = vec!["TB.CHARGE", key, "10", "0.001", "1"];
            args.extend_from_slice(options);
            assert_eq!(error(&mut con, &args), *message, "{}", args.join(" "));
        }
    }
    assert_eq!(
        snapshot(&mut con, b"tb:opt"),
        before,
        "the bucket is untouched"
    );
    for key in ["tb:missing", "{x}:b"] {
        assert!(!exists(&mut con, key), "{key} was created");
    }
}

#[test]
fn option_errors_come_after_the_errors_of_capacity_rate_and_n() {
    let server = Server::start();
    let mut con = server.conn();
    for command in ["TB.TAKE", "TB.CHARGE"] {
        let bad = |capacity: &'static str, rate: &'static str, n: &'static str| {
            vec![command, "tb:k", capacity, rate, n, "FOO", "1"]
        };
        assert_eq!(error(&mut con, &bad("0", "1", "1")), CAPACITY_ERROR);
        assert_eq!(error(&mut con, &bad("1", "x", "1")), RATE_ERROR);
        assert_eq!(error(&mut con, &bad("1", "1", "-1")), N_ERROR);
        assert_eq!(error(&mut con, &bad("1", "1", "1")), UNKNOWN);
    }
    // Options are parsed before the key is read: a key of another type gets the option's
    // error; with good options, WRONGTYPE.
    let _: () = redis::cmd("SET")
        .arg("tb:s")
        .arg("x")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        error(&mut con, &["TB.TAKE", "tb:s", "1", "1", "1", "BLOCK", "0"]),
        BLOCK_ERROR
    );
    assert_eq!(
        error(&mut con, &["TB.TAKE", "tb:s", "1", "1", "1", "BLOCK", "5"]),
        WRONGTYPE_ERROR
    );
    assert_eq!(
        error(&mut con, &["TB.CHARGE", "tb:s", "1", "1", "1"]),
        WRONGTYPE_ERROR
    );
}

#[test]
fn a_damaged_lock_field_is_refused_as_a_corrupt_bucket_and_left_as_it_is() {
    let server = Server::start();
    let mut con = server.conn();
    let message =
        "ERR corrupt bucket 'tb:bad': locked_until, strikes and probation_until must be whole numbers";
    for (field, value) in [
        ("locked_until", "soon"),
        ("locked_until", "1.5"),
        ("strikes", "0"),
        ("probation_until", "-1"),
    ] {
        let now = server_time_ms(&mut con);
        harness::hset(
            &mut con,
            "tb:bad",
            &[
                ("tokens", "1"),
                ("last_refill", &now.to_string()),
                ("locked_until", &(now + 1000).to_string()),
                ("strikes", "1"),
                ("probation_until", &(now + 2000).to_string()),
                (field, value),
            ],
        );
        let before = snapshot(&mut con, b"tb:bad");
        for args in [
            &["TB.TAKE", "tb:bad", "1", "1", "1"][..],
            &["TB.PEEK", "tb:bad", "1", "1", "1"],
            &["TB.CHARGE", "tb:bad", "1", "1", "1"],
            &["TB.TAKEALL", "tb:bad", "1", "1", "1"],
        ] {
            assert_eq!(
                error(&mut con, args),
                message,
                "{field} = {value}: {}",
                args.join(" ")
            );
        }
        assert_eq!(snapshot(&mut con, b"tb:bad"), before);
        // TB.UNBLOCK is the way out: it deletes the lock fields whatever they hold.
        assert_eq!(unblock(&mut con, "tb:bad"), 1);
        assert_eq!(call(&mut con, &["TB.TAKE", "tb:bad", "1", "1", "1"])[0], 1);
    }
}

#[test]
fn command_getkeys_of_tb_takeall_leaves_its_options_out() {
    let server = Server::start();
    let mut con = server.conn();
    let keys: Vec<String> = command(&[
        "COMMAND",
        "GETKEYS",
        "TB.TAKEALL",
        "a",
        "1",
        "1",
        "1",
        "b",
        "1",
        "1",
        "1",
        "MAXWAIT",
        "10",
        "BLOCK",
        "5",
        "MAXBLOCK",
        "50",
    ])
    .query(&mut con)
    .expect("COMMAND GETKEYS");
    assert_eq!(keys, ["a", "b"]);
    for args in [
        &[
            "COMMAND", "GETKEYS", "TB.TAKE", "k", "1", "1", "1", "BLOCK", "5",
        ][..],
        &[
            "COMMAND",
            "GETKEYS",
            "TB.CHARGE",
            "k",
            "1",
            "1",
            "1",
            "MAXDEBT",
            "5",
        ],
        &["COMMAND", "GETKEYS", "TB.UNBLOCK", "k"],
        &["COMMAND", "GETKEYS", "TB.THROTTLE", "k", "1", "1", "1", "1"],
    ] {
        let keys: Vec<String> = command(args).query(&mut con).expect("COMMAND GETKEYS");
        assert_eq!(keys, ["k"], "{}", args.join(" "));
    }
}

// ---------------------------------------------------------------------------------------
// A cluster
// ---------------------------------------------------------------------------------------

/// How long the cluster may take to agree on something.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
const SLOT_RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// Three masters owning every slot (assembled as tests/it/topology/cluster.rs does, without replicas).
struct Cluster {
    nodes: Vec<Server>,
}

impl Cluster {
    fn start() -> Cluster {
        let nodes: Vec<(Server, u16)> = (0..3).map(|_| cluster_node()).collect();
        for (i, ((node, _), (first, last))) in nodes.iter().zip(SLOT_RANGES).enumerate() {
            let mut con = node.conn();
            ok(
                &mut con,
                &["CLUSTER", "SET-CONFIG-EPOCH", &(i + 1).to_string()],
            );
            ok(
                &mut con,
                &[
                    "CLUSTER",
                    "ADDSLOTSRANGE",
                    &first.to_string(),
                    &last.to_string(),
                ],
            );
        }
        let mut first = nodes[0].0.conn();
        for (node, bus) in &nodes[1..] {
            ok(
                &mut first,
                &[
                    "CLUSTER",
                    "MEET",
                    "127.0.0.1",
                    &node.port.to_string(),
                    &bus.to_string(),
                ],
            );
        }
        let cluster = Cluster {
            nodes: nodes.into_iter().map(|(node, _)| node).collect(),
        };
        cluster.wait_converged();
        cluster
    }

    /// Every node says `cluster_state:ok` and serves the same three slot ranges.
    fn wait_converged(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let maps: Vec<Option<Vec<(u16, u16, u16)>>> = self
                .nodes
                .iter()
                .map(|node| {
                    let mut con = node.conn();
                    let info: String = command(&["CLUSTER", "INFO"]).query(&mut con).ok()?;
                    info.contains("cluster_state:ok")
                        .then(|| slot_map(&mut con))
                })
                .collect();
            if maps
                .iter()
                .all(|m| m.as_ref().is_some_and(|m| m.len() == 3))
                && maps.windows(2).all(|w| w[0] == w[1])
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not converge: {maps:?}"
            );
            sleep(Duration::from_millis(50));
        }
    }

    fn client(&self) -> ClusterConnection {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect();
        let con = ClusterClient::new(seeds)
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection");
        con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        con
    }

    fn node(&self, port: u16) -> &Server {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("a node on that port")
    }

    /// The port of the master owning `key`'s slot.
    fn owner_of(&self, key: &str) -> u16 {
        let mut con = self.nodes[0].conn();
        let slot: u16 = command(&["CLUSTER", "KEYSLOT", key])
            .query(&mut con)
            .unwrap();
        slot_map(&mut con)
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|r| r.2)
            .expect("every slot is served")
    }

    /// A key made from `prefix` whose slot the node on `port` owns.
    fn key_on(&self, port: u16, prefix: &str) -> String {
        (0..100_000)
            .map(|i| format!("{prefix}-{i}"))
            .find(|key| self.owner_of(key) == port)
            .expect("a key for that node")
    }

    fn masters(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        ports.sort_unstable();
        ports
    }
}

/// A cluster node on a free bus port (retried if another process took it meanwhile).
fn cluster_node() -> (Server, u16) {
    for attempt in 1..=3 {
        let bus = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        match std::panic::catch_unwind(|| {
            start_cluster_node(bus, &["--cluster-node-timeout", "5000"])
        }) {
            Ok(node) => return (node, bus),
            Err(panic) if attempt == 3 => std::panic::resume_unwind(panic),
            Err(_) => eprintln!("cluster node with bus port {bus} did not start; retrying"),
        }
    }
    unreachable!()
}

fn ok(con: &mut redis::Connection, args: &[&str]) {
    let reply: String = command(args)
        .query(con)
        .unwrap_or_else(|e| panic!("{}: {e}", args.join(" ")));
    assert_eq!(reply, "OK", "{}", args.join(" "));
}

/// `CLUSTER SLOTS` as sorted `(first, last, master port)`.
fn slot_map(con: &mut redis::Connection) -> Vec<(u16, u16, u16)> {
    let ranges: Vec<Value> = command(&["CLUSTER", "SLOTS"])
        .query(con)
        .expect("CLUSTER SLOTS");
    let mut map: Vec<(u16, u16, u16)> = ranges
        .iter()
        .map(|range| {
            let Value::Array(parts) = range else {
                panic!("CLUSTER SLOTS range: {range:?}")
            };
            let Value::Array(master) = &parts[2] else {
                panic!("CLUSTER SLOTS master: {:?}", parts[2])
            };
            (
                redis::from_redis_value(&parts[0]).expect("first slot"),
                redis::from_redis_value(&parts[1]).expect("last slot"),
                redis::from_redis_value(&master[1]).expect("master port"),
            )
        })
        .collect();
    map.sort_unstable();
    map
}

#[test]
fn the_new_commands_and_options_are_routed_to_the_node_owning_their_keys() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let masters = cluster.masters();
    for port in &masters {
        let key = cluster.key_on(*port, "job");
        let tag = format!("{{{key}}}");
        let (a, b) = (format!("{tag}:a"), format!("{tag}:b"));
        let calls: Vec<Vec<&str>> = vec![
            vec![
                "TB.TAKE", &key, "10", "0.001", "4", "MAXWAIT", "1000", "BLOCK", "60000",
                "MAXBLOCK", "120000",
            ],
            vec!["TB.CHARGE", &key, "10", "0.001", "2", "MAXDEBT", "5"],
            vec!["TB.THROTTLE", &key, "9", "1", "1000", "1"],
            vec![
                "TB.TAKEALL",
                &a,
                "10",
                "0.001",
                "1",
                &b,
                "10",
                "0.001",
                "1",
                "MAXWAIT",
                "5",
                "BLOCK",
                "60000",
                "MAXBLOCK",
                "120000",
            ],
        ];
        for args in &calls {
            assert_eq!(
                call(&mut client, args)[0],
                if args[0] == "TB.THROTTLE" { 0 } else { 1 },
                "{}",
                args.join(" ")
            );
        }
        // A denial with BLOCK through the cluster client locks the key on its owner.
        let reply = call(
            &mut client,
            &["TB.TAKE", &key, "10", "0.001", "10", "BLOCK", "60000"],
        );
        assert_eq!(reply[0], 0);
        let mut owner = cluster.node(*port).conn();
        assert_eq!(stored_lock(&mut owner, &key).1, 1);
        assert!(tokens(&mut owner, &key) > 0.0 && exists(&mut owner, &a) && exists(&mut owner, &b));
        assert_eq!(
            unblock(&mut client, &key),
            1,
            "TB.UNBLOCK reaches the owner"
        );
        assert!(!has_lock_fields(&mut owner, &key));

        // Every other node redirects each of them to the owner.
        let slot: u16 = command(&["CLUSTER", "KEYSLOT", &key])
            .query(&mut owner)
            .unwrap();
        let moved = format!("MOVED {slot} 127.0.0.1:{port}");
        for other in masters.iter().filter(|p| *p != port) {
            let mut con = cluster.node(*other).conn();
            for args in calls
                .iter()
                .map(Vec::as_slice)
                .chain([&["TB.UNBLOCK", key.as_str()][..]])
            {
                assert_eq!(
                    error(&mut con, args),
                    moved,
                    "{} on {other}",
                    args.join(" ")
                );
            }
            let count: i64 = command(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
                .query(&mut con)
                .unwrap();
            assert_eq!(count, 0, "node {other} holds nothing of this slot");
        }
    }
}

#[test]
fn tb_takeall_with_options_across_slots_is_crossslot_and_takes_nothing() {
    let cluster = Cluster::start();
    let masters = cluster.masters();
    let a = cluster.key_on(masters[0], "untagged");
    let b = cluster.key_on(masters[1], "untagged");
    let mut con = cluster.node(masters[0]).conn();
    for options in [
        &["MAXWAIT", "1000"][..],
        &["BLOCK", "1000", "MAXBLOCK", "2000"],
    ] {
        let mut args = vec!["TB.TAKEALL", &a, "10", "0.001", "1", &b, "10", "0.001", "1"];
        args.extend_from_slice(options);
        let text = error(&mut con, &args);
        assert!(text.starts_with("CROSSSLOT"), "{}: {text}", args.join(" "));
        let mut client = cluster.client();
        let text = error(&mut client, &args);
        assert!(
            text.starts_with("CROSSSLOT"),
            "through the cluster client: {text}"
        );
    }
    let mut owner_b = cluster.node(masters[1]).conn();
    assert!(
        !exists(&mut con, &a) && !exists(&mut owner_b, &b),
        "nothing was taken"
    );
}

// ---------------------------------------------------------------------------------------
// Shadow mode
// ---------------------------------------------------------------------------------------

/// docs/operations.md#shadow-mode: "nothing is written" for a denial that shadow mode
/// reports as allowed; with `BLOCK`, that includes the lock.
#[test]
fn in_shadow_mode_a_denial_with_block_is_reported_allowed_and_writes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    ok(&mut con, &["CONFIG", "SET", "tb.shadow-mode", "yes"]);
    drain(&mut con, "tb:shadow", "1", "0.001");
    let before = snapshot(&mut con, b"tb:shadow");
    let reply = call(
        &mut con,
        &["TB.TAKE", "tb:shadow", "1", "0.001", "1", "BLOCK", "60000"],
    );
    assert_eq!(reply[0], 1, "reported allowed: {reply:?}");
    assert_eq!(counter(&mut con, "tb_shadow_denied"), 1);
    assert!(
        !has_lock_fields(&mut con, "tb:shadow"),
        "shadow mode stored a lock: {:?}",
        hgetall(&mut con, "tb:shadow")
    );
    assert_eq!(snapshot(&mut con, b"tb:shadow"), before, "nothing written");
}
