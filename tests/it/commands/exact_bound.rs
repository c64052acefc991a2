//! The one bound of every number argument, 2^53, judged on the exact decimal text: a text just
//! above it (`9007199254740993`, `9007199254740992.5`) rounds to the double 2^53, and used to
//! pass a check made after the conversion. The module and the Lua twin refuse it with the
//! argument's own error, and accept 2^53 however it is written.

use crate::harness::*;
use redis::Value;

const CAPACITY: &str = "ERR capacity must be at most 9007199254740992 (2^53)";
const N: &str = "ERR n must be at most 9007199254740992 (2^53)";
const MAXDEBT: &str =
    "ERR MAXDEBT must be a non-negative finite number, at most 9007199254740992 (2^53)";
const TIMEOUT: &str = "ERR timeout_ms must be a non-negative finite number of ms, at most 2^53";

/// Texts whose exact value is just above 2^53, though each converts to the double 2^53.
const JUST_ABOVE: [&str; 4] = [
    "9007199254740993",
    "9007199254740992.5",
    "9007199254740992.000000000000000001",
    "9.007199254740993e15",
];

/// 2^53 itself, written otherwise.
const AT_THE_BOUND: [&str; 3] = [
    "9007199254740992",
    "90071992547409920e-1",
    "9007199254740992.000",
];

/// TB.<COMMAND> key args: the calls of the module that take such a number, with the error the
/// one at the bound gives.
fn module_calls(above: &str) -> Vec<(&'static str, Vec<String>, &'static str)> {
    let words = |text: &str| -> Vec<String> { text.split(' ').map(str::to_owned).collect() };
    vec![
        ("take", words(&format!("{above} 1 1")), CAPACITY),
        ("take", words(&format!("10 1 {above}")), N),
        ("peek", words(&format!("{above} 1 1")), CAPACITY),
        ("peek", words(&format!("10 1 {above}")), N),
        ("refund", words(&format!("10 1 {above}")), N),
        ("charge", words(&format!("10 1 {above}")), N),
        ("charge", words(&format!("10 1 1 MAXDEBT {above}")), MAXDEBT),
        (
            "takeall",
            words(&format!("10 1 1 k2 {above} 1 1")),
            CAPACITY,
        ),
        ("btake", words(&format!("10 1 1 {above}")), TIMEOUT),
        ("acquire", words(&format!("1 1000 {above}")), TIMEOUT),
    ]
}

#[test]
fn the_module_refuses_every_number_just_above_2_pow_53_with_its_own_error() {
    let server = Server::start();
    let mut con = server.conn();
    for above in JUST_ABOVE {
        for (command, args, error) in module_calls(above) {
            let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
            let got = outcome(&mut con, &module_cmd(command, b"k", &args));
            assert_eq!(
                got,
                Err(error.to_owned()),
                "TB.{command} k {}",
                show_args(&args)
            );
        }
    }
    assert!(!exists(&mut con, "k"), "a refused call wrote the key");
}

#[test]
fn the_module_accepts_2_pow_53_however_it_is_written() {
    let server = Server::start();
    let mut con = server.conn();
    for (at, bound) in AT_THE_BOUND.iter().enumerate() {
        let key = format!("k{at}");
        let b = bound.as_bytes();
        let calls: [(&str, Vec<&[u8]>); 5] = [
            ("take", vec![b, b"1", b]),
            ("peek", vec![b, b"1", b]),
            ("charge", vec![b"10", b"1", b"1", b"MAXDEBT", b]),
            // Allowed at once (a full bucket), so the timeout is never waited for.
            ("btake", vec![b"10", b"1", b"1", b]),
            ("acquire", vec![b"1", b"1000", b]),
        ];
        for (command, args) in calls {
            let got = outcome(&mut con, &module_cmd(command, key.as_bytes(), &args));
            assert!(
                got.is_ok(),
                "TB.{command} {key} {}: {got:?}",
                show_args(&args)
            );
            let _: () = redis::cmd("DEL").arg(&key).query(&mut con).unwrap();
        }
    }
}

/// The twin has TB.TAKE, TB.PEEK, TB.REFUND, TB.CHARGE and TB.TAKEALL (no waiting commands):
/// the same refusals, in the module's words.
#[test]
fn the_twin_refuses_the_same_numbers_as_the_module() {
    let server = Server::start();
    let mut con = server.conn();
    let twins = [Fallback::script(&mut con), Fallback::function(&mut con)];
    for above in JUST_ABOVE {
        for (command, args, error) in module_calls(above) {
            if matches!(command, "btake" | "acquire") {
                continue;
            }
            let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
            for twin in &twins {
                let got = if command == "takeall" {
                    // The twin takes the keys as KEYS: `k capacity rate n k2 ...` loses its keys.
                    let numbers: Vec<&[u8]> = [&args[..3], &args[4..]].concat();
                    outcome(&mut con, &twin.cmd_for(command, &[b"k", b"k2"], &numbers))
                } else {
                    outcome(&mut con, &twin.cmd(command, b"k", &args))
                };
                assert_eq!(
                    got,
                    Err(error.to_owned()),
                    "{} {command} k {}",
                    twin.name(),
                    show_args(&args)
                );
            }
        }
    }
    for bound in AT_THE_BOUND {
        let b = bound.as_bytes();
        for twin in &twins {
            for (command, args) in [
                ("take", vec![b, &b"1"[..], b]),
                ("charge", vec![b"10", b"1", b"1", b"MAXDEBT", b]),
            ] {
                let got: Result<Value, String> = outcome(&mut con, &twin.cmd(command, b"t", &args));
                assert!(
                    got.is_ok(),
                    "{} {command} {}: {got:?}",
                    twin.name(),
                    show_args(&args)
                );
                let _: () = redis::cmd("DEL").arg("t").query(&mut con).unwrap();
            }
        }
    }
    assert!(!exists(&mut con, "k"), "a refused call wrote the key");
}
