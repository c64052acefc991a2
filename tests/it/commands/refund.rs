//! TB.REFUND against a real server: giving tokens back.
//!
//! What is checked, each on its own server: refill first, then add, capped at capacity; a
//! refund into a missing (full) bucket or of 0 tokens writes nothing; the TTL moves to the new
//! time-to-full; errors are TB.TAKE's; replication (a real replica), the AOF and a restart.
//!
//! Timing: buckets use slow rates (a token per 100 s or slower) unless a test needs a refill,
//! and time-dependent figures are asserted as ranges bounded by the server's own clock.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::harness::*;

fn refund_cmd(key: &str, capacity: &str, rate: &str, n: &str) -> redis::Cmd {
    tb_cmd("TB.REFUND", key, capacity, rate, n)
}

// --- Arithmetic ----------------------------------------------------------------------------------

#[test]
fn refund_refills_first_then_adds() {
    let server = Server::start();
    let mut con = server.conn();
    // 2 tokens written 300 s ago at 1 token per 100 s: 5 available now, 8 after giving 3
    // back (a refund that skipped the refill would leave 5). The slow rate leaves 200 s
    // before the cap, however slow the machine.
    let written_ms = server_time_ms(&mut con) - 300_000;
    seed_bucket(&mut con, "tb:r", "2", written_ms);

    let reply = refund(&mut con, "tb:r", "10", "0.01", "3");
    let after_ms = server_time_ms(&mut con);

    let now_ms = stored_last_refill(&mut con, "tb:r");
    assert_within("last_refill", now_ms, written_ms + 300_000, after_ms);
    let since_ms = now_ms - written_ms; // 300_000 and a few
    let tokens = stored_tokens(&mut con, "tb:r");
    assert_eq!(
        tokens,
        2.0 + since_ms as f64 / 1000.0 * 0.01 + 3.0,
        "stored tokens"
    );
    assert_eq!(&reply[..3], &[1, tokens.floor() as i64, 0], "{reply:?}");
    // Full again after the fewest whole ms w with tokens + w / 1000 * rate >= capacity,
    // computed the way the module does.
    let guess = ((10.0 - tokens) / 0.01 * 1000.0).ceil() as i64;
    let full_ms = (guess - 2..)
        .find(|w| tokens + *w as f64 / 1000.0 * 0.01 >= 10.0)
        .expect("a wait that fills the bucket");
    assert_eq!(reply[3], full_ms, "{reply:?}");
}

#[test]
fn refund_is_capped_at_capacity() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "tb:r", "10", "0.001", "3"); // 7 left

    // In one transaction, so the bucket is read before its 1 ms TTL runs out.
    let (reply, fields, deadline_ms): (Vec<i64>, BTreeMap<String, String>, i64) = redis::pipe()
        .atomic()
        .add_command(refund_cmd("tb:r", "10", "0.001", "5"))
        .cmd("HGETALL")
        .arg("tb:r")
        .cmd("PEXPIRETIME")
        .arg("tb:r")
        .query(&mut con)
        .expect("MULTI TB.REFUND HGETALL PEXPIRETIME EXEC");

    assert_eq!(reply, vec![1, 10, 0, 0]);
    assert_eq!(fields["tokens"], "10");
    // Full again at once: the deadline is the earliest possible, 1 ms after the write.
    let now_ms: i64 = fields["last_refill"].parse().expect("last_refill");
    assert_eq!(deadline_ms, now_ms + 1);
    // And then the key is gone, which is the same thing as a full bucket.
    wait_until("the full bucket to expire", Duration::from_secs(5), || {
        !exists(&mut con, "tb:r")
    });
}

#[test]
fn refund_pays_back_debt_first() {
    let server = Server::start();
    let mut con = server.conn();
    let now_ms = server_time_ms(&mut con).to_string();
    seed_bucket(&mut con, "tb:r", "-7", now_ms);

    let reply = refund(&mut con, "tb:r", "10", "0.001", "2");

    assert_eq!(&reply[..3], &[1, 0, 0], "{reply:?}");
    let tokens = stored_tokens(&mut con, "tb:r");
    assert!((-5.0..-4.99).contains(&tokens), "stored tokens {tokens}");
}

#[test]
fn refund_into_a_missing_bucket_writes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    for n in ["1", "3.5", "1000"] {
        // A missing bucket is full: 10 tokens, full now.
        assert_eq!(
            refund(&mut con, "tb:missing", "10", "1", n),
            vec![1, 10, 0, 0],
            "n = {n}"
        );
        assert!(!exists(&mut con, "tb:missing"), "n = {n} created the key");
    }
}

#[test]
fn refund_of_zero_tokens_writes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "tb:r", "10", "0.001", "4"); // 6 left, full again in 4000 s
    let before = bucket(&mut con, "tb:r");

    let reply = refund(&mut con, "tb:r", "10", "0.001", "0");

    assert_eq!(&reply[..3], &[1, 6, 0], "{reply:?}");
    assert_within("reset_after_ms", reply[3], 4_000_000 - 60_000, 4_000_000);
    assert_eq!(bucket(&mut con, "tb:r"), before);
}

#[test]
fn refund_moves_the_ttl_to_the_new_time_to_full() {
    let server = Server::start();
    let mut con = server.conn();
    // 5 taken at 0.01/s: full again in 500 s.
    let reply = take(&mut con, "tb:r", "10", "0.01", "5");
    assert_eq!(reply, vec![1, 5, 0, 500_000]);

    // 3 given back: 2 missing, full again in 200 s (a little less: time has passed).
    let reply = refund(&mut con, "tb:r", "10", "0.01", "3");
    let ttl_ms = pttl(&mut con, "tb:r");
    let after_ms = server_time_ms(&mut con);

    assert_eq!(&reply[..3], &[1, 8, 0], "{reply:?}");
    let reset_ms = reply[3];
    assert_within("reset_after_ms", reset_ms, 200_000 - 60_000, 200_000);
    let now_ms = stored_last_refill(&mut con, "tb:r");
    assert_eq!(
        pexpiretime(&mut con, "tb:r"),
        now_ms + reset_ms,
        "absolute deadline"
    );
    // PTTL read right after: the reset, less the ms that passed since the refund.
    assert_within("PTTL", ttl_ms, reset_ms - (after_ms - now_ms) - 1, reset_ms);
}

#[test]
fn refund_leaves_other_fields_alone() {
    let server = Server::start();
    let mut con = server.conn();
    let now_ms = server_time_ms(&mut con).to_string();
    hset(
        &mut con,
        "tb:r",
        &[
            ("owner", "alice"),
            ("tokens", "1"),
            ("last_refill", &now_ms),
        ],
    );

    refund(&mut con, "tb:r", "10", "0.001", "2");

    let fields = hgetall(&mut con, "tb:r");
    assert_eq!(fields.len(), 3, "{fields:?}");
    assert_eq!(fields["owner"], "alice");
}

// --- Errors: as TB.TAKE, nothing touched -------------------------------------------------------

#[test]
fn refund_with_the_wrong_number_of_arguments_gets_the_server_arity_error() {
    let server = Server::start();
    let mut con = server.conn();
    assert_arity_errors(
        &mut con,
        &[
            &[b"TB.REFUND", b"tb:r", b"10", b"1"],
            &[b"TB.REFUND", b"tb:r", b"10", b"1", b"1", b"1"],
            &[b"TB.REFUND"],
        ],
    );
    assert!(!exists(&mut con, "tb:r"));
}

#[test]
fn refund_argument_errors_are_those_of_tb_take_and_touch_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "tb:r", "10", "0.001", "4");
    let before = bucket(&mut con, "tb:r");

    for ((capacity, rate, n), message) in [
        (("0", "1", "1"), CAPACITY_ERROR),
        (("-1", "1", "1"), CAPACITY_ERROR),
        (("1e400", "1", "1"), CAPACITY_ERROR),
        (("10", "0", "1"), RATE_ERROR),
        (("10", "inf", "1"), RATE_ERROR),
        (("10", "1", "-1"), N_ERROR),
        (("10", "1", "nan"), N_ERROR),
        (("10", "1", ""), N_ERROR),
        // Checked in argument order: capacity, rate, n.
        (("x", "x", "x"), CAPACITY_ERROR),
        (("10", "x", "x"), RATE_ERROR),
    ] {
        for key in ["tb:r", "tb:missing"] {
            let refunded = tb_error(&mut con, ["TB.REFUND", key, capacity, rate, n]);
            assert_eq!(
                refunded, message,
                "TB.REFUND {key} {capacity:?} {rate:?} {n:?}"
            );
            let taken = tb_error(&mut con, ["TB.TAKE", key, capacity, rate, n]);
            assert_eq!(refunded, taken, "TB.TAKE {key} {capacity:?} {rate:?} {n:?}");
        }
    }
    assert_eq!(bucket(&mut con, "tb:r"), before);
    assert!(!exists(&mut con, "tb:missing"));
}

#[test]
fn refund_into_a_key_of_another_type_is_wrongtype() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = redis::cmd("SET")
        .arg("tb:string")
        .arg("x")
        .query(&mut con)
        .expect("SET");

    let error = refund_cmd("tb:string", "10", "1", "1")
        .query::<redis::Value>(&mut con)
        .expect_err("TB.REFUND on a string must fail");

    assert_eq!(error_text(&error), WRONGTYPE_ERROR);
    let value: String = redis::cmd("GET")
        .arg("tb:string")
        .query(&mut con)
        .expect("GET");
    assert_eq!(value, "x");
}

#[test]
fn refund_into_a_corrupt_bucket_names_the_key_and_touches_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    for (key, fields) in [
        ("tb:words", &[("tokens", "many"), ("last_refill", "0")][..]),
        ("tb:no-clock", &[("tokens", "3")]),
        ("tb:inf", &[("tokens", "inf"), ("last_refill", "0")]),
    ] {
        hset(&mut con, key, fields);
        let before = bucket(&mut con, key);
        let error = refund_cmd(key, "10", "1", "1")
            .query::<redis::Value>(&mut con)
            .expect_err("TB.REFUND on a corrupt bucket must fail");
        assert_eq!(error_text(&error), corrupt_error(key));
        assert_eq!(bucket(&mut con, key), before, "{key}");
    }
}

#[test]
fn command_info_gives_arity_five_write_flags_and_one_key() {
    let server = Server::start();
    let mut con = server.conn();
    let info: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("tb.refund")
        .query(&mut con)
        .expect("COMMAND INFO");
    let redis::Value::Array(entries) = info else {
        panic!("COMMAND INFO replied {info:?}");
    };
    let Some(redis::Value::Array(entry)) = entries.first() else {
        panic!("no entry for tb.refund: {entries:?}");
    };
    let ints: Vec<i64> = [1, 3, 4, 5]
        .iter()
        .map(|&i| match &entry[i] {
            redis::Value::Int(v) => *v,
            other => panic!("field {i}: {other:?}"),
        })
        .collect();
    assert_eq!(ints, [5, 1, 1, 1], "arity, first, last, step");
    let flags: Vec<String> = redis::from_redis_value(&entry[2]).expect("flags");
    for flag in ["write", "denyoom", "fast"] {
        assert!(flags.iter().any(|f| f == flag), "flag {flag} in {flags:?}");
    }
}

// --- Replication --------------------------------------------------------------------------------

#[test]
fn refunds_leave_the_replica_byte_identical() {
    let master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    let mut m = master.conn();
    // Slow rates (full again in 500 s or more), so no bucket expires before it is compared.
    for (key, capacity, rate, n) in [
        ("tb:a", "10", "0.005", "6"),
        ("tb:b", "2.5", "0.003", "2.2"),
    ] {
        assert_eq!(take(&mut m, key, capacity, rate, n)[0], 1, "take {key}");
    }
    // Fractional amounts make the stored token counts non-trivial text.
    for (key, capacity, rate, n) in [
        ("tb:a", "10", "0.005", "1.3"),
        ("tb:a", "10", "0.005", "2"),
        ("tb:b", "2.5", "0.003", "0.7"),
    ] {
        refund(&mut m, key, capacity, rate, n);
    }
    assert_replica_holds_the_same_buckets(&master, &replica, &["tb:a", "tb:b"]);
}

#[test]
fn refunds_that_write_nothing_do_not_move_the_replication_offset() {
    let master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    let mut m = master.conn();
    take(&mut m, "tb:some", "10", "0.001", "4");
    wait_for_replica(&master, &replica);
    let offset = repl_offset(&mut m);

    for _ in 0..50 {
        assert_eq!(
            refund(&mut m, "tb:missing", "10", "1", "2"),
            vec![1, 10, 0, 0]
        );
        assert_eq!(refund(&mut m, "tb:some", "10", "0.001", "0")[1], 6);
    }

    assert_eq!(repl_offset(&mut m), offset, "master_repl_offset moved");
    wait_for_replica(&master, &replica);
    let mut r = replica.conn();
    assert!(!exists(&mut m, "tb:missing") && !exists(&mut r, "tb:missing"));
    assert_eq!(bucket(&mut r, "tb:some"), bucket(&mut m, "tb:some"));
}

// --- AOF ---------------------------------------------------------------------------------------

#[test]
fn the_aof_holds_hset_and_pexpireat_for_a_refund_and_never_tb_refund() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    take(&mut con, "tb:r", "10", "0.001", "4");
    let start = aof_without_select(&server, &mut con).len();

    refund(&mut con, "tb:r", "10", "0.001", "1.5");
    let logged = aof_without_select(&server, &mut con);

    let [hset, pexpireat] = bucket_write(&mut con, "tb:r");
    let expected = vec![argv(&["MULTI"]), hset, pexpireat, argv(&["EXEC"])];
    assert_eq!(logged[start..].to_vec(), expected, "AOF after TB.REFUND");
    assert_no_tb_command(&logged);
}

#[test]
fn refunds_that_write_nothing_add_nothing_to_the_aof() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    take(&mut con, "tb:some", "10", "0.001", "4");
    let before = aof_without_select(&server, &mut con);

    for _ in 0..20 {
        refund(&mut con, "tb:missing", "10", "1", "2");
        refund(&mut con, "tb:some", "10", "0.001", "0");
    }
    assert_eq!(aof_without_select(&server, &mut con), before);
}

#[test]
fn refunded_state_survives_an_aof_restart() {
    let mut server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    // Slow rates: deadlines far away, so nothing expires across the restart.
    take(&mut con, "tb:a", "10", "0.01", "6");
    take(&mut con, "tb:b", "2.5", "0.003", "2");
    refund(&mut con, "tb:a", "10", "0.01", "2.5");
    refund(&mut con, "tb:b", "2.5", "0.003", "0.3");
    let before = [bucket(&mut con, "tb:a"), bucket(&mut con, "tb:b")];
    assert!(before.iter().all(|b| b.expire_at_ms > 0), "{before:?}");

    server.restart();
    let mut con = server.conn();
    assert_eq!([bucket(&mut con, "tb:a"), bucket(&mut con, "tb:b")], before);
}
