//! Buckets written and read by hand, for the behaviour cases of locks, reservations and
//! charges: frozen buckets whose figures are exact, locks relative to the server's clock,
//! and the lock a call stored.
//!
//! Exact figures come from buckets whose `last_refill` lies far in the future: such a
//! `last_refill` counts as now (and the call repairs it to now), so no refill happens before
//! the call, whatever the clock shows. Locks are written by hand relative to the server's
//! clock, an hour from now, or read back from what a call stored (`last_refill` is the
//! call's `now`).

use super::aof::aof_without_select;
use super::commands::{hgetall, hset, seed_bucket, server_time_ms};
use super::server::Server;

/// A `last_refill` far ahead of any clock: the bucket is seen as it is stored, at now.
pub const FROZEN: &str = "99999999999999";
/// An hour, in ms: a lock that outlasts any test.
pub const HOUR_MS: i64 = 3_600_000;

/// A bucket holding `tokens` that sees no refill before the next call.
pub fn frozen(con: &mut redis::Connection, key: &str, tokens: &str) {
    seed_bucket(con, key, tokens, FROZEN);
}

/// A bucket holding `tokens` at `last_refill`, with a lock of `strikes` ending at
/// `locked_until` and a probation ending at `probation_until`.
pub fn locked_bucket(
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

/// A bucket holding `tokens`, refilled now, under a first lock that lasts an hour (its
/// probation two). Returns that now, the server's clock.
pub fn locked_for_an_hour(con: &mut redis::Connection, key: &str, tokens: &str) -> i64 {
    let now = server_time_ms(con);
    locked_bucket(con, key, tokens, now, [now + HOUR_MS, 1, now + 2 * HOUR_MS]);
    now
}

/// The hash's fields and values in the server's order (HGETALL).
pub fn fields(con: &mut redis::Connection, key: &str) -> Vec<(String, String)> {
    redis::cmd("HGETALL").arg(key).query(con).expect("HGETALL")
}

/// One field of a hash (nil: missing).
pub fn field(con: &mut redis::Connection, key: &str, name: &str) -> Option<String> {
    redis::cmd("HGET")
        .arg(key)
        .arg(name)
        .query(con)
        .expect("HGET")
}

/// One field of a hash as an integer.
pub fn int_field(con: &mut redis::Connection, key: &str, name: &str) -> i64 {
    let text = field(con, key, name).unwrap_or_else(|| panic!("no {name} in {key}"));
    text.parse()
        .unwrap_or_else(|e| panic!("{name} = {text:?} in {key}: {e}"))
}

/// The lock a key stores, as [locked_until, strikes, probation_until] relative to its
/// `last_refill` (the `now` of the call that stored it): [length, strikes, length * 2].
pub fn lock_stored(con: &mut redis::Connection, key: &str) -> [i64; 3] {
    let now = int_field(con, key, "last_refill");
    [
        int_field(con, key, "locked_until") - now,
        int_field(con, key, "strikes"),
        int_field(con, key, "probation_until") - now,
    ]
}

/// A lock as the hash stores it: `(locked_until, strikes, probation_until)`, absolute.
pub fn stored_lock(con: &mut redis::Connection, key: &str) -> (i64, i64, i64) {
    (
        int_field(con, key, "locked_until"),
        int_field(con, key, "strikes"),
        int_field(con, key, "probation_until"),
    )
}

/// Whether the hash has any of the three lock fields.
pub fn has_lock_fields(con: &mut redis::Connection, key: &str) -> bool {
    let fields = hgetall(con, key);
    ["locked_until", "strikes", "probation_until"]
        .iter()
        .any(|name| fields.contains_key(*name))
}

/// Polls until the server clock reads `at_ms` or later (bounded: `at_ms` must be near).
pub fn wait_for_server_time(con: &mut redis::Connection, at_ms: i64) {
    let now = server_time_ms(con);
    assert!(at_ms - now < 120_000, "{at_ms} is {} ms away", at_ms - now);
    while server_time_ms(con) < at_ms {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// The commands the server appended to its AOF (run with `AOF_ARGS`) that touch `key`, in
/// order, without the MULTI/EXEC a script's effects come in.
pub fn effects_on(server: &Server, con: &mut redis::Connection, key: &str) -> Vec<Vec<Vec<u8>>> {
    aof_without_select(server, con)
        .into_iter()
        .filter(|argv| argv.len() > 1 && argv[1] == key.as_bytes())
        .collect()
}
