//! The bucket's rules as vectors: take, peek, refund, charge (its debt
//! floor), reservation (`MAXWAIT`), lockout (`BLOCK`, escalation,
//! probation), TB.TAKEALL, `first_ms_when` and the denial cache's priming
//! window. Each vector is one call on one stored state at one instant.

use redis_tb_core::bucket::{self, Charge, Limit, Outcome, State, TakeOptions};
use redis_tb_core::denial_cache::primed_denial_ms;
use redis_tb_core::lockout::Lock;
use redis_tb_core::number::MAX_EXACT_INTEGER;
use serde_json::{json, Value};

use crate::file::{self, object, Lcg, VectorFile};

/// 2100-01-01T00:00:00Z: every instant of these files is after it, so a real
/// server's expiries (PEXPIREAT at these instants) are in its future.
pub const T0: i64 = 4_102_444_800_000;
/// 2^53, the bound of every number.
const MAX: f64 = MAX_EXACT_INTEGER as f64;

/// The double just below `x` (positive, normal).
fn below(x: f64) -> f64 {
    f64::from_bits(x.to_bits() - 1)
}

fn limit(capacity: f64, rate: f64) -> Limit {
    Limit {
        capacity,
        refill_per_sec: rate,
    }
}

fn stored(tokens: f64, last_refill_ms: f64) -> Option<State> {
    Some(State {
        tokens,
        last_refill_ms,
    })
}

/// `stored(tokens, T0 + after_ms)`.
fn at(tokens: f64, after_ms: f64) -> Option<State> {
    stored(tokens, T0 as f64 + after_ms)
}

/// One call on one bucket.
#[derive(Clone)]
struct Call {
    name: String,
    state: Option<State>,
    lock: Option<Lock>,
    limit: Limit,
    n: f64,
    now_ms: i64,
}

fn call(name: &str, state: Option<State>, capacity: f64, rate: f64, n: f64, now_ms: i64) -> Call {
    Call {
        name: name.to_string(),
        state,
        lock: None,
        limit: limit(capacity, rate),
        n,
        now_ms,
    }
}

impl Call {
    fn locked(mut self, lock: Lock) -> Call {
        self.lock = Some(lock);
        self
    }

    /// The vector: inputs, then `expect`.
    fn vector(&self, options: Value, expect: Value) -> Value {
        object(vec![
            ("name", json!(self.name)),
            ("state", file::state(self.state, self.lock)),
            ("config", file::config(&self.limit)),
            ("n", json!(self.n)),
            ("now_ms", json!(self.now_ms)),
            ("options", options),
            ("expect", expect),
        ])
    }

    /// The reply and write of a call that stores its outcome.
    fn writes(&self, outcome: &Outcome) -> Value {
        object(vec![
            ("reply", file::reply(outcome)),
            ("write", file::write(outcome, self.lock, self.now_ms)),
        ])
    }
}

pub fn files() -> Vec<VectorFile> {
    vec![
        take_file(),
        peek_file(),
        refund_file(),
        charge_file(),
        reserve_file(),
        lockout_file(),
        takeall_file(),
        first_ms_when_file(),
        denial_cache_file(),
    ]
}

const BUCKET_ABOUT: &str = "Each vector is one call on one bucket: `state` is the stored hash (null: a missing key, which is a full bucket; `lock` when it holds one), `config` the capacity and the refill rate per second, `n` the tokens, `now_ms` the server's clock, `options` the call's options. `expect.reply` is what the command replies; `expect.write` what it stores, or null when it writes nothing: tokens (and `tokens_text`, the hash field byte for byte), last_refill_ms, the key's absolute expiry, and the lock it starts, if any.";

/// Plain TB.TAKE on the awkward inputs, then seeded random ones.
fn take_calls() -> Vec<Call> {
    let mut calls = hand_picked_takes();
    calls.extend(random_calls(0x7a6e_2100, 120));
    calls.extend(order_sensitive_takes(0x0bde_2100, 30));
    calls
}

/// Allowed takes whose written tokens depend on the refill's operation order:
/// `tokens + elapsed / 1000 * rate` (the core's, and every copy's) differs in
/// its last bits from `tokens + elapsed * rate / 1000` on each of them, so a
/// copy that reorders the formula fails these.
fn order_sensitive_takes(seed: u64, count: usize) -> Vec<Call> {
    let mut rng = Lcg::new(seed);
    let mut calls = Vec::new();
    while calls.len() < count {
        let capacity = rng.between(10.0, 1e6);
        let rate = rng.between(1e-3, 1e3);
        let tokens = rng.between(0.0, capacity / 2.0);
        let elapsed_ms = 1 + rng.below(100_000) as i64;
        let now_ms = T0 + rng.below(20_000) as i64;
        let n = rng.between(0.0, tokens);
        let elapsed = elapsed_ms as f64;
        let core_order = tokens + elapsed / 1000.0 * rate;
        let other_order = tokens + elapsed * rate / 1000.0;
        if core_order == other_order || core_order.max(other_order) >= capacity {
            continue;
        }
        calls.push(Call {
            name: format!("operation order {}", calls.len()),
            state: stored(tokens, (now_ms - elapsed_ms) as f64),
            lock: None,
            limit: limit(capacity, rate),
            n,
            now_ms,
        });
    }
    calls
}

/// The awkward inputs of a plain take.
#[rustfmt::skip]
fn hand_picked_takes() -> Vec<Call> {
    vec![
        call("a missing key is a full bucket", None, 10.0, 1.0, 1.0, T0),
        call("n = 0 on a missing key writes nothing", None, 10.0, 1.0, 0.0, T0),
        call("n = capacity empties a missing key", None, 10.0, 1.0, 10.0, T0),
        call("n above the capacity can never be granted", None, 10.0, 1.0, 11.0, T0),
        call("refill since last_refill is added before the take", at(2.5, -1500.0), 10.0, 2.0, 5.0, T0),
        call("an empty bucket waits for its next token", at(0.0, 0.0), 10.0, 1.0, 1.0, T0),
        call("a denial a ms before the token writes nothing", at(0.0, -999.0), 10.0, 1.0, 1.0, T0),
        call("the token arrives exactly on time", at(0.0, -1000.0), 10.0, 1.0, 1.0, T0),
        call("refill never passes the capacity", at(3.0, -86_400_000.0), 10.0, 1.0, 1.0, T0),
        call("stored tokens above the capacity count as the capacity", at(50.0, 0.0), 10.0, 1.0, 1.0, T0),
        call("a clock behind last_refill grants no refill for the gap, and the take stores now", at(3.0, 5000.0), 10.0, 1.0, 1.0, T0),
        call("a clock behind last_refill: even a denial stores the repair", at(3.0, 5000.0), 10.0, 1.0, 5.0, T0),
        call("a clock behind last_refill: n = 0 stores the repair", at(3.0, 5000.0), 10.0, 1.0, 0.0, T0),
        call("a hand-edited fractional last_refill", at(1.0, -0.5), 10.0, 1.0, 2.0, T0),
        call("debt is repaid by refill before any token is taken", at(-4.0, -1000.0), 10.0, 2.0, 1.0, T0),
        call("debt deeper than 2^53 counts as 2^53", at(-1e300, 0.0), 10.0, 1.0, 1.0, T0),
        call("capacity and n of 2^53", None, MAX, 1.0, MAX, T0),
        call("a 2^53 bucket refilling at 1e-300 waits 2^53 ms at most", at(0.0, 0.0), MAX, 1e-300, 1.0, T0),
        call("a rate of 1e-300 leaves the stored tokens as they are", at(5.0, -1e12), 10.0, 1e-300, 1.0, T0),
        call("a capacity of 1e-300", None, 1e-300, 1.0, 1e-300, T0),
        call("n of 1e-300 from 1e-300 tokens", at(1e-300, 0.0), 1.0, 1.0, 1e-300, T0),
        call("just under the capacity, n = 0: full a ms later", at(below(10.0), 0.0), 10.0, 1.0, 0.0, T0),
        call("just under one token: denied for a ms", at(below(1.0), 0.0), 10.0, 1.0, 1.0, T0),
        call("just under the capacity, n = capacity", at(below(10.0), 0.0), 10.0, 1.0, 10.0, T0),
        call("0.1 + 0.2 tokens are not 0.3", at(0.3, 0.0), 1.0, 1.0, 0.1 + 0.2, T0),
        call("a rate of 0.3 per s rounds its waits up", at(0.0, -1.0), 2.5, 0.3, 1.25, T0),
        call("a fast rate: 1e12 tokens per s", at(0.0, 0.0), 1e9, 1e12, 1e9, T0),
        call("a clock at 2^53 ms", None, 10.0, 1.0, 1.0, MAX_EXACT_INTEGER),
        call("a slow rate: a token per 1000 s", at(0.0, 0.0), 3.0, 0.001, 1.0, T0),
    ]
}

/// Seeded random single-bucket calls over pools of ordinary and awkward
/// numbers.
fn random_calls(seed: u64, count: usize) -> Vec<Call> {
    let mut rng = Lcg::new(seed);
    (0..count)
        .map(|i| {
            let capacity = match rng.below(8) {
                0 => MAX,
                1 => 1e-3,
                2 => rng.between(0.5, 5.0),
                3 => rng.between(1.0, 1e6),
                _ => rng.pick(&[1.0, 2.5, 3.0, 10.0, 100.0, 1e9]),
            };
            let rate = match rng.below(8) {
                0 => 1e-300,
                1 => rng.between(1e-3, 10.0),
                2 => rng.between(1.0, 1e6),
                _ => rng.pick(&[0.001, 0.1, 0.3, 1.0, 7.5, 1e6, 1e12]),
            };
            let last_refill = T0 as f64
                + match rng.below(10) {
                    0 => 5000.0, // the clock stepped back
                    1 => -0.5,
                    2 => -1e12,
                    _ => -(rng.below(10_000) as f64),
                };
            let state = match rng.below(9) {
                0 => None,
                1 => stored(capacity, last_refill),
                2 => stored(below(capacity), last_refill),
                3 => stored(-rng.between(0.0, capacity), last_refill),
                4 => stored(1e-300, last_refill),
                _ => stored(rng.between(0.0, capacity), last_refill),
            };
            let n = match rng.below(9) {
                0 => 0.0,
                1 => capacity,
                2 => (capacity * 2.0).min(MAX),
                3 => below(capacity),
                4 => 1e-300,
                5 => 1.0,
                _ => rng.between(0.0, capacity),
            };
            let now_ms = T0 + rng.below(20_000) as i64;
            Call {
                name: format!("random {i}"),
                state,
                lock: None,
                limit: limit(capacity, rate),
                n,
                now_ms,
            }
        })
        .collect()
}

fn take_file() -> VectorFile {
    let vectors = take_calls()
        .iter()
        .map(|c| {
            let outcome = bucket::take(c.state, &c.limit, c.n, c.now_ms);
            c.vector(json!({}), c.writes(&outcome))
        })
        .collect();
    VectorFile {
        rule: "take",
        about: format!(
            "TB.TAKE key capacity rate n without options (core/src/bucket.rs take): the rule the client libraries' local limiters repeat. Replayed by lua/tb.lua (tests/it/twin/vectors.rs), Python, Node and the Rust library. {BUCKET_ABOUT}"
        ),
        vectors,
    }
}

fn lock_until(until_after_ms: i64, strikes: i64, probation_after_ms: i64) -> Lock {
    Lock {
        until_ms: T0 + until_after_ms,
        strikes,
        probation_until_ms: T0 + probation_after_ms,
    }
}

fn peek_file() -> VectorFile {
    let mut calls = hand_picked_takes();
    calls.extend(random_calls(0x9e_2100, 30));
    #[rustfmt::skip]
    let locked = [
        call("a lock that holds denies even n = 0", at(10.0, 0.0), 10.0, 1.0, 0.0, T0).locked(lock_until(2000, 1, 4000)),
        call("a lock that holds: the wait is the later of the lock and the tokens", at(0.0, 0.0), 10.0, 0.5, 3.0, T0).locked(lock_until(2000, 1, 4000)),
        call("a lock that holds: n above the capacity is never", at(0.0, 0.0), 10.0, 1.0, 11.0, T0).locked(lock_until(2000, 1, 4000)),
        call("a lock that has ended no longer denies", at(10.0, 0.0), 10.0, 1.0, 1.0, T0).locked(lock_until(0, 2, 4000)),
    ];
    calls.extend(locked);
    let vectors = calls
        .iter()
        .map(|c| {
            let outcome = bucket::take_with(
                c.state,
                c.lock,
                &c.limit,
                c.n,
                &TakeOptions::PLAIN,
                c.now_ms,
            );
            let expect = object(vec![
                ("reply", file::reply(&outcome)),
                ("write", Value::Null),
            ]);
            c.vector(json!({}), expect)
        })
        .collect();
    VectorFile {
        rule: "peek",
        about: format!(
            "TB.PEEK key capacity rate n: TB.TAKE's reply (a lock that holds included), and it writes nothing, not even the repair of a clock behind last_refill. Replayed by lua/tb.lua; the clients replay the vectors without a lock (their local limiter has none). {BUCKET_ABOUT}"
        ),
        vectors,
    }
}

fn refund_file() -> VectorFile {
    #[rustfmt::skip]
    let calls = [
        call("a missing key is full: a refund writes nothing", None, 10.0, 1.0, 3.0, T0),
        call("refill first, then the refund", at(2.0, -1000.0), 10.0, 1.0, 3.0, T0),
        call("a refund stops at the capacity", at(8.0, 0.0), 10.0, 1.0, 5.0, T0),
        call("a refund repays debt", at(-6.0, 0.0), 10.0, 1.0, 4.0, T0),
        call("debt deeper than 2^53 counts as 2^53", at(-1e300, 0.0), 10.0, 1.0, 4.0, T0),
        call("n = 0 writes nothing", at(2.0, -1000.0), 10.0, 1.0, 0.0, T0),
        call("n = 0 on a clock behind last_refill stores the repair", at(2.0, 5000.0), 10.0, 1.0, 0.0, T0),
        call("a refund on a clock behind last_refill", at(2.0, 5000.0), 10.0, 1.0, 1.0, T0),
        call("2^53 into a 2^53 bucket", at(0.0, 0.0), MAX, 1.0, MAX, T0),
        call("1e-300 into a bucket just under its capacity", at(below(10.0), 0.0), 10.0, 1.0, 1e-300, T0),
        call("a fractional refund at a fractional rate", at(0.25, -10.0), 2.5, 0.3, 0.75, T0),
    ];
    let vectors = calls
        .iter()
        .map(|c| {
            let refunded = bucket::refund(c.state, &c.limit, c.n, c.now_ms);
            let mut expect = c.writes(&refunded.outcome);
            expect["added"] = json!(refunded.added);
            c.vector(json!({}), expect)
        })
        .collect();
    VectorFile {
        rule: "refund",
        about: format!(
            "TB.REFUND key capacity rate n (core/src/bucket.rs refund): refill, then add n, capped at the capacity; `expect.added` is what it really added (the tb_tokens_refunded counter). Replayed by lua/tb.lua. {BUCKET_ABOUT}"
        ),
        vectors,
    }
}

fn charge_file() -> VectorFile {
    // (call, MAXDEBT if given)
    #[rustfmt::skip]
    let calls: Vec<(Call, Option<f64>)> = vec![
        (call("a charge on a missing key", None, 10.0, 1.0, 4.0, T0), None),
        (call("a charge goes into debt, down to the capacity by default", at(2.0, 0.0), 10.0, 1.0, 50.0, T0), None),
        (call("MAXDEBT sets the floor", at(2.0, 0.0), 10.0, 1.0, 50.0, T0), Some(5.0)),
        (call("MAXDEBT 0: never below zero", at(2.0, 0.0), 10.0, 1.0, 50.0, T0), Some(0.0)),
        (call("a balance already below -MAXDEBT stays as it is", at(-30.0, 0.0), 10.0, 1.0, 5.0, T0), Some(10.0)),
        (call("refill repays part of the debt first", at(-8.0, -3000.0), 10.0, 1.0, 2.0, T0), None),
        (call("n = 0 writes nothing", at(-3.0, -1000.0), 10.0, 1.0, 0.0, T0), None),
        (call("n = 0 on a clock behind last_refill stores the repair", at(3.0, 5000.0), 10.0, 1.0, 0.0, T0), None),
        (call("a charge on a clock behind last_refill", at(3.0, 5000.0), 10.0, 1.0, 5.0, T0), None),
        (call("2^53 of debt", at(0.0, 0.0), MAX, 1.0, MAX, T0), Some(MAX)),
        (call("a MAXDEBT of 1e-300", at(0.5, 0.0), 10.0, 1.0, 1.0, T0), Some(1e-300)),
        (call("debt at 1e-300 per s is repaid in 2^53 ms at most", at(0.0, 0.0), 10.0, 1e-300, 3.0, T0), None),
        (call("debt deeper than 2^53 counts as 2^53 and stays", at(-1e300, 0.0), 10.0, 1.0, 1.0, T0), None),
        (call("just under the capacity", at(below(10.0), 0.0), 10.0, 1.0, 10.0, T0), Some(0.0)),
    ];
    let vectors = calls
        .iter()
        .map(|(c, max_debt)| {
            let floor = max_debt.unwrap_or(c.limit.capacity);
            let outcome = bucket::debit(c.state, &c.limit, c.n, floor, c.now_ms);
            let options = match max_debt {
                Some(debt) => json!({ "max_debt": debt }),
                None => json!({}),
            };
            c.vector(options, c.writes(&outcome))
        })
        .collect();
    VectorFile {
        rule: "charge",
        about: format!(
            "TB.CHARGE key capacity rate n [MAXDEBT d] (core/src/bucket.rs debit): always allowed, takes n into debt down to -d and no further (d: options.max_debt, the capacity when absent); a balance already below -d is never raised. Replayed by lua/tb.lua. {BUCKET_ABOUT}"
        ),
        vectors,
    }
}

fn options_json(options: &TakeOptions) -> Value {
    let mut pairs = Vec::new();
    if options.max_wait_ms > 0 {
        pairs.push(("max_wait_ms", json!(options.max_wait_ms)));
    }
    if let Some(block) = options.block {
        pairs.push(("block_ms", json!(block.block_ms)));
        pairs.push(("max_block_ms", json!(block.max_block_ms)));
    }
    object(pairs)
}

/// TB.TAKE with options: the vector of `take_with`.
fn take_with_vector(c: &Call, options: TakeOptions) -> Value {
    let outcome = bucket::take_with(c.state, c.lock, &c.limit, c.n, &options, c.now_ms);
    c.vector(options_json(&options), c.writes(&outcome))
}

fn reserve_file() -> VectorFile {
    #[rustfmt::skip]
    let calls: Vec<(Call, i64)> = vec![
        (call("enough tokens: a plain take", at(5.0, 0.0), 10.0, 1.0, 1.0, T0), 5000),
        (call("a reservation goes into debt and waits for it", at(0.0, 0.0), 10.0, 1.0, 3.0, T0), 5000),
        (call("a second reservation waits behind the first", at(-3.0, 0.0), 10.0, 1.0, 2.0, T0), 5000),
        (call("beyond MAXWAIT: denied with the wait a call with the same MAXWAIT needs", at(-3.0, 0.0), 10.0, 1.0, 5.0, T0), 5000),
        (call("exactly at the horizon", at(0.0, 0.0), 10.0, 1.0, 5.0, T0), 5000),
        (call("a ms short of the horizon", at(0.0, 0.0), 10.0, 1.0, 5.0, T0), 4999),
        (call("n above the capacity is never, whatever MAXWAIT", at(0.0, 0.0), 10.0, 1.0, 11.0, T0), 1_000_000),
        (call("MAXWAIT 1 ms", at(below(1.0), 0.0), 10.0, 1.0, 1.0, T0), 1),
        (call("MAXWAIT 2^53 at 1e-300 per s", at(0.0, 0.0), MAX, 1e-300, 1.0, T0), MAX_EXACT_INTEGER),
        (call("MAXWAIT 2^53 on a 2^53 bucket", at(0.0, 0.0), MAX, 1.0, MAX, T0), MAX_EXACT_INTEGER),
        (call("a fractional rate rounds the wait up", at(0.1, -7.0), 2.5, 0.3, 1.25, T0), 10_000),
        (call("a clock behind last_refill", at(1.0, 5000.0), 10.0, 1.0, 3.0, T0), 5000),
        (call("a missing key is full", None, 10.0, 1.0, 4.0, T0), 5000),
        (call("n = 0 in debt: a reservation of nothing, stored as the bucket stands", at(-3.0, 0.0), 10.0, 1.0, 0.0, T0), 5000),
    ];
    let vectors = calls
        .iter()
        .map(|(c, max_wait_ms)| take_with_vector(c, TakeOptions::new(*max_wait_ms, None)))
        .collect();
    VectorFile {
        rule: "reserve",
        about: format!(
            "TB.TAKE key capacity rate n MAXWAIT ms (core/src/bucket.rs reserve): a call the tokens cannot serve now is allowed into debt when they arrive within options.max_wait_ms, and told to act after retry_after_ms. Replayed by lua/tb.lua. {BUCKET_ABOUT}"
        ),
        vectors,
    }
}

/// `BLOCK ms` and `MAXBLOCK ms`.
type Bounds = (i64, i64);

fn lockout_file() -> VectorFile {
    let block = |ms, max| Some((ms, max));
    #[rustfmt::skip]
    let calls: Vec<(Call, i64, Option<Bounds>)> = vec![
        (call("a denial with BLOCK locks the key", at(0.0, 0.0), 5.0, 1.0, 1.0, T0), 0, block(10_000, 10_000)),
        (call("the wait is the later of the lock's end and the tokens", at(0.0, 0.0), 10.0, 0.1, 1.0, T0), 0, block(2000, 2000)),
        (call("an allowed take with BLOCK locks nothing", at(5.0, 0.0), 5.0, 1.0, 1.0, T0), 0, block(1000, 8000)),
        (call("a lock that holds denies, whatever the bucket holds, and writes nothing", at(5.0, 0.0), 5.0, 1.0, 1.0, T0) .locked(lock_until(1000, 1, 2000)), 0, None),
        (call("a lock that holds denies n = 0 too", at(5.0, 0.0), 5.0, 1.0, 0.0, T0) .locked(lock_until(1000, 1, 2000)), 0, block(1000, 8000)),
        (call("a lock that holds, with MAXWAIT: still denied", at(5.0, 0.0), 5.0, 1.0, 1.0, T0) .locked(lock_until(1000, 1, 2000)), 5000, None),
        (call("after the lock, a take goes through and the lock stays for its probation", at(5.0, 0.0), 5.0, 1.0, 1.0, T0) .locked(lock_until(0, 1, 10_000)), 0, block(1000, 8000)),
        (call("a denial within the probation escalates: twice as long", at(0.0, 0.0), 5.0, 1.0, 1.0, T0) .locked(lock_until(-1, 1, 999)), 0, block(1000, 8000)),
        (call("the third strike: four times as long", at(0.0, 0.0), 5.0, 0.001, 1.0, T0) .locked(lock_until(0, 2, 2000)), 0, block(1000, 8000)),
        (call("escalation stops at MAXBLOCK", at(0.0, 0.0), 5.0, 0.001, 1.0, T0) .locked(lock_until(0, 4, 8000)), 0, block(1000, 5000)),
        (call("a denial after the probation starts over at one strike", at(0.0, 0.0), 5.0, 1.0, 1.0, T0) .locked(lock_until(-2000, 3, 0)), 0, block(1000, 8000)),
        (call("a denial with MAXWAIT beyond the horizon locks too", at(0.0, 0.0), 5.0, 1.0, 5.0, T0), 1000, block(3000, 3000)),
        (call("a reservation within MAXWAIT is allowed and locks nothing", at(0.0, 0.0), 5.0, 1.0, 1.0, T0), 1000, block(3000, 3000)),
        (call("n above the capacity: never, and locked", at(5.0, 0.0), 5.0, 1.0, 6.0, T0), 0, block(1000, 1000)),
        (call("BLOCK 2^53 saturates at 2^53", at(0.0, 0.0), 5.0, 1.0, 1.0, T0), 0, block(MAX_EXACT_INTEGER, MAX_EXACT_INTEGER)),
        (call("a huge strike count saturates at MAXBLOCK", at(0.0, 0.0), 5.0, 1.0, 1.0, T0) .locked(lock_until(0, MAX_EXACT_INTEGER - 1, 10)), 0, block(1, MAX_EXACT_INTEGER)),
        (call("a clock behind last_refill: the lock stores the repaired bucket", at(0.0, 5000.0), 5.0, 1.0, 1.0, T0), 0, block(1000, 1000)),
        (call("a missing key denied for n above the capacity is locked", None, 5.0, 1.0, 6.0, T0), 0, block(1000, 1000)),
    ];
    let vectors = calls
        .iter()
        .map(|(c, max_wait_ms, block)| take_with_vector(c, TakeOptions::new(*max_wait_ms, *block)))
        .collect();
    VectorFile {
        rule: "lockout",
        about: format!(
            "TB.TAKE key capacity rate n [MAXWAIT ms] BLOCK ms MAXBLOCK ms, and TB.TAKE on a key that holds a lock (core/src/bucket.rs take_with, core/src/lockout.rs): a denial with BLOCK locks the key; while the lock holds every take and peek is denied; a lock started within the previous one's probation lasts twice as long, up to MAXBLOCK. state.lock and expect.write.lock are the hash's locked_until, strikes and probation_until. Replayed by lua/tb.lua. {BUCKET_ABOUT}"
        ),
        vectors,
    }
}

fn takeall_file() -> VectorFile {
    // (name, buckets [(state, capacity, rate, n)], MAXWAIT)
    type Buckets = Vec<(Option<State>, f64, f64, f64)>;
    #[rustfmt::skip]
    let cases: Vec<(&str, Buckets, i64)> = vec![
        ("every bucket allows: each takes", vec![(None, 10.0, 10.0, 1.0), (at(3.0, 0.0), 4.0, 0.01, 1.0)], 0),
        ("one denies: none takes, and it decides", vec![(None, 10.0, 10.0, 1.0), (at(0.0, 0.0), 4.0, 0.01, 1.0)], 0),
        ("the longest wait decides a denial", vec![ (at(0.0, 0.0), 10.0, 1.0, 1.0), (at(0.0, 0.0), 10.0, 0.5, 1.0), ], 0),
        ("never (-1) is the longest wait", vec![(at(0.0, 0.0), 10.0, 0.001, 1.0), (None, 5.0, 1.0, 6.0)], 0),
        ("allowed: the fewest tokens left decides", vec![ (None, 10.0, 1.0, 1.0), (at(3.0, 0.0), 10.0, 1.0, 1.0), (None, 10.0, 1.0, 8.0), ], 0),
        ("ties go to the first", vec![ (at(0.0, 0.0), 10.0, 1.0, 1.0), (at(0.0, 0.0), 10.0, 1.0, 1.0), ], 0),
        ("a denied call stores a clock repair and nothing else", vec![ (at(5.0, 5000.0), 10.0, 1.0, 1.0), (at(0.0, 0.0), 10.0, 1.0, 1.0), ], 0),
        ("MAXWAIT: the longest reservation decides", vec![ (at(0.0, 0.0), 10.0, 1.0, 1.0), (at(0.0, 0.0), 10.0, 0.5, 1.0), ], 5000),
        ("2^53 and 1e-300 side by side", vec![(None, MAX, 1.0, MAX), (at(0.0, 0.0), 10.0, 1e-300, 1.0)], 0),
        ("just under and n = 0", vec![ (at(below(10.0), 0.0), 10.0, 1.0, 0.0), (at(below(1.0), 0.0), 10.0, 1.0, 0.0), ], 0),
    ];
    let vectors = cases
        .iter()
        .map(|(name, buckets, max_wait_ms)| {
            let options = TakeOptions::new(*max_wait_ms, None);
            let charges: Vec<Charge> = buckets
                .iter()
                .map(|&(state, capacity, rate, n)| Charge {
                    state,
                    limit: limit(capacity, rate),
                    n,
                    behind: None,
                    lock: None,
                    options,
                })
                .collect();
            let all = bucket::take_all(&charges, T0);
            let decisive = all.outcomes[all.decisive];
            let inputs: Vec<Value> = charges
                .iter()
                .map(|c| {
                    object(vec![
                        ("state", file::state(c.state, None)),
                        ("config", file::config(&c.limit)),
                        ("n", json!(c.n)),
                    ])
                })
                .collect();
            let writes: Vec<Value> = all
                .outcomes
                .iter()
                .map(|outcome| file::write(outcome, None, T0))
                .collect();
            let mut reply = file::reply(&decisive);
            reply["allowed"] = json!(all.allowed);
            reply["index"] = json!(all.decisive);
            object(vec![
                ("name", json!(name)),
                ("buckets", json!(inputs)),
                ("now_ms", json!(T0)),
                ("options", options_json(&options)),
                (
                    "expect",
                    object(vec![("reply", reply), ("writes", json!(writes))]),
                ),
            ])
        })
        .collect();
    VectorFile {
        rule: "takeall",
        about: "TB.TAKEALL key1 .. keyN capacity1 rate1 n1 .. [options] (core/src/bucket.rs take_all): every bucket or none. Each of `buckets` is a key's stored state, config and n; `expect.reply` is the deciding bucket's figures with its `index` (from 0), and `expect.writes` each key's write, in order (null: nothing). Replayed by lua/tb.lua, and by the clients' local limiters (the vectors without options). Shapes as in take.json.".to_string(),
        vectors,
    }
}

/// Waits where the closed formula's guess, `ceil((wanted - available) /
/// rate * 1000)`, is not the answer, so `first_ms_when` gallops and halves
/// to the exact edge: a copy that trusts the guess, or reorders the refill
/// formula in its search, fails these. Found by wanting exactly what the
/// bucket holds a whole number of ms later, where rounding decides.
fn slow_path_waits(seed: u64, count: usize) -> Vec<WhenCase> {
    let mut rng = Lcg::new(seed);
    let mut cases = Vec::new();
    for _ in 0..100_000 {
        if cases.len() == count {
            return cases;
        }
        let capacity = rng.between(1.0, 1e4);
        let rate = rng.between(1e-3, 1e3);
        let now_ms = T0 + rng.below(20_000) as i64;
        let state = State {
            tokens: rng.between(-capacity, capacity / 2.0),
            last_refill_ms: (now_ms - rng.below(10_000) as i64) as f64,
        };
        let lim = limit(capacity, rate);
        let now = now_ms as f64;
        let wanted = state.available_at(&lim, now + (1 + rng.below(100_000)) as f64);
        let available = state.available_at(&lim, now);
        if available >= wanted || wanted >= capacity {
            continue;
        }
        let guess = ((wanted - available) / rate * 1000.0).ceil();
        let ms = bucket::first_ms_when(&state, &lim, now, wanted);
        if ms as f64 != guess {
            let name = format!("the guess is off {}", cases.len());
            cases.push((name, state, capacity, rate, now_ms, wanted));
        }
    }
    panic!("only {} waits off the guess in 100000 tries", cases.len());
}

/// A `first_ms_when` vector's inputs: name, state, capacity, rate, now, wanted.
type WhenCase = (String, State, f64, f64, i64, f64);

fn first_ms_when_file() -> VectorFile {
    // (name, state, capacity, rate, now, wanted)
    #[rustfmt::skip]
    let hand_picked: [(&str, f64, f64, f64, f64, f64); 16] = [
        ("ready now", 5.0, 0.0, 10.0, 1.0, 3.0),
        ("one token at 1 per s", 0.0, 0.0, 10.0, 1.0, 1.0),
        ("the full bucket", 2.5, -1500.0, 10.0, 2.0, 10.0),
        ("a fractional rate", 0.0, -1.0, 2.5, 0.3, 1.25),
        ("0.1 + 0.2", 0.0, 0.0, 1.0, 1.0, 0.1 + 0.2),
        ("just under the wanted tokens", below(1.0), 0.0, 10.0, 1.0, 1.0),
        ("just under the capacity, wanting it", below(10.0), 0.0, 10.0, 1.0, 10.0),
        ("debt first", -4.0, -1000.0, 10.0, 2.0, 1.0),
        ("debt deeper than 2^53 counts as 2^53", -1e300, 0.0, 10.0, 1.0, 1.0),
        ("never within 2^53 ms: 2^53", 0.0, 0.0, MAX, 1e-300, 1.0),
        ("2^53 tokens at 1 per s", 0.0, 0.0, MAX, 1.0, MAX),
        ("wanting more than the capacity: 2^53", 0.0, 0.0, 10.0, 1.0, 11.0),
        ("1e-300 tokens", 0.0, 0.0, 1.0, 1.0, 1e-300),
        ("a fast rate", 0.0, 0.0, 1e9, 1e12, 1e9),
        ("a last_refill in the future", 0.0, 5000.0, 10.0, 1.0, 1.0),
        ("a fractional last_refill", 0.0, -0.5, 10.0, 1.0, 1.0),
    ];
    let mut cases: Vec<WhenCase> = hand_picked
        .iter()
        .map(|&(name, tokens, after, capacity, rate, wanted)| {
            let state = State {
                tokens,
                last_refill_ms: T0 as f64 + after,
            };
            (name.to_string(), state, capacity, rate, T0, wanted)
        })
        .collect();
    cases.extend(slow_path_waits(0x51_2100, 40));
    let mut rng = Lcg::new(0xf1_2100);
    for c in random_calls(0xf1_5eed, 100) {
        let state = c.state.unwrap_or(State {
            tokens: 0.0,
            last_refill_ms: c.now_ms as f64,
        });
        let wanted = if rng.below(2) == 0 {
            c.limit.capacity
        } else {
            c.n
        };
        cases.push((
            c.name,
            state,
            c.limit.capacity,
            c.limit.refill_per_sec,
            c.now_ms,
            wanted,
        ));
    }
    let vectors = cases
        .iter()
        .map(|(name, state, capacity, rate, now_ms, wanted)| {
            let ms =
                bucket::first_ms_when(state, &limit(*capacity, *rate), *now_ms as f64, *wanted);
            object(vec![
                ("name", json!(name)),
                ("state", file::state(Some(*state), None)),
                (
                    "config",
                    object(vec![("capacity", json!(capacity)), ("rate", json!(rate))]),
                ),
                ("now_ms", json!(now_ms)),
                ("wanted", json!(wanted)),
                ("expect", json!({ "ms": ms })),
            ])
        })
        .collect();
    VectorFile {
        rule: "first_ms_when",
        about: "core/src/bucket.rs first_ms_when(state, limit, now, wanted): the fewest whole ms w in [0, 2^53] such that the stored state holds at least `wanted` tokens at now + w (2^53 when none does). Every wait and reset of a reply is one. Replayed by Python and Node (their local limiters write it again).".to_string(),
        vectors,
    }
}

fn denial_cache_file() -> VectorFile {
    let mut vectors: Vec<Value> = Vec::new();
    // From the reply of an allowed take, as a client sees it.
    #[rustfmt::skip]
    let mut from_takes: Vec<Call> = vec![
        call("a take that leaves n primes nothing", at(3.0, 0.0), 10.0, 1.0, 1.0, T0),
        call("a take of 2 that leaves 1", at(3.0, 0.0), 10.0, 1.0, 2.0, T0),
        call("the last token at a fractional rate", at(1.0, 0.0), 2.5, 0.3, 1.0, T0),
        call("a slow rate", at(1.0, 0.0), 3.0, 0.001, 1.0, T0),
        call("a fast rate: the n-th token is back within the ms", at(1.0, 0.0), 10.0, 1e6, 1.0, T0),
        call("1e-300 per s: the term overflows, nothing primed", at(3.0, 0.0), MAX, 1e-300, 3.0, T0),
        call("a 2^53 bucket emptied", None, MAX, 1.0, MAX, T0),
        call("just under one token left", at(below(2.0), 0.0), 10.0, 1.0, 1.0, T0),
        call("n = 0 primes nothing", at(0.0, 0.0), 10.0, 1.0, 0.0, T0),
    ];
    from_takes.extend(random_calls(0xdc_2100, 80));
    for c in from_takes {
        let outcome = bucket::take(c.state, &c.limit, c.n, c.now_ms);
        if !outcome.allowed {
            continue; // a denial is cached for its own retry_after_ms
        }
        vectors.push(window_vector(
            &c.name,
            &c.limit,
            c.n,
            outcome.remaining,
            outcome.reset_after_ms,
        ));
    }
    // And replies no take gives, for the guards.
    vectors.push(window_vector(
        "no refill: nothing primed",
        &limit(10.0, 0.0),
        2.0,
        1,
        9000,
    ));
    vectors.push(window_vector(
        "a window of w <= 0: nothing primed",
        &limit(10.0, 1.0),
        2.0,
        1,
        8000,
    ));
    VectorFile {
        rule: "denial_cache",
        about: "The denial cache's priming window (core/src/denial_cache.rs primed_denial_ms, docs/clients.md#the-denial-cache): after an allowed take of n that left `remaining` < n whole tokens and a bucket full in `reset_after_ms`, a client answers the same take as denied for `expect.window_ms` ms (0: it remembers nothing). `config` and `n` are the call's; `reply` the server's figures. Replayed by Python, Node and the Rust library.".to_string(),
        vectors,
    }
}

fn window_vector(name: &str, limit: &Limit, n: f64, remaining: i64, reset_after_ms: i64) -> Value {
    let window = primed_denial_ms(
        limit.capacity,
        limit.refill_per_sec,
        n,
        remaining,
        reset_after_ms,
    );
    object(vec![
        ("name", json!(name)),
        ("config", file::config(limit)),
        ("n", json!(n)),
        (
            "reply",
            object(vec![
                ("remaining", json!(remaining)),
                ("reset_after_ms", json!(reset_after_ms)),
            ]),
        ),
        ("expect", json!({ "window_ms": window })),
    ])
}
