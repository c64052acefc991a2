//! Reservations: `MAXWAIT ms` on TB.TAKE and TB.TAKEALL, on the module and on its Lua twin
//! (one case, two tests: `<case>::on_module`, `<case>::on_twin`). The contract is in
//! docs/commands.md; the arithmetic is core/src/bucket.rs (`reserve`, `deadline_ms`).
//!
//! Exact figures come from frozen buckets (harness/buckets.rs); where a reply depends on the
//! instant of the call, it is bounded by the server clock read before and after it. Every
//! wait is a bounded poll of the server clock.

use crate::harness::*;

on_every_backend!(maxwait_allows_into_debt_and_waits_until_it_is_repaid);
fn maxwait_allows_into_debt_and_waits_until_it_is_repaid(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "0");
    // 5 tokens at 1 per second, none left: the token arrives in 1 s, within MAXWAIT.
    let reply = backend.ints(&mut con, "take", "k", "5 1 1 MAXWAIT 2000");
    assert_eq!(reply, [1, 0, 1000, 6000]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("-1"));
    let now = int_field(&mut con, "k", "last_refill");
    assert_eq!(pexpiretime(&mut con, "k"), now + 6000);
}

on_every_backend!(a_reservation_is_allowed_into_debt_and_retry_after_ms_is_its_wait);
fn a_reservation_is_allowed_into_debt_and_retry_after_ms_is_its_wait(backend: Backend) {
    let (_server, mut con) = backend.start();
    // 10 tokens, 10 per second: 5 more take 500 ms to come.
    backend.drain(&mut con, "tb:res", "10", "10");
    let (before, reply, _) = backend.timed(&mut con, "take", "tb:res", "10 10 5 MAXWAIT 1000");
    assert_eq!(reply[..2], [1, 0], "allowed, nothing left: {reply:?}");
    assert_within("retry_after_ms", reply[2], 450, 500);
    let debt = stored_tokens(&mut con, "tb:res");
    assert!(
        (-5.0..-4.5).contains(&debt),
        "stored tokens {debt}: a debt of about 5"
    );
    // Full again after the debt and the capacity: 15 tokens, 1.5 s.
    let full = reply[2] + 1000;
    assert_within("reset_after_ms", reply[3], full - 1, full + 1);
    backend.assert_counter(&mut con, "tb_reservations_waited", 1);
    // While the debt is being repaid a plain take is denied, and its wait counts the debt.
    let reply = backend.ints(&mut con, "take", "tb:res", "10 10 1");
    assert_eq!(reply[0], 0, "{reply:?}");
    assert!(reply[2] > 400, "one token after the debt: {reply:?}");
    // Acting when told, the reserved tokens are there: the debt is repaid.
    wait_for_server_time(&mut con, before + 700);
    assert!(stored_tokens(&mut con, "tb:res") < 0.0, "stored as it was");
    let reply = backend.ints(&mut con, "peek", "tb:res", "10 10 0");
    assert_eq!(reply[0], 1);
    assert!(reply[1] >= 1, "the debt is repaid: {reply:?}");
}

on_every_backend!(maxwait_denies_what_arrives_too_late_with_the_wait_from_the_horizon);
fn maxwait_denies_what_arrives_too_late_with_the_wait_from_the_horizon(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "0");
    // 3 tokens take 3 s; a call with MAXWAIT 2000 is allowed 1 s from now.
    let reply = backend.ints(&mut con, "take", "k", "5 1 3 MAXWAIT 2000");
    assert_eq!(reply, [0, 0, 1000, 5000]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("0"));
}

on_every_backend!(a_reservation_that_cannot_be_served_within_maxwait_is_denied_and_writes_nothing);
fn a_reservation_that_cannot_be_served_within_maxwait_is_denied_and_writes_nothing(
    backend: Backend,
) {
    let (_server, mut con) = backend.start();
    // 10 tokens, 1 per second, drained: 5 tokens take 5 s, more than MAXWAIT 2000.
    let drained_at = backend.drain(&mut con, "tb:far", "10", "1");
    let before = snapshot(&mut con, b"tb:far");
    let (t0, reply, t1) = backend.timed(&mut con, "take", "tb:far", "10 1 5 MAXWAIT 2000");
    assert_eq!(reply[..2], [0, 0], "{reply:?}");
    // Denied with the soonest a call with the same MAXWAIT is allowed: when 5 tokens are
    // 2 s away, 3 s after the drain.
    let go = drained_at + 3000;
    assert_within("retry_after_ms", reply[2], go - t1, go - t0 + 1);
    assert_eq!(snapshot(&mut con, b"tb:far"), before, "nothing written");
    backend.assert_counter(&mut con, "tb_reservations_waited", 0);
}

on_every_backend!(a_denied_reservation_writes_nothing);
fn a_denied_reservation_writes_nothing(backend: Backend) {
    let (server, mut con) = backend.start();
    let now = server_time_ms(&mut con);
    seed_bucket(&mut con, "k", "0", now);
    let before = snapshot(&mut con, b"k");
    assert!(watch_survives(&server, &mut con, "k", |other| {
        let reply = backend.ints(other, "take", "k", "5 0.001 1 MAXWAIT 1000");
        assert_eq!(reply[..2], [0, 0]);
    }));
    assert_eq!(snapshot(&mut con, b"k"), before);
}

on_every_backend!(maxwait_zero_is_a_plain_take);
fn maxwait_zero_is_a_plain_take(backend: Backend) {
    let (_server, mut con) = backend.start();
    for (i, tokens) in ["0", "0.5", "3", "-2"].iter().enumerate() {
        for n in ["0", "1", "2.5", "6"] {
            let (plain, with) = (format!("p:{i}:{n}"), format!("w:{i}:{n}"));
            frozen(&mut con, &plain, tokens);
            frozen(&mut con, &with, tokens);
            let a = backend.ints(&mut con, "take", &plain, &format!("5 1 {n}"));
            let b = backend.ints(&mut con, "take", &with, &format!("5 1 {n} MAXWAIT 0"));
            assert_eq!(a, b, "tokens {tokens} n {n}");
            assert_eq!(
                field(&mut con, &plain, "tokens"),
                field(&mut con, &with, "tokens")
            );
        }
    }
    // Zero in any spelling: an empty bucket denies, and writes nothing, where a reservation
    // would be allowed.
    backend.drain(&mut con, "tb:empty", "1", "1");
    let before = snapshot(&mut con, b"tb:empty");
    for zero in ["0", "000"] {
        let reply = backend.ints(
            &mut con,
            "take",
            "tb:empty",
            &format!("1 1 1 MAXWAIT {zero}"),
        );
        assert_eq!(reply[0], 0, "MAXWAIT {zero}: {reply:?}");
        assert_eq!(snapshot(&mut con, b"tb:empty"), before);
    }
    let reply = backend.ints(&mut con, "take", "tb:empty", "1 1 1 MAXWAIT 10000");
    assert_eq!(reply[0], 1, "{reply:?}");
}

on_every_backend!(maxwait_never_reserves_more_than_the_capacity);
fn maxwait_never_reserves_more_than_the_capacity(backend: Backend) {
    let (_server, mut con) = backend.start();
    let reply = backend.ints(&mut con, "take", "k", "5 1 6 MAXWAIT 9007199254740992");
    assert_eq!(reply, [0, 5, -1, 0]);
    assert!(!exists(&mut con, "k"));
    // Nor on a bucket in use.
    backend.drain(&mut con, "tb:far", "10", "1");
    let before = snapshot(&mut con, b"tb:far");
    let reply = backend.ints(&mut con, "take", "tb:far", "10 1 11 MAXWAIT 100000000");
    assert_eq!(reply[..3], [0, 0, -1], "{reply:?}");
    assert_eq!(snapshot(&mut con, b"tb:far"), before, "nothing written");
}

on_every_backend!(reservations_are_served_in_arrival_order);
fn reservations_are_served_in_arrival_order(backend: Backend) {
    let (_server, mut con) = backend.start();
    // 10 tokens, 10 per second, drained: each reservation waits behind the ones before.
    let drained_at = backend.drain(&mut con, "tb:order", "10", "10");
    // Each caller acts when every token reserved before it, and its own, has been
    // refilled since the drain: 2, 3, 6, 7 and 9 tokens, 100 ms each.
    for (n, ahead) in [("2", 2), ("1", 3), ("3", 6), ("1", 7), ("2", 9)] {
        let args = format!("10 10 {n} MAXWAIT 5000");
        let (before, reply, after) = backend.timed(&mut con, "take", "tb:order", &args);
        assert_eq!(reply[..2], [1, 0], "reserved: {reply:?}");
        let go = drained_at + ahead * 100;
        // The call ran between `before` and `after`; 1 ms of rounding.
        assert_within(
            "when it may act",
            go,
            before + reply[2] - 1,
            after + reply[2] + 1,
        );
    }
    assert!(
        stored_tokens(&mut con, "tb:order") < -5.0,
        "a debt of 9 less the refill"
    );
}

on_every_backend!(a_bucket_in_debt_has_no_tokens_left_and_waits_for_the_repayment);
fn a_bucket_in_debt_has_no_tokens_left_and_waits_for_the_repayment(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "-3");
    // Peek: 0 left (never below), the debt of 3 and the token wanted take 4 s.
    let reply = backend.ints(&mut con, "peek", "k", "5 1 1");
    assert_eq!(reply, [0, 0, 4000, 8000]);
}

on_every_backend!(
    tb_takeall_with_maxwait_reserves_in_every_bucket_or_in_none_and_waits_for_the_longest
);
fn tb_takeall_with_maxwait_reserves_in_every_bucket_or_in_none_and_waits_for_the_longest(
    backend: Backend,
) {
    let (_server, mut con) = backend.start();
    // Two drained buckets: 1 token in 100 ms at 10/s, in 500 ms at 2/s.
    let keys = "{w}:fast {w}:slow";
    backend.drain(&mut con, "{w}:fast", "10", "10");
    backend.drain(&mut con, "{w}:slow", "10", "2");
    let reply = backend.ints(&mut con, "takeall", keys, "10 10 1 10 2 1 MAXWAIT 2000");
    assert_eq!(
        (reply[0], reply[1], reply[4]),
        (1, 0, 1),
        "the slow bucket decides: {reply:?}"
    );
    assert_within("retry_after_ms", reply[2], 400, 500);
    assert!(stored_tokens(&mut con, "{w}:fast") < 0.0);
    assert!(stored_tokens(&mut con, "{w}:slow") < 0.0);
    backend.assert_counter(&mut con, "tb_reservations_waited", 1);

    // One bucket cannot reserve in time: the call is denied and neither is written.
    let before = [
        snapshot(&mut con, b"{w}:fast"),
        snapshot(&mut con, b"{w}:slow"),
    ];
    let reply = backend.ints(&mut con, "takeall", keys, "10 10 1 10 2 4 MAXWAIT 1000");
    assert_eq!((reply[0], reply[4]), (0, 1), "{reply:?}");
    let after = [
        snapshot(&mut con, b"{w}:fast"),
        snapshot(&mut con, b"{w}:slow"),
    ];
    assert_eq!(after, before, "all or nothing");
}

on_every_backend!(takeall_options_apply_to_every_bucket_and_its_longest_reservation_decides);
fn takeall_options_apply_to_every_bucket_and_its_longest_reservation_decides(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "a", "0");
    frozen(&mut con, "b", "0");
    frozen(&mut con, "c", "5");
    // a repays in 1 s, b (half the rate) in 2 s, c has its token: b decides.
    let args = "10 1 1 10 0.5 1 10 1 1 MAXWAIT 5000";
    let reply = backend.ints(&mut con, "takeall", "a b c", args);
    assert_eq!(reply, [1, 0, 2000, 22_000, 1]);
    for (key, tokens) in [("a", "-1"), ("b", "-1"), ("c", "4")] {
        let stored = field(&mut con, key, "tokens");
        assert_eq!(stored.as_deref(), Some(tokens), "{key}");
    }
}
