//! The rules of concurrency leases (TB.ACQUIRE, TB.RELEASE, TB.RENEW),
//! pure: no Redis types, no clock of its own. src/lease/set.rs reads a
//! lease set into a [`SetView`] and writes back what these functions decide.
//!
//! A lease is live while `now < deadline`. At most `limit` may be live at
//! once; a lease that has ended never holds a slot, whether or not a call
//! has removed it yet. Ids are `<ms>-<n>-<incarnation>`: the grant's
//! instant, the set's running count, and the random number the set was
//! made with ([`Incarnation`]), so no id is handed out twice on a key, even
//! when the set is made anew after the clock stepped back (docs/leases.md,
//! "Lease ids"). Sets made before incarnations have none, and keep handing
//! out `<ms>-<n>` until they are gone.

use crate::error::TbError;
use crate::number::{format_integer, MAX_EXACT_INTEGER};

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

/// The number a lease set is made with: drawn from the server's random
/// source by the call that makes the set, stored with it (the `inc` member,
/// scored by minus it, so RDB, AOF and replicas keep it and never draw
/// their own) and the last part of each of its ids. A set made anew, after
/// an expiry or a DEL, draws again, so its ids differ from every id its
/// earlier incarnations handed out, whatever the clock did in between.
///
/// In [1, 2^53], so the score holding it is exact.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Incarnation(i64);

impl Incarnation {
    /// The incarnation for 64 random bits: their top 53, plus 1.
    pub fn from_random(bits: u64) -> Incarnation {
        let top = i64::try_from(bits.checked_shr(11).unwrap_or(0)).unwrap_or(0);
        Incarnation(top.saturating_add(1))
    }

    /// The incarnation stored as the `inc` member's `score`, if it is one: a
    /// whole number in [-2^53, -1]. Any other score is no incarnation (the
    /// member is then just another member, and the set has none).
    pub fn from_score(score: f64) -> Option<Incarnation> {
        if !(score <= -1.0 && score >= -(MAX_EXACT_INTEGER as f64)) || score.fract() != 0.0 {
            return None;
        }
        // A whole number within [-2^53, -1]: the conversion is exact.
        Some(Incarnation((score as i64).saturating_neg()))
    }

    /// The incarnation as a number, in [1, 2^53] (as the id shows it).
    pub fn value(self) -> i64 {
        self.0
    }

    /// The `inc` member's score: minus the incarnation, so that, like `seq`,
    /// it is never in a range of deadlines.
    pub fn score(self) -> i64 {
        self.0.saturating_neg()
    }
}

/// Which ids a lease set hands out, as a call sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SetIncarnation {
    /// A set made before incarnations (no `inc` member): ids `<ms>-<n>`,
    /// unique for as long as the set lives, which is all it ever promised.
    #[default]
    Legacy,
    /// The set's own, stored with it: ids `<ms>-<n>-<incarnation>`.
    Stored(Incarnation),
    /// The set does not exist yet: the grant that makes it takes this one,
    /// freshly drawn, and stores it.
    New(Incarnation),
}

impl SetIncarnation {
    /// The incarnation its ids carry, if any.
    pub fn incarnation(self) -> Option<Incarnation> {
        match self {
            SetIncarnation::Legacy => None,
            SetIncarnation::Stored(incarnation) | SetIncarnation::New(incarnation) => {
                Some(incarnation)
            }
        }
    }
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
    /// The set's incarnation; for a set that does not exist yet, the one a
    /// grant would make it with.
    pub incarnation: SetIncarnation,
}

/// A lease id: `<ms>-<n>-<incarnation>`, or `<ms>-<n>` from a set made
/// before incarnations. Each part is a whole number in decimal, without
/// leading zeros; `ms` in [0, 2^53], `n` and the incarnation in [1, 2^53].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LeaseId {
    pub granted_ms: i64,
    pub n: i64,
    pub incarnation: Option<Incarnation>,
}

/// The text of a lease id, at most [`MAX_ID_LEN`] bytes, without a heap
/// allocation.
#[derive(Clone, Copy)]
pub struct IdText {
    bytes: [u8; MAX_ID_LEN],
    len: usize,
}

impl IdText {
    pub fn as_bytes(&self) -> &[u8] {
        self.bytes.get(..self.len).unwrap_or_default()
    }

    /// Appends `text`; a write past the end (which no id needs: three parts
    /// of at most 16 digits and two dashes) is dropped.
    fn push(&mut self, text: &[u8]) {
        let Some(end) = self.len.checked_add(text.len()) else {
            return;
        };
        if let Some(dest) = self.bytes.get_mut(self.len..end) {
            dest.copy_from_slice(text);
            self.len = end;
        }
    }
}

impl LeaseId {
    /// The id's text.
    pub fn text(&self) -> IdText {
        let mut text = IdText {
            bytes: [0; MAX_ID_LEN],
            len: 0,
        };
        text.push(format_integer(self.granted_ms).as_bytes());
        text.push(b"-");
        text.push(format_integer(self.n).as_bytes());
        if let Some(incarnation) = self.incarnation {
            text.push(b"-");
            text.push(format_integer(incarnation.value()).as_bytes());
        }
        text
    }

    /// The id `bytes` spell, if they are the text of one: the inverse of
    /// [`text`](Self::text), so no two ids share a text (an id of a set
    /// made before incarnations has two parts, every other three).
    pub fn parse(bytes: &[u8]) -> Option<LeaseId> {
        if bytes.len() > MAX_ID_LEN {
            return None;
        }
        let mut parts = bytes.split(|byte| *byte == b'-');
        let granted_ms = canonical_integer(parts.next()?)?;
        let n = canonical_integer(parts.next()?).filter(|n| *n >= 1)?;
        let incarnation = match parts.next() {
            None => None,
            Some(part) => Some(Incarnation(
                canonical_integer(part).filter(|value| *value >= 1)?,
            )),
        };
        if parts.next().is_some() {
            return None;
        }
        Some(LeaseId {
            granted_ms,
            n,
            incarnation,
        })
    }
}

/// `bytes` as a whole number in [0, 2^53] written as `format_integer`
/// writes it: digits only, no leading zero (but `0` itself).
fn canonical_integer(bytes: &[u8]) -> Option<i64> {
    let leading_zero = bytes.len() > 1 && bytes.first() == Some(&b'0');
    if bytes.is_empty() || bytes.len() > 16 || leading_zero {
        return None;
    }
    let mut value: i64 = 0;
    for byte in bytes {
        let digit = byte
            .is_ascii_digit()
            .then(|| i64::from(byte.wrapping_sub(b'0')))?;
        value = value.checked_mul(10)?.checked_add(digit)?;
    }
    (value <= MAX_EXACT_INTEGER).then_some(value)
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
    /// The incarnation to store with this grant: the set's, when this grant
    /// makes the set.
    pub new_incarnation: Option<Incarnation>,
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
            incarnation: seen.incarnation.incarnation(),
        },
        deadline_ms,
        available: free(limit.limit, live, 0),
        expire_at_ms: expiry_after(seen, deadline_ms),
        new_incarnation: match seen.incarnation {
            SetIncarnation::New(incarnation) => Some(incarnation),
            SetIncarnation::Legacy | SetIncarnation::Stored(_) => None,
        },
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
        // The grant made the set, if it was new: the next is on that set.
        incarnation: match seen.incarnation {
            SetIncarnation::New(incarnation) => SetIncarnation::Stored(incarnation),
            other => other,
        },
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

/// Whether `bytes` has the shape of a lease id: two or three groups of
/// digits joined by dashes (`<ms>-<n>`, `<ms>-<n>-<incarnation>`), at most
/// [`MAX_ID_LEN`] bytes. Only such members are ever released or renewed, so
/// no argument can touch the `seq` or `inc` member or a member someone else
/// stored. Looser than [`LeaseId::parse`] (leading zeros, any number of
/// digits), as it always was: such a member is looked up, and simply not
/// found.
pub fn is_lease_id(bytes: &[u8]) -> bool {
    if bytes.len() > MAX_ID_LEN {
        return false;
    }
    let mut groups = 0usize;
    for part in bytes.split(|byte| *byte == b'-') {
        if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
            return false;
        }
        groups = groups.saturating_add(1);
    }
    (2..=3).contains(&groups)
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

    /// The view of a missing key, as the module reads it: nothing in it, and
    /// the incarnation drawn for it.
    fn missing(incarnation: i64) -> SetView {
        SetView {
            incarnation: SetIncarnation::New(Incarnation(incarnation)),
            ..SetView::default()
        }
    }

    #[test]
    fn the_first_lease_on_a_missing_key_is_number_one_and_makes_the_set() {
        let grant = granted(acquire(&missing(42), &limit(2, 30_000), 0, NOW));
        assert_eq!(grant.id.text().as_bytes(), b"1764633600000-1-42");
        assert_eq!(grant.deadline_ms, NOW + 30_000);
        assert_eq!(grant.available, 1);
        assert_eq!(grant.expire_at_ms, Some(NOW + 30_000));
        assert_eq!(grant.new_incarnation, Some(Incarnation(42)));
    }

    #[test]
    fn a_set_hands_out_ids_of_its_own_incarnation_and_stores_it_only_once() {
        let new = missing(7);
        let first = granted(acquire(&new, &limit(5, 100), 0, NOW));
        let after = after_grant(&new, &first);
        assert_eq!(after.incarnation, SetIncarnation::Stored(Incarnation(7)));
        // The next head a wake-up serves, and any later call, is on that set.
        let second = granted(acquire(&after, &limit(5, 100), 0, NOW));
        assert_eq!(second.id.text().as_bytes(), b"1764633600000-2-7");
        assert_eq!(second.new_incarnation, None);
        let stored = SetView {
            issued: 9,
            incarnation: SetIncarnation::Stored(Incarnation(MAX_EXACT_INTEGER)),
            ..SetView::default()
        };
        let tenth = granted(acquire(&stored, &limit(5, 100), 0, NOW));
        assert_eq!(
            tenth.id.text().as_bytes(),
            b"1764633600000-10-9007199254740992"
        );
        assert_eq!(tenth.new_incarnation, None);
    }

    #[test]
    fn a_set_made_before_incarnations_keeps_handing_out_ms_dash_n() {
        let legacy = SetView {
            issued: 3,
            ..SetView::default()
        };
        let grant = granted(acquire(&legacy, &limit(5, 100), 0, NOW));
        assert_eq!(grant.id.text().as_bytes(), b"1764633600000-4");
        assert_eq!(grant.new_incarnation, None);
        assert_eq!(
            after_grant(&legacy, &grant).incarnation,
            SetIncarnation::Legacy
        );
    }

    #[test]
    fn the_same_instant_and_count_on_a_set_made_anew_is_another_id() {
        // The clock stepped back to the instant of an id of the set that
        // expired: the new set's first id has its ms and n, not its text.
        let before = granted(acquire(&missing(1_000_001), &limit(1, 1_000), 0, NOW));
        let again = granted(acquire(&missing(2_000_002), &limit(1, 1_000), 0, NOW));
        assert_eq!(
            (before.id.granted_ms, before.id.n),
            (again.id.granted_ms, again.id.n)
        );
        assert_ne!(before.id.text().as_bytes(), again.id.text().as_bytes());
    }

    #[test]
    fn an_incarnation_takes_the_top_53_random_bits_plus_one() {
        assert_eq!(Incarnation::from_random(0).value(), 1);
        assert_eq!(Incarnation::from_random(2047).value(), 1);
        assert_eq!(Incarnation::from_random(2048).value(), 2);
        assert_eq!(
            Incarnation::from_random(u64::MAX).value(),
            MAX_EXACT_INTEGER
        );
    }

    #[test]
    fn an_incarnation_is_minus_a_whole_score_from_minus_1_to_minus_2_pow_53() {
        let max = MAX_EXACT_INTEGER as f64;
        assert_eq!(Incarnation::from_score(-1.0), Some(Incarnation(1)));
        assert_eq!(
            Incarnation::from_score(-max),
            Some(Incarnation(MAX_EXACT_INTEGER))
        );
        for bad in [
            0.0,
            -0.0,
            -0.5,
            -1.5,
            1.0,
            -max - 2.0,
            f64::NAN,
            f64::NEG_INFINITY,
            f64::INFINITY,
        ] {
            assert_eq!(Incarnation::from_score(bad), None, "{bad}");
        }
        let incarnation = Incarnation::from_random(0x1234_5678_9abc_def0);
        assert_eq!(
            Incarnation::from_score(incarnation.score() as f64),
            Some(incarnation)
        );
    }

    #[test]
    fn a_full_set_denies_with_the_wait_for_the_earliest_live_lease() {
        let seen = SetView {
            live: 2,
            earliest_deadline_ms: Some(NOW + 1_500),
            issued: 9,
            expire_at_ms: Some(NOW + 9_000),
            latest_deadline_ms: Some(NOW + 9_000),
            incarnation: SetIncarnation::Stored(Incarnation(5)),
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
    fn only_two_or_three_groups_of_digits_joined_by_dashes_are_a_lease_id() {
        assert!(is_lease_id(b"1764633600000-1"));
        assert!(is_lease_id(b"1764633600000-1-4503599627370496"));
        assert!(is_lease_id(b"0-0"));
        assert!(is_lease_id(b"1-2-3"));
        assert!(is_lease_id(b"01-02-03"));
        for bad in [
            &b"seq"[..],
            b"inc",
            b"",
            b"-",
            b"1-",
            b"-1",
            b"1--2",
            b"1-2-",
            b"1-2-3-4",
            b"1 -2",
            b"+1-2",
            b"1-2\n",
            b"1-2-x",
        ] {
            assert!(!is_lease_id(bad), "{bad:?}");
        }
        assert!(!is_lease_id(&[b'1'; 65]));
        let mut longest = vec![b'1'; MAX_ID_LEN];
        longest.splice(20..21, [b'-']);
        longest.splice(40..41, [b'-']);
        assert!(is_lease_id(&longest) && !is_lease_id(&[longest.as_slice(), b"1"].concat()));
    }

    #[test]
    fn an_id_reads_back_only_from_the_text_it_is_written_as() {
        let id = |text: &[u8]| LeaseId::parse(text);
        assert_eq!(
            id(b"1764633600000-7-42"),
            Some(LeaseId {
                granted_ms: 1_764_633_600_000,
                n: 7,
                incarnation: Some(Incarnation(42)),
            })
        );
        assert_eq!(
            id(b"0-1"),
            Some(LeaseId {
                granted_ms: 0,
                n: 1,
                incarnation: None,
            })
        );
        for not_written in [
            &b"01-1"[..],
            b"1-01",
            b"1-1-01",
            b"1-0",
            b"1-1-0",
            b"1-9007199254740993",
            b"1-1-9007199254740993",
            b"1-1-99999999999999999",
            b"1-2-3-4",
            b"1-",
            b"x-1",
            b"",
        ] {
            assert_eq!(id(not_written), None, "{not_written:?}");
        }
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

    /// A reference model: the leases themselves, by id and deadline, and
    /// the set's incarnation (`Legacy` until a grant makes the set).
    #[derive(Default)]
    struct Model {
        leases: Vec<(LeaseId, i64)>,
        issued: i64,
        expire_at_ms: Option<i64>,
        incarnation: SetIncarnation,
    }

    impl Model {
        /// The set as a call sees it; a set not made yet gets `incarnation`.
        fn seen_or_new(&self, now_ms: i64, incarnation: Incarnation) -> SetView {
            let mut seen = self.seen(now_ms);
            if self.incarnation == SetIncarnation::Legacy {
                seen.incarnation = SetIncarnation::New(incarnation);
            }
            seen
        }

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
                incarnation: self.incarnation,
            }
        }
    }

    proptest! {
        /// Every id's text is at most `MAX_ID_LEN` bytes of digits and
        /// dashes, shaped like an id, and reads back as that id; an id with
        /// an incarnation never reads as one without.
        #[test]
        fn an_id_is_written_and_read_back_exactly(
            granted_ms in prop_oneof![0i64..=MAX_EXACT_INTEGER, Just(MAX_EXACT_INTEGER)],
            n in prop_oneof![1i64..=MAX_EXACT_INTEGER, Just(1), Just(MAX_EXACT_INTEGER)],
            bits in proptest::option::of(any::<u64>()),
        ) {
            let id = LeaseId { granted_ms, n, incarnation: bits.map(Incarnation::from_random) };
            let written = id.text();
            let text = written.as_bytes();
            prop_assert!(text.len() <= MAX_ID_LEN);
            prop_assert!(text.iter().all(|byte| byte.is_ascii_digit() || *byte == b'-'));
            prop_assert!(is_lease_id(text));
            prop_assert_eq!(LeaseId::parse(text), Some(id));
            let dashes = text.iter().filter(|byte| **byte == b'-').count();
            prop_assert_eq!(dashes, if bits.is_some() { 2 } else { 1 });
        }

        /// A text reads as an id only if it is that id's own text, so two
        /// ids never share one; whatever reads as an id is shaped like one.
        #[test]
        fn only_an_ids_own_text_reads_as_it(
            text in "[0-9]{1,17}-[0-9]{1,17}(-[0-9]{1,17})?(-[0-9]{1,3})?|[0-9a-z-]{0,70}",
        ) {
            if let Some(id) = LeaseId::parse(text.as_bytes()) {
                let written = id.text();
                prop_assert_eq!(written.as_bytes(), text.as_bytes());
                prop_assert!(is_lease_id(text.as_bytes()));
            }
        }

        /// On a virtual clock that now and then steps back (an NTP step, a
        /// restored snapshot, a promoted replica behind), any mix of
        /// acquires, releases and renewals never has more than `limit` live
        /// leases at any instant, never hands out an id (nor an id's text)
        /// twice, even on a set made anew at instants its predecessors
        /// used, never lets the key expire before a live lease, and denies
        /// only when the slots are really taken.
        #[test]
        fn never_more_than_limit_live_and_no_id_twice(
            steps in proptest::collection::vec((0u8..3, -10i64..40, 1i64..60, 0usize..8), 1..200),
            limit_value in 1i64..5,
        ) {
            let mut model = Model::default();
            let mut now = NOW;
            let mut handed_out = std::collections::HashSet::new();
            let mut texts = std::collections::HashSet::new();
            // The server's random source, as distinct draws.
            let mut draws = 0u64;
            for (kind, advance, lease_ms, pick) in steps {
                // Mostly forward; one step in five the clock steps back by
                // 10 to 100 ms, to before ids already handed out.
                now += if advance >= 0 { advance } else { advance * 10 };
                // The key expires by itself at its expiry, leases and all.
                if model.expire_at_ms.is_some_and(|at| at <= now) {
                    model = Model::default();
                }
                draws += 1;
                let seen = model.seen_or_new(now, Incarnation::from_random(draws << 11));
                match kind {
                    0 => match acquire(&seen, &limit(limit_value, lease_ms), 0, now).unwrap() {
                        Acquire::Granted(grant) => {
                            prop_assert!(seen.live < limit_value);
                            prop_assert!(handed_out.insert(grant.id), "id {:?} twice", grant.id);
                            let text = grant.id.text().as_bytes().to_vec();
                            prop_assert_eq!(LeaseId::parse(&text), Some(grant.id));
                            prop_assert!(texts.insert(text), "the text of {:?} twice", grant.id);
                            prop_assert_eq!(
                                grant.new_incarnation.is_some(),
                                model.incarnation == SetIncarnation::Legacy
                            );
                            // A write removes the ended leases (the server's
                            // 64 at most: these sets are smaller).
                            model.leases.retain(|(_, deadline)| is_live(*deadline, now));
                            model.leases.push((grant.id, grant.deadline_ms));
                            model.issued = grant.id.n;
                            model.incarnation = after_grant(&seen, &grant).incarnation;
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
                        // A release of a live lease writes; of an ended one, nothing.
                        if let Some(index) = (!model.leases.is_empty()).then(|| pick % model.leases.len()) {
                            if is_live(model.leases[index].1, now) {
                                model.leases.remove(index);
                                model.leases.retain(|(_, deadline)| is_live(*deadline, now));
                            }
                        }
                    }
                    _ => {
                        if let Some(index) = (!model.leases.is_empty()).then(|| pick % model.leases.len()) {
                            let current = model.leases[index].1;
                            if let Some((deadline, expiry)) = renew(&seen, Some(current), lease_ms, now) {
                                model.leases[index].1 = deadline;
                                model.leases.retain(|(_, deadline)| is_live(*deadline, now));
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
