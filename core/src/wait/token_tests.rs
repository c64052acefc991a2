//! The waiting state machine against a simulated server and a reference
//! model, under both callback orders: the server running a blocked client's
//! callback inside `RM_UnblockClient` (Redis 7.0, 7.2, Valkey) or just
//! before the event loop sleeps (Redis 7.4+).

use std::collections::HashMap;

use proptest::prelude::*;

use super::sim_timers::{self, Key, Keyspace, Order, TimerFor};
use super::tokens::{Served, Tokens};
use super::*;
use crate::args::Request;
use crate::bucket::{self, Limit, Outcome, State};

// TB.BTAKE's machine: the kind these tests wait for.
type Machine = super::Machine<Tokens>;
type Event<'a> = super::Event<'a, Tokens>;
type Action = super::Action<Tokens>;
type Arrival<'a> = super::Arrival<'a, Tokens>;

const START_MS: i64 = 1_000_000;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Value {
    Bucket(State),
    /// A value of another type (a string, say).
    Other,
}

/// The simulated server's keys: buckets, and values of other types.
#[derive(Default)]
struct Buckets {
    keys: HashMap<Key, Value>,
    fail_writes: bool,
    /// Writes done during the event being handled.
    written: Vec<(Key, State, i64)>,
}

type Sim = sim_timers::Sim<Buckets>;

impl Keyspace<Tokens> for Buckets {
    fn read(sim: &mut Sim, db: Db, key: &[u8], _now_ms: i64) -> Result<Served, TbError> {
        let bucket = match sim.keyspace.keys.get(&(db, key.to_vec())) {
            None => None,
            Some(Value::Bucket(state)) => Some(*state),
            Some(Value::Other) => return Err(TbError::BucketGone),
        };
        Ok(Served {
            bucket,
            expire_at_ms: 0,
        })
    }

    fn write(
        sim: &mut Sim,
        db: Db,
        key: &[u8],
        served: &Served,
        _now_ms: i64,
    ) -> Result<(), TbError> {
        let Some(state) = &served.bucket else {
            sim.violations
                .push(format!("write of no bucket to {key:?}"));
            return Err(TbError::Internal);
        };
        let buckets = &mut sim.keyspace;
        if buckets.fail_writes {
            return Err(TbError::WriteFailed);
        }
        let key = (db, key.to_vec());
        buckets.keys.insert(key.clone(), Value::Bucket(*state));
        buckets.written.push((key, *state, served.expire_at_ms));
        Ok(())
    }
}

/// A waiter as the reference model sees it.
#[derive(Clone, Debug)]
struct Expected {
    id: WaiterId,
    limit: Limit,
    n: f64,
    deadline_ms: Option<i64>,
}

/// What a client is owed.
#[derive(Clone, Debug, PartialEq)]
enum Owed {
    Waiting,
    /// Unblocked; its callback must reply this.
    Grant(i64, i64),
    Denial,
    Error(TbError),
    Answered,
    /// Killed or disconnected: owed nothing.
    Gone,
}

/// The reference model: a plain list per key, in arrival order, and what
/// each client is owed.
#[derive(Default)]
struct Model {
    queues: HashMap<Key, Vec<Expected>>,
    owed: HashMap<WaiterId, Owed>,
}

impl Model {
    fn queued(&self, key: &Key) -> f64 {
        self.queues
            .get(key)
            .map_or(0.0, |q| q.iter().map(|w| w.n).sum())
    }

    fn remove(&mut self, id: WaiterId) -> Option<Expected> {
        for queue in self.queues.values_mut() {
            if let Some(at) = queue.iter().position(|w| w.id == id) {
                return Some(queue.remove(at));
            }
        }
        None
    }

    /// Who a wake-up of `key` at `now` ends, in order, and the bucket after.
    fn drive(&self, key: &Key, now: i64, sim: &Sim) -> (Vec<(WaiterId, Owed)>, Option<State>) {
        let mut ended = Vec::new();
        let Some(queue) = self.queues.get(key) else {
            return (ended, None);
        };
        let mut state = match sim.keyspace.keys.get(key) {
            Some(Value::Other) => {
                let failed = queue
                    .iter()
                    .map(|w| (w.id, Owed::Error(TbError::BucketGone)));
                return (failed.collect(), None);
            }
            Some(Value::Bucket(state)) => Some(*state),
            None => None,
        };
        let mut written = None;
        let mut served = Vec::new();
        for waiter in queue {
            if waiter.deadline_ms.is_some_and(|d| now >= d) {
                ended.push((waiter.id, Owed::Denial));
                continue;
            }
            let outcome = bucket::take(state, &waiter.limit, waiter.n, now);
            if !outcome.allowed {
                break;
            }
            state = outcome.write.or(state);
            written = outcome.write;
            served.push((
                waiter.id,
                Owed::Grant(outcome.remaining, outcome.reset_after_ms),
            ));
        }
        if sim.keyspace.fail_writes && written.is_some() {
            for (_, owed) in &mut served {
                *owed = Owed::Error(TbError::WriteFailed);
            }
        }
        // Timeouts found on the way are ended as they are met, grants after
        // the write: the machine's order within one wake-up.
        let mut order = Vec::new();
        let mut served = served.into_iter().peekable();
        for (id, owed) in ended {
            order.push((id, owed));
        }
        order.extend(&mut served);
        (order, written)
    }
}

/// One step of a random run.
#[derive(Clone, Debug)]
enum Op {
    Arrive {
        db: u8,
        key: u8,
        n: u8,
        capacity: u8,
        rate: u8,
        timeout: u8,
    },
    Advance(u16),
    Refund {
        db: u8,
        key: u8,
        amount: u8,
    },
    Delete {
        db: u8,
        key: u8,
    },
    Overwrite {
        db: u8,
        key: u8,
    },
    Flush(Option<u8>),
    Swap,
    Unblock(u8),
    Kill(u8),
    Pause,
    Resume,
    FailWrites(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u8..2, 0u8..2, 1u8..5, 1u8..7, 0u8..3, 0u8..7).prop_map(
            |(db, key, n, capacity, rate, timeout)| Op::Arrive { db, key, n, capacity, rate, timeout }
        ),
        6 => (0u16..400).prop_map(Op::Advance),
        3 => (0u8..2, 0u8..2, 1u8..8).prop_map(|(db, key, amount)| Op::Refund { db, key, amount }),
        1 => (0u8..2, 0u8..2).prop_map(|(db, key)| Op::Delete { db, key }),
        1 => (0u8..2, 0u8..2).prop_map(|(db, key)| Op::Overwrite { db, key }),
        1 => proptest::option::of(0u8..2).prop_map(Op::Flush),
        1 => Just(Op::Swap),
        2 => any::<u8>().prop_map(Op::Unblock),
        2 => any::<u8>().prop_map(Op::Kill),
        1 => Just(Op::Pause),
        2 => Just(Op::Resume),
        1 => prop_oneof![9 => Just(false), 1 => Just(true)].prop_map(Op::FailWrites),
    ]
}

const RATES: [f64; 3] = [0.5, 20.0, 1000.0];
const TIMEOUTS: [i64; 7] = [0, 1, 4, 7, 50, 100, 900];

/// The machine, the simulated server and the model, run together.
struct Run {
    order: Order,
    machine: Machine,
    sim: Sim,
    model: Model,
    /// Unblocked clients whose deferred callback has yet to run.
    pending: Vec<WaiterId>,
    /// When writes last resumed: the machine notices within
    /// `PAUSED_RECHECK_MS`.
    resumed_ms: i64,
}

impl Run {
    fn new(order: Order) -> Run {
        Run {
            order,
            machine: Machine::default(),
            sim: Sim::starting_at(START_MS),
            model: Model::default(),
            pending: Vec::new(),
            resumed_ms: 0,
        }
    }

    fn fail(&mut self, why: String) {
        self.sim.violations.push(why);
    }

    /// Hands an event to the machine and carries out its actions as the
    /// server would; `expected` is who the model says it must unblock, in
    /// order (checked when given).
    fn dispatch(&mut self, event: Event<'_>, expected: Option<Vec<WaiterId>>) {
        let replying = match event {
            Event::Unblocked { id, .. } => Some(id),
            _ => None,
        };
        let actions = self.machine.on(event, &mut self.sim);
        if let Err(why) = self.machine.check() {
            self.fail(format!("after {event:?}: {why}"));
        }
        let unblocked: Vec<WaiterId> = actions
            .iter()
            .filter_map(|action| match action {
                Action::Unblock(client) => Some(*client as WaiterId),
                _ => None,
            })
            .collect();
        if let Some(expected) = expected {
            if unblocked != expected {
                self.fail(format!(
                    "{event:?}: unblocked {unblocked:?}, model {expected:?}"
                ));
            }
        }
        for action in actions {
            match action {
                Action::Unblock(client) => {
                    let id = client as WaiterId;
                    match self.order {
                        Order::Sync => self.callback(id),
                        Order::Deferred => self.pending.push(id),
                    }
                }
                Action::Reply { result, .. } => match replying {
                    Some(id) => self.replied(id, result),
                    None => self.fail(format!("a reply outside a callback: {event:?}")),
                },
                Action::Abandoned { .. } => {}
            }
        }
    }

    fn callback(&mut self, id: WaiterId) {
        let now_ms = self.sim.now_ms;
        self.dispatch(Event::Unblocked { id, now_ms }, Some(Vec::new()));
    }

    fn replied(&mut self, id: WaiterId, result: Result<Outcome, TbError>) {
        let owed = self.model.owed.get(&id).cloned();
        let ok = match (&owed, &result) {
            (Some(Owed::Grant(remaining, reset)), Ok(outcome)) => {
                outcome.allowed
                    && outcome.remaining == *remaining
                    && outcome.reset_after_ms == *reset
            }
            (Some(Owed::Denial), Ok(outcome)) => !outcome.allowed,
            // A timed-out waiter whose bucket turned into another type.
            (Some(Owed::Denial), Err(TbError::BucketGone)) => true,
            (Some(Owed::Error(expected)), Err(error)) => expected == error,
            _ => false,
        };
        if !ok {
            self.fail(format!("waiter {id} owed {owed:?}, replied {result:?}"));
        }
        self.model.owed.insert(id, Owed::Answered);
    }

    /// The server's timers due by now, in order, then the deferred
    /// callbacks (before the event loop sleeps), until nothing is due.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            if let Some(what) = self.sim.timers.take_due(self.sim.now_ms) {
                self.fire(what);
                continue;
            }
            if self.pending.is_empty() {
                return;
            }
            for id in std::mem::take(&mut self.pending) {
                self.callback(id);
            }
        }
        self.fail("the timers never settle".into());
    }

    fn fire(&mut self, what: TimerFor) {
        let now_ms = self.sim.now_ms;
        match what {
            TimerFor::Wake(key, token) => {
                let may_write = !self.sim.paused;
                let (ended, written) = if may_write {
                    self.model.drive(&key, now_ms, &self.sim)
                } else {
                    (Vec::new(), None)
                };
                // The model's view is only comparable for the wake-up the
                // machine holds for this key (a stale token is ignored).
                let current = self
                    .machine
                    .queue(key.0, &key.1)
                    .is_some_and(|queue| queue.timer.is_some_and(|(_, _, own)| own == token));
                let expected = current.then(|| ended.iter().map(|(id, _)| *id).collect());
                if current {
                    // Owed before the event: a synchronous callback replies
                    // inside it.
                    for (id, owed) in &ended {
                        self.model.remove(*id);
                        self.model.owed.insert(*id, owed.clone());
                    }
                }
                let before = self.sim.keyspace.keys.get(&key).copied();
                self.sim.keyspace.written.clear();
                self.dispatch(
                    Event::Wake {
                        db: key.0,
                        key: &key.1,
                        token,
                        now_ms,
                    },
                    expected,
                );
                let stored = self
                    .sim
                    .keyspace
                    .written
                    .first()
                    .map(|(_, state, _)| *state);
                if current && !self.sim.keyspace.fail_writes && stored != written {
                    self.fail(format!(
                        "{key:?}: stored {stored:?}, model {written:?} from {before:?}"
                    ));
                }
            }
            TimerFor::Deadline(id) => {
                let late = self
                    .model
                    .queues
                    .values()
                    .flatten()
                    .any(|w| w.id == id && w.deadline_ms.is_some_and(|d| now_ms >= d));
                if late {
                    self.model.remove(id);
                    self.model.owed.insert(id, Owed::Denial);
                }
                let expected = if late { vec![id] } else { Vec::new() };
                self.dispatch(Event::Deadline { id, now_ms }, Some(expected));
            }
        }
    }

    fn key(db: u8, key: u8) -> Key {
        (Db::from(db), vec![b'k', key])
    }

    /// A client in the state `wanted`, picked by `pick`.
    fn pick(&self, pick: u8, wanted: &[Owed]) -> Option<WaiterId> {
        let mut ids: Vec<WaiterId> = self
            .model
            .owed
            .iter()
            .filter(|(_, owed)| {
                wanted.contains(owed)
                    || (wanted.contains(&Owed::Denial)
                        && **owed != Owed::Waiting
                        && **owed != Owed::Answered
                        && **owed != Owed::Gone)
            })
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        (!ids.is_empty()).then(|| ids[usize::from(pick) % ids.len()])
    }

    fn changed(&mut self, key: &Key) {
        let now_ms = self.sim.now_ms;
        self.dispatch(
            Event::Changed {
                db: key.0,
                key: &key.1,
                now_ms,
            },
            Some(Vec::new()),
        );
    }

    fn apply(&mut self, op: &Op) {
        let now_ms = self.sim.now_ms;
        // Write commands do not run while writes are paused; CLIENT UNBLOCK,
        // CLIENT KILL, disconnects and time do.
        let write_command = !matches!(
            op,
            Op::Advance(_)
                | Op::Unblock(_)
                | Op::Kill(_)
                | Op::Pause
                | Op::Resume
                | Op::FailWrites(_)
        );
        if write_command && self.sim.paused {
            return;
        }
        match *op {
            Op::Arrive {
                db,
                key,
                n,
                capacity,
                rate,
                timeout,
            } => {
                let key = Run::key(db, key);
                let limit = Limit {
                    capacity: f64::from(capacity),
                    refill_per_sec: RATES[usize::from(rate) % RATES.len()],
                };
                let n = f64::from(n);
                let timeout_ms = TIMEOUTS[usize::from(timeout) % TIMEOUTS.len()];
                let state = match self.sim.keyspace.keys.get(&key) {
                    Some(Value::Other) => return, // WRONGTYPE at once
                    Some(Value::Bucket(state)) => Some(*state),
                    None => None,
                };
                // TB.BTAKE's own judgement, as the command makes it.
                let outcome = match self.machine.queued(key.0, &key.1) {
                    Some(queued) => bucket::take_behind(state, &limit, n, queued, now_ms),
                    None => bucket::take(state, &limit, n, now_ms),
                };
                if outcome.allowed || outcome.retry_after_ms <= 0 {
                    if let Some(after) = outcome.write {
                        self.sim
                            .keyspace
                            .keys
                            .insert(key.clone(), Value::Bucket(after));
                        self.changed(&key);
                    }
                    return;
                }
                let id = self.machine.reserve();
                self.model
                    .queues
                    .entry(key.clone())
                    .or_default()
                    .push(Expected {
                        id,
                        limit,
                        n,
                        deadline_ms: (timeout_ms > 0).then(|| now_ms + timeout_ms),
                    });
                self.model.owed.insert(id, Owed::Waiting);
                self.dispatch(
                    Event::Arrive(Arrival {
                        id,
                        client: id as Client,
                        db: key.0,
                        key: &key.1,
                        request: Request { limit, n },
                        timeout_ms,
                        retry_after_ms: outcome.retry_after_ms,
                        now_ms,
                    }),
                    Some(Vec::new()),
                );
            }
            Op::Advance(ms) => {
                self.sim.timers.newest_first = ms % 2 == 1;
                // In steps, so every timer fires at its own instant.
                let target = now_ms + i64::from(ms);
                while self.sim.now_ms < target {
                    let next = self
                        .sim
                        .timers
                        .next_after(self.sim.now_ms)
                        .unwrap_or(target)
                        .min(target);
                    self.sim.now_ms = next;
                    self.settle();
                }
            }
            Op::Refund { db, key, amount } => {
                let key = Run::key(db, key);
                if let Some(Value::Bucket(state)) = self.sim.keyspace.keys.get(&key).copied() {
                    // Uncapped: the model reads the same bucket back.
                    self.sim.keyspace.keys.insert(
                        key.clone(),
                        Value::Bucket(State {
                            tokens: state.tokens + f64::from(amount),
                            ..state
                        }),
                    );
                    self.changed(&key);
                }
            }
            Op::Delete { db, key } => {
                let key = Run::key(db, key);
                if self.sim.keyspace.keys.remove(&key).is_some() {
                    self.changed(&key);
                }
            }
            Op::Overwrite { db, key } => {
                let key = Run::key(db, key);
                self.sim.keyspace.keys.insert(key.clone(), Value::Other);
                self.changed(&key);
            }
            Op::Flush(db) => {
                let db = db.map(Db::from);
                self.sim
                    .keyspace
                    .keys
                    .retain(|(kdb, _), _| db.is_some_and(|db| db != *kdb));
                self.dispatch(Event::Flushed { db, now_ms }, Some(Vec::new()));
            }
            Op::Swap => {
                let swapped = self
                    .sim
                    .keyspace
                    .keys
                    .drain()
                    .map(|((db, key), value)| ((1 - db, key), value))
                    .collect();
                self.sim.keyspace.keys = swapped;
                self.dispatch(Event::Swapped { a: 0, b: 1, now_ms }, Some(Vec::new()));
            }
            Op::Unblock(pick) => {
                // CLIENT UNBLOCK: the server runs the callback at once, on
                // a waiting client or one whose deferred callback is due.
                let Some(id) = self.pick(pick, &[Owed::Waiting, Owed::Denial]) else {
                    return;
                };
                if self.model.owed.get(&id) == Some(&Owed::Waiting) {
                    self.model.remove(id);
                    self.model.owed.insert(id, Owed::Denial);
                }
                self.pending.retain(|pending| *pending != id);
                self.callback(id);
            }
            Op::Kill(pick) => {
                let Some(id) = self.pick(pick, &[Owed::Waiting, Owed::Denial]) else {
                    return;
                };
                self.model.remove(id);
                self.model.owed.insert(id, Owed::Gone);
                self.pending.retain(|pending| *pending != id);
                self.dispatch(Event::Left { id, now_ms }, Some(Vec::new()));
                self.dispatch(Event::Freed { id }, Some(Vec::new()));
            }
            Op::Pause => self.sim.paused = true,
            Op::Resume => {
                if self.sim.paused {
                    self.resumed_ms = now_ms;
                }
                self.sim.paused = false;
            }
            Op::FailWrites(fail) => self.sim.keyspace.fail_writes = fail,
        }
        self.settle();
    }

    /// What must hold between any two steps.
    fn check(&mut self) {
        let now_ms = self.sim.now_ms;
        // Memory follows the live waiters: a record for each client still
        // owed a reply, nothing for those answered or gone.
        let live = self
            .model
            .owed
            .values()
            .filter(|owed| !matches!(owed, Owed::Answered | Owed::Gone))
            .count();
        if self.machine.waiting() != live {
            self.fail(format!(
                "{} records, {live} live waiters",
                self.machine.waiting()
            ));
        }
        let mut wrong = Vec::new();
        for (key, queue) in &self.model.queues {
            let ids: Vec<WaiterId> = queue.iter().map(|w| w.id).collect();
            let machine_ids = self.machine.queued_ids(key.0, &key.1);
            if ids != machine_ids {
                wrong.push(format!("{key:?}: model {ids:?}, machine {machine_ids:?}"));
            }
            let queued = self.machine.queued(key.0, &key.1).unwrap_or(0.0);
            if !queue.is_empty() && (queued - self.model.queued(key)).abs() > 1e-6 {
                wrong.push(format!("{key:?}: queued {queued}"));
            }
        }
        self.sim.violations.extend(wrong);
        let (wakes, deadlines) = self.sim.timers.counts();
        let keys = self.model.queues.values().filter(|q| !q.is_empty()).count();
        if wakes != keys {
            self.fail(format!("{wakes} wake-ups for {keys} keys with waiters"));
        }
        let timed: usize = self
            .model
            .queues
            .values()
            .flatten()
            .filter(|w| w.deadline_ms.is_some())
            .count();
        if deadlines != timed {
            self.fail(format!(
                "{deadlines} deadline timers for {timed} waiters with one"
            ));
        }
        // Nobody left waiting whose turn has come, unless writes are paused
        // (or were, too recently for the machine to have looked again).
        if !self.sim.paused && now_ms >= self.resumed_ms + PAUSED_RECHECK_MS {
            let model_drives: Vec<Key> = self.model.queues.keys().cloned().collect();
            for key in model_drives {
                let (ended, _) = self.model.drive(&key, now_ms, &self.sim);
                if !ended.is_empty() {
                    self.fail(format!("{key:?} at {now_ms}: {ended:?} not ended in time"));
                }
            }
        }
        if !self.pending.is_empty() {
            self.fail("deferred callbacks left after the loop slept".into());
        }
    }

    /// Ends the run: writes resume, every waiter is unblocked by hand, and
    /// each client must then have been answered exactly once.
    fn finish(&mut self) {
        self.sim.paused = false;
        self.sim.keyspace.fail_writes = false;
        for _ in 0..1000 {
            let Some(id) = self.pick(0, &[Owed::Waiting]) else {
                break;
            };
            self.apply(&Op::Unblock(0));
            let _ = id;
        }
        self.settle();
        for (id, owed) in &self.model.owed {
            if !matches!(owed, Owed::Answered | Owed::Gone) {
                self.sim
                    .violations
                    .push(format!("waiter {id} never answered: {owed:?}"));
            }
        }
        if !self.machine.is_empty() || !self.sim.timers.is_empty() {
            let why = format!(
                "left behind: {:?} timers {:?}",
                self.machine, self.sim.timers
            );
            self.fail(why);
        }
    }
}

fn run(order: Order, ops: &[Op]) -> Result<(), TestCaseError> {
    let mut run = Run::new(order);
    for (step, op) in ops.iter().enumerate() {
        run.apply(op);
        run.check();
        if !run.sim.violations.is_empty() {
            return Err(TestCaseError::fail(format!(
                "step {step} {op:?}: {:?}",
                run.sim.violations
            )));
        }
    }
    run.finish();
    prop_assert!(run.sim.violations.is_empty(), "{:?}", run.sim.violations);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    /// Any sequence of server events, callbacks run inside the unblock.
    #[test]
    fn every_event_sequence_keeps_the_rules_with_synchronous_callbacks(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(Order::Sync, &ops)?;
    }

    /// The same, with callbacks deferred to before the event loop sleeps.
    #[test]
    fn every_event_sequence_keeps_the_rules_with_deferred_callbacks(
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        run(Order::Deferred, &ops)?;
    }
}

/// Whose tokens exist at the very ms its timeout ends is not served,
/// whichever timer the server fires first.
#[test]
fn a_waiter_is_never_served_at_its_deadline() {
    for order in [Order::Sync, Order::Deferred] {
        // Two waiters alike but for their timeout (an index into TIMEOUTS).
        let arrive = |timeout| Op::Arrive {
            db: 0,
            key: 0,
            n: 1,
            capacity: 1,
            rate: 2,
            timeout,
        };
        let ops = [arrive(0), arrive(1), Op::Advance(1)];
        run(order, &ops).unwrap();
    }
}

/// A bare machine on a simulated server, driven by hand: nothing else
/// allocates between two measurements.
struct Bare {
    machine: Machine,
    sim: Sim,
}

impl Bare {
    fn new() -> Bare {
        let mut sim = Sim::starting_at(START_MS);
        // A drained bucket that refills one token per 1000 s.
        let drained = State {
            tokens: 0.0,
            last_refill_ms: START_MS as f64,
        };
        sim.keyspace
            .keys
            .insert((0, b"k".to_vec()), Value::Bucket(drained));
        Bare {
            machine: Machine::default(),
            sim,
        }
    }

    /// Handles `event`, and the callbacks of whoever it unblocks.
    fn on(&mut self, event: Event<'_>) {
        for action in self.machine.on(event, &mut self.sim) {
            if let Action::Unblock(client) = action {
                let now_ms = self.sim.now_ms;
                let id = client as WaiterId;
                self.machine
                    .on(Event::Unblocked { id, now_ms }, &mut self.sim);
            }
        }
    }

    fn arrive(&mut self, timeout_ms: i64) -> WaiterId {
        let id = self.machine.reserve();
        let now_ms = self.sim.now_ms;
        self.on(Event::Arrive(Arrival {
            id,
            client: id as Client,
            db: 0,
            key: b"k",
            request: Request {
                limit: Limit {
                    capacity: 10.0,
                    refill_per_sec: 0.001,
                },
                n: 1.0,
            },
            timeout_ms,
            retry_after_ms: 1_000_000,
            now_ms,
        }));
        id
    }

    /// Fires the deadline timers due by now.
    fn fire_deadlines(&mut self) {
        let due: Vec<(TimerId, WaiterId)> = self
            .sim
            .timers
            .armed
            .iter()
            .filter_map(|(timer, (at, what))| match what {
                TimerFor::Deadline(id) if *at <= self.sim.now_ms => Some((*timer, *id)),
                _ => None,
            })
            .collect();
        for (timer, id) in due {
            self.sim.timers.armed.remove(&timer);
            let now_ms = self.sim.now_ms;
            self.on(Event::Deadline { id, now_ms });
        }
    }
}

/// Issue: 200,000 short waits behind one long one used to leave 7 bytes
/// each behind until the head left. Now what they leave is nothing.
#[test]
fn waiters_that_left_leave_nothing_behind() {
    let mut bare = Bare::new();
    bare.arrive(0); // the head, for good
    for _ in 0..1_000 {
        bare.arrive(1);
        bare.sim.now_ms += 1;
        bare.fire_deadlines();
    }
    let before = crate::live_bytes();
    for _ in 0..200_000 {
        bare.arrive(1);
        bare.sim.now_ms += 1;
        bare.fire_deadlines();
    }
    let grown = crate::live_bytes() - before;
    assert_eq!(bare.machine.waiting(), 1);
    assert!(
        grown <= 0,
        "{grown} bytes kept for 200,000 waiters that left"
    );
}

/// The machine's memory follows the live waiters, and gives it back when
/// they go. Per waiter it keeps one record (its limit, n, deadline, the
/// client and timer handles, and its two queue links, 16 bytes of the
/// record, which are all the queue itself costs) in one hash map.
#[test]
fn memory_follows_the_live_waiters() {
    let mut bare = Bare::new();
    let before = crate::live_bytes();
    let ids: Vec<WaiterId> = (0..100_000).map(|_| bare.arrive(0)).collect();
    let per_waiter = (crate::live_bytes() - before - 800_000) / 100_000;
    eprintln!(
        "{per_waiter} bytes per live waiter (record {} bytes)",
        std::mem::size_of::<Waiter<Tokens>>()
    );
    assert!(per_waiter <= 256, "{per_waiter} bytes per live waiter");
    for id in ids {
        let now_ms = bare.sim.now_ms;
        bare.on(Event::Left { id, now_ms });
    }
    assert!(bare.machine.is_empty());
    // The ids vector is gone too by now; what stays is a small map kept
    // for the next waiters (at most 64 entries).
    let left = crate::live_bytes() - before;
    assert!(left <= 16_384, "{left} bytes kept after every waiter left");
}

/// The check every keyspace event makes while someone waits somewhere: a
/// key nobody waits on costs a lookup and allocates nothing.
#[test]
fn a_key_nobody_waits_on_costs_a_lookup_and_no_allocation() {
    let mut bare = Bare::new();
    bare.arrive(0);
    let before = crate::live_bytes();
    let mut seen = 0;
    for db in 0..16 {
        for key in [&b"other"[..], b"k2", b""] {
            seen += usize::from(bare.machine.queued(db, key).is_some());
        }
    }
    assert_eq!(seen, 0);
    assert_eq!(crate::live_bytes(), before);
    assert!(bare.machine.queued(0, b"k").is_some());
}

/// A second kind, as TB.ACQUIRE's will be: slots, each waiter wanting one
/// (weight 1), and a head that may fail on its own.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Slots;

/// A slot request; `fails`: serving it fails this waiter alone.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Slot {
    fails: bool,
}

impl Kind for Slots {
    type Request = Slot;
    /// Free slots, and how many were taken since the read.
    type State = (i64, i64);
    type Grant = i64;
    type Reply = Option<i64>;

    fn weight(_: &Slot) -> f64 {
        1.0
    }

    fn serve(state: &mut (i64, i64), slot: &Slot, _: i64) -> Result<(i64, bool), Unserved> {
        if slot.fails {
            return Err(Unserved::Failed(TbError::Internal));
        }
        if state.0 == 0 {
            return Err(Unserved::Later(100));
        }
        state.0 -= 1;
        state.1 += 1;
        Ok((state.0, true))
    }

    fn granted(left: i64) -> Option<i64> {
        Some(left)
    }

    fn denied(_: &(i64, i64), _: &Slot, _: f64, _: i64) -> Result<Option<i64>, TbError> {
        Ok(None)
    }

    fn denied_elsewhere(_: &Slot, _: i64) -> Option<i64> {
        None
    }
}

/// The free slots of every key, and the writes.
#[derive(Default)]
struct SlotServer {
    free: i64,
    writes: Vec<(i64, i64)>,
    timers: TimerId,
}

impl Server<Slots> for SlotServer {
    fn read(&mut self, _: Db, _: &[u8], _: i64) -> Result<(i64, i64), TbError> {
        Ok((self.free, 0))
    }

    fn write(&mut self, _: Db, _: &[u8], state: &(i64, i64), _: i64) -> Result<(), TbError> {
        self.free = state.0;
        self.writes.push(*state);
        Ok(())
    }

    fn writable(&mut self, _: Db, _: &[u8]) -> Writable {
        Writable::Yes
    }

    fn arm(&mut self, _: Timer<'_>, _: i64) -> TimerId {
        self.timers += 1;
        self.timers
    }

    fn cancel(&mut self, _: TimerId, _: bool) {}
}

/// The same machine serves another kind: heads in order, as many as the
/// state allows, one write for all, a failing head ended alone.
#[test]
fn another_kind_waits_in_the_same_machine() {
    let mut server = SlotServer::default();
    let mut machine = super::Machine::<Slots>::default();
    let now_ms = START_MS;
    let requests = [false, true, false, false];
    let mut ids = Vec::new();
    for fails in requests {
        let id = machine.reserve();
        ids.push(id);
        let arrival = super::Arrival::<Slots> {
            id,
            client: id as Client,
            db: 0,
            key: b"slots",
            request: Slot { fails },
            timeout_ms: 0,
            retry_after_ms: 100,
            now_ms,
        };
        assert!(machine
            .on(super::Event::Arrive(arrival), &mut server)
            .is_empty());
    }
    assert_eq!(machine.queued(0, b"slots"), Some(4.0));
    // Two free slots: the first head, the failing one, the third; the
    // fourth waits.
    server.free = 2;
    let token = machine
        .queue(0, b"slots")
        .and_then(|queue| queue.timer)
        .map(|(_, _, token)| token)
        .unwrap();
    let wake = super::Event::Wake {
        db: 0,
        key: b"slots",
        token,
        now_ms,
    };
    let actions = machine.on(wake, &mut server);
    machine.check().unwrap();
    let unblocked: Vec<super::Action<Slots>> = [ids[1], ids[0], ids[2]]
        .iter()
        .map(|id| super::Action::Unblock(*id as Client))
        .collect();
    assert_eq!(actions, unblocked);
    assert_eq!(server.writes, vec![(0, 2)]);
    assert_eq!(machine.queued_ids(0, b"slots"), vec![ids[3]]);
    let replies: Vec<_> = ids
        .iter()
        .take(3)
        .flat_map(|id| machine.on(super::Event::Unblocked { id: *id, now_ms }, &mut server))
        .collect();
    let reply = |result| super::Action::Reply {
        result,
        key: Rc::from(&b"slots"[..]),
        request: Slot { fails: false },
        waited_ms: 0,
    };
    let failed = super::Action::Reply {
        result: Err(TbError::Internal),
        key: Rc::from(&b"slots"[..]),
        request: Slot { fails: true },
        waited_ms: 0,
    };
    assert_eq!(
        replies,
        vec![reply(Ok(Some(1))), failed, reply(Ok(Some(0)))]
    );
    // CLIENT UNBLOCK of the last: the kind's denial.
    let last = machine.on(super::Event::Unblocked { id: ids[3], now_ms }, &mut server);
    assert_eq!(last, vec![reply(Ok(None))]);
    assert!(machine.is_empty());
}
