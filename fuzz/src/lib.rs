//! Shared code of the fuzz targets: the core crate's modules they fuzz, the
//! reference grammar they are checked against, and a small reader that turns
//! fuzzer bytes into numbers (raw bit patterns as well as everyday values).

pub use redis_tb_core::{args, bucket, error, number};

use std::sync::OnceLock;

use regex::bytes::Regex;

/// The contract's number grammar (argument form: no sign).
pub const ARG_GRAMMAR: &str = r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$";
/// The stored-field form: the same with an optional leading sign.
pub const STORED_GRAMMAR: &str = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$";

/// The contract's "at most 64 bytes".
pub const MAX_TEXT_LEN: usize = 64;

fn arg_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(ARG_GRAMMAR).expect("valid grammar"))
}

fn stored_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(STORED_GRAMMAR).expect("valid grammar"))
}

/// What the contract says a number text means: `Some(value)` iff the text
/// is at most 64 bytes, matches the grammar and denotes a finite f64
/// (correctly rounded, as `str::parse` does); `None` otherwise.
pub fn reference_decimal(text: &[u8], signed: bool) -> Option<f64> {
    let re = if signed { stored_regex() } else { arg_regex() };
    if text.len() > MAX_TEXT_LEN || !re.is_match(text) {
        return None;
    }
    let text = std::str::from_utf8(text).expect("the grammar is ASCII");
    let value: f64 = text
        .parse()
        .unwrap_or_else(|e| panic!("grammar admits {text:?} but str::parse refuses it: {e}"));
    value.is_finite().then_some(value)
}

/// Whether a text of the argument grammar denotes a value above 2^53, by
/// exact arithmetic on its digits (the contract judges the bound on the
/// text, not on the double it rounds to): `digits x 10^exponent` against
/// 2^53, both written out as decimal integers of the same scale.
pub fn reference_above_2_pow_53(text: &[u8]) -> bool {
    let text = std::str::from_utf8(text).expect("the grammar is ASCII");
    let (mantissa, exponent) = match text.find(['e', 'E']) {
        // An exponent past i128 (up to 62 digits fit in 64 bytes) is huge
        // either way.
        Some(at) => (
            &text[..at],
            text[at + 1..].parse::<i128>().unwrap_or_else(|_| {
                if text[at + 1..].starts_with('-') {
                    -1000
                } else {
                    1000
                }
            }),
        ),
        None => (text, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int}{frac}");
    if digits.bytes().all(|d| d == b'0') {
        return false;
    }
    let scale = exponent - frac.len() as i128; // value = digits x 10^scale
    if scale > 100 {
        return true;
    }
    if scale < -100 {
        return false; // at most 64 digits over 10^100
    }
    let (value, bound) = if scale >= 0 {
        (
            format!("{digits}{}", "0".repeat(scale as usize)),
            "9007199254740992".to_owned(),
        )
    } else {
        (
            digits,
            format!("9007199254740992{}", "0".repeat((-scale) as usize)),
        )
    };
    let value = value.trim_start_matches('0');
    (value.len(), value) > (bound.len(), bound.as_str())
}

/// Same value, same bits (so 0.0 and -0.0 differ, NaN equals NaN).
pub fn same(a: Option<f64>, b: Option<f64>) -> bool {
    a.map(f64::to_bits) == b.map(f64::to_bits)
}

/// Reads fuzzer bytes front to back; past the end every read gives zeros,
/// so any input decodes to something.
pub struct Reader<'a> {
    data: &'a [u8],
}

/// Values a raw bit pattern almost never hits but the arithmetic must
/// survive: zeros, subnormals, the f64 range edges, the 2^53 boundary.
pub const SPECIAL_F64: [f64; 24] = [
    0.0,
    -0.0,
    5e-324,                     // smallest subnormal
    2.225_073_858_507_201e-308, // largest subnormal
    f64::MIN_POSITIVE,
    1e-300,
    1e-9,
    0.001,
    0.1,
    0.5,
    1.0,
    2.0,
    10.0,
    1000.0,
    86_400.0,
    9_007_199_254_740_992.0, // 2^53
    9_007_199_254_740_994.0, // 2^53 + 2
    1e15,
    1e20,
    1e300,
    f64::MAX,
    -1.0,
    -1e300,
    f64::MIN,
];

/// A current time of these days, in Unix ms.
pub const NOW_MS: i64 = 1_700_000_000_000;

pub const SPECIAL_I64: [i64; 12] = [
    0,
    1,
    -1,
    NOW_MS,
    1 << 53,
    (1 << 53) + 1,
    -(1 << 53),
    1 << 62,
    i64::MAX,
    i64::MAX - 1000,
    i64::MIN,
    i64::MIN + 1000,
];

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data }
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    pub fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let n = N.min(self.data.len());
        out[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        out
    }

    pub fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }

    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.bytes())
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }

    pub fn i32(&mut self) -> i32 {
        i32::from_le_bytes(self.bytes())
    }

    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }

    /// A tag byte, then: raw bits (any f64 at all, NaN and inf included), a
    /// small integer, a value with three decimals, an entry of
    /// `SPECIAL_F64`, or `mantissa * 10^exp` over the whole exponent range.
    pub fn f64(&mut self) -> f64 {
        match self.u8() % 5 {
            0 => f64::from_bits(self.u64()),
            1 => f64::from(self.u16()),
            2 => f64::from(self.u32()) / 1000.0,
            3 => SPECIAL_F64[usize::from(self.u8()) % SPECIAL_F64.len()],
            _ => {
                let mantissa = self.u32();
                let exp = i32::from(self.u8() as i8) * 3; // -384 ..= 381
                format!("{mantissa}e{exp}")
                    .parse()
                    .expect("valid float text")
            }
        }
    }

    /// A tag byte, then: raw bits, today +- 2^31 ms, an entry of
    /// `SPECIAL_I64`, or a small non-negative value.
    pub fn i64(&mut self) -> i64 {
        match self.u8() % 4 {
            0 => self.u64() as i64,
            1 => NOW_MS + i64::from(self.i32()),
            2 => SPECIAL_I64[usize::from(self.u8()) % SPECIAL_I64.len()],
            _ => i64::from(self.u32()),
        }
    }
}

// ---------------------------------------------------------------------------
// Invariants of the arithmetic, shared by the `arithmetic` and
// `decode_state` targets. Each `check_*` runs the function under test and
// panics (a fuzzer crash) naming the broken rule.
// ---------------------------------------------------------------------------

use bucket::{Limit, Outcome, State};
use number::MAX_EXACT_INTEGER;
use number::{format_tokens, parse_decimal, Sign};

/// Largest |ms| at which an i64 time converts to f64 exactly, so that
/// "the same call at now + w" means exactly what the arithmetic computed.
const EXACT_MS: u64 = 1 << 53;

/// `now_ms + offset` as the f64 a later call at that instant would use,
/// when both that time and `now_ms` are exactly representable.
fn exact_at(now_ms: i64, offset: i64) -> Option<f64> {
    let t = now_ms.checked_add(offset)?;
    (now_ms.unsigned_abs() <= EXACT_MS && t.unsigned_abs() <= EXACT_MS).then_some(t as f64)
}

fn floor_i64(value: f64) -> i64 {
    value.floor() as i64
}

/// A written state survives the trip through the hash exactly:
/// `tokens` as `format_tokens` text, `last_refill` as integer text.
pub fn check_storage_round_trip(written: &State, now_ms: i64) {
    let text = format_tokens(written.tokens);
    assert!(text.as_bytes().len() <= 24, "tokens text too long");
    let back = parse_decimal(text.as_bytes(), Sign::Allowed);
    assert!(
        same(back, Some(written.tokens)),
        "tokens {:?} stored as {:?} reads back as {back:?}",
        written.tokens,
        String::from_utf8_lossy(text.as_bytes())
    );
    let last = parse_decimal(now_ms.to_string().as_bytes(), Sign::Allowed);
    assert!(
        same(last, Some(written.last_refill_ms)),
        "last_refill {now_ms} reads back as {last:?}, not {:?}",
        written.last_refill_ms
    );
}

/// `reset` is the fewest whole ms until `state` is full (capped at 2^53).
fn check_reset(state: &State, limit: &Limit, now_ms: i64, reset: i64, what: &str) {
    assert!(
        (0..=MAX_EXACT_INTEGER).contains(&reset),
        "{what}: reset {reset} out of range"
    );
    let full_at = |t: f64| state.available_at(limit, t) >= limit.capacity;
    if reset == 0 {
        assert!(full_at(now_ms as f64), "{what}: reset 0 but not full");
        return;
    }
    assert!(
        !full_at(now_ms as f64),
        "{what}: reset {reset} but already full"
    );
    if reset < MAX_EXACT_INTEGER {
        if let Some(t) = exact_at(now_ms, reset) {
            assert!(full_at(t), "{what}: not full after reset {reset} ms");
        }
    }
    if let Some(t) = exact_at(now_ms, reset - 1) {
        assert!(
            !full_at(t),
            "{what}: already full at reset - 1 = {} ms",
            reset - 1
        );
    }
}

type Call = (&'static str, Option<State>, Limit, f64, i64);

thread_local! {
    /// The call being checked, printed if a check fails.
    static CURRENT: std::cell::Cell<Option<Call>> = const { std::cell::Cell::new(None) };
}

/// Records the call under check, so a failing check prints a ready-made
/// repro. libFuzzer's panic hook aborts without unwinding, so this wraps
/// that hook (installed once, after libFuzzer's own) instead of relying on
/// a Drop guard.
fn record(call: Call) {
    static HOOK: OnceLock<()> = OnceLock::new();
    HOOK.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if let Some((what, state, limit, n, now_ms)) = CURRENT.with(|c| c.get()) {
                eprintln!("repro: bucket::{what}({state:?}, &{limit:?}, {n:?}, {now_ms})");
            }
            previous(info);
        }));
    });
    CURRENT.with(|c| c.set(Some(call)));
}

/// The bucket as the contract says every command sees it at `now`: a
/// missing key is full, a `last_refill` later than now counts as now (and
/// must be repaired: the second value).
fn as_seen(state: Option<State>, limit: &Limit, now: f64) -> (State, bool) {
    match state {
        None => (
            State {
                tokens: limit.capacity,
                last_refill_ms: now,
            },
            false,
        ),
        Some(s) if s.last_refill_ms > now => (
            State {
                tokens: s.tokens,
                last_refill_ms: now,
            },
            true,
        ),
        Some(s) => (s, false),
    }
}

/// TB.TAKE (and TB.PEEK: same function) at `now_ms`, with every rule of
/// the contract checked. Returns the outcome.
pub fn check_take(state: Option<State>, limit: &Limit, n: f64, now_ms: i64) -> Outcome {
    record(("take", state, *limit, n, now_ms));
    let got = bucket::take(state, limit, n, now_ms);
    let now = now_ms as f64;
    let (current, future) = as_seen(state, limit, now);
    let available = current.available_at(limit, now);
    // Debt (stored tokens below zero) is only repaid by refill.
    let floor = current.tokens.min(0.0);
    assert!(
        available.is_finite() && available >= floor && available <= limit.capacity,
        "available {available:?} outside [min(0, tokens), capacity]"
    );

    assert_eq!(got.allowed, available >= n, "allowed iff available >= n");
    if got.allowed {
        assert!(n <= limit.capacity, "granted n > capacity");
    }
    assert_eq!(
        got.write.is_some(),
        (got.allowed && n > 0.0) || future,
        "writes iff allowed and n > 0, or to repair a future last_refill"
    );

    let left = if got.allowed {
        available - n
    } else {
        available
    };
    assert_eq!(
        got.remaining,
        floor_i64(left.max(0.0)),
        "remaining = floor(tokens left), 0 in debt"
    );
    assert!(got.remaining >= 0, "negative remaining");

    if let Some(written) = got.write {
        assert!(
            written.tokens.is_finite()
                && written.tokens >= floor
                && (written.tokens < 0.0 || written.tokens.is_sign_positive())
                && written.tokens <= limit.capacity,
            "written tokens {:?} outside [min(0, tokens), capacity]",
            written.tokens
        );
        assert!(
            same(Some(written.tokens), Some(left)),
            "written tokens != what is left"
        );
        assert!(
            same(Some(written.last_refill_ms), Some(now)),
            "last_refill != now"
        );
        check_storage_round_trip(&written, now_ms);
        // Read back at the same instant: exactly what was left, no more.
        assert!(
            same(Some(written.available_at(limit, now)), Some(written.tokens)),
            "a re-read at the same ms sees other tokens"
        );
        let again = bucket::take(Some(written), limit, 0.0, now_ms);
        assert_eq!(
            again.remaining, got.remaining,
            "a re-read at the same ms disagrees"
        );
    }

    // retry_after_ms
    if got.allowed {
        assert_eq!(got.retry_after_ms, 0, "allowed with a retry");
    } else if n > limit.capacity {
        assert_eq!(got.retry_after_ms, -1, "n > capacity must say never (-1)");
    } else {
        // The same call later sees what this one stored (a clock repair).
        let state = got.write.or(state);
        let retry = got.retry_after_ms;
        assert!(
            (1..=MAX_EXACT_INTEGER).contains(&retry),
            "retry {retry} out of range"
        );
        assert!(
            retry <= got.reset_after_ms,
            "retry {retry} > reset {}",
            got.reset_after_ms
        );
        let ready = |t: f64| current.available_at(limit, t) >= n;
        if retry < MAX_EXACT_INTEGER {
            if let Some(t) = exact_at(now_ms, retry) {
                assert!(ready(t), "still denied after retry {retry} ms");
                let same_call = bucket::take(state, limit, n, now_ms + retry);
                assert!(
                    same_call.allowed,
                    "the same call after retry {retry} ms is denied"
                );
            }
        }
        if let Some(t) = exact_at(now_ms, retry - 1) {
            assert!(!ready(t), "already allowed at retry - 1 = {} ms", retry - 1);
            let same_call = bucket::take(state, limit, n, now_ms + retry - 1);
            assert!(
                !same_call.allowed,
                "the same call at retry - 1 ms is allowed"
            );
        }
    }

    // reset_after_ms: time to full of the bucket as stored after this call:
    // the written state, or the bucket as it is when nothing is written
    // (a denial, n = 0).
    let stored = got.write.unwrap_or(current);
    check_reset(&stored, limit, now_ms, got.reset_after_ms, "take");
    CURRENT.with(|c| c.set(None));
    got
}

/// TB.REFUND at `now_ms`, every rule checked.
pub fn check_refund(state: Option<State>, limit: &Limit, n: f64, now_ms: i64) -> Outcome {
    record(("refund", state, *limit, n, now_ms));
    let refunded = bucket::refund(state, limit, n, now_ms);
    let got = refunded.outcome;
    assert!(got.allowed, "refund denied");
    assert_eq!(got.retry_after_ms, 0, "refund with a retry");
    if state.is_none() {
        assert_eq!(got.write, None, "refund into a missing bucket wrote");
        assert_eq!(refunded.added, 0.0, "refund into a missing bucket added");
        assert_eq!(got.remaining, floor_i64(limit.capacity));
        assert_eq!(got.reset_after_ms, 0);
        return got;
    }
    let now = now_ms as f64;
    let (current, future) = as_seen(state, limit, now);
    let available = current.available_at(limit, now);
    let tokens = (available + n).min(limit.capacity);
    assert!(
        tokens.is_finite() && tokens >= current.tokens.min(0.0) && tokens <= limit.capacity,
        "refunded tokens {tokens:?} outside [min(0, tokens), capacity]"
    );
    assert_eq!(
        got.write.is_some(),
        n > 0.0 || future,
        "refund writes iff n > 0, or to repair a future last_refill"
    );
    assert!(
        same(Some(refunded.added), Some((tokens - available).max(0.0))),
        "refund counted {:?} added",
        refunded.added
    );
    if let Some(written) = got.write {
        assert!(
            same(Some(written.tokens), Some(tokens)),
            "refund wrote {:?}",
            written.tokens
        );
        assert!(
            written.tokens < 0.0 || written.tokens.is_sign_positive(),
            "refund wrote -0"
        );
        assert!(same(Some(written.last_refill_ms), Some(now)));
        check_storage_round_trip(&written, now_ms);
    }
    assert_eq!(got.remaining, floor_i64(tokens.max(0.0)));
    // As for take: time to full of what is stored after the call.
    let stored = got.write.unwrap_or(current);
    check_reset(&stored, limit, now_ms, got.reset_after_ms, "refund");
    CURRENT.with(|c| c.set(None));
    got
}
