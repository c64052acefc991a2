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

use std::os::raw::{c_int, c_longlong};

use redis_module::raw::{
    RedisModuleCtx, RedisModuleKey, RedisModuleString, REDISMODULE_KEYTYPE_EMPTY,
    REDISMODULE_KEYTYPE_ZSET, REDISMODULE_NOTIFY_GENERIC, REDISMODULE_NOTIFY_ZSET, REDISMODULE_OK,
};

use redis_tb_core::error::TbError;
use redis_tb_core::lease::{
    self, Grant, Incarnation, SetIncarnation, SetView, MAX_EXPIRED_REMOVED,
};
use redis_tb_core::number::format_integer;

use crate::server::api::Api;
use crate::server::keys::{open_key, Access, ServerString};
use crate::server::metrics;

/// The bookkeeping members' names (`Api::seq_member`, `Api::inc_member`
/// as bytes).
const SEQ: &[u8] = b"seq";
const INC: &[u8] = b"inc";

/// An open lease-set key; closed when dropped.
pub struct LeaseSet<'a> {
    api: &'a Api,
    ctx: *mut RedisModuleCtx,
    name: *mut RedisModuleString,
    key: *mut RedisModuleKey,
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
    /// Opens `name`, empty or a sorted set (see [`open_key`]).
    ///
    /// # Safety
    /// `ctx` and `name` must be live for as long as the set is open.
    pub unsafe fn open(
        api: &'a Api,
        ctx: *mut RedisModuleCtx,
        name: *mut RedisModuleString,
        access: Access,
    ) -> Result<Self, TbError> {
        Ok(LeaseSet {
            api,
            ctx,
            name,
            key: open_key(api, ctx, name, access, REDISMODULE_KEYTYPE_ZSET)?,
        })
    }

    pub fn exists(&self) -> bool {
        !self.is_empty()
    }

    fn is_empty(&self) -> bool {
        // SAFETY: `key` is open (or null, checked first).
        self.key.is_null()
            || unsafe { (self.api.key_type)(self.key) } as isize == REDISMODULE_KEYTYPE_EMPTY
    }

    /// The set as seen at `now_ms`, with its expiry: what TB.ACQUIRE and a
    /// wake-up decide on. A missing set comes with a new incarnation,
    /// drawn from the server's random source, for the grant that would make
    /// it. `CorruptLeaseSet` (naming argument `key_arg`) if it has no usable
    /// `seq` member.
    pub fn read(&self, now_ms: i64, key_arg: usize) -> Result<Read<'a>, TbError> {
        let mut read = self.scan(now_ms, key_arg, Count::Live)?;
        if self.is_empty() {
            let drawn = Incarnation::from_random(self.api.random_u64());
            read.seen.incarnation = SetIncarnation::New(drawn);
        }
        Ok(self.with_expiry(read, now_ms))
    }

    /// What TB.RENEW needs: as [`read_ended`](Self::read_ended), with the
    /// expiry (a renewal may move it), without counting the live leases.
    pub fn read_for_renewal(&self, now_ms: i64, key_arg: usize) -> Result<Read<'a>, TbError> {
        let read = self.scan(now_ms, key_arg, Count::EndedOnly)?;
        Ok(self.with_expiry(read, now_ms))
    }

    fn with_expiry(&self, mut read: Read<'a>, now_ms: i64) -> Read<'a> {
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
    pub fn read_ended(&self, now_ms: i64, key_arg: usize) -> Result<Read<'a>, TbError> {
        self.scan(now_ms, key_arg, Count::EndedOnly)
    }

    /// One pass from the lowest score: `seq` and `inc` (and any other member
    /// scored <= 0, which is never a lease), then the ended leases (kept for
    /// removal, the 64 earliest), then the earliest live one. Past either
    /// bound the rest are looked up or counted by the server instead, so a
    /// call's work stays bounded however many leases ended unnoticed.
    fn scan(&self, now_ms: i64, key_arg: usize, count: Count) -> Result<Read<'a>, TbError> {
        let mut read = Read {
            seen: SetView::default(),
            expired: Vec::new(),
            all_ended_seen: false,
        };
        if self.is_empty() {
            return Ok(read);
        }
        let zset = &self.api.zset;
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
        // SAFETY: the key is open and holds a sorted set; elements come back
        // as new strings, owned (and freed) by ServerString.
        unsafe {
            let mut more =
                (zset.first_in_score_range)(self.key, f64::NEG_INFINITY, f64::INFINITY, 0, 0)
                    == REDISMODULE_OK as c_int;
            while more && (zset.range_end_reached)(self.key) == 0 {
                let mut score = 0.0;
                let element = (zset.range_current_element)(self.key, &mut score);
                let element = ServerString::owned(self.api, self.ctx, element);
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
                    read.expired.push(element);
                } else {
                    match element.bytes() {
                        SEQ => seq_score = Some(score),
                        INC => inc_score = Some(score),
                        _ => {}
                    }
                    not_positive = not_positive.saturating_add(1);
                    if not_positive > MAX_NOT_POSITIVE {
                        overflow = true;
                        break;
                    }
                }
                more = (zset.range_next)(self.key) != 0;
            }
            (zset.range_stop)(self.key);
        }
        read.seen.issued = seq_score
            .or_else(|| self.score(self.api.seq_member.0))
            .and_then(lease::issued_from_score)
            .ok_or(TbError::CorruptLeaseSet { key_arg })?;
        let bookkeeping = 1usize.saturating_add(usize::from(inc_score.is_some()));
        read.all_ended_seen = !overflow && not_positive == bookkeeping && seq_score.is_some();
        let stopped_among_not_positive = overflow && expired <= MAX_EXPIRED_REMOVED;
        if stopped_among_not_positive {
            // Stopped among the members scored <= 0: `inc`, if not met yet,
            // and the ended leases are looked up on their own.
            inc_score = inc_score.or_else(|| self.score(self.api.inc_member.0));
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
            let length = i64::try_from(unsafe { (zset.length)(self.key) }).unwrap_or(i64::MAX);
            let not_live = not_positive.saturating_add(expired);
            length.saturating_sub(i64::try_from(not_live).unwrap_or(i64::MAX))
        };
        read.seen.earliest_deadline_ms = earliest.map(whole_ms);
        Ok(read)
    }

    /// The score of `member`, if it is in the set.
    pub fn score(&self, member: *mut RedisModuleString) -> Option<f64> {
        let mut score = 0.0;
        // SAFETY: the key is open and holds a sorted set.
        let found = !self.is_empty()
            && unsafe { (self.api.zset.score)(self.key, member, &mut score) }
                == REDISMODULE_OK as c_int;
        found.then_some(score)
    }

    /// The ended leases with the earliest deadlines, scored in (0, now], at
    /// most `MAX_EXPIRED_REMOVED`.
    fn earliest_ended(&self, now: f64) -> Vec<ServerString<'a>> {
        let zset = &self.api.zset;
        let mut ended = Vec::new();
        // SAFETY: as in `read`.
        unsafe {
            let mut more =
                (zset.first_in_score_range)(self.key, 0.0, now, 1, 0) == REDISMODULE_OK as c_int;
            while more
                && (zset.range_end_reached)(self.key) == 0
                && ended.len() < MAX_EXPIRED_REMOVED
            {
                let mut score = 0.0;
                let element = (zset.range_current_element)(self.key, &mut score);
                ended.push(ServerString::owned(self.api, self.ctx, element));
                more = (zset.range_next)(self.key) != 0;
            }
            (zset.range_stop)(self.key);
        }
        ended
    }

    /// The lowest score above `floor`.
    fn first_score_above(&self, floor: f64) -> Option<f64> {
        self.edge_score(self.api.zset.first_in_score_range, floor)
    }

    /// The highest score above `floor`.
    fn last_score_above(&self, floor: f64) -> Option<f64> {
        self.edge_score(self.api.zset.last_in_score_range, floor)
    }

    /// The score where `start` (the first or last element in a score range)
    /// puts the range (floor, +inf], if it holds anything.
    fn edge_score(
        &self,
        start: unsafe extern "C" fn(*mut RedisModuleKey, f64, f64, c_int, c_int) -> c_int,
        floor: f64,
    ) -> Option<f64> {
        let zset = &self.api.zset;
        // SAFETY: as in `read`.
        unsafe {
            if start(self.key, floor, f64::INFINITY, 1, 0) != REDISMODULE_OK as c_int {
                return None;
            }
            let mut score = 0.0;
            let found = (zset.range_end_reached)(self.key) == 0;
            if found {
                let element = (zset.range_current_element)(self.key, &mut score);
                drop(ServerString::owned(self.api, self.ctx, element));
            }
            (zset.range_stop)(self.key);
            found.then_some(score)
        }
    }

    /// ZCOUNT key (now +inf, through the server: only when more ended
    /// leases wait for removal than one call looks at.
    fn count_live(&self, now_ms: i64) -> Result<i64, TbError> {
        let mut min = b"(".to_vec();
        min.extend_from_slice(format_integer(now_ms).as_bytes());
        let min = ServerString::copy(self.api, self.ctx, &min).ok_or(TbError::Internal)?;
        // SAFETY: a live context, key name and strings; the reply is freed.
        unsafe {
            let reply = (self.api.call)(
                self.ctx,
                c"ZCOUNT".as_ptr(),
                c"ssc".as_ptr(),
                self.name,
                min.ptr(),
                c"+inf".as_ptr(),
            );
            if reply.is_null() {
                self.api.log(
                    self.ctx,
                    c"warning",
                    "tb: ZCOUNT through RM_Call failed (renamed or disabled?): \
                     a lease set with more than 64 ended leases cannot be counted",
                );
                return Err(TbError::Internal);
            }
            let count = (self.api.call_reply_integer)(reply);
            (self.api.free_call_reply)(reply);
            Ok(count)
        }
    }

    fn expire_at_ms(&self, now_ms: i64) -> Option<i64> {
        // SAFETY: the key is open.
        let at = unsafe {
            match self.api.get_abs_expire {
                Some(get_abs_expire) => get_abs_expire(self.key),
                None => match (self.api.get_expire)(self.key) {
                    relative if relative >= 0 => now_ms.saturating_add(relative),
                    none => none,
                },
            }
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
            .map(|grant| ServerString::copy(self.api, self.ctx, grant.id.text().as_bytes()))
            .collect::<Option<_>>()
            .ok_or(TbError::WriteFailed)?;
        let issued = last.id.n;
        let expire_at_ms = grants.iter().filter_map(|grant| grant.expire_at_ms).max();
        for (grant, id) in grants.iter().zip(&ids) {
            self.add(grant.deadline_ms as f64, id.ptr())?;
        }
        self.add(-(issued as f64), self.api.seq_member.0)?;
        if let Some(made) = made {
            self.add(made.score() as f64, self.api.inc_member.0)?;
        }
        // SAFETY: a live context; the strings live until after the call
        // (RM_Replicate copies what it keeps).
        self.after_zadd(read, expire_at_ms, || unsafe {
            match (grants, ids.as_slice(), made) {
                ([grant], [id], None) => {
                    (self.api.replicate)(
                        self.ctx,
                        c"ZADD".as_ptr(),
                        c"slsls".as_ptr(),
                        self.name,
                        grant.deadline_ms as c_longlong,
                        id.ptr(),
                        issued.saturating_neg() as c_longlong,
                        self.api.seq_member.0,
                    );
                }
                ([grant], [id], Some(made)) => {
                    (self.api.replicate)(
                        self.ctx,
                        c"ZADD".as_ptr(),
                        c"slslsls".as_ptr(),
                        self.name,
                        grant.deadline_ms as c_longlong,
                        id.ptr(),
                        issued.saturating_neg() as c_longlong,
                        self.api.seq_member.0,
                        made.score() as c_longlong,
                        self.api.inc_member.0,
                    );
                }
                _ => {
                    let mut texts = Vec::with_capacity(grants.len().saturating_mul(2));
                    for (grant, id) in grants.iter().zip(&ids) {
                        texts.push(self.integer(grant.deadline_ms)?);
                        texts.push(
                            ServerString::copy(self.api, self.ctx, id.bytes())
                                .ok_or(TbError::Internal)?,
                        );
                    }
                    let count = self.integer(issued.saturating_neg())?;
                    let made_score = made.map(|made| self.integer(made.score())).transpose()?;
                    let mut argv: Vec<*mut RedisModuleString> =
                        texts.iter().map(|text| text.ptr()).collect();
                    argv.extend([count.ptr(), self.api.seq_member.0]);
                    if let Some(score) = &made_score {
                        argv.extend([score.ptr(), self.api.inc_member.0]);
                    }
                    (self.api.replicate)(
                        self.ctx,
                        c"ZADD".as_ptr(),
                        c"sv".as_ptr(),
                        self.name,
                        argv.as_mut_ptr(),
                        argv.len(),
                    );
                }
            }
            Ok(())
        })
    }

    /// Removes `lease` and, if it was there, `expired`; whether it was
    /// there. The caller knows `lease` is live if present: it checked the
    /// deadline, or `read` saw every ended member.
    pub fn release(&self, read: &Read<'a>, lease: *mut RedisModuleString) -> Result<bool, TbError> {
        let mut deleted: c_int = 0;
        // SAFETY: the key is open for writing and holds a sorted set.
        let status = unsafe { (self.api.zset.rem)(self.key, lease, &mut deleted) };
        if status != REDISMODULE_OK as c_int {
            return Err(TbError::WriteFailed);
        }
        if deleted == 0 {
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
        lease: *mut RedisModuleString,
        deadline_ms: i64,
        expire_at_ms: Option<i64>,
    ) -> Result<(), TbError> {
        self.add(deadline_ms as f64, lease)?;
        // SAFETY: a live context and strings.
        self.after_zadd(read, expire_at_ms, || unsafe {
            (self.api.replicate)(
                self.ctx,
                c"ZADD".as_ptr(),
                c"sls".as_ptr(),
                self.name,
                deadline_ms as c_longlong,
                lease,
            );
            Ok(())
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
        // SAFETY: a live context and key name.
        unsafe {
            (self.api.notify)(
                self.ctx,
                REDISMODULE_NOTIFY_ZSET as c_int,
                c"zadd".as_ptr(),
                self.name,
            );
        }
        if let Some(at) = expire_at_ms {
            self.propagate_expiry(at);
        }
        self.signal();
        Ok(())
    }

    fn add(&self, score: f64, member: *mut RedisModuleString) -> Result<(), TbError> {
        let mut flags: c_int = 0;
        // SAFETY: the key is open for writing (empty or a sorted set).
        let status = unsafe { (self.api.zset.add)(self.key, score, member, &mut flags) };
        if status == REDISMODULE_OK as c_int {
            Ok(())
        } else {
            Err(TbError::WriteFailed)
        }
    }

    fn remove(&self, expired: &[ServerString<'a>]) {
        for member in expired {
            let mut deleted: c_int = 0;
            // SAFETY: the key is open for writing and holds a sorted set
            // (its `seq` member is never among these, so it never empties).
            unsafe { (self.api.zset.rem)(self.key, member.ptr(), &mut deleted) };
        }
        metrics::LEASES_EXPIRED.add_count(expired.len());
    }

    fn set_expiry(&self, at_ms: i64) -> Result<(), TbError> {
        // SAFETY: the key is open for writing and holds the set.
        let status = unsafe {
            match self.api.set_abs_expire {
                Some(set_abs_expire) => set_abs_expire(self.key, at_ms),
                None => (self.api.set_expire)(
                    self.key,
                    at_ms.saturating_sub((self.api.milliseconds)()).max(1),
                ),
            }
        };
        if status == REDISMODULE_OK as c_int {
            Ok(())
        } else {
            Err(TbError::WriteFailed)
        }
    }

    /// `ZREM key <expired...> [lease]`, if there is anything to remove.
    fn propagate_removal(
        &self,
        expired: &[ServerString<'a>],
        lease: Option<*mut RedisModuleString>,
    ) {
        let mut argv: Vec<*mut RedisModuleString> = expired.iter().map(ServerString::ptr).collect();
        argv.extend(lease);
        if argv.is_empty() {
            return;
        }
        // SAFETY: a live context and strings.
        unsafe {
            (self.api.replicate)(
                self.ctx,
                c"ZREM".as_ptr(),
                c"sv".as_ptr(),
                self.name,
                argv.as_mut_ptr(),
                argv.len(),
            );
            (self.api.notify)(
                self.ctx,
                REDISMODULE_NOTIFY_ZSET as c_int,
                c"zrem".as_ptr(),
                self.name,
            );
        }
    }

    fn propagate_expiry(&self, at_ms: i64) {
        // SAFETY: a live context and key name.
        unsafe {
            (self.api.replicate)(
                self.ctx,
                c"PEXPIREAT".as_ptr(),
                c"sl".as_ptr(),
                self.name,
                at_ms as c_longlong,
            );
            (self.api.notify)(
                self.ctx,
                REDISMODULE_NOTIFY_GENERIC as c_int,
                c"expire".as_ptr(),
                self.name,
            );
        }
    }

    /// WATCH and client tracking (the module opts out of the implicit
    /// signal on every write-open).
    fn signal(&self) {
        // SAFETY: a live context and key name.
        unsafe { (self.api.signal_modified_key)(self.ctx, self.name) };
    }

    fn integer(&self, value: i64) -> Result<ServerString<'a>, TbError> {
        ServerString::copy(self.api, self.ctx, format_integer(value).as_bytes())
            .ok_or(TbError::Internal)
    }
}

impl Drop for LeaseSet<'_> {
    fn drop(&mut self) {
        if !self.key.is_null() {
            // SAFETY: opened by `open`, closed exactly once.
            unsafe { (self.api.close_key)(self.key) };
        }
    }
}

/// A score as whole ms (scores this module writes are whole already).
pub fn whole_ms(score: f64) -> i64 {
    // `as` saturates, and a sorted set holds no NaN.
    score.ceil() as i64
}
