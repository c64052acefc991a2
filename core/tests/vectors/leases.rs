//! The lease rules as vectors (core/src/lease.rs): TB.ACQUIRE, TB.RENEW and
//! TB.RELEASE on a stored lease set, as the module reads it into a
//! `SetView`.

use redis_tb_core::error::TbError;
use redis_tb_core::lease::{self, Acquire, Incarnation, LeaseLimit, SetIncarnation, SetView};
use redis_tb_core::number::MAX_EXACT_INTEGER;
use serde_json::{json, Value};

use crate::bucket_rules::T0;
use crate::file::{object, VectorFile};

/// The incarnation a new set is made with in these vectors. The server
/// draws its own; a replay compares the ids' other parts.
const DRAWN: i64 = 42;

/// A lease set as stored: its leases (id, deadline), the count of ids it
/// has handed out (`seq`), its incarnation (`inc`; `None`: a set made
/// before incarnations) and its expiry (`None`: none, after a PERSIST).
#[derive(Clone)]
struct Set {
    leases: Vec<(String, i64)>,
    issued: i64,
    incarnation: Option<i64>,
    expire_at_ms: Option<i64>,
}

fn incarnation(value: i64) -> Incarnation {
    Incarnation::from_score(-(value as f64)).expect("an incarnation in [1, 2^53]")
}

impl Set {
    /// `n` leases granted at T0 - 1000 in turn, ending at the given
    /// instants after T0, with the key's expiry at the latest.
    fn of(deadlines_after_t0: &[i64], incarnation: Option<i64>) -> Set {
        let leases: Vec<(String, i64)> = deadlines_after_t0
            .iter()
            .enumerate()
            .map(|(i, after)| {
                let granted = T0 - 1000;
                let id = match incarnation {
                    Some(inc) => format!("{granted}-{}-{inc}", i + 1),
                    None => format!("{granted}-{}", i + 1),
                };
                (id, T0 + after)
            })
            .collect();
        let latest = leases.iter().map(|(_, deadline)| *deadline).max();
        Set {
            issued: leases.len() as i64,
            leases,
            incarnation,
            expire_at_ms: latest,
        }
    }

    fn view(&self, now_ms: i64) -> SetView {
        let live: Vec<i64> = self
            .leases
            .iter()
            .map(|(_, deadline)| *deadline)
            .filter(|deadline| lease::is_live(*deadline, now_ms))
            .collect();
        SetView {
            live: live.len() as i64,
            earliest_deadline_ms: live.iter().copied().min(),
            issued: self.issued,
            expire_at_ms: self.expire_at_ms,
            latest_deadline_ms: self.leases.iter().map(|(_, deadline)| *deadline).max(),
            incarnation: match self.incarnation {
                Some(value) => SetIncarnation::Stored(incarnation(value)),
                None => SetIncarnation::Legacy,
            },
        }
    }

    fn json(&self) -> Value {
        let leases: Vec<Value> = self
            .leases
            .iter()
            .map(|(id, deadline)| json!({ "id": id, "deadline_ms": deadline }))
            .collect();
        object(vec![
            ("leases", json!(leases)),
            ("issued", json!(self.issued)),
            ("incarnation", json!(self.incarnation)),
            ("expire_at_ms", json!(self.expire_at_ms)),
        ])
    }

    /// The stored deadline of `id`, if the set holds it (only an id-shaped
    /// member is ever looked up).
    fn deadline_of(&self, id: &str) -> Option<i64> {
        if !lease::is_lease_id(id.as_bytes()) {
            return None;
        }
        self.leases
            .iter()
            .find(|(lease, _)| lease == id)
            .map(|(_, deadline)| *deadline)
    }
}

enum Op {
    Acquire { limit: i64, lease_ms: i64 },
    Renew { lease: String, lease_ms: i64 },
    Release { lease: String },
}

fn acquire(limit: i64, lease_ms: i64) -> Op {
    Op::Acquire { limit, lease_ms }
}

fn renew(lease: &str, lease_ms: i64) -> Op {
    Op::Renew {
        lease: lease.to_string(),
        lease_ms,
    }
}

fn release(lease: &str) -> Op {
    Op::Release {
        lease: lease.to_string(),
    }
}

pub fn file() -> VectorFile {
    let first = format!("{}-1-7", T0 - 1000);
    let second = format!("{}-2-7", T0 - 1000);
    let legacy = format!("{}-1", T0 - 1000);
    let two_live = Set::of(&[30_000, 60_000], Some(7));
    let one_ended = Set::of(&[0, 60_000], Some(7));
    let persisted = Set {
        expire_at_ms: None,
        ..Set::of(&[90_000], Some(7))
    };
    let exhausted = Set {
        issued: MAX_EXACT_INTEGER,
        ..Set::of(&[], Some(7))
    };
    let near_the_end = Set {
        issued: MAX_EXACT_INTEGER - 1,
        ..Set::of(&[], Some(MAX_EXACT_INTEGER))
    };
    #[rustfmt::skip]
    let cases: Vec<(&str, Option<Set>, Op, i64)> = vec![
        ("the first lease on a missing key is number 1 and makes the set", None, acquire(2, 30_000), T0),
        ("a free slot: the next number", Some(Set::of(&[30_000], Some(7))), acquire(2, 30_000), T0),
        ("no free slot: denied until the earliest live lease ends", Some(two_live.clone()), acquire(2, 30_000), T0),
        ("a lease that has ended holds no slot", Some(one_ended.clone()), acquire(2, 30_000), T0),
        ("a lease ending at now has ended", Some(Set::of(&[0], Some(7))), acquire(1, 5000), T0),
        ("the expiry only grows: a shorter lease leaves it", Some(two_live.clone()), acquire(3, 1000), T0),
        ("a set without an expiry gets its latest deadline", Some(persisted.clone()), acquire(2, 1000), T0),
        ("a set made before incarnations hands out two-part ids", Some(Set::of(&[30_000], None)), acquire(2, 30_000), T0),
        ("a deadline past 2^53 is 2^53", Some(Set::of(&[30_000], Some(7))), acquire(2, MAX_EXACT_INTEGER), T0),
        ("limit 2^53", None, acquire(MAX_EXACT_INTEGER, 1), T0),
        ("the 2^53-th id is the last", Some(near_the_end), acquire(1, 1000), T0),
        ("a set that has handed out 2^53 ids hands out no more", Some(exhausted), acquire(1, 1000), T0),
        ("a renew moves the deadline to lease_ms from now", Some(two_live.clone()), renew(&first, 45_000), T0),
        ("a renew to a shorter time leaves the expiry", Some(two_live.clone()), renew(&second, 1000), T0),
        ("an ended lease cannot be renewed", Some(one_ended.clone()), renew(&first, 45_000), T0),
        ("an unknown lease cannot be renewed", Some(two_live.clone()), renew(&format!("{T0}-9-7"), 45_000), T0),
        ("a renew on a missing key", None, renew(&first, 45_000), T0),
        ("a renew past 2^53 is 2^53", Some(two_live.clone()), renew(&first, MAX_EXACT_INTEGER), T0),
        ("a renew of a set without an expiry", Some(persisted.clone()), renew(&format!("{}-1-7", T0 - 1000), 120_000), T0),
        ("a release of a live lease", Some(two_live.clone()), release(&second), T0),
        ("a release of an ended lease writes nothing", Some(one_ended.clone()), release(&first), T0),
        ("a release of a legacy id", Some(Set::of(&[30_000], None)), release(&legacy), T0),
        ("seq is not a lease", Some(two_live.clone()), release("seq"), T0),
        ("an id with a leading zero is not found", Some(two_live), release(&format!("0{first}")), T0),
    ];
    let vectors = cases
        .into_iter()
        .map(|(name, set, op, now_ms)| vector(name, set, op, now_ms))
        .collect();
    VectorFile {
        rule: "leases",
        about: format!("TB.ACQUIRE key limit lease_ms, TB.RENEW key lease lease_ms and TB.RELEASE key lease (core/src/lease.rs) on a stored lease set: `state` is null (a missing key) or its leases (id, deadline), `issued` (the seq member: ids handed out), `incarnation` (the inc member; null: a set made before incarnations) and the key's absolute expiry (null: none). A set made by the call is made with a drawn incarnation, {DRAWN} here: a replay compares the id's other parts. `expect.reply`: acquire's [acquired, available, retry_after_ms, id]; renew's and release's `held` (1 or 0); or `error`. `expect.write`: null when nothing is written; else the lease's deadline (or the id removed) and the key's new expiry (null: unchanged). Ended leases are removed by every writing call; that part is the module's and is not here. Replayed by lua/tb.lua."),
        vectors,
    }
}

fn vector(name: &str, set: Option<Set>, op: Op, now_ms: i64) -> Value {
    let view = match &set {
        Some(set) => set.view(now_ms),
        None => SetView {
            incarnation: SetIncarnation::New(incarnation(DRAWN)),
            ..SetView::default()
        },
    };
    let (op_name, args, expect) = match op {
        Op::Acquire { limit, lease_ms } => {
            let args = json!({ "limit": limit, "lease_ms": lease_ms });
            let expect = match lease::acquire(&view, &LeaseLimit { limit, lease_ms }, 0, now_ms) {
                Ok(Acquire::Granted(grant)) => {
                    let id = String::from_utf8_lossy(grant.id.text().as_bytes()).into_owned();
                    object(vec![
                        (
                            "reply",
                            json!({ "acquired": true, "available": grant.available, "retry_after_ms": 0, "id": id }),
                        ),
                        (
                            "write",
                            object(vec![
                                ("id", json!(id)),
                                ("deadline_ms", json!(grant.deadline_ms)),
                                ("issued", json!(grant.id.n)),
                                ("expire_at_ms", json!(grant.expire_at_ms)),
                                (
                                    "incarnation",
                                    json!(grant.new_incarnation.map(Incarnation::value)),
                                ),
                            ]),
                        ),
                    ])
                }
                Ok(Acquire::Denied {
                    available,
                    retry_after_ms,
                }) => object(vec![
                    (
                        "reply",
                        json!({ "acquired": false, "available": available, "retry_after_ms": retry_after_ms, "id": null }),
                    ),
                    ("write", Value::Null),
                ]),
                Err(error) => error_expect(error),
            };
            ("acquire", args, expect)
        }
        Op::Renew { lease, lease_ms } => {
            let current = set.as_ref().and_then(|set| set.deadline_of(&lease));
            let args = json!({ "lease": lease, "lease_ms": lease_ms });
            let expect = match lease::renew(&view, current, lease_ms, now_ms) {
                Some((deadline_ms, expire_at_ms)) => object(vec![
                    ("reply", json!({ "held": 1 })),
                    (
                        "write",
                        json!({ "deadline_ms": deadline_ms, "expire_at_ms": expire_at_ms }),
                    ),
                ]),
                None => object(vec![
                    ("reply", json!({ "held": 0 })),
                    ("write", Value::Null),
                ]),
            };
            ("renew", args, expect)
        }
        Op::Release { lease } => {
            let current = set.as_ref().and_then(|set| set.deadline_of(&lease));
            let held = current.is_some_and(|deadline| lease::is_live(deadline, now_ms));
            let args = json!({ "lease": lease });
            let expect = if held {
                object(vec![
                    ("reply", json!({ "held": 1 })),
                    ("write", json!({ "removed": lease, "expire_at_ms": null })),
                ])
            } else {
                object(vec![
                    ("reply", json!({ "held": 0 })),
                    ("write", Value::Null),
                ])
            };
            ("release", args, expect)
        }
    };
    object(vec![
        ("name", json!(name)),
        ("op", json!(op_name)),
        ("state", set.map_or(Value::Null, |set| set.json())),
        ("args", args),
        ("now_ms", json!(now_ms)),
        ("expect", expect),
    ])
}

fn error_expect(error: TbError) -> Value {
    object(vec![
        ("error", json!(error.message().to_string_lossy())),
        ("write", Value::Null),
    ])
}
