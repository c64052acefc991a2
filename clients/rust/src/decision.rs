//! Decisions, limits and the draft-11 `RateLimit` headers, the checks that
//! a policy, a key or a cost is one the server (and the headers) take, and
//! the bucket keys with their cluster slots: the pure rules (Python's
//! `_core.py`, Node's `core.js`; the commands are in `backend.rs`).

use crate::error::{Error, Result};
use http::{HeaderMap, HeaderName, HeaderValue};
use redis::Value;

/// The largest Structured Fields integer; larger header values are capped.
pub(crate) const SF_INT_MAX: u64 = 999_999_999_999_999;

/// The limit a decision was judged with, kept for the headers.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    /// Policy name in the headers (`"default"` unless set; `take_all`:
    /// `"limit<index>"` unless the [`Limit`] has a name).
    pub name: String,
    /// Tokens in a full bucket.
    pub capacity: f64,
    /// Tokens added per second.
    pub rate: f64,
}

impl Policy {
    /// A policy named `name`: `capacity` tokens, refilled at `rate` per second.
    pub fn new(name: impl Into<String>, capacity: impl Into<f64>, rate: impl Into<f64>) -> Policy {
        Policy {
            name: name.into(),
            capacity: capacity.into(),
            rate: rate.into(),
        }
    }

    /// `floor(capacity)`: whole requests of cost 1 in a full bucket.
    pub fn quota(&self) -> u64 {
        // `as` saturates (NaN -> 0), never panics.
        self.capacity.floor() as u64
    }

    /// `ceil(capacity / rate)` seconds: the time to refill an empty bucket.
    pub fn window_secs(&self) -> u64 {
        (self.capacity / self.rate).ceil() as u64
    }

    /// This policy as one `RateLimit-Policy` item: `"name";q=10;w=5`.
    pub fn header_item(&self) -> String {
        format!(
            "{};q={};w={}",
            sf_string(&self.name),
            self.quota().min(SF_INT_MAX),
            self.window_secs().min(SF_INT_MAX)
        )
    }
}

/// One bucket of a [`take_all`](crate::RateLimiter::take_all) call.
#[derive(Debug, Clone, PartialEq)]
pub struct Limit {
    /// The bucket's key. In a cluster all keys of one call must share a hash
    /// slot: give them a common hash tag, e.g. `{user:42}:sec`, `{user:42}:day`.
    pub key: String,
    /// Tokens in a full bucket.
    pub capacity: f64,
    /// Tokens added per second.
    pub rate: f64,
    /// Tokens this call takes (default 1).
    pub n: f64,
    /// Policy name in the headers (default `"limit<index>"`).
    pub name: Option<String>,
    /// Lockout ([docs/clients.md](../../docs/clients.md)): a denied take
    /// locks the key for this many ms (`BLOCK`, 1 to 2^53), sent on this
    /// limit's takes ([`take_limit`](crate::RateLimiter::take_limit),
    /// `take_all`). `None`: no lockout.
    pub block_ms: Option<u64>,
    /// A lock that starts within the last one's probation lasts twice as
    /// long, up to this (`MAXBLOCK`; needs `block_ms`, at least it).
    pub max_block_ms: Option<u64>,
}

impl Limit {
    /// A limit of `capacity` tokens refilled at `rate` per second; costs 1.
    pub fn new(key: impl Into<String>, capacity: impl Into<f64>, rate: impl Into<f64>) -> Limit {
        Limit {
            key: key.into(),
            capacity: capacity.into(),
            rate: rate.into(),
            n: 1.0,
            name: None,
            block_ms: None,
            max_block_ms: None,
        }
    }

    /// Sets the lockout: a denied take locks the key for `block_ms`
    /// (checked, as every field, before anything is sent).
    pub fn block(mut self, block_ms: u64) -> Limit {
        self.block_ms = Some(block_ms);
        self
    }

    /// Sets the longest lock an escalation reaches (`MAXBLOCK`).
    pub fn max_block(mut self, max_block_ms: u64) -> Limit {
        self.max_block_ms = Some(max_block_ms);
        self
    }

    /// Sets the cost (tokens taken).
    pub fn cost(mut self, n: impl Into<f64>) -> Limit {
        self.n = n.into();
        self
    }

    /// Sets the policy name used in the headers.
    pub fn name(mut self, name: impl Into<String>) -> Limit {
        self.name = Some(name.into());
        self
    }

    /// A limit checked when it is made ([`check`](Self::check)): the form
    /// for numbers that come from configuration.
    pub fn try_new(
        key: impl Into<String>,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
    ) -> Result<Limit> {
        let limit = Limit::new(key, capacity, rate);
        limit.check()?;
        Ok(limit)
    }

    /// [`Error::InvalidArgument`] for a field the server would refuse: an
    /// empty key, a capacity or rate that is not a positive finite number
    /// (capacity at most 2^53), a cost that is not a non-negative finite
    /// number at most 2^53, a name that is empty or not printable ASCII, a
    /// lockout out of range. Every call checks its limits this way before
    /// anything is sent; call it yourself to refuse a limit where it is
    /// made (after `.cost(..)`, `.name(..)`, `.block(..)`).
    pub fn check(&self) -> Result<()> {
        check_key(&self.key)?;
        check_capacity(self.capacity)?;
        check_rate(self.rate)?;
        check_cost(self.n)?;
        if let Some(name) = &self.name {
            check_name(name)?;
        }
        lockout_words(self.block_ms, self.max_block_ms).map(drop)
    }
}

/// The answer of a limiter call: the module's (or the script's) reply plus
/// the limits it was judged with.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// The tokens were taken (peek: would be).
    pub allowed: bool,
    /// Whole tokens left after the call; when denied, whole tokens available now.
    pub remaining: u64,
    /// Denied: the shortest wait in ms after which the same call would
    /// succeed (a lock's end included); -1 when it never can (`n >
    /// capacity`). Allowed: 0, or (a reservation, a charge into debt) the
    /// wait before acting: [`wait_ms`](Decision::wait_ms).
    pub retry_after_ms: i64,
    /// Shortest wait in ms until the bucket is full again (0: full).
    pub reset_after_ms: u64,
    /// The deciding policy's name.
    pub policy: String,
    /// The deciding policy's capacity.
    pub capacity: f64,
    /// The deciding policy's rate (tokens per second).
    pub rate: f64,
    /// `take_all` only: 0-based position of the deciding limit.
    pub index: Option<usize>,
    /// Every limit judged, in the call's order (one outside `take_all`), for
    /// the `RateLimit-Policy` header.
    pub policies: Vec<Policy>,
    /// Who answered: see [`source`](Decision::source).
    source: Source,
}

/// Where a [`Decision`] came from (docs/clients.md#which-answers-were-local).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum Source {
    /// Redis (the module or the Lua backend).
    #[default]
    Server,
    /// The local limiter, while Redis is unreachable.
    Local,
    /// The denial cache (`cache_denials`), without a round trip.
    Cache,
}

impl Source {
    /// `"server"`, `"local"` or `"cache"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Source::Server => "server",
            Source::Local => "local",
            Source::Cache => "cache",
        }
    }
}

/// The four numbers of an answer, from the server or from the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fields {
    pub allowed: bool,
    pub remaining: u64,
    pub retry_after_ms: i64,
    pub reset_after_ms: u64,
}

impl Decision {
    /// The decision of `fields` judged with `policies` (`index`: the
    /// deciding one of a `take_all`), answered by `source`.
    pub(crate) fn answered(
        fields: Fields,
        policies: Vec<Policy>,
        index: Option<usize>,
        source: Source,
    ) -> Option<Decision> {
        let deciding = policies.get(index.unwrap_or(0))?;
        Some(Decision {
            allowed: fields.allowed,
            remaining: fields.remaining,
            retry_after_ms: fields.retry_after_ms,
            reset_after_ms: fields.reset_after_ms,
            policy: deciding.name.clone(),
            capacity: deciding.capacity,
            rate: deciding.rate,
            index,
            policies,
            source,
        })
    }

    /// Who answered: [`Source::Server`] (Redis), [`Source::Local`] (the
    /// local limiter during an outage) or [`Source::Cache`] (a cached denial).
    pub fn source(&self) -> Source {
        self.source
    }

    /// Renames the deciding policy (the only one outside `take_all`).
    pub fn with_policy_name(mut self, name: impl Into<String>) -> Decision {
        let name = name.into();
        if let Some(policy) = self.policies.get_mut(self.index.unwrap_or(0)) {
            policy.name = name.clone();
        }
        self.policy = name;
        self
    }

    /// On an allowed decision, the ms to wait before acting: > 0 for a
    /// reservation (a take with `max_wait_ms`) or a charge that left debt
    /// (until it is repaid), 0 for a plain grant. 0 on a denial (see
    /// `retry_after_ms`).
    pub fn wait_ms(&self) -> u64 {
        if self.allowed && self.retry_after_ms > 0 {
            self.retry_after_ms.unsigned_abs()
        } else {
            0
        }
    }

    /// True when denied and no wait makes the same call succeed (`n > capacity`).
    pub fn can_never_succeed(&self) -> bool {
        !self.allowed && self.retry_after_ms < 0
    }

    /// `ceil(retry_after_ms / 1000)`: the `Retry-After` seconds on a denial
    /// with `retry_after_ms >= 0`; `None` when allowed or when waiting cannot help.
    pub fn retry_after_secs(&self) -> Option<u64> {
        if self.allowed || self.retry_after_ms < 0 {
            return None;
        }
        Some((self.retry_after_ms as u64).div_ceil(1000))
    }

    /// `ceil(reset_after_ms / 1000)`.
    pub fn reset_secs(&self) -> u64 {
        self.reset_after_ms.div_ceil(1000)
    }

    /// The draft-ietf-httpapi-ratelimit-headers-11 response headers, in this
    /// order: `RateLimit-Policy` (one item per limit, in the call's order),
    /// `RateLimit` (the deciding limit), and `Retry-After` on a denial that a
    /// wait can fix.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut headers = Vec::with_capacity(3);
        let items: Vec<String> = self.policies.iter().map(Policy::header_item).collect();
        headers.push(("RateLimit-Policy", items.join(", ")));
        headers.push((
            "RateLimit",
            format!(
                "{};r={};t={}",
                sf_string(&self.policy),
                self.remaining.min(SF_INT_MAX),
                self.reset_secs().min(SF_INT_MAX)
            ),
        ));
        if let Some(secs) = self.retry_after_secs() {
            headers.push(("Retry-After", secs.to_string()));
        }
        headers
    }

    /// [`headers`](Self::headers) as an [`http::HeaderMap`].
    pub fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in self.headers() {
            if let Ok(value) = HeaderValue::from_str(&value) {
                map.insert(HeaderName::from_static(lower(name)), value);
            }
        }
        map
    }

    /// Builds a decision from a four- (or, for `take_all`, five-) integer reply.
    pub(crate) fn from_reply(value: &Value, policies: Vec<Policy>, all: bool) -> Result<Decision> {
        let ints: Vec<i64> = redis::FromRedisValue::from_redis_value_ref(value)
            .map_err(|_| Error::Other(format!("unexpected reply: {value:?}")))?;
        let bad = || Error::Other(format!("unexpected reply: {ints:?}"));
        let want = if all { 5 } else { 4 };
        if ints.len() != want {
            return Err(bad());
        }
        let field = |i: usize| ints.get(i).copied().ok_or_else(bad);
        let index = if all {
            Some(usize::try_from(field(4)?).map_err(|_| bad())?)
        } else {
            None
        };
        let fields = Fields {
            allowed: field(0)? == 1,
            remaining: u64::try_from(field(1)?).map_err(|_| bad())?,
            retry_after_ms: field(2)?,
            reset_after_ms: u64::try_from(field(3)?).map_err(|_| bad())?,
        };
        Decision::answered(fields, policies, index, Source::Server).ok_or_else(bad)
    }
}

fn lower(name: &'static str) -> &'static str {
    match name {
        "RateLimit-Policy" => "ratelimit-policy",
        "RateLimit" => "ratelimit",
        _ => "retry-after",
    }
}

/// A Structured Field string: `"..."` with `\` and `"` escaped; characters
/// outside printable ASCII (which sf-strings cannot hold) become `?`.
pub(crate) fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            _ => out.push('?'),
        }
    }
    out.push('"');
    out
}

/// A number as the module reads it: the shortest text that reads back as
/// the same double (Rust's `{}`), or exponent form when that is long
/// (`1e-70`); NaN and infinities are refused before anything is sent.
pub(crate) fn number(what: &str, x: f64) -> Result<String> {
    if !x.is_finite() {
        return Err(Error::InvalidArgument(format!(
            "{what} must be a finite number, got {x}"
        )));
    }
    let plain = format!("{x}");
    if plain.len() <= 32 {
        Ok(plain)
    } else {
        Ok(format!("{x:e}"))
    }
}

/// The largest integer a double holds exactly: the module's bound on
/// capacities and costs.
pub(crate) const MAX_EXACT: f64 = 9_007_199_254_740_992.0;

fn invalid(message: String) -> Error {
    Error::InvalidArgument(message)
}

pub(crate) fn check_capacity(capacity: f64) -> Result<()> {
    if capacity.is_finite() && capacity > 0.0 && capacity <= MAX_EXACT {
        Ok(())
    } else {
        Err(invalid(format!(
            "capacity must be a positive finite number at most 2^53, got {capacity}"
        )))
    }
}

pub(crate) fn check_rate(rate: f64) -> Result<()> {
    if rate.is_finite() && rate > 0.0 {
        Ok(())
    } else {
        Err(invalid(format!(
            "rate must be a positive finite number, got {rate}"
        )))
    }
}

pub(crate) fn check_cost(n: f64) -> Result<()> {
    if n.is_finite() && (0.0..=MAX_EXACT).contains(&n) {
        Ok(())
    } else {
        Err(invalid(format!(
            "n must be a non-negative finite number at most 2^53, got {n}"
        )))
    }
}

pub(crate) fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        Err(invalid("the key must not be empty".into()))
    } else {
        Ok(())
    }
}

pub(crate) fn check_name(name: &str) -> Result<()> {
    if !name.is_empty() && name.chars().all(|c| matches!(c, ' '..='~')) {
        Ok(())
    } else {
        Err(invalid(format!(
            "a policy name must be printable ASCII and not empty, got {name:?}"
        )))
    }
}

/// A whole number of ms in `[least, 2^53]` (`MAXWAIT`: 0; `BLOCK`, `MAXBLOCK`: 1).
pub(crate) fn check_ms(value: u64, what: &str, least: u64) -> Result<String> {
    if (least..=MAX_EXACT as u64).contains(&value) {
        Ok(value.to_string())
    } else {
        Err(invalid(format!(
            "{what} must be a whole number of ms from {least} to 2^53, got {value}"
        )))
    }
}

/// The `timeout_ms` of a wait (TB.BTAKE's, TB.ACQUIRE's): 0 (no limit) to
/// 2^53, the server's bound on it. A `u64` is its own exact value, so
/// 2^53 + 1 is refused here, as the server refuses its text.
pub(crate) fn check_timeout_ms(timeout_ms: u64) -> Result<()> {
    if timeout_ms <= MAX_EXACT as u64 {
        Ok(())
    } else {
        Err(invalid(format!(
            "timeout_ms must be a whole number of ms from 0 (no limit) to 2^53, got {timeout_ms}"
        )))
    }
}

/// `BLOCK ms [MAXBLOCK ms]`, or nothing without `block_ms`; `max_block_ms`
/// needs `block_ms` and is at least it.
pub(crate) fn lockout_words(
    block_ms: Option<u64>,
    max_block_ms: Option<u64>,
) -> Result<Vec<String>> {
    match (block_ms, max_block_ms) {
        (None, None) => Ok(vec![]),
        (None, Some(_)) => Err(invalid("max_block_ms needs block_ms".into())),
        (Some(block), None) => Ok(vec!["BLOCK".into(), check_ms(block, "block_ms", 1)?]),
        (Some(block), Some(most)) => {
            let words = vec![
                "BLOCK".into(),
                check_ms(block, "block_ms", 1)?,
                "MAXBLOCK".into(),
                check_ms(most, "max_block_ms", 1)?,
            ];
            if most < block {
                return Err(invalid(format!(
                    "max_block_ms must be at least block_ms ({block}), got {most}"
                )));
            }
            Ok(words)
        }
    }
}

/// `MAXWAIT ms` (nothing for 0) and the lockout's words.
pub(crate) fn take_words(
    max_wait_ms: u64,
    block_ms: Option<u64>,
    max_block_ms: Option<u64>,
) -> Result<Vec<String>> {
    let mut words = Vec::new();
    if max_wait_ms > 0 {
        words.push("MAXWAIT".into());
        words.push(check_ms(max_wait_ms, "max_wait_ms", 0)?);
    }
    words.extend(lockout_words(block_ms, max_block_ms)?);
    Ok(words)
}

/// The options of a take on one bucket ([`take_with`](crate::RateLimiter::take_with)):
/// `max_wait_ms` (a reservation, `MAXWAIT`; 0: none) and the lockout
/// (`BLOCK`, `MAXBLOCK`), checked before anything is sent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TakeOptions {
    /// A reservation: allowed into debt when the tokens arrive within this
    /// many ms; the decision's [`wait_ms`](Decision::wait_ms) is then how
    /// long to wait before acting. 0: no reservation.
    pub max_wait_ms: u64,
    /// A denial locks the key for this many ms (`BLOCK`).
    pub block_ms: Option<u64>,
    /// Escalation cap (`MAXBLOCK`; needs `block_ms`).
    pub max_block_ms: Option<u64>,
}

impl TakeOptions {
    /// No option: a plain take.
    pub fn new() -> TakeOptions {
        TakeOptions::default()
    }

    /// Sets `max_wait_ms`.
    pub fn max_wait_ms(mut self, ms: u64) -> TakeOptions {
        self.max_wait_ms = ms;
        self
    }

    /// Sets `block_ms`.
    pub fn block(mut self, ms: u64) -> TakeOptions {
        self.block_ms = Some(ms);
        self
    }

    /// Sets `max_block_ms`.
    pub fn max_block(mut self, ms: u64) -> TakeOptions {
        self.max_block_ms = Some(ms);
        self
    }
}

/// What [`unblock`](crate::RateLimiter::unblock) takes: a key, or a [`Limit`] (its key).
pub trait BucketKey {
    /// The bucket's key.
    fn bucket_key(&self) -> &str;
}

impl BucketKey for str {
    fn bucket_key(&self) -> &str {
        self
    }
}

impl BucketKey for String {
    fn bucket_key(&self) -> &str {
        self
    }
}

impl BucketKey for Limit {
    fn bucket_key(&self) -> &str {
        &self.key
    }
}

impl<T: BucketKey + ?Sized> BucketKey for &T {
    fn bucket_key(&self) -> &str {
        (**self).bucket_key()
    }
}

/// The id as it goes between the braces of a bucket key: `%` -> `%25`,
/// `{` -> `%7B`, `}` -> `%7D`, and the empty id -> `%`. The result never
/// holds a brace and is never empty, so it is always exactly the hash tag.
pub fn escape_id(id: &str) -> String {
    if id.is_empty() {
        return "%".into();
    }
    let mut out = String::with_capacity(id.len());
    for c in id.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

/// The bucket of caller `id` under policy `name`: `<prefix>{<escaped id>}:<name>`.
pub fn bucket_key(prefix: &str, id: &str, name: &str) -> String {
    format!("{prefix}{{{}}}:{name}", escape_id(id))
}

/// The CRC16 (XMODEM) of Redis Cluster's key hashing.
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The cluster slot of `key`: the CRC16 of its hash tag (the part between
/// the first `{` and the next `}`, when not empty) or of the whole key.
pub fn key_slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let tagged = bytes.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = bytes.get(open + 1..)?;
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| rest.get(..close)).flatten()
    });
    crc16(tagged.unwrap_or(bytes)) % 16384
}

/// Refuses a policy whose capacity, rate or name the server would refuse
/// (or the headers could not carry).
pub fn check_policy(policy: &Policy) -> Result<()> {
    check_name(&policy.name)?;
    check_capacity(policy.capacity)?;
    check_rate(policy.rate)
}

/// One row of [`top`](crate::RateLimiter::top) (TB.TOP,
/// docs/clients.md#the-most-denied-keys): a key among the most denied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopKey {
    /// The key's name as text, bytes that are not UTF-8 replaced by U+FFFD.
    pub key: String,
    /// The key's name, exactly (its first 256 bytes when `truncated`).
    pub key_bytes: Vec<u8>,
    /// Denials counted: never below the true number over the window, at
    /// most `error` above it.
    pub count: u64,
    /// The bound on the overcount.
    pub error: u64,
    /// How many of them were shadow-mode denials.
    pub shadow: u64,
    /// The name was longer than 256 bytes and cut to its first 256 (keys
    /// that share those bytes share the row).
    pub truncated: bool,
}

/// `TB.TOP COUNT count`, `count` from 1 to 2^53.
pub(crate) fn top_command(count: u64) -> Result<redis::Cmd> {
    if !(1..=MAX_EXACT as u64).contains(&count) {
        return Err(Error::InvalidArgument(format!(
            "count must be an integer from 1 to 2^53, got {count}"
        )));
    }
    let mut cmd = redis::cmd("TB.TOP");
    cmd.arg("COUNT").arg(count);
    Ok(cmd)
}

/// One server's TB.TOP reply: `[key, count, error, shadow, truncated]` rows.
fn top_rows(value: &Value) -> Result<Vec<TopKey>> {
    let bad = || Error::Other(format!("unexpected TB.TOP reply: {value:?}"));
    let Value::Array(rows) = value else {
        return Err(bad());
    };
    let count = |v: &Value| match v {
        Value::Int(i) => u64::try_from(*i).ok(),
        _ => None,
    };
    rows.iter()
        .map(|row| {
            let Value::Array(fields) = row else {
                return Err(bad());
            };
            let [key, n, error, shadow, truncated] = fields.as_slice() else {
                return Err(bad());
            };
            let key_bytes = match key {
                Value::BulkString(b) => b.clone(),
                Value::SimpleString(s) => s.as_bytes().to_vec(),
                _ => return Err(bad()),
            };
            let (Some(n), Some(error), Some(shadow), Some(truncated)) =
                (count(n), count(error), count(shadow), count(truncated))
            else {
                return Err(bad());
            };
            Ok(TopKey {
                key: String::from_utf8_lossy(&key_bytes).into_owned(),
                key_bytes,
                count: n,
                error,
                shadow,
                truncated: truncated != 0,
            })
        })
        .collect()
}

/// The answer of `top(count)` from the TB.TOP replies of every master (one
/// on a standalone server): all their rows, the most denied first, ties by
/// key bytes, the first `count`. Any server's error is the call's: never a
/// partial answer.
pub(crate) fn merged_top(
    replies: impl IntoIterator<Item = Result<Value>>,
    count: u64,
) -> Result<Vec<TopKey>> {
    let mut rows = Vec::new();
    for reply in replies {
        rows.extend(top_rows(&reply?)?);
    }
    // The server's own order (core/src/top.rs): each node cut its answer at
    // `count` in it, so the merge keeps the deployment's first `count`.
    rows.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.error.cmp(&b.error))
            .then_with(|| a.key_bytes.cmp(&b.key_bytes))
    });
    rows.truncate(usize::try_from(count).unwrap_or(usize::MAX));
    Ok(rows)
}

/// The replies of a command routed to every master by a cluster client: a
/// map of node address to that node's reply (an error reply as a value, by
/// the async client).
#[cfg(feature = "cluster")]
pub(crate) fn per_node(value: Value) -> Vec<Result<Value>> {
    match value {
        Value::Map(nodes) => nodes
            .into_iter()
            .map(|(_, reply)| match reply {
                Value::ServerError(e) => Err(Error::from(redis::RedisError::from(e))),
                reply => Ok(reply),
            })
            .collect(),
        other => vec![Ok(other)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &[u8], count: i64) -> Value {
        Value::Array(vec![
            Value::BulkString(key.to_vec()),
            Value::Int(count),
            Value::Int(1),
            Value::Int(0),
            Value::Int(0),
        ])
    }

    #[test]
    fn top_rows_merge_most_denied_first_ties_by_key_bytes() {
        let a = Value::Array(vec![row(b"b", 5), row(b"\xff", 2)]);
        let b = Value::Array(vec![row(b"a", 5), row(b"c", 7)]);
        let top = merged_top([Ok(a.clone()), Ok(b.clone())], 10).unwrap();
        let keys: Vec<&[u8]> = top.iter().map(|r| r.key_bytes.as_slice()).collect();
        assert_eq!(keys, [&b"c"[..], b"a", b"b", b"\xff"]);
        assert_eq!(top[3].key, "\u{fffd}");
        assert_eq!(
            (top[0].count, top[0].error, top[0].truncated),
            (7, 1, false)
        );
        assert_eq!(
            merged_top([Ok(a.clone()), Ok(b.clone())], 2).unwrap().len(),
            2
        );
        let refused = Err(Error::Reply("NOPERM no".into()));
        assert!(merged_top([Ok(a), refused, Ok(b)], 10).is_err());
        let odd = Value::Array(vec![Value::Array(vec![Value::Int(1)])]);
        assert!(matches!(merged_top([Ok(odd)], 1), Err(Error::Other(_))));
        assert!(top_command(0).is_err());
        assert!(top_command(1 << 53).is_ok());
        assert!(top_command((1 << 53) + 1).is_err());
    }

    #[test]
    fn ids_are_escaped_as_the_spec_says() {
        for (id, key) in [
            ("alice", "ratelimit:{alice}:sec"),
            ("}x", "ratelimit:{%7Dx}:sec"),
            ("{}", "ratelimit:{%7B%7D}:sec"),
            ("50%", "ratelimit:{50%25}:sec"),
            ("", "ratelimit:{%}:sec"),
        ] {
            assert_eq!(bucket_key("ratelimit:", id, "sec"), key, "id {id:?}");
        }
    }

    #[test]
    fn the_slot_function_matches_redis_reference_values() {
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("foo{}{bar}"), key_slot("foo{}{bar}"));
        assert_ne!(key_slot("foo{}{bar}"), key_slot("bar"));
    }

    #[test]
    fn a_timeout_may_reach_but_not_pass_2_pow_53() {
        assert!(check_timeout_ms(0).is_ok());
        assert!(check_timeout_ms(1 << 53).is_ok());
        assert!(matches!(
            check_timeout_ms((1 << 53) + 1),
            Err(Error::InvalidArgument(_))
        ));
    }

    fn decision(allowed: bool, remaining: u64, retry: i64, reset: u64) -> Decision {
        Decision {
            allowed,
            remaining,
            retry_after_ms: retry,
            reset_after_ms: reset,
            policy: "default".into(),
            capacity: 10.0,
            rate: 2.0,
            index: None,
            policies: vec![Policy::new("default", 10, 2)],
            source: Source::Server,
        }
    }

    #[test]
    fn allowed_headers() {
        assert_eq!(
            decision(true, 9, 0, 500).headers(),
            vec![
                ("RateLimit-Policy", "\"default\";q=10;w=5".to_string()),
                ("RateLimit", "\"default\";r=9;t=1".to_string()),
            ]
        );
    }

    #[test]
    fn denied_headers_round_up() {
        let h = decision(false, 0, 1001, 4000).headers();
        assert_eq!(h[2], ("Retry-After", "2".to_string()));
        assert_eq!(h[1].1, "\"default\";r=0;t=4");
        let h = decision(false, 0, 1000, 4001).headers();
        assert_eq!(h[2].1, "1");
        assert_eq!(h[1].1, "\"default\";r=0;t=5");
    }

    #[test]
    fn never_possible_has_no_retry_after() {
        let d = decision(false, 10, -1, 0);
        assert!(d.can_never_succeed());
        assert_eq!(d.headers().len(), 2);
    }

    #[test]
    fn take_all_headers_list_every_policy_and_use_the_deciding_one() {
        let d = Decision {
            allowed: false,
            remaining: 0,
            retry_after_ms: 17_280_000,
            reset_after_ms: 86_400_000,
            policy: "day".into(),
            capacity: 5000.0,
            rate: 5000.0 / 86400.0,
            index: Some(1),
            policies: vec![
                Policy::new("sec", 10, 2),
                Policy::new("day", 5000, 5000.0 / 86400.0),
            ],
            source: Source::Server,
        };
        let h = d.headers();
        assert_eq!(h[0].1, "\"sec\";q=10;w=5, \"day\";q=5000;w=86400");
        assert_eq!(h[1].1, "\"day\";r=0;t=86400");
        assert_eq!(h[2].1, "17280");
        let map = d.header_map();
        assert_eq!(map["retry-after"], "17280");
        assert_eq!(map["ratelimit"], "\"day\";r=0;t=86400");
    }

    #[test]
    fn header_integers_are_capped_at_the_structured_fields_maximum() {
        let d = Decision {
            allowed: false,
            remaining: 1 << 53,
            retry_after_ms: 1 << 53,
            reset_after_ms: 1 << 53,
            policy: "big".into(),
            capacity: 9007199254740992.0,
            rate: 1e-300,
            index: None,
            policies: vec![Policy::new("big", 9007199254740992.0, 1e-300)],
            source: Source::Server,
        };
        let h = d.headers();
        assert_eq!(h[0].1, "\"big\";q=999999999999999;w=999999999999999");
        assert_eq!(h[1].1, "\"big\";r=999999999999999;t=9007199254741");
        assert_eq!(h[2].1, "9007199254741");
    }

    #[test]
    fn fractional_capacity_and_names_are_escaped() {
        let p = Policy::new("a\"b\\c\u{e9}", 2.5, 1);
        assert_eq!(p.header_item(), "\"a\\\"b\\\\c?\";q=2;w=3");
    }

    #[test]
    fn numbers_are_shortest_exact_decimals() {
        assert_eq!(number("rate", 20.0).unwrap(), "20");
        assert_eq!(number("rate", 0.001).unwrap(), "0.001");
        assert_eq!(number("rate", 2.5).unwrap(), "2.5");
        assert_eq!(number("rate", 1e-70).unwrap(), "1e-70");
        assert_eq!(number("rate", 1e300).unwrap(), "1e300");
        assert_eq!(number("rate", 0.1 + 0.2).unwrap(), "0.30000000000000004");
        assert!(matches!(
            number("rate", f64::NAN),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            number("rate", f64::INFINITY),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn replies_parse_and_odd_shapes_are_errors() {
        let v = Value::Array(vec![
            Value::Int(0),
            Value::Int(3),
            Value::Int(-1),
            Value::Int(250),
        ]);
        let d = Decision::from_reply(&v, vec![Policy::new("x", 1, 1)], false).unwrap();
        assert_eq!(
            (d.allowed, d.remaining, d.retry_after_ms, d.reset_after_ms),
            (false, 3, -1, 250)
        );
        assert!(Decision::from_reply(&v, vec![], true).is_err());
        assert!(Decision::from_reply(&Value::Int(1), vec![], false).is_err());
        let five = Value::Array((0..5).map(|_| Value::Int(1)).collect());
        assert!(Decision::from_reply(&five, vec![Policy::new("x", 1, 1)], false).is_err());
        let d = Decision::from_reply(
            &five,
            vec![Policy::new("a", 1, 1), Policy::new("b", 1, 1)],
            true,
        )
        .unwrap();
        assert_eq!(d.index, Some(1));
        assert_eq!(d.policy, "b");
    }
}
