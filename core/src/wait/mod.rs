//! Waiting in the server, first come first served, as one explicit state
//! machine: `Machine::on(event)`.
//!
//! Pure and the same on every server: no Redis types, no clock of its own.
//! Generic over what is waited for, a [`Kind`]: TB.BTAKE waits for tokens
//! ([`tokens::Tokens`]), TB.ACQUIRE for a lease ([`leases::Leases`]). A kind
//! says what a waiter asks for, what the key holds, how one head is served
//! on it and what a waiter is told; the queues, timers, phases, deadlines,
//! pauses, flushes and unload below are written once for every kind. The
//! module keeps one machine per kind (src/server/machines.rs).
//!
//! The glue (src/server/blocking.rs) turns each server callback into an [`Event`],
//! gives the machine a [`Server`] to read and write the key's state and to
//! arm and cancel timers with (calls that never call back into the module),
//! and carries out the [`Action`]s it returns: unblocking a client, whose
//! callback the server runs at once (Redis 7.0 and 7.2, Valkey) or just
//! before the event loop sleeps (Redis 7.4+), and replying in that callback.
//!
//! The rules, each enforced in one place below:
//! - A key's waiters are served in arrival order, and only from a wake-up
//!   of the key (`drive`): one wake-up serves every head the key's state
//!   can serve ([`Kind::serve`]), with one write for all of them.
//! - The take happens at the wake-up; the callback only replies. So a
//!   served waiter has left the queue before its callback runs, whenever
//!   that is, and nobody can be served twice or after its deadline.
//! - Nothing is written while the server forbids writes (a client pause,
//!   a failover): the wake-up looks again every `PAUSED_RECHECK_MS`, so the
//!   waiters are served as soon as writes resume. The server has no event
//!   for the end of a pause; this recheck is how it is noticed.
//! - Each key with waiters has exactly one wake-up timer; each waiter with
//!   a timeout has one deadline timer. A waiter that leaves, however it
//!   leaves, takes its record and its timer with it: memory follows the
//!   live waiters, nothing stays behind per waiter that left.

use std::collections::HashMap;
use std::fmt::Debug;
use std::rc::Rc;

use crate::error::TbError;

pub mod leases;
pub mod tokens;

pub type Db = i32;
/// A wait, numbered by the machine (never 0); the server hands it back as
/// the blocked client's private data.
pub type WaiterId = u64;
/// The server's id of a timer.
pub type TimerId = u64;
/// The server's handle of a blocked client, opaque here.
pub type Client = usize;

/// The longest single timer; a longer delay is looked at again when it fires.
pub const MAX_TIMER_MS: i64 = 1 << 30;
/// How soon a due key is looked at again while writes are paused.
pub const PAUSED_RECHECK_MS: i64 = 10;
/// How soon a due key is looked at again while its slot moves elsewhere.
pub const MIGRATING_RECHECK_MS: i64 = 100;

/// What is waited for: TB.BTAKE's tokens, TB.ACQUIRE's leases. Only
/// types and pure functions; the server side of a kind is
/// `GlueKind` in src/server/blocking.rs.
pub trait Kind: Sized + Copy + Debug + PartialEq + 'static {
    /// What one waiter asks for (tokens: the limit and n).
    type Request: Copy + Debug + PartialEq;
    /// What [`Server::read`] returns and [`Server::write`] stores: the
    /// key's value as served so far, and whatever the write needs with it
    /// (tokens: the bucket and the expiry to set).
    type State;
    /// What a served waiter is told (tokens: remaining, reset_after_ms).
    type Grant: Copy + Debug + PartialEq;
    /// The reply value of a waiter's callback (tokens: `bucket::Outcome`).
    type Reply: Copy + Debug + PartialEq;

    /// How much a waiter counts in [`Machine::queued`] (tokens: n).
    fn weight(request: &Self::Request) -> f64;

    /// Serves one head on `state` at `now_ms`: its grant, and whether
    /// `state` now holds something to write; or why not ([`Unserved`]).
    /// The heads of one wake-up are served one after another on the same
    /// `state`, which is written once after the last.
    fn serve(
        state: &mut Self::State,
        request: &Self::Request,
        now_ms: i64,
    ) -> Result<(Self::Grant, bool), Unserved>;

    /// The reply of a served waiter.
    fn granted(grant: Self::Grant) -> Self::Reply;

    /// The denial of a waiter that timed out (or got CLIENT UNBLOCK), with
    /// the figures of `now_ms`; `queued` is what the queue still ahead of
    /// it wants.
    fn denied(
        state: &Self::State,
        request: &Self::Request,
        queued: f64,
        now_ms: i64,
    ) -> Result<Self::Reply, TbError>;

    /// The denial of such a waiter whose key's slot is on its way to
    /// another node: this node can no longer read the key (one already
    /// moved reads as missing, which would look like plenty), so the
    /// figures are the most cautious ones: nothing to be had here, ask
    /// again soon, when the client is routed to the key's new home.
    fn denied_elsewhere(request: &Self::Request, now_ms: i64) -> Self::Reply;
}

/// Why [`Kind::serve`] did not serve a head.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unserved {
    /// Not yet: it could be served in this many ms (-1: never; the key is
    /// looked at again later). The head and everyone behind it wait on.
    Later(i64),
    /// This head's wait ends with `error` (tokens never do this; a lease
    /// may, when the key's ids run out); the next head is judged on the
    /// same state.
    Failed(TbError),
}

/// Whether the machine may write a key now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writable {
    Yes,
    /// Writes are paused (CLIENT PAUSE WRITE/ALL, FAILOVER, CLUSTER
    /// FAILOVER), or this server is a replica.
    Paused,
    /// In a cluster, the key's slot is on its way to another node.
    Elsewhere,
}

/// A timer the machine asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer<'a> {
    /// Look at the key's queue again; `token` comes back in `Event::Wake`.
    Wake { db: Db, key: &'a [u8], token: u64 },
    /// The waiter's timeout.
    Deadline(WaiterId),
}

/// What the machine asks of the server while it handles an event. None of
/// these may call back into the machine.
pub trait Server<K: Kind> {
    /// The state at `key` in `db` (tokens: `None` when missing, a full
    /// bucket); an error when the key holds something of another type.
    /// The key's state as seen at `now_ms`.
    fn read(&mut self, db: Db, key: &[u8], now_ms: i64) -> Result<K::State, TbError>;
    /// Stores `state` as served, and propagates it; all or nothing.
    fn write(&mut self, db: Db, key: &[u8], state: &K::State, now_ms: i64) -> Result<(), TbError>;
    fn writable(&mut self, db: Db, key: &[u8]) -> Writable;
    fn arm(&mut self, timer: Timer<'_>, delay_ms: i64) -> TimerId;
    /// Stops a timer that has not fired; `wake` says which kind it was.
    fn cancel(&mut self, timer: TimerId, wake: bool);
}

/// What the server did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Event<'a, K: Kind> {
    /// A command that must wait has been blocked.
    Arrive(Arrival<'a, K>),
    /// A key's wake-up timer fired.
    Wake {
        db: Db,
        key: &'a [u8],
        token: u64,
        now_ms: i64,
    },
    /// A waiter's deadline timer fired.
    Deadline { id: WaiterId, now_ms: i64 },
    /// The server ran the waiter's callback: after our `Unblock`, or because
    /// of CLIENT UNBLOCK. The reply goes out now.
    Unblocked { id: WaiterId, now_ms: i64 },
    /// The client left without a reply: disconnect, CLIENT KILL, the
    /// server turned replica (-UNBLOCKED), its slot moved (MOVED).
    Left { id: WaiterId, now_ms: i64 },
    /// The server freed the wait: its last callback, whatever came before.
    Freed { id: WaiterId },
    /// The key may have changed: a write, DEL, expiry, eviction, another
    /// type written over it, RENAME or MOVE away or in.
    Changed { db: Db, key: &'a [u8], now_ms: i64 },
    /// FLUSHDB (`Some(db)`) or FLUSHALL (`None`).
    Flushed { db: Option<Db>, now_ms: i64 },
    /// SWAPDB: waiters stay on their database number, so they now see the
    /// other database's keys.
    Swapped { a: Db, b: Db, now_ms: i64 },
    /// MODULE UNLOAD: forget everything.
    Unload,
}

/// What the glue must do, in order, after `on` returns.
#[derive(Clone, Debug, PartialEq)]
pub enum Action<K: Kind> {
    /// End this client's wait; the server then runs its callback, which
    /// becomes `Event::Unblocked`.
    Unblock(Client),
    /// The reply to send from the callback being handled: a grant, a denial
    /// at its timeout (or CLIENT UNBLOCK), or an error. `request` is what
    /// the waiter asked for, `key` the key it waited on.
    Reply {
        result: Result<K::Reply, TbError>,
        key: Rc<[u8]>,
        request: K::Request,
        waited_ms: i64,
    },
    /// A waiter left without a reply.
    Abandoned { waited_ms: i64 },
}

/// Where a waiter stands.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase<G> {
    /// In its key's queue.
    Waiting,
    /// Out of the queue, unblocked, its callback yet to run: served (what
    /// it waited for is taken and stored), timed out, or failed.
    Granted(G),
    TimedOut,
    Failed(TbError),
}

impl<G> Phase<G> {
    fn is_waiting(&self) -> bool {
        matches!(self, Phase::Waiting)
    }
}

#[derive(Debug)]
struct Waiter<K: Kind> {
    db: Db,
    key: Rc<[u8]>,
    request: K::Request,
    client: Client,
    since_ms: i64,
    deadline_ms: Option<i64>,
    deadline_timer: Option<TimerId>,
    /// Neighbours in the queue, while `Waiting` (0: none).
    prev: WaiterId,
    next: WaiterId,
    phase: Phase<K::Grant>,
}

/// One key's queue: a list linked through the waiters, so a waiter leaves
/// from anywhere in O(1) and leaves nothing behind.
#[derive(Debug)]
struct Queue {
    head: WaiterId,
    tail: WaiterId,
    len: usize,
    /// The sum of the waiters' weights (`Kind::weight`): what the queue
    /// ahead of a newcomer wants.
    wanted: f64,
    /// The wake-up timer: its id, when it is due, and its token.
    timer: Option<(TimerId, i64, u64)>,
}

/// One kind's waiters, on every key.
#[derive(Debug)]
pub struct Machine<K: Kind> {
    /// Queues by database, then key; only keys with waiters have one.
    queues: HashMap<Db, HashMap<Rc<[u8]>, Queue>, Sequential>,
    waiters: HashMap<WaiterId, Waiter<K>, Sequential>,
    last_id: WaiterId,
    last_token: u64,
}

impl<K: Kind> Default for Machine<K> {
    fn default() -> Self {
        Machine {
            queues: HashMap::default(),
            waiters: HashMap::default(),
            last_id: 0,
            last_token: 0,
        }
    }
}

impl<K: Kind> Machine<K> {
    /// The id for the next arrival, given to the server before `Arrive`.
    pub fn reserve(&mut self) -> WaiterId {
        loop {
            self.last_id = self.last_id.wrapping_add(1);
            if self.last_id != 0 && !self.waiters.contains_key(&self.last_id) {
                return self.last_id;
            }
        }
    }

    /// Nobody waits anywhere (the commands' fast path).
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// Clients whose wait has not ended yet, over all keys.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// The most clients waiting on one key now (INFO tb's
    /// `tb_longest_queue`, read against `tb.max-waiters`): a walk over the
    /// keys that have waiters, for INFO only.
    pub fn longest_queue(&self) -> usize {
        self.queues
            .values()
            .flat_map(HashMap::values)
            .map(|queue| queue.len)
            .max()
            .unwrap_or(0)
    }

    /// How many wait on `key` now.
    pub fn waiting_on(&self, db: Db, key: &[u8]) -> usize {
        self.queue(db, key).map_or(0, |queue| queue.len)
    }

    /// What the waiters on `key` want (the sum of their weights), if any
    /// wait: other commands leave it to the queue (tokens:
    /// `bucket::take_behind`). A hash lookup only.
    pub fn queued(&self, db: Db, key: &[u8]) -> Option<f64> {
        self.queue(db, key).map(|queue| queue.wanted)
    }

    /// Handles one event; the glue carries out the returned actions in order.
    pub fn on(&mut self, event: Event<'_, K>, server: &mut dyn Server<K>) -> Vec<Action<K>> {
        let mut actions = Vec::new();
        match event {
            Event::Arrive(arrival) => self.arrive(arrival, server),
            Event::Wake {
                db,
                key,
                token,
                now_ms,
            } => {
                let fired = self
                    .queue_mut(db, key)
                    .filter(|queue| queue.timer.is_some_and(|(_, _, own)| own == token));
                if let Some(queue) = fired {
                    queue.timer = None;
                    self.drive(db, key, now_ms, server, &mut actions);
                }
            }
            Event::Deadline { id, now_ms } => self.deadline(id, now_ms, server, &mut actions),
            Event::Unblocked { id, now_ms } => self.unblocked(id, now_ms, server, &mut actions),
            Event::Left { id, now_ms } => {
                if let Some(waiter) = self.leave(id, now_ms, server) {
                    actions.push(Action::Abandoned {
                        waited_ms: waited(&waiter, now_ms),
                    });
                }
            }
            Event::Freed { id } => {
                self.leave(id, 0, server);
            }
            Event::Changed { db, key, now_ms } => {
                if self.queue(db, key).is_some() {
                    self.wake_soon(db, key, 0, now_ms, server);
                }
            }
            Event::Flushed { db, now_ms } => {
                let dbs: Vec<Db> = match db {
                    Some(db) => vec![db],
                    None => self.queues.keys().copied().collect(),
                };
                self.wake_dbs(&dbs, now_ms, server);
            }
            Event::Swapped { a, b, now_ms } => self.wake_dbs(&[a, b], now_ms, server),
            Event::Unload => {
                for queue in self.queues.values().flat_map(HashMap::values) {
                    if let Some((timer, _, _)) = queue.timer {
                        server.cancel(timer, true);
                    }
                }
                for waiter in self.waiters.values() {
                    if let Some(timer) = waiter.deadline_timer {
                        server.cancel(timer, false);
                    }
                }
                *self = Machine::default();
            }
        }
        actions
    }

    fn arrive(&mut self, arrival: Arrival<'_, K>, server: &mut dyn Server<K>) {
        let Arrival {
            id,
            client,
            db,
            key,
            request,
            timeout_ms,
            retry_after_ms,
            now_ms,
        } = arrival;
        let queues = self.queues.entry(db).or_default();
        let key_rc: Rc<[u8]> = match queues.get_key_value(key) {
            Some((key_rc, _)) => key_rc.clone(),
            None => Rc::from(key),
        };
        let queue = queues.entry(key_rc.clone()).or_insert(Queue {
            head: 0,
            tail: 0,
            len: 0,
            wanted: 0.0,
            timer: None,
        });
        let prev = queue.tail;
        queue.tail = id;
        if prev == 0 {
            queue.head = id;
        }
        queue.len = queue.len.saturating_add(1);
        queue.wanted += K::weight(&request);
        if prev != 0 {
            if let Some(before) = self.waiters.get_mut(&prev) {
                before.next = id;
            }
        }
        let deadline_ms = (timeout_ms > 0).then(|| now_ms.saturating_add(timeout_ms));
        let deadline_timer =
            deadline_ms.map(|_| server.arm(Timer::Deadline(id), timeout_ms.min(MAX_TIMER_MS)));
        self.waiters.insert(
            id,
            Waiter {
                db,
                key: key_rc,
                request,
                client,
                since_ms: now_ms,
                deadline_ms,
                deadline_timer,
                prev,
                next: 0,
                phase: Phase::Waiting,
            },
        );
        // The head's wake-up decides; a sooner one for a newcomer behind it
        // is kept only if none is due sooner.
        self.wake_soon(db, key, retry_after_ms, now_ms, server);
    }

    /// Serves the key's queue from its head for as long as the key's state
    /// can serve the head, with one write for all of them, then sets the
    /// wake-up for the next head.
    fn drive(
        &mut self,
        db: Db,
        key: &[u8],
        now_ms: i64,
        server: &mut dyn Server<K>,
        actions: &mut Vec<Action<K>>,
    ) {
        match server.writable(db, key) {
            Writable::Yes => {}
            Writable::Paused => return self.wake_soon(db, key, PAUSED_RECHECK_MS, now_ms, server),
            Writable::Elsewhere => {
                return self.wake_soon(db, key, MIGRATING_RECHECK_MS, now_ms, server)
            }
        }
        let mut state = match server.read(db, key, now_ms) {
            Ok(state) => state,
            Err(error) => {
                // Not this kind's value any more: every waiter of the key
                // fails alike.
                for id in self.queued_ids(db, key) {
                    self.end(id, Phase::Failed(error), server, actions);
                }
                return;
            }
        };
        let mut served: Vec<(WaiterId, K::Grant)> = Vec::new();
        let mut written = false;
        let mut retry_after_ms = None;
        let mut cursor = self.queue(db, key).map_or(0, |queue| queue.head);
        while let Some(waiter) = self.waiters.get(&cursor) {
            let id = cursor;
            cursor = waiter.next;
            if waiter
                .deadline_ms
                .is_some_and(|deadline| now_ms >= deadline)
            {
                // Its deadline timer has yet to fire: it is late, not served.
                self.end(id, Phase::TimedOut, server, actions);
                continue;
            }
            match K::serve(&mut state, &waiter.request, now_ms) {
                Ok((grant, wrote)) => {
                    written |= wrote;
                    served.push((id, grant));
                }
                Err(Unserved::Later(delay_ms)) => {
                    retry_after_ms = Some(delay_ms);
                    break;
                }
                Err(Unserved::Failed(error)) => {
                    // Ended as met, like a late waiter.
                    self.end(id, Phase::Failed(error), server, actions);
                }
            }
        }
        let stored = if written {
            server.write(db, key, &state, now_ms)
        } else {
            Ok(())
        };
        if stored.is_err() {
            // The key is as it was: the next head is judged on it anew.
            retry_after_ms = Some(0);
        }
        for (id, grant) in served {
            let phase = match stored {
                Ok(()) => Phase::Granted(grant),
                Err(error) => Phase::Failed(error),
            };
            self.end(id, phase, server, actions);
        }
        if let Some(delay_ms) = retry_after_ms {
            // -1 (never) cannot wait; should it ever, look again later.
            let delay_ms = if delay_ms < 0 { MAX_TIMER_MS } else { delay_ms };
            self.wake_soon(db, key, delay_ms, now_ms, server);
        }
    }

    fn deadline(
        &mut self,
        id: WaiterId,
        now_ms: i64,
        server: &mut dyn Server<K>,
        actions: &mut Vec<Action<K>>,
    ) {
        let Some(waiter) = self.waiters.get_mut(&id) else {
            return;
        };
        if waiter.deadline_timer.take().is_none() || !waiter.phase.is_waiting() {
            return;
        }
        let Some(deadline_ms) = waiter.deadline_ms else {
            return;
        };
        if now_ms < deadline_ms {
            // A timeout longer than one timer: the rest of it.
            let rest = deadline_ms.saturating_sub(now_ms).min(MAX_TIMER_MS);
            waiter.deadline_timer = Some(server.arm(Timer::Deadline(id), rest));
            return;
        }
        let key = (waiter.db, waiter.key.clone());
        if self.end(id, Phase::TimedOut, server, actions) {
            // The next one may be servable now.
            self.wake_soon(key.0, &key.1, 0, now_ms, server);
        }
    }

    fn unblocked(
        &mut self,
        id: WaiterId,
        now_ms: i64,
        server: &mut dyn Server<K>,
        actions: &mut Vec<Action<K>>,
    ) {
        let Some(phase) = self.waiters.get(&id).map(|waiter| waiter.phase) else {
            return; // answered already, or gone
        };
        if phase.is_waiting() {
            // CLIENT UNBLOCK: a denial, like a timeout.
            self.unlink(id, now_ms, server);
        }
        let Some(waiter) = self.forget(id) else {
            return;
        };
        if let Some(timer) = waiter.deadline_timer {
            server.cancel(timer, false);
        }
        let result = match phase {
            Phase::Granted(grant) => Ok(K::granted(grant)),
            Phase::Failed(error) => Err(error),
            // A denial with the figures of this moment, counting the
            // queue still ahead of a request like this one.
            Phase::Waiting | Phase::TimedOut
                if server.writable(waiter.db, &waiter.key) == Writable::Elsewhere =>
            {
                Ok(K::denied_elsewhere(&waiter.request, now_ms))
            }
            Phase::Waiting | Phase::TimedOut => {
                let queued = self.queued(waiter.db, &waiter.key).unwrap_or(0.0);
                server
                    .read(waiter.db, &waiter.key, now_ms)
                    .and_then(|state| K::denied(&state, &waiter.request, queued, now_ms))
            }
        };
        actions.push(Action::Reply {
            result,
            key: Rc::clone(&waiter.key),
            request: waiter.request,
            waited_ms: waited(&waiter, now_ms),
        });
    }

    /// Takes a waiter out of its queue for good, in whatever phase: the
    /// client is gone.
    fn leave(
        &mut self,
        id: WaiterId,
        now_ms: i64,
        server: &mut dyn Server<K>,
    ) -> Option<Waiter<K>> {
        if self.waiters.get(&id)?.phase.is_waiting() {
            self.unlink(id, now_ms, server);
        }
        let waiter = self.forget(id)?;
        if let Some(timer) = waiter.deadline_timer {
            server.cancel(timer, false);
        }
        Some(waiter)
    }

    /// Ends a waiting waiter's wait with `phase` and unblocks it. Says
    /// whether it was the head; waking the next one is the caller's choice
    /// (a wake-up goes on serving by itself).
    fn end(
        &mut self,
        id: WaiterId,
        phase: Phase<K::Grant>,
        server: &mut dyn Server<K>,
        actions: &mut Vec<Action<K>>,
    ) -> bool {
        let was_head = self
            .unlink_quietly(id, server)
            .is_some_and(|(_, _, was_head)| was_head);
        if let Some(waiter) = self.waiters.get_mut(&id) {
            waiter.phase = phase;
            if let Some(timer) = waiter.deadline_timer.take() {
                server.cancel(timer, false);
            }
            actions.push(Action::Unblock(waiter.client));
        }
        was_head
    }

    /// Unlinks a waiting waiter; if it was the head, the next one may be
    /// servable now, so the key is woken.
    fn unlink(&mut self, id: WaiterId, now_ms: i64, server: &mut dyn Server<K>) {
        let Some((db, key, was_head)) = self.unlink_quietly(id, server) else {
            return;
        };
        if was_head {
            self.wake_soon(db, &key, 0, now_ms, server);
        }
    }

    /// Takes a waiting waiter out of its queue; drops the queue (and its
    /// timer) once empty. Returns the key and whether it was the head.
    fn unlink_quietly(
        &mut self,
        id: WaiterId,
        server: &mut dyn Server<K>,
    ) -> Option<(Db, Rc<[u8]>, bool)> {
        let waiter = self.waiters.get_mut(&id)?;
        if !waiter.phase.is_waiting() {
            return None;
        }
        let (db, key, prev, next, n) = (
            waiter.db,
            waiter.key.clone(),
            waiter.prev,
            waiter.next,
            K::weight(&waiter.request),
        );
        waiter.prev = 0;
        waiter.next = 0;
        // A phase other than Waiting until the caller sets the real one.
        waiter.phase = Phase::TimedOut;
        if prev != 0 {
            if let Some(before) = self.waiters.get_mut(&prev) {
                before.next = next;
            }
        }
        if next != 0 {
            if let Some(after) = self.waiters.get_mut(&next) {
                after.prev = prev;
            }
        }
        let queues = self.queues.get_mut(&db)?;
        let queue = queues.get_mut(&key[..])?;
        if queue.head == id {
            queue.head = next;
        }
        if queue.tail == id {
            queue.tail = prev;
        }
        queue.len = queue.len.saturating_sub(1);
        queue.wanted = if queue.len == 0 {
            0.0 // exact again once empty, whatever rounding the sums left
        } else {
            (queue.wanted - n).max(0.0)
        };
        if queue.len == 0 {
            if let Some((timer, _, _)) = queue.timer.take() {
                server.cancel(timer, true);
            }
            queues.remove(&key[..]);
            shrink(queues);
            if queues.is_empty() {
                self.queues.remove(&db);
            }
        }
        Some((db, key, prev == 0))
    }

    /// Removes the record of a waiter that is out of its queue.
    fn forget(&mut self, id: WaiterId) -> Option<Waiter<K>> {
        let waiter = self.waiters.remove(&id)?;
        shrink(&mut self.waiters);
        Some(waiter)
    }

    /// Makes sure the key's queue is looked at within `delay_ms`: keeps a
    /// wake-up due sooner, else replaces it, so a key never has two.
    fn wake_soon(
        &mut self,
        db: Db,
        key: &[u8],
        delay_ms: i64,
        now_ms: i64,
        server: &mut dyn Server<K>,
    ) {
        let delay_ms = delay_ms.clamp(0, MAX_TIMER_MS);
        let due_ms = now_ms.saturating_add(delay_ms);
        self.last_token = self.last_token.wrapping_add(1);
        let token = self.last_token;
        let Some(queue) = self.queue_mut(db, key) else {
            return;
        };
        if let Some((timer, at_ms, _)) = queue.timer {
            if at_ms <= due_ms {
                return;
            }
            server.cancel(timer, true);
        }
        let timer = server.arm(Timer::Wake { db, key, token }, delay_ms);
        if let Some(queue) = self.queue_mut(db, key) {
            queue.timer = Some((timer, due_ms, token));
        }
    }

    fn wake_dbs(&mut self, dbs: &[Db], now_ms: i64, server: &mut dyn Server<K>) {
        for db in dbs {
            let keys: Vec<Rc<[u8]>> = self
                .queues
                .get(db)
                .map(|queues| queues.keys().cloned().collect())
                .unwrap_or_default();
            for key in keys {
                self.wake_soon(*db, &key, 0, now_ms, server);
            }
        }
    }

    /// The key's waiters in queue order.
    fn queued_ids(&self, db: Db, key: &[u8]) -> Vec<WaiterId> {
        let mut ids = Vec::new();
        let mut cursor = self.queue(db, key).map_or(0, |queue| queue.head);
        while let Some(waiter) = self.waiters.get(&cursor) {
            ids.push(cursor);
            cursor = waiter.next;
        }
        ids
    }

    fn queue(&self, db: Db, key: &[u8]) -> Option<&Queue> {
        self.queues.get(&db)?.get(key)
    }

    fn queue_mut(&mut self, db: Db, key: &[u8]) -> Option<&mut Queue> {
        self.queues.get_mut(&db)?.get_mut(key)
    }
}

/// The hasher of the maps keyed by waiter ids and database numbers, which
/// the module itself hands out or the server numbers from 0: ids of
/// waiters that arrived one after another land in neighbouring slots, so a
/// wake-up walking its queue reads memory in order instead of missing the
/// cache once per waiter. The low bits place an entry; the low 7 bits are
/// copied to the top, where the map looks first, so neighbours differ there.
#[derive(Clone, Copy, Debug, Default)]
struct Sequential;

impl std::hash::BuildHasher for Sequential {
    type Hasher = SequentialHasher;

    fn build_hasher(&self) -> SequentialHasher {
        SequentialHasher(0)
    }
}

#[derive(Clone, Copy, Debug, Default)]
struct SequentialHasher(u64);

impl std::hash::Hasher for SequentialHasher {
    fn finish(&self) -> u64 {
        self.0 ^ (self.0 << 57)
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by u64 and i32 keys; any other key still hashes.
        for byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(*byte);
        }
    }

    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }

    fn write_i32(&mut self, value: i32) {
        self.0 = u64::from(value as u32);
    }
}

/// A command that must wait: blocked by the server as `client`, with `id`
/// (from `Machine::reserve`) as its private data. `retry_after_ms` is when
/// what it asks for could exist, from its judgement on arrival.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Arrival<'a, K: Kind> {
    pub id: WaiterId,
    pub client: Client,
    pub db: Db,
    pub key: &'a [u8],
    pub request: K::Request,
    pub timeout_ms: i64,
    pub retry_after_ms: i64,
    pub now_ms: i64,
}

fn waited<K: Kind>(waiter: &Waiter<K>, now_ms: i64) -> i64 {
    now_ms.saturating_sub(waiter.since_ms).max(0)
}

/// Gives memory back once a map is mostly empty, so a burst of waiters
/// does not stay allocated after it has gone.
fn shrink<K: std::hash::Hash + Eq, V, S: std::hash::BuildHasher>(map: &mut HashMap<K, V, S>) {
    if map.capacity() > 64 && map.len().saturating_mul(4) < map.capacity() {
        map.shrink_to(map.len().saturating_mul(2));
    }
}

#[cfg(test)]
impl<K: Kind> Machine<K> {
    /// Checks the structure against itself: links, counts, sums, timers.
    fn check(&self) -> Result<(), String> {
        let mut linked = 0usize;
        for (db, queues) in &self.queues {
            if queues.is_empty() {
                return Err(format!("db {db} kept without queues"));
            }
            for (key, queue) in queues {
                let mut cursor = queue.head;
                let mut prev = 0;
                let mut len = 0usize;
                let mut wanted = 0.0;
                while cursor != 0 {
                    let waiter = self.waiters.get(&cursor).ok_or("dangling link")?;
                    if !waiter.phase.is_waiting() || waiter.prev != prev {
                        return Err(format!("waiter {cursor} linked but {waiter:?}"));
                    }
                    if waiter.db != *db || waiter.key != *key {
                        return Err(format!("waiter {cursor} in another key's queue"));
                    }
                    len += 1;
                    wanted += K::weight(&waiter.request);
                    prev = cursor;
                    cursor = waiter.next;
                }
                if queue.tail != prev || queue.len != len || len == 0 {
                    return Err(format!(
                        "queue {key:?}: len {} tail {}",
                        queue.len, queue.tail
                    ));
                }
                if (queue.wanted - wanted).abs() > 1e-6 || queue.timer.is_none() {
                    return Err(format!("queue {key:?}: wanted or timer wrong: {queue:?}"));
                }
                linked += len;
            }
        }
        let waiting = self
            .waiters
            .values()
            .filter(|waiter| waiter.phase.is_waiting())
            .count();
        if waiting != linked {
            return Err(format!("{waiting} waiting, {linked} in queues"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod sim_timers;

#[cfg(test)]
mod token_tests;

#[cfg(test)]
mod lease_tests;
