//! TB.BTAKE: callers that must wait queue in the server, first come first served, and are
//! answered when their turn comes and the bucket holds their n, or when their timeout passes.
//!
//! Each waiter is a `RawClient`: its command is sent, and its reply looked for later. Rates are
//! either fast and measured (the exact-time tests) or so slow (one token per 1000 s) that only
//! the test's own TB.REFUND calls can supply tokens, which makes every order deterministic.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::harness::*;

/// One token per 1000 s: nothing refills during a test.
const SLOW: &str = "0.001";

fn tb_field(con: &mut redis::Connection, field: &str) -> i64 {
    info_field(con, "tb", field)
        .unwrap_or_else(|| panic!("INFO tb {field}"))
        .parse::<f64>()
        .unwrap_or_else(|e| panic!("{field}: {e}")) as i64
}

/// Sends TB.BTAKE on a fresh connection and returns it, its reply still to come.
fn btake(server: &Server, args: &[&str]) -> RawClient {
    let mut client = RawClient::connect(server);
    let mut all = vec!["TB.BTAKE"];
    all.extend_from_slice(args);
    client.send(&all);
    client
}

/// A drained bucket: `capacity` taken at once.
const QUICK: Duration = Duration::from_millis(150);

#[test]
fn a_btake_that_can_be_granted_at_once_is_exactly_tb_take() {
    let server = Server::start();
    let mut con = server.conn();
    let mut waiter = btake(&server, &["a", "10", SLOW, "3", "0"]);
    let reply = waiter.reply().ints();
    let plain = take(&mut con, "b", "10", SLOW, "3");
    assert_eq!(reply, plain);
    assert_eq!(
        hgetall(&mut con, "a")["tokens"],
        hgetall(&mut con, "b")["tokens"]
    );
    assert_eq!(tb_field(&mut con, "tb_waits_started"), 0, "nobody waited");
}

#[test]
fn a_btake_above_the_capacity_is_answered_at_once_and_never_waits() {
    let server = Server::start();
    let mut waiter = btake(&server, &["a", "5", SLOW, "6", "0"]);
    assert_eq!(waiter.reply().ints(), vec![0, 5, -1, 0]);
}

#[test]
fn a_waiter_is_served_when_its_tokens_exist_and_not_before() {
    let server = Server::start();
    let mut con = server.conn();
    // Drained at 100 tokens per second: 5 tokens exist 50 ms after the drain. A large
    // capacity keeps the bucket (and its key) far from full while the test reads it.
    drain(&mut con, "k", "1000", "100");
    let drained_at = stored_last_refill(&mut con, "k");
    let started = Instant::now();
    let mut waiter = btake(&server, &["k", "1000", "100", "5", "0"]);
    let reply = waiter.reply().ints();
    let elapsed = started.elapsed();
    // Served with TB.TAKE's reply (on a slow machine the call may arrive after its tokens
    // exist, and is then granted at once, with more left).
    assert_eq!((reply[0], reply[2]), (1, 0), "{reply:?}");
    assert!(
        reply[3] > 0 && reply[3] <= 10_000,
        "time to full: {reply:?}"
    );
    let served_at = stored_last_refill(&mut con, "k");
    assert!(
        served_at >= drained_at + 50,
        "served at +{} ms, before its tokens existed",
        served_at - drained_at
    );
    // Generous: how late a grant comes is measured by `make bench`, not asserted here.
    assert!(
        served_at <= drained_at + 5_000,
        "served only at +{} ms",
        served_at - drained_at
    );
    assert!(elapsed < Duration::from_secs(10), "{elapsed:?}");
}

#[test]
fn waiters_are_served_in_arrival_order() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "1", SLOW);
    let mut waiters: Vec<RawClient> = Vec::new();
    for index in 0..50 {
        waiters.push(btake(&server, &["k", "1", SLOW, "1", "0"]));
        wait_for_waiting(&mut con, index + 1);
    }
    // One token at a time: exactly the next in line is served, nobody else.
    for index in 0..waiters.len() {
        refund(&mut con, "k", "1", SLOW, "1");
        let reply = waiters[index]
            .reply_within(Duration::from_secs(5))
            .unwrap_or_else(|| panic!("waiter {index} not served"));
        assert_eq!(reply.ints()[..3], [1, 0, 0], "waiter {index}");
        if let Some(next) = waiters.get_mut(index + 1) {
            assert_eq!(
                next.reply_within(Duration::from_millis(20)),
                None,
                "{index} overtaken"
            );
        }
    }
    assert_eq!(tb_field(&mut con, "tb_waits_served"), 50);
    assert_eq!(tb_field(&mut con, "tb_waiting"), 0);
}

#[test]
fn a_waiter_whose_timeout_passes_gets_a_denial_and_takes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "3", SLOW);
    let before = snapshot(&mut con, b"k");
    let started = Instant::now();
    let mut waiter = btake(&server, &["k", "3", SLOW, "2", "200"]);
    let reply = waiter.reply().ints();
    assert!(
        started.elapsed() >= Duration::from_millis(190),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(reply[..2], [0, 0], "{reply:?}");
    assert!(reply[2] > 0, "a wait: {reply:?}");
    assert_eq!(snapshot(&mut con, b"k"), before, "nothing written");
    assert_eq!(tb_field(&mut con, "tb_waits_timed_out"), 1);
    assert_eq!(tb_field(&mut con, "tb_waiting"), 0);
}

#[test]
fn a_refund_wakes_the_waiter_at_once() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "3", SLOW);
    let mut waiter = btake(&server, &["k", "3", SLOW, "2", "0"]);
    wait_for_waiting(&mut con, 1);
    refund(&mut con, "k", "3", SLOW, "1");
    assert_eq!(waiter.reply_within(QUICK), None, "1 token is not 2");
    refund(&mut con, "k", "3", SLOW, "1");
    assert_eq!(waiter.reply().ints()[..3], [1, 0, 0]);
}

#[test]
fn deleting_the_bucket_serves_the_waiter_from_a_full_one() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "3", SLOW);
    let mut waiter = btake(&server, &["k", "3", SLOW, "2", "0"]);
    wait_for_waiting(&mut con, 1);
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).expect("DEL");
    assert_eq!(
        waiter.reply().ints()[..3],
        [1, 1, 0],
        "a missing bucket is full"
    );
}

#[test]
fn an_expiring_bucket_serves_the_waiter() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "3", SLOW);
    let mut waiter = btake(&server, &["k", "3", SLOW, "2", "0"]);
    wait_for_waiting(&mut con, 1);
    let _: i64 = redis::cmd("PEXPIRE")
        .arg("k")
        .arg(50)
        .query(&mut con)
        .expect("PEXPIRE");
    let reply = waiter
        .reply_within(Duration::from_secs(5))
        .expect("served once the key expired");
    assert_eq!(reply.ints()[..3], [1, 1, 0]);
}

#[test]
fn a_hand_written_hset_re_evaluates_the_queue() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "3", SLOW);
    let mut waiter = btake(&server, &["k", "3", SLOW, "2", "0"]);
    wait_for_waiting(&mut con, 1);
    let now = server_time_ms(&mut con).to_string();
    seed_bucket(&mut con, "k", "3", now);
    assert_eq!(waiter.reply().ints()[..3], [1, 1, 0]);
}

#[test]
fn a_bucket_overwritten_by_another_type_fails_its_waiters() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "3", SLOW);
    let mut waiter = btake(&server, &["k", "3", SLOW, "2", "0"]);
    wait_for_waiting(&mut con, 1);
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg("x")
        .query(&mut con)
        .expect("SET");
    assert_eq!(
        waiter.reply(),
        Resp::Error(
            "ERR tb: the bucket was overwritten with a value that is not a bucket while waiting"
                .into()
        )
    );
}

#[test]
fn a_disconnected_waiter_leaves_the_queue_and_the_next_moves_up() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "1", SLOW);
    let first = btake(&server, &["k", "1", SLOW, "1", "0"]);
    wait_for_waiting(&mut con, 1);
    let mut second = btake(&server, &["k", "1", SLOW, "1", "0"]);
    wait_for_waiting(&mut con, 2);
    drop(first);
    wait_for_waiting(&mut con, 1);
    refund(&mut con, "k", "1", SLOW, "1");
    assert_eq!(second.reply().ints()[..3], [1, 0, 0]);
    assert_eq!(tb_field(&mut con, "tb_waits_abandoned"), 1);
    assert_eq!(stored_tokens(&mut con, "k"), 0.0, "one token, taken once");
}

#[test]
fn a_killed_waiter_takes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    // Capacity 2, so the refunded bucket below is not full (a full one expires at once).
    drain(&mut con, "k", "2", SLOW);
    let mut waiter = btake(&server, &["k", "2", SLOW, "1", "0"]);
    wait_for_waiting(&mut con, 1);
    let killed: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query(&mut con)
        .expect("CLIENT KILL");
    assert_eq!(killed, 1);
    assert!(waiter.closed_within(Duration::from_secs(2)));
    wait_for_waiting(&mut con, 0);
    refund(&mut con, "k", "2", SLOW, "1");
    // 1, plus what refilled meanwhile at one token per 1000 s.
    let tokens = stored_tokens(&mut con, "k");
    assert!(
        (1.0..1.01).contains(&tokens),
        "the refunded token is still there: {tokens}"
    );
}

#[test]
fn client_unblock_ends_a_wait_with_a_denial() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "1", SLOW);
    let mut waiter = RawClient::connect(&server);
    waiter.send(&["CLIENT", "ID"]);
    let Resp::Other(id) = waiter.reply() else {
        panic!("CLIENT ID");
    };
    waiter.send(&["TB.BTAKE", "k", "1", SLOW, "1", "0"]);
    wait_for_waiting(&mut con, 1);
    let unblocked: i64 = redis::cmd("CLIENT")
        .arg("UNBLOCK")
        .arg(id.trim())
        .query(&mut con)
        .expect("CLIENT UNBLOCK");
    assert_eq!(unblocked, 1);
    assert_eq!(waiter.reply().ints()[..2], [0, 0]);
    assert_eq!(tb_field(&mut con, "tb_waiting"), 0);
}

#[test]
fn inside_multi_and_scripts_btake_behaves_as_tb_take() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "1", SLOW);
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("TB.BTAKE")
        .arg(&["k", "1", SLOW, "1", "0"]);
    let (reply,): (Vec<i64>,) = pipe.query(&mut con).expect("MULTI/EXEC");
    assert_eq!(reply[..2], [0, 0], "denied at once");
    let script: Vec<i64> = redis::cmd("EVAL")
        .arg("return redis.call('TB.BTAKE', KEYS[1], 1, ARGV[1], 1, 0)")
        .arg(1)
        .arg("k")
        .arg(SLOW)
        .query(&mut con)
        .expect("EVAL");
    assert_eq!(script[..2], [0, 0]);
    assert_eq!(tb_field(&mut con, "tb_waits_started"), 0);
}

#[test]
fn a_flood_of_tb_take_cannot_starve_a_waiter() {
    let server = Server::start();
    let mut con = server.conn();
    // 10 per second; the waiter wants 5 (half a second), the flood 1 at a time, as fast
    // as it can. Capacity 1000 keeps the key far from full (and from expiring).
    drain(&mut con, "k", "1000", "10");
    let mut waiter = btake(&server, &["k", "1000", "10", "5", "0"]);
    wait_for_waiting(&mut con, 1);
    let started = Instant::now();
    let mut flood_granted = 0;
    let mut served = None;
    while started.elapsed() < Duration::from_secs(3) {
        flood_granted += take(&mut con, "k", "1000", "10", "1")[0];
        if let Some(reply) = waiter.reply_within(Duration::ZERO) {
            served = Some((reply.ints(), started.elapsed()));
            break;
        }
    }
    let (reply, after) = served.expect("the waiter was starved");
    assert_eq!(reply[..3], [1, 0, 0]);
    assert_eq!(
        flood_granted, 0,
        "the flood took tokens the waiter was owed"
    );
    assert!(after < Duration::from_secs(3), "{after:?}");
}

#[test]
fn tb_take_on_a_key_with_waiters_is_denied_counting_the_queue_ahead() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "10", "1");
    let _waiter = btake(&server, &["k", "10", "1", "4", "0"]);
    wait_for_waiting(&mut con, 1);
    // 4 for the waiter, then 2 for this call: about 6 s at 1 per second.
    let reply = take(&mut con, "k", "10", "1", "2");
    assert_eq!(reply[0], 0);
    assert!((5_000..=6_000).contains(&reply[2]), "{reply:?}");
    let peeked = peek(&mut con, "k", "10", "1", "2");
    assert_eq!(peeked[0], 0, "TB.PEEK answers as TB.TAKE would");
    let all: Vec<i64> = redis::cmd("TB.TAKEALL")
        .arg(&["k", "10", "1", "1"])
        .query(&mut con)
        .expect("TB.TAKEALL");
    assert_eq!(all[0], 0, "TB.TAKEALL too");
}

#[test]
fn each_waiter_is_judged_with_its_own_capacity_and_rate_in_queue_order() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "4", SLOW);
    // The head wants 3 of a capacity-4 bucket, the next 1 of a capacity-2 one.
    let mut head = btake(&server, &["k", "4", SLOW, "3", "0"]);
    wait_for_waiting(&mut con, 1);
    let mut next = btake(&server, &["k", "2", SLOW, "1", "0"]);
    wait_for_waiting(&mut con, 2);
    refund(&mut con, "k", "4", SLOW, "2");
    assert_eq!(next.reply_within(QUICK), None, "no overtaking the head");
    assert_eq!(head.reply_within(Duration::from_millis(20)), None, "2 < 3");
    refund(&mut con, "k", "4", SLOW, "2");
    assert_eq!(head.reply().ints()[..3], [1, 1, 0]);
    assert_eq!(next.reply().ints()[..3], [1, 0, 0]);
}

#[test]
fn tb_max_waiters_bounds_each_queue() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "tb.max-waiters", "2"])
        .query(&mut con)
        .expect("CONFIG SET");
    drain(&mut con, "k", "1", SLOW);
    let _a = btake(&server, &["k", "1", SLOW, "1", "0"]);
    let _b = btake(&server, &["k", "1", SLOW, "1", "0"]);
    wait_for_waiting(&mut con, 2);
    let mut third = btake(&server, &["k", "1", SLOW, "1", "0"]);
    assert_eq!(
        third.reply(),
        Resp::Error("ERR tb: too many clients wait on this key (see tb.max-waiters)".into())
    );
    // Another key has its own queue.
    drain(&mut con, "other", "1", SLOW);
    let _c = btake(&server, &["other", "1", SLOW, "1", "0"]);
    wait_for_waiting(&mut con, 3);
}

#[test]
fn module_unload_is_refused_while_clients_wait() {
    let server = Server::start_with(&["--enable-module-command", "yes"]);
    let mut con = server.conn();
    drain(&mut con, "k", "1", SLOW);
    let _waiter = btake(&server, &["k", "1", SLOW, "1", "0"]);
    wait_for_waiting(&mut con, 1);
    let err = redis::cmd("MODULE")
        .arg(&["UNLOAD", "tb"])
        .query::<redis::Value>(&mut con)
        .expect_err("unload with a waiter");
    let text = error_text(&err);
    assert!(text.starts_with("ERR Error unloading module"), "{text}");
    assert!(ping(&mut con));
    refund(&mut con, "k", "1", SLOW, "1");
    wait_for_waiting(&mut con, 0);
}

#[test]
fn shadow_mode_answers_a_would_be_wait_at_once_as_allowed() {
    let server = Server::start_with(&["--tb.shadow-mode", "yes"]);
    let mut con = server.conn();
    drain(&mut con, "k", "1", SLOW);
    let mut waiter = btake(&server, &["k", "1", SLOW, "1", "0"]);
    let reply = waiter
        .reply_within(Duration::from_secs(2))
        .expect("at once")
        .ints();
    assert_eq!(reply[..2], [1, 0]);
    assert!(
        reply[2] > 0,
        "retry_after_ms still says how long: {reply:?}"
    );
    assert_eq!(tb_field(&mut con, "tb_shadow_denied"), 1);
    assert_eq!(tb_field(&mut con, "tb_waits_started"), 0);
}

#[test]
fn bad_arguments_are_refused_in_order_before_anything_waits() {
    let server = Server::start();
    let mut con = server.conn();
    for (args, error) in [
        (
            &["k", "x", "1", "1", "0"][..],
            "ERR capacity must be a positive finite number",
        ),
        (
            &["k", "1", "1", "1", "-1"][..],
            "ERR timeout_ms must be a non-negative finite number of ms, at most 2^53",
        ),
        (
            &["k", "1", "1", "1", "soon"][..],
            "ERR timeout_ms must be a non-negative finite number of ms, at most 2^53",
        ),
        (
            &["k", "1", "1", "1"][..],
            "ERR wrong number of arguments for 'tb.btake' command",
        ),
    ] {
        let mut all: Vec<&[u8]> = vec![b"TB.BTAKE"];
        all.extend(args.iter().map(|a| a.as_bytes()));
        assert_eq!(expect_error(&mut con, &all), error, "{args:?}");
    }
    assert!(!exists(&mut con, "k"));
}

#[test]
fn replicas_and_the_aof_hold_the_masters_buckets_after_a_run_with_waiters() {
    let master = Server::start_with(AOF_ARGS);
    let replica = start_replica_of(&master);
    let mut con = master.conn();
    // Capacity 1000: the bucket stays far from full (and its key from expiring) while the
    // master and the replica are compared.
    drain(&mut con, "k", "1000", "50");
    let mut waiters: Vec<RawClient> = (0..6)
        .map(|_| btake(&master, &["k", "1000", "50", "1", "0"]))
        .collect();
    for (index, waiter) in waiters.iter_mut().enumerate() {
        assert_eq!(waiter.reply().ints()[0], 1, "waiter {index}");
    }
    wait_for_replica(&master, &replica);
    let mut rcon = replica.conn();
    assert_eq!(hgetall(&mut rcon, "k"), hgetall(&mut con, "k"));
    assert_eq!(pexpiretime(&mut rcon, "k"), pexpiretime(&mut con, "k"));
    let aof = aof_commands(&master.dir);
    let hsets: Vec<&Vec<Vec<u8>>> = aof
        .iter()
        .filter(|c| {
            c.first()
                .is_some_and(|name| name.eq_ignore_ascii_case(b"HSET"))
        })
        .collect();
    // One HSET for the drain, then one per serving pass: a pass that finds tokens for several
    // waiters (a slow server, valgrind) serves them all and writes once.
    assert!(
        (2..=7).contains(&hsets.len()),
        "the drain and the served waiters, as 2 to 7 HSETs: {}",
        hsets.len()
    );
    let last_written: BTreeMap<String, String> = hsets
        .last()
        .map(|hset| {
            hset.get(2..)
                .unwrap_or_default()
                .chunks(2)
                .map(|pair| {
                    let text = |i: usize| String::from_utf8_lossy(&pair[i]).into_owned();
                    (text(0), text(1))
                })
                .collect()
        })
        .unwrap_or_default();
    assert_eq!(
        last_written,
        hgetall(&mut con, "k"),
        "the AOF's last HSET is the master's bucket"
    );
    assert!(
        !aof.iter().any(|c| c
            .first()
            .is_some_and(|name| name.eq_ignore_ascii_case(b"TB.BTAKE"))),
        "the command itself is never propagated"
    );
}

#[test]
fn a_master_turning_replica_ends_every_wait_with_an_error() {
    let other = Server::start();
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "1", SLOW);
    let mut waiter = btake(&server, &["k", "1", SLOW, "1", "0"]);
    turn_replica_under_waiter(&server, &other, &mut waiter);
}

#[test]
fn command_info_declares_a_blocking_write_with_one_key() {
    let server = Server::start();
    let mut con = server.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg(&["GETKEYS", "TB.BTAKE", "rl:1", "1", "1", "1", "0"])
        .query(&mut con)
        .expect("COMMAND GETKEYS");
    assert_eq!(keys, ["rl:1"]);
    let info: redis::Value = redis::cmd("COMMAND")
        .arg(&["INFO", "tb.btake"])
        .query(&mut con)
        .expect("COMMAND INFO");
    let text = format!("{info:?}");
    for flag in ["write", "denyoom", "blocking"] {
        assert!(text.contains(flag), "{flag} in {text}");
    }
}

#[test]
fn flushall_serves_the_waiters_of_every_bucket_it_removed() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "3", SLOW);
    let mut waiter = btake(&server, &["k", "3", SLOW, "2", "0"]);
    wait_for_waiting(&mut con, 1);
    let _: () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");
    assert_eq!(waiter.reply().ints()[..3], [1, 1, 0]);
}

#[test]
fn after_module_unload_and_load_writes_still_wake_waiters() {
    let server = Server::start_with(&["--enable-module-command", "yes"]);
    let mut con = server.conn();
    // A first wait subscribes this load to keyspace events.
    drain(&mut con, "k", "1", SLOW);
    let mut first = btake(&server, &["k", "1", SLOW, "1", "0"]);
    wait_for_waiting(&mut con, 1);
    refund(&mut con, "k", "1", SLOW, "1");
    assert_eq!(first.reply().ints()[0], 1);
    // Unload may be refused while a timer is still pending: retry briefly.
    wait_until("MODULE UNLOAD", Duration::from_secs(5), || {
        redis::cmd("MODULE")
            .arg(&["UNLOAD", "tb"])
            .query::<()>(&mut con)
            .is_ok()
    });
    let path = module_path().display().to_string();
    let _: () = redis::cmd("MODULE")
        .arg(&["LOAD", &path])
        .query(&mut con)
        .expect("MODULE LOAD");
    drain(&mut con, "k2", "1", SLOW);
    let mut second = btake(&server, &["k2", "1", SLOW, "1", "0"]);
    wait_for_waiting(&mut con, 1);
    refund(&mut con, "k2", "1", SLOW, "1");
    let reply = second
        .reply_within(Duration::from_secs(5))
        .expect("the refund woke the waiter");
    assert_eq!(reply.ints()[0], 1);
}
