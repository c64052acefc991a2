//! Calling the TB.* commands and reading what they write: replies, exact error texts, the
//! stored fields and expiries, and the error words every command shares.

use std::collections::BTreeMap;
use std::thread;
use std::time::Duration;

use redis::Connection;

use super::server::{info_field, wait_until, Server};

/// The reference Lua token bucket (our own version of the seeds' algorithm), the same file
/// `make bench` races. KEYS[1] bucket; ARGV capacity, rate, n, now_ms; returns
/// `{allowed, floor(tokens)}`.
pub const REFERENCE_LUA: &str = include_str!("../../../bench/reference_token_bucket.lua");

/// Largest wait the module reports, in ms (contract: waits are capped at 2^53 ms).
pub const MAX_WAIT_MS: i64 = 1 << 53;

/// `TB.<COMMAND> key capacity rate n` as a command, e.g. for a pipeline (`command`: the
/// full name, `"TB.TAKE"`).
pub fn tb_cmd(command: &str, key: &str, capacity: &str, rate: &str, n: &str) -> redis::Cmd {
    let mut cmd = redis::cmd(command);
    cmd.arg(key).arg(capacity).arg(rate).arg(n);
    cmd
}

/// `TB.<COMMAND> key capacity rate n` (e.g. `tb(con, "TB.REFUND", ..)`); panics, naming the
/// call, on an error reply.
pub fn tb(
    con: &mut redis::Connection,
    command: &str,
    key: &str,
    capacity: &str,
    rate: &str,
    n: &str,
) -> Vec<i64> {
    let shown = format!("{command} {key} {capacity} {rate} {n}");
    ints(con, &tb_cmd(command, key, capacity, rate, n), &shown)
}

/// The reply of `cmd` as integers; panics, naming the call (`shown`), on an error reply.
fn ints(con: &mut redis::Connection, cmd: &redis::Cmd, shown: &str) -> Vec<i64> {
    cmd.query(con)
        .unwrap_or_else(|e| panic!("{shown} failed: {e}"))
}

/// The exact error text of `TB.<COMMAND> key capacity rate n`, given as those five words;
/// panics if the call succeeds.
pub fn tb_error(
    con: &mut redis::Connection,
    [command, key, capacity, rate, n]: [&str; 5],
) -> String {
    match tb_cmd(command, key, capacity, rate, n).query::<redis::Value>(con) {
        Ok(v) => panic!("expected an error from {command} {key} {capacity} {rate} {n}, got {v:?}"),
        Err(e) => error_text(&e),
    }
}

/// `TB.TAKE key capacity rate n`; panics (naming the call) on an error reply.
pub fn take(con: &mut Connection, key: &str, capacity: &str, rate: &str, n: &str) -> Vec<i64> {
    tb(con, "TB.TAKE", key, capacity, rate, n)
}

/// Empties a new bucket: one allowed TB.TAKE of its whole `capacity`. Returns the stored
/// `last_refill`, the instant the bucket was empty, from which a test times its refill.
pub fn drain(con: &mut Connection, key: &str, capacity: &str, rate: &str) -> i64 {
    let reply = take(con, key, capacity, rate, capacity);
    assert_eq!(reply[..2], [1, 0], "{key} drained: {reply:?}");
    stored_last_refill(con, key)
}

/// `TB.REFUND key capacity rate n`; panics, naming the call, on an error reply.
pub fn refund(con: &mut Connection, key: &str, capacity: &str, rate: &str, n: &str) -> Vec<i64> {
    let reply = tb(con, "TB.REFUND", key, capacity, rate, n);
    assert_eq!(
        reply.len(),
        4,
        "TB.REFUND {key} {capacity} {rate} {n} replied {reply:?}"
    );
    reply
}

/// `WATCH key` on `con`.
pub fn watch(con: &mut redis::Connection, key: &str) {
    let _: () = redis::cmd("WATCH").arg(key).query(con).expect("WATCH");
}

/// MULTI; PING; EXEC on `con`, after a `watch`: whether the transaction ran (`false`: a
/// write to a watched key aborted it).
pub fn watched_transaction_runs(con: &mut redis::Connection) -> bool {
    let _: () = redis::cmd("MULTI").query(con).expect("MULTI");
    let queued: String = redis::cmd("PING").query(con).expect("PING");
    assert_eq!(queued, "QUEUED");
    match redis::cmd("EXEC").query(con).expect("EXEC") {
        redis::Value::Nil => false,
        redis::Value::Array(replies) => {
            assert_eq!(
                replies,
                vec![redis::Value::SimpleString("PONG".into())],
                "EXEC ran something else"
            );
            true
        }
        other => panic!("unexpected EXEC reply {other:?}"),
    }
}

/// `TB.PEEK key capacity rate n`; panics (naming the call) on an error reply.
pub fn peek(con: &mut Connection, key: &str, capacity: &str, rate: &str, n: &str) -> Vec<i64> {
    tb(con, "TB.PEEK", key, capacity, rate, n)
}

/// `TB.PEEK key capacity rate` (n left to its default); panics on an error reply.
pub fn peek_default_n(
    con: &mut redis::Connection,
    key: &str,
    capacity: &str,
    rate: &str,
) -> Vec<i64> {
    let mut cmd = redis::cmd("TB.PEEK");
    cmd.arg(key).arg(capacity).arg(rate);
    ints(con, &cmd, &format!("TB.PEEK {key} {capacity} {rate}"))
}

/// One call of the reference Lua script (`EVAL`), with `now_ms` as the script's clock.
pub fn lua_take(
    con: &mut redis::Connection,
    key: &str,
    capacity: &str,
    rate: &str,
    n: &str,
    now_ms: i64,
) -> Vec<i64> {
    redis::cmd("EVAL")
        .arg(REFERENCE_LUA)
        .arg(1)
        .arg(key)
        .arg(capacity)
        .arg(rate)
        .arg(n)
        .arg(now_ms)
        .query(con)
        .unwrap_or_else(|e| {
            panic!("reference Lua on {key} {capacity} {rate} {n} {now_ms} failed: {e}")
        })
}

/// Runs a raw command given as byte strings (first is the command name).
pub fn raw(con: &mut redis::Connection, args: &[&[u8]]) -> redis::RedisResult<redis::Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).expect("command name is UTF-8"));
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(con)
}

/// The reply exactly as sent, error replies (also nested ones, e.g. inside EXEC) kept as
/// `Value::ServerError` instead of failing the whole call.
pub fn reply_value(con: &mut redis::Connection, cmd: &redis::Cmd) -> redis::Value {
    redis::ConnectionLike::req_command(con, cmd).expect("connection error")
}

/// The server's error for a call with the wrong number of arguments (`command` as the server
/// names it: in lower case, `tb.take`).
pub fn arity_error(command: &str) -> String {
    format!("ERR wrong number of arguments for '{command}' command")
}

/// Each of `calls` (whole command lines, the name first) is refused with the arity error of
/// its command.
pub fn assert_arity_errors(con: &mut redis::Connection, calls: &[&[&[u8]]]) {
    for args in calls {
        let command = String::from_utf8_lossy(args[0]).to_lowercase();
        assert_eq!(
            expect_error(con, args),
            arity_error(&command),
            "{} arguments",
            args.len()
        );
    }
}

/// The exact error line the server sent (`CODE detail`), rebuilt from a client error.
pub fn error_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => format!("<not a server error: {e}>"),
    }
}

/// Runs `args` expecting an error reply and returns its exact text; panics if the call succeeds.
pub fn expect_error(con: &mut redis::Connection, args: &[&[u8]]) -> String {
    match raw(con, args) {
        Ok(v) => panic!("expected an error from {}, got {v:?}", show_args(args)),
        Err(e) => error_text(&e),
    }
}

/// Arguments rendered for failure messages, non-printable bytes escaped.
pub fn show_args(args: &[&[u8]]) -> String {
    args.iter()
        .map(|a| format!("{:?}", String::from_utf8_lossy(&escape(a))))
        .collect::<Vec<_>>()
        .join(" ")
}

fn escape(bytes: &[u8]) -> Vec<u8> {
    bytes
        .iter()
        .flat_map(|b| std::ascii::escape_default(*b))
        .collect()
}

/// The server clock (TIME) in Unix ms, rounded down.
pub fn server_time_ms(con: &mut redis::Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1000 + micros / 1000
}

/// True when PING answers PONG on this connection.
pub fn ping(con: &mut redis::Connection) -> bool {
    matches!(redis::cmd("PING").query::<String>(con), Ok(ref s) if s == "PONG")
}

pub fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(con)
        .expect("EXISTS")
        == 1
}

pub fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).expect("PTTL")
}

/// Absolute expiry in Unix ms (`PEXPIRETIME`): -1 no expiry, -2 no key.
pub fn pexpiretime(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME")
        .arg(key)
        .query(con)
        .expect("PEXPIRETIME")
}

pub fn hgetall(con: &mut redis::Connection, key: &str) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(con).expect("HGETALL")
}

/// `SET key value`: a string where a test wants one (a redis-cell key, another type).
pub fn set_string(con: &mut redis::Connection, key: &str, value: impl redis::ToRedisArgs) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query(con)
        .expect("SET");
}

/// Writes a bucket hash directly (e.g. to seed state or corrupt it).
pub fn hset(con: &mut redis::Connection, key: &str, fields: &[(&str, &str)]) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(key);
    for (f, v) in fields {
        cmd.arg(*f).arg(*v);
    }
    let _: i64 = cmd.query(con).expect("HSET");
}

/// A stored `tokens` field as a number.
pub fn stored_tokens(con: &mut redis::Connection, key: &str) -> f64 {
    let text: String = redis::cmd("HGET")
        .arg(key)
        .arg("tokens")
        .query(con)
        .expect("HGET tokens");
    text.parse()
        .unwrap_or_else(|e| panic!("stored tokens {text:?} is not a number: {e}"))
}

/// A stored `last_refill` field as an integer.
pub fn stored_last_refill(con: &mut redis::Connection, key: &str) -> i64 {
    let text: String = redis::cmd("HGET")
        .arg(key)
        .arg("last_refill")
        .query(con)
        .expect("HGET last_refill");
    text.parse()
        .unwrap_or_else(|e| panic!("stored last_refill {text:?} is not an integer: {e}"))
}

/// Everything observable about a key that a command could change: its serialized value and
/// its absolute expiry. Two equal snapshots mean the key was not touched.
#[derive(Debug, PartialEq, Eq, Clone)]
pub struct KeySnapshot {
    pub key_type: String,
    pub dump: Option<Vec<u8>>,
    pub expire_at_ms: i64,
}

pub fn snapshot(con: &mut redis::Connection, key: &[u8]) -> KeySnapshot {
    KeySnapshot {
        key_type: redis::cmd("TYPE").arg(key).query(con).expect("TYPE"),
        dump: redis::cmd("DUMP").arg(key).query(con).expect("DUMP"),
        expire_at_ms: redis::cmd("PEXPIRETIME")
            .arg(key)
            .query(con)
            .expect("PEXPIRETIME"),
    }
}

/// Sleeps `ms` milliseconds.
pub fn sleep_ms(ms: i64) {
    if ms > 0 {
        thread::sleep(Duration::from_millis(ms as u64));
    }
}

/// `HGETALL` with fields and values as raw bytes, for byte-for-byte comparisons.
pub fn hgetall_bytes(con: &mut redis::Connection, key: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    redis::cmd("HGETALL").arg(key).query(con).expect("HGETALL")
}

/// The argument errors every TB.* command replies (checked in order: capacity, rate, n).
pub const CAPACITY_ERROR: &str = "ERR capacity must be a positive finite number";
pub const RATE_ERROR: &str = "ERR rate must be a positive finite number";
pub const N_ERROR: &str = "ERR n must be a non-negative finite number";
/// The errors of the options after the numbers (docs/commands.md), the same for every
/// command that takes them and for the Lua twin.
pub const UNKNOWN_OPTION_ERROR: &str = "ERR unknown option (TB.TAKE and TB.TAKEALL take MAXWAIT, BLOCK and MAXBLOCK; TB.CHARGE takes MAXDEBT)";
pub const MAXWAIT_ERROR: &str =
    "ERR MAXWAIT must be a whole number of ms from 0 to 9007199254740992 (2^53)";
pub const BLOCK_ERROR: &str =
    "ERR BLOCK must be a whole number of ms from 1 to 9007199254740992 (2^53)";
pub const MAXBLOCK_ERROR: &str =
    "ERR MAXBLOCK must be a whole number of ms from BLOCK to 9007199254740992 (2^53)";
pub const MAXBLOCK_WITHOUT_BLOCK_ERROR: &str = "ERR MAXBLOCK needs BLOCK";
pub const MAXDEBT_ERROR: &str =
    "ERR MAXDEBT must be a non-negative finite number, at most 9007199254740992 (2^53)";
/// The server's reply for a key of another type.
pub const WRONGTYPE_ERROR: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";

/// The error for a hash that is not a bucket, naming the key as the module shows it.
pub fn corrupt_error(shown_key: &str) -> String {
    format!("ERR corrupt bucket '{shown_key}': tokens and last_refill must be finite numbers")
}

/// Writes a bucket by hand: `tokens` and `last_refill` (ms, or any spelling of it).
pub fn seed_bucket(
    con: &mut redis::Connection,
    key: &str,
    tokens: &str,
    last_refill: impl std::fmt::Display,
) {
    hset(
        con,
        key,
        &[
            ("tokens", tokens),
            ("last_refill", &last_refill.to_string()),
        ],
    );
}

/// Everything about a bucket a command could change: its fields and its absolute expiry
/// (`PEXPIRETIME`: -2 when the key does not exist).
#[derive(Debug, PartialEq, Eq, Clone)]
pub struct Bucket {
    pub fields: BTreeMap<Vec<u8>, Vec<u8>>,
    pub expire_at_ms: i64,
}

pub fn bucket(con: &mut redis::Connection, key: &str) -> Bucket {
    Bucket {
        fields: hgetall_bytes(con, key),
        expire_at_ms: pexpiretime(con, key),
    }
}

pub fn buckets(con: &mut redis::Connection, keys: &[&str]) -> Vec<Bucket> {
    keys.iter().map(|key| bucket(con, key)).collect()
}

/// Asserts `low <= value <= high`, naming `what`.
pub fn assert_within(what: &str, value: i64, low: i64, high: i64) {
    assert!(
        low <= value && value <= high,
        "{what} = {value}, expected within [{low}, {high}]"
    );
}

/// WATCHes `key` on `con`, runs `call` on a second connection, and says whether the watching
/// transaction still runs (`false`: `call` signalled the key).
pub fn watch_survives(
    server: &Server,
    con: &mut redis::Connection,
    key: &str,
    call: impl FnOnce(&mut redis::Connection),
) -> bool {
    let mut other = server.conn();
    watch(con, key);
    call(&mut other);
    watched_transaction_runs(con)
}

/// `EVAL` (or `EVAL_RO`, ...) of `return redis.call('<command>', KEYS[1], ARGV[1], ...)` with
/// `key` and `args`; panics on an error reply.
pub fn eval_tb(
    con: &mut redis::Connection,
    eval: &str,
    command: &str,
    key: &str,
    args: &[&str],
) -> Vec<i64> {
    let argv: Vec<String> = (1..=args.len()).map(|i| format!(", ARGV[{i}]")).collect();
    let script = format!("return redis.call('{command}', KEYS[1]{})", argv.concat());
    redis::cmd(eval)
        .arg(&script)
        .arg(1)
        .arg(key)
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("{eval} {command} {key} {args:?} failed: {e}"))
}

/// A sorted set (a lease set: the ids, `seq` and `inc`) as `(member, score)` pairs, lowest
/// score first.
pub fn members(con: &mut redis::Connection, key: &str) -> Vec<(String, i64)> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(con)
        .expect("ZRANGE")
}

/// 2^53: the largest incarnation.
const MAX_INCARNATION: i64 = 1 << 53;

/// The incarnation a lease set's `inc` member holds (minus its score, a whole number in
/// [-2^53, -1]; docs/leases.md), if it has one.
pub fn incarnation_of_score(score: f64) -> Option<i64> {
    let whole = score.fract() == 0.0 && (-(MAX_INCARNATION as f64)..=-1.0).contains(&score);
    whole.then(|| -(score as i64))
}

/// The incarnation of the lease set at `key`, if it has one.
pub fn incarnation(con: &mut redis::Connection, key: &str) -> Option<i64> {
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(key)
        .arg("inc")
        .query(con)
        .expect("ZSCORE");
    score.and_then(incarnation_of_score)
}

/// The parts of a lease id: `<ms>-<n>-<incarnation>`, or `<ms>-<n>` from a set made before
/// incarnations; panics on anything else.
pub fn id_parts(id: &str) -> (i64, i64, Option<i64>) {
    let parts: Vec<i64> = id
        .split('-')
        .map(|part| {
            part.parse()
                .unwrap_or_else(|_| panic!("not a lease id: {id:?}"))
        })
        .collect();
    match parts[..] {
        [ms, n] => (ms, n, None),
        [ms, n, incarnation] => {
            assert!(
                (1..=MAX_INCARNATION).contains(&incarnation),
                "incarnation out of range: {id:?}"
            );
            (ms, n, Some(incarnation))
        }
        _ => panic!("not a lease id: {id:?}"),
    }
}

/// One field of `INFO tb`; panics when it is missing.
pub fn tb_field(con: &mut redis::Connection, name: &str) -> String {
    info_field(con, "tb", name).unwrap_or_else(|| panic!("INFO tb {name}"))
}

/// Waits (bounded, 10 s) until `INFO tb` shows `count` clients waiting.
pub fn wait_for_waiting(con: &mut redis::Connection, count: i64) {
    wait_until(
        &format!("tb_waiting = {count}"),
        Duration::from_secs(10),
        || tb_field(con, "tb_waiting") == count.to_string(),
    );
}
