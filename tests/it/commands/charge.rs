//! Post-paid costs: TB.CHARGE with `MAXDEBT`, on the module and on its Lua twin (one case,
//! two tests: `<case>::on_module`, `<case>::on_twin`). The contract is in docs/commands.md;
//! the arithmetic is core/src/bucket.rs (`debit`, `deadline_ms`).
//!
//! Exact figures come from frozen buckets (harness/buckets.rs); where a reply depends on the
//! instant of the call, it is bounded by the server clock read before and after it. Every
//! wait is a bounded poll of the server clock.

use crate::harness::*;

on_every_backend!(a_charge_takes_whatever_the_bucket_holds_into_debt);
fn a_charge_takes_whatever_the_bucket_holds_into_debt(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "2");
    // Allowed whatever: 2 - 4 = -2, repaid 2 s from now, full 7 s from now.
    let reply = backend.ints(&mut con, "charge", "k", "5 1 4");
    assert_eq!(reply, [1, 0, 2000, 7000]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("-2"));
    let now = int_field(&mut con, "k", "last_refill");
    assert_eq!(pexpiretime(&mut con, "k"), now + 7000);
}

on_every_backend!(a_charge_goes_into_debt_down_to_maxdebt_and_later_takes_wait_until_it_is_repaid);
fn a_charge_goes_into_debt_down_to_maxdebt_and_later_takes_wait_until_it_is_repaid(
    backend: Backend,
) {
    let (_server, mut con) = backend.start();
    // 10 tokens, 10 per second: a cost of 25 on a full bucket is 15 more than it holds,
    // and MAXDEBT 5 stops the debt at 5 (500 ms of refill).
    let reply = backend.ints(&mut con, "charge", "tb:llm", "10 10 25 MAXDEBT 5");
    assert_eq!(reply, [1, 0, 500, 1500], "always allowed; repaid in 500 ms");
    assert_eq!(stored_tokens(&mut con, "tb:llm"), -5.0);
    backend.assert_counter(&mut con, "tb_charges", 1);
    // INFO counts what was taken (10 held, down to -5), not the 25 asked.
    backend.assert_counter(&mut con, "tb_tokens_charged", 15);
    let charged_at = stored_last_refill(&mut con, "tb:llm");
    // A take is denied until the debt and its own token are back: 600 ms.
    let (before, reply, after) = backend.timed(&mut con, "take", "tb:llm", "10 10 1");
    assert_eq!(reply[..2], [0, 0], "{reply:?}");
    let go = charged_at + 600;
    assert_within("retry_after_ms", reply[2], go - after, go - before + 1);
    wait_for_server_time(&mut con, go + 10);
    let reply = backend.ints(&mut con, "take", "tb:llm", "10 10 1");
    assert_eq!(reply[0], 1, "repaid: {reply:?}");
}

/// `tb_tokens_charged` counts what was really charged, as `tb_tokens_refunded` counts what was
/// added: 150,000 asked of a full bucket of 10,000 with MAXDEBT 10,000 is 20,000 taken, and a
/// charge on a balance already below its floor takes nothing. (The twin keeps no counters.)
#[test]
fn tb_tokens_charged_counts_what_maxdebt_let_a_charge_take_not_what_was_asked() {
    let backend = Backend::Module;
    let (_server, mut con) = backend.start();
    backend.ints(
        &mut con,
        "charge",
        "tb:big",
        "10000 0.001 150000 MAXDEBT 10000",
    );
    assert_eq!(stored_tokens(&mut con, "tb:big"), -10000.0);
    backend.assert_counter(&mut con, "tb_tokens_charged", 20000);
    backend.ints(&mut con, "charge", "tb:big", "10000 0.001 7 MAXDEBT 5");
    backend.assert_counter(&mut con, "tb_tokens_charged", 20000);
    backend.ints(&mut con, "charge", "tb:small", "10 0.001 3");
    backend.assert_counter(&mut con, "tb_tokens_charged", 20003);
    backend.assert_counter(&mut con, "tb_charges", 3);
}

on_every_backend!(a_charge_goes_no_deeper_than_the_capacity_by_default);
fn a_charge_goes_no_deeper_than_the_capacity_by_default(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "0");
    let reply = backend.ints(&mut con, "charge", "k", "5 1 100");
    assert_eq!(reply, [1, 0, 5000, 10_000]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("-5"));
}

on_every_backend!(a_charge_goes_no_deeper_than_maxdebt);
fn a_charge_goes_no_deeper_than_maxdebt(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "0");
    let reply = backend.ints(&mut con, "charge", "k", "5 1 100 maxdebt 2.5");
    assert_eq!(reply, [1, 0, 2500, 7500]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("-2.5"));
}

on_every_backend!(a_charge_never_raises_a_debt_below_maxdebt);
fn a_charge_never_raises_a_debt_below_maxdebt(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "-10");
    let reply = backend.ints(&mut con, "charge", "k", "5 1 1 MAXDEBT 2");
    assert_eq!(reply, [1, 0, 10_000, 15_000]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("-10"));
}

on_every_backend!(a_charge_defaults_maxdebt_to_the_capacity_and_never_raises_a_deeper_debt);
fn a_charge_defaults_maxdebt_to_the_capacity_and_never_raises_a_deeper_debt(backend: Backend) {
    let (_server, mut con) = backend.start();
    // 10 tokens, 1 per 1000 s.
    let reply = backend.ints(&mut con, "charge", "tb:deep", "10 0.001 100");
    assert_eq!(reply[..3], [1, 0, 10_000_000], "{reply:?}");
    let debt = stored_tokens(&mut con, "tb:deep");
    assert_eq!(debt, -10.0, "MAXDEBT defaults to the capacity");
    // A smaller MAXDEBT afterwards keeps the debt as it is, never raised.
    let reply = backend.ints(&mut con, "charge", "tb:deep", "10 0.001 1 MAXDEBT 2");
    assert_eq!(reply[0], 1);
    let debt = stored_tokens(&mut con, "tb:deep");
    assert!((-10.0..-9.99).contains(&debt), "{debt}");
    // A fractional MAXDEBT is a limit like any other; MAXDEBT 0 stops at empty.
    let reply = backend.ints(&mut con, "charge", "tb:frac", "10 0.001 12 MAXDEBT 0.5");
    assert_eq!(reply[0], 1);
    assert_eq!(stored_tokens(&mut con, "tb:frac"), -0.5);
    backend.ints(&mut con, "charge", "tb:floor", "10 0.001 12 MAXDEBT 0");
    assert_eq!(stored_tokens(&mut con, "tb:floor"), 0.0);
}

on_every_backend!(a_charge_in_credit_leaves_no_wait);
fn a_charge_in_credit_leaves_no_wait(backend: Backend) {
    let (_server, mut con) = backend.start();
    let reply = backend.ints(&mut con, "charge", "k", "5 1 1");
    assert_eq!(reply, [1, 4, 0, 1000]);
}

on_every_backend!(a_charge_of_zero_writes_nothing);
fn a_charge_of_zero_writes_nothing(backend: Backend) {
    let (server, mut con) = backend.start();
    let now = server_time_ms(&mut con);
    seed_bucket(&mut con, "k", "1", now - 100);
    let before = snapshot(&mut con, b"k");
    assert!(watch_survives(&server, &mut con, "k", |other| {
        let reply = backend.ints(other, "charge", "k", "5 0.001 0");
        assert_eq!(reply[..3], [1, 1, 0]);
    }));
    assert_eq!(snapshot(&mut con, b"k"), before);
    // Nor on a missing key, nor on one in debt.
    backend.ints(&mut con, "charge", "none", "10 0.001 0");
    assert!(!exists(&mut con, "none"));
    backend.ints(&mut con, "charge", "deep", "10 0.001 100");
    let before = snapshot(&mut con, b"deep");
    backend.ints(&mut con, "charge", "deep", "10 0.001 0");
    assert_eq!(snapshot(&mut con, b"deep"), before);
}

on_every_backend!(a_bucket_in_debt_denies_even_n_0_until_the_debt_is_repaid);
fn a_bucket_in_debt_denies_even_n_0_until_the_debt_is_repaid(backend: Backend) {
    let (_server, mut con) = backend.start();
    // 10 tokens, 10 per second, charged 15: a debt of 5, repaid in 500 ms.
    let reply = backend.ints(&mut con, "charge", "tb:debt0", "10 10 15");
    assert_eq!(reply[..3], [1, 0, 500]);
    let charged_at = stored_last_refill(&mut con, "tb:debt0");
    let before = snapshot(&mut con, b"tb:debt0");
    for command in ["peek", "take", "takeall"] {
        let (t0, reply, t1) = backend.timed(&mut con, command, "tb:debt0", "10 10 0");
        assert_eq!(reply[..2], [0, 0], "{command}: {reply:?}");
        let repaid = charged_at + 500;
        assert_within("retry_after_ms", reply[2], repaid - t1, repaid - t0 + 1);
    }
    assert_eq!(snapshot(&mut con, b"tb:debt0"), before, "nothing written");
    wait_for_server_time(&mut con, charged_at + 510);
    assert_eq!(backend.ints(&mut con, "take", "tb:debt0", "10 10 0")[0], 1);
}

on_every_backend!(a_charge_ignores_a_lock_but_keeps_the_key_until_its_probation_ends);
fn a_charge_ignores_a_lock_but_keeps_the_key_until_its_probation_ends(backend: Backend) {
    let (_server, mut con) = backend.start();
    let now = locked_for_an_hour(&mut con, "k", "5");
    let reply = backend.ints(&mut con, "charge", "k", "5 0.001 1");
    assert_eq!(reply[..2], [1, 4]);
    assert_eq!(pexpiretime(&mut con, "k"), now + 2 * HOUR_MS);
}

on_every_backend!(a_charge_is_allowed_on_a_locked_key_and_keeps_the_lock);
fn a_charge_is_allowed_on_a_locked_key_and_keeps_the_lock(backend: Backend) {
    let (_server, mut con) = backend.start();
    let lock = backend.locked_slow_bucket(&mut con, "tb:locked", "60000");
    let reply = backend.ints(&mut con, "charge", "tb:locked", "1 0.001 1");
    assert_eq!(reply[0], 1, "the work is done already: {reply:?}");
    assert_eq!(stored_lock(&mut con, "tb:locked"), lock);
    assert!(stored_tokens(&mut con, "tb:locked") < 0.0, "in debt");
    let deadline = pexpiretime(&mut con, "tb:locked");
    assert!(deadline >= lock.2, "the TTL covers the probation");
}
