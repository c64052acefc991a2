//! TB.THROTTLE's conversion and reply as vectors: redis-cell's arguments as
//! a bucket, a redis-cell key (its TAT) read as the bucket it stands for,
//! and the reply in cell's shape and whole seconds.

use redis_tb_core::bucket::{Charge, State, TakeOptions};
use redis_tb_core::throttle::{self, from_cell, parse_throttle};
use serde_json::{json, Value};

use crate::bucket_rules::T0;
use crate::file::{self, object, VectorFile};

/// What the key holds before the call.
#[derive(Clone, Copy)]
enum Stored {
    Missing,
    /// redis-tb's hash.
    Bucket(State),
    /// redis-cell's string: its TAT in ns.
    Cell(i64),
}

/// The TAT redis-cell would store for a key written at `T0 + after_ms`
/// (ns, at the end of that ms as the module reads it) plus `ahead_ms`.
fn tat(after_ms: i64, ahead_ms: i64) -> i64 {
    (T0 + after_ms + ahead_ms) * 1_000_000 + 999_999
}

/// name, max_burst, count, period, quantity (if given), what the key holds.
type ThrottleCase = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    Option<&'static str>,
    Stored,
);

pub fn file() -> VectorFile {
    let bucket = |tokens: f64, after_ms: f64| {
        Stored::Bucket(State {
            tokens,
            last_refill_ms: T0 as f64 + after_ms,
        })
    };
    // (name, max_burst, count, period, quantity, stored)
    #[rustfmt::skip]
    let cases: Vec<ThrottleCase> = vec![
        ("a missing key: 16 tokens at 30 per minute", "15", "30", "60", None, Stored::Missing),
        ("a quantity of 3", "15", "30", "60", Some("3"), Stored::Missing),
        ("a quantity of 0 looks and writes nothing", "4", "1", "2", Some("0"), Stored::Missing),
        ("a denial: waits in whole seconds, truncated", "4", "1", "2", None, bucket(0.0, -1.0)),
        ("a wait under a second is 0 s", "4", "1", "1", None, bucket(0.5, 0.0)),
        ("a quantity above max_burst + 1 is never (-1)", "4", "1", "2", Some("6"), bucket(5.0, 0.0)),
        ("a hash written by TB.TAKE is the same bucket", "9", "1", "1", None, bucket(2.5, -1500.0)),
        ("a redis-cell key with a TAT in the past is a full bucket", "9", "1", "1", None, Stored::Cell(tat(-60_000, 0))),
        ("a redis-cell key 3 s ahead: 3 tokens used", "9", "1", "1", None, Stored::Cell(tat(0, 3000))),
        ("a redis-cell key written in this very ms", "9", "1", "1", None, Stored::Cell(tat(0, 0))),
        ("a redis-cell key at its limit: denied, the string stays", "9", "1", "1", None, Stored::Cell(tat(0, 10_000))),
        ("max_burst 2^53 - 1 and count 2^53 per s", "9007199254740991", "9007199254740992", "1", Some("9007199254740992"), Stored::Missing),
        ("a period of 2^53 s", "0", "1", "9007199254740992", None, bucket(0.0, 0.0)),
        ("a clock behind last_refill", "9", "1", "1", Some("5"), bucket(3.0, 5000.0)),
        ("debt left by TB.CHARGE", "9", "2", "1", None, bucket(-4.0, -1000.0)),
    ];
    let vectors = cases
        .iter()
        .map(|&(name, burst, count, period, quantity, stored)| {
            let request = parse_throttle(
                burst.as_bytes(),
                count.as_bytes(),
                period.as_bytes(),
                quantity.map(str::as_bytes),
            )
            .expect("valid throttle arguments");
            let limit = request.limit;
            let (state, state_json) = match stored {
                Stored::Missing => (None, Value::Null),
                Stored::Bucket(state) => (Some(state), file::state(Some(state), None)),
                Stored::Cell(tat_ns) => (
                    Some(from_cell(tat_ns, &limit, T0)),
                    json!({ "cell_tat_ns": tat_ns.to_string() }),
                ),
            };
            let outcome = Charge {
                state,
                limit,
                n: request.n,
                behind: None,
                lock: None,
                options: TakeOptions::PLAIN,
            }
            .judge(T0);
            let mut args = vec![
                ("max_burst", json!(burst)),
                ("count", json!(count)),
                ("period", json!(period)),
            ];
            if let Some(quantity) = quantity {
                args.push(("quantity", json!(quantity)));
            }
            let mut expect = vec![(
                "bucket",
                object(vec![
                    ("capacity", json!(limit.capacity)),
                    ("rate", json!(limit.refill_per_sec)),
                    ("n", json!(request.n)),
                ]),
            )];
            if let Stored::Cell(_) = stored {
                expect.push(("cell_read_as", file::state(state, None)));
            }
            expect.push(("reply", json!(throttle::reply(&outcome, &limit))));
            expect.push(("write", file::write(&outcome, None, T0)));
            object(vec![
                ("name", json!(name)),
                ("state", state_json),
                ("args", object(args)),
                ("now_ms", json!(T0)),
                ("expect", object(expect)),
            ])
        })
        .collect();
    VectorFile {
        rule: "throttle",
        about: "TB.THROTTLE key max_burst count period [quantity] (core/src/throttle.rs): redis-cell's arguments (`args`, as text) become the bucket `expect.bucket` (capacity max_burst + 1, rate count / period per s, n the quantity, 1 when absent), judged as TB.TAKE; `expect.reply` is cell's [limited, limit, remaining, retry_after s (-1 when allowed or never), reset_after s], seconds truncated. `state` is null, a hash (as in take.json) or redis-cell's string (`cell_tat_ns`, its TAT in ns, as text), read as `expect.cell_read_as`; a write replaces the string by the hash (`expect.write`, as in take.json), a denial leaves it. Replayed by lua/tb.lua.".to_string(),
        vectors,
    }
}
