//! The core's vectors (clients/conformance/vectors/, written by the pure core) replayed
//! against what this library does itself, without a server: the local limiter's take, peek
//! and take-all over its own in-process buckets (take.json; peek.json and takeall.json
//! without a lock or options), and the denial cache's priming window (denial_cache.json),
//! which this library writes again. Each vector's stored state is put in the local
//! buckets, the call runs at the vector's clock, and the reply figures and the state the
//! buckets then hold must be the vector's, bit for bit.

use redis_tb_core::bucket::State;
use serde_json::Value;

use crate::local::{primed_denial_ms, BucketRef, LocalLimiter, LocalSettings};

fn vectors(rule: &str) -> Vec<Value> {
    let path = format!(
        "{}/../conformance/vectors/{rule}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let file: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let found = file["vectors"].as_array().unwrap().clone();
    assert!(!found.is_empty(), "no vectors in {rule}.json");
    found
}

fn num(value: &Value) -> f64 {
    value.as_f64().unwrap()
}

fn state_of(state: &Value) -> Option<State> {
    (!state.is_null()).then(|| State {
        tokens: num(&state["tokens"]),
        last_refill_ms: num(&state["last_refill_ms"]),
    })
}

/// A vector's bucket, under `key`.
fn bucket<'a>(key: &'a str, vector: &Value) -> BucketRef<'a> {
    BucketRef {
        key,
        capacity: num(&vector["config"]["capacity"]),
        rate: num(&vector["config"]["rate"]),
        n: num(&vector["n"]),
    }
}

/// The figures as the vectors write them.
fn reply(allowed: bool, remaining: i64, retry_after_ms: i64, reset_after_ms: i64) -> Value {
    serde_json::json!({
        "allowed": allowed,
        "remaining": remaining,
        "retry_after_ms": retry_after_ms,
        "reset_after_ms": reset_after_ms,
    })
}

/// The bucket a key holds after a call that wrote `write` (null: what it held before).
fn after(before: Option<State>, write: &Value) -> Option<State> {
    if write.is_null() {
        before
    } else {
        state_of(write)
    }
}

fn has_lock(vector: &Value) -> bool {
    vector["state"].get("lock").is_some()
}

/// Replays take.json (`write`) or peek.json through the local buckets: the failures.
fn replay_single(rule: &str, write: bool) -> Vec<String> {
    let settings = LocalSettings::default();
    let mut failures = Vec::new();
    for vector in vectors(rule).iter().filter(|v| !has_lock(v)) {
        let name = vector["name"].as_str().unwrap();
        let local = LocalLimiter::default();
        let before = state_of(&vector["state"]);
        local.seed(&settings, "k", before);
        let now = vector["now_ms"].as_i64().unwrap();
        let answer = local
            .take(&settings, &[bucket("k", vector)], write, now)
            .unwrap();
        let o = answer.outcome;
        let got = reply(
            answer.allowed,
            o.remaining,
            o.retry_after_ms,
            o.reset_after_ms,
        );
        if got != vector["expect"]["reply"] {
            failures.push(format!(
                "{name}: reply {got}, the core {}",
                vector["expect"]["reply"]
            ));
        }
        let expected = after(before, &vector["expect"]["write"]);
        let held = local.stored(&settings, "k");
        if held != expected {
            failures.push(format!("{name}: holds {held:?}, the core {expected:?}"));
        }
    }
    failures
}

fn assert_none(rule: &str, failures: Vec<String>) {
    assert!(
        failures.is_empty(),
        "the Rust library differs from the core on {} vectors of {rule}.json:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
}

#[test]
fn a_local_take_replies_and_writes_as_the_core() {
    assert_none("take", replay_single("take", true));
}

#[test]
fn a_local_peek_replies_as_the_core_and_writes_nothing() {
    // peek.json's writes are all null: the local buckets keep what they held.
    assert_none("peek", replay_single("peek", false));
}

#[test]
fn a_local_take_all_takes_from_every_bucket_or_none_as_the_core() {
    let settings = LocalSettings::default();
    let mut failures = Vec::new();
    let all = vectors("takeall");
    let plain: Vec<&Value> = all
        .iter()
        .filter(|v| v["options"].as_object().unwrap().is_empty())
        .collect();
    assert!(!plain.is_empty());
    for vector in plain {
        let name = vector["name"].as_str().unwrap();
        let local = LocalLimiter::default();
        let inputs = vector["buckets"].as_array().unwrap();
        let keys: Vec<String> = (0..inputs.len()).map(|i| format!("k{i}")).collect();
        let befores: Vec<Option<State>> = inputs.iter().map(|b| state_of(&b["state"])).collect();
        for (key, before) in keys.iter().zip(&befores) {
            local.seed(&settings, key, *before);
        }
        let buckets: Vec<BucketRef<'_>> = keys
            .iter()
            .zip(inputs)
            .map(|(key, b)| bucket(key, b))
            .collect();
        let now = vector["now_ms"].as_i64().unwrap();
        let answer = local.take(&settings, &buckets, true, now).unwrap();
        let o = answer.outcome;
        let mut got = reply(
            answer.allowed,
            o.remaining,
            o.retry_after_ms,
            o.reset_after_ms,
        );
        got["index"] = answer.index.into();
        let expect = &vector["expect"];
        if got != expect["reply"] {
            failures.push(format!("{name}: reply {got}, the core {}", expect["reply"]));
        }
        let writes = expect["writes"].as_array().unwrap();
        for ((key, before), write) in keys.iter().zip(&befores).zip(writes) {
            let expected = after(*before, write);
            let held = local.stored(&settings, key);
            if held != expected {
                failures.push(format!(
                    "{name}: {key} holds {held:?}, the core {expected:?}"
                ));
            }
        }
    }
    assert_none("takeall", failures);
}

#[test]
fn the_denial_cache_primes_the_cores_window() {
    let mut failures = Vec::new();
    for vector in vectors("denial_cache") {
        let name = vector["name"].as_str().unwrap();
        let reply = &vector["reply"];
        let got = primed_denial_ms(
            num(&vector["config"]["capacity"]),
            num(&vector["config"]["rate"]),
            num(&vector["n"]),
            reply["remaining"].as_u64().unwrap(),
            reply["reset_after_ms"].as_u64().unwrap(),
        )
        .unwrap_or(0);
        let want = vector["expect"]["window_ms"].as_i64().unwrap();
        if got != want {
            failures.push(format!("{name}: a window of {got} ms, the core {want}"));
        }
    }
    assert_none("denial_cache", failures);
}
