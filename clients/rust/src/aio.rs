//! The async limiter (tokio), over any `redis::aio::ConnectionLike` that is
//! `Clone`: `MultiplexedConnection`, `ConnectionManager`,
//! `cluster_async::ClusterConnection`, or the [`LazyConnectionManager`]
//! this crate makes (a `ConnectionManager` made at the first call, so that
//! a limiter can be created while the server is down).

use crate::backend::{emit, emit_line, Backend, Blocking, Logger, Request, Timeouts};
use crate::decision::{self, TopKey};
use crate::engine::{self, BackendState, Exchange, Learned, Step};
use crate::error::{self, Error, Result};
use crate::lease::{self, LeaseDecision, Permit, Renewal};
use crate::limiter::{wait_read_bound, Options};
use crate::metrics::{LeaseOutcome, Origin};
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{AsyncConnectionConfig, Cmd, IntoConnectionInfo, RedisFuture, RedisResult, Value};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A `ConnectionManager` (which reconnects by itself) made at the first
/// command rather than up front: creating it never fails, a server that is
/// down makes the commands fail (fast when the connection is refused).
#[derive(Clone)]
pub struct LazyConnectionManager {
    client: redis::Client,
    timeouts: Timeouts,
    /// Replaced by an empty cell on `close`; calls in flight keep the old one.
    manager: Arc<Mutex<Arc<tokio::sync::OnceCell<ConnectionManager>>>>,
}

impl LazyConnectionManager {
    /// A manager for `client`'s server with `timeouts` (nothing is sent yet).
    pub fn new(client: redis::Client, timeouts: Timeouts) -> LazyConnectionManager {
        LazyConnectionManager {
            client,
            timeouts,
            manager: Arc::default(),
        }
    }

    /// Drops the connection (for this manager and its clones) once the
    /// calls in flight are done; a later call connects again.
    pub fn close(&self) {
        if let Ok(mut cell) = self.manager.lock() {
            *cell = Arc::default();
        }
    }

    async fn manager(&self) -> RedisResult<ConnectionManager> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeouts.connect))
            .set_response_timeout(Some(self.timeouts.command))
            // No retry with back-off inside a call: a refused connection
            // must fail at once; the next call tries again.
            .set_number_of_retries(0);
        let limit = self.timeouts.connect + self.timeouts.command;
        let make = ConnectionManager::new_with_config(self.client.clone(), config);
        let cell = match self.manager.lock() {
            Ok(cell) => cell.clone(),
            Err(_) => return Err(std::io::Error::other("connection state poisoned").into()),
        };
        let manager = cell
            .get_or_try_init(|| async {
                match tokio::time::timeout(limit, make).await {
                    Ok(made) => made,
                    Err(_) => Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connect timed out",
                    )
                    .into()),
                }
            })
            .await?;
        Ok(manager.clone())
    }
}

impl ConnectionLike for LazyConnectionManager {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move { self.manager().await?.req_packed_command(cmd).await })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a redis::Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.manager()
                .await?
                .req_packed_commands(cmd, offset, count)
                .await
        })
    }

    fn get_db(&self) -> i64 {
        self.client.get_connection_info().redis_settings().db()
    }
}

/// The connections of TB.BTAKE waits: a blocked connection carries nothing
/// else, so each wait in progress has one of its own, taken from a pool
/// per node and given back after. Waits go to the node that owns the key's
/// slot, learnt from `MOVED` (any node of a cluster will do as the seed).
#[derive(Default)]
struct WaitPool {
    idle: Mutex<HashMap<Option<String>, Vec<MultiplexedConnection>>>,
    owners: Mutex<HashMap<u16, String>>,
}

impl WaitPool {
    fn owner(&self, slot: u16) -> Option<String> {
        self.owners.lock().ok()?.get(&slot).cloned()
    }

    fn moved(&self, slot: u16, addr: &str) {
        if let Ok(mut owners) = self.owners.lock() {
            owners.insert(slot, addr.to_string());
        }
    }

    fn checkout(&self, addr: &Option<String>) -> Option<MultiplexedConnection> {
        self.idle.lock().ok()?.get_mut(addr)?.pop()
    }

    fn checkin(&self, addr: Option<String>, con: MultiplexedConnection) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.entry(addr).or_default().push(con);
        }
    }

    fn clear(&self) {
        if let Ok(mut idle) = self.idle.lock() {
            idle.clear();
        }
    }
}

#[derive(Default)]
struct State {
    waits: WaitPool,
    backend: Mutex<BackendState>,
    polling_logged: AtomicBool,
}

/// A token-bucket rate limiter over an async connection; cheap to clone
/// (clones share the connection and the chosen backend).
///
/// Every command is bounded by `Timeouts::command` (default 200 ms),
/// whatever the connection's own settings: a hung Redis gives
/// [`Error::Unavailable`] quickly.
pub struct AsyncRateLimiter<C> {
    con: C,
    opts: Arc<Options>,
    state: Arc<State>,
    /// Closes the connection the limiter made itself (none for `new`).
    closer: Option<Arc<dyn Fn() + Send + Sync>>,
}

impl<C: Clone> Clone for AsyncRateLimiter<C> {
    fn clone(&self) -> Self {
        AsyncRateLimiter {
            con: self.con.clone(),
            opts: self.opts.clone(),
            state: self.state.clone(),
            closer: self.closer.clone(),
        }
    }
}

impl AsyncRateLimiter<LazyConnectionManager> {
    /// A limiter on a [`LazyConnectionManager`] to `url`, with the default
    /// timeouts; `wait_take` and `wait_acquire` get dedicated connections
    /// to the same server for TB.BTAKE and TB.ACQUIRE. Nothing is sent yet: only a bad URL is an error here.
    pub async fn connect_url<T: IntoConnectionInfo>(url: T) -> Result<Self> {
        Ok(Self::from_client(
            redis::Client::open(url)?,
            Timeouts::default(),
        ))
    }

    /// As [`connect_url`](Self::connect_url), from a client, with `timeouts`.
    pub fn from_client(client: redis::Client, timeouts: Timeouts) -> Self {
        let con = LazyConnectionManager::new(client.clone(), timeouts);
        let mut limiter = AsyncRateLimiter::new(con.clone())
            .with_timeouts(timeouts)
            .with_blocking_client(client);
        limiter.closer = Some(Arc::new(move || con.close()));
        limiter
    }
}

async fn timed<T, F>(limit: Duration, future: F) -> Result<T>
where
    F: Future<Output = RedisResult<T>>,
{
    let started = Instant::now();
    match tokio::time::timeout(limit, future).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(engine::timed_out(started, limit)),
    }
}

impl<C> AsyncRateLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    /// A limiter on `con`.
    pub fn new(con: C) -> Self {
        AsyncRateLimiter {
            con,
            opts: Arc::new(Options::default()),
            state: Arc::new(State::default()),
            closer: None,
        }
    }

    /// Releases every connection this limiter (and its clones) opened: the
    /// idle TB.BTAKE connections, and the `LazyConnectionManager` of
    /// [`connect_url`](AsyncRateLimiter::connect_url) / [`from_client`](AsyncRateLimiter::from_client).
    /// A connection given to [`new`](Self::new) is the caller's to drop.
    /// Waits in progress keep their connection until they end; a call after
    /// `close` connects again.
    pub fn close(&self) {
        self.state.waits.clear();
        if let Some(close) = &self.closer {
            close();
        }
    }

    fn opts_mut(&mut self) -> &mut Options {
        Arc::make_mut(&mut self.opts)
    }

    fn force_backend(&mut self, backend: Backend) {
        if let Ok(mut state) = self.state.backend.lock() {
            *state = BackendState::forced(Some(backend));
        }
    }

    crate::limiter::limiter_methods! {
        receiver: [&],
        asyncness: [async],
        dot_await: [.await],
        sleep: tokio::time::sleep,
        /// [`connect_url`](AsyncRateLimiter::connect_url) and
        /// [`from_client`](AsyncRateLimiter::from_client) set the blocking
        /// client; for other constructors, see
        /// [`with_blocking_client`](Self::with_blocking_client).
        blocking_client;
        /// The [`ConcurrencyLimitLayer`](crate::ConcurrencyLimitLayer) has
        /// its own `fail_open` setting and ignores this one.
        lease_fail_open;
    }

    /// The backend in use, once chosen.
    pub fn backend(&self) -> Option<Backend> {
        self.state.backend.lock().ok().and_then(|s| s.backend())
    }

    #[cfg(feature = "tower")]
    pub(crate) fn logger(&self) -> &Option<Logger> {
        &self.opts.logger
    }

    #[cfg(feature = "tower")]
    pub(crate) fn metrics(&self) -> &crate::metrics::Metrics {
        &self.opts.metrics
    }

    /// The `count` keys denied most (docs/clients.md#the-most-denied-keys),
    /// the most denied first: TB.TOP `COUNT count` on a standalone server;
    /// on a `redis::cluster_async::ClusterConnection` (feature
    /// `cluster-async`) TB.TOP on every master, the rows merged (ties by
    /// key bytes) and the first `count` kept. The module's alone, whatever
    /// the backend: without it (or without the ACL's grant) the server's
    /// error is [`Error::Reply`]; a server or master that cannot be reached
    /// (or a reply later than `Timeouts::command`) is [`Error::Unavailable`];
    /// never a partial answer. `count` from 1 to 2^53.
    pub async fn top(&self, count: u64) -> Result<Vec<TopKey>> {
        let cmd = decision::top_command(count)?;
        let mut resent = false;
        loop {
            match self.top_replies(&cmd).await {
                // A dropped connection is made again and asked once more,
                // as any call (docs/clients.md#a-dropped-connection-is-not-an-outage).
                Err(Some(e)) if error::is_dropped(&e) && !resent => resent = true,
                Err(Some(e)) => return Err(Error::from(e)),
                Err(None) => {
                    return Err(engine::timed_out(
                        Instant::now(),
                        self.opts.timeouts.command,
                    ))
                }
                Ok(replies) => return decision::merged_top(replies, count),
            }
        }
    }

    /// Every master's reply (`Err(None)`: out of time).
    async fn top_replies(
        &self,
        cmd: &Cmd,
    ) -> std::result::Result<Vec<Result<Value>>, Option<redis::RedisError>> {
        let limit = self.opts.timeouts.command;
        let mut con = self.con.clone();
        #[cfg(feature = "cluster-async")]
        if let Some(cluster) = (&mut con as &mut dyn std::any::Any)
            .downcast_mut::<redis::cluster_async::ClusterConnection>()
        {
            use redis::cluster_routing::{MultipleNodeRoutingInfo, RoutingInfo};
            let every_master = RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllMasters, None));
            let routed = cluster.route_command(cmd.clone(), every_master);
            return match tokio::time::timeout(limit, routed).await {
                Ok(reply) => Ok(decision::per_node(reply.map_err(Some)?)),
                Err(_) => Err(None),
            };
        }
        match tokio::time::timeout(limit, cmd.query_async::<Value>(&mut con)).await {
            Ok(reply) => Ok(vec![Ok(reply.map_err(Some)?)]),
            Err(_) => Err(None),
        }
    }

    fn learn(&self, learned: Vec<Learned>) {
        if let Ok(mut state) = self.state.backend.lock() {
            for l in learned {
                emit_line(&self.opts.logger, state.learn(l, Instant::now()));
            }
        }
    }

    /// True the first time a wait polls although the module is there.
    fn first_poll(&self) -> bool {
        !self.state.polling_logged.swap(true, Ordering::SeqCst)
    }

    /// One call: answered in process if it can be, else sent under the
    /// failure rule, its outcome through the outage and the denial cache.
    async fn run<R: Request>(&self, call: &R) -> Result<R::Output> {
        if let Some(answer) = self.opts.shield.before(&self.opts.local, call) {
            return answer;
        }
        let outcome = self.send(call).await;
        self.opts
            .shield
            .after(&self.opts.local, &self.opts.logger, call, outcome)
    }

    async fn send<R: Request>(&self, call: &R) -> Result<R::Output> {
        let (forced, plan) = match self.state.backend.lock() {
            Ok(state) => (state.forced, state.plan(Instant::now(), self.opts.recheck)),
            Err(_) => return Err(Error::Other("limiter state poisoned".into())),
        };
        let (mut exchange, mut step) = Exchange::start(call, forced, plan);
        let mut con = self.con.clone();
        let outcome = loop {
            match step {
                Step::Send(cmd) => {
                    let limit = self.opts.timeouts.command;
                    let reply =
                        match tokio::time::timeout(limit, cmd.query_async::<Value>(&mut con)).await
                        {
                            Ok(reply) => reply,
                            Err(_) => break Err(engine::timed_out(Instant::now(), limit)),
                        };
                    step = exchange.on_reply(reply);
                }
                Step::Done(outcome) => break outcome,
            }
        };
        self.learn(std::mem::take(&mut exchange.learned));
        outcome
    }

    /// The wait on the node that owns the key's slot, on a pooled
    /// connection of its own, following `MOVED`/`ASK`; sent once more on a
    /// new connection when the server closed the one it went out on.
    async fn btake<R: Blocking>(
        &self,
        client: &redis::Client,
        call: &R,
        timeout_ms: u64,
    ) -> Result<R::Output> {
        let timeouts = self.opts.timeouts;
        let pool = &self.state.waits;
        let slot = crate::decision::key_slot(call.first_key());
        let mut addr = pool.owner(slot);
        let mut asking = false;
        let mut resent = false;
        // One round more than the redirects: the one resend.
        for _ in 0..=engine::MAX_REDIRECTIONS + 1 {
            let con = match pool.checkout(&addr) {
                Some(con) => con,
                None => {
                    let config = AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(timeouts.connect))
                        // A wait's own bound is set per wait (blocking_query).
                        .set_response_timeout(None);
                    let node = engine::client_at(client, addr.as_deref())?;
                    timed(
                        timeouts.connect + timeouts.command,
                        node.get_multiplexed_async_connection_with_config(&config),
                    )
                    .await?
                }
            };
            let mut sender = con.clone();
            let reply = if asking {
                // ASK: this one command goes to the importing node, after ASKING.
                let mut pipe = redis::pipe();
                pipe.cmd("ASKING")
                    .ignore()
                    .add_command(call.blocking(timeout_ms));
                let query = async move {
                    let mut replies = pipe.query_async::<Vec<Value>>(&mut sender).await?;
                    Ok(replies.pop().unwrap_or(Value::Nil))
                };
                self.blocking_query(timeout_ms, query).await
            } else {
                let cmd = call.blocking(timeout_ms);
                let query = async move { cmd.query_async::<Value>(&mut sender).await };
                self.blocking_query(timeout_ms, query).await
            };
            // A connection the server closed: a new one, and the wait sent
            // once more (docs/clients.md#a-dropped-connection-is-not-an-outage);
            // a timed-out wait (`Err(None)`) is never sent again.
            if let Err(Some(e)) = &reply {
                if error::is_dropped(e) && !resent && call.resend_on_drop() {
                    resent = true;
                    pool.clear();
                    continue;
                }
            }
            if let Some(outcome) =
                self.after_wait(reply, call, pool, &mut addr, &mut asking, slot, con)
            {
                return outcome;
            }
        }
        Err(Error::Other(format!(
            "TB.BTAKE: more than {} redirects",
            engine::MAX_REDIRECTIONS
        )))
    }

    /// A wait's reply, bounded by its own timeout plus a margin (none for 0).
    async fn blocking_query<T>(
        &self,
        timeout_ms: u64,
        query: impl Future<Output = RedisResult<T>>,
    ) -> std::result::Result<T, Option<redis::RedisError>> {
        let Some(limit) = wait_read_bound(&self.opts.timeouts, timeout_ms) else {
            return query.await.map_err(Some);
        };
        match tokio::time::timeout(limit, query).await {
            Ok(reply) => reply.map_err(Some),
            Err(_) => Err(None),
        }
    }

    /// `None`: follow the redirect; otherwise the wait's outcome. The
    /// connection goes back to the pool unless it cannot be trusted.
    #[allow(clippy::too_many_arguments)]
    fn after_wait<R: Request>(
        &self,
        reply: std::result::Result<Value, Option<redis::RedisError>>,
        call: &R,
        pool: &WaitPool,
        addr: &mut Option<String>,
        asking: &mut bool,
        slot: u16,
        con: MultiplexedConnection,
    ) -> Option<Result<R::Output>> {
        match reply {
            Ok(value) => {
                pool.checkin(addr.clone(), con);
                Some(call.parse(&value))
            }
            Err(None) => Some(Err(engine::timed_out(Instant::now(), Duration::ZERO))),
            Err(Some(e)) => {
                let redirect = engine::redirection(&e);
                if !error::is_connection_problem(&e) {
                    pool.checkin(addr.clone(), con);
                } else {
                    pool.clear();
                }
                let Some((ask, to)) = redirect else {
                    return Some(Err(Error::from(e)));
                };
                if !ask {
                    pool.moved(slot, &to);
                }
                *asking = ask;
                *addr = Some(to);
                None
            }
        }
    }
}

/// Concurrency leases (docs/leases.md).
impl<C> AsyncRateLimiter<C>
where
    C: ConnectionLike + Clone + Send + Sync + 'static,
{
    crate::limiter::lease_methods! {
        receiver: [&],
        asyncness: [async],
        dot_await: [.await],
        guard: AsyncLeaseGuard,
        /// The guard ([`AsyncLeaseGuard`]) renews the lease in a task while
        /// held, and releases it when dropped.
        guard_does;
    }

    /// The acquire without this limiter's lease fail-open (the guards and
    /// the middleware decide that themselves).
    pub(crate) async fn acquire_strict(
        &self,
        key: &str,
        limit: u64,
        lease_ms: u64,
    ) -> Result<LeaseDecision> {
        let call = self.opts.acquire_call(key, limit, lease_ms)?;
        self.run(&call).await
    }

    fn guard(
        &self,
        outcome: Result<LeaseDecision>,
        started: Instant,
    ) -> Result<Permit<AsyncLeaseGuard>> {
        self.guard_with(outcome, started, self.opts.lease_fail_open)
    }

    /// The guard of an acquire sent at `started`, failing open as `fail_open` says.
    pub(crate) fn guard_with(
        &self,
        outcome: Result<LeaseDecision>,
        started: Instant,
        fail_open: bool,
    ) -> Result<Permit<AsyncLeaseGuard>> {
        lease::permit(outcome, fail_open, |decision, id| {
            AsyncLeaseGuard::start(self.clone(), decision, id, started)
        })
    }
}

type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

/// A held lease, renewed every `lease_ms / 3` by a tokio task while the
/// guard lives.
///
/// - [`release`](Self::release)`.await` releases it and returns the answer:
///   the way to end a lease promptly and know it.
/// - Dropping the guard (an early return, a panic, a cancelled future)
///   stops the renewals and releases the lease in a spawned task: best
///   effort, since `Drop` cannot wait. The release runs shortly after on
///   the runtime, and not at all if the runtime is shutting down or the
///   server cannot be reached; the lease then ends by itself at its
///   deadline, at most `lease_ms` later.
/// - A renewal that finds the lease gone (or that cannot reach the server
///   for `lease_ms`) marks it lost: [`is_lost`](Self::is_lost), the
///   [`lost`](Self::lost) future (for `tokio::select!`), or a
///   [`watch`](Self::watch) receiver. A lost lease is not renewed again.
pub struct AsyncLeaseGuard {
    decision: LeaseDecision,
    id: String,
    lost: tokio::sync::watch::Receiver<Option<String>>,
    renewer: tokio::task::JoinHandle<()>,
    release: Option<BoxFuture<Result<bool>>>,
}

impl AsyncLeaseGuard {
    fn start<C>(
        limiter: AsyncRateLimiter<C>,
        decision: LeaseDecision,
        id: String,
        started: Instant,
    ) -> AsyncLeaseGuard
    where
        C: ConnectionLike + Clone + Send + Sync + 'static,
    {
        let (tx, lost) = tokio::sync::watch::channel(None);
        let (key, lease_ms) = (decision.key.clone(), decision.lease_ms);
        let renewer = {
            let (limiter, key, id) = (limiter.clone(), key.clone(), id.clone());
            let policy = decision.policy.clone();
            tokio::spawn(async move {
                let every = lease::renew_every(lease_ms);
                let mut confirmed = started;
                loop {
                    tokio::time::sleep(every).await;
                    let sent = Instant::now();
                    let outcome = limiter.renew(&key, &id, lease_ms).await;
                    match lease::after_renew(&outcome, sent - confirmed, lease_ms) {
                        Renewal::Held => confirmed = sent,
                        Renewal::Retry => {}
                        Renewal::Lost(why) => {
                            emit(
                                &limiter.opts.logger,
                                log::Level::Warn,
                                &format!("redis-tb: lease {id} on {key} lost: {why}"),
                            );
                            let metrics = &limiter.opts.metrics;
                            metrics.lease(&policy, LeaseOutcome::Lost, Origin::of_lost(&outcome));
                            let _ = tx.send(Some(why));
                            return;
                        }
                    }
                }
            })
        };
        let release: BoxFuture<Result<bool>> = {
            let id = id.clone();
            Box::pin(async move {
                let outcome = limiter.release(&key, &id).await;
                if let Err(e) = &outcome {
                    emit(
                        &limiter.opts.logger,
                        log::Level::Warn,
                        &lease::release_failed(&id, &key, e),
                    );
                }
                outcome
            })
        };
        AsyncLeaseGuard {
            decision,
            id,
            lost,
            renewer,
            release: Some(release),
        }
    }

    /// The lease's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The acquire's answer.
    pub fn decision(&self) -> &LeaseDecision {
        &self.decision
    }

    /// True once a renewal found the lease gone: the slot may be someone
    /// else's now.
    pub fn is_lost(&self) -> bool {
        self.lost.borrow().is_some()
    }

    /// Why the lease was lost, if it was.
    pub fn lost_reason(&self) -> Option<String> {
        self.lost.borrow().clone()
    }

    /// Resolves when the lease is lost, with the reason (never, while it is
    /// held); for `tokio::select!` against the work.
    pub async fn lost(&self) -> String {
        let mut rx = self.lost.clone();
        loop {
            if let Some(why) = rx.borrow_and_update().clone() {
                return why;
            }
            if rx.changed().await.is_err() {
                // The renewal task ended without a loss (released): never.
                std::future::pending::<()>().await;
            }
        }
    }

    /// A receiver that turns `Some(reason)` when the lease is lost.
    pub fn watch(&self) -> tokio::sync::watch::Receiver<Option<String>> {
        self.lost.clone()
    }

    /// Stops the renewals and releases the lease: `true` if it was still live.
    pub async fn release(mut self) -> Result<bool> {
        self.renewer.abort();
        match self.release.take() {
            Some(release) => release.await,
            None => Ok(false),
        }
    }
}

impl Drop for AsyncLeaseGuard {
    fn drop(&mut self) {
        self.renewer.abort();
        if let Some(release) = self.release.take() {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    let _ = release.await;
                });
            }
        }
    }
}

impl std::fmt::Debug for AsyncLeaseGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncLeaseGuard")
            .field("key", &self.decision.key)
            .field("id", &self.id)
            .field("lost", &*self.lost.borrow())
            .finish()
    }
}

impl<C> std::fmt::Debug for AsyncRateLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncRateLimiter")
            .field(
                "backend",
                &self.state.backend.lock().ok().and_then(|s| s.backend()),
            )
            .finish()
    }
}
