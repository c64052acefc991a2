//! The blocking limiter, over any `redis::ConnectionLike` (a plain
//! `redis::Connection`, a `redis::cluster::ClusterConnection`, or the
//! [`ManagedConnection`] this crate makes with short timeouts).

use crate::backend::{emit, emit_line, Backend, Blocking, Call, Logger, Op, Request, Timeouts};
use crate::core::{Awaited, BackendState, Exchange, Learned, Step};
use crate::decision::{Decision, Limit};
use crate::error::{is_connection_problem, Error, Result};
use crate::lease::{self, AcquireCall, FlagCall, LeaseDecision, LeaseId, Permit, Renewal};
use crate::limiter::{wait_read_bound, Options};
use redis::{ConnectionLike, IntoConnectionInfo, RedisResult, Value};
use std::io;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// A `redis::Connection` made with bounded connect, handshake, read and
/// write timeouts, dropped after any I/O error or timeout (so a late reply
/// can never be read as the answer to the next command) and made again on
/// the next call.
///
/// The handshake of a new `redis::Connection` (`CLIENT SETINFO`) has no read
/// timeout of its own, so connecting runs on a helper thread that the caller
/// waits for at most `Timeouts::connect`; at most one such thread is pending
/// at a time (against a hung server it finishes when the server answers).
pub struct ManagedConnection {
    client: redis::Client,
    timeouts: Timeouts,
    read_timeout: Option<Duration>,
    con: Option<redis::Connection>,
    pending: Option<Receiver<RedisResult<redis::Connection>>>,
}

impl ManagedConnection {
    /// A connection to `client`'s server with `timeouts` (nothing is sent yet).
    pub fn new(client: redis::Client, timeouts: Timeouts) -> ManagedConnection {
        ManagedConnection::with_read_timeout(client, timeouts, Some(timeouts.command))
    }

    pub(crate) fn with_read_timeout(
        client: redis::Client,
        timeouts: Timeouts,
        read_timeout: Option<Duration>,
    ) -> ManagedConnection {
        ManagedConnection {
            client,
            timeouts,
            read_timeout,
            con: None,
            pending: None,
        }
    }

    /// The client this connection is made from.
    pub fn client(&self) -> &redis::Client {
        &self.client
    }

    fn connection(&mut self) -> RedisResult<&mut redis::Connection> {
        if self.con.is_none() {
            let pending = match self.pending.take() {
                Some(pending) => pending,
                None => self.start_connect()?,
            };
            match pending.recv_timeout(self.timeouts.connect) {
                Ok(Ok(con)) => {
                    con.set_read_timeout(self.read_timeout)?;
                    con.set_write_timeout(Some(self.timeouts.command))?;
                    self.con = Some(con);
                }
                Ok(Err(e)) => return Err(e),
                Err(RecvTimeoutError::Timeout) => {
                    self.pending = Some(pending);
                    return Err(io_error(io::ErrorKind::TimedOut, "connect timed out"));
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(io_error(io::ErrorKind::Other, "connect thread ended"))
                }
            }
        }
        self.con
            .as_mut()
            .ok_or_else(|| io_error(io::ErrorKind::NotConnected, "not connected"))
    }

    fn start_connect(&self) -> RedisResult<Receiver<RedisResult<redis::Connection>>> {
        let (tx, rx) = mpsc::channel();
        let client = self.client.clone();
        let timeout = self.timeouts.connect;
        std::thread::Builder::new()
            .name("redis-tb-connect".into())
            .spawn(move || {
                let _ = tx.send(client.get_connection_with_timeout(timeout));
            })
            .map_err(redis::RedisError::from)?;
        Ok(rx)
    }

    fn check<T>(&mut self, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(e) = &result {
            if is_connection_problem(e) {
                self.con = None;
            }
        }
        result
    }
}

fn io_error(kind: io::ErrorKind, message: &str) -> redis::RedisError {
    redis::RedisError::from(io::Error::new(kind, message.to_string()))
}

impl ConnectionLike for ManagedConnection {
    fn req_packed_command(&mut self, cmd: &[u8]) -> RedisResult<Value> {
        let result = self
            .connection()
            .and_then(|con| con.req_packed_command(cmd));
        self.check(result)
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let result = self
            .connection()
            .and_then(|con| con.req_packed_commands(cmd, offset, count));
        self.check(result)
    }

    fn get_db(&self) -> i64 {
        self.client.get_connection_info().redis_settings().db()
    }

    fn check_connection(&mut self) -> bool {
        redis::cmd("PING").query::<String>(self).is_ok()
    }

    fn is_open(&self) -> bool {
        self.con.as_ref().map(|c| c.is_open()).unwrap_or(true)
    }
}

/// A token-bucket rate limiter over a blocking connection.
///
/// The backend (module, FUNCTION library or EVALSHA script) is chosen at
/// the first call that reaches the server and logged; it is chosen again
/// when the server changes (docs/clients.md#the-failure-rule).
pub struct RateLimiter<C = ManagedConnection> {
    con: C,
    opts: Options,
    state: BackendState,
    blocking: Option<redis::Client>,
    /// The wait connection of each node (`None`: the blocking client's own).
    waits: std::collections::HashMap<Option<String>, ManagedConnection>,
    polling_logged: bool,
}

impl RateLimiter<ManagedConnection> {
    /// A limiter on a [`ManagedConnection`] to `url` with the default
    /// timeouts (200 ms connect, 200 ms per command); `wait_take` gets its
    /// own connections to the same server. Nothing is sent yet: a server
    /// that is down makes the first calls [`Error::Unavailable`], not this.
    pub fn open<T: IntoConnectionInfo>(url: T) -> Result<Self> {
        Ok(Self::from_client(
            redis::Client::open(url)?,
            Timeouts::default(),
        ))
    }

    /// A limiter on a [`ManagedConnection`] made from `client` with `timeouts`.
    pub fn from_client(client: redis::Client, timeouts: Timeouts) -> Self {
        let mut limiter = RateLimiter::new(ManagedConnection::new(client.clone(), timeouts));
        limiter.opts.timeouts = timeouts;
        limiter.blocking = Some(client);
        limiter
    }
}

impl<C: ConnectionLike> RateLimiter<C> {
    /// A limiter on `con`. Its timeouts are the connection's: set short
    /// read/write timeouts on it (`redis::Connection::set_read_timeout`,
    /// `ClusterClientBuilder::read_timeout`) or the limiter hangs when Redis
    /// hangs.
    pub fn new(con: C) -> Self {
        RateLimiter {
            con,
            opts: Options::default(),
            state: BackendState::default(),
            blocking: None,
            waits: Default::default(),
            polling_logged: false,
        }
    }

    /// Forces a backend instead of choosing one.
    pub fn with_backend(mut self, backend: Backend) -> Self {
        self.state = BackendState::forced(Some(backend));
        self
    }

    /// Sends the log lines to `logger` instead of the `log` crate.
    pub fn with_logger(mut self, logger: Logger) -> Self {
        self.opts.logger = Some(logger);
        self
    }

    /// The policy name of `take`/`peek`/`refund`/`wait_take` decisions
    /// (default `"default"`; printable ASCII, or every call is refused).
    pub fn with_policy_name(mut self, name: impl Into<String>) -> Self {
        self.opts.policy_name = name.into();
        self
    }

    /// Timeouts for the connections `wait_take` makes (`command` is also
    /// the margin added to a TB.BTAKE's own timeout).
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.opts.timeouts = timeouts;
        self
    }

    /// How often a limiter that fell back to Lua after the module went away
    /// looks for the module again (default 30 s).
    pub fn with_module_recheck(mut self, every: Duration) -> Self {
        self.opts.recheck = every;
        self
    }

    /// A client for the dedicated connections `wait_take` and `wait_acquire`
    /// use for TB.BTAKE and TB.ACQUIRE with a timeout (a blocking command
    /// must not share a connection, and needs a read timeout above its own).
    /// Without one, they poll.
    pub fn with_blocking_client(mut self, client: redis::Client) -> Self {
        self.blocking = Some(client);
        self
    }

    /// `true`: when the limiter is unavailable, [`acquire`](Self::acquire)
    /// and [`wait_acquire`](Self::wait_acquire) answer a [`LeaseDecision`]
    /// with `acquired` true, `lease` `None` and `failed_open` true, and
    /// [`acquire_guard`](Self::acquire_guard) and
    /// [`wait_acquire_guard`](Self::wait_acquire_guard) answer
    /// [`Permit::FailedOpen`]: go ahead WITHOUT a lease (nothing is held,
    /// counted or released). Default `false` (fail closed):
    /// [`Error::Unavailable`], like every call.
    pub fn with_lease_fail_open(mut self, fail_open: bool) -> Self {
        self.opts.lease_fail_open = fail_open;
        self
    }

    /// The longest sleep between two tries of a polling
    /// [`wait_acquire`](Self::wait_acquire) (`poll_ms`, default 100 ms, at
    /// least 1 ms): it sleeps `min(retry_after_ms, poll)`.
    pub fn with_lease_poll(mut self, poll: Duration) -> Self {
        self.opts.lease_poll = poll.max(Duration::from_millis(1));
        self
    }

    /// The backend in use, once chosen.
    pub fn backend(&self) -> Option<Backend> {
        self.state.backend()
    }

    /// Releases every connection this limiter opened (its connection and
    /// the TB.BTAKE ones); the same as dropping it.
    pub fn close(self) {
        drop(self);
    }

    /// The connection.
    pub fn connection_mut(&mut self) -> &mut C {
        &mut self.con
    }

    /// Chooses the backend now (loading the Lua library or script if
    /// needed) instead of at the first call: a peek of a key that is never
    /// written.
    pub fn connect(&mut self) -> Result<Backend> {
        self.peek("redis-tb:connect", 1, 1, 0)?;
        self.backend()
            .ok_or_else(|| Error::Other("no backend chosen".into()))
    }

    fn run<R: Request>(&mut self, call: &R) -> Result<R::Output> {
        let plan = self.state.plan(Instant::now(), self.opts.recheck);
        let (mut exchange, mut step) = Exchange::start(call, self.state.forced, plan);
        let outcome = loop {
            match step {
                Step::Send(cmd) => step = exchange.on_reply(cmd.query::<Value>(&mut self.con)),
                Step::Done(outcome) => break outcome,
            }
        };
        for learned in exchange.learned {
            emit_line(&self.opts.logger, self.state.learn(learned, Instant::now()));
        }
        outcome
    }

    /// Takes `n` tokens from the bucket at `key` (burst `capacity`, refilled
    /// at `rate` tokens per second) if it holds them.
    pub fn take(
        &mut self,
        key: &str,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
        n: impl Into<f64>,
    ) -> Result<Decision> {
        let call = self.opts.single(Op::Take, key, capacity, rate, n)?;
        self.run(&call)
    }

    /// What `take` would answer now; writes nothing.
    pub fn peek(
        &mut self,
        key: &str,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
        n: impl Into<f64>,
    ) -> Result<Decision> {
        let call = self.opts.single(Op::Peek, key, capacity, rate, n)?;
        self.run(&call)
    }

    /// Gives `n` tokens back (capped at `capacity`).
    pub fn refund(
        &mut self,
        key: &str,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
        n: impl Into<f64>,
    ) -> Result<Decision> {
        let call = self.opts.single(Op::Refund, key, capacity, rate, n)?;
        self.run(&call)
    }

    /// Several limits, all or nothing; the decision names the deciding one
    /// (`index`). In a cluster the keys must share a hash slot.
    pub fn take_all(&mut self, limits: &[Limit]) -> Result<Decision> {
        self.run(&Call::all(limits)?)
    }

    /// Takes `n` tokens, waiting up to `timeout_ms` (0: no limit) for them;
    /// on timeout the last denial.
    ///
    /// Module backend with a blocking client (see [`with_blocking_client`](Self::with_blocking_client);
    /// [`open`](RateLimiter::open) sets one): TB.BTAKE on a dedicated
    /// connection whose read timeout is `timeout_ms` plus a margin; waiters
    /// are served first come, first served by the server.
    ///
    /// **Otherwise this polls**: take, sleep `min(retry_after_ms, time left)`,
    /// again. Polling waiters are NOT served in arrival order.
    pub fn wait_take(
        &mut self,
        key: &str,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
        n: impl Into<f64>,
        timeout_ms: u64,
    ) -> Result<Decision> {
        let call = self.opts.single(Op::Take, key, capacity, rate, n)?;
        let probe = Call::probe(key)?;
        self.wait(&call, &probe, timeout_ms)
    }

    /// A wait for `call`: its blocking form on a dedicated connection with
    /// the module and a blocking client, else polling (`probe` chooses the
    /// backend first).
    fn wait<R>(&mut self, call: &R, probe: &Call, timeout_ms: u64) -> Result<R::Output>
    where
        R: Blocking,
        R::Output: Awaited,
    {
        if self.backend().is_none() {
            self.run(probe)?;
        }
        if self.backend() == Some(Backend::Module) {
            if let Some(client) = self.blocking.clone() {
                match self.btake(client, call, timeout_ms) {
                    Err(Error::Reply(r))
                        if crate::error::classify_reply(&r)
                            == crate::error::FailureClass::ServerChanged =>
                    {
                        // The module went away: detect again, then poll on Lua.
                        self.state.learn(Learned::Stale, Instant::now());
                    }
                    other => return other,
                }
            } else if !self.polling_logged {
                self.polling_logged = true;
                emit(
                    &self.opts.logger,
                    log::Level::Info,
                    crate::core::POLLING_NOTE,
                );
            }
        }
        self.poll(call, timeout_ms)
    }

    /// TB.BTAKE on the node that owns the key's slot, found by following
    /// `MOVED`/`ASK` from `client`'s node; the wait's connection is kept for
    /// the next wait on that node.
    fn btake<R: Blocking>(
        &mut self,
        client: redis::Client,
        call: &R,
        timeout_ms: u64,
    ) -> Result<R::Output> {
        let read = wait_read_bound(&self.opts.timeouts, timeout_ms);
        let mut addr: Option<String> = None;
        let mut asking = false;
        for _ in 0..=crate::core::MAX_REDIRECTS {
            let mut con = match self.waits.remove(&addr) {
                Some(con) => con,
                None => ManagedConnection::with_read_timeout(
                    crate::core::client_at(&client, addr.as_deref())?,
                    self.opts.timeouts,
                    read,
                ),
            };
            con.read_timeout = read;
            if let Some(c) = con.con.as_mut() {
                c.set_read_timeout(read).map_err(Error::from)?;
            }
            let reply = if asking {
                redis::pipe()
                    .cmd("ASKING")
                    .ignore()
                    .add_command(call.blocking(timeout_ms))
                    .query::<Vec<Value>>(&mut con)
                    .map(|mut v| v.pop().unwrap_or(Value::Nil))
            } else {
                call.blocking(timeout_ms).query::<Value>(&mut con)
            };
            let redirect = match &reply {
                Err(e) => crate::core::redirect_of(e),
                Ok(_) => None,
            };
            self.waits.insert(addr.clone(), con);
            match (reply, redirect) {
                (_, Some((ask, to))) => {
                    asking = ask;
                    addr = Some(to);
                }
                (reply, None) => return call.parse(&reply?),
            }
        }
        Err(Error::Other(format!(
            "TB.BTAKE: more than {} redirects",
            crate::core::MAX_REDIRECTS
        )))
    }

    fn poll<R>(&mut self, call: &R, timeout_ms: u64) -> Result<R::Output>
    where
        R: Blocking,
        R::Output: Awaited,
    {
        let deadline = crate::core::deadline_after(timeout_ms);
        loop {
            let decision = self.run(call)?;
            match crate::core::poll_wait(&decision, call.poll_cap(), deadline, Instant::now()) {
                None => return Ok(decision),
                Some(wait) => std::thread::sleep(wait),
            }
        }
    }
}

/// Concurrency leases (docs/leases.md).
impl<C: ConnectionLike> RateLimiter<C> {
    /// Takes a lease on the lease set at `key` if fewer than `limit` are
    /// live; it ends by itself `lease_ms` after it was granted (server
    /// clock) unless released or renewed. The denial says when the earliest
    /// live lease ends by itself. An unavailable limiter is
    /// [`Error::Unavailable`], or, with
    /// [`with_lease_fail_open(true)`](Self::with_lease_fail_open), a
    /// failed-open decision (`acquired`, no `lease`, `failed_open`).
    pub fn acquire(&mut self, key: &str, limit: u64, lease_ms: u64) -> Result<LeaseDecision> {
        let call = self.opts.acquire_call(key, limit, lease_ms)?;
        let outcome = self.run(&call);
        self.opts.lease_fail_open(&call, outcome)
    }

    /// Releases `lease` (an id, a [`LeaseDecision`], or an `Option` of
    /// one): `true` if it was live, `false` if it was not (released
    /// already, expired, never handed out). Safe to repeat. No id (`None`:
    /// a denial's or a failed-open decision's) answers `false` without a call.
    pub fn release(&mut self, key: &str, lease: impl LeaseId) -> Result<bool> {
        match FlagCall::release(key, lease.lease_id())? {
            Some(call) => self.run(&call),
            None => Ok(false),
        }
    }

    /// Makes the live `lease` end `lease_ms` from now: `true`, or `false`
    /// if it is not held (an expired lease cannot come back). No id answers
    /// `false` without a call.
    pub fn renew(&mut self, key: &str, lease: impl LeaseId, lease_ms: u64) -> Result<bool> {
        match FlagCall::renew(key, lease.lease_id(), lease_ms)? {
            Some(call) => self.run(&call),
            None => Ok(false),
        }
    }

    /// Takes a lease, waiting up to `timeout_ms` (0: no limit) for one; on
    /// timeout the last denial.
    ///
    /// Module backend with a blocking client: `TB.ACQUIRE key limit lease_ms
    /// timeout_ms` on a dedicated connection (on the node that owns the
    /// key's slot), served first come, first served by the server.
    ///
    /// **Otherwise this polls**: acquire, sleep `min(retry_after_ms,
    /// poll_ms, time left)` (`poll_ms`: [`with_lease_poll`](Self::with_lease_poll),
    /// default 100 ms), again. Polling waiters are NOT served in arrival
    /// order, and a caller that never waits can take a freed slot first.
    /// Fails open as [`acquire`](Self::acquire) does.
    pub fn wait_acquire(
        &mut self,
        key: &str,
        limit: u64,
        lease_ms: u64,
        timeout_ms: u64,
    ) -> Result<LeaseDecision> {
        let call = self.opts.acquire_call(key, limit, lease_ms)?;
        let outcome = self.wait_acquire_call(&call, timeout_ms);
        self.opts.lease_fail_open(&call, outcome)
    }

    fn wait_acquire_call(&mut self, call: &AcquireCall, timeout_ms: u64) -> Result<LeaseDecision> {
        let probe = Call::probe("redis-tb:connect")?;
        self.wait(call, &probe, timeout_ms)
    }

    /// [`acquire`](Self::acquire) as a guard that releases the lease when
    /// dropped (also on an early return or a panic): [`Permit::Held`],
    /// [`Permit::Denied`], or, when the limiter is unavailable and
    /// [`with_lease_fail_open(true)`](Self::with_lease_fail_open),
    /// [`Permit::FailedOpen`].
    pub fn acquire_guard(
        &mut self,
        key: &str,
        limit: u64,
        lease_ms: u64,
    ) -> Result<Permit<LeaseGuard<'_, C>>> {
        let started = Instant::now();
        let call = self.opts.acquire_call(key, limit, lease_ms)?;
        let outcome = self.run(&call);
        self.guard(outcome, started)
    }

    /// [`wait_acquire`](Self::wait_acquire) as a guard, as [`acquire_guard`](Self::acquire_guard).
    pub fn wait_acquire_guard(
        &mut self,
        key: &str,
        limit: u64,
        lease_ms: u64,
        timeout_ms: u64,
    ) -> Result<Permit<LeaseGuard<'_, C>>> {
        let call = self.opts.acquire_call(key, limit, lease_ms)?;
        let outcome = self.wait_acquire_call(&call, timeout_ms);
        // Granted during the wait, at most a round trip before its reply.
        self.guard(outcome, Instant::now())
    }

    fn guard(
        &mut self,
        outcome: Result<LeaseDecision>,
        started: Instant,
    ) -> Result<Permit<LeaseGuard<'_, C>>> {
        let fail_open = self.opts.lease_fail_open;
        lease::permit(outcome, fail_open, move |decision, id| LeaseGuard {
            limiter: self,
            decision,
            id,
            confirmed: started,
            lost: None,
            released: false,
        })
    }
}

/// A held lease that is released when the guard is dropped: at the end of
/// its scope, on an early return, while a panic unwinds. The release on
/// drop is best effort (its error is dropped too; the lease then ends by
/// itself at its deadline); [`release`](Self::release) returns it.
///
/// The guard borrows the limiter; use [`limiter`](Self::limiter) for other
/// calls meanwhile. The blocking limiter has no background thread: renew
/// in the work's own loop with [`keep_alive`](Self::keep_alive) (renews once
/// a third of `lease_ms` has passed) or [`renew`](Self::renew).
pub struct LeaseGuard<'a, C: ConnectionLike> {
    limiter: &'a mut RateLimiter<C>,
    decision: LeaseDecision,
    id: String,
    /// When the lease was last known to run `lease_ms` more (the acquire
    /// or the renewal was sent no earlier).
    confirmed: Instant,
    lost: Option<String>,
    released: bool,
}

impl<C: ConnectionLike> LeaseGuard<'_, C> {
    /// The lease's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The acquire's answer.
    pub fn decision(&self) -> &LeaseDecision {
        &self.decision
    }

    /// The limiter, for other calls while the lease is held.
    pub fn limiter(&mut self) -> &mut RateLimiter<C> {
        self.limiter
    }

    /// True once a renewal found the lease gone (or could not reach the
    /// server for `lease_ms`): the slot may be someone else's now.
    pub fn is_lost(&self) -> bool {
        self.lost.is_some()
    }

    /// Why the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<&str> {
        self.lost.as_deref()
    }

    /// Renews the lease for another `lease_ms` now: `Ok(true)` renewed,
    /// `Ok(false)` lost (see [`is_lost`](Self::is_lost)); an unavailable
    /// server is `Err(Unavailable)` until `lease_ms` has passed since the
    /// last renewal, then the lease counts as lost.
    pub fn renew(&mut self) -> Result<bool> {
        if self.lost.is_some() {
            return Ok(false);
        }
        let sent = Instant::now();
        let outcome = self
            .limiter
            .renew(&self.decision.key, &self.id, self.decision.lease_ms);
        match lease::after_renew(&outcome, sent - self.confirmed, self.decision.lease_ms) {
            Renewal::Held => self.confirmed = sent,
            Renewal::Retry => {}
            Renewal::Lost(why) => {
                self.lost = Some(why);
                return match outcome {
                    Ok(_) => Ok(false),
                    Err(e) if e.is_unavailable() => Ok(false),
                    Err(e) => Err(e),
                };
            }
        }
        outcome
    }

    /// Renews if a third of `lease_ms` has passed since the last renewal;
    /// `Ok(true)` while the lease is held.
    pub fn keep_alive(&mut self) -> Result<bool> {
        if self.lost.is_some() {
            return Ok(false);
        }
        if self.confirmed.elapsed() < lease::renew_every(self.decision.lease_ms) {
            return Ok(true);
        }
        self.renew()
    }

    /// Releases the lease now: `true` if it was still live.
    pub fn release(mut self) -> Result<bool> {
        self.released = true;
        let (key, id) = (self.decision.key.clone(), self.id.clone());
        self.limiter.release(&key, &id)
    }
}

impl<C: ConnectionLike> Drop for LeaseGuard<'_, C> {
    fn drop(&mut self) {
        if !self.released {
            if let Err(e) = self.limiter.release(&self.decision.key, &self.id) {
                emit(
                    &self.limiter.opts.logger,
                    log::Level::Warn,
                    &lease::release_failed(&self.id, &self.decision.key, &e),
                );
            }
        }
    }
}

impl<C: ConnectionLike> std::fmt::Debug for LeaseGuard<'_, C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("key", &self.decision.key)
            .field("id", &self.id)
            .field("lost", &self.lost)
            .finish()
    }
}

impl<C> std::fmt::Debug for RateLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("backend", &self.state.backend())
            .finish()
    }
}

#[allow(dead_code)]
fn _assert_error_is_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<Error>();
}
