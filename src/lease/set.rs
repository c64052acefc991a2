//! A lease set in the keyspace: type check, read into a [`SetView`], and the
//! writes of a grant, a release and a renewal with their propagation.
//!
//! Layout (shared with lua/tb.lua, so either can take over from the other):
//! a sorted set with one member per lease, its id scored by its deadline
//! (Unix ms), the member `seq` scored by minus the count of ids handed out,
//! and the member `inc` scored by minus the set's incarnation (drawn from
//! the server's random source by the grant that makes the set; a set made
//! before incarnations has no `inc`). The key expires at the latest
//! deadline it has handed out.
//!
//! Replicas and the AOF get plain ZREM / ZADD / PEXPIREAT with the values
//! computed here, never the command, so they need no module and replay to
//! exactly the master's set.

use redis_tb_core::error::TbError;
use redis_tb_core::lease::{
    self, Grant, Incarnation, SetIncarnation, SetView, MAX_EXPIRED_REMOVED,
};
use redis_tb_core::number::format_integer;

use crate::server::context::{Context, Notify};
use crate::server::keys::{Access, Key, KeyType, RangeStart};
use crate::server::metrics;
use crate::server::strings::{ServerStr, ServerString};

/// The bookkeeping members' names (`Api::seq_member`, `Api::inc_member`
/// as bytes).
const SEQ: &[u8] = b"seq";
const INC: &[u8] = b"inc";

/// An open lease-set key; closed when dropped.
pub struct LeaseSet<'a> {
    ctx: Context<'a>,
    name: &'a ServerStr,
    /// `None` when a read finds no key.
    key: Option<Key<'a>>,
}

/// How much of the set a read counts.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Count {
    /// The live leases and the earliest deadline too.
    Live,
    /// Only `seq` and the ended leases.
    EndedOnly,
}

/// What a call read: the figures, and the ended leases a write removes.
pub struct Read<'a> {
    pub seen: SetView,
    pub expired: Vec<ServerString<'a>>,
    /// Whether `expired` holds every member scored <= now but `seq` and
    /// `inc`: then any other member is a live lease, with no lookup.
    pub all_ended_seen: bool,
}

impl Read<'_> {
    /// A read of nothing: no ended leases to remove (TB.FLOOR.*).
    #[cfg(feature = "bench-floor")]
    pub fn nothing() -> Self {
        Read {
            seen: SetView::default(),
            expired: Vec::new(),
            all_ended_seen: false,
        }
    }
}

impl<'a> LeaseSet<'a> {
    /// Opens `name`, empty or a sorted set (WRONGTYPE otherwise).
    pub fn open(ctx: Context<'a>, name: &'a ServerStr, access: Access) -> Result<Self, TbError> {
        Ok(LeaseSet {
            ctx,
            name,
            key: ctx.open(name, access, KeyType::Zset)?,
        })
    }

    pub fn exists(&self) -> bool {
        !self.is_empty()
    }

    fn is_empty(&self) -> bool {
        self.key.as_ref().is_none_or(Key::is_empty)
    }

    /// The set as seen at `now_ms`, with its expiry: what TB.ACQUIRE and a
    /// wake-up decide on. A missing set comes with a new incarnation,
    /// drawn from the server's random source, for the grant that would make
    /// it. `CorruptLeaseSet` (naming argument `key_arg`) if it has no usable
    /// `seq` member.
    pub fn read(&mut self, now_ms: i64, key_arg: usize) -> Result<Read<'a>, TbError> {
        let mut read = self.scan(now_ms, key_arg, Count::Live)?;
        if self.is_empty() {
            let drawn = Incarnation::from_random(self.ctx.random_u64());
            read.seen.incarnation = SetIncarnation::New(drawn);
        }
        Ok(self.with_expiry(read, now_ms))
    }

    /// What TB.RENEW needs: as [`read_ended`](Self::read_ended), with the
    /// expiry (a renewal may move it), without counting the live leases.
    pub fn read_for_renewal(&mut self, now_ms: i64, key_arg: usize) -> Result<Read<'a>, TbError> {
        let read = self.scan(now_ms, key_arg, Count::EndedOnly)?;
        Ok(self.with_expiry(read, now_ms))
    }

    fn with_expiry(&mut self, mut read: Read<'a>, now_ms: i64) -> Read<'a> {
        if self.is_empty() {
            return read;
        }
        read.seen.expire_at_ms = self.expire_at_ms(now_ms);
        if read.seen.expire_at_ms.is_none() {
            read.seen.latest_deadline_ms = self.last_score_above(0.0).map(whole_ms);
        }
        read
    }

    /// What TB.RELEASE needs: the `seq` check and the ended leases a write
    /// removes; the live count, the earliest deadline and the expiry stay
    /// unset (a release never moves the expiry).
    pub fn read_ended(&mut self, now_ms: i64, key_arg: usize) -> Result<Read<'a>, TbError> {
        self.scan(now_ms, key_arg, Count::EndedOnly)
    }

    /// One pass from the lowest score: `seq` and `inc` (and any other member
    /// scored <= 0, which is never a lease), then the ended leases (kept for
    /// removal, the 64 earliest), then the earliest live one. Past either
    /// bound the rest are looked up or counted by the server instead, so a
    /// call's work stays bounded however many leases ended unnoticed.
    fn scan(&mut self, now_ms: i64, key_arg: usize, count: Count) -> Result<Read<'a>, TbError> {
        let mut read = Read {
            seen: SetView::default(),
            expired: Vec::new(),
            all_ended_seen: false,
        };
        let key = match &mut self.key {
            Some(key) if !key.is_empty() => key,
            _ => return Ok(read),
        };
        let now = now_ms as f64;
        // `seq` and `inc` are found on the way (they are scored <= 0, so they
        // come first): a lookup by name would scan a small set's listpack
        // once more.
        let mut seq_score = None;
        let mut inc_score = None;
        const MAX_NOT_POSITIVE: usize = 8;
        let mut not_positive = 0usize;
        let mut expired = 0usize;
        let mut earliest = None;
        let mut overflow = false;
        let whole_set = (f64::NEG_INFINITY, false);
        if let Some(mut range) =
            key.score_range(RangeStart::Lowest, whole_set, (f64::INFINITY, false))
        {
            let mut more = true;
            while more && !range.at_end() {
                let (element, score) = range.current();
                if score > now {
                    earliest = Some(score);
                    break;
                }
                if score > 0.0 {
                    expired = expired.saturating_add(1);
                    if expired > MAX_EXPIRED_REMOVED {
                        overflow = true;
                        break;
                    }
                    read.expired.extend(element);
                } else {
                    match element.as_deref().map(ServerStr::bytes) {
                        Some(SEQ) => seq_score = Some(score),
                        Some(INC) => inc_score = Some(score),
                        _ => {}
                    }
                    not_positive = not_positive.saturating_add(1);
                    if not_positive > MAX_NOT_POSITIVE {
                        overflow = true;
                        break;
                    }
                }
                more = range.advance();
            }
        }
        let api = self.ctx.api();
        read.seen.issued = seq_score
            .or_else(|| self.score(api.seq_member.get()))
            .and_then(lease::issued_from_score)
            .ok_or(TbError::CorruptLeaseSet { key_arg })?;
        let bookkeeping = 1usize.saturating_add(usize::from(inc_score.is_some()));
        read.all_ended_seen = !overflow && not_positive == bookkeeping && seq_score.is_some();
        let stopped_among_not_positive = overflow && expired <= MAX_EXPIRED_REMOVED;
        if stopped_among_not_positive {
            // Stopped among the members scored <= 0: `inc`, if not met yet,
            // and the ended leases are looked up on their own.
            inc_score = inc_score.or_else(|| self.score(api.inc_member.get()));
            read.expired = self.earliest_ended(now);
        }
        // An `inc` scored otherwise than minus an incarnation (or above 0,
        // where it counts as a lease) is no incarnation: the set hands out
        // ids as a set made before incarnations.
        read.seen.incarnation = inc_score
            .and_then(Incarnation::from_score)
            .map_or(SetIncarnation::Legacy, SetIncarnation::Stored);
        if count == Count::EndedOnly {
            return Ok(read);
        }
        read.seen.live = if overflow {
            earliest = self.first_score_above(now);
            self.count_live(now_ms)?
        } else {
            let length = self.key.as_ref().map_or(0, Key::length);
            let length = i64::try_from(length).unwrap_or(i64::MAX);
            let not_live = not_positive.saturating_add(expired);
            length.saturating_sub(i64::try_from(not_live).unwrap_or(i64::MAX))
        };
        read.seen.earliest_deadline_ms = earliest.map(whole_ms);
        Ok(read)
    }

    /// The score of `member`, if it is in the set.
    pub fn score(&self, member: &ServerStr) -> Option<f64> {
        match &self.key {
            Some(key) if !key.is_empty() => key.zset_score(member),
            _ => None,
        }
    }

    /// The ended leases with the earliest deadlines, scored in (0, now], at
    /// most `MAX_EXPIRED_REMOVED`.
    fn earliest_ended(&mut self, now: f64) -> Vec<ServerString<'a>> {
        let mut ended = Vec::new();
        let Some(key) = &mut self.key else {
            return ended;
        };
        if let Some(mut range) = key.score_range(RangeStart::Lowest, (0.0, true), (now, false)) {
            let mut more = true;
            while more && !range.at_end() && ended.len() < MAX_EXPIRED_REMOVED {
                let (element, _) = range.current();
                ended.extend(element);
                more = range.advance();
            }
        }
        ended
    }

    /// The lowest score above `floor`.
    fn first_score_above(&mut self, floor: f64) -> Option<f64> {
        self.edge_score(RangeStart::Lowest, floor)
    }

    /// The highest score above `floor`.
    fn last_score_above(&mut self, floor: f64) -> Option<f64> {
        self.edge_score(RangeStart::Highest, floor)
    }

    /// The score where `start` (the first or last element in a score range)
    /// puts the range (floor, +inf], if it holds anything.
    fn edge_score(&mut self, start: RangeStart, floor: f64) -> Option<f64> {
        let range = self
            .key
            .as_mut()?
            .score_range(start, (floor, true), (f64::INFINITY, false))?;
        if range.at_end() {
            return None;
        }
        let (_element, score) = range.current();
        Some(score)
    }

    /// ZCOUNT key (now +inf, through the server: only when more ended
    /// leases wait for removal than one call looks at.
    fn count_live(&self, now_ms: i64) -> Result<i64, TbError> {
        let mut min = b"(".to_vec();
        min.extend_from_slice(format_integer(now_ms).as_bytes());
        let min = self.ctx.string(&min).ok_or(TbError::Internal)?;
        self.ctx.zcount(self.name, &min, c"+inf").ok_or_else(|| {
            self.ctx.warn(
                "tb: ZCOUNT through RM_Call failed (renamed or disabled?): \
                 a lease set with more than 64 ended leases cannot be counted",
            );
            TbError::Internal
        })
    }

    fn expire_at_ms(&self, now_ms: i64) -> Option<i64> {
        let key = self.key.as_ref()?;
        let at = match key.abs_expire() {
            Some(at) => at,
            None => match key.ttl() {
                relative if relative >= 0 => now_ms.saturating_add(relative),
                none => none,
            },
        };
        (at >= 0).then_some(at)
    }

    /// Stores new leases (one per waiter a wake-up serves, or one for
    /// TB.ACQUIRE), the count after them, the removal of `expired` and the
    /// expiry, then tells replicas, the AOF and listeners. The grant that
    /// makes the set (the first of a new set's) also stores its incarnation,
    /// in the same ZADD.
    pub fn grant(&self, read: &Read<'a>, grants: &[Grant]) -> Result<(), TbError> {
        let Some(last) = grants.last() else {
            return Ok(());
        };
        let made = grants.iter().find_map(|grant| grant.new_incarnation);
        let ids: Vec<ServerString> = grants
            .iter()
            .map(|grant| self.ctx.string(grant.id.text().as_bytes()))
            .collect::<Option<_>>()
            .ok_or(TbError::WriteFailed)?;
        let issued = last.id.n;
        let expire_at_ms = grants.iter().filter_map(|grant| grant.expire_at_ms).max();
        for (grant, id) in grants.iter().zip(&ids) {
            self.add(grant.deadline_ms as f64, id)?;
        }
        let api = self.ctx.api();
        let (seq, inc) = (api.seq_member.get(), api.inc_member.get());
        self.add(-(issued as f64), seq)?;
        if let Some(made) = made {
            self.add(made.score() as f64, inc)?;
        }
        let count = issued.saturating_neg();
        let (ctx, name) = (self.ctx, self.name);
        self.after_zadd(read, expire_at_ms, || {
            match (grants, ids.as_slice(), made) {
                ([grant], [id], None) => {
                    ctx.replicate_scored(c"ZADD", name, &[(grant.deadline_ms, id), (count, seq)])
                }
                ([grant], [id], Some(made)) => ctx.replicate_scored(
                    c"ZADD",
                    name,
                    &[(grant.deadline_ms, id), (count, seq), (made.score(), inc)],
                ),
                _ => {
                    let mut pairs: Vec<(i64, &ServerStr)> = grants
                        .iter()
                        .zip(&ids)
                        .map(|(grant, id)| (grant.deadline_ms, &**id))
                        .collect();
                    pairs.push((count, seq));
                    if let Some(made) = made {
                        pairs.push((made.score(), inc));
                    }
                    ctx.replicate_scored(c"ZADD", name, &pairs)
                }
            }
        })
    }

    /// Removes `lease` and, if it was there, `expired`; whether it was
    /// there. The caller knows `lease` is live if present: it checked the
    /// deadline, or `read` saw every ended member.
    pub fn release(&self, read: &Read<'a>, lease: &ServerStr) -> Result<bool, TbError> {
        let Some(key) = &self.key else {
            return Err(TbError::WriteFailed);
        };
        if !key.zset_rem(lease).map_err(|_| TbError::WriteFailed)? {
            return Ok(false);
        }
        self.remove(&read.expired);
        self.propagate_removal(&read.expired, Some(lease));
        self.signal();
        Ok(true)
    }

    /// Moves the live lease `lease` to `deadline_ms`, with `expired` removed.
    pub fn renew(
        &self,
        read: &Read<'a>,
        lease: &ServerStr,
        deadline_ms: i64,
        expire_at_ms: Option<i64>,
    ) -> Result<(), TbError> {
        self.add(deadline_ms as f64, lease)?;
        let (ctx, name) = (self.ctx, self.name);
        self.after_zadd(read, expire_at_ms, || {
            ctx.replicate_scored(c"ZADD", name, &[(deadline_ms, lease)])
        })
    }

    /// What follows the ZADDs of a grant or a renewal: the ended leases out,
    /// the expiry moved, then replicas and the AOF told in the order they
    /// must replay (ZREM, the `zadd` that `replicate_zadd` sends, PEXPIREAT),
    /// and listeners and WATCH last.
    fn after_zadd(
        &self,
        read: &Read<'a>,
        expire_at_ms: Option<i64>,
        replicate_zadd: impl FnOnce() -> Result<(), TbError>,
    ) -> Result<(), TbError> {
        self.remove(&read.expired);
        if let Some(at) = expire_at_ms {
            self.set_expiry(at)?;
        }
        self.propagate_removal(&read.expired, None);
        replicate_zadd()?;
        self.ctx.notify(Notify::Zset, c"zadd", self.name);
        if let Some(at) = expire_at_ms {
            self.propagate_expiry(at);
        }
        self.signal();
        Ok(())
    }

    fn add(&self, score: f64, member: &ServerStr) -> Result<(), TbError> {
        match &self.key {
            Some(key) if key.zset_add(score, member) => Ok(()),
            _ => Err(TbError::WriteFailed),
        }
    }

    fn remove(&self, expired: &[ServerString<'a>]) {
        if let Some(key) = &self.key {
            for member in expired {
                // The key holds a sorted set (its `seq` member is never among
                // these, so it never empties).
                let _ = key.zset_rem(member);
            }
        }
        metrics::LEASES_EXPIRED.add_count(expired.len());
    }

    fn set_expiry(&self, at_ms: i64) -> Result<(), TbError> {
        let Some(key) = &self.key else {
            return Err(TbError::WriteFailed);
        };
        let set = match key.set_abs_expire(at_ms) {
            Some(set) => set,
            None => key.set_expire(at_ms.saturating_sub(self.ctx.wall_ms()).max(1)),
        };
        if set {
            Ok(())
        } else {
            Err(TbError::WriteFailed)
        }
    }

    /// `ZREM key <expired...> [lease]`, if there is anything to remove.
    fn propagate_removal(&self, expired: &[ServerString<'a>], lease: Option<&ServerStr>) {
        if expired.is_empty() && lease.is_none() {
            return;
        }
        let members = expired.iter().map(|member| &**member).chain(lease);
        self.ctx.replicate_list(c"ZREM", self.name, members);
        self.ctx.notify(Notify::Zset, c"zrem", self.name);
    }

    fn propagate_expiry(&self, at_ms: i64) {
        self.ctx.replicate_integer(c"PEXPIREAT", self.name, at_ms);
        self.ctx.notify(Notify::Generic, c"expire", self.name);
    }

    /// WATCH and client tracking (the module opts out of the implicit
    /// signal on every write-open).
    fn signal(&self) {
        self.ctx.signal_modified(self.name);
    }
}

/// A score as whole ms (scores this module writes are whole already).
pub fn whole_ms(score: f64) -> i64 {
    // `as` saturates, and a sorted set holds no NaN.
    score.ceil() as i64
}
