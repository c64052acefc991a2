//! One rule's vector file, and the JSON shapes the bucket rules share.
//!
//! A file is `{"about", "rule", "version", "vectors": [...]}` with one vector
//! per line, keys in the order written, so a change to a rule shows in a
//! diff as the lines of the vectors it changes. Doubles are written as
//! serde_json writes an f64 (the shortest text that reads back as the same
//! double, with a `.0` or an exponent), whole numbers (ms, counts) as
//! integers.

use redis_tb_core::bucket::{self, Limit, Outcome, State};
use redis_tb_core::lockout::Lock;
use redis_tb_core::number::format_tokens;
use serde_json::{json, Map, Value};

pub struct VectorFile {
    /// The rule's name, and the file's (`<rule>.json`).
    pub rule: &'static str,
    /// What a vector holds and how it is replayed.
    pub about: String,
    pub vectors: Vec<Value>,
}

impl VectorFile {
    pub fn render(&self) -> String {
        let mut out = String::from("{\n");
        let about = Value::from(self.about.as_str()).to_string();
        out.push_str(&format!("  \"about\": {about},\n"));
        out.push_str(&format!("  \"rule\": \"{}\",\n", self.rule));
        out.push_str("  \"version\": 1,\n  \"vectors\": [\n");
        let lines: Vec<String> = self
            .vectors
            .iter()
            .map(|vector| format!("    {vector}"))
            .collect();
        out.push_str(&lines.join(",\n"));
        out.push_str("\n  ]\n}\n");
        out
    }
}

/// An object with its keys in the order given.
pub fn object(pairs: Vec<(&str, Value)>) -> Value {
    let mut map = Map::new();
    for (key, value) in pairs {
        map.insert(key.to_string(), value);
    }
    Value::Object(map)
}

/// A bucket as stored: `null` for a missing key, else its tokens and
/// last_refill (doubles, as a hash may hold them) and, when it has one, its
/// lock.
pub fn state(state: Option<State>, lock: Option<Lock>) -> Value {
    let Some(state) = state else {
        return Value::Null;
    };
    let mut pairs = vec![
        ("tokens", json!(state.tokens)),
        ("last_refill_ms", json!(state.last_refill_ms)),
    ];
    if let Some(lock) = lock {
        pairs.push(("lock", lock_json(&lock)));
    }
    object(pairs)
}

pub fn lock_json(lock: &Lock) -> Value {
    object(vec![
        ("locked_until_ms", json!(lock.until_ms)),
        ("strikes", json!(lock.strikes)),
        ("probation_until_ms", json!(lock.probation_until_ms)),
    ])
}

pub fn config(limit: &Limit) -> Value {
    object(vec![
        ("capacity", json!(limit.capacity)),
        ("rate", json!(limit.refill_per_sec)),
    ])
}

/// The four figures every bucket command replies.
pub fn reply(outcome: &Outcome) -> Value {
    object(vec![
        ("allowed", json!(outcome.allowed)),
        ("remaining", json!(outcome.remaining)),
        ("retry_after_ms", json!(outcome.retry_after_ms)),
        ("reset_after_ms", json!(outcome.reset_after_ms)),
    ])
}

/// What the call stores, or `null` for "writes nothing": the tokens (and
/// their text in the hash, byte for byte), last_refill (the call's now),
/// the absolute expiry, and the lock it starts, if any (a stored lock is
/// left as it is).
pub fn write(outcome: &Outcome, stored_lock: Option<Lock>, now_ms: i64) -> Value {
    let Some(written) = outcome.write else {
        return Value::Null;
    };
    let text = format_tokens(written.tokens);
    let mut pairs = vec![
        ("tokens", json!(written.tokens)),
        (
            "tokens_text",
            json!(String::from_utf8_lossy(text.as_bytes())),
        ),
        ("last_refill_ms", json!(written.last_refill_ms)),
        (
            "expire_at_ms",
            json!(bucket::deadline_ms(now_ms, outcome, stored_lock)),
        ),
    ];
    if let Some(lock) = outcome.lock {
        pairs.push(("lock", lock_json(&lock)));
    }
    object(pairs)
}

/// A fixed pseudo-random sequence (an LCG), so the random vectors never
/// change unless a rule does.
pub struct Lcg(u64);

impl Lcg {
    pub fn new(seed: u64) -> Lcg {
        Lcg(seed)
    }

    /// A number in `[0, bound)`.
    pub fn below(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (self.0 >> 33) % bound
    }

    /// One of `choices`.
    pub fn pick<T: Copy>(&mut self, choices: &[T]) -> T {
        choices[self.below(choices.len() as u64) as usize]
    }

    /// A double in `[low, high)`.
    pub fn between(&mut self, low: f64, high: f64) -> f64 {
        low + (high - low) * (self.below(1 << 30) as f64 / (1u64 << 30) as f64)
    }
}
