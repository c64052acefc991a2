//! Concurrency leases (docs/leases.md): TB.ACQUIRE / TB.RELEASE / TB.RENEW
//! and their Lua twins, as sans-IO pieces. The calls, their replies and
//! headers, the choice between a guard, a denial and failing open, and
//! when a renewal loop gives a lease up are all decided here once. The sync
//! and async limiters only do the I/O.

use crate::backend::{lua_command, Backend, Blocking, LuaName, Request, Resolved};
use crate::decision::{check_key, check_name, sf_string, MAX_EXACT, SF_INT_MAX};
use crate::engine::Awaited;
use crate::error::{Error, Result};
use http::{HeaderMap, HeaderName, HeaderValue};
use redis::{Cmd, Value};
use std::time::Duration;

/// The largest `limit` and `lease_ms` the server takes: 2^53.
const MAX_LEASE_ARG: u64 = MAX_EXACT as u64;

/// The default `poll_ms` of a polling `wait_acquire`: it sleeps
/// `min(retry_after_ms, poll_ms)` between two tries, since a release frees
/// a slot long before the earliest lease would end by itself, and a poll
/// cannot hear it. Set with `with_lease_poll`.
pub const LEASE_POLL_DEFAULT: Duration = Duration::from_millis(100);

/// The answer of an acquire: a lease, or why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseDecision {
    /// A lease was granted (`lease` holds its id), or, with `failed_open`,
    /// the limiter was unavailable and the call may proceed without one.
    pub acquired: bool,
    /// Free slots left after the call: `limit - live - waiting`, never below 0.
    pub available: u64,
    /// 0 when acquired; when denied, ms until the earliest live lease ends
    /// by itself (a release can free a slot sooner; 0 when the call was
    /// denied only because others wait ahead of it).
    pub retry_after_ms: u64,
    /// The lease's id when acquired (`<ms>-<n>-<incarnation>`, an opaque
    /// string to pass back; docs/leases.md#lease-ids): what release and renew
    /// take. `None` when denied, and when failed open (nothing to release).
    pub lease: Option<String>,
    /// `true` only when the limiter was unavailable and it fails open for
    /// leases (`with_lease_fail_open(true)`): `acquired` is `true` but no
    /// lease is held, so nothing limits this caller and there is nothing to
    /// release or renew (and no headers).
    pub failed_open: bool,
    /// The lease set's key.
    pub key: String,
    /// The policy name in the headers (the limiter's, `"default"` unless set).
    pub policy: String,
    /// The limit the call was judged with.
    pub limit: u64,
    /// How long the lease lasts unless released or renewed.
    pub lease_ms: u64,
}

impl LeaseDecision {
    /// What an acquire that fails open answers when the limiter is
    /// unavailable: acquired, no id, `failed_open`.
    pub(crate) fn failed_open(call: &AcquireCall) -> LeaseDecision {
        LeaseDecision {
            acquired: true,
            available: 0,
            retry_after_ms: 0,
            lease: None,
            failed_open: true,
            key: call.key.clone(),
            policy: call.policy.clone(),
            limit: call.limit,
            lease_ms: call.lease_ms,
        }
    }

    /// The `Retry-After` seconds of a denial: `ceil(retry_after_ms / 1000)`,
    /// at least 1 (a denial with `retry_after_ms` 0, turned away only
    /// because others wait, still gets 1).
    pub fn retry_after_secs(&self) -> Option<u64> {
        (!self.acquired).then(|| self.retry_after_ms.div_ceil(1000).max(1))
    }

    /// The response headers of an in-flight limit (docs/clients.md#leases),
    /// in this order: `RateLimit-Policy:
    /// "<name>";q=<limit>;qu="concurrent-requests"`, and on a denial
    /// `Retry-After` ([`retry_after_secs`](Self::retry_after_secs)). None
    /// for a failed-open decision.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        if self.failed_open {
            return Vec::new();
        }
        let name = sf_string(&self.policy);
        let mut headers = vec![(
            "RateLimit-Policy",
            format!(
                "{name};q={};qu=\"concurrent-requests\"",
                self.limit.min(SF_INT_MAX)
            ),
        )];
        if let Some(secs) = self.retry_after_secs() {
            headers.push(("Retry-After", secs.min(SF_INT_MAX).to_string()));
        }
        headers
    }

    /// [`headers`](Self::headers) as an [`http::HeaderMap`].
    pub fn header_map(&self) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in self.headers() {
            if let Ok(value) = HeaderValue::from_str(&value) {
                let name = match name {
                    "RateLimit-Policy" => "ratelimit-policy",
                    _ => "retry-after",
                };
                map.insert(HeaderName::from_static(name), value);
            }
        }
        map
    }
}

impl Awaited for LeaseDecision {
    /// `retry_after_ms`; the wait caps it at its `poll_ms`.
    fn retry_in(&self) -> Option<Duration> {
        (!self.acquired).then(|| Duration::from_millis(self.retry_after_ms))
    }
}

/// What [`release`](crate::RateLimiter::release) and
/// [`renew`](crate::RateLimiter::renew) take: a lease id (`&str`,
/// `String`), a [`LeaseDecision`], or an `Option` of one. `None` (a
/// denial's or a failed-open decision's id) answers `false` without a call.
pub trait LeaseId {
    /// The id, if there is one.
    fn lease_id(&self) -> Option<&str>;
}

impl LeaseId for str {
    fn lease_id(&self) -> Option<&str> {
        Some(self)
    }
}

impl LeaseId for String {
    fn lease_id(&self) -> Option<&str> {
        Some(self)
    }
}

impl LeaseId for LeaseDecision {
    fn lease_id(&self) -> Option<&str> {
        self.lease.as_deref()
    }
}

impl<T: LeaseId> LeaseId for Option<T> {
    fn lease_id(&self) -> Option<&str> {
        self.as_ref().and_then(|l| l.lease_id())
    }
}

impl<T: LeaseId + ?Sized> LeaseId for &T {
    fn lease_id(&self) -> Option<&str> {
        (**self).lease_id()
    }
}

/// The outcome of asking for a lease guard, with failing open made explicit.
#[must_use = "a Permit::Held releases its lease when dropped"]
#[derive(Debug)]
pub enum Permit<G> {
    /// A lease is held: do the work, then release it (or drop the guard).
    Held(G),
    /// No slot was free (or none freed in time): the denial.
    Denied(LeaseDecision),
    /// The limiter was unavailable and the limiter fails open for leases
    /// (`with_lease_fail_open(true)`): go ahead WITHOUT a lease. Nothing is
    /// held, nothing is counted, nothing needs releasing. The error says why.
    FailedOpen(Error),
}

impl<G> Permit<G> {
    /// True unless denied: held, or failed open.
    pub fn may_proceed(&self) -> bool {
        !matches!(self, Permit::Denied(_))
    }

    /// The guard, when a lease is held.
    pub fn held(self) -> Option<G> {
        match self {
            Permit::Held(guard) => Some(guard),
            _ => None,
        }
    }
}

/// Held, denied, failed open, or the error: the one place where an acquire's
/// outcome meets the fail-open setting.
pub(crate) fn permit<G>(
    outcome: Result<LeaseDecision>,
    fail_open: bool,
    guard: impl FnOnce(LeaseDecision, String) -> G,
) -> Result<Permit<G>> {
    match outcome {
        Ok(d) => match d.lease.clone() {
            Some(id) if d.acquired => Ok(Permit::Held(guard(d, id))),
            _ => Ok(Permit::Denied(d)),
        },
        Err(e) if fail_open && e.is_unavailable() => Ok(Permit::FailedOpen(e)),
        Err(e) => Err(e),
    }
}

/// What a renewal loop does after one TB.RENEW.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Renewal {
    /// Renewed: the lease runs `lease_ms` from now.
    Held,
    /// The server could not be reached: try again at the next tick.
    Retry,
    /// The lease is gone (or cannot be trusted to be held): the reason.
    Lost(String),
}

/// After a renewal that answered `outcome`, `since_confirmed` after the
/// last moment the lease was known to run `lease_ms` more.
pub(crate) fn after_renew(
    outcome: &Result<bool>,
    since_confirmed: Duration,
    lease_ms: u64,
) -> Renewal {
    match outcome {
        Ok(true) => Renewal::Held,
        Ok(false) => Renewal::Lost("the server no longer holds the lease (it expired)".into()),
        Err(e) if e.is_unavailable() && since_confirmed < Duration::from_millis(lease_ms) => {
            Renewal::Retry
        }
        Err(e) if e.is_unavailable() => Renewal::Lost(format!(
            "no renewal reached the server within lease_ms ({lease_ms} ms): {e}"
        )),
        Err(e) => Renewal::Lost(format!("the renewal failed: {e}")),
    }
}

/// How often a guard renews its lease: every `lease_ms / 3` (at least 1 ms),
/// so that two renewals in a row can fail before it ends.
pub(crate) fn renew_every(lease_ms: u64) -> Duration {
    Duration::from_millis((lease_ms / 3).max(1))
}

/// The warning of a guard whose release failed: the lease is not lost for
/// good, it ends by itself at its deadline.
pub(crate) fn release_failed(id: &str, key: &str, e: &Error) -> String {
    format!(
        "redis-tb: releasing lease {id} on {key} failed ({e}); it ends by itself at its deadline"
    )
}

pub(crate) fn check_limit(limit: u64) -> Result<()> {
    if (1..=MAX_LEASE_ARG).contains(&limit) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "limit must be a positive integer at most 2^53, got {limit}"
        )))
    }
}

pub(crate) fn check_lease_ms(lease_ms: u64) -> Result<()> {
    if (1..=MAX_LEASE_ARG).contains(&lease_ms) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "lease_ms must be a positive integer number of ms at most 2^53, got {lease_ms}"
        )))
    }
}

/// TB.ACQUIRE key limit lease_ms (checked), and its Lua twin.
#[derive(Debug, Clone)]
pub(crate) struct AcquireCall {
    key: String,
    limit: u64,
    lease_ms: u64,
    policy: String,
    /// The longest sleep between two tries of a polling wait.
    poll: Duration,
}

impl AcquireCall {
    pub fn new(key: &str, limit: u64, lease_ms: u64, policy: &str) -> Result<AcquireCall> {
        check_name(policy)?;
        check_key(key)?;
        check_limit(limit)?;
        check_lease_ms(lease_ms)?;
        Ok(AcquireCall {
            key: key.into(),
            limit,
            lease_ms,
            policy: policy.into(),
            poll: LEASE_POLL_DEFAULT,
        })
    }

    /// The name its decision carries (the limiter's policy name).
    pub fn policy(&self) -> &str {
        &self.policy
    }

    /// Polls at least every `poll` (at least 1 ms).
    pub fn poll(mut self, poll: Duration) -> AcquireCall {
        self.poll = poll.max(Duration::from_millis(1));
        self
    }
}

const ACQUIRE: LuaName = LuaName {
    fcall: "FCALL",
    function: "tb_acquire",
    word: "acquire",
};
const RELEASE: LuaName = LuaName {
    fcall: "FCALL",
    function: "tb_release",
    word: "release",
};
const RENEW: LuaName = LuaName {
    fcall: "FCALL",
    function: "tb_renew",
    word: "renew",
};

fn command(
    resolved: &Resolved,
    eval: bool,
    module: &str,
    lua: LuaName,
    key: &str,
    args: &[&str],
) -> Cmd {
    if resolved.backend == Backend::Module {
        let mut cmd = redis::cmd(module);
        cmd.arg(key).arg(args);
        return cmd;
    }
    lua_command(resolved, eval, lua, &[key], args)
}

fn bad_reply(value: &Value) -> Error {
    Error::Other(format!("unexpected reply: {value:?}"))
}

fn int(value: &Value) -> Option<i64> {
    match value {
        Value::Int(i) => Some(*i),
        _ => None,
    }
}

impl Request for AcquireCall {
    type Output = LeaseDecision;

    fn command(&self, resolved: &Resolved, eval: bool) -> Cmd {
        let (limit, lease_ms) = (self.limit.to_string(), self.lease_ms.to_string());
        command(
            resolved,
            eval,
            "TB.ACQUIRE",
            ACQUIRE,
            &self.key,
            &[&limit, &lease_ms],
        )
    }

    fn first_key(&self) -> &str {
        &self.key
    }

    /// `[acquired, available, retry_after_ms, lease]`.
    fn parse(&self, value: &Value) -> Result<LeaseDecision> {
        let Value::Array(items) = value else {
            return Err(bad_reply(value));
        };
        let [acquired, available, retry, lease] = items.as_slice() else {
            return Err(bad_reply(value));
        };
        let count = |v: &Value| int(v).and_then(|i| u64::try_from(i).ok());
        let (Some(acquired), Some(available), Some(retry_after_ms)) =
            (int(acquired), count(available), count(retry))
        else {
            return Err(bad_reply(value));
        };
        let lease = match lease {
            Value::Nil => None,
            Value::BulkString(b) => {
                Some(String::from_utf8(b.clone()).map_err(|_| bad_reply(value))?)
            }
            Value::SimpleString(s) => Some(s.clone()),
            _ => return Err(bad_reply(value)),
        };
        let acquired = acquired == 1;
        if acquired != lease.is_some() {
            return Err(bad_reply(value));
        }
        Ok(LeaseDecision {
            acquired,
            available,
            retry_after_ms,
            lease,
            failed_open: false,
            key: self.key.clone(),
            policy: self.policy.clone(),
            limit: self.limit,
            lease_ms: self.lease_ms,
        })
    }
}

impl Blocking for AcquireCall {
    /// `TB.ACQUIRE key limit lease_ms timeout_ms`.
    fn blocking(&self, timeout_ms: u64) -> Cmd {
        let mut cmd = redis::cmd("TB.ACQUIRE");
        cmd.arg(&self.key)
            .arg(self.limit)
            .arg(self.lease_ms)
            .arg(timeout_ms);
        cmd
    }

    fn poll_cap(&self) -> Option<Duration> {
        Some(self.poll)
    }
}

/// TB.RELEASE key lease, or TB.RENEW key lease lease_ms: `1` or `0`.
#[derive(Debug, Clone)]
pub(crate) struct FlagCall {
    key: String,
    lease: String,
    /// `Some` for a renewal.
    lease_ms: Option<u64>,
}

/// The arguments are checked whether or not there is a lease id; with none
/// (a denial's or a failed-open decision's) there is no call (`Ok(None)`),
/// and the limiters answer `false` without one.
impl FlagCall {
    pub fn release(key: &str, lease: Option<&str>) -> Result<Option<FlagCall>> {
        check_key(key)?;
        Ok(lease.map(|lease| FlagCall {
            key: key.into(),
            lease: lease.into(),
            lease_ms: None,
        }))
    }

    pub fn renew(key: &str, lease: Option<&str>, lease_ms: u64) -> Result<Option<FlagCall>> {
        check_key(key)?;
        check_lease_ms(lease_ms)?;
        Ok(lease.map(|lease| FlagCall {
            key: key.into(),
            lease: lease.into(),
            lease_ms: Some(lease_ms),
        }))
    }
}

impl Request for FlagCall {
    type Output = bool;

    fn command(&self, resolved: &Resolved, eval: bool) -> Cmd {
        match self.lease_ms {
            None => command(
                resolved,
                eval,
                "TB.RELEASE",
                RELEASE,
                &self.key,
                &[&self.lease],
            ),
            Some(ms) => {
                let ms = ms.to_string();
                command(
                    resolved,
                    eval,
                    "TB.RENEW",
                    RENEW,
                    &self.key,
                    &[&self.lease, &ms],
                )
            }
        }
    }

    fn first_key(&self) -> &str {
        &self.key
    }

    fn parse(&self, value: &Value) -> Result<bool> {
        match int(value) {
            Some(0) => Ok(false),
            Some(1) => Ok(true),
            _ => Err(bad_reply(value)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::tests::args;

    #[test]
    fn commands_per_backend() {
        let module = Resolved::new(Backend::Module, None);
        let function = Resolved::new(Backend::Function, None);
        let script = Resolved::new(Backend::Script, Some("abc".into()));
        let a = AcquireCall::new("k", 2, 30000, "default").unwrap();
        assert_eq!(
            args(&a.command(&module, false)),
            ["TB.ACQUIRE", "k", "2", "30000"]
        );
        assert_eq!(
            args(&a.command(&function, false)),
            ["FCALL", "tb_acquire", "1", "k", "2", "30000"]
        );
        assert_eq!(
            args(&a.command(&script, false)),
            ["EVALSHA", "abc", "1", "k", "acquire", "2", "30000"]
        );
        assert_eq!(args(&a.blocking(0)), ["TB.ACQUIRE", "k", "2", "30000", "0"]);
        let r = FlagCall::release("k", Some("1-1")).unwrap().unwrap();
        assert_eq!(args(&r.command(&module, false)), ["TB.RELEASE", "k", "1-1"]);
        assert_eq!(
            args(&r.command(&script, false)),
            ["EVALSHA", "abc", "1", "k", "release", "1-1"]
        );
        let n = FlagCall::renew("k", Some("1-1"), 500).unwrap().unwrap();
        assert_eq!(
            args(&n.command(&function, false)),
            ["FCALL", "tb_renew", "1", "k", "1-1", "500"]
        );
    }

    #[test]
    fn arguments_are_checked_before_sending() {
        assert!(AcquireCall::new("k", 0, 1, "default").is_err());
        assert!(AcquireCall::new("k", 1, 0, "default").is_err());
        assert!(AcquireCall::new("k", MAX_LEASE_ARG + 1, 1, "default").is_err());
        assert!(AcquireCall::new("", 1, 1, "default").is_err());
        assert!(AcquireCall::new("k", MAX_LEASE_ARG, MAX_LEASE_ARG, "default").is_ok());
        assert!(FlagCall::renew("k", Some("x"), 0).is_err());
        assert!(FlagCall::release("", None).is_err());
        assert!(FlagCall::release("k", None).unwrap().is_none());
    }

    #[test]
    fn replies_parse_and_odd_shapes_are_errors() {
        let a = AcquireCall::new("k", 2, 1000, "jobs").unwrap();
        let granted = Value::Array(vec![
            Value::Int(1),
            Value::Int(1),
            Value::Int(0),
            Value::BulkString(b"17-1".to_vec()),
        ]);
        let d = a.parse(&granted).unwrap();
        assert_eq!(
            (d.acquired, d.available, d.lease.as_deref()),
            (true, 1, Some("17-1"))
        );
        let denied = Value::Array(vec![
            Value::Int(0),
            Value::Int(0),
            Value::Int(1500),
            Value::Nil,
        ]);
        let d = a.parse(&denied).unwrap();
        assert_eq!(
            (d.acquired, d.retry_after_ms, d.lease.clone()),
            (false, 1500, None)
        );
        assert_eq!(d.retry_after_secs(), Some(2));
        let queued = LeaseDecision {
            retry_after_ms: 0,
            ..d.clone()
        };
        assert_eq!(queued.retry_after_secs(), Some(1), "at least 1");
        let h = d.headers();
        assert_eq!(h[0].1, "\"jobs\";q=2;qu=\"concurrent-requests\"");
        assert_eq!(h[1], ("Retry-After", "2".into()));
        assert_eq!(h.len(), 2);
        let odd = Value::Array(vec![
            Value::Int(1),
            Value::Int(0),
            Value::Int(0),
            Value::Nil,
        ]);
        assert!(a.parse(&odd).is_err());
        assert!(a.parse(&Value::Int(1)).is_err());
        let f = FlagCall::release("k", Some("x")).unwrap().unwrap();
        assert!(f.parse(&Value::Int(1)).unwrap());
        assert!(!f.parse(&Value::Int(0)).unwrap());
        assert!(f.parse(&Value::Int(2)).is_err());
    }

    #[test]
    fn renewal_gives_up_only_when_the_lease_must_have_ended() {
        let unavailable = Err(Error::Unavailable("down".into()));
        assert_eq!(after_renew(&Ok(true), Duration::ZERO, 100), Renewal::Held);
        assert!(matches!(
            after_renew(&Ok(false), Duration::ZERO, 100),
            Renewal::Lost(_)
        ));
        assert_eq!(
            after_renew(&unavailable, Duration::from_millis(99), 100),
            Renewal::Retry
        );
        assert!(matches!(
            after_renew(&unavailable, Duration::from_millis(100), 100),
            Renewal::Lost(_)
        ));
        let bug = Err(Error::Reply("WRONGTYPE x".into()));
        assert!(matches!(
            after_renew(&bug, Duration::ZERO, 100),
            Renewal::Lost(_)
        ));
        assert_eq!(renew_every(30000), Duration::from_millis(10000));
        assert_eq!(renew_every(2), Duration::from_millis(1));
    }

    #[test]
    fn a_failed_open_decision_has_no_id_and_no_headers() {
        let a = AcquireCall::new("k", 2, 1000, "jobs").unwrap();
        let d = LeaseDecision::failed_open(&a);
        assert!(d.acquired && d.failed_open && d.lease.is_none());
        assert!(d.headers().is_empty());
        assert_eq!(d.lease_id(), None);
        assert_eq!(Some("1-1").lease_id(), Some("1-1"));
        assert_eq!(None::<String>.lease_id(), None);
    }

    #[test]
    fn fail_open_is_a_variant_not_a_fake_lease() {
        let down = || Err(Error::Unavailable("down".into()));
        assert!(matches!(
            permit(down(), true, |_, _| ()),
            Ok(Permit::FailedOpen(_))
        ));
        assert!(matches!(
            permit(down(), false, |_, _| ()),
            Err(Error::Unavailable(_))
        ));
        let bug = Err(Error::Reply("WRONGTYPE".into()));
        assert!(permit(bug, true, |_, _| ()).is_err());
    }
}
