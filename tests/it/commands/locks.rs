//! Locks: `BLOCK ms [MAXBLOCK ms]` on TB.TAKE and TB.TAKEALL, on the module and on its Lua
//! twin (one case, two tests: `<case>::on_module`, `<case>::on_twin`). The contract is in
//! docs/commands.md; the arithmetic is core/src/bucket.rs (`locked`, `lock_on_denial`) and
//! core/src/lockout.rs; what is written, src/bucket/hash.rs. TB.UNBLOCK is in unblock.rs.
//!
//! Exact figures come from frozen buckets and from locks written by hand (harness/buckets.rs);
//! where a reply depends on the instant of the call, it is bounded by the server clock read
//! before and after it. Every wait is a bounded poll of the server clock.

use crate::harness::*;

on_every_backend!(a_denial_with_block_locks_the_key);
fn a_denial_with_block_locks_the_key(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "0");
    // Denied: the token is 1 s away, the lock 5 s; the wait is the later.
    let reply = backend.ints(&mut con, "take", "k", "5 1 1 BLOCK 5000");
    assert_eq!(reply, [0, 0, 5000, 5000]);
    assert_eq!(lock_stored(&mut con, "k"), [5000, 1, 10_000]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("0"));
}

on_every_backend!(
    a_denial_with_block_locks_the_key_until_the_lock_ends_while_tokens_keep_refilling
);
fn a_denial_with_block_locks_the_key_until_the_lock_ends_while_tokens_keep_refilling(
    backend: Backend,
) {
    let (_server, mut con) = backend.start();
    // 5 tokens, 10 per second: empty now, full again in 500 ms.
    backend.drain(&mut con, "tb:lock", "5", "10");
    let (before, reply, after) = backend.timed(&mut con, "take", "tb:lock", "5 10 1 BLOCK 3000");
    // A token would be back within 100 ms; the lock is the later, so it is the wait.
    assert_eq!(reply[..3], [0, 0, 3000], "{reply:?}");
    let (until, strikes, probation) = stored_lock(&mut con, "tb:lock");
    assert_within("locked_until", until, before + 3000, after + 3000);
    assert_eq!(strikes, 1);
    let again = until + 3000;
    assert_eq!(probation, again, "probation: as long again as the lock");
    backend.assert_counter(&mut con, "tb_locks_started", 1);

    // The bucket fills up meanwhile (500 ms), and still every call is denied.
    sleep_ms(700);
    let checks = [
        ("peek", "tb:lock", "5 10 1"),
        ("peek", "tb:lock", "5 10"),
        ("take", "tb:lock", "5 10 1"),
        ("take", "tb:lock", "5 10 0"),
        ("take", "tb:lock", "5 10 1 MAXWAIT 100000"),
        ("take", "tb:lock", "5 10 1 BLOCK 3000"),
        ("takeall", "tb:lock tb:other", "5 10 1 5 10 1"),
    ];
    for (command, keys, args) in checks {
        let (before, reply, after) = backend.timed(&mut con, command, keys, args);
        let call = format!("{command} {keys} {args}");
        assert!(
            after < until,
            "the lock ended before {call}; machine too slow"
        );
        assert_eq!(
            reply[..2],
            [0, 5],
            "{call}: denied, the bucket full: {reply:?}"
        );
        assert_within("retry_after_ms", reply[2], until - after, until - before);
        assert_eq!(reply[3], 0, "full: reset_after_ms 0");
        if command == "takeall" {
            assert_eq!(reply[4], 0, "the locked bucket decides");
        }
    }
    assert!(!exists(&mut con, "tb:other"), "TB.TAKEALL took nothing");
    let unchanged = (until, 1, probation);
    assert_eq!(stored_lock(&mut con, "tb:lock"), unchanged, "no new strike");

    // Once it ends, the bucket serves again; the lock's fields stay for the probation.
    wait_for_server_time(&mut con, until);
    let reply = backend.ints(&mut con, "take", "tb:lock", "5 10 1");
    assert_eq!(reply[..3], [1, 4, 0], "{reply:?}");
    assert_eq!(stored_lock(&mut con, "tb:lock"), unchanged);
}

on_every_backend!(a_locked_denial_waits_for_the_later_of_the_lock_end_and_the_tokens);
fn a_locked_denial_waits_for_the_later_of_the_lock_end_and_the_tokens(backend: Backend) {
    let (_server, mut con) = backend.start();
    // Tokens later than the lock: one token per 1000 s, a lock of 2 s.
    let (until, _, _) = backend.locked_slow_bucket(&mut con, "tb:slow", "2000");
    let reply = backend.ints(&mut con, "peek", "tb:slow", "1 0.001 1");
    assert_eq!(reply[..2], [0, 0]);
    assert_within("retry_after_ms (the token)", reply[2], 990_000, 1_000_000);
    assert!(server_time_ms(&mut con) < until, "still locked");
    // More than the capacity can never succeed, lock or not.
    let reply = backend.ints(&mut con, "take", "tb:slow", "1 0.001 2");
    assert_eq!(reply[..3], [0, 0, -1], "{reply:?}");
    let reply = backend.ints(&mut con, "take", "tb:fresh", "1 0.001 2 BLOCK 10");
    assert_eq!(
        reply[..3],
        [0, 1, -1],
        "a lock does not shorten never: {reply:?}"
    );

    // The lock later than the tokens: 10 per second, a lock of 2 s.
    backend.drain(&mut con, "tb:fast", "10", "10");
    let reply = backend.ints(&mut con, "take", "tb:fast", "10 10 1 BLOCK 2000");
    assert_eq!(reply[..3], [0, 0, 2000], "{reply:?}");
}

on_every_backend!(a_lock_start_is_one_hset_of_the_five_fields_then_the_deadline_of_its_probation);
fn a_lock_start_is_one_hset_of_the_five_fields_then_the_deadline_of_its_probation(
    backend: Backend,
) {
    let (server, mut con) = backend.start_with(AOF_ARGS);
    // A missing key is full: 6 tokens of 5 can never be taken, and that denial locks too.
    let reply = backend.ints(&mut con, "take", "k", "5 1 6 BLOCK 1000");
    assert_eq!(reply, [0, 5, -1, 0]);
    let stored = fields(&mut con, "k");
    let names: Vec<&str> = stored.iter().map(|(name, _)| name.as_str()).collect();
    let five = [
        "tokens",
        "last_refill",
        "locked_until",
        "strikes",
        "probation_until",
    ];
    assert_eq!(names, five);
    let probation = int_field(&mut con, "k", "probation_until");
    // Full at once (a deadline of now + 1), but kept until the probation ends.
    assert_eq!(pexpiretime(&mut con, "k"), probation);
    let mut hset = vec![b"HSET".to_vec(), b"k".to_vec()];
    for (name, value) in &stored {
        hset.push(name.clone().into_bytes());
        hset.push(value.clone().into_bytes());
    }
    let pexpireat = argv(&["PEXPIREAT", "k", &probation.to_string()]);
    assert_eq!(effects_on(&server, &mut con, "k"), vec![hset, pexpireat]);
}

on_every_backend!(a_locked_key_denies_even_a_full_bucket);
fn a_locked_key_denies_even_a_full_bucket(backend: Backend) {
    let (_server, mut con) = backend.start();
    locked_for_an_hour(&mut con, "k", "5");
    let reply = backend.ints(&mut con, "take", "k", "5 1 1");
    assert_eq!(reply[..2], [0, 5]);
    let wait = reply[2];
    assert_within("wait until the lock ends", wait, HOUR_MS - 5000, HOUR_MS);
    assert_eq!(reply[3], 0);
}

on_every_backend!(a_locked_key_denies_a_peek_and_a_look_of_zero);
fn a_locked_key_denies_a_peek_and_a_look_of_zero(backend: Backend) {
    let (_server, mut con) = backend.start();
    locked_for_an_hour(&mut con, "k", "5");
    for command in ["peek", "take"] {
        for n in ["0", "1"] {
            let reply = backend.ints(&mut con, command, "k", &format!("5 1 {n}"));
            assert_eq!(reply[0], 0, "{command} n {n}");
        }
    }
}

on_every_backend!(a_denial_during_a_lock_writes_nothing_and_adds_no_strike);
fn a_denial_during_a_lock_writes_nothing_and_adds_no_strike(backend: Backend) {
    let (server, mut con) = backend.start();
    let now = locked_for_an_hour(&mut con, "k", "0");
    let _: i64 = redis::cmd("PEXPIREAT")
        .arg("k")
        .arg(now + 2 * HOUR_MS)
        .query(&mut con)
        .unwrap();
    let before = snapshot(&mut con, b"k");
    assert!(watch_survives(&server, &mut con, "k", |other| {
        let reply = backend.ints(other, "take", "k", "5 1 1 BLOCK 10 MAXWAIT 5");
        assert_eq!(reply[0], 0);
    }));
    assert_eq!(snapshot(&mut con, b"k"), before);
}

on_every_backend!(a_lock_on_one_key_denies_the_whole_takeall);
fn a_lock_on_one_key_denies_the_whole_takeall(backend: Backend) {
    let (_server, mut con) = backend.start();
    locked_for_an_hour(&mut con, "b", "5");
    let reply = backend.ints(&mut con, "takeall", "a b", "5 1 1 5 1 1");
    assert_eq!((reply[0], reply[4]), (0, 1), "denied by b: {reply:?}");
    assert!(!exists(&mut con, "a"), "nothing taken from a");
}

on_every_backend!(tb_takeall_with_block_locks_each_denying_bucket_and_no_other);
fn tb_takeall_with_block_locks_each_denying_bucket_and_no_other(backend: Backend) {
    let (_server, mut con) = backend.start();
    let keys = "{u}:full {u}:empty";
    backend.drain(&mut con, "{u}:empty", "1", "0.001");
    let reply = backend.ints(&mut con, "takeall", keys, "5 0.001 1 1 0.001 1 BLOCK 60000");
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
    let reply = backend.ints(&mut con, "takeall", keys, "5 0.001 1 1 0.001 0");
    assert_eq!((reply[0], reply[4]), (0, 1), "{reply:?}");
    backend.assert_counter(&mut con, "tb_locks_started", 1);
}

on_every_backend!(a_takeall_denial_with_block_locks_every_bucket_that_denied);
fn a_takeall_denial_with_block_locks_every_bucket_that_denied(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "a", "0");
    frozen(&mut con, "b", "5");
    frozen(&mut con, "c", "0");
    // b's capacity is 10, so its repaired hash stays 5 s (a full one would expire at once).
    let args = "5 1 1 10 1 1 5 1 1 BLOCK 1000";
    let reply = backend.ints(&mut con, "takeall", "a b c", args);
    assert_eq!(reply, [0, 0, 1000, 5000, 0]);
    for key in ["a", "c"] {
        assert_eq!(lock_stored(&mut con, key), [1000, 1, 2000], "{key}");
    }
    // b allowed alone, so nothing taken from it: only its clock repaired.
    assert_eq!(field(&mut con, "b", "locked_until"), None);
    assert_eq!(field(&mut con, "b", "tokens").as_deref(), Some("5"));
}

on_every_backend!(an_ended_lock_lets_takes_through_and_keeps_the_key_until_its_probation_ends);
fn an_ended_lock_lets_takes_through_and_keeps_the_key_until_its_probation_ends(backend: Backend) {
    let (_server, mut con) = backend.start();
    let now = server_time_ms(&mut con);
    let lock = [now - 1000, 1, now + HOUR_MS];
    locked_bucket(&mut con, "k", "5", now, lock);
    let reply = backend.ints(&mut con, "take", "k", "5 1 1");
    assert_eq!(reply[..3], [1, 4, 0]);
    let names = ["locked_until", "strikes", "probation_until"];
    for (name, value) in names.iter().zip(lock) {
        assert_eq!(int_field(&mut con, "k", name), value, "{name} kept");
    }
    assert_eq!(pexpiretime(&mut con, "k"), now + HOUR_MS);
}

on_every_backend!(a_write_on_a_key_with_a_lock_stored_rewrites_only_tokens_and_last_refill);
fn a_write_on_a_key_with_a_lock_stored_rewrites_only_tokens_and_last_refill(backend: Backend) {
    let (server, mut con) = backend.start_with(AOF_ARGS);
    let now = server_time_ms(&mut con);
    locked_bucket(&mut con, "k", "1", now, [now - 1000, 2, now + HOUR_MS]);
    let reply = backend.ints(&mut con, "refund", "k", "5 0.001 1");
    assert_eq!(reply[..2], [1, 2]);
    let written = effects_on(&server, &mut con, "k");
    let last = &written[written.len() - 2..];
    let tokens = field(&mut con, "k", "tokens").unwrap();
    let last_refill = field(&mut con, "k", "last_refill").unwrap();
    let hset = argv(&["HSET", "k", "tokens", &tokens, "last_refill", &last_refill]);
    let deadline = (now + HOUR_MS).to_string();
    assert_eq!(last, [hset, argv(&["PEXPIREAT", "k", &deadline])]);
}

on_every_backend!(a_refund_does_not_lift_a_lock);
fn a_refund_does_not_lift_a_lock(backend: Backend) {
    let (_server, mut con) = backend.start();
    let lock = backend.locked_slow_bucket(&mut con, "tb:refunded", "60000");
    let reply = backend.ints(&mut con, "refund", "tb:refunded", "1 0.001 1");
    assert_eq!(reply[..2], [1, 1], "the token is back: {reply:?}");
    let kept = stored_lock(&mut con, "tb:refunded");
    assert_eq!(kept, lock, "the lock is kept");
    let deadline = pexpiretime(&mut con, "tb:refunded");
    assert!(deadline >= lock.2, "the TTL still covers it");
    let reply = backend.ints(&mut con, "take", "tb:refunded", "1 0.001 1");
    assert_eq!(reply[..2], [0, 1], "a full bucket, still locked: {reply:?}");
}

on_every_backend!(the_keys_ttl_covers_the_locks_probation);
fn the_keys_ttl_covers_the_locks_probation(backend: Backend) {
    let (_server, mut con) = backend.start();
    // 10 tokens, 100 per second: full again 100 ms after a drain, long before the
    // probation (a lock of 800 ms, its probation 800 ms more) ends.
    backend.drain(&mut con, "tb:ttl", "10", "100");
    let reply = backend.ints(&mut con, "take", "tb:ttl", "10 100 5 BLOCK 800");
    assert_eq!(reply[0], 0);
    let (until, _, probation) = stored_lock(&mut con, "tb:ttl");
    let deadline = pexpiretime(&mut con, "tb:ttl");
    assert_eq!(deadline, probation, "the TTL ends with the probation");

    // A take after the lock writes the bucket again, and keeps that deadline (not the
    // 10 ms to full).
    wait_for_server_time(&mut con, until);
    assert_eq!(backend.ints(&mut con, "take", "tb:ttl", "10 100 1")[0], 1);
    assert_eq!(pexpiretime(&mut con, "tb:ttl"), probation);
    // Then the key goes, strikes and all, when the probation ends.
    wait_until(
        "the key to expire after its probation",
        std::time::Duration::from_secs(10),
        || !exists(&mut con, "tb:ttl"),
    );
    assert!(server_time_ms(&mut con) >= probation);
    backend.ints(&mut con, "take", "tb:ttl", "10 100 10");
    let reply = backend.ints(
        &mut con,
        "take",
        "tb:ttl",
        "10 100 5 BLOCK 800 MAXBLOCK 9000",
    );
    assert_eq!(reply[0], 0);
    assert_eq!(stored_lock(&mut con, "tb:ttl").1, 1, "a first strike again");
}

// --- MAXBLOCK: locks that grow within their probation ---------------------------------------

on_every_backend!(a_lock_within_probation_doubles_up_to_maxblock);
fn a_lock_within_probation_doubles_up_to_maxblock(backend: Backend) {
    let (_server, mut con) = backend.start();
    let args = "5 0.001 1 BLOCK 100 MAXBLOCK 300";
    let now = server_time_ms(&mut con);
    locked_bucket(&mut con, "k", "0", now, [now - 10, 1, now + HOUR_MS]);
    backend.ints(&mut con, "take", "k", args);
    let stored = lock_stored(&mut con, "k");
    assert_eq!(stored, [200, 2, 400], "second strike: twice BLOCK");
    // A third strike would last 400: MAXBLOCK caps it.
    locked_bucket(&mut con, "k", "0", now, [now - 10, 2, now + HOUR_MS]);
    backend.ints(&mut con, "take", "k", args);
    assert_eq!(lock_stored(&mut con, "k"), [300, 3, 600]);
}

on_every_backend!(
    with_maxblock_each_lock_within_the_probation_doubles_up_to_maxblock_and_after_it_starts_over
);
fn with_maxblock_each_lock_within_the_probation_doubles_up_to_maxblock_and_after_it_starts_over(
    backend: Backend,
) {
    let (_server, mut con) = backend.start();
    backend.drain(&mut con, "tb:esc", "1", "0.001");
    let deny = |con: &mut redis::Connection| {
        let args = "1 0.001 1 BLOCK 300 MAXBLOCK 1000";
        let reply = backend.ints(con, "take", "tb:esc", args);
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
        let latest = server_time_ms(&mut con) + length;
        assert_within("locked_until", next.0, at + length, latest);
        lock = next;
    }
    // After the probation, the next lock is a first one again.
    wait_for_server_time(&mut con, lock.2);
    let fresh = deny(&mut con);
    assert_eq!((fresh.1, fresh.2 - fresh.0), (1, 300), "{fresh:?}");
    backend.assert_counter(&mut con, "tb_locks_started", 5);
}

on_every_backend!(a_lock_after_its_probation_starts_over);
fn a_lock_after_its_probation_starts_over(backend: Backend) {
    let (_server, mut con) = backend.start();
    let now = server_time_ms(&mut con);
    locked_bucket(&mut con, "k", "0", now, [now - 2000, 5, now - 1000]);
    backend.ints(&mut con, "take", "k", "5 0.001 1 BLOCK 100 MAXBLOCK 10000");
    assert_eq!(lock_stored(&mut con, "k"), [100, 1, 200]);
}

on_every_backend!(without_maxblock_locks_never_grow);
fn without_maxblock_locks_never_grow(backend: Backend) {
    let (_server, mut con) = backend.start();
    let now = server_time_ms(&mut con);
    locked_bucket(&mut con, "k", "0", now, [now - 10, 3, now + HOUR_MS]);
    backend.ints(&mut con, "take", "k", "5 0.001 1 BLOCK 100");
    assert_eq!(lock_stored(&mut con, "k"), [100, 4, 200]);
}

on_every_backend!(without_block_a_denial_never_locks);
fn without_block_a_denial_never_locks(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "0");
    let reply = backend.ints(&mut con, "take", "k", "5 1 1 MAXWAIT 10");
    assert_eq!(reply[0], 0);
    assert_eq!(field(&mut con, "k", "locked_until"), None);
}

// --- Lock fields as stored ------------------------------------------------------------------

on_every_backend!(damaged_lock_fields_are_refused_naming_the_key);
fn damaged_lock_fields_are_refused_naming_the_key(backend: Backend) {
    let (_server, mut con) = backend.start();
    let now = server_time_ms(&mut con).to_string();
    let later = (server_time_ms(&mut con) + 1000).to_string();
    // Each with the lock fields it stores: damaged, partial or out of order.
    let lock = |locked_until, strikes, probation_until| {
        vec![
            ("locked_until", locked_until),
            ("strikes", strikes),
            ("probation_until", probation_until),
        ]
    };
    let damaged: Vec<Vec<(&str, &str)>> = vec![
        lock("x", "1", &later),
        vec![("locked_until", &now)],
        vec![("locked_until", &now), ("strikes", "1")],
        lock(&now, "0", &later),
        lock(&later, "1", &now),
        lock("-1", "1", &later),
        lock("1.5", "1", &later),
        lock("0x10", "1", &later),
        lock(&now, "1", "9.1e15"),
        lock(&now, "1", "-1"),
        lock("", "1", &later),
    ];
    let commands = [
        ("take", "5 1 1"),
        ("peek", "5 1"),
        ("refund", "5 1 1"),
        ("charge", "5 1 1"),
        ("takeall", "5 1 1"),
        ("throttle", "4 1 1"),
    ];
    for (key, shown) in keys_that_need_escaping("rl:") {
        let want = format!(
            "ERR corrupt bucket '{shown}': locked_until, strikes and probation_until must be \
             whole numbers"
        );
        for lock in &damaged {
            let _: i64 = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
            let mut hset = redis::cmd("HSET");
            hset.arg(&key).arg(&["tokens", "1", "last_refill", &now]);
            for (name, value) in lock {
                hset.arg(*name).arg(*value);
            }
            let _: i64 = hset.query(&mut con).unwrap();
            let before = snapshot(&mut con, &key);
            for (command, args) in commands {
                let args: Vec<&[u8]> = args.split(' ').map(str::as_bytes).collect();
                let got = outcome(&mut con, &backend.cmd_for(command, &[&key], &args));
                let what = format!("{command} {lock:?} under {shown}");
                assert_eq!(got, Err(want.clone()), "{what}");
            }
            assert_eq!(snapshot(&mut con, &key), before, "{lock:?}: key touched");
        }
    }
}

on_every_backend!(lock_fields_are_read_in_any_spelling_of_a_stored_whole_number);
fn lock_fields_are_read_in_any_spelling_of_a_stored_whole_number(backend: Backend) {
    let (_server, mut con) = backend.start();
    let until = server_time_ms(&mut con) + HOUR_MS;
    frozen(&mut con, "k", "5");
    let until_text = format!("+{}e-3", until * 1000);
    let probation_text = format!("{}.0", until + HOUR_MS);
    hset(
        &mut con,
        "k",
        &[
            ("locked_until", &until_text),
            ("strikes", "1E0"),
            ("probation_until", &probation_text),
        ],
    );
    let reply = backend.ints(&mut con, "take", "k", "5 1 1");
    assert_eq!(reply[0], 0, "locked");
}

on_every_backend!(strikes_without_locked_until_are_no_lock);
fn strikes_without_locked_until_are_no_lock(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "5");
    let stray = [("strikes", "garbage"), ("probation_until", "x")];
    hset(&mut con, "k", &stray);
    let reply = backend.ints(&mut con, "take", "k", "5 1 1");
    assert_eq!(reply[..3], [1, 4, 0]);
}
