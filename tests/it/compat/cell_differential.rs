//! TB.THROTTLE against redis-cell 0.2.2 itself, loaded in the same server beside redis-tb
//! (without `cell-compat`): seeded random sequences of `CL.THROTTLE k1 ...` and
//! `TB.THROTTLE k2 ...` with the same arguments, sent back to back in one pipeline (so at
//! the same moment but for microseconds) on twin keys, and their replies compared.
//!
//! What may differ, and why (docs/redis-cell.md has the whole list):
//! - redis-cell reads the clock in ns, redis-tb in ms (rounded down): near a token boundary
//!   the two can see a different whole number of tokens. A reply is accepted when the tokens
//!   it implies before the call are within one token of the other's; where a token takes a
//!   second or more (count/period <= 1) such a disagreement must also be rare, or it is a
//!   bug rather than a boundary. After a disagreement on `limited` (one took, the other did
//!   not) the twins are put back in step: `k2` gets `k1`'s value (redis-cell's string,
//!   which TB.THROTTLE reads as the same bucket).
//! - seconds (`retry_after`, `reset_after`) are truncated from ns by redis-cell and from ms
//!   by redis-tb: within 1.
//!
//! Some cases start `k2` on redis-cell too and switch it to TB.THROTTLE mid-sequence: the
//! first write converts redis-cell's string, and from then on the answers must follow those
//! of `k1`, which stays on redis-cell.
//!
//! Without redis-cell (scripts/build-redis-cell.sh failed) the tests skip loudly, and fail
//! under `CI=true` (tests/it/harness/cell.rs).

use std::thread;
use std::time::Instant;

use crate::harness::*;

/// The largest clock difference between the twin calls of one step that is put down to the
/// clocks (ns against ms, and the microseconds between the two calls), in ms.
const SKEW_MS: f64 = 2.0;

/// The seeds of the random cases: `TB_CELL_SEED` replays another run (each failure names
/// its case's seed and parameters).
fn seed(default: u64) -> u64 {
    std::env::var("TB_CELL_SEED")
        .ok()
        .and_then(|text| text.parse().ok())
        .unwrap_or(default)
}

/// One random sequence: a limit, its steps, and when `k2` switches from CL.THROTTLE to
/// TB.THROTTLE (0: from the start).
#[derive(Clone, Debug)]
struct Case {
    seed: u64,
    max_burst: i64,
    count: i64,
    period: i64,
    steps: usize,
    /// Longest pause between steps, in ms.
    max_pause_ms: u64,
    switch_at: usize,
}

impl Case {
    fn rate(&self) -> f64 {
        self.count as f64 / self.period as f64
    }

    fn capacity(&self) -> i64 {
        self.max_burst + 1
    }

    /// One token takes a second or more.
    fn slow(&self) -> bool {
        self.count <= self.period
    }
}

/// What one reply says about the tokens the bucket held before the call: an interval
/// [low, high).
fn tokens_before(reply: &[i64], quantity: i64, capacity: i64) -> (f64, f64) {
    let (limited, remaining) = (reply[0] == 1, reply[2] as f64);
    if !limited {
        // Took `quantity`, leaving `remaining` whole tokens.
        (
            remaining + quantity as f64,
            remaining + quantity as f64 + 1.0,
        )
    } else if quantity > capacity {
        // Never fits: `remaining` is what there is.
        (remaining, remaining + 1.0)
    } else {
        // Fewer than `quantity`.
        (remaining, (remaining + 1.0).min(quantity as f64))
    }
}

/// The gap between two intervals (0 when they overlap or touch).
fn gap(a: (f64, f64), b: (f64, f64)) -> f64 {
    (a.0 - b.1).max(b.0 - a.1).max(0.0)
}

struct Tally {
    steps: usize,
    /// Steps where `limited` or `remaining` differed (a token boundary).
    disagreements: usize,
    /// The widest gap seen between the tokens the two replies implied.
    widest_gap: f64,
}

fn run_case(server: &Server, case: &Case, k1: &str, k2: &str) -> Tally {
    let mut con = server.conn();
    let mut rng = Rng(case.seed);
    let mut tally = Tally {
        steps: 0,
        disagreements: 0,
        widest_gap: 0.0,
    };
    let capacity = case.capacity();
    for step in 0..case.steps {
        let pause = rng.below(case.max_pause_ms as usize + 1) as i64;
        sleep_ms(pause);
        let quantity = match rng.below(20) {
            0 => 0,
            1 => capacity + 1 + rng.below(3) as i64, // never fits
            2..=4 => 1 + rng.below(capacity as usize) as i64,
            _ => 1,
        };
        let tb_command = if step >= case.switch_at {
            "TB.THROTTLE"
        } else {
            "CL.THROTTLE"
        };
        let args = [case.max_burst, case.count, case.period, quantity];
        let mut pipe = redis::pipe();
        pipe.cmd("CL.THROTTLE").arg(k1).arg(&args[..]);
        pipe.cmd(tb_command).arg(k2).arg(&args[..]);
        let (cell, tb): (Vec<i64>, Vec<i64>) = pipe.query(&mut con).unwrap_or_else(|e| {
            panic!("{case:?} step {step}: {e}");
        });
        let what = format!(
            "{case:?}\nstep {step} (q {quantity}, {tb_command} on k2): CL.THROTTLE {cell:?}, \
             {tb_command} {tb:?}"
        );
        tally.steps += 1;
        assert_eq!(cell.len(), 5, "{what}");
        assert_eq!(tb.len(), 5, "{what}");
        assert_eq!(cell[1], tb[1], "limit: {what}");
        assert_eq!(cell[1], capacity, "limit: {what}");
        // The tokens each reply implies must agree within what the clocks' difference
        // (at most SKEW_MS) refills: where a token takes a second or more, the two may only
        // fall either side of one token boundary.
        let slack = case.rate() * SKEW_MS / 1000.0 + 1e-9;
        let (a, b) = (
            tokens_before(&cell, quantity, capacity),
            tokens_before(&tb, quantity, capacity),
        );
        let gap = gap(a, b);
        tally.widest_gap = tally.widest_gap.max(gap);
        assert!(
            gap <= slack,
            "tokens before the call: cell {a:?}, tb {b:?} (slack {slack}): {what}"
        );
        if cell[0] == tb[0] {
            assert!((cell[2] - tb[2]).abs() <= 1, "remaining: {what}");
        }
        if cell[0] != tb[0] || cell[2] != tb[2] {
            tally.disagreements += 1;
            if case.slow() {
                // remaining within 1, and limited differs only at such a boundary.
                assert!((cell[2] - tb[2]).abs() <= 1, "remaining: {what}");
                assert!(
                    (a.1 - b.0).abs() <= slack || (b.1 - a.0).abs() <= slack,
                    "not a token boundary: cell {a:?}, tb {b:?}: {what}"
                );
            }
        }
        if cell[0] == tb[0] {
            // retry_after: -1 on both (allowed, or never fits) or within a second.
            assert_eq!(cell[3] == -1, tb[3] == -1, "retry_after: {what}");
            assert!((cell[3] - tb[3]).abs() <= 1, "retry_after: {what}");
            if cell[2] == tb[2] {
                assert!((cell[4] - tb[4]).abs() <= 1, "reset_after: {what}");
            }
        } else {
            // One took and the other did not: put the twins back in step.
            resync(&mut con, k1, k2);
        }
    }
    tally
}

/// Gives `k2` the state of `k1`: redis-cell's string (or nothing, a full bucket).
fn resync(con: &mut redis::Connection, k1: &str, k2: &str) {
    let value: Option<String> = redis::cmd("GET").arg(k1).query(con).expect("GET");
    let _: i64 = redis::cmd("DEL").arg(k2).query(con).expect("DEL");
    if let Some(value) = value {
        let _: () = redis::cmd("SET")
            .arg(k2)
            .arg(value)
            .query(con)
            .expect("SET");
    }
}

fn cases(seed: u64, slow: bool, count: usize) -> Vec<Case> {
    let mut rng = Rng(seed);
    (0..count)
        .map(|index| {
            let (count, period) = if slow {
                *rng.pick(&[(1, 1), (1, 2), (2, 3), (1, 1), (3, 4)])
            } else {
                *rng.pick(&[(10, 1), (50, 1), (7, 2), (100, 3), (1000, 1), (3, 1)])
            };
            let max_burst = if slow {
                *rng.pick(&[0, 1, 2, 3, 5])
            } else {
                *rng.pick(&[0, 3, 10, 30])
            };
            let steps = if slow { 40 } else { 80 };
            // Cases with an odd index start k2 on redis-cell and switch it part way.
            let switch_at = if index % 2 == 1 {
                steps / 4 + rng.below(steps / 2)
            } else {
                0
            };
            Case {
                seed: rng.next(),
                max_burst,
                count,
                period,
                steps,
                max_pause_ms: if slow { 450 } else { 60 },
                switch_at,
            }
        })
        .collect()
}

/// Runs `cases` in parallel, each on its own twin keys and connection, in one server with
/// both modules; returns the tallies.
fn run_all(cases: Vec<Case>) -> Option<Vec<(Case, Tally)>> {
    let cell = redis_cell_module()?;
    let cell = cell.display().to_string();
    let server = Server::start_with(&["--loadmodule", &cell]);
    let started = Instant::now();
    let server = &server;
    let tallies = thread::scope(|scope| {
        let handles: Vec<_> = cases
            .into_iter()
            .enumerate()
            .map(|(index, case)| {
                scope.spawn(move || {
                    let (k1, k2) = (format!("cell:{index}"), format!("tb:{index}"));
                    let tally = run_case(server, &case, &k1, &k2);
                    (case, tally)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|e| std::panic::resume_unwind(e))
            })
            .collect::<Vec<_>>()
    });
    eprintln!("differential: {:?}", started.elapsed());
    for (case, tally) in &tallies {
        eprintln!(
            "  {case:?}: {} steps, {} disagreements, widest gap {:.4} tokens",
            tally.steps, tally.disagreements, tally.widest_gap
        );
    }
    Some(tallies)
}

#[test]
fn slow_rates_answer_as_redis_cell_does_but_at_token_boundaries() {
    let Some(tallies) = run_all(cases(seed(0xce11_0001), true, 10)) else {
        return;
    };
    let steps: usize = tallies.iter().map(|(_, tally)| tally.steps).sum();
    let disagreements: usize = tallies.iter().map(|(_, tally)| tally.disagreements).sum();
    // A boundary falls within a few ms of a call about SKEW_MS / 1000 of the time at one
    // token per second: a handful in 400 steps is a boundary, dozens a bug.
    assert!(
        disagreements * 50 <= steps + 50,
        "{disagreements} disagreements in {steps} steps: {:#?}",
        tallies
            .iter()
            .map(|(case, tally)| (case.clone(), tally.disagreements))
            .collect::<Vec<_>>()
    );
}

#[test]
fn fast_rates_answer_as_redis_cell_does_within_a_token() {
    let Some(tallies) = run_all(cases(seed(0xce11_0002), false, 10)) else {
        return;
    };
    let steps: usize = tallies.iter().map(|(_, tally)| tally.steps).sum();
    assert_eq!(steps, 800, "every step was compared");
}

#[test]
fn a_redis_cell_key_switched_to_tb_throttle_keeps_its_place() {
    // Spend most of a slow bucket on redis-cell, then switch: the first TB.THROTTLE must
    // answer what redis-cell would have answered on the twin.
    let Some(cell) = redis_cell_module() else {
        return;
    };
    let cell = cell.display().to_string();
    let server = Server::start_with(&["--loadmodule", &cell]);
    let mut con = server.conn();
    let limit = [9_i64, 1, 60]; // 10 tokens, one a minute
    for quantity in [3_i64, 2, 1] {
        let mut pipe = redis::pipe();
        pipe.cmd("CL.THROTTLE")
            .arg("a")
            .arg(&limit[..])
            .arg(quantity);
        pipe.cmd("CL.THROTTLE")
            .arg("b")
            .arg(&limit[..])
            .arg(quantity);
        let (a, b): (Vec<i64>, Vec<i64>) = pipe.query(&mut con).expect("CL.THROTTLE");
        assert_eq!(a[..3], b[..3]);
    }
    for quantity in [1_i64, 5, 3, 0, 11, 1] {
        let mut pipe = redis::pipe();
        pipe.cmd("CL.THROTTLE")
            .arg("a")
            .arg(&limit[..])
            .arg(quantity);
        pipe.cmd("TB.THROTTLE")
            .arg("b")
            .arg(&limit[..])
            .arg(quantity);
        let (a, b): (Vec<i64>, Vec<i64>) = pipe.query(&mut con).expect("throttle");
        // Seconds are truncated from ns by redis-cell, from ms (a wait rounded up) here.
        assert_eq!(a[..3], b[..3], "quantity {quantity}");
        assert_eq!(a[3] == -1, b[3] == -1, "retry_after: {a:?} {b:?}");
        assert!((a[3] - b[3]).abs() <= 1, "retry_after: {a:?} {b:?}");
        assert!((a[4] - b[4]).abs() <= 1, "reset_after: {a:?} {b:?}");
    }
    let key_type: String = redis::cmd("TYPE").arg("b").query(&mut con).expect("TYPE");
    assert_eq!(key_type, "hash");
}
