//! The blocking limiter, over any `redis::ConnectionLike` (a plain
//! `redis::Connection`, a `redis::cluster::ClusterConnection`, or the
//! [`ManagedConnection`] this crate makes with short timeouts).

use crate::backend::{emit, emit_line, Backend, Blocking, Request, Timeouts};
use crate::decision::{self, TopKey};
use crate::engine::{BackendState, Exchange, Learned, Step};
use crate::error::{is_connection_problem, is_dropped, limiter_error, Error, Result};
use crate::lease::{self, LeaseDecision, Permit, Renewal};
use crate::limiter::{wait_read_bound, Options};
use crate::metrics::{LeaseOutcome, Origin};
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
    /// The wait connection of each node (`None`: the blocking client's own).
    waits: std::collections::HashMap<Option<String>, ManagedConnection>,
    polling_logged: bool,
}

impl RateLimiter<ManagedConnection> {
    /// A limiter on a [`ManagedConnection`] to `url` with the default
    /// timeouts (200 ms connect, 200 ms per command); `wait_take` and
    /// `wait_acquire` get their own connections to the same server. Nothing is sent yet: a server
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
        limiter.opts.blocking = Some(client);
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
            waits: Default::default(),
            polling_logged: false,
        }
    }

    crate::limiter::limiter_methods! {
        receiver: [&mut],
        asyncness: [],
        dot_await: [],
        sleep: std::thread::sleep,
        /// [`open`](RateLimiter::open) and [`from_client`](RateLimiter::from_client)
        /// set the blocking client; for other constructors, see
        /// [`with_blocking_client`](Self::with_blocking_client).
        blocking_client;
        lease_fail_open;
    }

    fn opts_mut(&mut self) -> &mut Options {
        &mut self.opts
    }

    fn force_backend(&mut self, backend: Backend) {
        self.state = BackendState::forced(Some(backend));
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

    /// One call: answered in process if it can be, else sent under the
    /// failure rule, its outcome through the outage and the denial cache.
    fn run<R: Request>(&mut self, call: &R) -> Result<R::Output> {
        if let Some(answer) = self.opts.shield.before(&self.opts.local, call) {
            return answer;
        }
        let outcome = self.send(call);
        self.opts
            .shield
            .after(&self.opts.local, &self.opts.logger, call, outcome)
    }

    fn send<R: Request>(&mut self, call: &R) -> Result<R::Output> {
        let plan = self.state.plan(Instant::now(), self.opts.recheck);
        let (mut exchange, mut step) = Exchange::start(call, self.state.forced, plan);
        let outcome = loop {
            match step {
                Step::Send(cmd) => step = exchange.on_reply(cmd.query::<Value>(&mut self.con)),
                Step::Done(outcome) => break outcome,
            }
        };
        self.learn(exchange.learned);
        outcome
    }

    fn learn(&mut self, learned: Vec<Learned>) {
        for l in learned {
            emit_line(&self.opts.logger, self.state.learn(l, Instant::now()));
        }
    }

    /// True the first time a wait polls although the module is there.
    fn first_poll(&mut self) -> bool {
        !std::mem::replace(&mut self.polling_logged, true)
    }

    /// TB.BTAKE on the node that owns the key's slot, found by following
    /// `MOVED`/`ASK` from `client`'s node; the wait's connection is kept for
    /// the next wait on that node. A connection the server closed is made
    /// again and the wait sent once more, as any call is
    /// (docs/clients.md#a-dropped-connection-is-not-an-outage); a timed-out
    /// wait is not.
    fn btake<R: Blocking>(
        &mut self,
        client: &redis::Client,
        call: &R,
        timeout_ms: u64,
    ) -> Result<R::Output> {
        let read = wait_read_bound(&self.opts.timeouts, timeout_ms);
        let mut addr: Option<String> = None;
        let mut asking = false;
        let mut resent = false;
        // One round more than the redirects: the one resend.
        for _ in 0..=crate::engine::MAX_REDIRECTIONS + 1 {
            let mut con = match self.waits.remove(&addr) {
                Some(con) => con,
                None => ManagedConnection::with_read_timeout(
                    crate::engine::client_at(client, addr.as_deref())?,
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
                Err(e) => crate::engine::redirection(e),
                Ok(_) => None,
            };
            self.waits.insert(addr.clone(), con);
            if let Err(e) = &reply {
                if is_dropped(e) && !resent && call.resend_on_drop() {
                    // What closed this connection (a restart, CLIENT KILL)
                    // closed the other nodes' idle ones too, as the async
                    // limiter assumes: every wait connection is made anew.
                    resent = true;
                    self.waits.clear();
                    continue;
                }
            }
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
            crate::engine::MAX_REDIRECTIONS
        )))
    }
}

/// The most-denied keys.
impl<C: ConnectionLike + 'static> RateLimiter<C> {
    /// The `count` keys denied most (docs/clients.md#the-most-denied-keys),
    /// the most denied first: TB.TOP `COUNT count` on a standalone server;
    /// on a `redis::cluster::ClusterConnection` (feature `cluster`) TB.TOP
    /// on every master, the rows merged (ties by key bytes) and the first
    /// `count` kept. The module's alone, whatever the backend: without it
    /// (or without the ACL's grant) the server's error is
    /// [`Error::Reply`]; a server or master that cannot be reached is
    /// [`Error::Unavailable`]; never a partial answer. `count` from 1 to 2^53.
    pub fn top(&mut self, count: u64) -> Result<Vec<TopKey>> {
        let cmd = decision::top_command(count)?;
        let mut resent = false;
        loop {
            let replies = self.top_replies(&cmd);
            match replies {
                // A dropped connection is made again and asked once more,
                // as any call (docs/clients.md#a-dropped-connection-is-not-an-outage).
                Err(e) if is_dropped(&e) && !resent => resent = true,
                Err(e) => return Err(limiter_error(&e)),
                Ok(replies) => return decision::merged_top(replies, count),
            }
        }
    }

    fn top_replies(&mut self, cmd: &redis::Cmd) -> RedisResult<Vec<Result<Value>>> {
        #[cfg(feature = "cluster")]
        if let Some(cluster) = (&mut self.con as &mut dyn std::any::Any)
            .downcast_mut::<redis::cluster::ClusterConnection>()
        {
            use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
            let every_master = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            return Ok(decision::per_node(
                cluster.route_command(cmd, every_master)?,
            ));
        }
        Ok(vec![Ok(cmd.query::<Value>(&mut self.con)?)])
    }
}

/// Concurrency leases (docs/leases.md).
impl<C: ConnectionLike> RateLimiter<C> {
    crate::limiter::lease_methods! {
        receiver: [&mut],
        asyncness: [],
        dot_await: [],
        guard: LeaseGuard<'_, C>,
        /// The guard releases the lease when dropped (also on an early
        /// return or a panic).
        guard_does;
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
                let metrics = &self.limiter.opts.metrics;
                metrics.lease(
                    &self.decision.policy,
                    LeaseOutcome::Lost,
                    Origin::of_lost(&outcome),
                );
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
