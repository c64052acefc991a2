//! TB.TAKE against a real redis-server: reply contract, stored state, expiry, real-time refill.
//!
//! Timing assertions are bounded by the server's own clock (TIME read before and after a call),
//! or are one-sided, so they cannot flake on a slow machine.

use crate::harness::*;

#[test]
fn fresh_bucket_is_full_and_allows_with_time_to_full() {
    let server = Server::start();
    let mut con = server.conn();
    // 10 - 3 = 7 tokens left; 3 missing at 2/s = 1500 ms to full.
    assert_eq!(take(&mut con, "b", "10", "2", "3"), vec![1, 7, 0, 1500]);
}

#[test]
fn draining_the_bucket_ends_in_a_denial() {
    let server = Server::start();
    let mut con = server.conn();
    // 0.001 tokens/s: refill during the test is far below one token.
    for expected_remaining in (0..5).rev() {
        let reply = take(&mut con, "b", "5", "0.001", "1");
        assert_eq!(&reply[..3], &[1, expected_remaining, 0], "reply {reply:?}");
    }
    let t0 = server_time_ms(&mut con);
    let denied = take(&mut con, "b", "5", "0.001", "1");
    assert_eq!(&denied[..2], &[0, 0], "denied reply {denied:?}");
    // One token at 0.001/s is 1_000_000 ms, minus the few ms since the drain began.
    assert!(
        denied[2] > 990_000 && denied[2] <= 1_000_000,
        "retry_after_ms {} (t0 {t0})",
        denied[2]
    );
    assert!(
        denied[3] > 4_990_000 && denied[3] <= 5_000_000,
        "reset_after_ms {}",
        denied[3]
    );
}

#[test]
fn retry_after_ms_is_the_time_until_n_tokens_are_there() {
    let server = Server::start();
    let mut con = server.conn();
    let t0 = server_time_ms(&mut con);
    seed_bucket(&mut con, "b", "0", t0);
    // One token per 100 s: however slow the machine, the call is still denied.
    let reply = take(&mut con, "b", "10", "0.01", "3");
    let t1 = server_time_ms(&mut con);
    let drift = t1 - t0; // the module's clock read lies in [t0, t1]
    assert_eq!(&reply[..2], &[0, 0], "reply {reply:?}");
    // 3 tokens at 0.01/s = 300_000 ms, 10 tokens = 1_000_000 ms, less what refilled since t0.
    assert!(
        reply[2] <= 300_000 && reply[2] >= 300_000 - drift,
        "retry_after_ms {} not in [{}, 300000]",
        reply[2],
        300_000 - drift
    );
    assert!(
        reply[3] <= 1_000_000 && reply[3] >= 1_000_000 - drift,
        "reset_after_ms {} not in [{}, 1000000]",
        reply[3],
        1_000_000 - drift
    );
}

#[test]
fn n_above_capacity_is_denied_with_retry_after_minus_one() {
    let server = Server::start();
    let mut con = server.conn();
    // Full bucket: remaining = 5 available, reset 0 (already full).
    assert_eq!(take(&mut con, "b", "5", "1", "6"), vec![0, 5, -1, 0]);
    assert!(
        !exists(&mut con, "b"),
        "a denied call must not create the key"
    );
}

#[test]
fn n_zero_on_a_missing_key_creates_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(take(&mut con, "b", "10", "1", "0"), vec![1, 10, 0, 0]);
    assert!(!exists(&mut con, "b"), "n = 0 must not create the key");
}

#[test]
fn n_zero_on_an_existing_bucket_writes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "b", "10", "0.001", "4");
    let before = snapshot(&mut con, b"b");
    let reply = take(&mut con, "b", "10", "0.001", "0");
    assert_eq!(&reply[..3], &[1, 6, 0], "reply {reply:?}");
    assert!(reply[3] > 0, "not full, reset_after_ms {}", reply[3]);
    assert_eq!(snapshot(&mut con, b"b"), before, "n = 0 changed the key");
}

#[test]
fn remaining_floors_fractional_tokens() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(&take(&mut con, "b", "10", "0.001", "2.5")[..3], &[1, 7, 0]);
    let t = stored_tokens(&mut con, "b");
    assert!((7.5..7.51).contains(&t), "stored tokens {t}");
    // 7.5 - 0.6 = 6.9 -> 6
    assert_eq!(&take(&mut con, "b", "10", "0.001", "0.6")[..3], &[1, 6, 0]);
    // 6.9 - 6.5 = 0.4 -> 0
    assert_eq!(&take(&mut con, "b", "10", "0.001", "6.5")[..3], &[1, 0, 0]);
    // 0.4 available, 1 wanted: denied, remaining floor(0.4) = 0
    assert_eq!(&take(&mut con, "b", "10", "0.001", "1")[..2], &[0, 0]);
}

#[test]
fn bucket_is_a_hash_of_tokens_and_last_refill_in_server_ms() {
    let server = Server::start();
    let mut con = server.conn();
    let t0 = server_time_ms(&mut con);
    // Full again in 300 s: the key is still there when it is read back.
    take(&mut con, "b", "10", "0.01", "3");
    let t1 = server_time_ms(&mut con);
    let ty: String = redis::cmd("TYPE").arg("b").query(&mut con).unwrap();
    assert_eq!(ty, "hash");
    let all = hgetall(&mut con, "b");
    assert_eq!(
        all.keys().collect::<Vec<_>>(),
        vec!["last_refill", "tokens"],
        "fields {all:?}"
    );
    assert_eq!(stored_tokens(&mut con, "b"), 7.0);
    let last = stored_last_refill(&mut con, "b");
    assert!(
        (t0..=t1).contains(&last),
        "last_refill {last} not within server TIME [{t0}, {t1}]"
    );
}

#[test]
fn other_hash_fields_are_left_alone() {
    let server = Server::start();
    let mut con = server.conn();
    let t0 = server_time_ms(&mut con);
    hset(
        &mut con,
        "b",
        &[
            ("owner", "alice"),
            ("tokens", "5"),
            ("last_refill", &t0.to_string()),
            ("note", "\u{0}binary\u{ff}"),
        ],
    );
    assert_eq!(&take(&mut con, "b", "10", "0.001", "1")[..3], &[1, 4, 0]);
    let all = hgetall(&mut con, "b");
    assert_eq!(all.len(), 4, "fields {all:?}");
    assert_eq!(all["owner"], "alice");
    assert_eq!(all["note"], "\u{0}binary\u{ff}");
}

#[test]
fn pttl_equals_reset_after_ms() {
    let server = Server::start();
    let mut con = server.conn();
    let t0 = server_time_ms(&mut con);
    // 3 tokens at 0.01/s: full again in 300 s, so the key outlives any slow read below.
    let reply = take(&mut con, "b", "10", "0.01", "3");
    let ttl = pttl(&mut con, "b");
    let t1 = server_time_ms(&mut con);
    assert_eq!(reply[3], 300_000);
    // PTTL is read at most (t1 - t0) ms after the write; +1 for ms rounding.
    assert!(
        ttl <= 300_000 && ttl >= 300_000 - (t1 - t0) - 1,
        "PTTL {ttl} vs reset_after_ms 300000 (elapsed {} ms)",
        t1 - t0
    );
    let deadline = pexpiretime(&mut con, "b");
    let last = stored_last_refill(&mut con, "b");
    assert_eq!(
        deadline,
        last + 300_000,
        "expiry must be absolute: last_refill + reset_after_ms"
    );
}

#[test]
fn expiry_follows_each_allowed_take() {
    let server = Server::start();
    let mut con = server.conn();
    // One token per 100 s, so the milliseconds between the calls (on a slow
    // machine, up to seconds) hardly refill anything.
    take(&mut con, "b", "10", "0.01", "1");
    let first = pexpiretime(&mut con, "b");
    take(&mut con, "b", "10", "0.01", "4");
    let second = pexpiretime(&mut con, "b");
    let last = stored_last_refill(&mut con, "b");
    // About 5 tokens missing: about 500 s after the second take, less what
    // refilled in between.
    assert!(
        second > first,
        "expiry {second} must move out after a bigger take ({first})"
    );
    assert!(
        (last + 490_000..=last + 500_000).contains(&second),
        "expiry {second} vs last_refill {last}"
    );
}

#[test]
fn denied_call_leaves_hash_and_ttl_alone() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "b", "2", "0.001", "2");
    let hash_before = hgetall(&mut con, "b");
    let pttl_before = pttl(&mut con, "b");
    let before = snapshot(&mut con, b"b");
    let reply = take(&mut con, "b", "2", "0.001", "1");
    assert_eq!(reply[0], 0, "expected a denial, got {reply:?}");
    assert_eq!(hgetall(&mut con, "b"), hash_before);
    let pttl_after = pttl(&mut con, "b");
    assert!(
        pttl_after <= pttl_before,
        "PTTL grew on a denial: {pttl_before} -> {pttl_after}"
    );
    assert_eq!(snapshot(&mut con, b"b"), before, "denial changed the key");
}

#[test]
fn denied_call_does_not_touch_a_watched_key() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "b", "1", "0.001", "1");
    let denied = |other: &mut redis::Connection| {
        assert_eq!(take(other, "b", "1", "0.001", "1")[0], 0);
    };
    assert!(
        watch_survives(&server, &mut con, "b", denied),
        "EXEC aborted: a denied TB.TAKE signalled WATCH"
    );
}

#[test]
fn allowed_call_signals_a_watched_key() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "b", "5", "0.001", "1");
    let allowed = |other: &mut redis::Connection| {
        assert_eq!(take(other, "b", "5", "0.001", "1")[0], 1);
    };
    assert!(
        !watch_survives(&server, &mut con, "b", allowed),
        "EXEC ran although an allowed TB.TAKE wrote the watched key"
    );
}

#[test]
fn tokens_refill_over_real_time() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(&take(&mut con, "b", "100", "1000", "100")[..2], &[1, 0]);
    sleep_ms(50);
    // At least 50 tokens came back (1000/s for >= 50 ms); 10 are taken.
    let reply = take(&mut con, "b", "100", "1000", "10");
    assert_eq!(reply[0], 1, "reply {reply:?}");
    assert!(
        reply[1] >= 40,
        "only {} left after 50 ms at 1000/s",
        reply[1]
    );
}

#[test]
fn waiting_retry_after_ms_makes_the_call_succeed() {
    let server = Server::start();
    let mut con = server.conn();
    // Rates whose token time is not a whole number of ms, so rounding is exercised.
    for (key, rate) in [("b1", "20"), ("b2", "30"), ("b3", "7")] {
        assert_eq!(take(&mut con, key, "3", rate, "3")[0], 1);
        for round in 0..3 {
            let denied = take(&mut con, key, "3", rate, "1");
            if denied[0] == 1 {
                continue; // refilled already on a slow machine; nothing to wait for
            }
            let wait = denied[2];
            assert!(wait > 0, "rate {rate} round {round}: retry_after_ms {wait}");
            sleep_ms(wait);
            let reply = take(&mut con, key, "3", rate, "1");
            assert_eq!(
                reply[0], 1,
                "rate {rate} round {round}: still denied {reply:?} after waiting retry_after_ms {wait}"
            );
        }
    }
}

#[test]
fn key_expires_when_the_bucket_is_full_again() {
    let server = Server::start();
    let mut con = server.conn();
    // Full again 500 ms after the take: room for a slow machine to ask for
    // the PTTL before the key is gone.
    let reply = take(&mut con, "b", "2", "2", "1");
    assert_eq!(reply, vec![1, 1, 0, 500]);
    let ttl = pttl(&mut con, "b");
    assert!((1..=500).contains(&ttl), "PTTL {ttl}");
    sleep_ms(ttl + 20);
    assert!(
        !exists(&mut con, "b"),
        "key still there after its PTTL passed"
    );
    assert_eq!(
        take(&mut con, "b", "2", "2", "1"),
        vec![1, 1, 0, 500],
        "not a full bucket"
    );
}

#[test]
fn stored_tokens_below_zero_are_debt_repaid_first() {
    let server = Server::start();
    let mut con = server.conn();
    let t0 = server_time_ms(&mut con);
    seed_bucket(&mut con, "b", "-1", t0);
    let reply = take(&mut con, "b", "10", "0.001", "1");
    assert_eq!(&reply[..2], &[0, 0], "reply {reply:?}");
    // From -1: the debt, then the token, 2_000_000 ms at 0.001 per second.
    assert!(
        reply[2] <= 2_000_000 && reply[2] > 1_990_000,
        "retry_after_ms {}",
        reply[2]
    );
}

#[test]
fn stored_tokens_above_capacity_are_capped() {
    let server = Server::start();
    let mut con = server.conn();
    let t0 = server_time_ms(&mut con);
    seed_bucket(&mut con, "b", "1e+15", t0);
    assert_eq!(&take(&mut con, "b", "10", "0.001", "1")[..3], &[1, 9, 0]);
    assert!((9.0..9.01).contains(&stored_tokens(&mut con, "b")));
}

#[test]
fn stored_numbers_may_carry_exponent_and_long_decimals() {
    let server = Server::start();
    let mut con = server.conn();
    let t0 = server_time_ms(&mut con);
    let last = format!("{t0}e0");
    seed_bucket(&mut con, "b", "0.50000000000000001e1", last);
    assert_eq!(&take(&mut con, "b", "10", "0.001", "1")[..3], &[1, 4, 0]);
}

#[test]
fn future_last_refill_counts_as_no_elapsed_time() {
    let server = Server::start();
    let mut con = server.conn();
    let t0 = server_time_ms(&mut con);
    let future = (t0 + 1_000_000_000).to_string();
    seed_bucket(&mut con, "b", "3", future);
    // A negative elapsed time must not drain the bucket: 3 - 1 = 2.
    assert_eq!(&take(&mut con, "b", "10", "1000", "1")[..3], &[1, 2, 0]);
    let t1 = server_time_ms(&mut con);
    let last = stored_last_refill(&mut con, "b");
    assert!(
        (t0..=t1).contains(&last),
        "last_refill {last} must be now, not the future value"
    );
}

#[test]
fn waits_are_capped_at_two_to_the_53_ms() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(
        take(&mut con, "b", "1", "1e-300", "1"),
        vec![1, 0, 0, MAX_WAIT_MS]
    );
    assert_eq!(
        take(&mut con, "b", "1", "1e-300", "1"),
        vec![0, 0, MAX_WAIT_MS, MAX_WAIT_MS]
    );
}

#[test]
fn take_works_inside_multi_exec() {
    let server = Server::start();
    let mut con = server.conn();
    let replies: (Vec<i64>, Vec<i64>) = redis::pipe()
        .atomic()
        .add_command(tb_cmd("TB.TAKE", "b", "2", "0.001", "1"))
        .add_command(tb_cmd("TB.TAKE", "b", "2", "0.001", "1"))
        .query(&mut con)
        .unwrap();
    assert_eq!(&replies.0[..3], &[1, 1, 0]);
    assert_eq!(&replies.1[..3], &[1, 0, 0]);
    assert_eq!(take(&mut con, "b", "2", "0.001", "1")[0], 0);
}

#[test]
fn take_works_from_eval() {
    let server = Server::start();
    let mut con = server.conn();
    // A slow rate (full again in 300 s), so the bucket is still there to be read back.
    let reply = eval_tb(&mut con, "EVAL", "TB.TAKE", "b", &["10", "0.01", "3"]);
    assert_eq!(reply, vec![1, 7, 0, 300_000]);
    assert_eq!(stored_tokens(&mut con, "b"), 7.0);
}

#[test]
fn lua_reference_and_tb_take_share_one_count() {
    let server = Server::start();
    let mut con = server.conn();
    let capacity = 10;
    let mut allowed = 0;
    let mut denied_seen = false;
    for call in 0..(2 * capacity + 4) {
        let reply = if call % 2 == 0 {
            let now = server_time_ms(&mut con);
            lua_take(&mut con, "b", "10", "0.001", "1", now)
        } else {
            take(&mut con, "b", "10", "0.001", "1")
        };
        let who = if call % 2 == 0 { "lua" } else { "TB.TAKE" };
        if reply[0] == 1 {
            assert!(
                !denied_seen,
                "call {call} ({who}) allowed after a denial: {reply:?}"
            );
            allowed += 1;
            assert_eq!(
                reply[1],
                capacity - allowed,
                "call {call} ({who}) remaining disagrees with the shared count: {reply:?}"
            );
        } else {
            denied_seen = true;
            assert_eq!(reply[1], 0, "call {call} ({who}): {reply:?}");
        }
    }
    assert_eq!(
        allowed, capacity,
        "Lua and TB.TAKE together must allow exactly capacity"
    );
}

#[test]
fn lua_reference_script_is_a_token_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    let now = server_time_ms(&mut con);
    assert_eq!(lua_take(&mut con, "b", "3", "1", "2", now), vec![1, 1]);
    assert_eq!(lua_take(&mut con, "b", "3", "1", "2", now), vec![0, 1]);
    // 1.5 s later: 1 + 1.5 = 2.5 tokens, take 2 -> 0.5 left.
    assert_eq!(
        lua_take(&mut con, "b", "3", "1", "2", now + 1500),
        vec![1, 0]
    );
    // Refill is capped at capacity.
    assert_eq!(
        lua_take(&mut con, "b", "3", "1", "0", now + 100_000),
        vec![1, 3]
    );
}
