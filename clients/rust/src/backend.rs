//! Which server side answers (module, FUNCTION library, EVALSHA script), the
//! commands each one takes, and what the sync and async limiters share.

use crate::decision::{
    check_capacity, check_cost, check_key, check_name, check_rate, number, take_words, Decision,
    Fields, Limit, Policy, Source, TakeOptions, MAX_EXACT,
};
use crate::error::{Error, Result};
use crate::local::{primed_denial_ms, BucketRef, DenialCache, LocalLimiter, LocalSettings};
use redis::{Cmd, Value};
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The Lua fallback, `lua/tb.lua` of the repository (through the `lua`
/// symlink in this package): as it is, a `FUNCTION LOAD` library.
pub const LUA_LIBRARY: &str = include_str!("../lua/tb.lua");

/// The same text without its first line (`#!lua name=tb`): the EVAL script.
pub fn lua_script() -> &'static str {
    LUA_LIBRARY
        .split_once('\n')
        .map(|(_, rest)| rest)
        .unwrap_or(LUA_LIBRARY)
}

/// The server side a limiter calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Backend {
    /// The redis-tb module: `TB.TAKE`, `TB.PEEK`, `TB.REFUND`, `TB.TAKEALL`, `TB.BTAKE`.
    Module,
    /// `lua/tb.lua` as a FUNCTION library (`FCALL tb_take ...`; Redis 7+, Valkey).
    Function,
    /// `lua/tb.lua` as an EVALSHA script (where FUNCTION is missing: Redis
    /// before 7), sent again as EVAL on NOSCRIPT.
    Script,
}

impl Backend {
    /// `"module"`, `"function"` or `"script"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Backend::Module => "module",
            Backend::Function => "function",
            Backend::Script => "script",
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A log sink: `(level, message)`. Without one the `log` crate is used
/// (target `redis_tb_client`).
pub type Logger = Arc<dyn Fn(log::Level, &str) + Send + Sync>;

/// A log line the driver must emit.
pub(crate) type Line = (log::Level, String);

pub(crate) fn emit_line(logger: &Option<Logger>, line: Option<Line>) {
    if let Some((level, message)) = line {
        emit(logger, level, &message);
    }
}

pub(crate) fn emit(logger: &Option<Logger>, level: log::Level, message: &str) {
    match logger {
        Some(f) => f(level, message),
        None => log::log!(target: "redis_tb_client", level, "{message}"),
    }
}

/// Timeouts of the connections a limiter makes itself, and (async) of every call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// Connecting, including the connection's handshake. Default 200 ms.
    pub connect: Duration,
    /// One command (or one limiter call, async). Default 200 ms.
    pub command: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_millis(200),
            command: Duration::from_millis(200),
        }
    }
}

/// The backend in use and what it needs (the script's SHA1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Resolved {
    pub backend: Backend,
    pub sha: Option<String>,
}

impl Resolved {
    pub fn new(backend: Backend, sha: Option<String>) -> Resolved {
        Resolved { backend, sha }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Take,
    Peek,
    Refund,
    TakeAll,
    Charge,
}

impl Op {
    fn module_command(self) -> &'static str {
        match self {
            Op::Take => "TB.TAKE",
            Op::Peek => "TB.PEEK",
            Op::Refund => "TB.REFUND",
            Op::TakeAll => "TB.TAKEALL",
            Op::Charge => "TB.CHARGE",
        }
    }
    /// `FCALL_RO` for peek, which writes nothing and so runs on replicas.
    fn fcall(self) -> &'static str {
        match self {
            Op::Peek => "FCALL_RO",
            _ => "FCALL",
        }
    }
    fn function(self) -> &'static str {
        match self {
            Op::Take => "tb_take",
            Op::Peek => "tb_peek",
            Op::Refund => "tb_refund",
            Op::TakeAll => "tb_takeall",
            Op::Charge => "tb_charge",
        }
    }
    fn script_word(self) -> &'static str {
        match self {
            Op::Take => "take",
            Op::Peek => "peek",
            Op::Refund => "refund",
            Op::TakeAll => "takeall",
            Op::Charge => "charge",
        }
    }
}

/// One bucket of a call: its numbers (for the in-process answers) and the
/// same as text (for the server).
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    key: String,
    capacity: f64,
    rate: f64,
    n: f64,
    args: [String; 3],
}

impl Bucket {
    fn as_ref(&self) -> BucketRef<'_> {
        BucketRef {
            key: &self.key,
            capacity: self.capacity,
            rate: self.rate,
            n: self.n,
        }
    }
}

/// A checked call: the buckets and the policies for the decision.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    pub op: Op,
    buckets: Vec<Bucket>,
    policies: Vec<Policy>,
    /// After the numbers: MAXWAIT, BLOCK, MAXBLOCK (take, takeall), MAXDEBT (charge).
    options: Vec<String>,
    /// A reservation (`MAXWAIT`): the denial cache does not answer it.
    reserves: bool,
    /// The local limiter may answer it in an outage (not the takes of a wait).
    local: bool,
    /// A dropped connection may send it again (not a refund, not a settle).
    resend: bool,
}

impl Call {
    pub fn single(op: Op, key: &str, capacity: f64, rate: f64, n: f64, name: &str) -> Result<Call> {
        check_name(name)?;
        Ok(Call::new(
            op,
            vec![bucket(key, capacity, rate, n)?],
            vec![Policy::new(name, capacity, rate)],
        ))
    }

    fn new(op: Op, buckets: Vec<Bucket>, policies: Vec<Policy>) -> Call {
        Call {
            op,
            buckets,
            policies,
            options: Vec::new(),
            reserves: false,
            local: matches!(op, Op::Take | Op::Peek | Op::TakeAll),
            // A refund given twice hands out tokens nobody returned.
            resend: op != Op::Refund,
        }
    }

    /// The same call with `options` after its numbers.
    fn with_options(self, options: Vec<String>, max_wait_ms: u64) -> Call {
        Call {
            options,
            reserves: max_wait_ms > 0,
            ..self
        }
    }

    /// The same call as one step of a wait (`wait_take`), which the local
    /// limiter does not serve.
    pub fn waiting(self) -> Call {
        Call {
            local: false,
            ..self
        }
    }

    /// A take with its options (`take_with`).
    pub fn take_with(call: Call, options: &TakeOptions) -> Result<Call> {
        let words = take_words(options.max_wait_ms, options.block_ms, options.max_block_ms)?;
        Ok(call.with_options(words, options.max_wait_ms))
    }

    /// A take of one `Limit`: its numbers, name and lockout, and `max_wait_ms`.
    pub fn limit_take(limit: &Limit, max_wait_ms: u64) -> Result<Call> {
        let call = Call::of_limit(Op::Take, limit, limit.n)?;
        let options = take_words(max_wait_ms, limit.block_ms, limit.max_block_ms)?;
        Ok(call.with_options(options, max_wait_ms))
    }

    /// `op` on `limit`'s bucket with `n` (its lockout checked, not sent).
    fn of_limit(op: Op, limit: &Limit, n: f64) -> Result<Call> {
        limit.check()?;
        let name = limit.name.as_deref().unwrap_or("default");
        Call::single(op, &limit.key, limit.capacity, limit.rate, n, name)
    }

    /// TB.CHARGE of `n` on `limit`'s bucket, into debt down to `-max_debt`
    /// (`None`: the capacity).
    pub fn charge(limit: &Limit, n: f64, max_debt: Option<f64>) -> Result<Call> {
        let call = Call::of_limit(Op::Charge, limit, n)?;
        let options = match max_debt {
            None => Vec::new(),
            Some(debt) if debt.is_finite() && (0.0..=MAX_EXACT).contains(&debt) => {
                vec!["MAXDEBT".into(), number("max_debt", debt)?]
            }
            Some(debt) => {
                return Err(Error::InvalidArgument(format!(
                    "max_debt must be a non-negative finite number at most 2^53, got {debt}"
                )))
            }
        };
        Ok(call.with_options(options, 0))
    }

    /// The one call that turns a take of `reserved` into a cost of
    /// `actual`: a refund or a charge of the difference, or `None` when they
    /// are equal (nothing to send).
    pub fn settle(limit: &Limit, reserved: f64, actual: f64) -> Result<Option<Call>> {
        check_cost(reserved).map_err(|_| {
            Error::InvalidArgument(format!(
                "reserved must be a non-negative finite number at most 2^53, got {reserved}"
            ))
        })?;
        check_cost(actual).map_err(|_| {
            Error::InvalidArgument(format!(
                "actual must be a non-negative finite number at most 2^53, got {actual}"
            ))
        })?;
        let call = if actual < reserved {
            Call::of_limit(Op::Refund, limit, reserved - actual)?
        } else if actual > reserved {
            Call::of_limit(Op::Charge, limit, actual - reserved)?
        } else {
            Call::of_limit(Op::Refund, limit, 0.0)?;
            return Ok(None);
        };
        // Not sent again after a dropped connection: a settle that ran
        // twice would refund (or charge) the difference twice.
        Ok(Some(Call {
            resend: false,
            ..call
        }))
    }

    /// A take as ONE reservation of up to `timeout_ms` (0: no limit, 2^53):
    /// a wait without the module (`wait_take`).
    pub fn reservation(&self, timeout_ms: u64) -> Option<Call> {
        (self.op == Op::Take).then(|| {
            let ms = if timeout_ms == 0 {
                MAX_EXACT as u64
            } else {
                timeout_ms.min(MAX_EXACT as u64)
            };
            self.clone()
                .with_options(vec!["MAXWAIT".into(), ms.to_string()], ms)
        })
    }

    pub fn all_with(limits: &[Limit], max_wait_ms: u64) -> Result<Call> {
        let call = Call::all(limits)?;
        let Some(first) = limits.first() else {
            return Ok(call);
        };
        if limits
            .iter()
            .any(|l| (l.block_ms, l.max_block_ms) != (first.block_ms, first.max_block_ms))
        {
            return Err(Error::InvalidArgument(
                "take_all: every limit must have the same block_ms and max_block_ms \
                 (TB.TAKEALL's BLOCK applies to every bucket)"
                    .into(),
            ));
        }
        let options = take_words(max_wait_ms, first.block_ms, first.max_block_ms)?;
        Ok(call.with_options(options, max_wait_ms))
    }

    pub fn all(limits: &[Limit]) -> Result<Call> {
        if limits.is_empty() {
            return Err(Error::InvalidArgument(
                "take_all needs at least one limit".into(),
            ));
        }
        let mut buckets = Vec::with_capacity(limits.len());
        let mut policies = Vec::with_capacity(limits.len());
        for (i, limit) in limits.iter().enumerate() {
            limit.check()?;
            buckets.push(bucket(&limit.key, limit.capacity, limit.rate, limit.n)?);
            let name = limit.name.clone().unwrap_or_else(|| format!("limit{i}"));
            policies.push(Policy::new(name, limit.capacity, limit.rate));
        }
        Ok(Call::new(Op::TakeAll, buckets, policies))
    }

    /// The command for `backend` (the script: EVALSHA, or with `eval` the
    /// full text, which also caches it on that node).
    pub fn command(&self, resolved: &Resolved, eval: bool) -> Cmd {
        if resolved.backend == Backend::Module {
            let mut cmd = redis::cmd(self.op.module_command());
            for b in &self.buckets {
                cmd.arg(&b.key).arg(&b.args[..]);
            }
            cmd.arg(&self.options[..]);
            return cmd;
        }
        let keys: Vec<&str> = self.buckets.iter().map(|b| b.key.as_str()).collect();
        let args: Vec<&str> = self
            .buckets
            .iter()
            .flat_map(|b| b.args.iter().map(String::as_str))
            .chain(self.options.iter().map(String::as_str))
            .collect();
        let lua = LuaName {
            fcall: self.op.fcall(),
            function: self.op.function(),
            word: self.op.script_word(),
        };
        lua_command(resolved, eval, lua, &keys, &args)
    }

    /// The first bucket's key (the only one outside `take_all`): where an
    /// async wait goes first (the sync one follows MOVED every time).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub fn first_key(&self) -> &str {
        self.buckets.first().map(|b| b.key.as_str()).unwrap_or("")
    }

    /// The peek a wait sends first, whatever the call it waits for: it makes
    /// the limiter choose its backend, and any server answers it.
    pub fn probe(key: &str) -> Result<Call> {
        Ok(Call::single(Op::Peek, key, 1.0, 1.0, 0.0, "default")?.waiting())
    }

    /// `TB.BTAKE key capacity rate n timeout_ms` (single-bucket calls only).
    pub fn btake(&self, timeout_ms: u64) -> Cmd {
        let mut cmd = redis::cmd("TB.BTAKE");
        for b in &self.buckets {
            cmd.arg(&b.key).arg(&b.args[..]);
        }
        cmd.arg(timeout_ms);
        cmd
    }

    pub fn decision(&self, value: &Value) -> Result<Decision> {
        Decision::from_reply(value, self.policies.clone(), self.op == Op::TakeAll)
    }

    fn bucket_refs(&self) -> Vec<BucketRef<'_>> {
        self.buckets.iter().map(Bucket::as_ref).collect()
    }

    /// A decision answered in process (`index`: the deciding bucket).
    fn in_process(&self, fields: Fields, index: usize, source: Source) -> Option<Decision> {
        let index = (self.op == Op::TakeAll).then_some(index);
        Decision::answered(fields, self.policies.clone(), index, source)
    }

    /// A take, whose answer is a decision (docs/clients.md#metrics): not
    /// a peek, refund or charge.
    pub fn decides(&self) -> bool {
        matches!(self.op, Op::Take | Op::TakeAll)
    }

    /// A take the denial cache can answer: a plain or locking take (not a
    /// reservation, not a peek).
    fn cacheable(&self) -> bool {
        matches!(self.op, Op::Take | Op::TakeAll) && !self.reserves
    }
}

fn bucket(key: &str, capacity: f64, rate: f64, n: f64) -> Result<Bucket> {
    check_key(key)?;
    check_capacity(capacity)?;
    check_rate(rate)?;
    check_cost(n)?;
    Ok(Bucket {
        key: key.to_string(),
        capacity,
        rate,
        n,
        args: [
            number("capacity", capacity)?,
            number("rate", rate)?,
            number("n", n)?,
        ],
    })
}

/// What a Lua backend calls for one command: `FCALL <function>` or the
/// script with `<word>` first in ARGV.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LuaName {
    pub fcall: &'static str,
    pub function: &'static str,
    pub word: &'static str,
}

/// The Lua backends' form of a command: `FCALL[_RO] <function> N keys.. args..`,
/// `EVALSHA <sha> N keys.. <word> args..` or, with `eval` (or no SHA), `EVAL`
/// with the whole text.
pub(crate) fn lua_command(
    resolved: &Resolved,
    eval: bool,
    name: LuaName,
    keys: &[&str],
    args: &[&str],
) -> Cmd {
    let mut cmd;
    match resolved.backend {
        Backend::Script if eval || resolved.sha.is_none() => {
            cmd = redis::cmd("EVAL");
            cmd.arg(lua_script());
        }
        Backend::Script => {
            cmd = redis::cmd("EVALSHA");
            cmd.arg(resolved.sha.as_deref().unwrap_or_default());
        }
        _ => {
            cmd = redis::cmd(name.fcall);
            cmd.arg(name.function);
        }
    }
    cmd.arg(keys.len()).arg(keys);
    if resolved.backend == Backend::Script {
        cmd.arg(name.word);
    }
    cmd.arg(args);
    cmd
}

/// One kind of limiter call as the sans-IO engine sees it: the command for
/// each backend, the blocking form for a wait, and how to read the reply.
/// [`Exchange`](crate::engine::Exchange) drives any of them through
/// detection, one retry and the failure rule.
pub(crate) trait Request {
    /// What the call answers.
    type Output;
    /// The command on `resolved` (the script: EVALSHA, or EVAL with `eval`).
    fn command(&self, resolved: &Resolved, eval: bool) -> Cmd;
    /// The key whose slot owner serves the call (the async wait's pool).
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    fn first_key(&self) -> &str;
    /// The reply, read.
    fn parse(&self, value: &Value) -> Result<Self::Output>;

    /// The local limiter's answer in an outage, or `None`: the call is
    /// not served locally (it is unavailable).
    fn local(&self, _: &LocalLimiter, _: &LocalSettings, _now_ms: i64) -> Option<Self::Output> {
        None
    }
    /// A cached denial that answers the call without a round trip.
    fn cached(&self, _: &DenialCache, _: &LocalSettings, _now_ms: i64) -> Option<Self::Output> {
        None
    }
    /// What the denial cache learns from the server's answer.
    fn observe(&self, _: &Self::Output, _: &DenialCache, _: &LocalSettings, _now_ms: i64) {}
    /// Whether a connection dropped under the call may send it again
    /// (docs/clients.md#a-dropped-connection-is-not-an-outage).
    fn resend_on_drop(&self) -> bool {
        true
    }
}

/// A call that can wait in the server (TB.BTAKE, TB.ACQUIRE with a timeout).
pub(crate) trait Blocking: Request {
    /// The module's blocking form, waiting up to `timeout_ms` (0: no limit).
    fn blocking(&self, timeout_ms: u64) -> Cmd;
    /// The longest sleep between two tries when the wait polls (`None`:
    /// the answer's own wait).
    fn poll_cap(&self) -> Option<Duration> {
        None
    }
    /// Without the module: the ONE call that stands for the whole wait (a
    /// take's reservation, TB.TAKE with `MAXWAIT timeout_ms`), or `None`:
    /// the wait polls.
    fn reservation(&self, _timeout_ms: u64) -> Option<Self>
    where
        Self: Sized,
    {
        None
    }
}

impl Request for Call {
    type Output = Decision;
    fn command(&self, resolved: &Resolved, eval: bool) -> Cmd {
        Call::command(self, resolved, eval)
    }
    fn first_key(&self) -> &str {
        Call::first_key(self)
    }
    fn parse(&self, value: &Value) -> Result<Decision> {
        self.decision(value)
    }

    fn local(
        &self,
        local: &LocalLimiter,
        settings: &LocalSettings,
        now_ms: i64,
    ) -> Option<Decision> {
        if !self.local {
            return None;
        }
        let write = self.op != Op::Peek;
        let answer = local.take(settings, &self.bucket_refs(), write, now_ms)?;
        let outcome = answer.outcome;
        let fields = Fields {
            allowed: answer.allowed,
            remaining: u64::try_from(outcome.remaining).unwrap_or(0),
            retry_after_ms: outcome.retry_after_ms,
            reset_after_ms: u64::try_from(outcome.reset_after_ms).unwrap_or(0),
        };
        self.in_process(fields, answer.index, Source::Local)
    }

    fn cached(
        &self,
        denials: &DenialCache,
        settings: &LocalSettings,
        now_ms: i64,
    ) -> Option<Decision> {
        if !self.cacheable() {
            return None;
        }
        let hit = denials.answer(settings, &self.bucket_refs(), now_ms)?;
        let fields = Fields {
            allowed: false,
            remaining: hit.remaining,
            retry_after_ms: hit.retry_after_ms,
            reset_after_ms: hit.reset_after_ms,
        };
        self.in_process(fields, hit.index, Source::Cache)
    }

    fn observe(
        &self,
        answer: &Decision,
        denials: &DenialCache,
        settings: &LocalSettings,
        now_ms: i64,
    ) {
        match self.op {
            // This limiter changed the bucket: its cached denial may be wrong now.
            Op::Refund | Op::Charge => {
                for b in &self.buckets {
                    denials.forget(&b.key);
                }
            }
            _ if self.cacheable() && !answer.allowed => {
                let Some(denied) = self.buckets.get(answer.index.unwrap_or(0)) else {
                    return;
                };
                let fields = (
                    answer.remaining,
                    answer.retry_after_ms,
                    answer.reset_after_ms,
                );
                denials.remember(settings, &denied.key, denied.n, fields, now_ms);
            }
            // The flood bound: an allowed take that leaves fewer than its n
            // is cached as the denial the same take would get until n is
            // back. Not for a lockout take: its next denial must reach the
            // server to lock the key.
            _ if self.cacheable() && answer.allowed && self.options.is_empty() => {
                let Some(b) = self.buckets.get(answer.index.unwrap_or(0)) else {
                    return;
                };
                let (remaining, reset) = (answer.remaining, answer.reset_after_ms);
                if let Some(window) = primed_denial_ms(b.capacity, b.rate, b.n, remaining, reset) {
                    denials.remember(settings, &b.key, b.n, (remaining, window, reset), now_ms);
                }
            }
            _ => {}
        }
    }

    fn resend_on_drop(&self) -> bool {
        self.resend
    }
}

impl Blocking for Call {
    fn blocking(&self, timeout_ms: u64) -> Cmd {
        self.btake(timeout_ms)
    }
    fn reservation(&self, timeout_ms: u64) -> Option<Self> {
        Call::reservation(self, timeout_ms)
    }
}

/// `TB.UNBLOCK key`: 1 if a lock or strikes were forgotten, else 0.
#[derive(Debug, Clone)]
pub(crate) struct UnblockCall {
    key: String,
}

impl UnblockCall {
    pub fn new(key: &str) -> Result<UnblockCall> {
        check_key(key)?;
        Ok(UnblockCall { key: key.into() })
    }
}

impl Request for UnblockCall {
    type Output = bool;
    fn command(&self, resolved: &Resolved, eval: bool) -> Cmd {
        if resolved.backend == Backend::Module {
            let mut cmd = redis::cmd("TB.UNBLOCK");
            cmd.arg(&self.key);
            return cmd;
        }
        let lua = LuaName {
            fcall: "FCALL",
            function: "tb_unblock",
            word: "unblock",
        };
        lua_command(resolved, eval, lua, &[&self.key], &[])
    }
    fn first_key(&self) -> &str {
        &self.key
    }
    fn parse(&self, value: &Value) -> Result<bool> {
        match value {
            Value::Int(0) => Ok(false),
            Value::Int(1) => Ok(true),
            other => Err(Error::Other(format!("unexpected reply: {other:?}"))),
        }
    }

    fn observe(&self, _: &bool, denials: &DenialCache, _: &LocalSettings, _now_ms: i64) {
        // The lock is gone: a denial cached because of it is wrong now.
        denials.forget(&self.key);
    }
}

/// `COMMAND INFO tb.take` has an entry: the module is loaded.
pub(crate) fn command_info_has_entry(v: &Value) -> bool {
    match v {
        Value::Array(items) => items.iter().any(|i| !matches!(i, Value::Nil)),
        Value::Map(items) => !items.is_empty(),
        _ => false,
    }
}

pub(crate) fn command_info() -> Cmd {
    let mut cmd = redis::cmd("COMMAND");
    cmd.arg("INFO").arg("tb.take");
    cmd
}

pub(crate) fn function_load() -> Cmd {
    let mut cmd = redis::cmd("FUNCTION");
    cmd.arg("LOAD").arg("REPLACE").arg(LUA_LIBRARY);
    cmd
}

pub(crate) fn script_load() -> Cmd {
    let mut cmd = redis::cmd("SCRIPT");
    cmd.arg("LOAD").arg(lua_script());
    cmd
}

/// The SHA1 SCRIPT LOAD replied (a cluster client may answer with one per node).
pub(crate) fn sha_of(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => String::from_utf8(b.clone()).ok(),
        Value::SimpleString(s) => Some(s.clone()),
        Value::Array(items) => items.iter().find_map(sha_of),
        Value::Map(items) => items.iter().find_map(|(_, v)| sha_of(v)),
        _ => None,
    }
}

pub(crate) const WHY_MODULE: &str = "COMMAND INFO tb.take: the redis-tb module is loaded";
pub(crate) const WHY_FUNCTION: &str =
    "the module is not loaded; FUNCTION LOAD REPLACE of lua/tb.lua succeeded";
pub(crate) const WHY_FORCED: &str = "forced by the caller";

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn an_allowed_take_that_leaves_fewer_than_n_is_answered_denied_from_the_cache_until_n_is_back()
    {
        use crate::decision::{Fields, Source};
        let settings = LocalSettings {
            cache_denials: true,
            ..LocalSettings::default()
        };
        let denials = DenialCache::default();
        let take = Call::single(Op::Take, "k", 5.0, 1.0, 1.0, "default").unwrap();
        let fields = Fields {
            allowed: true,
            remaining: 0,
            retry_after_ms: 0,
            reset_after_ms: 5000,
        };
        let policies = vec![Policy::new("default", 5.0, 1.0)];
        let last_token = Decision::answered(fields, policies, None, Source::Server).unwrap();
        take.observe(&last_token, &denials, &settings, 10_000);
        let hit = take.cached(&denials, &settings, 10_400).unwrap();
        // Until 10_000 + 1000 + the 1 ms rounding margin.
        assert_eq!(
            (hit.allowed, hit.retry_after_ms, hit.remaining, hit.source()),
            (false, 601, 0, Source::Cache)
        );
        assert!(
            take.cached(&denials, &settings, 11_001).is_none(),
            "n is back"
        );
        // A lockout take is not primed: its denial must reach the server.
        let options = TakeOptions {
            block_ms: Some(1000),
            ..TakeOptions::default()
        };
        let locking = Call::take_with(take.clone(), &options).unwrap();
        let denials = DenialCache::default();
        locking.observe(&last_token, &denials, &settings, 10_000);
        assert!(locking.cached(&denials, &settings, 10_400).is_none());
    }

    /// A command's words, to hold against the expected ones (the lease
    /// commands' tests use it too).
    pub(crate) fn args(cmd: &Cmd) -> Vec<String> {
        cmd.args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "<cursor>".into(),
            })
            .collect()
    }

    #[test]
    fn script_is_the_library_without_its_first_line() {
        assert!(LUA_LIBRARY.starts_with("#!lua name=tb\n"));
        assert!(!lua_script().starts_with("#!lua"));
        assert_eq!(
            lua_script().len() + "#!lua name=tb\n".len(),
            LUA_LIBRARY.len()
        );
    }

    #[test]
    fn the_library_text_is_the_repository_file() {
        let repo =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../lua/tb.lua"))
                .unwrap();
        assert_eq!(repo, LUA_LIBRARY);
    }

    #[test]
    fn commands_per_backend() {
        let take = Call::single(Op::Take, "k", 10.0, 0.5, 1.0, "default").unwrap();
        let module = Resolved {
            backend: Backend::Module,
            sha: None,
        };
        let function = Resolved {
            backend: Backend::Function,
            sha: None,
        };
        let script = Resolved {
            backend: Backend::Script,
            sha: Some("abc".into()),
        };
        assert_eq!(
            args(&take.command(&module, false)),
            ["TB.TAKE", "k", "10", "0.5", "1"]
        );
        assert_eq!(
            args(&take.command(&function, false)),
            ["FCALL", "tb_take", "1", "k", "10", "0.5", "1"]
        );
        assert_eq!(
            args(&take.command(&script, false)),
            ["EVALSHA", "abc", "1", "k", "take", "10", "0.5", "1"]
        );
        assert_eq!(args(&take.command(&script, true))[0], "EVAL");
        // peek writes nothing: FCALL_RO, which replicas run too.
        let peek = Call::single(Op::Peek, "k", 10.0, 0.5, 1.0, "default").unwrap();
        assert_eq!(
            args(&peek.command(&function, false)),
            ["FCALL_RO", "tb_peek", "1", "k", "10", "0.5", "1"]
        );
        let all = Call::all(&[
            Limit::new("{u}:a", 10, 2),
            Limit::new("{u}:b", 5000, 0.25).cost(2),
        ])
        .unwrap();
        assert_eq!(
            args(&all.command(&module, false)),
            [
                "TB.TAKEALL",
                "{u}:a",
                "10",
                "2",
                "1",
                "{u}:b",
                "5000",
                "0.25",
                "2"
            ]
        );
        assert_eq!(
            args(&all.command(&function, false)),
            [
                "FCALL",
                "tb_takeall",
                "2",
                "{u}:a",
                "{u}:b",
                "10",
                "2",
                "1",
                "5000",
                "0.25",
                "2"
            ]
        );
        assert_eq!(
            args(&all.command(&script, false)),
            [
                "EVALSHA", "abc", "2", "{u}:a", "{u}:b", "takeall", "10", "2", "1", "5000", "0.25",
                "2"
            ]
        );
        assert_eq!(
            args(&take.btake(250)),
            ["TB.BTAKE", "k", "10", "0.5", "1", "250"]
        );
        assert!(Call::all(&[]).is_err());
    }

    #[test]
    fn options_follow_the_numbers_on_every_backend() {
        let module = Resolved::new(Backend::Module, None);
        let function = Resolved::new(Backend::Function, None);
        let script = Resolved::new(Backend::Script, Some("abc".into()));
        let plain = Call::single(Op::Take, "k", 10.0, 0.5, 1.0, "default").unwrap();
        let options = TakeOptions::new()
            .max_wait_ms(500)
            .block(100)
            .max_block(800);
        let take = Call::take_with(plain.clone(), &options).unwrap();
        assert_eq!(
            args(&take.command(&module, false)),
            [
                "TB.TAKE", "k", "10", "0.5", "1", "MAXWAIT", "500", "BLOCK", "100", "MAXBLOCK",
                "800"
            ]
        );
        assert_eq!(
            args(&take.command(&script, false)),
            [
                "EVALSHA", "abc", "1", "k", "take", "10", "0.5", "1", "MAXWAIT", "500", "BLOCK",
                "100", "MAXBLOCK", "800"
            ]
        );
        // The wait's blocking form takes no options; its reservation is MAXWAIT alone.
        assert_eq!(
            args(&take.btake(5)),
            ["TB.BTAKE", "k", "10", "0.5", "1", "5"]
        );
        let reservation = plain.reservation(0).unwrap();
        assert_eq!(
            args(&reservation.command(&function, false))[7..],
            ["MAXWAIT", "9007199254740992"]
        );
        let all = Call::all_with(
            &[
                Limit::new("{u}:a", 10, 2).block(50),
                Limit::new("{u}:b", 5, 1).block(50),
            ],
            20,
        )
        .unwrap();
        assert_eq!(
            args(&all.command(&module, false))[9..],
            ["MAXWAIT", "20", "BLOCK", "50"]
        );
        assert_eq!(
            args(&all.command(&function, false))[11..],
            ["MAXWAIT", "20", "BLOCK", "50"]
        );
        let limit = Limit::new("k", 5, 1);
        let charge = Call::charge(&limit, 3.0, Some(2.5)).unwrap();
        assert_eq!(
            args(&charge.command(&module, false)),
            ["TB.CHARGE", "k", "5", "1", "3", "MAXDEBT", "2.5"]
        );
        assert_eq!(
            args(&UnblockCall::new("k").unwrap().command(&function, false)),
            ["FCALL", "tb_unblock", "1", "k"]
        );
        let refund = Call::settle(&limit, 5.0, 2.0).unwrap().unwrap();
        assert_eq!(
            args(&refund.command(&module, false)),
            ["TB.REFUND", "k", "5", "1", "3"]
        );
        let more = Call::settle(&limit, 2.0, 5.0).unwrap().unwrap();
        assert_eq!(
            args(&more.command(&module, false)),
            ["TB.CHARGE", "k", "5", "1", "3"]
        );
        assert!(Call::settle(&limit, 2.0, 2.0).unwrap().is_none());
    }

    #[test]
    fn bad_options_are_refused_before_sending() {
        let plain = Call::single(Op::Take, "k", 1.0, 1.0, 1.0, "default").unwrap();
        for options in [
            TakeOptions::new().block(0),
            TakeOptions::new().max_block(5),
            TakeOptions::new().block(10).max_block(9),
            TakeOptions::new().max_wait_ms((1 << 53) + 1),
        ] {
            assert!(
                Call::take_with(plain.clone(), &options).is_err(),
                "{options:?}"
            );
        }
        let limit = Limit::new("k", 1, 1);
        assert!(Call::limit_take(&limit.clone().max_block(5), 0).is_err());
        assert!(Call::charge(&limit, 1.0, Some(-1.0)).is_err());
        assert!(Call::charge(&limit, 1.0, Some(f64::NAN)).is_err());
        assert!(Call::settle(&limit, f64::NAN, 1.0).is_err());
        assert!(Call::settle(&limit.clone().block(0), 1.0, 1.0).is_err());
        assert!(Call::all_with(&[limit.clone().block(5), limit.clone()], 0).is_err());
        assert!(UnblockCall::new("").is_err());
    }
}
