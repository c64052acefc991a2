//! The options after the numbers (`MAXWAIT`, `BLOCK`, `MAXBLOCK` on TB.TAKE and TB.TAKEALL,
//! `MAXDEBT` on TB.CHARGE): how they are spelled and every bad one's error, on the module
//! and on its Lua twin (one case, two tests: `<case>::on_module`, `<case>::on_twin`). What
//! they do is in locks.rs, reservations.rs and charge.rs.

use crate::harness::*;

/// Option words after TB.TAKE's numbers, and the error each gives.
const BAD_TAKE_OPTIONS: [(&str, &str); 32] = [
    ("FOO 1", UNKNOWN_OPTION_ERROR),
    ("WAIT 5", UNKNOWN_OPTION_ERROR),
    ("1", UNKNOWN_OPTION_ERROR),
    ("maxwait 1 NOPE", UNKNOWN_OPTION_ERROR),
    ("MAXDEBT 1", UNKNOWN_OPTION_ERROR),
    ("WAIT BLOCK 0", UNKNOWN_OPTION_ERROR),
    ("MAXWAIT 1 MAXWAIT 2", "ERR MAXWAIT is given twice"),
    ("BLOCK 1 block 2", "ERR BLOCK is given twice"),
    (
        "BLOCK 5 MAXBLOCK 9 maxblock 9",
        "ERR MAXBLOCK is given twice",
    ),
    ("MAXWAIT", "ERR MAXWAIT needs a value"),
    ("BLOCK", "ERR BLOCK needs a value"),
    ("BLOCK 10 MAXBLOCK", "ERR MAXBLOCK needs a value"),
    ("MAXWAIT 5 BLOCK", "ERR BLOCK needs a value"),
    ("BLOCK 100 maxblock", "ERR MAXBLOCK needs a value"),
    ("MAXWAIT -1", MAXWAIT_ERROR),
    ("MAXWAIT 1.5", MAXWAIT_ERROR),
    ("MAXWAIT 1e3", MAXWAIT_ERROR),
    ("MAXWAIT 9007199254740993", MAXWAIT_ERROR),
    ("MAXWAIT x BLOCK 0", MAXWAIT_ERROR),
    ("BLOCK 0", BLOCK_ERROR),
    ("BLOCK 000", BLOCK_ERROR),
    ("BLOCK -5", BLOCK_ERROR),
    ("BLOCK 2.5", BLOCK_ERROR),
    ("BLOCK 9007199254740993", BLOCK_ERROR),
    ("BLOCK 0 WAIT", BLOCK_ERROR),
    ("BLOCK 10 MAXBLOCK 9", MAXBLOCK_ERROR),
    ("BLOCK 10 MAXBLOCK 0", MAXBLOCK_ERROR),
    ("MAXBLOCK 9 BLOCK 10", MAXBLOCK_ERROR),
    ("BLOCK 10 MAXBLOCK 9007199254740993", MAXBLOCK_ERROR),
    ("MAXBLOCK 100", MAXBLOCK_WITHOUT_BLOCK_ERROR),
    ("MAXWAIT 5 MAXBLOCK 100", MAXBLOCK_WITHOUT_BLOCK_ERROR),
    ("MAXBLOCK 10 MAXWAIT 1", MAXBLOCK_WITHOUT_BLOCK_ERROR),
];

/// Option words after TB.CHARGE's numbers, and the error each gives.
const BAD_CHARGE_OPTIONS: [(&str, &str); 14] = [
    ("MAXWAIT 1", UNKNOWN_OPTION_ERROR),
    ("BLOCK 1", UNKNOWN_OPTION_ERROR),
    ("MAXDEBT 1 FOO", UNKNOWN_OPTION_ERROR),
    ("MAXDEBT 1 x", UNKNOWN_OPTION_ERROR),
    ("MAXDEBT -1 x", UNKNOWN_OPTION_ERROR),
    ("MAXDEBT 1 MAXDEBT 2", "ERR MAXDEBT is given twice"),
    ("maxdebt 1 MaxDebt 2", "ERR MAXDEBT is given twice"),
    ("maxdebt", "ERR MAXDEBT needs a value"),
    ("MAXDEBT -1", MAXDEBT_ERROR),
    ("MAXDEBT nan", MAXDEBT_ERROR),
    ("MAXDEBT inf", MAXDEBT_ERROR),
    ("MAXDEBT 1e400", MAXDEBT_ERROR),
    ("MAXDEBT 9007199254740994", MAXDEBT_ERROR),
    ("MAXDEBT 1e16", MAXDEBT_ERROR),
];

/// Whether TB.TAKEALL reads `words` after its last group as options: only when they start
/// with one of its keywords. Otherwise the module, which has no key count, reads them as
/// the start of another group.
fn starts_with_a_takeall_option(words: &str) -> bool {
    let first = words.split(' ').next().unwrap_or("");
    ["MAXWAIT", "BLOCK", "MAXBLOCK"]
        .iter()
        .any(|keyword| keyword.eq_ignore_ascii_case(first))
}

on_every_backend!(each_bad_option_is_refused_with_its_own_error_and_the_key_untouched);
fn each_bad_option_is_refused_with_its_own_error_and_the_key_untouched(backend: Backend) {
    let (_server, mut con) = backend.start();
    // A bucket in use (6 of 10 left, 1 per 1000 s), a missing key and a string: the options
    // come before the key is read.
    backend.ints(&mut con, "take", "tb:opt", "10 0.001 4");
    set_string(&mut con, "tb:string", "x");
    let before = snapshot(&mut con, b"tb:opt");
    for (words, want) in BAD_TAKE_OPTIONS {
        for key in ["tb:opt", "tb:missing", "tb:string"] {
            let take = backend.error(&mut con, "take", key, &format!("10 0.001 1 {words}"));
            assert_eq!(take, want, "take {key} {words}");
            // TB.TAKEALL's options follow its last group; a word that is none of its
            // keywords comes after a real option, where it is refused as unknown.
            let options = match starts_with_a_takeall_option(words) {
                true => words.to_string(),
                false => format!("MAXWAIT 1 {words}"),
            };
            let args = format!("10 0.001 1 1 1 1 {options}");
            let takeall = backend.error(&mut con, "takeall", &format!("{key} {{x}}:b"), &args);
            assert_eq!(takeall, want, "takeall {key} {options}");
        }
        // The numbers before them are named first.
        let args = format!("5 x 1 {words}");
        let rate = backend.error(&mut con, "take", "tb:opt", &args);
        assert_eq!(rate, RATE_ERROR, "{words}");
    }
    // An empty value, which has no word of its own.
    let empty = backend.cmd_for("take", &[b"tb:opt"], &[b"5", b"1", b"1", b"MAXWAIT", b""]);
    assert_eq!(outcome(&mut con, &empty), Err(MAXWAIT_ERROR.to_string()));
    assert_eq!(
        snapshot(&mut con, b"tb:opt"),
        before,
        "the bucket is untouched"
    );
    for key in ["tb:missing", "{x}:b"] {
        assert!(!exists(&mut con, key), "{key} was created");
    }
}

on_every_backend!(bad_charge_options_are_refused_in_argument_order);
fn bad_charge_options_are_refused_in_argument_order(backend: Backend) {
    let (_server, mut con) = backend.start();
    backend.ints(&mut con, "take", "tb:opt", "10 0.001 4");
    set_string(&mut con, "s", "x");
    let before = snapshot(&mut con, b"tb:opt");
    for (words, want) in BAD_CHARGE_OPTIONS {
        for key in ["tb:opt", "tb:missing", "s"] {
            let args = format!("5 1 1 {words}");
            let refused = backend.error(&mut con, "charge", key, &args);
            assert_eq!(refused, want, "{key} {words}");
        }
    }
    let empty = backend.cmd_for("charge", &[b"s"], &[b"5", b"1", b"1", b"MAXDEBT", b""]);
    assert_eq!(outcome(&mut con, &empty), Err(MAXDEBT_ERROR.to_string()));
    assert_eq!(
        snapshot(&mut con, b"tb:opt"),
        before,
        "the bucket is untouched"
    );
    assert!(!exists(&mut con, "tb:missing"), "tb:missing was created");
    let short = backend.error(&mut con, "charge", "s", "5 1");
    assert_eq!(short, arity_error("tb.charge"));
    let n = backend.error(&mut con, "charge", "s", "5 1 -1 MAXDEBT -1");
    assert_eq!(n, N_ERROR);
    // A valid MAXDEBT on a string key: the type comes after the arguments.
    let wrongtype = backend.error(&mut con, "charge", "s", "5 1 1 MAXDEBT 0");
    assert_eq!(wrongtype, WRONGTYPE_ERROR);
}

on_every_backend!(option_errors_come_after_the_errors_of_capacity_rate_and_n);
fn option_errors_come_after_the_errors_of_capacity_rate_and_n(backend: Backend) {
    let (_server, mut con) = backend.start();
    for command in ["take", "charge"] {
        for (numbers, want) in [
            ("0 1 1", CAPACITY_ERROR),
            ("1 x 1", RATE_ERROR),
            ("1 1 -1", N_ERROR),
            ("1 1 1", UNKNOWN_OPTION_ERROR),
        ] {
            let refused = backend.error(&mut con, command, "tb:k", &format!("{numbers} FOO 1"));
            assert_eq!(refused, want, "{command} {numbers} FOO 1");
        }
    }
    // Options are parsed before the key is read: a key of another type gets the option's
    // error; with good options, WRONGTYPE.
    set_string(&mut con, "tb:s", "x");
    for (command, args, want) in [
        ("take", "1 1 1 BLOCK 0", BLOCK_ERROR),
        ("take", "1 1 1 BLOCK 5", WRONGTYPE_ERROR),
        ("charge", "1 1 1", WRONGTYPE_ERROR),
    ] {
        let refused = backend.error(&mut con, command, "tb:s", args);
        assert_eq!(refused, want, "{command} {args}");
    }
}

on_every_backend!(take_options_take_any_case_and_order);
fn take_options_take_any_case_and_order(backend: Backend) {
    let (_server, mut con) = backend.start();
    let mut take = |args: &str| backend.ints(&mut con, "take", "k", args)[..3].to_vec();
    assert_eq!(take("5 1 1 block 100 MaxWait 0 MAXBLOCK 800"), [1, 4, 0]);
    // The largest of each.
    let largest = "MAXWAIT 9007199254740992 BLOCK 9007199254740992 MAXBLOCK 9007199254740992";
    assert_eq!(take(&format!("5 1 1 {largest}")), [1, 3, 0]);
    // Leading zeros; MAXWAIT 0 in any spelling of zero digits.
    assert_eq!(take("5 1 1 MAXWAIT 000 BLOCK 007"), [1, 2, 0]);
}

on_every_backend!(peek_and_refund_take_no_options);
fn peek_and_refund_take_no_options(backend: Backend) {
    let (_server, mut con) = backend.start();
    for command in ["peek", "refund"] {
        let refused = backend.error(&mut con, command, "k", "5 1 1 MAXWAIT 5");
        assert_eq!(refused, arity_error(&format!("tb.{command}")));
    }
}

on_every_backend!(takeall_needs_its_numbers_before_any_option);
fn takeall_needs_its_numbers_before_any_option(backend: Backend) {
    let (_server, mut con) = backend.start();
    let refused = backend.error(&mut con, "takeall", "a b", "5 1 1 5 1");
    assert_eq!(refused, arity_error("tb.takeall"));
}
