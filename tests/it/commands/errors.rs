//! Every bad input from the contract: exact error text, the server alive afterwards, and the key
//! (bucket or foreign value) byte-for-byte and expiry-for-expiry untouched.

use crate::harness::*;

const CAPACITY_ERR: &str = "ERR capacity must be a positive finite number";
const RATE_ERR: &str = "ERR rate must be a positive finite number";
const N_ERR: &str = "ERR n must be a non-negative finite number";
const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";

/// Rejected everywhere (capacity, rate and n).
fn bad_everywhere() -> Vec<(String, &'static str)> {
    let mut cases: Vec<(String, &'static str)> = [
        ("nan", "nan"),
        ("NaN", "NaN"),
        ("inf", "inf"),
        ("-inf", "-inf"),
        ("+inf", "+inf"),
        ("Infinity", "Infinity"),
        ("-1", "negative"),
        ("-0", "minus zero (no sign allowed)"),
        ("+1", "plus sign"),
        ("0x10", "hex"),
        ("", "empty"),
        (" 5", "leading space"),
        ("5 ", "trailing space"),
        ("5\t", "trailing tab"),
        ("5\n", "trailing newline"),
        ("1e400", "overflows to inf"),
        ("1_000", "underscore"),
        ("1,5", "comma"),
        ("abc", "letters"),
        ("5abc", "trailing letters"),
        (".", "lone dot"),
        ("e5", "exponent without mantissa"),
        ("1e", "exponent without digits"),
        ("1e+", "exponent sign without digits"),
        ("1.2.3", "two dots"),
        ("5\u{0}", "embedded NUL"),
        ("\u{663}", "non-ASCII digit"),
    ]
    .iter()
    .map(|(v, why)| (v.to_string(), *why))
    .collect();
    // 65 bytes, otherwise a fine number (1.000...): too long.
    cases.push((format!("1.{}", "0".repeat(63)), "65 bytes long"));
    cases.push(("9".repeat(65), "65 digits"));
    cases
}

/// Rejected for capacity and rate only (they must be > 0); fine for n.
fn bad_for_capacity_and_rate_only() -> Vec<(&'static str, &'static str)> {
    vec![
        ("0", "zero"),
        ("0.0", "zero with decimals"),
        (".0", "zero without integer part"),
        ("0e5", "zero with exponent"),
        ("1e-400", "underflows to zero"),
    ]
}

/// Documented accepted spellings, and the 64-byte boundary.
fn accepted() -> Vec<String> {
    let mut v: Vec<String> = ["20", "2.5", "1e3", "0.5", ".5", "5.", "1E-3", "1e+2", "007"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    v.push(format!("1.{}", "0".repeat(62))); // exactly 64 bytes
    v
}

/// A bucket with state and an expiry, to prove an error leaves it untouched.
fn seed_bucket(con: &mut redis::Connection, key: &str) {
    take(con, key, "10", "0.001", "3");
}

/// Calls `args`, asserts the exact error, a live server and an untouched key.
fn assert_rejected(
    server: &Server,
    con: &mut redis::Connection,
    key: &[u8],
    args: &[&[u8]],
    expected: &str,
    case: &str,
) {
    let before = snapshot(con, key);
    let got = expect_error(con, args);
    assert_eq!(got, expected, "case {case}: {}", show_args(args));
    assert!(ping(con), "case {case}: server no longer answers PING");
    assert!(server.is_alive(), "case {case}: server died");
    assert_eq!(
        snapshot(con, key),
        before,
        "case {case}: key changed by a rejected call {}",
        show_args(args)
    );
}

#[test]
fn bad_numbers_are_rejected_with_the_argument_named() {
    let server = Server::start();
    let mut con = server.conn();
    seed_bucket(&mut con, "b");
    for cmd in ["TB.TAKE", "TB.PEEK"] {
        for (value, why) in bad_everywhere() {
            let v = value.as_bytes();
            let positions: [(&[&[u8]], &str, &str); 3] = [
                (
                    &[cmd.as_bytes(), b"b", v, b"1", b"1"],
                    "capacity",
                    CAPACITY_ERR,
                ),
                (&[cmd.as_bytes(), b"b", b"10", v, b"1"], "rate", RATE_ERR),
                (&[cmd.as_bytes(), b"b", b"10", b"1", v], "n", N_ERR),
            ];
            for (args, position, expected) in positions {
                let case = format!("{cmd} {position} = {value:?} ({why})");
                assert_rejected(&server, &mut con, b"b", args, expected, &case);
            }
        }
    }
}

#[test]
fn zero_or_underflowing_capacity_and_rate_are_rejected() {
    let server = Server::start();
    let mut con = server.conn();
    seed_bucket(&mut con, "b");
    for cmd in ["TB.TAKE", "TB.PEEK"] {
        for (value, why) in bad_for_capacity_and_rate_only() {
            let v = value.as_bytes();
            let case = format!("{cmd} capacity = {value:?} ({why})");
            assert_rejected(
                &server,
                &mut con,
                b"b",
                &[cmd.as_bytes(), b"b", v, b"1", b"1"],
                CAPACITY_ERR,
                &case,
            );
            let case = format!("{cmd} rate = {value:?} ({why})");
            assert_rejected(
                &server,
                &mut con,
                b"b",
                &[cmd.as_bytes(), b"b", b"10", v, b"1"],
                RATE_ERR,
                &case,
            );
        }
    }
}

#[test]
fn zero_and_underflowing_n_are_accepted() {
    let server = Server::start();
    let mut con = server.conn();
    for (value, why) in bad_for_capacity_and_rate_only() {
        let reply = take(&mut con, "fresh", "10", "1", value);
        assert_eq!(reply, vec![1, 10, 0, 0], "n = {value:?} ({why})");
    }
    assert!(!exists(&mut con, "fresh"));
}

#[test]
fn documented_number_spellings_are_accepted_everywhere() {
    let server = Server::start();
    let mut con = server.conn();
    for cmd in ["TB.TAKE", "TB.PEEK"] {
        for value in accepted() {
            let v = value.as_str();
            for (position, args) in [
                ("capacity", [cmd, "k", v, "1", "0"]),
                ("rate", [cmd, "k", "10", v, "0"]),
                ("n", [cmd, "k", "1e6", "1", v]),
            ] {
                let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
                let reply = raw(&mut con, &bytes);
                assert!(
                    matches!(reply, Ok(redis::Value::Array(ref a)) if a.len() == 4),
                    "{cmd} {position} = {value:?} must be accepted, got {reply:?}"
                );
                let _: () = redis::cmd("DEL").arg("k").query(&mut con).unwrap();
            }
        }
    }
}

#[test]
fn arguments_are_checked_in_order_capacity_rate_n() {
    let server = Server::start();
    let mut con = server.conn();
    seed_bucket(&mut con, "b");
    for cmd in ["TB.TAKE", "TB.PEEK"] {
        let c = cmd.as_bytes();
        assert_rejected(
            &server,
            &mut con,
            b"b",
            &[c, b"b", b"0", b"0", b"-1"],
            CAPACITY_ERR,
            &format!("{cmd} all bad"),
        );
        assert_rejected(
            &server,
            &mut con,
            b"b",
            &[c, b"b", b"x", b"1", b"-1"],
            CAPACITY_ERR,
            &format!("{cmd} capacity and n bad"),
        );
        assert_rejected(
            &server,
            &mut con,
            b"b",
            &[c, b"b", b"1", b"inf", b"nan"],
            RATE_ERR,
            &format!("{cmd} rate and n bad"),
        );
    }
}

#[test]
fn bad_numbers_on_a_missing_key_create_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    for args in [
        ["TB.TAKE", "nokey", "0", "1", "1"],
        ["TB.TAKE", "nokey", "1", "0", "1"],
        ["TB.TAKE", "nokey", "1", "1", "-1"],
        ["TB.PEEK", "nokey", "1", "1", "nan"],
    ] {
        let bytes: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        expect_error(&mut con, &bytes);
        assert!(!exists(&mut con, "nokey"), "{args:?} created the key");
    }
}

#[test]
fn wrong_arity_uses_the_standard_message() {
    let server = Server::start();
    let mut con = server.conn();
    seed_bucket(&mut con, "b");
    let take_err = "ERR wrong number of arguments for 'tb.take' command";
    let peek_err = "ERR wrong number of arguments for 'tb.peek' command";
    // TB.TAKE takes options after n: a stray word there is one it does not know.
    let option_err = UNKNOWN_OPTION_ERROR;
    let cases: Vec<(Vec<&[u8]>, &str)> = vec![
        (vec![b"TB.TAKE"], take_err),
        (vec![b"TB.TAKE", b"b"], take_err),
        (vec![b"TB.TAKE", b"b", b"10"], take_err),
        (vec![b"TB.TAKE", b"b", b"10", b"1"], take_err),
        (vec![b"TB.TAKE", b"b", b"10", b"1", b"1", b"1"], option_err),
        (vec![b"tb.take", b"b", b"10", b"1"], take_err),
        (vec![b"TB.PEEK"], peek_err),
        (vec![b"TB.PEEK", b"b"], peek_err),
        (vec![b"TB.PEEK", b"b", b"10"], peek_err),
        (vec![b"TB.PEEK", b"b", b"10", b"1", b"1", b"1"], peek_err),
        (
            vec![b"TB.PEEK", b"b", b"10", b"1", b"1", b"1", b"1"],
            peek_err,
        ),
    ];
    for (args, expected) in cases {
        let case = show_args(&args);
        assert_rejected(&server, &mut con, b"b", &args, expected, &case);
    }
}

#[test]
fn non_hash_keys_are_wrongtype_and_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    let far = server_time_ms(&mut con) + 3_600_000;
    let setup: [(&str, &[&str]); 4] = [
        ("string", &["SET", "string", "hello"]),
        ("list", &["RPUSH", "list", "a", "b"]),
        ("set", &["SADD", "set", "a", "b"]),
        ("zset", &["ZADD", "zset", "1", "a", "2", "b"]),
    ];
    for (_, cmd) in setup {
        let bytes: Vec<&[u8]> = cmd.iter().map(|a| a.as_bytes()).collect();
        raw(&mut con, &bytes).unwrap();
    }
    // One of each with an expiry as well, to see the expiry untouched.
    let _: i64 = redis::cmd("PEXPIREAT")
        .arg("list")
        .arg(far)
        .query(&mut con)
        .unwrap();
    let _: i64 = redis::cmd("PEXPIREAT")
        .arg("string")
        .arg(far)
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("XADD")
        .arg("stream")
        .arg("*")
        .arg("f")
        .arg("v")
        .query(&mut con)
        .unwrap();
    for key in ["string", "list", "set", "zset", "stream"] {
        let k = key.as_bytes();
        for args in [
            vec![&b"TB.TAKE"[..], k, b"10", b"1", b"1"],
            vec![&b"TB.TAKE"[..], k, b"10", b"1", b"0"],
            vec![&b"TB.PEEK"[..], k, b"10", b"1"],
            vec![&b"TB.PEEK"[..], k, b"10", b"1", b"100"],
        ] {
            let case = format!("{} on a {key}", show_args(&args));
            assert_rejected(&server, &mut con, k, &args, WRONGTYPE, &case);
        }
    }
    let s: String = redis::cmd("GET").arg("string").query(&mut con).unwrap();
    assert_eq!(s, "hello");
}

fn corrupt_err(key_shown: &str) -> String {
    format!("ERR corrupt bucket '{key_shown}': tokens and last_refill must be finite numbers")
}

#[test]
fn corrupt_buckets_are_rejected_and_untouched() {
    let server = Server::start();
    let mut con = server.conn();
    let now = server_time_ms(&mut con).to_string();
    let far = server_time_ms(&mut con) + 3_600_000;
    let n = now.as_str();
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("tokens missing", vec![("last_refill", n)]),
        ("last_refill missing", vec![("tokens", "5")]),
        ("both missing", vec![("other", "x")]),
        (
            "tokens garbage",
            vec![("tokens", "abc"), ("last_refill", n)],
        ),
        (
            "last_refill garbage",
            vec![("tokens", "5"), ("last_refill", "xyz")],
        ),
        ("tokens empty", vec![("tokens", ""), ("last_refill", n)]),
        (
            "last_refill empty",
            vec![("tokens", "5"), ("last_refill", "")],
        ),
        ("tokens inf", vec![("tokens", "inf"), ("last_refill", n)]),
        ("tokens -inf", vec![("tokens", "-inf"), ("last_refill", n)]),
        ("tokens nan", vec![("tokens", "nan"), ("last_refill", n)]),
        (
            "tokens overflow",
            vec![("tokens", "1e400"), ("last_refill", n)],
        ),
        (
            "last_refill inf",
            vec![("tokens", "5"), ("last_refill", "inf")],
        ),
        (
            "last_refill nan",
            vec![("tokens", "5"), ("last_refill", "nan")],
        ),
        (
            "tokens trailing junk",
            vec![("tokens", "5x"), ("last_refill", n)],
        ),
        ("tokens hex", vec![("tokens", "0x10"), ("last_refill", n)]),
    ];
    for (why, fields) in cases {
        let _: () = redis::cmd("DEL").arg("c").query(&mut con).unwrap();
        hset(&mut con, "c", &fields);
        let _: i64 = redis::cmd("PEXPIREAT")
            .arg("c")
            .arg(far)
            .query(&mut con)
            .unwrap();
        for args in [
            vec![&b"TB.TAKE"[..], b"c", b"10", b"1", b"1"],
            vec![&b"TB.TAKE"[..], b"c", b"10", b"1", b"0"],
            vec![&b"TB.PEEK"[..], b"c", b"10", b"1"],
        ] {
            let case = format!("{why}: {}", show_args(&args));
            assert_rejected(&server, &mut con, b"c", &args, &corrupt_err("c"), &case);
        }
    }
}

#[test]
fn corrupt_bucket_error_escapes_non_printable_key_bytes() {
    let server = Server::start();
    let mut con = server.conn();
    let key: &[u8] = b"bad\x01key\xff\n";
    let _: i64 = redis::cmd("HSET")
        .arg(key)
        .arg("tokens")
        .arg("x")
        .query(&mut con)
        .unwrap();
    assert_rejected(
        &server,
        &mut con,
        key,
        &[b"TB.TAKE", key, b"10", b"1", b"1"],
        &corrupt_err("bad\\x01key\\xff\\x0a"),
        "binary key",
    );
}

#[test]
fn corrupt_bucket_error_cuts_long_keys_at_64_bytes() {
    let server = Server::start();
    let mut con = server.conn();
    let key = "k".repeat(100);
    hset(&mut con, &key, &[("tokens", "5")]);
    let shown = format!("{}...", "k".repeat(64));
    assert_rejected(
        &server,
        &mut con,
        key.as_bytes(),
        &[b"TB.TAKE", key.as_bytes(), b"10", b"1", b"1"],
        &corrupt_err(&shown),
        "100-byte key",
    );
    // Exactly 64 bytes: shown whole, no ellipsis.
    let key64 = "j".repeat(64);
    hset(&mut con, &key64, &[("tokens", "5")]);
    assert_rejected(
        &server,
        &mut con,
        key64.as_bytes(),
        &[b"TB.PEEK", key64.as_bytes(), b"10", b"1"],
        &corrupt_err(&key64),
        "64-byte key",
    );
}

#[test]
fn errors_inside_multi_exec_do_not_abort_the_rest() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = redis::cmd("MULTI").query(&mut con).unwrap();
    for args in [["b", "0", "1", "1"], ["b", "10", "1", "1"]] {
        let queued: String = redis::cmd("TB.TAKE").arg(&args).query(&mut con).unwrap();
        assert_eq!(queued, "QUEUED");
    }
    let replies = match reply_value(&mut con, &redis::cmd("EXEC")) {
        redis::Value::Array(replies) => replies,
        other => panic!("EXEC replied {other:?}"),
    };
    assert_eq!(replies.len(), 2, "{replies:?}");
    match &replies[0] {
        redis::Value::ServerError(e) => assert_eq!(
            format!("{} {}", e.code(), e.details().unwrap_or_default()),
            CAPACITY_ERR
        ),
        other => panic!("expected the capacity error, got {other:?}"),
    }
    assert!(
        matches!(&replies[1], redis::Value::Array(a) if a.len() == 4),
        "{replies:?}"
    );
}
