//! The queues of TB.BTAKE: who waits on which bucket, in arrival order.
//!
//! Pure bookkeeping, no Redis types: the glue (`btake.rs`) keeps one
//! `Queues` for the whole server and asks it who is at the head of a key's
//! queue, how many tokens the queue ahead of a newcomer wants, and so on.
//! A waiter is removed in O(1) wherever it stands (a timeout, a disconnect):
//! its id simply stops resolving, and the queue skips such ids when it next
//! looks at its head.

use std::collections::{HashMap, VecDeque};

use crate::bucket::Limit;

/// A bucket key in one database.
pub type KeyName = (i32, Vec<u8>);

/// One client waiting in TB.BTAKE.
#[derive(Clone, Debug, PartialEq)]
pub struct Waiter {
    pub key: KeyName,
    pub limit: Limit,
    pub n: f64,
    /// When it started waiting (Unix ms), for the time-waited counter.
    pub since_ms: i64,
    /// The server's handle of the blocked client (opaque here).
    pub handle: usize,
    /// The timer that ends the wait at its timeout, if it has one.
    pub deadline_timer: Option<u64>,
    pub state: WaitState,
}

/// Where a waiter stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitState {
    Waiting,
    /// Its tokens are there: the take and the reply follow in the server's
    /// callback, which may run a little later (see `btake.rs`).
    Serve,
    /// Its key no longer holds a bucket: it gets an error.
    Fail,
}

/// One key's queue.
#[derive(Debug, Default)]
struct Queue {
    /// Waiter ids in arrival order; ids of waiters that left are skipped.
    order: VecDeque<u64>,
    /// How many of `order` are still waiting.
    len: usize,
    /// The sum of their `n`: what the queue ahead of a newcomer will take.
    wanted: f64,
    /// The pending wake-up timer (server id) and when it is due.
    timer: Option<(u64, i64)>,
}

/// Every queue of the server.
#[derive(Debug, Default)]
pub struct Queues {
    queues: HashMap<KeyName, Queue>,
    waiters: HashMap<u64, Waiter>,
    next_id: u64,
}

impl Queues {
    /// No one waits anywhere: the commands' fast path skips every lookup.
    pub fn is_empty(&self) -> bool {
        self.waiters.is_empty()
    }

    /// Clients waiting now, over all keys.
    pub fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// How many wait on `key`, and the tokens they want in all.
    pub fn ahead(&self, key: &KeyName) -> Option<(usize, f64)> {
        let queue = self.queues.get(key)?;
        (queue.len > 0).then_some((queue.len, queue.wanted))
    }

    /// Appends a waiter to its key's queue; returns its id (never 0) and
    /// whether it is the head (no one was waiting before it).
    pub fn push(&mut self, waiter: Waiter) -> (u64, bool) {
        self.next_id = self.next_id.wrapping_add(1).max(1);
        let id = self.next_id;
        let queue = self.queues.entry(waiter.key.clone()).or_default();
        queue.order.push_back(id);
        queue.len = queue.len.saturating_add(1);
        queue.wanted += waiter.n;
        let is_head = queue.len == 1;
        self.waiters.insert(id, waiter);
        (id, is_head)
    }

    pub fn get(&self, id: u64) -> Option<&Waiter> {
        self.waiters.get(&id)
    }

    /// Its timeout timer has fired (nothing left to stop).
    pub fn clear_deadline(&mut self, id: u64) {
        if let Some(waiter) = self.waiters.get_mut(&id) {
            waiter.deadline_timer = None;
        }
    }

    pub fn set_state(&mut self, id: u64, state: WaitState) {
        if let Some(waiter) = self.waiters.get_mut(&id) {
            waiter.state = state;
        }
    }

    pub fn set_handle(&mut self, id: u64, handle: usize, deadline_timer: Option<u64>) {
        if let Some(waiter) = self.waiters.get_mut(&id) {
            waiter.handle = handle;
            waiter.deadline_timer = deadline_timer;
        }
    }

    /// Removes a waiter wherever it stands. Returns it, and whether it was
    /// the head of its queue (so the next one may now be served).
    pub fn remove(&mut self, id: u64) -> Option<(Waiter, bool)> {
        let waiter = self.waiters.remove(&id)?;
        let mut was_head = false;
        if let Some(queue) = self.queues.get_mut(&waiter.key) {
            // Its place is skipped from now on; the head is the first id
            // that still resolves (or this one).
            while let Some(&front) = queue.order.front() {
                if front == id {
                    was_head = true;
                } else if self.waiters.contains_key(&front) {
                    break;
                }
                queue.order.pop_front();
            }
            queue.len = queue.len.saturating_sub(1);
            // Exact again once empty, whatever rounding the sums left.
            queue.wanted = if queue.len == 0 {
                0.0
            } else {
                (queue.wanted - waiter.n).max(0.0)
            };
        }
        Some((waiter, was_head))
    }

    /// The first waiter still waiting on `key`.
    pub fn head(&mut self, key: &KeyName) -> Option<(u64, &Waiter)> {
        self.skip_gone(key);
        let id = *self.queues.get(key)?.order.front()?;
        self.waiters.get(&id).map(|waiter| (id, waiter))
    }

    /// Drops the ids of waiters that left from the front of the queue.
    fn skip_gone(&mut self, key: &KeyName) {
        if let Some(queue) = self.queues.get_mut(key) {
            while let Some(id) = queue.order.front() {
                if self.waiters.contains_key(id) {
                    break;
                }
                queue.order.pop_front();
            }
        }
    }

    /// The pending wake-up of `key`.
    pub fn timer(&self, key: &KeyName) -> Option<(u64, i64)> {
        self.queues.get(key)?.timer
    }

    pub fn set_timer(&mut self, key: &KeyName, timer: Option<(u64, i64)>) {
        if let Some(queue) = self.queues.get_mut(key) {
            queue.timer = timer;
        }
    }

    /// Forgets `key` once no one waits on it and no timer is pending.
    pub fn forget_if_idle(&mut self, key: &KeyName) {
        if self
            .queues
            .get(key)
            .is_some_and(|queue| queue.len == 0 && queue.timer.is_none())
        {
            self.queues.remove(key);
        }
    }

    /// Every key with a queue (for a wake-up after FLUSHDB and the like).
    pub fn keys(&self) -> Vec<KeyName> {
        self.queues.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(key: &str, n: f64) -> Waiter {
        Waiter {
            key: (0, key.as_bytes().to_vec()),
            limit: Limit {
                capacity: 10.0,
                refill_per_sec: 1.0,
            },
            n,
            since_ms: 0,
            handle: 0,
            deadline_timer: None,
            state: WaitState::Waiting,
        }
    }

    fn name(key: &str) -> KeyName {
        (0, key.as_bytes().to_vec())
    }

    #[test]
    fn waiters_are_served_in_arrival_order() {
        let mut queues = Queues::default();
        let (first, head) = queues.push(waiter("k", 1.0));
        assert!(head);
        let (second, head) = queues.push(waiter("k", 2.0));
        assert!(!head);
        assert_eq!(queues.ahead(&name("k")), Some((2, 3.0)));
        assert_eq!(queues.head(&name("k")).map(|(id, _)| id), Some(first));
        assert_eq!(
            queues.remove(first).map(|(_, was_head)| was_head),
            Some(true)
        );
        assert_eq!(queues.head(&name("k")).map(|(id, _)| id), Some(second));
    }

    #[test]
    fn a_waiter_leaving_from_the_middle_keeps_the_order_of_the_rest() {
        let mut queues = Queues::default();
        let ids: Vec<u64> = (0..4).map(|_| queues.push(waiter("k", 1.0)).0).collect();
        assert_eq!(
            queues.remove(ids[1]).map(|(_, was_head)| was_head),
            Some(false)
        );
        assert_eq!(
            queues.remove(ids[2]).map(|(_, was_head)| was_head),
            Some(false)
        );
        assert_eq!(queues.ahead(&name("k")), Some((2, 2.0)));
        assert_eq!(
            queues.remove(ids[0]).map(|(_, was_head)| was_head),
            Some(true)
        );
        assert_eq!(queues.head(&name("k")).map(|(id, _)| id), Some(ids[3]));
    }

    #[test]
    fn keys_and_databases_have_separate_queues() {
        let mut queues = Queues::default();
        queues.push(waiter("a", 1.0));
        let mut other_db = waiter("a", 1.0);
        other_db.key.0 = 1;
        assert!(queues.push(other_db).1, "head of its own queue");
        assert!(queues.push(waiter("b", 1.0)).1);
        assert_eq!(queues.waiting(), 3);
    }

    #[test]
    fn an_idle_key_is_forgotten_only_without_a_pending_timer() {
        let mut queues = Queues::default();
        let (id, _) = queues.push(waiter("k", 1.0));
        queues.set_timer(&name("k"), Some((7, 100)));
        queues.remove(id);
        assert_eq!(queues.ahead(&name("k")), None);
        queues.forget_if_idle(&name("k"));
        assert_eq!(queues.timer(&name("k")), Some((7, 100)));
        queues.set_timer(&name("k"), None);
        queues.forget_if_idle(&name("k"));
        assert!(queues.keys().is_empty());
        assert!(queues.is_empty());
    }

    proptest::proptest! {
        /// Against a plain list per key: any mix of arrivals and departures
        /// (from anywhere in the queue) keeps arrival order, counts and sums.
        #[test]
        fn queues_behave_like_ordered_lists(
            ops in proptest::collection::vec((0u8..3, 0usize..3, 1u32..5), 1..200),
        ) {
            let mut queues = Queues::default();
            let mut model: Vec<Vec<(u64, f64)>> = vec![Vec::new(); 3];
            for (op, key, n) in ops {
                let name = (0, vec![b'k', key as u8]);
                if op < 2 {
                    let mut w = waiter("x", f64::from(n));
                    w.key = name.clone();
                    let (id, is_head) = queues.push(w);
                    proptest::prop_assert_eq!(is_head, model[key].is_empty());
                    model[key].push((id, f64::from(n)));
                } else if !model[key].is_empty() {
                    let at = (n as usize) % model[key].len();
                    let (id, _) = model[key].remove(at);
                    let (_, was_head) = queues.remove(id).expect("queued");
                    proptest::prop_assert_eq!(was_head, at == 0);
                }
                let head = queues.head(&name).map(|(id, _)| id);
                proptest::prop_assert_eq!(head, model[key].first().map(|(id, _)| *id));
                let ahead = queues.ahead(&name);
                let wanted: f64 = model[key].iter().map(|(_, n)| n).sum();
                proptest::prop_assert_eq!(
                    ahead,
                    (!model[key].is_empty()).then_some((model[key].len(), wanted))
                );
            }
            let total: usize = model.iter().map(Vec::len).sum();
            proptest::prop_assert_eq!(queues.waiting(), total);
        }
    }

    #[test]
    fn removing_twice_or_an_unknown_id_changes_nothing() {
        let mut queues = Queues::default();
        let (id, _) = queues.push(waiter("k", 1.0));
        assert!(queues.remove(id).is_some());
        assert!(queues.remove(id).is_none());
        assert!(queues.remove(12345).is_none());
        assert_eq!(queues.waiting(), 0);
    }
}
