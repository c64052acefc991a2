//! What a limiter answers in process, without a round trip: the local
//! limiter of an outage (docs/clients.md#when-redis-is-down-the-local-limiter)
//! and the denial cache (docs/clients.md#the-denial-cache). The arithmetic is
//! the module's own, from the pure core crate (`redis-tb-core`); this file
//! only keeps the buckets ([`LocalLimiter`]), the denials ([`DenialCache`])
//! and the outage's state ([`Outage`]), each behind one short-held lock so
//! that the sync and the async limiter share them. The engine's `Shield`
//! asks them around each call.

use lru::LruCache;
use redis_tb_core::bucket::{self, Charge, Limit as CoreLimit, Outcome, State, TakeOptions};
use std::num::NonZeroUsize;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

/// What a limiter's plain API does when Redis is unreachable (after the one
/// retry of a dropped connection).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum OnUnavailable {
    /// The call fails with [`Error::Unavailable`](crate::Error::Unavailable) (the default).
    #[default]
    Raise,
    /// Takes, `take_limit`, `take_all` and peeks are answered by the local
    /// limiter at `1/instances` of each limit; the other calls fail with
    /// `Error::Unavailable`.
    Local,
}

/// Default of `local_max_keys`: the most keys the local limiter and the
/// denial cache each keep.
pub const LOCAL_MAX_KEYS_DEFAULT: usize = 10_000;
/// Default of `local_probe_ms`: how long an outage sends nothing before one
/// call tries Redis again.
pub const LOCAL_PROBE_MS_DEFAULT: u64 = 1_000;

/// The settings of the in-process answers (part of the limiter's options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalSettings {
    pub on_unavailable: OnUnavailable,
    /// How many processes share each limit (at least 1).
    pub instances: u32,
    pub max_keys: usize,
    pub probe_ms: u64,
    pub cache_denials: bool,
}

impl Default for LocalSettings {
    fn default() -> Self {
        LocalSettings {
            on_unavailable: OnUnavailable::Raise,
            instances: 1,
            max_keys: LOCAL_MAX_KEYS_DEFAULT,
            probe_ms: LOCAL_PROBE_MS_DEFAULT,
            cache_denials: false,
        }
    }
}

impl LocalSettings {
    pub fn local(&self) -> bool {
        self.on_unavailable == OnUnavailable::Local
    }
}

/// The wall clock in whole ms since the Unix epoch, as the module reads it.
pub(crate) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// One bucket of a call, as the in-process answers see it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BucketRef<'a> {
    pub key: &'a str,
    pub capacity: f64,
    pub rate: f64,
    pub n: f64,
}

/// A local answer: the deciding bucket's outcome, and whether the call
/// (every bucket of it) was allowed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LocalAnswer {
    pub allowed: bool,
    /// The deciding bucket (0 outside `take_all`).
    pub index: usize,
    pub outcome: Outcome,
}

/// A denial the server gave, kept until `until_ms`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Denial {
    /// The tokens the denied take asked for: a take of fewer goes to the server.
    pub n: f64,
    pub until_ms: i64,
    pub remaining: u64,
    pub reset_at_ms: i64,
}

/// A cached denial answering a call: which bucket, and the answer's fields.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct CachedDenial {
    pub index: usize,
    pub remaining: u64,
    pub retry_after_ms: i64,
    pub reset_after_ms: u64,
}

/// A map of at most `max_keys` keys, the least recently used first out,
/// made at its first use (most limiters never need one).
struct Bounded<V>(Option<LruCache<String, V>>);

impl<V> Default for Bounded<V> {
    fn default() -> Self {
        Bounded(None)
    }
}

impl<V> Bounded<V> {
    fn map(&mut self, max_keys: usize) -> &mut LruCache<String, V> {
        let cap = NonZeroUsize::new(max_keys).unwrap_or(NonZeroUsize::MIN);
        let map = self.0.get_or_insert_with(|| LruCache::new(cap));
        if map.cap() != cap {
            map.resize(cap);
        }
        map
    }

    fn clear(&mut self) {
        self.0 = None;
    }
}

/// Each key's bucket in process at `1/instances` of its limit, for the
/// answers of an outage (`LocalLimiter` in all three libraries).
#[derive(Default)]
pub(crate) struct LocalLimiter {
    buckets: Mutex<Bounded<State>>,
}

/// A poisoned lock only means a panic elsewhere while it was held; the
/// maps stay usable (at worst one entry is stale), so go on.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl LocalLimiter {
    /// A take (`write`) or a peek on the local buckets at `1/instances` of
    /// each limit: all or nothing over `buckets`, as TB.TAKEALL.
    pub fn take(
        &self,
        settings: &LocalSettings,
        buckets: &[BucketRef<'_>],
        write: bool,
        now_ms: i64,
    ) -> Option<LocalAnswer> {
        let share = f64::from(settings.instances.max(1));
        let limit = |b: &BucketRef<'_>| CoreLimit {
            capacity: b.capacity / share,
            refill_per_sec: b.rate / share,
        };
        let mut guard = lock(&self.buckets);
        let map = guard.map(settings.max_keys);
        if let [one] = buckets {
            let outcome = bucket::take(map.get(one.key).copied(), &limit(one), one.n, now_ms);
            if write {
                store(map, one.key, outcome.write);
            }
            return Some(LocalAnswer {
                allowed: outcome.allowed,
                index: 0,
                outcome,
            });
        }
        let charges: Vec<Charge> = buckets
            .iter()
            .map(|b| Charge {
                state: map.get(b.key).copied(),
                limit: limit(b),
                n: b.n,
                behind: None,
                lock: None,
                options: TakeOptions::PLAIN,
            })
            .collect();
        let all = bucket::take_all(&charges, now_ms);
        if write {
            for (b, outcome) in buckets.iter().zip(&all.outcomes) {
                store(map, b.key, outcome.write);
            }
        }
        let outcome = *all.outcomes.get(all.decisive)?;
        Some(LocalAnswer {
            allowed: all.allowed,
            index: all.decisive,
            outcome,
        })
    }

    /// Forgets every bucket: an outage is over, and the next one starts
    /// from full buckets.
    pub fn clear(&self) {
        lock(&self.buckets).clear();
    }

    /// Test-only: stores `state` as `key`'s local bucket, as a take would
    /// have (the core's vectors each start from a stored state).
    #[cfg(test)]
    pub(crate) fn seed(&self, settings: &LocalSettings, key: &str, state: Option<State>) {
        store(lock(&self.buckets).map(settings.max_keys), key, state);
    }

    /// Test-only: `key`'s local bucket as stored.
    #[cfg(test)]
    pub(crate) fn stored(&self, settings: &LocalSettings, key: &str) -> Option<State> {
        lock(&self.buckets)
            .map(settings.max_keys)
            .peek(key)
            .copied()
    }
}

/// The server's denials, each kept per key until the time it names
/// (`DenialCache` in all three libraries).
#[derive(Default)]
pub(crate) struct DenialCache {
    entries: Mutex<Bounded<Denial>>,
}

impl DenialCache {
    /// The first of `buckets` held in the cache for at least its `n`
    /// tokens, answered with the time left. Expired entries go.
    pub fn answer(
        &self,
        settings: &LocalSettings,
        buckets: &[BucketRef<'_>],
        now_ms: i64,
    ) -> Option<CachedDenial> {
        let mut guard = lock(&self.entries);
        let map = guard.map(settings.max_keys);
        for (index, b) in buckets.iter().enumerate() {
            let Some(denial) = map.get(b.key).copied() else {
                continue;
            };
            if now_ms >= denial.until_ms {
                map.pop(b.key);
                continue;
            }
            if b.n >= denial.n {
                return Some(CachedDenial {
                    index,
                    remaining: denial.remaining,
                    retry_after_ms: (denial.until_ms - now_ms).max(1),
                    reset_after_ms: u64::try_from(denial.reset_at_ms - now_ms).unwrap_or(0),
                });
            }
        }
        None
    }

    /// Keeps the server's denial of `n` tokens on `key` until its retry
    /// time; "never" (-1) and 0 are not kept.
    pub fn remember(
        &self,
        settings: &LocalSettings,
        key: &str,
        n: f64,
        fields: (u64, i64, u64),
        now_ms: i64,
    ) {
        let (remaining, retry_after_ms, reset_after_ms) = fields;
        if retry_after_ms <= 0 {
            return;
        }
        let denial = Denial {
            n,
            until_ms: now_ms.saturating_add(retry_after_ms),
            remaining,
            reset_at_ms: now_ms.saturating_add(i64::try_from(reset_after_ms).unwrap_or(i64::MAX)),
        };
        lock(&self.entries)
            .map(settings.max_keys)
            .put(key.to_string(), denial);
    }

    /// Drops `key`'s cached denial: this limiter changed the bucket.
    pub fn forget(&self, key: &str) {
        if let Some(map) = lock(&self.entries).0.as_mut() {
            map.pop(key);
        }
    }
}

/// Whether Redis is taken to be down, and when to try it again: during an
/// outage nothing is sent for `probe_ms`, then one call probes Redis
/// (`Outage` in all three libraries).
#[derive(Default)]
pub(crate) struct Outage {
    state: Mutex<OutageState>,
}

#[derive(Debug, Default)]
struct OutageState {
    active: bool,
    probe_at_ms: i64,
}

impl Outage {
    /// Whether a call at `now_ms` goes to Redis: always outside an outage;
    /// in one, only the first call at or after the probe time (which moves
    /// the next probe on), so one call tries Redis per interval.
    pub fn should_send(&self, probe_ms: u64, now_ms: i64) -> bool {
        let mut outage = lock(&self.state);
        if !outage.active {
            return true;
        }
        if now_ms < outage.probe_at_ms {
            return false;
        }
        outage.probe_at_ms = now_ms.saturating_add_unsigned(probe_ms);
        true
    }

    /// A call found Redis unreachable: nothing is sent for another
    /// `probe_ms`. True when this starts the outage (log it).
    pub fn failed(&self, probe_ms: u64, now_ms: i64) -> bool {
        let mut outage = lock(&self.state);
        outage.probe_at_ms = now_ms.saturating_add_unsigned(probe_ms);
        !std::mem::replace(&mut outage.active, true)
    }

    /// A call reached Redis. True when this ends the outage (log it).
    pub fn succeeded(&self) -> bool {
        std::mem::replace(&mut lock(&self.state).active, false)
    }
}

/// The flood bound (docs/clients.md#the-denial-cache): an allowed take of
/// `n` whose reply leaves fewer than `n` tokens (`remaining < n`) means the
/// same take is denied until the bucket holds `n` again, which is
/// `w = reset_after_ms - ceil((capacity - n) * 1000 / rate)` ms after the
/// reply (the reset is the time to a full bucket; the second term the time
/// from `n` tokens to full). `w + 1` ms, when `w` is a positive time;
/// `None` otherwise (tokens left for another take, or no refill at all).
/// The 1 ms is the server's rounding: its tokens are doubles
/// (`tokens + elapsed / 1000 * rate`), so the `n`-th token can be whole a
/// ms after `w` (0.002 + 0.998 < 1), and a take at `w` would be one more
/// denied call per window. Cached as a denial, it keeps the flood's next
/// take off the server: one call per retry window, the one that finds its
/// token back.
pub(crate) fn primed_denial_ms(
    capacity: f64,
    rate: f64,
    n: f64,
    remaining: u64,
    reset_after_ms: u64,
) -> Option<i64> {
    if rate.is_nan() || rate <= 0.0 || (remaining as f64) >= n {
        return None;
    }
    let from_n_to_full = ((capacity - n) * 1000.0 / rate).ceil();
    let window = reset_after_ms as f64 - from_n_to_full;
    // Whole ms: the reset is, and so is the ceiling.
    (window.is_finite() && window > 0.0 && window < i64::MAX as f64).then_some(window as i64 + 1)
}

fn store(map: &mut LruCache<String, State>, key: &str, state: Option<State>) {
    let Some(state) = state else { return };
    match map.get_mut(key) {
        Some(slot) => *slot = state,
        None => {
            map.put(key.to_string(), state);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn settings(instances: u32) -> LocalSettings {
        LocalSettings {
            instances,
            on_unavailable: OnUnavailable::Local,
            ..LocalSettings::default()
        }
    }

    fn bucket_of(v: &Value) -> BucketRef<'_> {
        BucketRef {
            key: v["key"].as_str().unwrap(),
            capacity: v["capacity"].as_f64().unwrap(),
            rate: v["rate"].as_f64().unwrap(),
            n: v["n"].as_f64().unwrap(),
        }
    }

    /// clients/conformance/vectors/local.json, written by the pure core: every step
    /// on a virtual clock gives exactly the expected fields.
    #[test]
    fn the_local_limiter_replays_the_core_case_table() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../conformance/vectors/local.json"
        );
        let table: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut steps = 0;
        for case in table["cases"].as_array().unwrap() {
            let name = case["name"].as_str().unwrap();
            let settings = settings(case["instances"].as_u64().unwrap() as u32);
            let local = LocalLimiter::default();
            for (i, step) in case["steps"].as_array().unwrap().iter().enumerate() {
                let now = step["now_ms"].as_i64().unwrap();
                let (buckets, write) = match step["op"].as_str().unwrap() {
                    "take" => (vec![bucket_of(step)], true),
                    "peek" => (vec![bucket_of(step)], false),
                    "take_all" => (
                        step["limits"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(bucket_of)
                            .collect(),
                        true,
                    ),
                    other => panic!("unknown op {other}"),
                };
                let answer = local.take(&settings, &buckets, write, now).unwrap();
                let expect = &step["expect"];
                let got = (
                    answer.allowed,
                    answer.outcome.remaining,
                    answer.outcome.retry_after_ms,
                    answer.outcome.reset_after_ms,
                );
                let want = (
                    expect["allowed"].as_bool().unwrap(),
                    expect["remaining"].as_i64().unwrap(),
                    expect["retry_after_ms"].as_i64().unwrap(),
                    expect["reset_after_ms"].as_i64().unwrap(),
                );
                assert_eq!(got, want, "{name}, step {i}");
                if let Some(index) = expect["index"].as_u64() {
                    assert_eq!(answer.index as u64, index, "{name}, step {i}");
                }
                steps += 1;
            }
        }
        assert!(steps > 100, "only {steps} steps");
    }

    #[test]
    fn the_local_buckets_keep_at_most_max_keys() {
        let settings = LocalSettings {
            max_keys: 2,
            ..settings(1)
        };
        let local = LocalLimiter::default();
        let take = |key: &str| {
            let b = BucketRef {
                key,
                capacity: 1.0,
                rate: 0.001,
                n: 1.0,
            };
            local.take(&settings, &[b], true, 0).unwrap().allowed
        };
        assert!(take("a") && take("b"));
        assert!(!take("a"), "a is spent");
        assert!(take("c"), "c pushes out b, the least recently used");
        assert!(!take("a"), "a was used more recently than b: kept");
        assert!(take("b"), "b was forgotten: a full bucket again");
    }

    #[test]
    fn denials_are_cached_until_their_retry_time_for_at_least_their_n() {
        let settings = LocalSettings {
            cache_denials: true,
            ..LocalSettings::default()
        };
        let denials = DenialCache::default();
        let b = |n| BucketRef {
            key: "k",
            capacity: 5.0,
            rate: 1.0,
            n,
        };
        denials.remember(&settings, "k", 2.0, (1, 1000, 4000), 10_000);
        let hit = denials.answer(&settings, &[b(2.0)], 10_400).unwrap();
        assert_eq!(
            (hit.remaining, hit.retry_after_ms, hit.reset_after_ms),
            (1, 600, 3600)
        );
        assert!(
            denials.answer(&settings, &[b(1.0)], 10_400).is_none(),
            "fewer tokens"
        );
        assert!(
            denials.answer(&settings, &[b(3.0)], 11_000).is_none(),
            "expired"
        );
        denials.remember(&settings, "k", 2.0, (0, -1, 0), 10_000);
        assert!(
            denials.answer(&settings, &[b(3.0)], 10_001).is_none(),
            "never is not kept"
        );
        denials.remember(&settings, "k", 2.0, (0, 500, 0), 10_000);
        denials.forget("k");
        assert!(
            denials.answer(&settings, &[b(3.0)], 10_001).is_none(),
            "forgotten"
        );
    }

    #[test]
    fn an_allowed_take_that_leaves_fewer_than_n_primes_a_denial_until_n_is_back() {
        // 5 of capacity, 1 per s, the last token taken: full in 5 s, 1 token in 1 s.
        // (Each window is w + 1: the server's rounding margin.)
        assert_eq!(primed_denial_ms(5.0, 1.0, 1.0, 0, 5000), Some(1001));
        // Part of a token left (0.4): 600 ms to the next whole one.
        assert_eq!(primed_denial_ms(5.0, 1.0, 1.0, 0, 4600), Some(601));
        // n = 2 with 1 left: 2 tokens again in 1 s (reset 4000 ms).
        assert_eq!(primed_denial_ms(5.0, 1.0, 2.0, 1, 4000), Some(1001));
        // A slow bucket: 0.5 per s, ceil of the time from n to full (2 s).
        assert_eq!(primed_denial_ms(3.0, 0.5, 1.0, 0, 6000), Some(2001));
        // 0.3 per s: 2 tokens from n to full in ceil(6666.7) ms; 1 ms left.
        assert_eq!(primed_denial_ms(3.0, 0.3, 1.0, 0, 6668), Some(2));
        assert_eq!(
            primed_denial_ms(5.0, 1.0, 1.0, 1, 4000),
            None,
            "a token is left for the next take"
        );
        assert_eq!(
            primed_denial_ms(5.0, 1.0, 1.0, 0, 4000),
            None,
            "n is back already"
        );
        assert_eq!(primed_denial_ms(5.0, 0.0, 1.0, 0, 5000), None, "no refill");
        assert_eq!(primed_denial_ms(5.0, 1.0, 0.0, 0, 5000), None, "n = 0");
    }

    #[test]
    fn an_outage_sends_nothing_until_its_probe_time() {
        let outage = Outage::default();
        assert!(outage.should_send(1000, 0));
        assert!(outage.failed(1000, 0), "starts it");
        assert!(!outage.should_send(1000, 999));
        assert!(outage.should_send(1000, 1000), "one probe");
        assert!(!outage.should_send(1000, 1001), "and only one");
        assert!(!outage.failed(1000, 1002), "goes on");
        assert!(outage.succeeded());
        assert!(!outage.succeeded());
        assert!(outage.should_send(1000, 1003));
    }
}
