//! The core's argument vectors (clients/conformance/vectors/args.json, written by the core's
//! own parsers) through this library's calls on a server with the module: what the core
//! refuses, the limiter refuses before sending ([`Error::InvalidArgument`], naming the same
//! argument, and 2^53 when the value is above it); what the core accepts, the limiter sends
//! and the server accepts.
//!
//! A caller passes `f64` (capacity, rate, n, max_debt) and `u64` (the ms, limit, lease_ms,
//! timeout_ms), so the vectors whose text no such value can say are not this library's to
//! replay: a sign on zero, a plus sign, hex, padding, 65 bytes, a fraction or a sign where a
//! `u64` goes, a whole number spelt `1.0` or `1e3`, a text above 2^53 whose double is 2^53,
//! an option keyword unknown, repeated or without its value, and TB.THROTTLE (no call sends it).

use crate::api::GENEROUS;
use crate::common::*;
use redis_tb_client::{Error, Limit, ManagedConnection, RateLimiter, TakeOptions};
use serde_json::Value;

/// The vector says something only its text can (see the module docs).
struct TextOnly;

type Parsed<T> = Result<T, TextOnly>;

fn is_decimal(text: &str) -> bool {
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        Some(at) => (&text[..at], Some(&text[at + 1..])),
        None => (text, None),
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mantissa_ok =
        (digits(int) && (frac.is_empty() || digits(frac))) || (int.is_empty() && digits(frac));
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)));
    mantissa_ok && exponent_ok
}

/// The `f64` a caller passes for `text`.
fn double(text: &str) -> Parsed<f64> {
    match text {
        "nan" | "NaN" => return Ok(f64::NAN),
        "inf" | "infinity" => return Ok(f64::INFINITY),
        "-inf" => return Ok(f64::NEG_INFINITY),
        _ => {}
    }
    let (negative, body) = match text.strip_prefix('-') {
        Some(body) => (true, body),
        None => (false, text),
    };
    if text.len() > 64 || !is_decimal(body) {
        return Err(TextOnly);
    }
    let value: f64 = body.parse().map_err(|_| TextOnly)?;
    match (negative, value == 0.0) {
        (true, true) => Err(TextOnly),
        (true, false) => Ok(-value),
        (false, _) => Ok(value),
    }
}

/// The `u64` a caller passes for `text`: plain digits only.
fn whole(text: &str) -> Parsed<u64> {
    if text.len() > 64 || text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TextOnly);
    }
    text.parse().map_err(|_| TextOnly)
}

fn take_options(words: &[String]) -> Parsed<TakeOptions> {
    let mut options = TakeOptions::new();
    let mut seen = Vec::new();
    for pair in words.chunks(2) {
        let [keyword, value] = pair else {
            return Err(TextOnly);
        };
        let keyword = keyword.to_uppercase();
        if seen.contains(&keyword) {
            return Err(TextOnly);
        }
        let ms = whole(value)?;
        options = match keyword.as_str() {
            "MAXWAIT" => options.max_wait_ms(ms),
            "BLOCK" => options.block(ms),
            "MAXBLOCK" => options.max_block(ms),
            _ => return Err(TextOnly),
        };
        seen.push(keyword);
    }
    Ok(options)
}

type Limiter = RateLimiter<ManagedConnection>;

/// What the call answered: nothing of it but whether it refused.
type Outcome = redis_tb_client::Result<()>;

/// A limiter call, ready to run.
type LimiterCall = Box<dyn Fn(&mut Limiter) -> Outcome>;

/// The limiter call that sends the vector's command with its arguments, on the key `k`.
fn limiter_call(vector: &Value) -> Parsed<LimiterCall> {
    let command = vector["command"].as_str().unwrap();
    let args: Vec<String> = vector["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let numbers = || -> Parsed<(f64, f64, f64)> {
        let n = args.get(2).map_or(Ok(1.0), |n| double(n))?;
        Ok((double(&args[0])?, double(&args[1])?, n))
    };
    Ok(match command {
        "TB.TAKE" => {
            let (c, r, n) = numbers()?;
            let options = take_options(&args[3..])?;
            Box::new(move |l| l.take_with("k", c, r, n, options).map(drop))
        }
        "TB.PEEK" => {
            let (c, r, n) = numbers()?;
            Box::new(move |l| l.peek("k", c, r, n).map(drop))
        }
        "TB.REFUND" => {
            let (c, r, n) = numbers()?;
            Box::new(move |l| l.refund("k", c, r, n).map(drop))
        }
        "TB.CHARGE" => {
            let (c, r, n) = numbers()?;
            let max_debt = match &args[3..] {
                [] => None,
                [keyword, debt] if keyword.eq_ignore_ascii_case("MAXDEBT") => Some(double(debt)?),
                _ => return Err(TextOnly),
            };
            Box::new(move |l| l.charge(&Limit::new("k", c, r), n, max_debt).map(drop))
        }
        "TB.BTAKE" => {
            let (c, r, n) = numbers()?;
            let timeout_ms = whole(&args[3])?;
            Box::new(move |l| l.wait_take("k", c, r, n, timeout_ms).map(drop))
        }
        "TB.TAKEALL" => {
            let groups = vector["groups"].as_u64().unwrap() as usize;
            let options = take_options(&args[4 * groups..])?;
            let mut limits = Vec::new();
            for group in args[..4 * groups].chunks(4) {
                let mut limit =
                    Limit::new(group[0].as_str(), double(&group[1])?, double(&group[2])?)
                        .cost(double(&group[3])?);
                limit.block_ms = options.block_ms;
                limit.max_block_ms = options.max_block_ms;
                limits.push(limit);
            }
            let max_wait_ms = options.max_wait_ms;
            Box::new(move |l| l.take_all_with(&limits, max_wait_ms).map(drop))
        }
        "TB.ACQUIRE" => {
            let (limit, lease_ms) = (whole(&args[0])?, whole(&args[1])?);
            match args.get(2) {
                Some(timeout) => {
                    let timeout_ms = whole(timeout)?;
                    Box::new(move |l| l.wait_acquire("k", limit, lease_ms, timeout_ms).map(drop))
                }
                None => Box::new(move |l| l.acquire("k", limit, lease_ms).map(drop)),
            }
        }
        "TB.RENEW" => {
            let (lease, lease_ms) = (args[0].clone(), whole(&args[1])?);
            Box::new(move |l| l.renew("k", lease.as_str(), lease_ms).map(drop))
        }
        _ => return Err(TextOnly), // TB.THROTTLE: no call of this library sends it
    })
}

/// This library's name for the argument the server's error names.
fn library_name(argument: &str) -> &str {
    match argument {
        "MAXWAIT" => "max_wait_ms",
        "BLOCK" => "block_ms",
        "MAXBLOCK" => "max_block_ms",
        "MAXDEBT" => "max_debt",
        other => other,
    }
}

/// `message` names `name` first: `name must ...` or `name needs ...`.
fn names(message: &str, name: &str) -> bool {
    let mut words = message.split(' ');
    words.next() == Some(name) && matches!(words.next(), Some("must" | "needs"))
}

/// What differs between the limiter's `outcome` and the core's verdict on `vector`, if anything.
fn differs(vector: &Value, outcome: Outcome) -> Option<String> {
    let expect = &vector["expect"];
    let Some(error) = expect["error"].as_str() else {
        return outcome
            .err()
            .map(|e| format!("the core accepts it; the limiter: {e}"));
    };
    let message = match outcome {
        Err(Error::InvalidArgument(message)) => message,
        other => {
            return Some(format!(
                "the core refuses it ({error}); the limiter: {other:?}"
            ))
        }
    };
    let name = library_name(expect["argument"].as_str().unwrap());
    if !names(&message, name) {
        return Some(format!("{message:?} does not name {name}"));
    }
    // Above the bound the server's error states: so must the limiter's.
    let above = vector["args"].as_array().unwrap().iter().any(|text| {
        double(text.as_str().unwrap()).is_ok_and(|x| x.is_finite() && x > 9007199254740992.0)
    });
    (above && error.contains("2^53") && !message.contains("2^53"))
        .then(|| format!("{message:?} does not say the bound, 2^53"))
}

#[test]
fn the_limiter_refuses_what_the_core_refuses_and_sends_what_it_accepts() {
    let path = repo_root().join("clients/conformance/vectors/args.json");
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let server = Server::with_module();
    let mut admin = server.conn();
    let mut limiter = RateLimiter::from_client(server.client(), GENEROUS);
    let (mut replayed, mut failures) = (0, Vec::new());
    for vector in file["vectors"].as_array().unwrap() {
        let refuses_no_argument =
            vector["expect"]["error"].is_string() && vector["expect"]["argument"].is_null();
        if !vector["doubles_suffice"].as_bool().unwrap() || refuses_no_argument {
            continue;
        }
        let Ok(call) = limiter_call(vector) else {
            continue;
        };
        let _: () = redis::cmd("FLUSHALL").query(&mut admin).unwrap();
        if let Some(what) = differs(vector, call(&mut limiter)) {
            failures.push(format!("{}: {what}", vector["name"]));
        }
        replayed += 1;
    }
    assert!(replayed > 0);
    assert!(
        failures.is_empty(),
        "the limiter differs from the core on {} of {replayed} argument vectors:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
    eprintln!("args.json: {replayed} vectors replayed by the Rust library");
}
