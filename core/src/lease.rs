//! The rules of concurrency leases (TB.ACQUIRE, TB.RELEASE, TB.RENEW),
//! pure: no Redis types, no clock of its own. src/lease/set.rs reads a
//! lease set into a [`SetView`] and writes back what these functions decide.
//!
//! A lease is live while `now < deadline`. At most `limit` may be live at
//! once; a lease that has ended never holds a slot, whether or not a call
//! has removed it yet. Ids are `<ms>-<n>`: the grant's instant and the
//! key's running count, so no id is handed out twice on a key (see
//! docs/leases.md for why that survives expiry, restarts and failovers).

use crate::error::TbError;
use crate::number::{format_integer, NumberText, MAX_EXACT_INTEGER};

/// Ended leases a writing call removes at most, earliest first: the work of
/// one call stays bounded however many leases ended unnoticed.
pub const MAX_EXPIRED_REMOVED: usize = 64;
/// The bytes of a lease id at most; anything longer is not one.
pub const MAX_ID_LEN: usize = 64;

/// `limit lease_ms` of TB.ACQUIRE, validated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseLimit {
    /// Leases that may be live at once, in [1, 2^53].
    pub limit: i64,
    /// How long a new lease lasts, in [1, 2^53] ms.
    pub lease_ms: i64,
}

/// A view of a lease set: what a call sees of it at its instant `now_ms`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct SetView {
    /// Leases with a deadline after now.
    pub live: i64,
    /// The earliest deadline among them.
    pub earliest_deadline_ms: Option<i64>,
    /// Ids the key has handed out (the `seq` member's count).
    pub issued: i64,
    /// The key's expiry; `None` when it has none (a new key, or PERSIST).
    pub expire_at_ms: Option<i64>,
    /// The latest deadline stored, live or not (needed only without an
    /// expiry).
    pub latest_deadline_ms: Option<i64>,
}

/// A lease id, `<ms>-<n>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseId {
    pub granted_ms: i64,
    pub n: i64,
}

impl LeaseId {
    /// The id's text, without a heap allocation.
    pub fn text(&self) -> NumberText {
        let mut text = format_integer(self.granted_ms);
        text.push(b"-");
        text.push(format_integer(self.n).as_bytes());
        text
    }
}

/// What TB.ACQUIRE decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Acquire {
    Granted(Grant),
    Denied { available: i64, retry_after_ms: i64 },
}

/// A new lease, and what storing it changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    pub id: LeaseId,
    pub deadline_ms: i64,
    /// Free slots left: `limit - live - waiting`, at least 0.
    pub available: i64,
    /// The key's new expiry, when it must change.
    pub expire_at_ms: Option<i64>,
}

/// When a lease taken or renewed at `now_ms` for `lease_ms` ends: capped at
/// 2^53 ms, where a score stops being exact (the year 287,396).
pub fn deadline_ms(now_ms: i64, lease_ms: i64) -> i64 {
    now_ms.saturating_add(lease_ms).min(MAX_EXACT_INTEGER)
}

/// Whether a lease ending at `deadline_ms` still holds its slot at `now_ms`.
pub fn is_live(deadline_ms: i64, now_ms: i64) -> bool {
    deadline_ms > now_ms
}

/// The key's expiry after storing a lease that ends at `deadline_ms`, if it
/// must change: the expiry only grows, so the key outlives every deadline
/// it has handed out (which keeps ids unique, see the module docs).
pub fn expiry_after(seen: &SetView, deadline_ms: i64) -> Option<i64> {
    let wanted = match seen.expire_at_ms {
        Some(current) => current.max(deadline_ms),
        None => seen
            .latest_deadline_ms
            .map_or(deadline_ms, |latest| latest.max(deadline_ms)),
    };
    (seen.expire_at_ms != Some(wanted)).then_some(wanted)
}

/// TB.ACQUIRE at `now_ms`, with `waiting` callers queued on the key ahead
/// of this one: a lease if a slot is free and nobody is ahead, else a
/// denial saying when the earliest live lease ends by itself.
pub fn acquire(
    seen: &SetView,
    limit: &LeaseLimit,
    waiting: i64,
    now_ms: i64,
) -> Result<Acquire, TbError> {
    if waiting > 0 || seen.live >= limit.limit {
        return Ok(denial(seen, limit, waiting, now_ms));
    }
    if seen.issued >= MAX_EXACT_INTEGER {
        return Err(TbError::LeaseIdsExhausted);
    }
    let deadline_ms = deadline_ms(now_ms, limit.lease_ms);
    let live = seen.live.saturating_add(1);
    Ok(Acquire::Granted(Grant {
        id: LeaseId {
            granted_ms: now_ms.max(0),
            n: seen.issued.saturating_add(1),
        },
        deadline_ms,
        available: free(limit.limit, live, 0),
        expire_at_ms: expiry_after(seen, deadline_ms),
    }))
}

/// A denial's figures at `now_ms`, with `waiting` callers queued ahead:
/// the free slots left to a newcomer, and the time until the earliest live
/// lease ends by itself (0 when none is live).
pub fn denial(seen: &SetView, limit: &LeaseLimit, waiting: i64, now_ms: i64) -> Acquire {
    let retry_after_ms = seen
        .earliest_deadline_ms
        .filter(|_| seen.live > 0)
        .map_or(0, |deadline| deadline.saturating_sub(now_ms).max(0));
    Acquire::Denied {
        available: free(limit.limit, seen.live, waiting),
        retry_after_ms,
    }
}

/// The lease set after `grant` was stored: what the next head in a queue
/// is judged on.
pub fn after_grant(seen: &SetView, grant: &Grant) -> SetView {
    SetView {
        live: seen.live.saturating_add(1),
        earliest_deadline_ms: Some(
            seen.earliest_deadline_ms
                .map_or(grant.deadline_ms, |earliest| {
                    earliest.min(grant.deadline_ms)
                }),
        ),
        issued: grant.id.n,
        expire_at_ms: grant.expire_at_ms.or(seen.expire_at_ms),
        latest_deadline_ms: Some(
            seen.latest_deadline_ms
                .map_or(grant.deadline_ms, |latest| latest.max(grant.deadline_ms)),
        ),
    }
}

/// TB.RENEW of a lease whose stored deadline is `current_deadline_ms`
/// (`None`: not in the set): the new deadline and expiry, or `None` when the
/// lease is not held, which writes nothing.
pub fn renew(
    seen: &SetView,
    current_deadline_ms: Option<i64>,
    lease_ms: i64,
    now_ms: i64,
) -> Option<(i64, Option<i64>)> {
    let current = current_deadline_ms?;
    if !is_live(current, now_ms) {
        return None; // an ended lease cannot come back
    }
    let deadline = deadline_ms(now_ms, lease_ms);
    Some((deadline, expiry_after(seen, deadline)))
}

/// Whether `bytes` has the shape of a lease id, `<digits>-<digits>`. Only
/// such members are ever released or renewed, so no argument can touch the
/// `seq` member or a member someone else stored.
pub fn is_lease_id(bytes: &[u8]) -> bool {
    if bytes.len() > MAX_ID_LEN {
        return false;
    }
    let mut parts = bytes.splitn(2, |byte| *byte == b'-');
    let digits = |part: Option<&[u8]>| {
        part.is_some_and(|part| !part.is_empty() && part.iter().all(u8::is_ascii_digit))
    };
    digits(parts.next()) && digits(parts.next())
}

/// The count of ids handed out, from the `seq` member's score (minus the
/// count); `None` if the score is not a whole number in [-2^53, 0].
pub fn issued_from_score(score: f64) -> Option<i64> {
    if !(score <= 0.0 && score >= -(MAX_EXACT_INTEGER as f64)) || score.fract() != 0.0 {
        return None;
    }
    // A whole number within ±2^53: the conversion is exact.
    Some((score as i64).saturating_neg())
}

fn free(limit: i64, live: i64, waiting: i64) -> i64 {
    limit.saturating_sub(live).saturating_sub(waiting).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const NOW: i64 = 1_764_633_600_000;

    fn limit(limit: i64, lease_ms: i64) -> LeaseLimit {
        LeaseLimit { limit, lease_ms }
    }

    fn granted(result: Result<Acquire, TbError>) -> Grant {
        match result {
            Ok(Acquire::Granted(grant)) => grant,
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn the_first_lease_on_a_missing_key_is_number_one_and_sets_the_expiry() {
        let grant = granted(acquire(&SetView::default(), &limit(2, 30_000), 0, NOW));
        assert_eq!(grant.id.text().as_bytes(), b"1764633600000-1");
        assert_eq!(grant.deadline_ms, NOW + 30_000);
        assert_eq!(grant.available, 1);
        assert_eq!(grant.expire_at_ms, Some(NOW + 30_000));
    }

    #[test]
    fn a_full_set_denies_with_the_wait_for_the_earliest_live_lease() {
        let seen = SetView {
            live: 2,
            earliest_deadline_ms: Some(NOW + 1_500),
            issued: 9,
            expire_at_ms: Some(NOW + 9_000),
            latest_deadline_ms: Some(NOW + 9_000),
        };
        assert_eq!(
            acquire(&seen, &limit(2, 100), 0, NOW),
            Ok(Acquire::Denied {
                available: 0,
                retry_after_ms: 1_500
            })
        );
    }

    #[test]
    fn a_limit_below_the_live_leases_denies_and_revokes_nothing() {
        let seen = SetView {
            live: 5,
            earliest_deadline_ms: Some(NOW + 10),
            issued: 5,
            ..SetView::default()
        };
        assert!(matches!(
            acquire(&seen, &limit(3, 100), 0, NOW),
            Ok(Acquire::Denied { available: 0, .. })
        ));
    }

    #[test]
    fn callers_waiting_ahead_keep_a_free_slot_from_a_newcomer() {
        let seen = SetView {
            live: 1,
            earliest_deadline_ms: Some(NOW + 40),
            issued: 1,
            ..SetView::default()
        };
        assert_eq!(
            acquire(&seen, &limit(3, 100), 1, NOW),
            Ok(Acquire::Denied {
                available: 1,
                retry_after_ms: 40
            })
        );
        // Nobody live: turned away only by the queue, so no wait to report.
        assert_eq!(
            acquire(&SetView::default(), &limit(3, 100), 4, NOW),
            Ok(Acquire::Denied {
                available: 0,
                retry_after_ms: 0
            })
        );
    }

    #[test]
    fn ids_count_on_from_the_stored_count() {
        let seen = SetView {
            live: 0,
            issued: 41,
            expire_at_ms: Some(NOW + 5),
            ..SetView::default()
        };
        let grant = granted(acquire(&seen, &limit(1, 1), 0, NOW));
        assert_eq!(grant.id.n, 42);
        // The expiry never shrinks.
        assert_eq!(grant.expire_at_ms, None);
    }

    #[test]
    fn a_key_without_expiry_gets_the_latest_deadline_it_holds() {
        let seen = SetView {
            issued: 3,
            latest_deadline_ms: Some(NOW + 90_000),
            ..SetView::default()
        };
        let grant = granted(acquire(&seen, &limit(5, 1_000), 0, NOW));
        assert_eq!(grant.expire_at_ms, Some(NOW + 90_000));
    }

    #[test]
    fn the_count_stops_at_2_pow_53() {
        let seen = SetView {
            issued: MAX_EXACT_INTEGER,
            ..SetView::default()
        };
        assert_eq!(
            acquire(&seen, &limit(1, 1), 0, NOW),
            Err(TbError::LeaseIdsExhausted)
        );
    }

    #[test]
    fn deadlines_stop_at_2_pow_53() {
        assert_eq!(deadline_ms(NOW, MAX_EXACT_INTEGER), MAX_EXACT_INTEGER);
        assert_eq!(deadline_ms(i64::MAX, 1), MAX_EXACT_INTEGER);
        assert_eq!(deadline_ms(NOW, 1), NOW + 1);
    }

    #[test]
    fn a_lease_ends_at_its_deadline() {
        assert!(is_live(NOW + 1, NOW));
        assert!(!is_live(NOW, NOW));
    }

    #[test]
    fn renewal_moves_a_live_lease_only() {
        let seen = SetView {
            expire_at_ms: Some(NOW + 100),
            ..SetView::default()
        };
        assert_eq!(
            renew(&seen, Some(NOW + 50), 1_000, NOW),
            Some((NOW + 1_000, Some(NOW + 1_000)))
        );
        // Sooner than before is allowed; the expiry stays.
        assert_eq!(
            renew(&seen, Some(NOW + 50), 10, NOW),
            Some((NOW + 10, None))
        );
        assert_eq!(renew(&seen, Some(NOW), 1_000, NOW), None);
        assert_eq!(renew(&seen, None, 1_000, NOW), None);
    }

    #[test]
    fn only_digits_dash_digits_is_a_lease_id() {
        assert!(is_lease_id(b"1764633600000-1"));
        assert!(is_lease_id(b"0-0"));
        for bad in [
            &b"seq"[..],
            b"",
            b"-",
            b"1-",
            b"-1",
            b"1-2-3",
            b"1 -2",
            b"+1-2",
            b"1-2\n",
        ] {
            assert!(!is_lease_id(bad), "{bad:?}");
        }
        assert!(!is_lease_id(&[b'1'; 65]));
    }

    #[test]
    fn the_count_is_minus_a_whole_score_down_to_minus_2_pow_53() {
        assert_eq!(issued_from_score(0.0), Some(0));
        assert_eq!(issued_from_score(-7.0), Some(7));
        assert_eq!(
            issued_from_score(-(MAX_EXACT_INTEGER as f64)),
            Some(MAX_EXACT_INTEGER)
        );
        for bad in [
            1.0,
            -0.5,
            f64::NAN,
            f64::NEG_INFINITY,
            -(MAX_EXACT_INTEGER as f64) * 2.0,
        ] {
            assert_eq!(issued_from_score(bad), None, "{bad}");
        }
    }

    /// A reference model: the leases themselves, by id and deadline.
    #[derive(Default)]
    struct Model {
        leases: Vec<(LeaseId, i64)>,
        issued: i64,
        expire_at_ms: Option<i64>,
    }

    impl Model {
        fn seen(&self, now_ms: i64) -> SetView {
            let live: Vec<i64> = self
                .leases
                .iter()
                .map(|(_, deadline)| *deadline)
                .filter(|deadline| is_live(*deadline, now_ms))
                .collect();
            SetView {
                live: live.len() as i64,
                earliest_deadline_ms: live.iter().copied().min(),
                issued: self.issued,
                expire_at_ms: self.expire_at_ms,
                latest_deadline_ms: self.leases.iter().map(|(_, deadline)| *deadline).max(),
            }
        }
    }

    proptest! {
        /// On a virtual clock, any mix of acquires, releases and renewals
        /// never has more than `limit` live leases at any instant, never
        /// hands out an id twice, never lets the key expire before a live
        /// lease, and denies only when the slots are really taken.
        #[test]
        fn never_more_than_limit_live_and_no_id_twice(
            steps in proptest::collection::vec((0u8..3, 0i64..40, 1i64..60, 0usize..8), 1..200),
            limit_value in 1i64..5,
        ) {
            let mut model = Model::default();
            let mut now = NOW;
            let mut handed_out = std::collections::HashSet::new();
            for (kind, advance, lease_ms, pick) in steps {
                now += advance;
                // The key expires by itself at its expiry, leases and all.
                if model.expire_at_ms.is_some_and(|at| at <= now) {
                    model = Model { issued: 0, ..Model::default() };
                }
                let seen = model.seen(now);
                match kind {
                    0 => match acquire(&seen, &limit(limit_value, lease_ms), 0, now).unwrap() {
                        Acquire::Granted(grant) => {
                            prop_assert!(seen.live < limit_value);
                            prop_assert!(handed_out.insert(grant.id), "id {:?} twice", grant.id);
                            model.leases.push((grant.id, grant.deadline_ms));
                            model.issued = grant.id.n;
                            if let Some(at) = grant.expire_at_ms {
                                model.expire_at_ms = Some(at);
                            }
                        }
                        Acquire::Denied { retry_after_ms, available } => {
                            prop_assert!(seen.live >= limit_value);
                            prop_assert_eq!(available, 0);
                            prop_assert!(retry_after_ms > 0);
                        }
                    },
                    1 => {
                        if let Some(index) = (!model.leases.is_empty()).then(|| pick % model.leases.len()) {
                            model.leases.remove(index);
                        }
                    }
                    _ => {
                        if let Some(index) = (!model.leases.is_empty()).then(|| pick % model.leases.len()) {
                            let current = model.leases[index].1;
                            if let Some((deadline, expiry)) = renew(&seen, Some(current), lease_ms, now) {
                                model.leases[index].1 = deadline;
                                if let Some(at) = expiry {
                                    model.expire_at_ms = Some(at);
                                }
                            }
                        }
                    }
                }
                let after = model.seen(now);
                prop_assert!(after.live <= limit_value);
                if let (Some(expiry), Some(latest)) = (model.expire_at_ms, after.earliest_deadline_ms) {
                    prop_assert!(expiry >= latest);
                }
                if let Some(latest) = model.leases.iter().filter(|(_, d)| is_live(*d, now)).map(|(_, d)| *d).max() {
                    prop_assert!(model.expire_at_ms.is_some_and(|at| at >= latest));
                }
            }
        }
    }
}
