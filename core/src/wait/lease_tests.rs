//! TB.ACQUIRE's waits (the kind `Leases`) in the waiting machine, against a
//! simulated server holding model lease sets on a virtual clock, under both
//! callback orders. The property: never more than `limit` live
//! leases at any instant; and for the waiters: first come first served per
//! key, nobody granted after its deadline, no id handed out twice (also
//! on a set made anew after a DEL, a flush or its expiry, which draws
//! another incarnation), and each wait ends exactly once.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};

use proptest::prelude::*;

use super::leases::{LeaseReply, Leases, LeasesServed};
use super::sim_timers::{self, Key, Keyspace, Order, TimerFor};
use super::*;
use crate::lease::{
    self, Acquire, Grant, Incarnation, LeaseId, LeaseLimit, SetIncarnation, SetView,
};

type Machine = super::Machine<Leases>;
type Event<'a> = super::Event<'a, Leases>;
type Action = super::Action<Leases>;

/// What limits the acquires of a run use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Limits {
    /// One limit per key for the whole run: live <= it at every instant.
    PerKey([i64; KEYS]),
    /// Each acquire its own, 1 to 4: a grant only while live < its own.
    Varying,
}

const START_MS: i64 = 1_764_633_600_000;
const KEYS: usize = 3;
const LEASE_MS: [i64; 5] = [1, 20, 100, 400, 1500];
/// `None`: no timeout argument (answered at once); `Some(0)`: no limit.
const TIMEOUTS: [Option<i64>; 7] = [
    None,
    Some(0),
    Some(0),
    Some(1),
    Some(20),
    Some(150),
    Some(600),
];

/// The model of one lease set: what the sorted set holds.
#[derive(Clone, Debug, Default)]
struct Set {
    /// Each lease's deadline.
    leases: HashMap<LeaseId, i64>,
    issued: i64,
    expire_at_ms: Option<i64>,
    /// `New` while the key is missing: a grant stores it.
    incarnation: SetIncarnation,
}

impl Set {
    fn live(&self, now_ms: i64) -> i64 {
        let live = self.leases.values().filter(|d| lease::is_live(**d, now_ms));
        live.count() as i64
    }

    /// The live leases, oldest id first.
    fn live_ids(&self, now_ms: i64) -> Vec<LeaseId> {
        let mut ids: Vec<LeaseId> = self
            .leases
            .iter()
            .filter(|(_, d)| lease::is_live(**d, now_ms))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable_by_key(|id| id.n);
        ids
    }

    /// What `LeaseSet::read` returns for it at `now_ms`.
    fn seen(&self, now_ms: i64) -> SetView {
        let live = self
            .leases
            .values()
            .copied()
            .filter(|d| lease::is_live(*d, now_ms));
        SetView {
            live: self.live(now_ms),
            earliest_deadline_ms: live.min(),
            issued: self.issued,
            expire_at_ms: self.expire_at_ms,
            latest_deadline_ms: self
                .expire_at_ms
                .is_none()
                .then(|| self.leases.values().copied().max())
                .flatten(),
            incarnation: self.incarnation,
        }
    }

    /// Gone by its expiry (the server's rule: expired once now > when).
    fn expired(&self, now_ms: i64) -> bool {
        self.expire_at_ms.is_some_and(|at| now_ms > at)
    }
}

/// The simulated server's keys: lease sets.
#[derive(Default)]
struct LeaseSets {
    sets: HashMap<Key, Set>,
    /// The machine's writes during the event being handled: the key, the
    /// live leases before, the grants stored.
    written: Vec<(Key, i64, Vec<Grant>)>,
    /// Every id ever handed out on a key: a set made anew (after a DEL, a
    /// flush or its expiry) starts its count again, at instants its
    /// predecessors may have used, but with an incarnation of its own.
    handed_out: HashMap<Key, HashSet<LeaseId>>,
    /// The server's random source, as distinct draws.
    draws: Cell<u64>,
}

type Sim = sim_timers::Sim<LeaseSets>;

impl Sim {
    /// The lease set at `key` as a command sees it now; a missing one with
    /// the incarnation drawn for it, as `LeaseSet::read` draws one.
    fn set(&self, key: &Key) -> Set {
        match self.keyspace.sets.get(key) {
            Some(set) if !set.expired(self.now_ms) => set.clone(),
            _ => {
                let draw = self.keyspace.draws.get() + 1;
                self.keyspace.draws.set(draw);
                Set {
                    incarnation: SetIncarnation::New(Incarnation::from_random(draw << 11)),
                    ..Set::default()
                }
            }
        }
    }

    /// Stores `grants` at `key` as `LeaseSet::grant` does; returns the
    /// live leases before.
    fn store(&mut self, key: &Key, grants: &[Grant], now_ms: i64) -> i64 {
        let mut set = self.set(key);
        let before = set.live(now_ms);
        // The write removes ended leases (at most 64; these sets are small).
        set.leases.retain(|_, d| lease::is_live(*d, now_ms));
        let handed_out = self.keyspace.handed_out.entry(key.clone()).or_default();
        for grant in grants {
            let mut wrong = Vec::new();
            if grant.id.n != set.issued + 1 || grant.id.granted_ms != now_ms {
                wrong.push(format!("grant {grant:?} after {} issued", set.issued));
            }
            // The grant that makes the set stores the incarnation its id
            // carries; every other grant carries the stored one.
            match set.incarnation {
                SetIncarnation::New(_) => match grant.new_incarnation {
                    Some(made) if grant.id.incarnation == Some(made) => {
                        set.incarnation = SetIncarnation::Stored(made);
                    }
                    _ => wrong.push(format!(
                        "grant {grant:?} makes the set without its incarnation"
                    )),
                },
                SetIncarnation::Stored(stored) => {
                    if grant.id.incarnation != Some(stored) || grant.new_incarnation.is_some() {
                        wrong.push(format!(
                            "grant {grant:?} on a set of incarnation {stored:?}"
                        ));
                    }
                }
                SetIncarnation::Legacy => wrong.push(format!("a set without incarnation: {set:?}")),
            }
            if !lease::is_live(grant.deadline_ms, now_ms) {
                wrong.push(format!("grant {grant:?} ended at once"));
            }
            if !handed_out.insert(grant.id) {
                wrong.push(format!("{key:?}: id {:?} handed out twice", grant.id));
            }
            self.violations.extend(wrong);
            set.leases.insert(grant.id, grant.deadline_ms);
            set.issued = grant.id.n;
            if let Some(at) = grant.expire_at_ms {
                if set.expire_at_ms.is_some_and(|current| at < current) {
                    self.violations
                        .push(format!("{key:?}: expiry shrinks to {at}"));
                }
                set.expire_at_ms = Some(at);
            }
        }
        let latest = set.leases.values().copied().max();
        if latest.is_some_and(|latest| set.expire_at_ms.is_none_or(|at| at < latest)) {
            self.violations
                .push(format!("{key:?}: expires before a lease: {set:?}"));
        }
        self.keyspace.sets.insert(key.clone(), set);
        before
    }
}

impl Keyspace<Leases> for LeaseSets {
    fn read(sim: &mut Sim, db: Db, key: &[u8], now_ms: i64) -> Result<LeasesServed, TbError> {
        sim.check_clock("read", now_ms);
        let seen = sim.set(&(db, key.to_vec())).seen(now_ms);
        Ok(LeasesServed::read_as(seen))
    }

    fn write(
        sim: &mut Sim,
        db: Db,
        key: &[u8],
        served: &LeasesServed,
        now_ms: i64,
    ) -> Result<(), TbError> {
        if served.grants().is_empty() {
            sim.violations.push(format!("write of no grant to {key:?}"));
        }
        let key = (db, key.to_vec());
        let before = sim.store(&key, served.grants(), now_ms);
        sim.keyspace
            .written
            .push((key, before, served.grants().to_vec()));
        Ok(())
    }
}

/// A waiting TB.ACQUIRE as the model sees it.
#[derive(Clone, Debug)]
struct Waiter {
    key: Key,
    limit: LeaseLimit,
    deadline_ms: Option<i64>,
}

/// What a client is owed.
#[derive(Clone, Debug, PartialEq)]
enum Owed {
    Waiting,
    /// Unblocked with this lease; its callback must reply it.
    Grant(LeaseId),
    /// Timed out, or CLIENT UNBLOCK: a denial.
    Denial,
    Answered,
    /// Disconnected or killed: owed nothing.
    Gone,
}

/// How often each way of ending happened, over a run.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    at_once: u64,
    waited: u64,
    /// Wake-ups that served more than one waiter with one write.
    batches: u64,
    timed_out: u64,
    unblocked: u64,
    abandoned: u64,
    /// Releases, renewals, DELs and flushes that found something.
    releases: u64,
    renewals: u64,
    deletes: u64,
}

/// One step of a random run.
#[derive(Clone, Debug)]
enum Op {
    Arrive {
        key: u8,
        limit: u8,
        lease: u8,
        timeout: u8,
    },
    Advance(u16),
    Release {
        key: u8,
        pick: u8,
    },
    Renew {
        key: u8,
        pick: u8,
        lease: u8,
    },
    Delete {
        key: u8,
    },
    Flush(Option<u8>),
    Unblock(u8),
    Kill(u8),
    Pause,
    Resume,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => (0u8..3, 1u8..5, any::<u8>(), any::<u8>()).prop_map(
            |(key, limit, lease, timeout)| Op::Arrive { key, limit, lease, timeout }
        ),
        5 => (0u16..200).prop_map(Op::Advance),
        4 => (0u8..3, any::<u8>()).prop_map(|(key, pick)| Op::Release { key, pick }),
        2 => (0u8..3, any::<u8>(), any::<u8>())
            .prop_map(|(key, pick, lease)| Op::Renew { key, pick, lease }),
        1 => (0u8..3).prop_map(|key| Op::Delete { key }),
        1 => proptest::option::of(0u8..2).prop_map(Op::Flush),
        2 => any::<u8>().prop_map(Op::Unblock),
        2 => any::<u8>().prop_map(Op::Kill),
        1 => Just(Op::Pause),
        2 => Just(Op::Resume),
    ]
}

/// The machine, the simulated server and the model, run together.
struct Run {
    order: Order,
    limits: Limits,
    machine: Machine,
    sim: Sim,
    /// Every waiter of the run, by id (ids grow with arrival).
    waiters: HashMap<WaiterId, Waiter>,
    owed: HashMap<WaiterId, Owed>,
    /// Who still waits on each key, in arrival order.
    queues: HashMap<Key, Vec<WaiterId>>,
    /// Unblocked clients whose deferred callback has yet to run.
    pending: Vec<WaiterId>,
    /// When writes last resumed: the machine notices within
    /// `PAUSED_RECHECK_MS`.
    resumed_ms: i64,
    tally: Tally,
}

impl Run {
    fn new(order: Order, limits: Limits) -> Run {
        Run {
            order,
            limits,
            machine: Machine::default(),
            sim: Sim::starting_at(START_MS),
            waiters: HashMap::new(),
            owed: HashMap::new(),
            queues: HashMap::new(),
            pending: Vec::new(),
            resumed_ms: 0,
            tally: Tally::default(),
        }
    }

    fn fail(&mut self, why: String) {
        self.sim.violations.push(why);
    }

    /// Keys 0 and 2 share a name in two databases.
    fn key(key: u8) -> Key {
        match key % KEYS as u8 {
            0 => (0, b"a".to_vec()),
            1 => (0, b"b".to_vec()),
            _ => (1, b"a".to_vec()),
        }
    }

    fn key_limit(&self, key: &Key) -> Option<i64> {
        match self.limits {
            Limits::PerKey(limits) => {
                let index = (0..KEYS as u8).position(|k| Run::key(k) == *key)?;
                Some(limits[index])
            }
            Limits::Varying => None,
        }
    }

    /// Hands an event to the machine and carries out its actions as the
    /// server would, checking whoever it unblocks against the model.
    fn dispatch(&mut self, event: Event<'_>) {
        let replying = match event {
            Event::Unblocked { id, .. } => Some(id),
            _ => None,
        };
        let leaving = matches!(event, Event::Left { .. });
        self.sim.keyspace.written.clear();
        let actions = self.machine.on(event, &mut self.sim);
        if let Err(why) = self.machine.check() {
            self.fail(format!("after {event:?}: {why}"));
        }
        let written = std::mem::take(&mut self.sim.keyspace.written);
        // How each unblocked waiter's wait ended, read before any callback
        // runs (a synchronous one forgets it).
        let ended: Vec<(WaiterId, Option<Phase<Grant>>)> = actions
            .iter()
            .filter_map(|action| match action {
                Action::Unblock(client) => {
                    let id = *client as WaiterId;
                    Some((id, self.machine.waiters.get(&id).map(|w| w.phase)))
                }
                _ => None,
            })
            .collect();
        self.ended(&event, &ended, &written);
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
                Action::Abandoned { .. } => {
                    if !leaving {
                        self.fail(format!("abandoned at {event:?}"));
                    }
                    self.tally.abandoned += 1;
                }
            }
        }
    }

    /// Checks the waits one event ended against the model, and the grants
    /// its writes stored against the limits.
    fn ended(
        &mut self,
        event: &Event<'_>,
        ended: &[(WaiterId, Option<Phase<Grant>>)],
        written: &[(Key, i64, Vec<Grant>)],
    ) {
        let now_ms = self.sim.now_ms;
        let mut granted: HashMap<LeaseId, WaiterId> = HashMap::new();
        for (id, phase) in ended {
            let (id, phase) = (*id, *phase);
            if self.owed.get(&id) != Some(&Owed::Waiting) {
                let owed = self.owed.get(&id).cloned();
                self.fail(format!("{event:?} unblocked {id}, owed {owed:?}"));
                continue;
            }
            let Some(waiter) = self.waiters.get(&id).cloned() else {
                self.fail(format!("unblocked {id}, who never arrived"));
                continue;
            };
            if let Some(queue) = self.queues.get_mut(&waiter.key) {
                queue.retain(|other| *other != id);
            }
            let owed = match phase {
                Some(Phase::Granted(grant)) => {
                    if waiter.deadline_ms.is_some_and(|d| now_ms >= d) {
                        self.fail(format!("{id} granted at {now_ms}, after its deadline"));
                    }
                    if grant.deadline_ms != lease::deadline_ms(now_ms, waiter.limit.lease_ms) {
                        self.fail(format!("{id} granted {grant:?} for {:?}", waiter.limit));
                    }
                    if granted.insert(grant.id, id).is_some() {
                        self.fail(format!("lease {:?} granted to two waiters", grant.id));
                    }
                    self.tally.waited += 1;
                    Owed::Grant(grant.id)
                }
                Some(Phase::TimedOut) => {
                    if waiter.deadline_ms.is_none_or(|d| now_ms < d) {
                        self.fail(format!("{id} timed out at {now_ms}: {waiter:?}"));
                    }
                    self.tally.timed_out += 1;
                    Owed::Denial
                }
                other => {
                    self.fail(format!("{id} unblocked as {other:?}"));
                    Owed::Denial
                }
            };
            self.owed.insert(id, owed);
        }
        // First come first served: nobody granted while someone who came
        // before on the same key still waits.
        for id in granted.values() {
            let key = &self.waiters[id].key;
            let ahead: Vec<WaiterId> = self
                .queues
                .get(key)
                .map(|queue| queue.iter().copied().filter(|other| other < id).collect())
                .unwrap_or_default();
            if !ahead.is_empty() {
                let why = format!("{id} granted on {key:?} while {ahead:?} wait ahead");
                self.fail(why);
            }
        }
        // Every lease written went to one waiter of that key, each while
        // fewer than its limit were live.
        let mut stored = 0;
        for (key, before, grants) in written {
            if grants.len() > 1 {
                self.tally.batches += 1;
            }
            for (k, grant) in grants.iter().enumerate() {
                stored += 1;
                let live = before + k as i64;
                let Some(waiter) = granted.get(&grant.id).map(|id| &self.waiters[id]) else {
                    let why = format!("{key:?}: lease {grant:?} stored for nobody");
                    self.fail(why);
                    continue;
                };
                let mut wrong = Vec::new();
                if waiter.key != *key {
                    wrong.push(format!("{key:?}: lease for a waiter of {:?}", waiter.key));
                }
                if live >= waiter.limit.limit {
                    wrong.push(format!(
                        "{key:?}: granted with {live} live, limit {}",
                        waiter.limit.limit
                    ));
                }
                if grant.available != (waiter.limit.limit - live - 1).max(0) {
                    wrong.push(format!("{key:?}: {grant:?} with {live} live"));
                }
                self.sim.violations.extend(wrong);
            }
            if let Some(limit) = self.key_limit(key) {
                let after = before + grants.len() as i64;
                if after > limit {
                    self.fail(format!("{key:?}: {after} live, limit {limit}"));
                }
            }
        }
        if stored != granted.len() {
            self.fail(format!("{stored} leases stored, {} granted", granted.len()));
        }
    }

    fn callback(&mut self, id: WaiterId) {
        let now_ms = self.sim.now_ms;
        self.dispatch(Event::Unblocked { id, now_ms });
    }

    fn replied(&mut self, id: WaiterId, result: Result<LeaseReply, TbError>) {
        let owed = self.owed.get(&id).cloned();
        let ok = match (&owed, &result) {
            (Some(Owed::Grant(lease)), Ok(reply)) => {
                reply.id == Some(*lease) && reply.retry_after_ms == 0 && reply.available >= 0
            }
            (Some(Owed::Denial), Ok(reply)) => {
                reply.id.is_none() && reply.available >= 0 && reply.retry_after_ms >= 0
            }
            _ => false,
        };
        if !ok {
            self.fail(format!("waiter {id} owed {owed:?}, replied {result:?}"));
        }
        self.owed.insert(id, Owed::Answered);
    }

    /// The server's timers due by now, in order, then the deferred
    /// callbacks (before the event loop sleeps), until nothing is due.
    fn settle(&mut self) {
        for _ in 0..10_000 {
            if let Some(what) = self.sim.timers.take_due(self.sim.now_ms) {
                let now_ms = self.sim.now_ms;
                match what {
                    TimerFor::Wake((db, key), token) => self.dispatch(Event::Wake {
                        db,
                        key: &key,
                        token,
                        now_ms,
                    }),
                    TimerFor::Deadline(id) => self.dispatch(Event::Deadline { id, now_ms }),
                }
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

    /// The keyspace notification of a write (or DEL, or expiry) of `key`.
    fn changed(&mut self, key: &Key) {
        let now_ms = self.sim.now_ms;
        self.dispatch(Event::Changed {
            db: key.0,
            key: &key.1,
            now_ms,
        });
    }

    /// Keys whose expiry has passed go, with their notification (not while
    /// writes are paused; a command reads them as missing regardless).
    fn expire(&mut self) {
        if self.sim.paused {
            return;
        }
        let now_ms = self.sim.now_ms;
        let mut gone: Vec<Key> = self
            .sim
            .keyspace
            .sets
            .iter()
            .filter(|(_, set)| set.expired(now_ms))
            .map(|(key, _)| key.clone())
            .collect();
        gone.sort();
        for key in gone {
            self.sim.keyspace.sets.remove(&key);
            self.changed(&key);
        }
    }

    /// A client in one of the states `wanted`, picked by `pick`.
    fn pick(&self, pick: u8, wanted: &[&Owed]) -> Option<WaiterId> {
        let mut ids: Vec<WaiterId> = self
            .owed
            .iter()
            .filter(|(_, owed)| wanted.contains(owed))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        (!ids.is_empty()).then(|| ids[usize::from(pick) % ids.len()])
    }

    /// A client still owed a reply: waiting, or its deferred callback due.
    fn pick_owed(&self, pick: u8) -> Option<WaiterId> {
        let mut ids: Vec<WaiterId> = self
            .owed
            .iter()
            .filter(|(_, owed)| !matches!(owed, Owed::Answered | Owed::Gone))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        (!ids.is_empty()).then(|| ids[usize::from(pick) % ids.len()])
    }

    fn apply(&mut self, op: &Op) {
        let now_ms = self.sim.now_ms;
        // Write commands do not run while writes are paused; CLIENT
        // UNBLOCK, CLIENT KILL, disconnects and time do.
        let write_command = !matches!(
            op,
            Op::Advance(_) | Op::Unblock(_) | Op::Kill(_) | Op::Pause | Op::Resume
        );
        if write_command && self.sim.paused {
            return;
        }
        match *op {
            Op::Arrive {
                key,
                limit,
                lease,
                timeout,
            } => {
                let key = Run::key(key);
                let limit = LeaseLimit {
                    limit: self.key_limit(&key).unwrap_or(i64::from(limit)),
                    lease_ms: LEASE_MS[usize::from(lease) % LEASE_MS.len()],
                };
                let timeout_ms = TIMEOUTS[usize::from(timeout) % TIMEOUTS.len()];
                let seen = self.sim.set(&key).seen(now_ms);
                let waiting = self.machine.waiting_on(key.0, &key.1) as i64;
                // TB.ACQUIRE's own judgement, as the command makes it.
                match lease::acquire(&seen, &limit, waiting, now_ms) {
                    Ok(Acquire::Granted(grant)) => {
                        let before = self.sim.store(&key, &[grant], now_ms);
                        if before >= limit.limit || waiting > 0 {
                            self.fail(format!("{key:?}: granted at once, {before} live"));
                        }
                        self.tally.at_once += 1;
                        self.changed(&key);
                    }
                    Ok(Acquire::Denied { retry_after_ms, .. }) => {
                        if seen.live < limit.limit && waiting == 0 {
                            self.fail(format!("{key:?}: denied a free slot: {seen:?}"));
                        }
                        let Some(timeout_ms) = timeout_ms else {
                            return;
                        };
                        let id = self.machine.reserve();
                        self.waiters.insert(
                            id,
                            Waiter {
                                key: key.clone(),
                                limit,
                                deadline_ms: (timeout_ms > 0).then(|| now_ms + timeout_ms),
                            },
                        );
                        self.queues.entry(key.clone()).or_default().push(id);
                        self.owed.insert(id, Owed::Waiting);
                        self.dispatch(Event::Arrive(Arrival {
                            id,
                            client: id as Client,
                            db: key.0,
                            key: &key.1,
                            request: limit,
                            timeout_ms,
                            retry_after_ms,
                            now_ms,
                        }));
                    }
                    Err(error) => self.fail(format!("TB.ACQUIRE failed: {error:?}")),
                }
            }
            Op::Advance(ms) => {
                self.sim.timers.newest_first = ms % 2 == 1;
                // In steps, so every timer fires and every key expires at
                // its own instant.
                let target = now_ms + i64::from(ms);
                while self.sim.now_ms < target {
                    let now = self.sim.now_ms;
                    let timer = self.sim.timers.next_after(now);
                    let expiries = self
                        .sim
                        .keyspace
                        .sets
                        .values()
                        .filter_map(|s| s.expire_at_ms);
                    let next = timer
                        .into_iter()
                        .chain(expiries.map(|at| at + 1))
                        .filter(|at| *at > now)
                        .min()
                        .unwrap_or(target)
                        .min(target);
                    self.sim.now_ms = next;
                    self.expire();
                    self.settle();
                }
            }
            Op::Release { key, pick } => {
                let key = Run::key(key);
                let ids = self.sim.set(&key).live_ids(now_ms);
                let Some(lease) = ids.get(usize::from(pick) % ids.len().max(1)) else {
                    return; // TB.RELEASE 0: writes nothing
                };
                if let Some(set) = self.sim.keyspace.sets.get_mut(&key) {
                    set.leases.remove(lease);
                    set.leases.retain(|_, d| lease::is_live(*d, now_ms));
                }
                self.tally.releases += 1;
                self.changed(&key);
            }
            Op::Renew { key, pick, lease } => {
                let key = Run::key(key);
                let set = self.sim.set(&key);
                let ids = set.live_ids(now_ms);
                let Some(id) = ids.get(usize::from(pick) % ids.len().max(1)) else {
                    return;
                };
                let lease_ms = LEASE_MS[usize::from(lease) % LEASE_MS.len()];
                let current = set.leases.get(id).copied();
                let Some((deadline, expiry)) =
                    lease::renew(&set.seen(now_ms), current, lease_ms, now_ms)
                else {
                    self.fail(format!("renewal of live {id:?} refused"));
                    return;
                };
                if let Some(set) = self.sim.keyspace.sets.get_mut(&key) {
                    set.leases.insert(*id, deadline);
                    set.leases.retain(|_, d| lease::is_live(*d, now_ms));
                    if let Some(at) = expiry {
                        set.expire_at_ms = Some(at);
                    }
                }
                self.tally.renewals += 1;
                self.changed(&key);
            }
            Op::Delete { key } => {
                let key = Run::key(key);
                if self.sim.keyspace.sets.remove(&key).is_some() {
                    self.tally.deletes += 1;
                    self.changed(&key);
                }
            }
            Op::Flush(db) => {
                let db = db.map(Db::from);
                let kept = |(kdb, _): &Key| db.is_some_and(|db| db != *kdb);
                self.sim.keyspace.sets.retain(|key, _| kept(key));
                self.tally.deletes += 1;
                self.dispatch(Event::Flushed { db, now_ms });
            }
            Op::Unblock(pick) => {
                // CLIENT UNBLOCK: the server runs the callback at once, on
                // a waiting client or one whose deferred callback is due.
                let Some(id) = self.pick_owed(pick) else {
                    return;
                };
                if self.owed.get(&id) == Some(&Owed::Waiting) {
                    if let Some(queue) = self.queues.get_mut(&self.waiters[&id].key) {
                        queue.retain(|other| *other != id);
                    }
                    self.owed.insert(id, Owed::Denial);
                    self.tally.unblocked += 1;
                }
                self.pending.retain(|pending| *pending != id);
                self.callback(id);
            }
            Op::Kill(pick) => {
                let Some(id) = self.pick_owed(pick) else {
                    return;
                };
                if let Some(queue) = self.queues.get_mut(&self.waiters[&id].key) {
                    queue.retain(|other| *other != id);
                }
                // A lease granted to it stays taken until it ends.
                self.owed.insert(id, Owed::Gone);
                self.pending.retain(|pending| *pending != id);
                self.dispatch(Event::Left { id, now_ms });
                self.dispatch(Event::Freed { id });
            }
            Op::Pause => self.sim.paused = true,
            Op::Resume => {
                if self.sim.paused {
                    self.resumed_ms = now_ms;
                }
                self.sim.paused = false;
                self.expire();
            }
        }
        self.settle();
    }

    /// What must hold between any two steps.
    fn check(&mut self) {
        let now_ms = self.sim.now_ms;
        let mut wrong = Vec::new();
        let live_waits = self
            .owed
            .values()
            .filter(|owed| !matches!(owed, Owed::Answered | Owed::Gone))
            .count();
        if self.machine.waiting() != live_waits {
            wrong.push(format!(
                "{} records, {live_waits} waits",
                self.machine.waiting()
            ));
        }
        for k in 0..KEYS as u8 {
            let key = Run::key(k);
            let queue = self.queues.get(&key).cloned().unwrap_or_default();
            let machine_ids = self.machine.queued_ids(key.0, &key.1);
            if queue != machine_ids {
                wrong.push(format!("{key:?}: model {queue:?}, machine {machine_ids:?}"));
            }
            let set = self.sim.set(&key);
            let live = set.live(now_ms);
            if let Some(limit) = self.key_limit(&key) {
                if live > limit {
                    wrong.push(format!("{key:?}: {live} live, limit {limit}"));
                }
            }
            // Nobody left waiting whose turn has come, unless writes are
            // paused (or were, too recently for the machine to look again).
            let looked = !self.sim.paused && now_ms >= self.resumed_ms + PAUSED_RECHECK_MS;
            if let Some(head) = queue.first().filter(|_| looked) {
                let waiter = &self.waiters[head];
                if waiter.deadline_ms.is_some_and(|d| now_ms >= d) {
                    wrong.push(format!("{key:?}: {head} waits past its deadline"));
                } else if live < waiter.limit.limit {
                    wrong.push(format!("{key:?}: {head} waits with {live} live: {set:?}"));
                }
            }
        }
        let (wakes, deadlines) = self.sim.timers.counts();
        let keys = self.queues.values().filter(|q| !q.is_empty()).count();
        if wakes != keys {
            wrong.push(format!("{wakes} wake-ups for {keys} keys with waiters"));
        }
        let timed = self
            .queues
            .values()
            .flatten()
            .filter(|id| self.waiters[*id].deadline_ms.is_some())
            .count();
        if deadlines != timed {
            wrong.push(format!(
                "{deadlines} deadline timers, {timed} waiters with one"
            ));
        }
        if !self.pending.is_empty() {
            wrong.push("deferred callbacks left after the loop slept".into());
        }
        self.sim.violations.extend(wrong);
    }

    /// Ends the run: writes resume, every waiter left is unblocked by hand,
    /// and each client must then have been answered exactly once.
    fn finish(&mut self) {
        self.apply(&Op::Resume);
        while let Some(id) = self.pick(0, &[&Owed::Waiting]) {
            let before = self.owed.get(&id).cloned();
            self.apply(&Op::Unblock(0));
            if self.owed.get(&id) == before.as_ref() {
                self.fail(format!("{id} cannot be unblocked"));
                break;
            }
        }
        self.settle();
        let mut wrong = Vec::new();
        for (id, owed) in &self.owed {
            if !matches!(owed, Owed::Answered | Owed::Gone) {
                wrong.push(format!("waiter {id} never answered: {owed:?}"));
            }
        }
        self.sim.violations.extend(wrong);
        if !self.machine.is_empty() || !self.sim.timers.is_empty() {
            let why = format!(
                "left behind: {:?} timers {:?}",
                self.machine, self.sim.timers
            );
            self.fail(why);
        }
    }
}

fn run(order: Order, limits: Limits, ops: &[Op]) -> Result<Tally, TestCaseError> {
    let mut run = Run::new(order, limits);
    for (step, op) in ops.iter().enumerate() {
        run.apply(op);
        run.check();
        if !run.sim.violations.is_empty() {
            return Err(TestCaseError::fail(format!(
                "step {step} {op:?} at {}: {:?}",
                run.sim.now_ms - START_MS,
                run.sim.violations
            )));
        }
    }
    run.finish();
    prop_assert!(run.sim.violations.is_empty(), "{:?}", run.sim.violations);
    Ok(run.tally)
}

fn order() -> impl Strategy<Value = Order> {
    prop_oneof![Just(Order::Sync), Just(Order::Deferred)]
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(op(), 1..150)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 500, ..ProptestConfig::default() })]

    /// One limit per key for the whole run: never more than it live at any
    /// instant, whoever acquires, waits, releases, renews, deletes,
    /// disconnects or pauses; waiters served first come first served,
    /// never after their deadline, each answered once.
    #[test]
    fn waiting_acquires_never_exceed_the_limit(
        order in order(),
        limits in proptest::array::uniform3(1i64..5),
        ops in ops(),
    ) {
        run(order, Limits::PerKey(limits), &ops)?;
    }

    /// Each acquire with its own limit: a lease is granted only while
    /// fewer than that acquire's limit are live, and the rest as above.
    #[test]
    fn waiting_acquires_with_their_own_limits_are_granted_only_below_them(
        order in order(),
        ops in ops(),
    ) {
        run(order, Limits::Varying, &ops)?;
    }
}

/// The runs above do exercise what they claim to: waits that end in a
/// grant (several in one write too), a timeout, CLIENT UNBLOCK and a
/// disconnect, under both orders and both kinds of limits.
#[test]
fn the_random_runs_reach_every_way_a_wait_ends() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut total = Tally::default();
    for case in 0..200 {
        let order = if case % 2 == 0 {
            Order::Sync
        } else {
            Order::Deferred
        };
        let limits = if case % 4 < 2 {
            Limits::PerKey([1, 2, 3])
        } else {
            Limits::Varying
        };
        let ops = ops().new_tree(&mut runner).unwrap().current();
        let tally = run(order, limits, &ops).unwrap();
        total.at_once += tally.at_once;
        total.waited += tally.waited;
        total.batches += tally.batches;
        total.timed_out += tally.timed_out;
        total.unblocked += tally.unblocked;
        total.abandoned += tally.abandoned;
        total.releases += tally.releases;
        total.renewals += tally.renewals;
        total.deletes += tally.deletes;
    }
    eprintln!("{total:?}");
    let Tally {
        at_once,
        waited,
        batches,
        timed_out,
        unblocked,
        abandoned,
        releases,
        renewals,
        deletes,
    } = total;
    for (what, count) in [
        ("at once", at_once),
        ("waited", waited),
        ("batches", batches),
        ("timed out", timed_out),
        ("unblocked", unblocked),
        ("abandoned", abandoned),
        ("releases", releases),
        ("renewals", renewals),
        ("deletes", deletes),
    ] {
        assert!(count > 0, "no {what} in 200 runs: {total:?}");
    }
}
