//! A bucket's hash in the keyspace: type check, read, write with an
//! absolute deadline, propagation of the effects, and `write_all`, which
//! writes several buckets all or nothing.
//!
//! Layout (shared with the Lua script it replaces, so either can take over
//! from the other): a hash with `tokens` (decimal text, below zero for
//! debt) and `last_refill` (integer Unix ms), other fields left alone, and a
//! TTL that ends exactly when the bucket is full again. A key that has been
//! locked (`BLOCK`) also holds `locked_until`, `strikes` and
//! `probation_until` (integers), and its TTL lasts until the probation ends
//! at least. They are looked up only when the hash has more than its two
//! fields, so a bucket never locked costs no lookup of missing fields.

use redis_tb_core::bucket::{self, Outcome, State};
use redis_tb_core::error::TbError;
use redis_tb_core::lockout::Lock;
use redis_tb_core::number::{
    format_integer, format_tokens, parse_decimal, NumberText, Sign, MAX_EXACT_INTEGER,
};

use crate::server::context::{Context, Notify};
use crate::server::keys::{Access, HashValue, Key, KeyType, NO_EXPIRE};
use crate::server::metrics;
use crate::server::strings::{ServerStr, ServerString};
use crate::testing::fault;

/// The key holds a hash that is not a bucket: `tokens` or `last_refill` is
/// missing or not a finite number (`Bucket`), or its lock fields are
/// damaged (`Lock`). The caller names the key in its error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Corrupt {
    Bucket,
    Lock,
}

/// An open bucket key; closed when dropped.
pub struct BucketKey<'a> {
    ctx: Context<'a>,
    name: &'a ServerStr,
    /// `None` when a read finds no key.
    key: Option<Key<'a>>,
    /// The `tokens` and `last_refill` values as read, kept until the key is
    /// closed so that a write that fails half way can put them back.
    prior: Option<(ServerString<'a>, ServerString<'a>)>,
    /// No bucket was there when read: a write creates one.
    was_missing: bool,
    /// The lock stored in the hash, as read.
    lock: Option<Lock>,
    /// The lock fields as read, kept (like `prior`) so that a write that
    /// stored a new lock can be taken back.
    prior_lock: Option<[ServerString<'a>; 3]>,
}

/// A write that reached the keyspace but not yet replicas, the AOF or
/// anyone watching: `propagate` tells them, `rollback` takes it back.
pub struct Applied<'a> {
    tokens: ServerString<'a>,
    last_refill: ServerString<'a>,
    /// The lock's three fields and their names, when the write stored one.
    lock: Option<([ServerString<'a>; 3], LockNames<'a>)>,
    deadline_ms: i64,
}

/// A key's expiry before a write, so a rollback can put it back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expiry {
    At(i64),
    Never,
    /// The server cannot tell (`RM_GetAbsExpire` is missing before 7.0.5).
    Unknown,
}

/// The server refused to store a bucket (`RM_HashSet` or setting the
/// expiry failed). The key is as it was and nothing was propagated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteFailed;

impl<'a> BucketKey<'a> {
    /// Opens `name`, empty or a hash (WRONGTYPE otherwise).
    pub fn open(ctx: Context<'a>, name: &'a ServerStr, access: Access) -> Result<Self, TbError> {
        Ok(BucketKey {
            ctx,
            name,
            key: ctx.open(name, access, KeyType::Hash)?,
            prior: None,
            was_missing: false,
            lock: None,
            prior_lock: None,
        })
    }

    /// The lock stored in the hash (read by `read`).
    pub fn lock(&self) -> Option<Lock> {
        self.lock
    }

    /// The stored state, `None` for a missing key (a full bucket), or
    /// `Corrupt` if the hash lacks a readable `tokens` or `last_refill`.
    pub fn read(&mut self) -> Result<Option<State>, Corrupt> {
        let key = match &self.key {
            Some(key) if !key.is_empty() => key,
            _ => {
                self.was_missing = true;
                return Ok(None);
            }
        };
        self.was_missing = false;
        let api = self.ctx.api();
        let [tokens, last_refill] =
            key.hash_get([api.tokens_field.get(), api.last_refill_field.get()]);
        let (Some(tokens), Some(last_refill)) = (tokens, last_refill) else {
            return Err(Corrupt::Bucket);
        };
        let state = match (number(&tokens), number(&last_refill)) {
            (Some(tokens), Some(last_refill_ms)) => State {
                tokens,
                last_refill_ms,
            },
            _ => return Err(Corrupt::Bucket),
        };
        // A bucket never locked has two fields: the field count (O(1)) spares
        // it the lookup of three missing ones.
        let locked = key.length() > 2;
        self.prior = Some((tokens, last_refill));
        if locked {
            self.read_lock()?;
        }
        Ok(Some(state))
    }

    /// The lock, if the hash has a `locked_until` (the other two fields are
    /// then required).
    fn read_lock(&mut self) -> Result<(), Corrupt> {
        let Some(key) = &self.key else {
            return Ok(());
        };
        let names = LockNames::new(self.ctx).ok_or(Corrupt::Lock)?;
        let [locked_until, strikes, probation_until] = key.hash_get(names.strs());
        let Some(locked_until) = locked_until else {
            return Ok(()); // other fields of someone else's: no lock
        };
        let (Some(strikes), Some(probation_until)) = (strikes, probation_until) else {
            return Err(Corrupt::Lock);
        };
        let lock = match (
            whole(&locked_until),
            whole(&strikes),
            whole(&probation_until),
        ) {
            (Some(until), Some(strikes), Some(probation)) => {
                Lock::from_fields(until, strikes, probation)
            }
            _ => None,
        };
        self.lock = Some(lock.ok_or(Corrupt::Lock)?);
        self.prior_lock = Some([locked_until, strikes, probation_until]);
        Ok(())
    }

    /// The key holds something (a bucket, as `open` checked the type).
    pub fn exists(&self) -> bool {
        !self.is_empty()
    }

    fn is_empty(&self) -> bool {
        self.key.as_ref().is_none_or(Key::is_empty)
    }

    /// Stores `state` in the keyspace and makes the key expire at
    /// `deadline_ms` (absolute), without telling anyone yet: if either step
    /// fails, the key is put back as it was and `WriteFailed` returned, so
    /// nothing the master does not hold can ever reach a replica.
    pub fn apply(
        &self,
        state: &State,
        lock: Option<&Lock>,
        now_ms: i64,
        deadline_ms: i64,
    ) -> Result<Applied<'a>, WriteFailed> {
        let text = format_tokens(state.tokens);
        // Formatted here rather than by RM_CreateStringFromLongLong, which
        // costs twice as much for the same text.
        let now_text = format_integer(now_ms);
        let tokens = self.ctx.string(text.as_bytes());
        let last_refill = self.ctx.string(now_text.as_bytes());
        let (Some(tokens), Some(last_refill)) = (tokens, last_refill) else {
            return Err(WriteFailed);
        };
        let lock = match lock {
            Some(lock) => Some((
                self.lock_strings(lock).ok_or(WriteFailed)?,
                LockNames::new(self.ctx).ok_or(WriteFailed)?,
            )),
            None => None,
        };
        // RM_HashSet checks everything before it changes anything, so a
        // refusal leaves the key as it was. Faults are injected here, once
        // per step, and never into `restore_fields`: the undo must run as
        // it would in production.
        if fault::injected(fault::Step::HashSet)
            || !self.set_fields(
                &tokens,
                &last_refill,
                lock.as_ref().map(|(values, _)| LockFields::Set(values)),
            )
        {
            return Err(WriteFailed);
        }
        // The TTL can only be set once the hash exists.
        if fault::injected(fault::Step::Expire) || !self.set_deadline(now_ms, deadline_ms) {
            self.restore_fields();
            return Err(WriteFailed);
        }
        Ok(Applied {
            tokens,
            last_refill,
            lock,
            deadline_ms,
        })
    }

    /// A lock's fields as server strings; `None` if one could not be made.
    fn lock_strings(&self, lock: &Lock) -> Option<[ServerString<'a>; 3]> {
        let text = |value: i64| -> NumberText { format_integer(value) };
        let [until, strikes, probation] = [lock.until_ms, lock.strikes, lock.probation_until_ms]
            .map(|value| self.ctx.string(text(value).as_bytes()));
        Some([until?, strikes?, probation?])
    }

    /// Takes back an applied write that will not be propagated (another
    /// bucket of the same TB.TAKEALL failed to store): the fields as they
    /// were read, and the expiry `prior_expiry` recorded before the write.
    pub fn rollback(&self, applied: Applied<'a>, prior_expiry: Expiry) {
        drop(applied);
        self.restore_fields();
        if self.prior.is_none() {
            return; // the key was deleted: no expiry to put back
        }
        let restored = match (prior_expiry, &self.key) {
            (Expiry::At(deadline_ms), Some(key)) => key.set_abs_expire(deadline_ms) == Some(true),
            (Expiry::Never, Some(key)) => key.set_abs_expire(NO_EXPIRE) == Some(true),
            _ => false,
        };
        if !restored {
            self.warn_not_restored();
        }
    }

    /// The key's expiry as it stands, for `rollback`.
    pub fn expiry(&self) -> Expiry {
        let Some(key) = &self.key else {
            return Expiry::Never;
        };
        match key.abs_expire() {
            Some(deadline_ms) if deadline_ms >= 0 => Expiry::At(deadline_ms),
            Some(_) => Expiry::Never,
            None => Expiry::Unknown,
        }
    }

    /// Tells replicas, the AOF, keyspace listeners, WATCH and client
    /// tracking about an applied write.
    ///
    /// Replicas and the AOF get `HSET` and `PEXPIREAT` with the values
    /// computed here, never the TB.TAKE command: replaying the command would
    /// refill with another clock and another result. The absolute deadline
    /// is computed once, so the master, its replicas and a reloaded AOF all
    /// expire the key at the same millisecond. Redis wraps the two commands
    /// in MULTI/EXEC, so a replica never sees one without the other.
    pub fn propagate(&self, applied: &Applied<'a>) {
        if self.was_missing {
            metrics::BUCKETS_CREATED.bump();
        }
        let (ctx, name, api) = (self.ctx, self.name, self.ctx.api());
        let (tokens, last_refill) = (api.tokens_field.get(), api.last_refill_field.get());
        match &applied.lock {
            None => ctx.replicate(
                c"HSET",
                name,
                [tokens, &applied.tokens, last_refill, &applied.last_refill],
            ),
            Some(([until, strikes, probation], names)) => {
                let [until_name, strikes_name, probation_name] = names.strs();
                ctx.replicate(
                    c"HSET",
                    name,
                    [
                        tokens,
                        &applied.tokens,
                        last_refill,
                        &applied.last_refill,
                        until_name,
                        until,
                        strikes_name,
                        strikes,
                        probation_name,
                        probation,
                    ],
                )
            }
        };
        ctx.replicate_integer(c"PEXPIREAT", name, applied.deadline_ms);
        ctx.notify(Notify::Hash, c"hset", name);
        ctx.notify(Notify::Generic, c"expire", name);
        // The module opts out of the implicit "modified" signal on every
        // write-open (`set_module_options` in load.rs), so WATCH and
        // client tracking are told here, only when the bucket changed.
        ctx.signal_modified(name);
    }

    /// Stores `state` with its absolute expiry and propagates it: `apply`
    /// then `propagate`, for a lone bucket.
    pub fn write(
        &self,
        state: &State,
        lock: Option<&Lock>,
        now_ms: i64,
        deadline_ms: i64,
    ) -> Result<(), TbError> {
        let applied = self
            .apply(state, lock, now_ms, deadline_ms)
            .map_err(|WriteFailed| TbError::WriteFailed)?;
        self.propagate(&applied);
        Ok(())
    }

    /// RM_HashSet of both fields, and of the lock's (set, or deleted by a
    /// rollback); false if the server refused.
    fn set_fields(
        &self,
        tokens: &ServerString,
        last_refill: &ServerString,
        lock: Option<LockFields>,
    ) -> bool {
        let Some(key) = &self.key else {
            return false;
        };
        let api = self.ctx.api();
        let (tokens_name, last_refill_name) = (api.tokens_field.get(), api.last_refill_field.get());
        let (tokens, last_refill) = (HashValue::Set(tokens), HashValue::Set(last_refill));
        let set = match lock {
            None => key.hash_set([(tokens_name, tokens), (last_refill_name, last_refill)]),
            Some(lock) => {
                let Some(names) = LockNames::new(self.ctx) else {
                    return false;
                };
                let [until_name, strikes_name, probation_name] = names.strs();
                let [until, strikes, probation] = match lock {
                    LockFields::Set([until, strikes, probation]) => {
                        [until, strikes, probation].map(|value| HashValue::Set(value))
                    }
                    LockFields::Delete => [HashValue::Delete; 3],
                };
                key.hash_set([
                    (tokens_name, tokens),
                    (last_refill_name, last_refill),
                    (until_name, until),
                    (strikes_name, strikes),
                    (probation_name, probation),
                ])
            }
        };
        set.is_ok() && key.holds(KeyType::Hash)
    }

    /// TB.UNBLOCK: deletes the lock's fields, if the hash has any of them,
    /// and tells replicas, the AOF and watchers (`HDEL`). The TTL stays: it
    /// only ever outlasts the bucket. Returns whether anything was deleted.
    pub fn delete_lock(&self) -> Result<bool, TbError> {
        let key = match &self.key {
            Some(key) if !key.is_empty() => key,
            _ => return Ok(false),
        };
        let names = LockNames::new(self.ctx).ok_or(TbError::WriteFailed)?;
        let [until_name, strikes_name, probation_name] = names.strs();
        let delete = HashValue::Delete;
        let deleted = key.hash_set([
            (until_name, delete),
            (strikes_name, delete),
            (probation_name, delete),
        ]);
        if deleted.unwrap_or(0) == 0 {
            return Ok(false);
        }
        let (ctx, name) = (self.ctx, self.name);
        ctx.replicate(c"HDEL", name, [until_name, strikes_name, probation_name]);
        ctx.notify(Notify::Hash, c"hdel", name);
        ctx.signal_modified(name);
        Ok(true)
    }

    /// Sets the absolute expiry; false if the server refused.
    fn set_deadline(&self, now_ms: i64, deadline_ms: i64) -> bool {
        let Some(key) = &self.key else {
            return false;
        };
        match key.set_abs_expire(deadline_ms) {
            Some(set) => set,
            None => key.set_expire(deadline_ms.saturating_sub(now_ms).max(1)),
        }
    }

    /// Puts the fields back as they were read, or deletes the key if it was
    /// empty, after a write that must not stand.
    fn restore_fields(&self) {
        let restored = match &self.prior {
            None => self.key.as_ref().is_some_and(Key::delete),
            Some((tokens, last_refill)) => self.set_fields(
                tokens,
                last_refill,
                Some(match &self.prior_lock {
                    Some(fields) => LockFields::Set(fields),
                    None => LockFields::Delete,
                }),
            ),
        };
        if !restored {
            self.warn_not_restored();
        }
    }

    fn warn_not_restored(&self) {
        self.ctx
            .warn("tb: could not undo a failed bucket write; the key may differ from its replicas");
    }
}

/// The lock's field names as server strings, made by the call that needs
/// them: only a locked bucket, a lock start and TB.UNBLOCK do, and names
/// kept for the module's life (as `tokens` is, in api.rs) would be left
/// behind by every MODULE UNLOAD.
struct LockNames<'a>([ServerString<'a>; 3]);

impl<'a> LockNames<'a> {
    fn new(ctx: Context<'a>) -> Option<Self> {
        let [until, strikes, probation] =
            [&b"locked_until"[..], b"strikes", b"probation_until"].map(|name| ctx.string(name));
        Some(LockNames([until?, strikes?, probation?]))
    }

    fn strs(&self) -> [&ServerStr; 3] {
        let [until, strikes, probation] = &self.0;
        [until, strikes, probation]
    }
}

/// What a write does to the lock's fields besides `tokens`/`last_refill`.
enum LockFields<'s, 'a> {
    Set(&'s [ServerString<'a>; 3]),
    /// A rollback of a write that stored the key's first lock.
    Delete,
}

/// A stored lock field as a whole number in [0, 2^53], `None` otherwise.
fn whole(field: &ServerStr) -> Option<i64> {
    parse_decimal(field, Sign::Allowed)
        .filter(|value| value.fract() == 0.0 && (0.0..=MAX_EXACT_INTEGER as f64).contains(value))
        .map(|value| value as i64)
}

/// A stored field as a finite number, `None` if absent or not a number.
fn number(field: &ServerStr) -> Option<f64> {
    parse_decimal(field, Sign::Allowed)
}

/// Stores every outcome that writes, all or none.
///
/// Every write is first applied to the keyspace only; if the server
/// refuses one, those already applied are taken back, nothing is
/// propagated and the command fails, so no replica, AOF or watcher can see
/// what the master does not hold. Only then is each write propagated.
pub fn write_all(outcomes: &[(&BucketKey, &Outcome)], now_ms: i64) -> Result<(), TbError> {
    let deadline =
        |bucket: &BucketKey, outcome: &Outcome| bucket::deadline_ms(now_ms, outcome, bucket.lock());
    // One bucket, the usual case: nothing to take back, so nothing to keep
    // (and no allocation on the hot path).
    if let [(bucket, outcome)] = outcomes {
        return match &outcome.write {
            Some(state) => bucket.write(
                state,
                outcome.lock.as_ref(),
                now_ms,
                deadline(bucket, outcome),
            ),
            None => Ok(()),
        };
    }
    let writes = outcomes
        .iter()
        .filter(|(_, outcome)| outcome.write.is_some())
        .count();
    // What to put back if a later write fails; a lone write needs none.
    let expiries: Vec<Expiry> = if writes > 1 {
        outcomes.iter().map(|(bucket, _)| bucket.expiry()).collect()
    } else {
        Vec::new()
    };
    let mut applied = Vec::with_capacity(writes);
    for (index, (bucket, outcome)) in outcomes.iter().enumerate() {
        let Some(state) = &outcome.write else {
            continue;
        };
        match bucket.apply(
            state,
            outcome.lock.as_ref(),
            now_ms,
            deadline(bucket, outcome),
        ) {
            Ok(done) => applied.push((index, done)),
            Err(WriteFailed) => {
                // Test-only (`fault-skip-rollback yes`, src/testing/fault.rs): shows
                // the rollback tests fail without the rollback, so they reach it.
                if fault::rollback_skipped() {
                    return Err(TbError::WriteFailed);
                }
                for (index, done) in applied.into_iter().rev() {
                    if let Some((bucket, _)) = outcomes.get(index) {
                        let expiry = expiries.get(index).copied().unwrap_or(Expiry::Unknown);
                        bucket.rollback(done, expiry);
                    }
                }
                return Err(TbError::WriteFailed);
            }
        }
    }
    for (index, done) in &applied {
        if let Some((bucket, _)) = outcomes.get(*index) {
            bucket.propagate(done);
        }
    }
    Ok(())
}
