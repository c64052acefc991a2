//! The Lua twin (`lua/tb.lua`) on its own, on a server without the module: what its
//! reservations (`MAXWAIT`), locks (`BLOCK`, `MAXBLOCK`), `tb_charge`, `tb_unblock` and
//! `tb_throttle` do, one behaviour per test, against the contract of core/src/bucket.rs,
//! core/src/lockout.rs and core/src/throttle.rs. tests/it/twin/differential.rs compares the same
//! calls with the module's.
//!
//! Exact figures come from buckets whose `last_refill` lies far in the future: such a
//! `last_refill` counts as now (and the call repairs it to now), so no refill happens before
//! the call, whatever the clock shows. Locks are written by hand relative to the server's
//! clock, an hour from now, or read back from what a call stored (`last_refill` is the
//! call's `now`).

use crate::harness::*;
use redis::Value;

/// A `last_refill` far ahead of any clock: the bucket is seen as it is stored, at now.
const FROZEN: &str = "99999999999999";
/// An hour, in ms: a lock that outlasts any test.
const HOUR_MS: i64 = 3_600_000;

/// A server without the module, with the twin loaded as a FUNCTION library.
fn library() -> (Server, redis::Connection) {
    library_with(&[])
}

fn library_with(extra: &[&str]) -> (Server, redis::Connection) {
    let server = Server::start_without_module(extra);
    let mut con = server.conn();
    Fallback::function(&mut con);
    (server, con)
}

/// `FCALL tb_<command>` on `keys` with `args`: the reply, or the exact error text.
fn call(
    con: &mut redis::Connection,
    command: &str,
    keys: &[&str],
    args: &[&str],
) -> Result<Value, String> {
    let keys: Vec<&[u8]> = keys.iter().map(|key| key.as_bytes()).collect();
    let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
    outcome(con, &Fallback::Function.cmd_for(command, &keys, &args))
}

/// `call`'s reply as integers; panics, naming the call, on an error.
fn ints(con: &mut redis::Connection, command: &str, keys: &[&str], args: &[&str]) -> Vec<i64> {
    let reply = call(con, command, keys, args)
        .unwrap_or_else(|e| panic!("tb_{command} {keys:?} {args:?}: {e}"));
    redis::from_redis_value(&reply)
        .unwrap_or_else(|e| panic!("tb_{command} {keys:?} {args:?}: {e}: {reply:?}"))
}

/// `tb_unblock key`: 1 when it removed a lock, 0 when there was none.
fn unblock(con: &mut redis::Connection, key: &str) -> i64 {
    let reply =
        call(con, "unblock", &[key], &[]).unwrap_or_else(|e| panic!("tb_unblock {key}: {e}"));
    redis::from_redis_value(&reply).unwrap_or_else(|e| panic!("tb_unblock {key}: {e}: {reply:?}"))
}

/// `call`'s error text; panics if it succeeds.
fn error(con: &mut redis::Connection, command: &str, keys: &[&str], args: &[&str]) -> String {
    match call(con, command, keys, args) {
        Ok(reply) => panic!("tb_{command} {keys:?} {args:?} accepted: {reply:?}"),
        Err(e) => e,
    }
}

/// The hash's fields and values in the server's order (HGETALL).
fn fields(con: &mut redis::Connection, key: &str) -> Vec<(String, String)> {
    redis::cmd("HGETALL").arg(key).query(con).expect("HGETALL")
}

/// One field of a hash (nil: missing).
fn field(con: &mut redis::Connection, key: &str, name: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(key)
        .arg(name)
        .query(con)
        .expect("HGET")
}

/// One field of a hash as an integer.
fn int_field(con: &mut redis::Connection, key: &str, name: &str) -> i64 {
    let text = field(con, key, name).unwrap_or_else(|| panic!("no {name} in {key}"));
    text.parse()
        .unwrap_or_else(|e| panic!("{name} = {text:?} in {key}: {e}"))
}

/// A bucket holding `tokens` that sees no refill before the next call.
fn frozen(con: &mut redis::Connection, key: &str, tokens: &str) {
    seed_bucket(con, key, tokens, FROZEN);
}

/// A bucket holding `tokens` at `last_refill`, with a lock of `strikes` ending at
/// `locked_until` and a probation ending at `probation_until`.
fn locked_bucket(
    con: &mut redis::Connection,
    key: &str,
    tokens: &str,
    last_refill: i64,
    [locked_until, strikes, probation_until]: [i64; 3],
) {
    hset(
        con,
        key,
        &[
            ("tokens", tokens),
            ("last_refill", &last_refill.to_string()),
            ("locked_until", &locked_until.to_string()),
            ("strikes", &strikes.to_string()),
            ("probation_until", &probation_until.to_string()),
        ],
    );
}

/// The lock a key stores, as [locked_until, strikes, probation_until] relative to its
/// `last_refill` (the `now` of the call that stored it): [length, strikes, length * 2].
fn lock_stored(con: &mut redis::Connection, key: &str) -> [i64; 3] {
    let now = int_field(con, key, "last_refill");
    [
        int_field(con, key, "locked_until") - now,
        int_field(con, key, "strikes"),
        int_field(con, key, "probation_until") - now,
    ]
}

/// The commands the server appended to its AOF (run with `AOF_ARGS`) that touch `key`, in
/// order, without the MULTI/EXEC a script's effects come in.
fn effects_on(server: &Server, con: &mut redis::Connection, key: &str) -> Vec<Vec<Vec<u8>>> {
    aof_without_select(server, con)
        .into_iter()
        .filter(|argv| argv.len() > 1 && argv[1] == key.as_bytes())
        .collect()
}

// --- MAXWAIT: reservations ---------------------------------------------------------------

#[test]
fn maxwait_allows_into_debt_and_waits_until_it_is_repaid() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "0");
    // 5 tokens at 1 per second, none left: the token arrives in 1 s, within MAXWAIT.
    let reply = ints(
        &mut con,
        "take",
        &["k"],
        &["5", "1", "1", "MAXWAIT", "2000"],
    );
    assert_eq!(reply, [1, 0, 1000, 6000]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("-1"));
    let now = int_field(&mut con, "k", "last_refill");
    assert_eq!(pexpiretime(&mut con, "k"), now + 6000);
}

#[test]
fn maxwait_denies_what_arrives_too_late_with_the_wait_from_the_horizon() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "0");
    // 3 tokens take 3 s; a call with MAXWAIT 2000 is allowed 1 s from now.
    let reply = ints(
        &mut con,
        "take",
        &["k"],
        &["5", "1", "3", "MAXWAIT", "2000"],
    );
    assert_eq!(reply, [0, 0, 1000, 5000]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("0"));
}

#[test]
fn a_denied_reservation_writes_nothing() {
    let (server, mut con) = library();
    let now = server_time_ms(&mut con);
    seed_bucket(&mut con, "k", "0", now);
    let before = snapshot(&mut con, b"k");
    assert!(watch_survives(&server, &mut con, "k", |other| {
        let reply = ints(
            other,
            "take",
            &["k"],
            &["5", "0.001", "1", "MAXWAIT", "1000"],
        );
        assert_eq!(reply[..2], [0, 0]);
    }));
    assert_eq!(snapshot(&mut con, b"k"), before);
}

#[test]
fn maxwait_zero_is_a_plain_take() {
    let (_server, mut con) = library();
    for (i, tokens) in ["0", "0.5", "3", "-2"].iter().enumerate() {
        for n in ["0", "1", "2.5", "6"] {
            let (plain, with) = (format!("p:{i}:{n}"), format!("w:{i}:{n}"));
            frozen(&mut con, &plain, tokens);
            frozen(&mut con, &with, tokens);
            let a = ints(&mut con, "take", &[&plain], &["5", "1", n]);
            let b = ints(&mut con, "take", &[&with], &["5", "1", n, "MAXWAIT", "0"]);
            assert_eq!(a, b, "tokens {tokens} n {n}");
            assert_eq!(
                field(&mut con, &plain, "tokens"),
                field(&mut con, &with, "tokens")
            );
        }
    }
}

#[test]
fn maxwait_never_reserves_more_than_the_capacity() {
    let (_server, mut con) = library();
    let reply = ints(
        &mut con,
        "take",
        &["k"],
        &["5", "1", "6", "MAXWAIT", "9007199254740992"],
    );
    assert_eq!(reply, [0, 5, -1, 0]);
    assert!(!exists(&mut con, "k"));
}

#[test]
fn reservations_are_served_in_arrival_order() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "0");
    // When each caller may act (its `now`, the `last_refill` it wrote, plus its wait): each
    // reservation deepens the debt by a token, a second of refill later than the one before,
    // however long the calls took (1 ms of rounding).
    let go: Vec<i64> = (0..3)
        .map(|_| {
            let wait = ints(
                &mut con,
                "take",
                &["k"],
                &["10", "1", "1", "MAXWAIT", "10000"],
            )[2];
            int_field(&mut con, "k", "last_refill") + wait
        })
        .collect();
    assert_within("second", go[1] - go[0], 999, 1001);
    assert_within("third", go[2] - go[1], 999, 1001);
}

#[test]
fn a_bucket_in_debt_has_no_tokens_left_and_waits_for_the_repayment() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "-3");
    // Peek: 0 left (never below), the debt of 3 and the token wanted take 4 s.
    let reply = ints(&mut con, "peek", &["k"], &["5", "1", "1"]);
    assert_eq!(reply, [0, 0, 4000, 8000]);
}

// --- BLOCK and MAXBLOCK: locks -------------------------------------------------------------

#[test]
fn a_denial_with_block_locks_the_key() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "0");
    // Denied: the token is 1 s away, the lock 5 s; the wait is the later.
    let reply = ints(&mut con, "take", &["k"], &["5", "1", "1", "BLOCK", "5000"]);
    assert_eq!(reply, [0, 0, 5000, 5000]);
    assert_eq!(lock_stored(&mut con, "k"), [5000, 1, 10_000]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("0"));
}

#[test]
fn a_lock_start_is_one_hset_of_the_five_fields_then_the_deadline_of_its_probation() {
    let (server, mut con) = library_with(AOF_ARGS);
    // A missing key is full: 6 tokens of 5 can never be taken, and that denial locks too.
    let reply = ints(&mut con, "take", &["k"], &["5", "1", "6", "BLOCK", "1000"]);
    assert_eq!(reply, [0, 5, -1, 0]);
    let stored = fields(&mut con, "k");
    let names: Vec<&str> = stored.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        [
            "tokens",
            "last_refill",
            "locked_until",
            "strikes",
            "probation_until"
        ]
    );
    let probation = int_field(&mut con, "k", "probation_until");
    // Full at once (a deadline of now + 1), but kept until the probation ends.
    assert_eq!(pexpiretime(&mut con, "k"), probation);
    let mut hset = vec![b"HSET".to_vec(), b"k".to_vec()];
    for (name, value) in &stored {
        hset.push(name.clone().into_bytes());
        hset.push(value.clone().into_bytes());
    }
    assert_eq!(
        effects_on(&server, &mut con, "k"),
        vec![hset, argv(&["PEXPIREAT", "k", &probation.to_string()])]
    );
}

#[test]
fn a_locked_key_denies_even_a_full_bucket() {
    let (_server, mut con) = library();
    let now = server_time_ms(&mut con);
    locked_bucket(
        &mut con,
        "k",
        "5",
        now,
        [now + HOUR_MS, 1, now + 2 * HOUR_MS],
    );
    let reply = ints(&mut con, "take", &["k"], &["5", "1", "1"]);
    assert_eq!(reply[..2], [0, 5]);
    assert_within(
        "wait until the lock ends",
        reply[2],
        HOUR_MS - 5000,
        HOUR_MS,
    );
    assert_eq!(reply[3], 0);
}

#[test]
fn a_locked_key_denies_a_peek_and_a_look_of_zero() {
    let (_server, mut con) = library();
    let now = server_time_ms(&mut con);
    locked_bucket(
        &mut con,
        "k",
        "5",
        now,
        [now + HOUR_MS, 1, now + 2 * HOUR_MS],
    );
    for n in ["0", "1"] {
        assert_eq!(
            ints(&mut con, "peek", &["k"], &["5", "1", n])[0],
            0,
            "peek n {n}"
        );
        assert_eq!(
            ints(&mut con, "take", &["k"], &["5", "1", n])[0],
            0,
            "take n {n}"
        );
    }
}

#[test]
fn a_denial_during_a_lock_writes_nothing_and_adds_no_strike() {
    let (server, mut con) = library();
    let now = server_time_ms(&mut con);
    locked_bucket(
        &mut con,
        "k",
        "0",
        now,
        [now + HOUR_MS, 1, now + 2 * HOUR_MS],
    );
    let _: i64 = redis::cmd("PEXPIREAT")
        .arg("k")
        .arg(now + 2 * HOUR_MS)
        .query(&mut con)
        .unwrap();
    let before = snapshot(&mut con, b"k");
    assert!(watch_survives(&server, &mut con, "k", |other| {
        let reply = ints(
            other,
            "take",
            &["k"],
            &["5", "1", "1", "BLOCK", "10", "MAXWAIT", "5"],
        );
        assert_eq!(reply[0], 0);
    }));
    assert_eq!(snapshot(&mut con, b"k"), before);
}

#[test]
fn a_lock_on_one_key_denies_the_whole_takeall() {
    let (_server, mut con) = library();
    let now = server_time_ms(&mut con);
    locked_bucket(
        &mut con,
        "b",
        "5",
        now,
        [now + HOUR_MS, 1, now + 2 * HOUR_MS],
    );
    let reply = ints(
        &mut con,
        "takeall",
        &["a", "b"],
        &["5", "1", "1", "5", "1", "1"],
    );
    assert_eq!((reply[0], reply[4]), (0, 1), "denied by b: {reply:?}");
    assert!(!exists(&mut con, "a"), "nothing taken from a");
}

#[test]
fn an_ended_lock_lets_takes_through_and_keeps_the_key_until_its_probation_ends() {
    let (_server, mut con) = library();
    let now = server_time_ms(&mut con);
    let lock = [now - 1000, 1, now + HOUR_MS];
    locked_bucket(&mut con, "k", "5", now, lock);
    assert_eq!(
        ints(&mut con, "take", &["k"], &["5", "1", "1"])[..3],
        [1, 4, 0]
    );
    for (name, value) in ["locked_until", "strikes", "probation_until"]
        .iter()
        .zip(lock)
    {
        assert_eq!(int_field(&mut con, "k", name), value, "{name} kept");
    }
    assert_eq!(pexpiretime(&mut con, "k"), now + HOUR_MS);
}

#[test]
fn a_write_on_a_key_with_a_lock_stored_rewrites_only_tokens_and_last_refill() {
    let (server, mut con) = library_with(AOF_ARGS);
    let now = server_time_ms(&mut con);
    locked_bucket(&mut con, "k", "1", now, [now - 1000, 2, now + HOUR_MS]);
    assert_eq!(
        ints(&mut con, "refund", &["k"], &["5", "0.001", "1"])[..2],
        [1, 2]
    );
    let written = effects_on(&server, &mut con, "k");
    let last = &written[written.len() - 2..];
    let tokens = field(&mut con, "k", "tokens").unwrap();
    let last_refill = field(&mut con, "k", "last_refill").unwrap();
    assert_eq!(
        last,
        [
            argv(&["HSET", "k", "tokens", &tokens, "last_refill", &last_refill]),
            argv(&["PEXPIREAT", "k", &(now + HOUR_MS).to_string()]),
        ]
    );
}

#[test]
fn a_lock_within_probation_doubles_up_to_maxblock() {
    let (_server, mut con) = library();
    let args = ["5", "0.001", "1", "BLOCK", "100", "MAXBLOCK", "300"];
    let now = server_time_ms(&mut con);
    locked_bucket(&mut con, "k", "0", now, [now - 10, 1, now + HOUR_MS]);
    let _ = ints(&mut con, "take", &["k"], &args);
    assert_eq!(
        lock_stored(&mut con, "k"),
        [200, 2, 400],
        "second strike: twice BLOCK"
    );
    // A third strike would last 400: MAXBLOCK caps it.
    locked_bucket(&mut con, "k", "0", now, [now - 10, 2, now + HOUR_MS]);
    let _ = ints(&mut con, "take", &["k"], &args);
    assert_eq!(lock_stored(&mut con, "k"), [300, 3, 600]);
}

#[test]
fn a_lock_after_its_probation_starts_over() {
    let (_server, mut con) = library();
    let now = server_time_ms(&mut con);
    locked_bucket(&mut con, "k", "0", now, [now - 2000, 5, now - 1000]);
    let _ = ints(
        &mut con,
        "take",
        &["k"],
        &["5", "0.001", "1", "BLOCK", "100", "MAXBLOCK", "10000"],
    );
    assert_eq!(lock_stored(&mut con, "k"), [100, 1, 200]);
}

#[test]
fn without_maxblock_locks_never_grow() {
    let (_server, mut con) = library();
    let now = server_time_ms(&mut con);
    locked_bucket(&mut con, "k", "0", now, [now - 10, 3, now + HOUR_MS]);
    let _ = ints(
        &mut con,
        "take",
        &["k"],
        &["5", "0.001", "1", "BLOCK", "100"],
    );
    assert_eq!(lock_stored(&mut con, "k"), [100, 4, 200]);
}

#[test]
fn without_block_a_denial_never_locks() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "0");
    assert_eq!(
        ints(&mut con, "take", &["k"], &["5", "1", "1", "MAXWAIT", "10"])[0],
        0
    );
    assert_eq!(field(&mut con, "k", "locked_until"), None);
}

#[test]
fn damaged_lock_fields_are_refused_naming_the_key() {
    let (_server, mut con) = library();
    let now = server_time_ms(&mut con).to_string();
    let later = (server_time_ms(&mut con) + 1000).to_string();
    let damaged: Vec<Vec<(&str, &str)>> = vec![
        vec![
            ("locked_until", "x"),
            ("strikes", "1"),
            ("probation_until", &later),
        ],
        vec![("locked_until", &now)],
        vec![("locked_until", &now), ("strikes", "1")],
        vec![
            ("locked_until", &now),
            ("strikes", "0"),
            ("probation_until", &later),
        ],
        vec![
            ("locked_until", &later),
            ("strikes", "1"),
            ("probation_until", &now),
        ],
        vec![
            ("locked_until", "-1"),
            ("strikes", "1"),
            ("probation_until", &later),
        ],
        vec![
            ("locked_until", "1.5"),
            ("strikes", "1"),
            ("probation_until", &later),
        ],
        vec![
            ("locked_until", "0x10"),
            ("strikes", "1"),
            ("probation_until", &later),
        ],
        vec![
            ("locked_until", &now),
            ("strikes", "1"),
            ("probation_until", "9.1e15"),
        ],
        vec![
            ("locked_until", ""),
            ("strikes", "1"),
            ("probation_until", &later),
        ],
    ];
    for (key, shown) in keys_that_need_escaping("rl:") {
        let want = format!(
            "ERR corrupt bucket '{shown}': locked_until, strikes and probation_until must be \
             whole numbers"
        );
        for lock in &damaged {
            let _: i64 = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
            let _: i64 = redis::cmd("HSET")
                .arg(&key)
                .arg(&["tokens", "1", "last_refill", &now])
                .query(&mut con)
                .unwrap();
            let mut hset = redis::cmd("HSET");
            hset.arg(&key);
            for (name, value) in lock {
                hset.arg(*name).arg(*value);
            }
            let _: i64 = hset.query(&mut con).unwrap();
            let before = snapshot(&mut con, &key);
            for (command, args) in [
                ("take", &["5", "1", "1"][..]),
                ("peek", &["5", "1"][..]),
                ("refund", &["5", "1", "1"][..]),
                ("charge", &["5", "1", "1"][..]),
                ("takeall", &["5", "1", "1"][..]),
                ("throttle", &["4", "1", "1"][..]),
            ] {
                let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
                let got = outcome(&mut con, &Fallback::Function.cmd(command, &key, &args));
                assert_eq!(
                    got,
                    Err(want.clone()),
                    "tb_{command} {lock:?} under {shown}"
                );
            }
            assert_eq!(snapshot(&mut con, &key), before, "{lock:?}: key touched");
        }
    }
}

#[test]
fn lock_fields_are_read_in_any_spelling_of_a_stored_whole_number() {
    let (_server, mut con) = library();
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
    assert_eq!(
        ints(&mut con, "take", &["k"], &["5", "1", "1"])[0],
        0,
        "locked"
    );
}

#[test]
fn strikes_without_locked_until_are_no_lock() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "5");
    hset(
        &mut con,
        "k",
        &[("strikes", "garbage"), ("probation_until", "x")],
    );
    assert_eq!(
        ints(&mut con, "take", &["k"], &["5", "1", "1"])[..3],
        [1, 4, 0]
    );
}

// --- tb_charge ---------------------------------------------------------------------------

#[test]
fn a_charge_takes_whatever_the_bucket_holds_into_debt() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "2");
    // Allowed whatever: 2 - 4 = -2, repaid 2 s from now, full 7 s from now.
    assert_eq!(
        ints(&mut con, "charge", &["k"], &["5", "1", "4"]),
        [1, 0, 2000, 7000]
    );
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("-2"));
    let now = int_field(&mut con, "k", "last_refill");
    assert_eq!(pexpiretime(&mut con, "k"), now + 7000);
}

#[test]
fn a_charge_goes_no_deeper_than_the_capacity_by_default() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "0");
    assert_eq!(
        ints(&mut con, "charge", &["k"], &["5", "1", "100"]),
        [1, 0, 5000, 10_000]
    );
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("-5"));
}

#[test]
fn a_charge_goes_no_deeper_than_maxdebt() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "0");
    let reply = ints(
        &mut con,
        "charge",
        &["k"],
        &["5", "1", "100", "maxdebt", "2.5"],
    );
    assert_eq!(reply, [1, 0, 2500, 7500]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("-2.5"));
}

#[test]
fn a_charge_never_raises_a_debt_below_maxdebt() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "-10");
    let reply = ints(&mut con, "charge", &["k"], &["5", "1", "1", "MAXDEBT", "2"]);
    assert_eq!(reply, [1, 0, 10_000, 15_000]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("-10"));
}

#[test]
fn a_charge_in_credit_leaves_no_wait() {
    let (_server, mut con) = library();
    assert_eq!(
        ints(&mut con, "charge", &["k"], &["5", "1", "1"]),
        [1, 4, 0, 1000]
    );
}

#[test]
fn a_charge_of_zero_writes_nothing() {
    let (server, mut con) = library();
    let now = server_time_ms(&mut con);
    seed_bucket(&mut con, "k", "1", now - 100);
    let before = snapshot(&mut con, b"k");
    assert!(watch_survives(&server, &mut con, "k", |other| {
        assert_eq!(
            ints(other, "charge", &["k"], &["5", "0.001", "0"])[..3],
            [1, 1, 0]
        );
    }));
    assert_eq!(snapshot(&mut con, b"k"), before);
}

#[test]
fn a_charge_ignores_a_lock_but_keeps_the_key_until_its_probation_ends() {
    let (_server, mut con) = library();
    let now = server_time_ms(&mut con);
    locked_bucket(
        &mut con,
        "k",
        "5",
        now,
        [now + HOUR_MS, 1, now + 2 * HOUR_MS],
    );
    assert_eq!(
        ints(&mut con, "charge", &["k"], &["5", "0.001", "1"])[..2],
        [1, 4]
    );
    assert_eq!(pexpiretime(&mut con, "k"), now + 2 * HOUR_MS);
}

// --- tb_unblock --------------------------------------------------------------------------

#[test]
fn unblock_removes_the_lock_and_keeps_the_tokens_and_the_expiry() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "0");
    let _ = ints(&mut con, "take", &["k"], &["5", "1", "1", "BLOCK", "60000"]);
    let expiry = pexpiretime(&mut con, "k");
    let tokens = field(&mut con, "k", "tokens");
    assert_eq!(unblock(&mut con, "k"), 1);
    let names: Vec<String> = fields(&mut con, "k")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(names, ["tokens", "last_refill"]);
    assert_eq!(field(&mut con, "k", "tokens"), tokens);
    assert_eq!(pexpiretime(&mut con, "k"), expiry);
    // No lock: the token, refilled within a second, can be taken again.
    sleep_ms(1000);
    assert_eq!(ints(&mut con, "take", &["k"], &["5", "1", "1"])[0], 1);
}

#[test]
fn unblock_without_a_lock_replies_0_and_writes_nothing() {
    let (server, mut con) = library();
    frozen(&mut con, "k", "1");
    let before = snapshot(&mut con, b"k");
    assert!(watch_survives(&server, &mut con, "k", |other| {
        assert_eq!(unblock(other, "k"), 0);
    }));
    assert_eq!(snapshot(&mut con, b"k"), before);
}

#[test]
fn unblock_of_a_missing_key_replies_0_and_creates_nothing() {
    let (_server, mut con) = library();
    assert_eq!(unblock(&mut con, "k"), 0);
    assert!(!exists(&mut con, "k"));
}

#[test]
fn unblock_removes_stray_lock_fields_too() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "1");
    hset(&mut con, "k", &[("strikes", "x")]);
    assert_eq!(unblock(&mut con, "k"), 1);
    assert_eq!(field(&mut con, "k", "strikes"), None);
}

#[test]
fn unblock_of_another_type_is_wrongtype() {
    let (_server, mut con) = library();
    for key in foreign_values(&mut con, "hash") {
        let key = std::str::from_utf8(key).unwrap();
        assert_eq!(
            error(&mut con, "unblock", &[key], &[]),
            WRONGTYPE_ERROR,
            "{key}"
        );
    }
}

#[test]
fn unblock_takes_exactly_one_key_and_no_arguments() {
    let (_server, mut con) = library();
    assert_eq!(
        error(&mut con, "unblock", &["k"], &["x"]),
        arity_error("tb.unblock")
    );
    assert_eq!(
        error(&mut con, "unblock", &["k", "l"], &[]),
        arity_error("tb.unblock")
    );
}

// --- tb_throttle -------------------------------------------------------------------------

#[test]
fn throttle_replies_as_redis_cell_does() {
    let (_server, mut con) = library();
    // max_burst 4, 1 per 2 s: 5 tokens; one taken, full again in 2 s, no retry.
    assert_eq!(
        ints(&mut con, "throttle", &["k"], &["4", "1", "2"]),
        [0, 5, 4, -1, 2]
    );
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("4"));
}

#[test]
fn a_throttle_denial_reports_whole_seconds() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "0");
    assert_eq!(
        ints(&mut con, "throttle", &["k"], &["4", "1", "2"]),
        [1, 5, 0, 2, 10]
    );
}

#[test]
fn throttle_seconds_are_truncated() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "0.25");
    // 750 ms to the token, 4750 ms to full: 0 s and 4 s.
    assert_eq!(
        ints(&mut con, "throttle", &["k"], &["4", "1", "1"]),
        [1, 5, 0, 0, 4]
    );
}

#[test]
fn a_throttle_quantity_above_the_burst_never_fits() {
    let (_server, mut con) = library();
    assert_eq!(
        ints(&mut con, "throttle", &["k"], &["4", "1", "2", "6"]),
        [1, 5, 5, -1, 0]
    );
    assert_eq!(
        ints(&mut con, "throttle", &["k"], &["4", "1", "2", "0"]),
        [0, 5, 5, -1, 0]
    );
    assert!(!exists(&mut con, "k"));
}

#[test]
fn throttle_reads_a_cell_key_as_the_bucket_it_stands_for() {
    let (_server, mut con) = library();
    // redis-cell's TAT 3 s ahead: 3 of 10 tokens used.
    let tat_ns = (server_time_ms(&mut con) + 3000) * 1_000_000;
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg(tat_ns)
        .query(&mut con)
        .unwrap();
    let reply = ints(&mut con, "throttle", &["k"], &["9", "1", "1"]);
    assert_eq!(reply[..3], [0, 10, 6]);
    // Just under 4 tokens short of full (the clock moved since the SET): 3 whole seconds.
    assert_within("reset_after_s", reply[4], 3, 4);
    let kind: String = redis::cmd("TYPE").arg("k").query(&mut con).unwrap();
    assert_eq!(kind, "hash");
    let tokens: f64 = field(&mut con, "k", "tokens").unwrap().parse().unwrap();
    assert!((6.0..7.0).contains(&tokens), "tokens {tokens}");
}

#[test]
fn the_first_write_of_a_cell_key_is_del_then_hset_then_pexpireat() {
    let (server, mut con) = library_with(AOF_ARGS);
    let _: () = redis::cmd("SET").arg("k").arg("0").query(&mut con).unwrap();
    assert_eq!(
        ints(&mut con, "throttle", &["k"], &["9", "1", "1"])[..3],
        [0, 10, 9]
    );
    let written = effects_on(&server, &mut con, "k");
    let bucket = bucket_write(&mut con, "k");
    assert_eq!(
        written,
        [
            argv(&["SET", "k", "0"]),
            argv(&["DEL", "k"]),
            bucket[0].clone(),
            bucket[1].clone()
        ]
    );
}

#[test]
fn a_denied_throttle_leaves_the_cell_key_as_it_is() {
    let (_server, mut con) = library();
    // 60 s ahead on a bucket of 10 at 1 per s: 50 tokens of debt.
    let tat_ns = (server_time_ms(&mut con) + 60_000) * 1_000_000;
    let _: () = redis::cmd("SET")
        .arg("k")
        .arg(tat_ns)
        .query(&mut con)
        .unwrap();
    let before = snapshot(&mut con, b"k");
    let reply = ints(&mut con, "throttle", &["k"], &["9", "1", "1"]);
    assert_eq!(reply[..3], [1, 10, 0]);
    assert_within("retry_after_s", reply[3], 50, 51);
    assert_eq!(snapshot(&mut con, b"k"), before);
    // A quantity of 0 is allowed and writes nothing either.
    assert_eq!(
        ints(&mut con, "throttle", &["k"], &["9", "1", "1", "0"])[0],
        1
    );
    assert_eq!(snapshot(&mut con, b"k"), before);
}

#[test]
fn a_string_that_is_not_a_cell_value_is_wrongtype() {
    let (_server, mut con) = library();
    for value in [
        "abc",
        "1.5",
        "1e9",
        "",
        " 1",
        "-",
        "9223372036854775808",
        "99999999999999999999",
    ] {
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg(value)
            .query(&mut con)
            .unwrap();
        let before = snapshot(&mut con, b"k");
        assert_eq!(
            error(&mut con, "throttle", &["k"], &["9", "1", "1"]),
            WRONGTYPE_ERROR,
            "{value:?}"
        );
        assert_eq!(snapshot(&mut con, b"k"), before);
    }
    for value in ["-5", "9223372036854775807", "-9223372036854775807", "0001"] {
        let _: () = redis::cmd("SET")
            .arg("k")
            .arg(value)
            .query(&mut con)
            .unwrap();
        assert!(
            call(&mut con, "throttle", &["k"], &["9", "1", "1", "0"]).is_ok(),
            "{value:?}"
        );
    }
}

#[test]
fn only_throttle_reads_a_cell_key() {
    let (_server, mut con) = library();
    let _: () = redis::cmd("SET").arg("k").arg("0").query(&mut con).unwrap();
    for (command, args) in [
        ("take", &["5", "1", "1"][..]),
        ("peek", &["5", "1"][..]),
        ("refund", &["5", "1", "1"][..]),
        ("charge", &["5", "1", "1"][..]),
        ("takeall", &["5", "1", "1"][..]),
    ] {
        assert_eq!(
            error(&mut con, command, &["k"], args),
            WRONGTYPE_ERROR,
            "tb_{command}"
        );
    }
}

#[test]
fn throttle_on_another_type_is_wrongtype() {
    let (_server, mut con) = library();
    for key in foreign_values(&mut con, "hash") {
        let key = std::str::from_utf8(key).unwrap();
        if key == "t:string" {
            continue; // "1", a TAT
        }
        assert_eq!(
            error(&mut con, "throttle", &[key], &["9", "1", "1"]),
            WRONGTYPE_ERROR,
            "{key}"
        );
    }
}

#[test]
fn a_locked_key_throttles() {
    let (_server, mut con) = library();
    let now = server_time_ms(&mut con);
    locked_bucket(
        &mut con,
        "k",
        "10",
        now,
        [now + HOUR_MS, 1, now + 2 * HOUR_MS],
    );
    let reply = ints(&mut con, "throttle", &["k"], &["9", "1", "1"]);
    assert_eq!(reply[..3], [1, 10, 10]);
    assert_within(
        "retry_after_s",
        reply[3],
        HOUR_MS / 1000 - 5,
        HOUR_MS / 1000,
    );
}

#[test]
fn throttle_arguments_are_checked_in_order() {
    let (_server, mut con) = library();
    let _: () = redis::cmd("SET").arg("s").arg("x").query(&mut con).unwrap();
    let burst = "ERR max_burst must be a whole number from 0 to 9007199254740991 (2^53 - 1)";
    let count = "ERR count must be a whole number from 1 to 9007199254740992 (2^53)";
    let period = "ERR period must be a whole number of seconds from 1 to 9007199254740992 (2^53)";
    let quantity = "ERR quantity must be a whole number from 0 to 9007199254740992 (2^53)";
    for (args, want) in [
        (&["-1", "x", "x", "x"][..], burst),
        (&["9007199254740992", "1", "1"][..], burst),
        (&["1.5", "1", "1"][..], burst),
        (&["1", "0", "x"][..], count),
        (&["1", "9007199254740993", "1"][..], count),
        (&["1", "1", "0"][..], period),
        (&["1", "1", "1e3"][..], period),
        (&["1", "1", "1", "1.5"][..], quantity),
        (&["1", "1", "1", "-1"][..], quantity),
    ] {
        assert_eq!(error(&mut con, "throttle", &["s"], args), want, "{args:?}");
    }
    for args in [&["1", "1"][..], &["1", "1", "1", "1", "1"][..]] {
        assert_eq!(
            error(&mut con, "throttle", &["k"], args),
            arity_error("tb.throttle")
        );
    }
    // The largest of each is fine.
    let reply = ints(
        &mut con,
        "throttle",
        &["k"],
        &[
            "9007199254740991",
            "9007199254740992",
            "1",
            "9007199254740992",
        ],
    );
    assert_eq!(reply[..2], [0, 9_007_199_254_740_992]);
}

// --- Options -----------------------------------------------------------------------------

const UNKNOWN_OPTION: &str = "ERR unknown option (TB.TAKE and TB.TAKEALL take MAXWAIT, BLOCK and MAXBLOCK; TB.CHARGE takes MAXDEBT)";
const MAXWAIT_ERROR: &str =
    "ERR MAXWAIT must be a whole number of ms from 0 to 9007199254740992 (2^53)";
const BLOCK_ERROR: &str =
    "ERR BLOCK must be a whole number of ms from 1 to 9007199254740992 (2^53)";
const MAXBLOCK_ERROR: &str =
    "ERR MAXBLOCK must be a whole number of ms from BLOCK to 9007199254740992 (2^53)";
const MAXDEBT_ERROR: &str =
    "ERR MAXDEBT must be a non-negative finite number, at most 9007199254740992 (2^53)";

/// Option words after the numbers, and the error they give.
fn bad_take_options() -> Vec<(&'static str, &'static str)> {
    vec![
        ("WAIT 5", UNKNOWN_OPTION),
        ("1", UNKNOWN_OPTION),
        ("MAXWAIT 5 MAXWAIT 5", "ERR MAXWAIT is given twice"),
        ("block 5 BLOCK 5", "ERR BLOCK is given twice"),
        ("MAXWAIT", "ERR MAXWAIT needs a value"),
        ("MAXWAIT 5 BLOCK", "ERR BLOCK needs a value"),
        ("BLOCK 100 maxblock", "ERR MAXBLOCK needs a value"),
        ("MAXWAIT -1", MAXWAIT_ERROR),
        ("MAXWAIT 1.5", MAXWAIT_ERROR),
        ("MAXWAIT 1e3", MAXWAIT_ERROR),
        ("MAXWAIT 9007199254740993", MAXWAIT_ERROR),
        ("BLOCK 0", BLOCK_ERROR),
        ("BLOCK 000", BLOCK_ERROR),
        ("BLOCK 10 MAXBLOCK 9", MAXBLOCK_ERROR),
        ("BLOCK 10 MAXBLOCK 0", MAXBLOCK_ERROR),
        ("MAXBLOCK 10", "ERR MAXBLOCK needs BLOCK"),
        ("MAXBLOCK 10 MAXWAIT 1", "ERR MAXBLOCK needs BLOCK"),
        ("MAXWAIT x BLOCK 0", MAXWAIT_ERROR),
        ("BLOCK 0 WAIT", BLOCK_ERROR),
        ("WAIT BLOCK 0", UNKNOWN_OPTION),
    ]
}

#[test]
fn bad_take_options_are_refused_in_argument_order_before_the_key_is_read() {
    let (_server, mut con) = library();
    let _: () = redis::cmd("SET").arg("s").arg("x").query(&mut con).unwrap();
    frozen(&mut con, "k", "1");
    let before = snapshot(&mut con, b"k");
    for (words, want) in bad_take_options() {
        let words: Vec<&str> = words.split(' ').collect();
        // On a bucket, on a key of another type (the options come first), and on TB.TAKEALL.
        for key in ["k", "s"] {
            let args = [&["5", "1", "1"][..], &words].concat();
            assert_eq!(
                error(&mut con, "take", &[key], &args),
                want,
                "take {key} {words:?}"
            );
        }
        let args = [&["5", "1", "1", "5", "1", "1"][..], &words].concat();
        assert_eq!(
            error(&mut con, "takeall", &["k", "s"], &args),
            want,
            "takeall {words:?}"
        );
        // The numbers before them are named first.
        let args = [&["5", "x", "1"][..], &words].concat();
        assert_eq!(
            error(&mut con, "take", &["k"], &args),
            RATE_ERROR,
            "{words:?}"
        );
    }
    assert_eq!(snapshot(&mut con, b"k"), before);
}

#[test]
fn take_options_take_any_case_and_order() {
    let (_server, mut con) = library();
    let args = [
        "5", "1", "1", "block", "100", "MaxWait", "0", "MAXBLOCK", "800",
    ];
    assert_eq!(ints(&mut con, "take", &["k"], &args)[..3], [1, 4, 0]);
    let args = [
        "5",
        "1",
        "1",
        "MAXWAIT",
        "9007199254740992",
        "BLOCK",
        "9007199254740992",
    ];
    assert_eq!(ints(&mut con, "take", &["k"], &args)[..3], [1, 3, 0]);
    // Leading zeros; MAXWAIT 0 in any spelling of zero digits.
    let args = ["5", "1", "1", "MAXWAIT", "000", "BLOCK", "007"];
    assert_eq!(ints(&mut con, "take", &["k"], &args)[..3], [1, 2, 0]);
}

#[test]
fn peek_and_refund_take_no_options() {
    let (_server, mut con) = library();
    assert_eq!(
        error(&mut con, "peek", &["k"], &["5", "1", "1", "MAXWAIT", "5"]),
        arity_error("tb.peek")
    );
    assert_eq!(
        error(&mut con, "refund", &["k"], &["5", "1", "1", "MAXWAIT", "5"]),
        arity_error("tb.refund")
    );
}

#[test]
fn takeall_options_apply_to_every_bucket_and_its_longest_reservation_decides() {
    let (_server, mut con) = library();
    frozen(&mut con, "a", "0");
    frozen(&mut con, "b", "0");
    frozen(&mut con, "c", "5");
    // a repays in 1 s, b (half the rate) in 2 s, c has its token: b decides.
    let args = [
        "10", "1", "1", "10", "0.5", "1", "10", "1", "1", "MAXWAIT", "5000",
    ];
    let reply = ints(&mut con, "takeall", &["a", "b", "c"], &args);
    assert_eq!(reply, [1, 0, 2000, 22_000, 1]);
    for (key, tokens) in [("a", "-1"), ("b", "-1"), ("c", "4")] {
        assert_eq!(
            field(&mut con, key, "tokens").as_deref(),
            Some(tokens),
            "{key}"
        );
    }
}

#[test]
fn a_takeall_denial_with_block_locks_every_bucket_that_denied() {
    let (_server, mut con) = library();
    frozen(&mut con, "a", "0");
    frozen(&mut con, "b", "5");
    frozen(&mut con, "c", "0");
    // b's capacity is 10, so its repaired hash stays 5 s (a full one would expire at once).
    let args = [
        "5", "1", "1", "10", "1", "1", "5", "1", "1", "BLOCK", "1000",
    ];
    let reply = ints(&mut con, "takeall", &["a", "b", "c"], &args);
    assert_eq!(reply, [0, 0, 1000, 5000, 0]);
    for key in ["a", "c"] {
        assert_eq!(lock_stored(&mut con, key), [1000, 1, 2000], "{key}");
    }
    // b allowed alone, so nothing taken from it: only its clock repaired.
    assert_eq!(field(&mut con, "b", "locked_until"), None);
    assert_eq!(field(&mut con, "b", "tokens").as_deref(), Some("5"));
}

#[test]
fn takeall_needs_its_numbers_before_any_option() {
    let (_server, mut con) = library();
    assert_eq!(
        error(&mut con, "takeall", &["a", "b"], &["5", "1", "1", "5", "1"]),
        arity_error("tb.takeall")
    );
}

#[test]
fn bad_charge_options_are_refused_in_argument_order() {
    let (_server, mut con) = library();
    let _: () = redis::cmd("SET").arg("s").arg("x").query(&mut con).unwrap();
    for (words, want) in [
        ("MAXDEBT", "ERR MAXDEBT needs a value"),
        ("MAXDEBT -1", MAXDEBT_ERROR),
        ("MAXDEBT 1e16", MAXDEBT_ERROR),
        ("MAXDEBT nan", MAXDEBT_ERROR),
        ("maxdebt 1 MaxDebt 2", "ERR MAXDEBT is given twice"),
        ("MAXWAIT 1", UNKNOWN_OPTION),
        ("MAXDEBT 1 x", UNKNOWN_OPTION),
        ("MAXDEBT -1 x", UNKNOWN_OPTION),
    ] {
        let args = [&["5", "1", "1"][..], &words.split(' ').collect::<Vec<_>>()].concat();
        assert_eq!(error(&mut con, "charge", &["s"], &args), want, "{words}");
    }
    assert_eq!(
        error(&mut con, "charge", &["s"], &["5", "1"]),
        arity_error("tb.charge")
    );
    assert_eq!(
        error(
            &mut con,
            "charge",
            &["s"],
            &["5", "1", "-1", "MAXDEBT", "-1"]
        ),
        N_ERROR
    );
    // A valid MAXDEBT on a string key: the type comes after the arguments.
    assert_eq!(
        error(&mut con, "charge", &["s"], &["5", "1", "1", "MAXDEBT", "0"]),
        WRONGTYPE_ERROR
    );
}

// --- The script form ---------------------------------------------------------------------

#[test]
fn the_script_runs_the_new_commands_by_name() {
    let server = Server::start_without_module(&[]);
    let mut con = server.conn();
    let script = Fallback::script(&mut con);
    let run = |con: &mut redis::Connection, command: &str, args: &[&[u8]]| -> Vec<i64> {
        script
            .cmd(command, b"k", args)
            .query(con)
            .unwrap_or_else(|e| panic!("{command}: {e}"))
    };
    assert_eq!(
        run(&mut con, "charge", &[b"5", b"1", b"6"]),
        [1, 0, 1000, 6000]
    );
    assert_eq!(
        run(&mut con, "take", &[b"5", b"1", b"1", b"BLOCK", b"50"])[0],
        0
    );
    let unblocked: i64 = script.cmd("unblock", b"k", &[]).query(&mut con).unwrap();
    assert_eq!(unblocked, 1);
    let _: i64 = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
    assert_eq!(
        run(&mut con, "throttle", &[b"4", b"1", b"2"]),
        [0, 5, 4, -1, 2]
    );
    let Fallback::Script { sha } = &script else {
        unreachable!()
    };
    let err = outcome(
        &mut con,
        redis::cmd("EVALSHA").arg(sha).arg(1).arg("k").arg("nope"),
    )
    .expect_err("an unknown name");
    assert_eq!(
        err,
        "ERR the first argument must be take, peek, refund, takeall, charge, unblock, throttle, \
         acquire, release or renew"
    );
}

#[test]
fn the_library_registers_unblock_to_run_when_memory_is_short() {
    let (_server, mut con) = library();
    frozen(&mut con, "k", "1");
    hset(&mut con, "k", &[("strikes", "1")]);
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "1"])
        .query(&mut con)
        .unwrap();
    assert_eq!(unblock(&mut con, "k"), 1);
    let err = error(&mut con, "charge", &["k"], &["5", "1", "1"]);
    assert!(err.starts_with("OOM"), "{err}");
}
