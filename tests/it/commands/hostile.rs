//! Buckets edited by hand, and a server clock that stepped backwards.
//!
//! A bucket is a plain hash, so anyone with `HSET` can put anything in it. Each test writes one
//! kind of hostile state and checks that TB.TAKE (and its siblings) either refuses it with the
//! corrupt-bucket error, touching nothing, or applies the documented recovery rule:
//!
//! | stored state                          | rule                                            |
//! |---------------------------------------|-------------------------------------------------|
//! | `tokens`/`last_refill` not a number   | `ERR corrupt bucket 'KEY': ...`, key untouched  |
//! | a field missing                       | same error                                      |
//! | `tokens` < 0                          | counts as 0                                     |
//! | `tokens` > capacity                   | capped at capacity                              |
//! | `last_refill` in the future           | counts as now; the first write repairs it       |
//! | `last_refill` far in the past         | full bucket                                     |
//! | sign / fraction / exponent            | read as the number it spells                    |
//! | other fields, any size                | kept as they are                                |
//!
//! After every case the server must still answer PING and no call may grant a token the
//! arithmetic does not allow.
//!
//! Timing: buckets that must not refill during a test use a rate of one token per 1000 s, and
//! waits that shrink while a test runs are asserted as ranges with `SLACK_MS` of slack.

use crate::harness::*;

/// Slack for waits that shrink while a test runs: far more than any test takes.
const SLACK_MS: i64 = 10_000;
/// One token per 1000 s: nothing refills noticeably during a test.
const SLOW: &str = "0.001";
/// Time to one token at `SLOW`.
const SLOW_TOKEN_MS: i64 = 1_000_000;
const DAY_MS: i64 = 86_400_000;

/// HSET with raw bytes for the key, the fields and the values.
fn hset_bytes(con: &mut redis::Connection, key: &[u8], fields: &[(&[u8], &[u8])]) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(key);
    for (field, value) in fields {
        cmd.arg(*field).arg(*value);
    }
    let _: i64 = cmd.query(con).expect("HSET");
}

/// Gives `key` a TTL, so a snapshot would notice if a refused call touched the expiry.
fn expire_in_an_hour(con: &mut redis::Connection, key: &[u8]) {
    let set: i64 = redis::cmd("PEXPIRE")
        .arg(key)
        .arg(3_600_000)
        .query(con)
        .expect("PEXPIRE");
    assert_eq!(set, 1);
}

/// TB.TAKE with a raw key; the reply or the exact error text.
fn take_raw(
    con: &mut redis::Connection,
    key: &[u8],
    capacity: &str,
    rate: &str,
    n: &str,
) -> Result<Vec<i64>, String> {
    redis::cmd("TB.TAKE")
        .arg(key)
        .arg(capacity)
        .arg(rate)
        .arg(n)
        .query(con)
        .map_err(|e| error_text(&e))
}

fn hget_bytes(con: &mut redis::Connection, key: &[u8], field: &str) -> Option<Vec<u8>> {
    redis::cmd("HGET")
        .arg(key)
        .arg(field)
        .query(con)
        .expect("HGET")
}

/// Asserts a reply never reports a negative count or a negative wait other than the
/// documented -1 ("never", only when n > capacity).
fn assert_sane(reply: &[i64], what: &str) {
    assert_eq!(reply.len(), 4, "{what}: {reply:?}");
    assert!(reply[0] == 0 || reply[0] == 1, "{what}: {reply:?}");
    assert!(reply[1] >= 0, "{what}: negative remaining in {reply:?}");
    assert!(
        reply[2] >= 0,
        "{what}: negative retry_after_ms in {reply:?}"
    );
    assert!(
        reply[3] >= 0,
        "{what}: negative reset_after_ms in {reply:?}"
    );
}

/// Stores `tokens` with a valid `last_refill` (or the reverse) under a fresh key for each
/// hostile value, calls TB.TAKE, and asserts the corrupt-bucket error and an untouched key.
fn assert_each_value_is_refused(field: &str, values: &[(Vec<u8>, &str)]) {
    let server = Server::start();
    let mut con = server.conn();
    let now = server_time_ms(&mut con).to_string();
    for (index, (value, why)) in values.iter().enumerate() {
        let key = format!("bad:{field}:{index}");
        let (tokens, last_refill): (&[u8], &[u8]) = if field == "tokens" {
            (value, now.as_bytes())
        } else {
            (b"5", value)
        };
        hset_bytes(
            &mut con,
            key.as_bytes(),
            &[(b"tokens", tokens), (b"last_refill", last_refill)],
        );
        expire_in_an_hour(&mut con, key.as_bytes());
        let before = snapshot(&mut con, key.as_bytes());
        let got = take_raw(&mut con, key.as_bytes(), "10", "1", "1");
        assert_eq!(got, Err(corrupt_error(&key)), "{field} = {why}");
        assert_eq!(
            snapshot(&mut con, key.as_bytes()),
            before,
            "{field} = {why}: a refused call changed the key"
        );
        assert!(ping(&mut con), "{field} = {why}: server down");
    }
}

/// Values that are not a finite decimal number, each with why it is refused.
fn garbage() -> Vec<(Vec<u8>, &'static str)> {
    vec![
        (b"abc".to_vec(), "letters"),
        (b"".to_vec(), "empty"),
        (vec![b'1'; 1 << 20], "1 MB of digits (over 64 bytes)"),
        (vec![b'x'; 1 << 20], "1 MB of letters"),
        (b"\x00\xff\r\n\x80".to_vec(), "binary bytes"),
        (b"5\x00".to_vec(), "number then NUL"),
        (b"inf".to_vec(), "inf"),
        (b"-inf".to_vec(), "-inf"),
        (b"Infinity".to_vec(), "Infinity"),
        (b"nan".to_vec(), "nan"),
        (b"-nan".to_vec(), "-nan"),
        (b"0x10".to_vec(), "hex"),
        (b"1e400".to_vec(), "overflows to infinity"),
        (b" 5".to_vec(), "leading space"),
        (b"5 ".to_vec(), "trailing space"),
        (b"1_000".to_vec(), "underscore"),
        (b"1,5".to_vec(), "comma"),
        (b"--1".to_vec(), "two signs"),
        ("\u{663}".as_bytes().to_vec(), "non-ASCII digit"),
    ]
}

#[test]
fn garbage_in_tokens_is_a_corrupt_bucket_and_the_key_is_left_alone() {
    assert_each_value_is_refused("tokens", &garbage());
}

#[test]
fn garbage_in_last_refill_is_a_corrupt_bucket_and_the_key_is_left_alone() {
    assert_each_value_is_refused("last_refill", &garbage());
}

#[test]
fn a_hash_with_only_unrelated_fields_is_a_corrupt_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    hset(
        &mut con,
        "session:1",
        &[("user", "alice"), ("cart", "3 items")],
    );
    let before = snapshot(&mut con, b"session:1");
    assert_eq!(
        take_raw(&mut con, b"session:1", "10", "1", "1"),
        Err(corrupt_error("session:1"))
    );
    assert_eq!(snapshot(&mut con, b"session:1"), before);
    assert!(ping(&mut con));
}

#[test]
fn a_hash_missing_either_field_is_a_corrupt_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    let now = server_time_ms(&mut con).to_string();
    hset(&mut con, "only-tokens", &[("tokens", "5")]);
    hset(&mut con, "only-last-refill", &[("last_refill", &now)]);
    for key in ["only-tokens", "only-last-refill"] {
        let before = snapshot(&mut con, key.as_bytes());
        assert_eq!(
            take_raw(&mut con, key.as_bytes(), "10", "1", "1"),
            Err(corrupt_error(key))
        );
        assert_eq!(snapshot(&mut con, key.as_bytes()), before, "{key}");
    }
}

#[test]
fn peek_refund_and_takeall_refuse_a_corrupt_bucket_the_same_way() {
    let server = Server::start();
    let mut con = server.conn();
    seed_bucket(&mut con, "corrupt", "nan", "1");
    take(&mut con, "healthy", "10", SLOW, "3");
    let corrupt_before = snapshot(&mut con, b"corrupt");
    let healthy_before = snapshot(&mut con, b"healthy");
    let expected = corrupt_error("corrupt");

    for args in [
        vec!["TB.PEEK", "corrupt", "10", "1"],
        vec!["TB.PEEK", "corrupt", "10", "1", "1"],
        vec!["TB.REFUND", "corrupt", "10", "1", "1"],
        // The healthy bucket comes first and would allow: it must not be charged.
        vec![
            "TB.TAKEALL",
            "healthy",
            "10",
            SLOW,
            "1",
            "corrupt",
            "10",
            "1",
            "1",
        ],
    ] {
        let argv: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        assert_eq!(expect_error(&mut con, &argv), expected, "{args:?}");
        assert_eq!(snapshot(&mut con, b"corrupt"), corrupt_before, "{args:?}");
        assert_eq!(snapshot(&mut con, b"healthy"), healthy_before, "{args:?}");
    }
}

#[test]
fn a_corrupt_bucket_error_escapes_a_binary_key_name() {
    let server = Server::start();
    let mut con = server.conn();
    let key: &[u8] = b"\x00\xff'\\\r\n";
    hset_bytes(
        &mut con,
        key,
        &[(b"tokens", b"abc"), (b"last_refill", b"1")],
    );
    assert_eq!(
        take_raw(&mut con, key, "10", "1", "1"),
        Err(corrupt_error("\\x00\\xff\\'\\\\\\x0d\\x0a"))
    );
    assert!(ping(&mut con));
}

#[test]
fn a_corrupt_bucket_error_cuts_a_long_key_name_to_64_bytes() {
    let server = Server::start();
    let mut con = server.conn();
    let key = "k".repeat(10_000);
    hset(&mut con, &key, &[("tokens", "abc"), ("last_refill", "1")]);
    let shown = format!("{}...", "k".repeat(64));
    assert_eq!(
        take_raw(&mut con, key.as_bytes(), "10", "1", "1"),
        Err(corrupt_error(&shown))
    );
}

#[test]
fn negative_tokens_are_debt_and_the_wait_counts_it() {
    let server = Server::start();
    let mut con = server.conn();
    let now = server_time_ms(&mut con);
    seed_bucket(&mut con, "negative", "-5", now);
    let before = snapshot(&mut con, b"negative");
    let reply = take(&mut con, "negative", "10", SLOW, "1");
    assert_sane(&reply, "negative tokens");
    assert_eq!(
        &reply[..2],
        &[0, 0],
        "denied, remaining 0 (not -5): {reply:?}"
    );
    // From -5: the debt first, then the token: six tokens' worth of time.
    assert!(
        (6 * SLOW_TOKEN_MS - SLACK_MS..=6 * SLOW_TOKEN_MS).contains(&reply[2]),
        "retry_after_ms {} is not six tokens' time",
        reply[2]
    );
    assert!(
        (15 * SLOW_TOKEN_MS - SLACK_MS..=15 * SLOW_TOKEN_MS).contains(&reply[3]),
        "reset_after_ms {} is not fifteen tokens' time",
        reply[3]
    );
    assert_eq!(snapshot(&mut con, b"negative"), before, "a denial wrote");
}

#[test]
fn a_debt_deeper_than_2_pow_53_counts_as_2_pow_53() {
    let server = Server::start();
    let mut con = server.conn();
    // No call leaves more than 2^53 of debt; a hand-edited -1e300 is read as
    // that much, so the wait is the longest one there is, and nothing is written.
    let long_ago = server_time_ms(&mut con) - 200_000;
    seed_bucket(&mut con, "debt", "-1e300", long_ago);
    let before = snapshot(&mut con, b"debt");
    let reply = take(&mut con, "debt", "10", "0.01", "2");
    assert_eq!(&reply[..3], &[0, 0, 1 << 53], "{reply:?}");
    assert_eq!(snapshot(&mut con, b"debt"), before, "a denial wrote");
    // Repaid at a rate that can: 2^53 tokens at 2^53 per second is one second.
    let reply = take(&mut con, "debt", "10", "9007199254740992", "2");
    assert_eq!(&reply[..3], &[1, 8, 0], "{reply:?}");
}

#[test]
fn tokens_above_capacity_are_capped() {
    let server = Server::start();
    let mut con = server.conn();
    let now = server_time_ms(&mut con).to_string();
    seed_bucket(&mut con, "overfull", "1e9", now);
    let peeked = peek(&mut con, "overfull", "10", SLOW, "1");
    assert_eq!(&peeked[..3], &[1, 9, 0], "peek: {peeked:?}");
    let reply = take(&mut con, "overfull", "10", SLOW, "1");
    assert_eq!(&reply[..3], &[1, 9, 0], "take: {reply:?}");
    assert_eq!(reply[3], SLOW_TOKEN_MS, "one token short of full");
    let stored = stored_tokens(&mut con, "overfull");
    assert!((9.0..9.01).contains(&stored), "stored tokens {stored}");
}

#[test]
fn a_last_refill_far_in_the_future_counts_as_now_for_peek_without_a_write() {
    let server = Server::start();
    let mut con = server.conn();
    let tomorrow = server_time_ms(&mut con) + DAY_MS;
    seed_bucket(&mut con, "future", "2", tomorrow);
    let before = snapshot(&mut con, b"future");
    // The gap is never credited as refill, and the wait is counted from now, not tomorrow:
    // one token short at 1000 per second, full 8 tokens later.
    let reply = peek(&mut con, "future", "10", "1000", "3");
    assert_eq!(reply, vec![0, 2, 1, 8], "{reply:?}");
    assert_eq!(
        snapshot(&mut con, b"future"),
        before,
        "TB.PEEK writes nothing"
    );
}

#[test]
fn a_last_refill_far_in_the_future_grants_only_the_stored_tokens() {
    let server = Server::start();
    let mut con = server.conn();
    let tomorrow = server_time_ms(&mut con) + DAY_MS;
    seed_bucket(&mut con, "future", "2", tomorrow);
    assert_eq!(take(&mut con, "future", "10", SLOW, "3")[0], 0, "3 > 2");
    // The denial above repaired the future instant to the server's own now.
    let after = stored_last_refill(&mut con, "future");
    assert!(after < tomorrow - DAY_MS + SLACK_MS, "last_refill {after}");
    let reply = take(&mut con, "future", "10", SLOW, "2");
    assert_eq!(&reply[..3], &[1, 0, 0], "{reply:?}");
    assert_eq!(take(&mut con, "future", "10", SLOW, "1")[0], 0, "empty now");
}

#[test]
fn a_last_refill_beyond_any_clock_counts_as_now() {
    let server = Server::start();
    let mut con = server.conn();
    for (index, last_refill) in [
        "9e18",
        "9223372036854775807",
        "1e300",
        "1.7976931348623157e308",
    ]
    .iter()
    .enumerate()
    {
        let key = format!("beyond:{index}");
        hset(
            &mut con,
            &key,
            &[("tokens", "0"), ("last_refill", last_refill)],
        );
        let reply = take(&mut con, &key, "10", SLOW, "1");
        assert_sane(&reply, last_refill);
        assert_eq!(
            reply,
            vec![0, 0, SLOW_TOKEN_MS, 10 * SLOW_TOKEN_MS],
            "last_refill {last_refill}"
        );
        let repaired = stored_last_refill(&mut con, &key);
        assert!(repaired <= server_time_ms(&mut con), "{key}: {repaired}");
    }
}

#[test]
fn an_allowed_take_on_a_bucket_beyond_any_clock_sets_a_positive_ttl() {
    let server = Server::start();
    let mut con = server.conn();
    seed_bucket(&mut con, "beyond", "5", "1e300");
    // 6 tokens short at one per 100 s: the key cannot expire before its PTTL is read.
    let reply = take(&mut con, "beyond", "10", "0.01", "1");
    assert_eq!(reply, vec![1, 4, 0, 600_000]);
    let ttl = pttl(&mut con, "beyond");
    assert!(ttl > 0 && ttl <= 600_000, "PTTL {ttl}");
}

#[test]
fn a_last_refill_far_in_the_past_means_a_full_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    for (index, last_refill) in [
        "0",
        "1",
        "-1",
        "-1e15",
        "-9223372036854775808",
        "-1.7976931348623157e308",
        "1e-300",
    ]
    .iter()
    .enumerate()
    {
        let key = format!("past:{index}");
        hset(
            &mut con,
            &key,
            &[("tokens", "0"), ("last_refill", last_refill)],
        );
        // A huge rate too, so the refill term can overflow to infinity before the cap.
        for rate in ["1", "1e300"] {
            let reply = peek(&mut con, &key, "10", rate, "10");
            assert_eq!(
                reply[..3],
                [1, 0, 0],
                "last_refill {last_refill}, rate {rate}"
            );
        }
        let reply = take(&mut con, &key, "10", "1", "10");
        assert_eq!(
            &reply[..3],
            &[1, 0, 0],
            "last_refill {last_refill}: {reply:?}"
        );
    }
}

#[test]
fn a_last_refill_with_an_exponent_is_read_as_the_number_it_spells() {
    let server = Server::start();
    let mut con = server.conn();
    // "1.7e12" is November 2023: long past, so the bucket is full.
    seed_bucket(&mut con, "exp-past", "0", "1.7e12");
    assert_eq!(take(&mut con, "exp-past", "10", "1", "10")[..3], [1, 0, 0]);

    // About a minute from now (59 to 60 s: the instant is rounded down to a whole second),
    // spelled in seconds with an exponent: the wait shows the value was read as milliseconds
    // since 1970, not as a small number.
    let in_a_minute_s = server_time_ms(&mut con) / 1000 + 60;
    seed_bucket(&mut con, "exp-future", "0", format!("{in_a_minute_s}e3"));
    let reply = take(&mut con, "exp-future", "10", "1", "1");
    assert_sane(&reply, "exp-future");
    // Read as a small number it would lie in 1970 and leave a full bucket; read as ms it lies
    // ahead, counts as now, and the drained bucket waits exactly one token.
    assert_eq!(reply, vec![0, 0, 1000, 10_000], "{reply:?}");
}

#[test]
fn a_last_refill_with_a_fraction_or_a_sign_is_read_as_a_number() {
    let server = Server::start();
    let mut con = server.conn();
    let now = server_time_ms(&mut con);
    for (key, last_refill) in [
        ("fraction", format!("{now}.75")),
        ("plus-sign", format!("+{now}")),
        ("exponent-sign", format!("{}e+3", now / 1000)),
    ] {
        seed_bucket(&mut con, key, "4.5", &last_refill);
        let reply = take(&mut con, key, "10", SLOW, "1");
        assert_eq!(&reply[..3], &[1, 3, 0], "{key} = {last_refill}: {reply:?}");
        // Rewritten as the server's integer ms.
        let written = stored_last_refill(&mut con, key);
        assert!(written >= now, "{key}: last_refill {written}");
    }
}

#[test]
fn other_fields_are_kept_byte_for_byte_after_a_take() {
    let server = Server::start();
    let mut con = server.conn();
    let now = server_time_ms(&mut con).to_string();
    let huge = vec![b'z'; 1 << 20];
    hset_bytes(
        &mut con,
        b"annotated",
        &[
            (b"tokens", b"5"),
            (b"last_refill", now.as_bytes()),
            (b"owner", b"alice"),
            (b"\x00\xffbinary-field", b"\x00\x01\x02"),
            (b"", b"empty field name"),
            (b"note", &huge),
        ],
    );
    let mut before = hgetall_bytes(&mut con, "annotated");
    take(&mut con, "annotated", "10", SLOW, "1");
    let mut after = hgetall_bytes(&mut con, "annotated");
    assert_eq!(after.len(), 6, "no field added or removed");
    for field in [&b"tokens"[..], b"last_refill"] {
        before.remove(field);
        after.remove(field);
    }
    assert_eq!(
        after, before,
        "fields other than tokens/last_refill changed"
    );
    assert_eq!(
        hget_bytes(&mut con, b"annotated", "note").map(|v| v.len()),
        Some(1 << 20)
    );
}

#[test]
fn an_empty_key_name_is_a_bucket_like_any_other() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(
        take_raw(&mut con, b"", "10", SLOW, "4"),
        Ok(vec![1, 6, 0, 4 * SLOW_TOKEN_MS])
    );
    assert_eq!(
        take_raw(&mut con, b"", "10", SLOW, "1").unwrap()[..2],
        [1, 5]
    );
    assert!(exists(&mut con, ""));
    assert!(pttl(&mut con, "") > 0);
}

#[test]
fn a_binary_key_name_is_a_bucket_like_any_other() {
    let server = Server::start();
    let mut con = server.conn();
    let key: &[u8] = b"\x00\xff\r\n rl:\x80";
    assert_eq!(
        take_raw(&mut con, key, "10", SLOW, "4"),
        Ok(vec![1, 6, 0, 4 * SLOW_TOKEN_MS])
    );
    assert_eq!(
        take_raw(&mut con, key, "10", SLOW, "1").unwrap()[..2],
        [1, 5]
    );
    // A neighbour that differs in one byte is a different bucket.
    assert_eq!(
        take_raw(&mut con, b"\x00\xff\r\n rl:\x81", "10", SLOW, "1").unwrap()[..2],
        [1, 9]
    );
    let stored = hget_bytes(&mut con, key, "tokens").expect("tokens stored");
    let stored: f64 = String::from_utf8(stored).unwrap().parse().unwrap();
    assert!((5.0..5.01).contains(&stored), "stored tokens {stored}");
}

// --- Clock faults, end to end: a `last_refill` ahead of the server clock. ---

/// A bucket holding 3 tokens whose `last_refill` is a minute ahead of the server clock, as
/// after a clock step backwards.
fn bucket_a_minute_ahead(con: &mut redis::Connection, key: &str) -> i64 {
    let ahead = server_time_ms(con) + 60_000;
    hset(
        con,
        key,
        &[("tokens", "3"), ("last_refill", &ahead.to_string())],
    );
    ahead
}

#[test]
fn a_clock_stepped_back_never_grants_more_than_the_stored_tokens() {
    let server = Server::start();
    let mut con = server.conn();
    bucket_a_minute_ahead(&mut con, "skewed");
    let mut granted = 0;
    for call in 0..10 {
        let reply = take(&mut con, "skewed", "10", SLOW, "1");
        assert_sane(&reply, &format!("call {call}"));
        granted += reply[0];
    }
    assert_eq!(granted, 3, "exactly the 3 stored tokens");
}

#[test]
fn a_clock_stepped_back_gives_waits_counted_from_now_never_from_the_future() {
    let server = Server::start();
    let mut con = server.conn();
    bucket_a_minute_ahead(&mut con, "skewed");
    // 4 > 3 stored: the fourth token arrives one second (rate 1) from now, not from the
    // minute ahead; full 7 s from now.
    let reply = take(&mut con, "skewed", "10", "1", "4");
    assert_sane(&reply, "denied");
    assert_eq!(reply, vec![0, 3, 1000, 7000], "{reply:?}");
}

#[test]
fn a_clock_stepped_back_still_sets_a_positive_ttl_after_an_allowed_take() {
    let server = Server::start();
    let mut con = server.conn();
    bucket_a_minute_ahead(&mut con, "skewed");
    let reply = take(&mut con, "skewed", "10", "0.01", "1");
    assert_eq!(&reply[..3], &[1, 2, 0], "{reply:?}");
    // From now (the write replaces the future instant): 8 tokens short at 1 per 100 s, so
    // the key is still there for the reads below.
    assert_eq!(reply[3], 800_000);
    let ttl = pttl(&mut con, "skewed");
    assert!(ttl > 0 && ttl <= 800_000, "PTTL {ttl}");
    let deadline = pexpiretime(&mut con, "skewed");
    assert!(
        deadline > server_time_ms(&mut con),
        "deadline {deadline} passed"
    );
}

#[test]
fn a_clock_stepped_back_with_n_zero_repairs_last_refill_and_nothing_else() {
    let server = Server::start();
    let mut con = server.conn();
    bucket_a_minute_ahead(&mut con, "skewed");
    let before = server_time_ms(&mut con);
    let reply = take(&mut con, "skewed", "10", "1", "0");
    assert_eq!(reply, vec![1, 3, 0, 7000]);
    let repaired = stored_last_refill(&mut con, "skewed");
    assert!((before..=server_time_ms(&mut con)).contains(&repaired));
    assert_eq!(stored_tokens(&mut con, "skewed"), 3.0);
    assert!(pttl(&mut con, "skewed") > 0, "the repair sets the TTL too");
    // Repaired: the same call now writes nothing at all.
    let snapshot_after = snapshot(&mut con, b"skewed");
    take(&mut con, "skewed", "10", "1", "0");
    assert_eq!(snapshot(&mut con, b"skewed"), snapshot_after);
}

/// The case: a drained bucket a minute ahead of the clock, at 1,000 tokens a second.
/// Before the rule, its denials wrote nothing and it stayed locked out for the whole minute.
#[test]
fn a_drained_bucket_a_minute_in_the_future_is_granted_again_within_milliseconds() {
    let server = Server::start();
    let mut con = server.conn();
    let ahead = server_time_ms(&mut con) + 60_000;
    seed_bucket(&mut con, "drained", "0", ahead);
    let denied = take(&mut con, "drained", "10", "1000", "1");
    assert_eq!(denied, vec![0, 0, 1, 10], "counted from now: {denied:?}");
    let started = std::time::Instant::now();
    wait_until(
        "the drained bucket to grant again",
        std::time::Duration::from_secs(2),
        || take(&mut con, "drained", "10", "1000", "1")[0] == 1,
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
}

#[test]
fn a_denied_takeall_repairs_only_the_buckets_in_the_future() {
    let server = Server::start();
    let mut con = server.conn();
    bucket_a_minute_ahead(&mut con, "{u}ahead");
    let now = server_time_ms(&mut con).to_string();
    seed_bucket(&mut con, "{u}drained", "0", now);
    let drained = snapshot(&mut con, b"{u}drained");
    let reply: Vec<i64> = redis::cmd("TB.TAKEALL")
        .arg(&["{u}ahead", "10", SLOW, "1", "{u}drained", "10", SLOW, "1"])
        .query(&mut con)
        .expect("TB.TAKEALL");
    assert_eq!(&reply[..1], &[0], "{reply:?}");
    assert_eq!(reply[4], 1, "the drained bucket decides");
    assert_eq!(stored_tokens(&mut con, "{u}ahead"), 3.0, "nothing taken");
    assert!(stored_last_refill(&mut con, "{u}ahead") <= server_time_ms(&mut con));
    assert_eq!(snapshot(&mut con, b"{u}drained"), drained, "untouched");
}

#[test]
fn a_refund_of_zero_repairs_a_future_last_refill() {
    let server = Server::start();
    let mut con = server.conn();
    bucket_a_minute_ahead(&mut con, "skewed");
    let reply: Vec<i64> = redis::cmd("TB.REFUND")
        .arg(&["skewed", "10", "1", "0"])
        .query(&mut con)
        .expect("TB.REFUND");
    assert_eq!(reply, vec![1, 3, 0, 7000]);
    assert!(stored_last_refill(&mut con, "skewed") <= server_time_ms(&mut con));
}
