//! A seeded randomized end-to-end test: thousands of random (mostly invalid) argument vectors
//! sent to a real server.
//!
//! Every call is one of TB.TAKE, TB.PEEK, TB.REFUND, TB.TAKEALL with 0 to 8 arguments. The
//! arguments are random byte strings biased toward what a parser finds hard: number-like text
//! with signs, dots and exponents, nan/inf spellings, values that overflow or underflow, the
//! 64-byte length limit, empty strings, spaces and binary bytes. Key slots get a fresh key
//! (most calls), a shared bucket (plain or hand-edited with a negative count or a far-future
//! `last_refill`), a corrupt bucket, a string key, or random bytes.
//!
//! For each call:
//! - the reply is either an array of integers of the command's length (4, or 5 for
//!   TB.TAKEALL) inside the documented ranges, or an error starting with `ERR` or `WRONGTYPE`
//!   (never the internal-error reply of a caught panic); a wrong argument count gets the
//!   server's exact arity message;
//! - after an error, and after any TB.PEEK or denied take, every key named is exactly as it
//!   was (type, serialized value, absolute expiry): no key appears for a rejected call;
//! - the server answers PING.
//!
//! At the end the server log must hold no `tb: bug` line (a caught panic).
//!
//! `TB_FUZZ_SEED` (decimal or 0x-hex) and `TB_FUZZ_CALLS` override the seed and the count; a
//! failure message names the seed and the call, which is enough to replay it.

use std::collections::BTreeMap;
use std::time::Instant;

use crate::harness::*;

const DEFAULT_SEED: u64 = 0x7b5e_ed00_2026_0005;
const DEFAULT_CALLS: usize = 20_000;

/// Spellings that sit on some edge of the number grammar or of f64.
const SPECIALS: &[&str] = &[
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "+inf",
    "Infinity",
    "infinity",
    "1e400",
    "1e-400",
    "1e308",
    "1.7976931348623157e308",
    "1.7976931348623159e308",
    "4.9e-324",
    "5e-324",
    "2.2250738585072014e-308",
    "2.2250738585072011e-308",
    "9007199254740993",
    "9223372036854775807",
    "18446744073709551616",
    "0",
    "0.0",
    ".0",
    "0.",
    "-0",
    "+0",
    "0e0",
    "00000",
    "1",
    "1.",
    ".5",
    "5.",
    "1E3",
    "1e+3",
    "1e-3",
    "0x10",
    "0b1",
    "1_000",
    "1,5",
    " 5",
    "5 ",
    "5\t",
    "5\n",
    "\r\n",
    "",
    ".",
    "-",
    "+",
    "e",
    "e5",
    "1e",
    "1e+",
    "1.2.3",
    "--1",
    "1e1e1",
    "١",
    "５",
];

/// One random argument, biased toward number-like text.
fn random_arg(rng: &mut Rng) -> Vec<u8> {
    match rng.below(100) {
        // A small valid decimal, most likely to pass and reach the arithmetic.
        0..=24 => (1 + rng.below(20)).to_string().into_bytes(),
        25..=54 => number_like(rng),
        55..=74 => rng.pick(SPECIALS).as_bytes().to_vec(),
        75..=84 => {
            let len = rng.below(17);
            (0..len).map(|_| rng.next() as u8).collect()
        }
        85..=89 => {
            // Around the 64-byte limit: "1." followed by zeros, 60 to 70 bytes in all.
            let len = 60 + rng.below(11);
            let mut text = b"1.".to_vec();
            text.resize(len, b'0');
            text
        }
        90..=94 => {
            let len = 65 + rng.below(4_000);
            rng.digits(len)
        }
        _ => Vec::new(),
    }
}

/// A number the grammar accepts: digits, maybe a fraction, maybe an exponent from -330 to
/// 330 (so some overflow to infinity or round to 0, which capacity and rate refuse).
fn valid_number(rng: &mut Rng) -> Vec<u8> {
    let int_len = 1 + rng.below(6);
    let mut text = rng.digits(int_len);
    if rng.chance(40) {
        text.push(b'.');
        let frac_len = rng.below(8);
        text.extend(rng.digits(frac_len));
    }
    if rng.chance(30) {
        let exponent = rng.below(661) as i64 - 330;
        text.extend(format!("e{exponent}").into_bytes());
    }
    text
}

/// `[sign] digits [. digits] [e [sign] digits]`, each part random, often malformed.
fn number_like(rng: &mut Rng) -> Vec<u8> {
    let mut text = Vec::new();
    if rng.chance(15) {
        text.push(*rng.pick(b"-+"));
    }
    let int_len = rng.below(25);
    text.extend(rng.digits(int_len));
    if rng.chance(40) {
        text.push(b'.');
        let frac_len = rng.below(25);
        text.extend(rng.digits(frac_len));
    }
    if rng.chance(30) {
        text.push(*rng.pick(b"eE"));
        if rng.chance(50) {
            text.push(*rng.pick(b"-+"));
        }
        let exp_len = rng.below(5);
        text.extend(rng.digits(exp_len));
    }
    if rng.chance(5) {
        // A stray byte somewhere.
        let at = rng.below(text.len() + 1);
        text.insert(at, *rng.pick(&[b' ', b'_', b',', b'x', 0u8, 0xff]));
    }
    text
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Command {
    Take,
    Peek,
    Refund,
    TakeAll,
}

impl Command {
    fn name(self) -> &'static str {
        match self {
            Command::Take => "TB.TAKE",
            Command::Peek => "TB.PEEK",
            Command::Refund => "TB.REFUND",
            Command::TakeAll => "TB.TAKEALL",
        }
    }

    fn arity_ok(self, args: usize) -> bool {
        match self {
            // TB.TAKE's options may follow n: a longer call is judged by them.
            Command::Take => args >= 4,
            Command::Refund => args == 4,
            Command::Peek => args == 3 || args == 4,
            Command::TakeAll => args > 0 && args.is_multiple_of(4),
        }
    }

    /// Argument positions that name keys.
    fn key_slots(self, args: usize) -> Vec<usize> {
        match self {
            Command::TakeAll => (0..args).step_by(4).collect(),
            _ => (0..args.min(1)).collect(),
        }
    }

    fn reply_len(self) -> usize {
        if self == Command::TakeAll {
            5
        } else {
            4
        }
    }
}

/// The seeded bucket whose `last_refill` lies in the future until a write repairs it.
const FUTURE_KEY: &str = "pool:future";

/// Keys seeded before the run: valid buckets (one of them hand-edited), a corrupt one, and a
/// non-hash.
fn seed_pool(con: &mut redis::Connection) {
    take(con, "pool:bucket", "1000000", "0.001", "1");
    // Hand-edited but readable: the recovery rules apply (see tests/it/commands/hostile.rs).
    hset(
        con,
        FUTURE_KEY,
        &[("tokens", "5"), ("last_refill", "1e300")],
    );
    hset(
        con,
        "pool:negative",
        &[("tokens", "-1e300"), ("last_refill", "-1e300")],
    );
    hset(
        con,
        "pool:corrupt",
        &[("tokens", "nan"), ("last_refill", "1")],
    );
    let _: () = redis::cmd("SET")
        .arg("pool:string")
        .arg("not a bucket")
        .query(con)
        .expect("SET");
}

fn random_key(rng: &mut Rng, call: usize, slot: usize) -> Vec<u8> {
    match rng.below(100) {
        0..=69 => format!("r:{call}:{slot}").into_bytes(),
        70..=75 => b"pool:bucket".to_vec(),
        76..=77 => b"pool:future".to_vec(),
        78..=79 => b"pool:negative".to_vec(),
        80..=84 => b"pool:corrupt".to_vec(),
        85..=89 => b"pool:string".to_vec(),
        _ => random_arg(rng),
    }
}

/// A random call: command and arguments (without the command name).
fn random_call(rng: &mut Rng, call: usize) -> (Command, Vec<Vec<u8>>) {
    let command = *rng.pick(&[
        Command::Take,
        Command::Peek,
        Command::Refund,
        Command::TakeAll,
    ]);
    // Half the calls get a count the command accepts, so most reach argument parsing.
    let arity = if rng.chance(50) {
        match command {
            Command::Take | Command::Refund => 4,
            Command::Peek => 3 + rng.below(2),
            Command::TakeAll => 4 * (1 + rng.below(2)),
        }
    } else {
        rng.below(9)
    };
    let plausible = command.arity_ok(arity) && rng.chance(60);
    let mut args: Vec<Vec<u8>> = (0..arity)
        .map(|_| {
            if plausible && rng.chance(75) {
                valid_number(rng)
            } else {
                random_arg(rng)
            }
        })
        .collect();
    for slot in command.key_slots(arity) {
        args[slot] = random_key(rng, call, slot);
    }
    // Sometimes the same key twice in TB.TAKEALL.
    if command == Command::TakeAll && arity >= 8 && rng.chance(10) {
        args[4] = args[0].clone();
    }
    (command, args)
}

/// Type, value and expiry of each key, in one round trip. In a transaction, so a key cannot
/// expire halfway through (the server holds its clock still during EXEC).
fn snapshots(con: &mut redis::Connection, keys: &[&[u8]]) -> Vec<KeySnapshot> {
    if keys.is_empty() {
        return Vec::new();
    }
    let mut pipe = redis::pipe();
    pipe.atomic();
    for key in keys {
        pipe.cmd("TYPE").arg(*key);
        pipe.cmd("DUMP").arg(*key);
        pipe.cmd("PEXPIRETIME").arg(*key);
    }
    let raw: Vec<redis::Value> = pipe.query(con).expect("snapshot pipeline");
    raw.chunks(3)
        .map(|chunk| KeySnapshot {
            key_type: redis::from_redis_value(&chunk[0]).expect("TYPE"),
            dump: redis::from_redis_value(&chunk[1]).expect("DUMP"),
            expire_at_ms: redis::from_redis_value(&chunk[2]).expect("PEXPIRETIME"),
        })
        .collect()
}

/// True when the key is as it was, or was due to expire by `now_ms` and is gone (random
/// buckets can have TTLs of a few ms, which may run out between two snapshots).
fn unchanged_or_expired(was: &KeySnapshot, is: &KeySnapshot, now_ms: i64) -> bool {
    was == is || (is.key_type == "none" && was.expire_at_ms >= 0 && was.expire_at_ms <= now_ms)
}

fn int(value: &redis::Value) -> Option<i64> {
    match value {
        redis::Value::Int(i) => Some(*i),
        _ => None,
    }
}

/// What one reply was, for the summary.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Allowed,
    Denied,
    Error(String),
}

/// Checks one reply; returns its kind or why it is wrong.
fn judge(command: Command, args: &[Vec<u8>], reply: &redis::Value) -> Result<Kind, String> {
    match reply {
        redis::Value::ServerError(error) => {
            let text = match error.details() {
                Some(detail) => format!("{} {detail}", error.code()),
                None => error.code().to_string(),
            };
            if error.code() != "ERR" && error.code() != "WRONGTYPE" {
                return Err(format!("error code is neither ERR nor WRONGTYPE: {text}"));
            }
            if text.contains("internal error") {
                return Err(format!("a panic was caught: {text}"));
            }
            let arity_error = format!(
                "ERR wrong number of arguments for '{}' command",
                command.name().to_ascii_lowercase()
            );
            if command.arity_ok(args.len()) == (text == arity_error) {
                return Err(format!("arity {} answered {text}", args.len()));
            }
            // Summaries group by message, with the key-specific part cut off.
            let group = text.split(" '").next().unwrap_or(&text).to_string();
            Ok(Kind::Error(group))
        }
        redis::Value::Array(items) => {
            if !command.arity_ok(args.len()) {
                return Err(format!("arity {} was accepted", args.len()));
            }
            let values: Vec<i64> = items.iter().filter_map(int).collect();
            if values.len() != items.len() || values.len() != command.reply_len() {
                return Err(format!("not {} integers", command.reply_len()));
            }
            let (allowed, remaining, retry, reset) = (values[0], values[1], values[2], values[3]);
            let ok = (allowed == 0 || allowed == 1)
                && remaining >= 0
                && (-1..=MAX_WAIT_MS).contains(&retry)
                && (0..=MAX_WAIT_MS).contains(&reset)
                && (allowed == 0 || retry == 0)
                && (command != Command::Refund || allowed == 1)
                && (command != Command::TakeAll
                    || (0..(args.len() / 4) as i64).contains(&values[4]));
            if !ok {
                return Err("integers outside their documented ranges".into());
            }
            Ok(if allowed == 1 {
                Kind::Allowed
            } else {
                Kind::Denied
            })
        }
        other => Err(format!("neither an integer array nor an error: {other:?}")),
    }
}

#[test]
fn random_argument_vectors_get_a_valid_reply_and_never_leave_a_key_behind() {
    let seed = std::env::var("TB_FUZZ_SEED")
        .ok()
        .map(|s| match s.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).expect("TB_FUZZ_SEED hex"),
            None => s.parse().expect("TB_FUZZ_SEED"),
        })
        .unwrap_or(DEFAULT_SEED);
    let calls: usize = std::env::var("TB_FUZZ_CALLS")
        .ok()
        .map(|s| s.parse().expect("TB_FUZZ_CALLS"))
        .unwrap_or(DEFAULT_CALLS);
    println!("seed {seed:#x}, {calls} calls");

    let server = Server::start();
    let mut con = server.conn();
    seed_pool(&mut con);
    let mut rng = Rng(seed);
    let mut kinds: BTreeMap<(&'static str, Kind), usize> = BTreeMap::new();
    let started = Instant::now();

    for call in 0..calls {
        let (command, args) = random_call(&mut rng, call);
        let keys: Vec<&[u8]> = command
            .key_slots(args.len())
            .into_iter()
            .map(|slot| args[slot].as_slice())
            .collect();
        let before = snapshots(&mut con, &keys);
        let mut cmd = redis::cmd(command.name());
        for arg in &args {
            cmd.arg(arg.as_slice());
        }
        let reply = reply_value(&mut con, &cmd);
        let argv: Vec<&[u8]> = std::iter::once(command.name().as_bytes())
            .chain(args.iter().map(|a| a.as_slice()))
            .collect();
        let context = || {
            format!(
                "seed {seed:#x}, call {call}: {}\nreply: {reply:?}",
                show_args(&argv)
            )
        };
        let kind =
            judge(command, &args, &reply).unwrap_or_else(|why| panic!("{why}\n{}", context()));
        // Errors, denials (only TB.TAKE and TB.TAKEALL deny) and TB.PEEK write nothing, bar
        // a denial's repair of the one bucket whose last_refill lies in the future.
        let must_be_untouched =
            matches!(kind, Kind::Error(_) | Kind::Denied) || command == Command::Peek;
        if must_be_untouched {
            let after = snapshots(&mut con, &keys);
            let now_ms = server_time_ms(&mut con);
            for ((key, was), is) in keys.iter().zip(&before).zip(&after) {
                if kind == Kind::Denied && command != Command::Peek && *key == FUTURE_KEY.as_bytes()
                {
                    // Gone (expired since) or repaired to the server's now.
                    let repaired: Option<f64> = redis::cmd("HGET")
                        .arg(FUTURE_KEY)
                        .arg("last_refill")
                        .query(&mut con)
                        .expect("HGET");
                    assert!(
                        repaired.is_none_or(|ms| ms <= now_ms as f64),
                        "repaired to {repaired:?}\n{}",
                        context()
                    );
                    continue;
                }
                assert!(
                    unchanged_or_expired(was, is, now_ms),
                    "key {} changed: {was:?} -> {is:?}\n{}",
                    show_args(&[key]),
                    context()
                );
            }
        }
        assert!(ping(&mut con), "server down\n{}", context());
        *kinds.entry((command.name(), kind)).or_default() += 1;
    }

    let elapsed = started.elapsed();
    println!("{calls} calls in {elapsed:.1?}:");
    for ((command, kind), count) in &kinds {
        println!("  {count:>5}  {command} {kind:?}");
    }
    assert!(server.is_alive());
    assert!(
        !server.log().contains("tb: bug"),
        "a panic was logged:\n{}",
        server.log()
    );
    // The mix must reach the arithmetic, not only the parser.
    let allowed: usize = kinds
        .iter()
        .filter(|((_, kind), _)| *kind == Kind::Allowed)
        .map(|(_, count)| count)
        .sum();
    assert!(
        allowed * 20 > calls,
        "only {allowed} of {calls} calls were allowed"
    );
}
