//! TB.TAKEALL against a real server: several buckets, all or nothing.
//!
//! What is checked, each on its own server:
//! - replies: `[allowed, remaining, retry_after_ms, reset_after_ms, index]` for the deciding
//!   bucket (the tightest when allowed, the longest wait when denied, ties to the first);
//! - all or nothing: on a denial or any error no bucket changes (fields and absolute expiry),
//!   and a missing bucket stays missing;
//! - errors: arity, duplicate keys, argument errors, WRONGTYPE and corrupt buckets in a later
//!   group;
//! - command metadata: COMMAND GETKEYS, INFO and DOCS;
//! - replication (a real replica), the AOF and a restart;
//! - a 3-master cluster: hash-tagged keys through a cluster-aware client, CROSSSLOT without.
//!
//! Timing: buckets that must not refill during a test use rates of a token per 1000 s or
//! slower, and waits are asserted as ranges whose slack (seconds) dwarfs the time a test takes.
//! Every wait for a replica or the cluster is a bounded poll.

use std::time::Duration;

use crate::harness::*;

/// One bucket of a TB.TAKEALL call: key, capacity, rate, n.
type Group<'a> = (&'a str, &'a str, &'a str, &'a str);

/// Slack for waits that shrink while a test runs: far more than any test takes.
const SLACK_MS: i64 = 60_000;

fn takeall_cmd(groups: &[Group]) -> redis::Cmd {
    let mut cmd = redis::cmd("TB.TAKEALL");
    for (key, capacity, rate, n) in groups {
        cmd.arg(*key).arg(*capacity).arg(*rate).arg(*n);
    }
    cmd
}

/// TB.TAKEALL on any connection (plain or cluster); panics, naming the call, on an error.
fn takeall(con: &mut dyn redis::ConnectionLike, groups: &[Group]) -> Vec<i64> {
    let reply: Vec<i64> = takeall_cmd(groups)
        .query(con)
        .unwrap_or_else(|e| panic!("TB.TAKEALL {groups:?} failed: {e}"));
    assert_eq!(reply.len(), 5, "TB.TAKEALL {groups:?} replied {reply:?}");
    reply
}

/// The exact error text TB.TAKEALL replies with; panics if it succeeds.
fn takeall_error(con: &mut redis::Connection, groups: &[Group]) -> String {
    match takeall_cmd(groups).query::<redis::Value>(con) {
        Ok(reply) => panic!("expected an error from TB.TAKEALL {groups:?}, got {reply:?}"),
        Err(e) => error_text(&e),
    }
}

/// The fewest whole ms in which `tokens` refill at `rate` per second.
fn refill_ms(tokens: f64, rate: f64) -> i64 {
    (tokens / rate * 1000.0).ceil() as i64
}

/// Empties `key` (capacity 1) with TB.TAKE at `rate`; the next take of 1 is denied for
/// about 1/rate seconds.
fn empty_bucket(con: &mut redis::Connection, key: &str, rate: &str) {
    let reply = take(con, key, "1", rate, "1");
    assert_eq!(
        reply[0], 1,
        "TB.TAKE {key} 1 {rate} 1 empties the bucket: {reply:?}"
    );
}

// --- Allowed -------------------------------------------------------------------------------

#[test]
fn takeall_charges_every_bucket_when_all_allow() {
    let server = Server::start();
    let mut con = server.conn();
    let before_ms = server_time_ms(&mut con);
    // Slow rates, each bucket its own: every key is still there (30 s or more from full)
    // when it is read back below, however slow the machine.
    let reply = takeall(
        &mut con,
        &[
            ("{t}a", "10", "0.01", "1"),
            ("{t}b", "5", "0.01", "2"),
            ("{t}c", "100", "0.1", "3"),
        ],
    );
    let after_ms = server_time_ms(&mut con);

    // {t}b keeps the fewest tokens (3) and refills its 2 in 200 s.
    assert_eq!(reply, vec![1, 3, 0, 200_000, 1]);
    let mut instants = Vec::new();
    for (key, tokens, reset_ms) in [
        ("{t}a", "9", 100_000),
        ("{t}b", "3", 200_000),
        ("{t}c", "97", 30_000),
    ] {
        let fields = hgetall(&mut con, key);
        assert_eq!(
            fields.get("tokens").map(String::as_str),
            Some(tokens),
            "{key}: {fields:?}"
        );
        let last_refill: i64 = fields["last_refill"]
            .parse()
            .expect("last_refill is an integer");
        assert_within(
            &format!("{key} last_refill"),
            last_refill,
            before_ms,
            after_ms,
        );
        // Each bucket expires exactly when it is full again.
        assert_eq!(
            pexpiretime(&mut con, key),
            last_refill + reset_ms,
            "deadline of {key}"
        );
        instants.push(last_refill);
    }
    assert!(
        instants.windows(2).all(|w| w[0] == w[1]),
        "every bucket is charged at the same instant: {instants:?}"
    );
}

#[test]
fn an_allowed_takeall_names_the_bucket_with_the_fewest_tokens_left_and_the_first_on_a_tie() {
    let server = Server::start();
    let mut con = server.conn();
    // Remaining 99, 5, 5: the tie between {t}a and {t}b goes to {t}a, index 1.
    let reply = takeall(
        &mut con,
        &[
            ("{t}x", "100", "1", "1"),
            ("{t}a", "10", "1", "5"),
            ("{t}b", "8", "1", "3"),
        ],
    );
    assert_eq!(reply, vec![1, 5, 0, 5000, 1]);
}

#[test]
fn a_bucket_asked_for_zero_tokens_is_not_written_while_the_others_are_charged() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "{t}existing", "10", "0.001", "4");
    let existing = bucket(&mut con, "{t}existing");

    // {t}charged refills one token per 1000 s, so it is still there to be read back.
    let reply = takeall(
        &mut con,
        &[
            ("{t}charged", "10", "0.001", "1"),
            ("{t}missing", "10", "1", "0"),
            ("{t}existing", "10", "0.001", "0"),
        ],
    );

    assert_eq!(&reply[..3], &[1, 6, 0], "{{t}}existing decides: {reply:?}");
    assert_eq!(reply[4], 2, "{reply:?}");
    assert_eq!(hgetall(&mut con, "{t}charged")["tokens"], "9");
    assert!(!exists(&mut con, "{t}missing"), "n = 0 created the key");
    assert_eq!(
        bucket(&mut con, "{t}existing"),
        existing,
        "n = 0 changed the bucket"
    );
}

// --- Denied: nothing is touched --------------------------------------------------------------

#[test]
fn a_takeall_denied_by_one_bucket_touches_no_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "{t}a", "10", "0.001", "4"); // 6 tokens left, with a TTL
    empty_bucket(&mut con, "{t}b", "0.001"); // 0 tokens, one back in 1000 s
    let keys = ["{t}a", "{t}b", "{t}c"];
    let before = buckets(&mut con, &keys);
    assert!(!exists(&mut con, "{t}c"));

    let reply = takeall(
        &mut con,
        &[
            ("{t}a", "10", "0.001", "1"),
            ("{t}b", "1", "0.001", "1"),
            ("{t}c", "5", "1", "1"),
        ],
    );

    assert_eq!(
        (reply[0], reply[1], reply[4]),
        (0, 0, 1),
        "denied by {{t}}b: {reply:?}"
    );
    let one_token_ms = refill_ms(1.0, 0.001);
    assert_within(
        "retry_after_ms",
        reply[2],
        one_token_ms - SLACK_MS,
        one_token_ms,
    );
    // Capacity 1: full again exactly when the one token is back.
    assert_eq!(reply[3], reply[2], "{reply:?}");
    assert_eq!(
        buckets(&mut con, &keys),
        before,
        "a denied TB.TAKEALL changed a bucket"
    );
    assert!(
        !exists(&mut con, "{t}c"),
        "a denied TB.TAKEALL created a key"
    );
}

#[test]
fn a_denied_takeall_names_the_bucket_with_the_longest_retry() {
    let server = Server::start();
    let mut con = server.conn();
    empty_bucket(&mut con, "{t}slow", "0.0005"); // one token back in 2000 s
    empty_bucket(&mut con, "{t}fast", "0.001"); // one token back in 1000 s

    let reply = takeall(
        &mut con,
        &[
            ("{t}free", "10", "1", "1"),
            ("{t}slow", "1", "0.0005", "1"),
            ("{t}fast", "1", "0.001", "1"),
        ],
    );

    assert_eq!((reply[0], reply[1], reply[4]), (0, 0, 1), "{reply:?}");
    let slow_ms = refill_ms(1.0, 0.0005);
    assert_within("retry_after_ms", reply[2], slow_ms - SLACK_MS, slow_ms);
    assert_eq!(reply[3], reply[2], "{reply:?}");
}

#[test]
fn equal_retries_name_the_first_denying_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    // Two byte-identical empty buckets under the same limit deny with the same wait.
    let now_ms = server_time_ms(&mut con).to_string();
    for key in ["{t}p", "{t}q"] {
        seed_bucket(&mut con, key, "0", &now_ms);
    }

    for (first, second) in [("{t}p", "{t}q"), ("{t}q", "{t}p")] {
        let reply = takeall(
            &mut con,
            &[
                ("{t}free", "10", "1", "1"),
                (first, "1", "0.001", "1"),
                (second, "1", "0.001", "1"),
            ],
        );
        assert_eq!(
            (reply[0], reply[4]),
            (0, 1),
            "{first} before {second}: {reply:?}"
        );
    }
}

#[test]
fn n_above_a_capacity_denies_with_retry_minus_one_naming_that_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    // A very long but finite wait: "never" (-1) still counts as longer.
    empty_bucket(&mut con, "{t}slow", "0.000001");
    let slow = bucket(&mut con, "{t}slow");

    let reply = takeall(
        &mut con,
        &[
            ("{t}a", "10", "1", "1"),
            ("{t}slow", "1", "0.000001", "1"),
            ("{t}big", "5", "1", "6"),
        ],
    );

    // {t}big is missing, so full: 5 tokens, reset 0, and 6 never fit.
    assert_eq!(reply, vec![0, 5, -1, 0, 2]);
    assert!(!exists(&mut con, "{t}a") && !exists(&mut con, "{t}big"));
    assert_eq!(bucket(&mut con, "{t}slow"), slow);
}

// --- The worked example: 10 per second plus a daily quota ------------------------------------

/// The README's per-second-plus-per-day example, with the day quota scaled down to 3 so the
/// test is quick: 3 per day is 3 / 86400 s = 0.000034722 tokens per second.
#[test]
fn the_day_bucket_decides_once_the_day_quota_is_used_up() {
    let server = Server::start();
    let mut con = server.conn();
    const DAY_RATE: f64 = 0.000034722;
    // The short-term bucket refills slowly here (a token per 100 s instead of 10 per
    // second), so it neither refills nor expires between the snapshot and the check that
    // the denied request left it alone, however slow the machine.
    let limits: [Group; 2] = [
        ("{user:7}:sec", "10", "0.01", "1"),
        ("{user:7}:day", "3", "0.000034722", "1"),
    ];
    let one_day_token_ms = refill_ms(1.0, DAY_RATE);

    // Requests 1..=3 are allowed; the day bucket keeps fewer tokens than the per-second one
    // (2, 1, 0 against 9, 8, 7 or more), so it is the one reported, index 1.
    for (request, remaining) in [(1, 2), (2, 1), (3, 0)] {
        let reply = takeall(&mut con, &limits);
        assert_eq!(
            &reply[..3],
            &[1, remaining, 0],
            "request {request}: {reply:?}"
        );
        assert_eq!(reply[4], 1, "request {request}: {reply:?}");
        let full_ms = request * one_day_token_ms;
        assert_within(
            &format!("request {request} reset_after_ms"),
            reply[3],
            full_ms - SLACK_MS,
            full_ms,
        );
    }
    let sec = bucket(&mut con, "{user:7}:sec");
    let day = bucket(&mut con, "{user:7}:day");

    // Request 4: the per-second bucket still holds 7 or more, the day is used up. Denied by
    // the day bucket, and the per-second bucket keeps its tokens.
    let reply = takeall(&mut con, &limits);
    assert_eq!(
        (reply[0], reply[1], reply[4]),
        (0, 0, 1),
        "request 4: {reply:?}"
    );
    assert_within(
        "request 4 retry_after_ms",
        reply[2],
        one_day_token_ms - SLACK_MS,
        one_day_token_ms,
    );
    assert_eq!(
        bucket(&mut con, "{user:7}:sec"),
        sec,
        "the denied request spent a per-second token"
    );
    assert_eq!(bucket(&mut con, "{user:7}:day"), day);
}

/// The same pair of limits the other way round: a burst runs into the short-term bucket
/// first, and the day bucket is not charged for the denied request.
#[test]
fn the_short_term_bucket_decides_a_burst_before_the_day_quota_is_used_up() {
    let server = Server::start();
    let mut con = server.conn();
    // A burst of 2, one token back every 50 s (slow, so the test cannot race the refill).
    let limits: [Group; 2] = [
        ("{user:8}:burst", "2", "0.02", "1"),
        ("{user:8}:day", "1000", "0.011574", "1"),
    ];

    assert_eq!(takeall(&mut con, &limits), vec![1, 1, 0, 50_000, 0]);
    let reply = takeall(&mut con, &limits);
    assert_eq!((reply[0], reply[1], reply[4]), (1, 0, 0), "{reply:?}");
    let day = bucket(&mut con, "{user:8}:day");
    // 998 and the sliver refilled between the two calls.
    let day_tokens: f64 = String::from_utf8_lossy(&day.fields[b"tokens".as_slice()])
        .parse()
        .expect("day tokens");
    assert!(
        (998.0..998.1).contains(&day_tokens),
        "day tokens {day_tokens}"
    );

    let reply = takeall(&mut con, &limits);
    assert_eq!((reply[0], reply[1], reply[4]), (0, 0, 0), "{reply:?}");
    assert_within("retry_after_ms", reply[2], 50_000 - SLACK_MS / 2, 50_000);
    assert_eq!(
        bucket(&mut con, "{user:8}:day"),
        day,
        "the denied request spent a day token"
    );
}

// --- Errors: nothing is touched ----------------------------------------------------------------

#[test]
fn takeall_without_a_whole_group_is_an_arity_error() {
    let server = Server::start();
    let mut con = server.conn();
    assert_arity_errors(
        &mut con,
        &[
            &[b"TB.TAKEALL"],
            &[b"TB.TAKEALL", b"{t}a"],
            &[b"TB.TAKEALL", b"{t}a", b"10"],
            &[b"TB.TAKEALL", b"{t}a", b"10", b"1"],
        ],
    );
    assert!(!exists(&mut con, "{t}a"));
}

#[test]
fn an_incomplete_last_group_is_an_arity_error_and_touches_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "{t}a", "10", "0.001", "2");
    let a = bucket(&mut con, "{t}a");
    let full: [&[u8]; 9] = [
        b"TB.TAKEALL",
        b"{t}a",
        b"10",
        b"0.001",
        b"1",
        b"{t}b",
        b"10",
        b"1",
        b"1",
    ];
    // One whole group followed by 1, 2 or 3 arguments of a second one.
    let calls: Vec<&[&[u8]]> = (6..=8).map(|len| &full[..len]).collect();
    assert_arity_errors(&mut con, &calls);
    assert_eq!(bucket(&mut con, "{t}a"), a);
    assert!(!exists(&mut con, "{t}b"));
}

#[test]
fn the_same_key_twice_is_refused_and_touches_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    let error = takeall_error(
        &mut con,
        &[
            ("{t}a", "10", "1", "1"),
            ("{t}b", "10", "1", "1"),
            ("{t}a", "5", "2", "1"),
        ],
    );
    assert_eq!(error, "ERR each key may appear only once in TB.TAKEALL");
    assert!(!exists(&mut con, "{t}a") && !exists(&mut con, "{t}b"));
}

#[test]
fn an_argument_error_in_the_second_group_leaves_the_first_bucket_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "{t}first", "10", "0.001", "2");
    let first = bucket(&mut con, "{t}first");

    for ((capacity, rate, n), message) in [
        (("0", "1", "1"), CAPACITY_ERROR),
        (("10", "nan", "1"), RATE_ERROR),
        (("10", "1", "-1"), N_ERROR),
        // Checked in argument order: capacity before rate before n.
        (("inf", "0", "x"), CAPACITY_ERROR),
        (("10", "0", "x"), RATE_ERROR),
    ] {
        for first_group in [
            ("{t}first", "10", "0.001", "1"),
            ("{t}missing", "10", "1", "1"),
        ] {
            let error = takeall_error(&mut con, &[first_group, ("{t}second", capacity, rate, n)]);
            assert_eq!(error, message, "second group {capacity} {rate} {n}");
        }
    }
    assert_eq!(bucket(&mut con, "{t}first"), first);
    assert!(!exists(&mut con, "{t}missing") && !exists(&mut con, "{t}second"));
}

#[test]
fn a_wrongtype_second_key_leaves_the_first_bucket_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "{t}first", "10", "0.001", "2");
    let first = bucket(&mut con, "{t}first");
    let _: () = redis::cmd("SET")
        .arg("{t}string")
        .arg("x")
        .query(&mut con)
        .expect("SET");
    let _: i64 = redis::cmd("RPUSH")
        .arg("{t}list")
        .arg("x")
        .query(&mut con)
        .expect("RPUSH");

    for other in ["{t}string", "{t}list"] {
        let error = takeall_error(
            &mut con,
            &[("{t}first", "10", "0.001", "1"), (other, "10", "1", "1")],
        );
        assert_eq!(error, WRONGTYPE_ERROR, "{other}");
    }
    assert_eq!(bucket(&mut con, "{t}first"), first);
    let value: String = redis::cmd("GET")
        .arg("{t}string")
        .query(&mut con)
        .expect("GET");
    assert_eq!(value, "x");
}

#[test]
fn a_corrupt_later_bucket_is_named_in_the_error_and_leaves_the_first_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "{t}first", "10", "0.001", "2");
    let first = bucket(&mut con, "{t}first");
    seed_bucket(&mut con, "{t}bad", "abc", "0");
    hset(&mut con, "{t}half", &[("tokens", "3")]);
    let corrupt = [bucket(&mut con, "{t}bad"), bucket(&mut con, "{t}half")];

    let error = takeall_error(
        &mut con,
        &[("{t}first", "10", "0.001", "1"), ("{t}bad", "10", "1", "1")],
    );
    assert_eq!(error, corrupt_error("{t}bad"));
    // The third key this time, after a missing one: still named, still nothing written.
    let error = takeall_error(
        &mut con,
        &[
            ("{t}first", "10", "0.001", "1"),
            ("{t}missing", "10", "1", "1"),
            ("{t}half", "10", "1", "1"),
        ],
    );
    assert_eq!(error, corrupt_error("{t}half"));
    assert_eq!(bucket(&mut con, "{t}first"), first);
    assert!(!exists(&mut con, "{t}missing"));
    assert_eq!(
        [bucket(&mut con, "{t}bad"), bucket(&mut con, "{t}half")],
        corrupt
    );
}

// --- Command metadata ----------------------------------------------------------------------------

#[test]
fn command_getkeys_returns_every_fourth_argument() {
    let server = Server::start();
    let mut con = server.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("TB.TAKEALL")
        .arg(&[
            "{u}a", "10", "1", "1", "{u}b", "5", "2", "1", "{u}c", "1", "1", "0",
        ])
        .query(&mut con)
        .expect("COMMAND GETKEYS");
    assert_eq!(keys, ["{u}a", "{u}b", "{u}c"]);
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("TB.TAKEALL")
        .arg(&["only", "10", "1", "1"])
        .query(&mut con)
        .expect("COMMAND GETKEYS");
    assert_eq!(keys, ["only"]);
}

#[test]
fn command_info_gives_arity_minus_five_and_keys_one_minus_one_step_four() {
    let server = Server::start();
    let mut con = server.conn();
    let info: redis::Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("tb.takeall")
        .query(&mut con)
        .expect("COMMAND INFO");
    let entry = &array(&info)[0];
    let entry = array(entry);
    assert_eq!(text(&entry[0]), "tb.takeall");
    assert_eq!(int(&entry[1]), -5, "arity");
    let flags: Vec<String> = array(&entry[2]).iter().map(text).collect();
    for flag in ["write", "denyoom"] {
        assert!(flags.iter().any(|f| f == flag), "flag {flag} in {flags:?}");
    }
    // Its cost grows with the number of buckets, so it is not `fast` (as MSET is not).
    assert!(!flags.iter().any(|f| f == "fast"), "flags {flags:?}");
    assert_eq!([int(&entry[3]), int(&entry[4]), int(&entry[5])], [1, -1, 4]);
}

#[test]
fn command_docs_describe_a_repeated_block_of_key_capacity_rate_n_then_the_options() {
    let server = Server::start();
    let mut con = server.conn();
    let docs: redis::Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg("tb.takeall")
        .query(&mut con)
        .expect("COMMAND DOCS");
    let docs = array(&docs);
    assert_eq!(text(&docs[0]), "tb.takeall");
    let doc = &docs[1];
    assert_eq!(text(field(doc, "group")), "module");
    assert!(
        text(field(doc, "summary")).contains("index"),
        "summary names the index field"
    );

    let arguments = array(field(doc, "arguments"));
    assert_eq!(
        arguments.len(),
        3,
        "the block, MAXWAIT, the lockout: {arguments:?}"
    );
    let options: Vec<String> = arguments[1..]
        .iter()
        .map(|a| text(field(a, "name")))
        .collect();
    assert_eq!(options, ["max_wait_ms", "lockout"]);
    let block = &arguments[0];
    assert_eq!(text(field(block, "type")), "block");
    let flags: Vec<String> = array(field(block, "flags")).iter().map(text).collect();
    assert!(
        flags.iter().any(|f| f == "multiple"),
        "block flags {flags:?}"
    );
    let inner: Vec<(String, String)> = array(field(block, "arguments"))
        .iter()
        .map(|arg| (text(field(arg, "name")), text(field(arg, "type"))))
        .collect();
    let expected = [
        ("key", "key"),
        ("capacity", "double"),
        ("rate", "double"),
        ("n", "double"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect();
    assert_eq!(inner, expected);
}

fn array(value: &redis::Value) -> &[redis::Value] {
    match value {
        redis::Value::Array(items) => items,
        other => panic!("expected an array, got {other:?}"),
    }
}

fn text(value: &redis::Value) -> String {
    match value {
        redis::Value::BulkString(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        other => panic!("expected a string, got {other:?}"),
    }
}

fn int(value: &redis::Value) -> i64 {
    match value {
        redis::Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    }
}

/// The value after `name` in a flat `[name, value, name, value, ...]` reply.
fn field<'a>(map: &'a redis::Value, name: &str) -> &'a redis::Value {
    array(map)
        .chunks(2)
        .find(|pair| text(&pair[0]) == name)
        .map(|pair| &pair[1])
        .unwrap_or_else(|| panic!("no {name:?} in {map:?}"))
}

// --- Replication --------------------------------------------------------------------------------

#[test]
fn an_allowed_takeall_leaves_the_replica_byte_identical() {
    let master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    let mut m = master.conn();
    // A field of its own, which TB.TAKEALL leaves alone; fractional numbers make the
    // stored token counts non-trivial text.
    hset(
        &mut m,
        "{t}owned",
        &[("owner", "alice"), ("tokens", "4.5"), ("last_refill", "0")],
    );
    // Slow rates (full again in 250 s or more), so no bucket expires before it is compared.
    let groups: [Group; 3] = [
        ("{t}a", "10", "0.005", "3"),
        ("{t}b", "2.5", "0.003", "0.7"),
        ("{t}owned", "4.5", "0.01", "1.25"),
    ];
    for call in 0..2 {
        let reply = takeall(&mut m, &groups);
        assert_eq!(reply[0], 1, "call {call}: {reply:?}");
    }
    let keys: Vec<&str> = groups.iter().map(|(key, ..)| *key).collect();
    assert_replica_holds_the_same_buckets(&master, &replica, &keys);
    let mut r = replica.conn();
    assert_eq!(hgetall(&mut r, "{t}owned")["owner"], "alice");
}

#[test]
fn a_denied_takeall_does_not_move_the_replication_offset() {
    let master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    let mut m = master.conn();
    empty_bucket(&mut m, "{t}empty", "0.001");
    take(&mut m, "{t}some", "10", "0.001", "3");
    wait_for_replica(&master, &replica);
    let offset = repl_offset(&mut m);

    for _ in 0..50 {
        // Denied by an empty bucket, and by n above a capacity.
        let reply = takeall(
            &mut m,
            &[
                ("{t}some", "10", "0.001", "1"),
                ("{t}new", "10", "1", "1"),
                ("{t}empty", "1", "0.001", "1"),
            ],
        );
        assert_eq!(reply[0], 0, "{reply:?}");
        let reply = takeall(
            &mut m,
            &[("{t}new", "10", "1", "1"), ("{t}huge", "1", "1", "2")],
        );
        assert_eq!(reply[0], 0, "{reply:?}");
    }

    assert_eq!(repl_offset(&mut m), offset, "master_repl_offset moved");
    wait_for_replica(&master, &replica);
    let mut r = replica.conn();
    for key in ["{t}new", "{t}huge"] {
        assert!(
            !exists(&mut m, key) && !exists(&mut r, key),
            "{key} was created"
        );
    }
    for key in ["{t}some", "{t}empty"] {
        assert_eq!(bucket(&mut r, key), bucket(&mut m, key), "{key}");
    }
}

// --- AOF ---------------------------------------------------------------------------------------

/// Slow rates: deadlines 100 s or more away, so nothing expires across a restart.
const SLOW_GROUPS: [Group; 3] = [
    ("{t}a", "10", "0.01", "3"),
    ("{t}b", "2.5", "0.003", "0.7"),
    ("{t}zero", "5", "0.01", "0"),
];

#[test]
fn the_aof_holds_one_multi_with_hset_and_pexpireat_per_charged_bucket() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    let start = aof_without_select(&server, &mut con).len();

    let reply = takeall(&mut con, &SLOW_GROUPS);
    assert_eq!(reply[0], 1, "{reply:?}");
    let logged = aof_without_select(&server, &mut con);

    let mut expected = vec![argv(&["MULTI"])];
    for key in ["{t}a", "{t}b"] {
        expected.extend(bucket_write(&mut con, key));
    }
    expected.push(argv(&["EXEC"]));
    assert_eq!(
        logged[start..].to_vec(),
        expected,
        "AOF after TB.TAKEALL (the n = 0 bucket is not written)"
    );
    assert!(!exists(&mut con, "{t}zero"));
    assert_no_tb_command(&logged);
}

#[test]
fn a_denied_takeall_adds_nothing_to_the_aof() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    empty_bucket(&mut con, "{t}empty", "0.001");
    let before = aof_without_select(&server, &mut con);

    for _ in 0..20 {
        let reply = takeall(
            &mut con,
            &[("{t}new", "10", "1", "1"), ("{t}empty", "1", "0.001", "1")],
        );
        assert_eq!(reply[0], 0, "{reply:?}");
    }
    assert_eq!(aof_without_select(&server, &mut con), before);
}

#[test]
fn takeall_state_survives_an_aof_restart() {
    let mut server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    for _ in 0..2 {
        let reply = takeall(&mut con, &SLOW_GROUPS);
        assert_eq!(reply[0], 1, "{reply:?}");
    }
    let keys = ["{t}a", "{t}b", "{t}zero"];
    let before = buckets(&mut con, &keys);
    assert!(
        before[0].expire_at_ms > 0 && before[1].expire_at_ms > 0,
        "{before:?}"
    );

    server.restart();
    let mut con = server.conn();
    assert_eq!(buckets(&mut con, &keys), before);
}

// --- Cluster -------------------------------------------------------------------------------------

/// How long a fresh cluster may take to agree on its slots.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// Slot ranges of the three masters, as `redis-cli --cluster create` splits them.
const SLOT_RANGES: [(i64, i64); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// A minimal cluster of three masters, slots split in three ranges.
struct Cluster {
    nodes: Vec<Server>,
}

impl Cluster {
    fn start() -> Cluster {
        let nodes: Vec<Server> = (0..3)
            .map(|_| start_cluster_node(unused_port(), &["--cluster-announce-ip", "127.0.0.1"]))
            .collect();
        for (epoch, (node, (first, last))) in nodes.iter().zip(SLOT_RANGES).enumerate() {
            let mut con = node.conn();
            // Distinct epochs up front (as `redis-cli --cluster create` does), so no
            // collision is left for gossip to resolve.
            let _: () = redis::cmd("CLUSTER")
                .arg("SET-CONFIG-EPOCH")
                .arg(epoch + 1)
                .query(&mut con)
                .expect("CLUSTER SET-CONFIG-EPOCH");
            let _: () = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(first)
                .arg(last)
                .query(&mut con)
                .expect("CLUSTER ADDSLOTSRANGE");
        }
        let mut first = nodes[0].conn();
        for node in &nodes[1..] {
            let (_, bus_port): (String, u16) = redis::cmd("CONFIG")
                .arg("GET")
                .arg("cluster-port")
                .query(&mut node.conn())
                .expect("CONFIG GET cluster-port");
            let _: () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(node.port)
                .arg(bus_port)
                .query(&mut first)
                .expect("CLUSTER MEET");
        }
        let cluster = Cluster { nodes };
        // Every node must see the whole map before a client reads it from one of them.
        let expected: Vec<(i64, i64, u16)> = SLOT_RANGES
            .iter()
            .zip(&cluster.nodes)
            .map(|(&(first, last), node)| (first, last, node.port))
            .collect();
        for node in &cluster.nodes {
            let mut con = node.conn();
            wait_until(
                &format!(
                    "node {} to see cluster_state:ok and every slot range",
                    node.port
                ),
                CLUSTER_TIMEOUT,
                || {
                    let info: String = redis::cmd("CLUSTER")
                        .arg("INFO")
                        .query(&mut con)
                        .expect("CLUSTER INFO");
                    info.contains("cluster_state:ok") && slot_map(&mut con) == expected
                },
            );
        }
        cluster
    }

    /// A cluster-aware client that starts from the first node only.
    fn client(&self) -> redis::cluster::ClusterConnection {
        redis::cluster::ClusterClientBuilder::new(vec![format!(
            "redis://127.0.0.1:{}/",
            self.nodes[0].port
        )])
        .connection_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(30))
        .build()
        .expect("cluster client")
        .get_connection()
        .expect("cluster connection")
    }

    fn slot(&self, key: &str) -> i64 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.nodes[0].conn())
            .expect("CLUSTER KEYSLOT")
    }

    /// The node that owns `slot` (ranges as assigned in `start`).
    fn owner(&self, slot: i64) -> usize {
        SLOT_RANGES
            .iter()
            .position(|&(first, last)| (first..=last).contains(&slot))
            .unwrap_or_else(|| panic!("slot {slot} out of range"))
    }

    fn total_keys(&self) -> i64 {
        self.nodes
            .iter()
            .map(|node| {
                redis::cmd("DBSIZE")
                    .query::<i64>(&mut node.conn())
                    .expect("DBSIZE")
            })
            .sum()
    }
}

/// `CLUSTER SLOTS` as (first slot, last slot, master port), sorted.
fn slot_map(con: &mut redis::Connection) -> Vec<(i64, i64, u16)> {
    let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(con)
        .expect("CLUSTER SLOTS");
    let mut map: Vec<(i64, i64, u16)> = slots
        .iter()
        .map(|range| {
            let range = array(range);
            let master = array(&range[2]);
            (int(&range[0]), int(&range[1]), int(&master[1]) as u16)
        })
        .collect();
    map.sort();
    map
}

/// A port nothing listens on right now.
fn unused_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

#[test]
fn takeall_with_hash_tagged_keys_works_through_a_cluster_client() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let mut owners = Vec::new();

    for user in 1..=6 {
        let sec = format!("{{user:{user}}}:sec");
        let day = format!("{{user:{user}}}:day");
        // A slow refill on the first bucket, so it is still there (100 s
        // from full) when the test reads it back and counts keys, however
        // long the cluster client takes to find its way.
        let limits = [
            (sec.as_str(), "10", "0.01", "1"),
            (day.as_str(), "1000", "0.011574", "1"),
        ];
        // Both buckets missing: the first keeps fewer tokens (9 against 999).
        assert_eq!(
            takeall(&mut client, &limits),
            vec![1, 9, 0, 100_000, 0],
            "user {user}"
        );

        let slot = cluster.slot(&sec);
        assert_eq!(
            slot,
            cluster.slot(&day),
            "the hash tag puts both buckets in one slot"
        );
        let owner = cluster.owner(slot);
        let mut con = cluster.nodes[owner].conn();
        assert_eq!(
            hgetall(&mut con, &sec)["tokens"],
            "9",
            "{sec} on node {owner}"
        );
        assert_eq!(
            hgetall(&mut con, &day)["tokens"],
            "999",
            "{day} on node {owner}"
        );
        owners.push(owner);
    }

    owners.sort();
    owners.dedup();
    assert!(
        owners.len() >= 2,
        "the users' slots span several nodes: {owners:?}"
    );
    assert_eq!(
        cluster.total_keys(),
        12,
        "two buckets per user, nothing else"
    );
}

#[test]
fn takeall_across_slots_without_a_hash_tag_is_refused_with_crossslot() {
    let cluster = Cluster::start();
    // Keys in different slots: first on different nodes, then both on node 0.
    let (a, b) = ("user:7:sec", "user:7:day");
    assert_ne!(
        cluster.owner(cluster.slot(a)),
        cluster.owner(cluster.slot(b))
    );
    let same_node: Vec<String> = (0..)
        .map(|i| format!("k{i}"))
        .filter(|key| cluster.owner(cluster.slot(key)) == 0)
        .take(2)
        .collect();
    assert_ne!(cluster.slot(&same_node[0]), cluster.slot(&same_node[1]));

    let mut client = cluster.client();
    for (first, second) in [(a, b), (same_node[0].as_str(), same_node[1].as_str())] {
        let groups = [(first, "10", "10", "1"), (second, "1000", "0.011574", "1")];
        let error = takeall_cmd(&groups)
            .query::<redis::Value>(&mut client)
            .expect_err("TB.TAKEALL across slots must fail");
        assert_eq!(error.kind(), redis::ErrorKind::CrossSlot, "{error:?}");

        // Sent straight to the node owning the first key, the server's own reply.
        let mut con = cluster.nodes[cluster.owner(cluster.slot(first))].conn();
        assert_eq!(
            takeall_error(&mut con, &groups),
            "CROSSSLOT Keys in request don't hash to the same slot"
        );
    }
    assert_eq!(
        cluster.total_keys(),
        0,
        "a refused TB.TAKEALL created a key"
    );
}

/// 20,000 buckets in one call (the duplicate check is a hash set, linear in the keys; its cost
/// against MSET is in `make bench`): all taken, and a duplicate at the very end still refuses
/// the whole call before anything is written.
#[test]
fn twenty_thousand_buckets_are_taken_at_once_and_a_late_duplicate_is_refused() {
    let server = Server::start();
    let mut con = server.conn();
    let keys: Vec<String> = (0..20_000).map(|i| format!("many:{i}")).collect();
    let mut cmd = redis::cmd("TB.TAKEALL");
    for key in &keys {
        cmd.arg(key).arg("10").arg("0.001").arg("1");
    }
    let reply: Vec<i64> = cmd.query(&mut con).expect("TB.TAKEALL of 20,000 keys");
    assert_eq!(&reply[..2], &[1, 9]);
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut con).expect("DBSIZE");
    assert_eq!(dbsize, 20_000);

    let mut duplicate = redis::cmd("TB.TAKEALL");
    for key in keys.iter().chain(std::iter::once(&keys[0])) {
        duplicate
            .arg(format!("{key}:2"))
            .arg("10")
            .arg("0.001")
            .arg("1");
    }
    let err = duplicate
        .query::<redis::Value>(&mut con)
        .expect_err("a duplicate key");
    assert_eq!(
        error_text(&err),
        "ERR each key may appear only once in TB.TAKEALL"
    );
    let dbsize: i64 = redis::cmd("DBSIZE").query(&mut con).expect("DBSIZE");
    assert_eq!(dbsize, 20_000, "nothing written");
}
