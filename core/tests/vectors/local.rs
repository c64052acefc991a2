//! The local limiter's case table (`vectors/local.json`,
//! docs/clients.md#the-local-limiter): sequences of calls on a virtual
//! clock, each library's local limiter from an empty start.
//!
//! While Redis is unreachable the Python, Node and Rust libraries can limit
//! each key in process with the module's own arithmetic. Python and Node
//! write that arithmetic again; this table is what keeps the copies honest:
//! every expected answer comes from this crate's `bucket::take` and
//! `bucket::take_all`, at `capacity / instances` and `rate / instances`.

use redis_tb_core::bucket::{self, Charge, Limit, Outcome, State, TakeOptions};
use std::collections::HashMap;
use std::fmt::Write as _;

/// One call of a case: at `now_ms`, take (or peek) from the given buckets.
enum Step {
    Take {
        now_ms: i64,
        key: &'static str,
        capacity: f64,
        rate: f64,
        n: f64,
    },
    Peek {
        now_ms: i64,
        key: &'static str,
        capacity: f64,
        rate: f64,
        n: f64,
    },
    TakeAll {
        now_ms: i64,
        limits: Vec<(&'static str, f64, f64, f64)>,
    },
}

struct Case {
    name: &'static str,
    /// The configured limits are divided by this many instances.
    instances: u32,
    steps: Vec<Step>,
}

const T0: i64 = 1_700_000_000_000;

/// Takes from one bucket, each `(ms after T0, n)` in turn.
fn takes(key: &'static str, capacity: f64, rate: f64, calls: &[(i64, f64)]) -> Vec<Step> {
    calls
        .iter()
        .map(|&(after_ms, n)| Step::Take {
            now_ms: T0 + after_ms,
            key,
            capacity,
            rate,
            n,
        })
        .collect()
}

fn peek(after_ms: i64, key: &'static str, capacity: f64, rate: f64, n: f64) -> Step {
    Step::Peek {
        now_ms: T0 + after_ms,
        key,
        capacity,
        rate,
        n,
    }
}

fn case(name: &'static str, instances: u32, steps: Vec<Vec<Step>>) -> Case {
    Case {
        name,
        instances,
        steps: steps.into_iter().flatten().collect(),
    }
}

fn cases() -> Vec<Case> {
    let day_and_second = |after_ms: i64, n_sec: f64, n_day: f64| Step::TakeAll {
        now_ms: T0 + after_ms,
        limits: vec![("i:sec", 10.0, 10.0, n_sec), ("i:day", 4.0, 0.01, n_day)],
    };
    let mut cases = vec![
        case(
            "a fresh bucket allows and counts down, then waits for refill",
            1,
            vec![takes(
                "a",
                3.0,
                1.0,
                &[
                    (0, 1.0),
                    (0, 1.0),
                    (0, 1.0),
                    (0, 1.0),
                    (999, 1.0),
                    (1000, 1.0),
                    (1000, 1.0),
                    (10_000, 3.0),
                ],
            )],
        ),
        case(
            "instances divide the capacity and the rate",
            2,
            vec![takes(
                "b",
                10.0,
                2.0,
                &[
                    (0, 1.0),
                    (0, 4.0),
                    (0, 1.0),
                    (500, 1.0),
                    (1000, 1.0),
                    (1000, 6.0),
                ],
            )],
        ),
        case(
            "n above the local capacity is denied for ever",
            3,
            vec![takes("c", 5.0, 1.0, &[(0, 2.0), (0, 1.0)])],
        ),
        case(
            "fractional rates and costs",
            1,
            vec![takes(
                "d",
                2.5,
                0.3,
                &[(0, 1.25), (1, 1.25), (2, 0.5), (1234, 0.5), (1667, 0.5)],
            )],
        ),
        case(
            "n = 0 looks without taking",
            1,
            vec![takes(
                "e",
                2.0,
                1.0,
                &[(0, 0.0), (0, 2.0), (0, 0.0), (10, 0.0)],
            )],
        ),
        case(
            "peek answers as a take would and takes nothing",
            1,
            vec![
                vec![peek(0, "f", 2.0, 0.5, 2.0)],
                takes("f", 2.0, 0.5, &[(0, 2.0)]),
                vec![peek(100, "f", 2.0, 0.5, 1.0)],
                takes("f", 2.0, 0.5, &[(2000, 1.0)]),
            ],
        ),
        case(
            "a clock step back grants no refill for the gap",
            1,
            vec![takes(
                "g",
                2.0,
                1.0,
                &[(5000, 2.0), (0, 1.0), (1000, 1.0), (1000, 1.0)],
            )],
        ),
        case(
            "keys are separate buckets",
            1,
            vec![
                takes("h1", 1.0, 1.0, &[(0, 1.0)]),
                takes("h2", 1.0, 1.0, &[(0, 1.0)]),
                takes("h1", 1.0, 1.0, &[(0, 1.0)]),
            ],
        ),
        case(
            "take_all takes from every bucket or from none",
            2,
            vec![
                vec![
                    day_and_second(0, 1.0, 1.0),
                    day_and_second(0, 1.0, 1.0),
                    day_and_second(0, 1.0, 1.0),
                ],
                takes("i:sec", 10.0, 10.0, &[(0, 3.0)]),
                vec![day_and_second(100, 3.0, 0.0)],
            ],
        ),
        case(
            "very slow and very fast rates",
            1,
            vec![
                takes("j1", 1.0, 0.000_001, &[(0, 1.0), (0, 1.0)]),
                takes(
                    "j2",
                    9_007_199_254_740_992.0,
                    1e12,
                    &[(0, 9_007_199_254_740_992.0), (1, 1e9)],
                ),
                takes("j3", 1e6, 1e-3, &[(0, 1e6), (0, 1.0)]),
            ],
        ),
    ];
    cases.extend(random_cases());
    cases
}

/// Deterministic pseudo-random walks (a fixed LCG, so the file never changes
/// unless the arithmetic does).
fn random_cases() -> Vec<Case> {
    const KEYS: [&str; 3] = ["r1", "r2", "r3"];
    const NAMES: [&str; 4] = [
        "random walk 1",
        "random walk 2",
        "random walk 3",
        "random walk 4",
    ];
    let mut seed: u64 = 0x5eed_2026_1202;
    let mut next = move |bound: u64| {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (seed >> 33) % bound
    };
    let limits = [(5.0, 2.0), (100.0, 0.5), (3.0, 7.5), (1.5, 0.25)];
    NAMES
        .iter()
        .enumerate()
        .map(|(which, name)| {
            let (capacity, rate) = limits[which];
            let instances = 1 + (which as u32 % 2);
            let mut now_ms = T0;
            let steps = (0..40)
                .map(|_| {
                    now_ms += next(700) as i64;
                    let key = KEYS[next(3) as usize];
                    let n = next(9) as f64 / 4.0;
                    if next(6) == 0 {
                        Step::Peek {
                            now_ms,
                            key,
                            capacity,
                            rate,
                            n,
                        }
                    } else {
                        Step::Take {
                            now_ms,
                            key,
                            capacity,
                            rate,
                            n,
                        }
                    }
                })
                .collect();
            Case {
                name,
                instances,
                steps,
            }
        })
        .collect()
}

fn local(capacity: f64, rate: f64, instances: u32) -> Limit {
    Limit {
        capacity: capacity / f64::from(instances),
        refill_per_sec: rate / f64::from(instances),
    }
}

fn outcome_json(out: &mut String, outcome: &Outcome, index: Option<usize>) {
    let _ = write!(
        out,
        "{{\"allowed\": {}, \"remaining\": {}, \"retry_after_ms\": {}, \"reset_after_ms\": {}",
        outcome.allowed, outcome.remaining, outcome.retry_after_ms, outcome.reset_after_ms
    );
    if let Some(index) = index {
        let _ = write!(out, ", \"index\": {index}");
    }
    out.push('}');
}

fn limit_json(out: &mut String, key: &str, capacity: f64, rate: f64, n: f64) {
    let _ = write!(
        out,
        "\"key\": \"{key}\", \"capacity\": {capacity:?}, \"rate\": {rate:?}, \"n\": {n:?}"
    );
}

/// The file's text, as it is checked in.
pub fn render() -> String {
    let mut out = String::new();
    out.push_str("{\n  \"about\": \"The local limiter's case table (docs/clients.md#the-local-limiter), computed by the pure core (core/tests/vectors/local.rs; do not edit by hand). Each case starts with no buckets and the given instances count; each step runs at the virtual Unix time now_ms on the configured (undivided) limits and must give exactly the expected fields. op: take, peek (the answer of a take, nothing taken), take_all (all or nothing; the answer is the deciding bucket's, with its index). Numbers are doubles as JSON writes them.\",\n  \"version\": 1,\n  \"cases\": [\n");
    let all = cases();
    for (case_index, case) in all.iter().enumerate() {
        let mut buckets: HashMap<&str, State> = HashMap::new();
        let _ = writeln!(
            out,
            "    {{\"name\": \"{}\", \"instances\": {}, \"steps\": [",
            case.name, case.instances
        );
        for (step_index, step) in case.steps.iter().enumerate() {
            out.push_str("      {");
            match step {
                Step::Take {
                    now_ms,
                    key,
                    capacity,
                    rate,
                    n,
                }
                | Step::Peek {
                    now_ms,
                    key,
                    capacity,
                    rate,
                    n,
                } => {
                    let is_take = matches!(step, Step::Take { .. });
                    let limit = local(*capacity, *rate, case.instances);
                    let outcome = bucket::take(buckets.get(key).copied(), &limit, *n, *now_ms);
                    if is_take {
                        if let Some(state) = outcome.write {
                            buckets.insert(key, state);
                        }
                    }
                    let _ = write!(
                        out,
                        "\"op\": \"{}\", \"now_ms\": {now_ms}, ",
                        if is_take { "take" } else { "peek" }
                    );
                    limit_json(&mut out, key, *capacity, *rate, *n);
                    out.push_str(", \"expect\": ");
                    outcome_json(&mut out, &outcome, None);
                }
                Step::TakeAll { now_ms, limits } => {
                    let charges: Vec<Charge> = limits
                        .iter()
                        .map(|(key, capacity, rate, n)| Charge {
                            state: buckets.get(key).copied(),
                            limit: local(*capacity, *rate, case.instances),
                            n: *n,
                            behind: None,
                            lock: None,
                            options: TakeOptions::PLAIN,
                        })
                        .collect();
                    let all = bucket::take_all(&charges, *now_ms);
                    for ((key, ..), outcome) in limits.iter().zip(&all.outcomes) {
                        if let Some(state) = outcome.write {
                            buckets.insert(key, state);
                        }
                    }
                    let _ = write!(
                        out,
                        "\"op\": \"take_all\", \"now_ms\": {now_ms}, \"limits\": ["
                    );
                    for (i, (key, capacity, rate, n)) in limits.iter().enumerate() {
                        if i > 0 {
                            out.push_str(", ");
                        }
                        out.push('{');
                        limit_json(&mut out, key, *capacity, *rate, *n);
                        out.push('}');
                    }
                    out.push_str("], \"expect\": ");
                    let decisive = all.outcomes[all.decisive];
                    let shown = Outcome {
                        allowed: all.allowed,
                        ..decisive
                    };
                    outcome_json(&mut out, &shown, Some(all.decisive));
                }
            }
            out.push('}');
            if step_index + 1 < case.steps.len() {
                out.push(',');
            }
            out.push('\n');
        }
        out.push_str("    ]}");
        if case_index + 1 < all.len() {
            out.push(',');
        }
        out.push('\n');
    }
    out.push_str("  ]\n}\n");
    out
}
