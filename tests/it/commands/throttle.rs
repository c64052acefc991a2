//! TB.THROTTLE, redis-cell's CL.THROTTLE on a bucket, on the module and on its Lua twin (one
//! case, two tests: `<case>::on_module`, `<case>::on_twin`). The contract is in
//! docs/commands.md and docs/redis-cell.md; the conversion is core/src/throttle.rs. The
//! comparison with redis-cell itself is in compat/.

use crate::harness::*;

on_every_backend!(throttle_replies_as_redis_cell_does);
fn throttle_replies_as_redis_cell_does(backend: Backend) {
    let (_server, mut con) = backend.start();
    // max_burst 4, 1 per 2 s: 5 tokens; one taken, full again in 2 s, no retry.
    let reply = backend.ints(&mut con, "throttle", "k", "4 1 2");
    assert_eq!(reply, [0, 5, 4, -1, 2]);
    assert_eq!(field(&mut con, "k", "tokens").as_deref(), Some("4"));
}

on_every_backend!(a_throttle_denial_reports_whole_seconds);
fn a_throttle_denial_reports_whole_seconds(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "0");
    let reply = backend.ints(&mut con, "throttle", "k", "4 1 2");
    assert_eq!(reply, [1, 5, 0, 2, 10]);
}

on_every_backend!(throttle_seconds_are_truncated);
fn throttle_seconds_are_truncated(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "0.25");
    // 750 ms to the token, 4750 ms to full: 0 s and 4 s.
    let reply = backend.ints(&mut con, "throttle", "k", "4 1 1");
    assert_eq!(reply, [1, 5, 0, 0, 4]);
}

on_every_backend!(a_throttle_quantity_above_the_burst_never_fits);
fn a_throttle_quantity_above_the_burst_never_fits(backend: Backend) {
    let (_server, mut con) = backend.start();
    let reply = backend.ints(&mut con, "throttle", "k", "4 1 2 6");
    assert_eq!(reply, [1, 5, 5, -1, 0]);
    let reply = backend.ints(&mut con, "throttle", "k", "4 1 2 0");
    assert_eq!(reply, [0, 5, 5, -1, 0]);
    assert!(!exists(&mut con, "k"));
}

on_every_backend!(throttle_reads_a_cell_key_as_the_bucket_it_stands_for);
fn throttle_reads_a_cell_key_as_the_bucket_it_stands_for(backend: Backend) {
    let (_server, mut con) = backend.start();
    // redis-cell's TAT 3 s ahead: 3 of 10 tokens used.
    let tat_ns = (server_time_ms(&mut con) + 3000) * 1_000_000;
    set_string(&mut con, "k", tat_ns);
    let reply = backend.ints(&mut con, "throttle", "k", "9 1 1");
    assert_eq!(reply[..3], [0, 10, 6]);
    // Just under 4 tokens short of full (the clock moved since the SET): 3 whole seconds.
    assert_within("reset_after_s", reply[4], 3, 4);
    let kind: String = redis::cmd("TYPE").arg("k").query(&mut con).unwrap();
    assert_eq!(kind, "hash");
    let tokens: f64 = field(&mut con, "k", "tokens").unwrap().parse().unwrap();
    assert!((6.0..7.0).contains(&tokens), "tokens {tokens}");
}

on_every_backend!(the_first_write_of_a_cell_key_is_del_then_hset_then_pexpireat);
fn the_first_write_of_a_cell_key_is_del_then_hset_then_pexpireat(backend: Backend) {
    let (server, mut con) = backend.start_with(AOF_ARGS);
    set_string(&mut con, "k", "0");
    let reply = backend.ints(&mut con, "throttle", "k", "9 1 1");
    assert_eq!(reply[..3], [0, 10, 9]);
    let written = effects_on(&server, &mut con, "k");
    let [hset, pexpireat] = bucket_write(&mut con, "k");
    let set = argv(&["SET", "k", "0"]);
    assert_eq!(written, [set, argv(&["DEL", "k"]), hset, pexpireat]);
}

on_every_backend!(a_denied_throttle_leaves_the_cell_key_as_it_is);
fn a_denied_throttle_leaves_the_cell_key_as_it_is(backend: Backend) {
    let (_server, mut con) = backend.start();
    // 60 s ahead on a bucket of 10 at 1 per s: 50 tokens of debt.
    let tat_ns = (server_time_ms(&mut con) + 60_000) * 1_000_000;
    set_string(&mut con, "k", tat_ns);
    let before = snapshot(&mut con, b"k");
    let reply = backend.ints(&mut con, "throttle", "k", "9 1 1");
    assert_eq!(reply[..3], [1, 10, 0]);
    assert_within("retry_after_s", reply[3], 50, 51);
    assert_eq!(snapshot(&mut con, b"k"), before);
    // A quantity of 0 is allowed and writes nothing either.
    assert_eq!(backend.ints(&mut con, "throttle", "k", "9 1 1 0")[0], 1);
    assert_eq!(snapshot(&mut con, b"k"), before);
}

on_every_backend!(a_string_that_is_not_a_cell_value_is_wrongtype);
fn a_string_that_is_not_a_cell_value_is_wrongtype(backend: Backend) {
    let (_server, mut con) = backend.start();
    let not_a_tat = [
        "abc",
        "1.5",
        "1e9",
        "",
        " 1",
        "-",
        "9223372036854775808",
        "99999999999999999999",
    ];
    for value in not_a_tat {
        set_string(&mut con, "k", value);
        let before = snapshot(&mut con, b"k");
        let refused = backend.error(&mut con, "throttle", "k", "9 1 1");
        assert_eq!(refused, WRONGTYPE_ERROR, "{value:?}");
        assert_eq!(snapshot(&mut con, b"k"), before);
    }
    for value in ["-5", "9223372036854775807", "-9223372036854775807", "0001"] {
        set_string(&mut con, "k", value);
        let read = backend.call(&mut con, "throttle", "k", "9 1 1 0");
        assert!(read.is_ok(), "{value:?}: {read:?}");
    }
}

on_every_backend!(only_throttle_reads_a_cell_key);
fn only_throttle_reads_a_cell_key(backend: Backend) {
    let (_server, mut con) = backend.start();
    set_string(&mut con, "k", "0");
    for (command, args) in [
        ("take", "5 1 1"),
        ("peek", "5 1"),
        ("refund", "5 1 1"),
        ("charge", "5 1 1"),
        ("takeall", "5 1 1"),
    ] {
        let refused = backend.error(&mut con, command, "k", args);
        assert_eq!(refused, WRONGTYPE_ERROR, "{command}");
    }
}

on_every_backend!(throttle_on_another_type_is_wrongtype);
fn throttle_on_another_type_is_wrongtype(backend: Backend) {
    let (_server, mut con) = backend.start();
    for key in foreign_values(&mut con, "hash") {
        let key = std::str::from_utf8(key).unwrap();
        if key == "t:string" {
            continue; // "1", a TAT
        }
        let refused = backend.error(&mut con, "throttle", key, "9 1 1");
        assert_eq!(refused, WRONGTYPE_ERROR, "{key}");
    }
}

on_every_backend!(a_locked_key_throttles);
fn a_locked_key_throttles(backend: Backend) {
    let (_server, mut con) = backend.start();
    locked_for_an_hour(&mut con, "k", "10");
    let reply = backend.ints(&mut con, "throttle", "k", "9 1 1");
    assert_eq!(reply[..3], [1, 10, 10]);
    let hour_s = HOUR_MS / 1000;
    assert_within("retry_after_s", reply[3], hour_s - 5, hour_s);
}

on_every_backend!(throttle_arguments_are_checked_in_order);
fn throttle_arguments_are_checked_in_order(backend: Backend) {
    let (_server, mut con) = backend.start();
    set_string(&mut con, "s", "x");
    let burst = "ERR max_burst must be a whole number from 0 to 9007199254740991 (2^53 - 1)";
    let count = "ERR count must be a whole number from 1 to 9007199254740992 (2^53)";
    let period = "ERR period must be a whole number of seconds from 1 to 9007199254740992 (2^53)";
    let quantity = "ERR quantity must be a whole number from 0 to 9007199254740992 (2^53)";
    for (args, want) in [
        ("-1 x x x", burst),
        ("9007199254740992 1 1", burst),
        ("1.5 1 1", burst),
        ("1 0 x", count),
        ("1 9007199254740993 1", count),
        ("1 1 0", period),
        ("1 1 1e3", period),
        ("1 1 1 1.5", quantity),
        ("1 1 1 -1", quantity),
    ] {
        assert_eq!(
            backend.error(&mut con, "throttle", "s", args),
            want,
            "{args}"
        );
    }
    for args in ["1 1", "1 1 1 1 1"] {
        let refused = backend.error(&mut con, "throttle", "k", args);
        assert_eq!(refused, arity_error("tb.throttle"), "{args}");
    }
    // The largest of each is fine.
    let largest = "9007199254740991 9007199254740992 1 9007199254740992";
    let reply = backend.ints(&mut con, "throttle", "k", largest);
    assert_eq!(reply[..2], [0, 9_007_199_254_740_992]);
}
