//! The async limiter (tokio), over any `redis::aio::ConnectionLike` that is
//! `Clone`: `MultiplexedConnection`, `ConnectionManager`,
//! `cluster_async::ClusterConnection`.

use crate::backend::{
    self, chosen, command_info_has_entry, emit, is_function_missing, is_noscript, Backend, Call,
    Logger, Op, Resolved, Timeouts,
};
use crate::decision::{Decision, Limit};
use crate::error::{is_connection_problem, Error, Result};
use crate::sync::{btake_margin, Options};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::{AsyncConnectionConfig, Cmd, IntoConnectionInfo, RedisResult, Value};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::OnceCell;
use tokio::time::Instant;

#[derive(Default)]
struct State {
    resolved: OnceCell<Resolved>,
    polling_logged: AtomicBool,
}

/// A token-bucket rate limiter over an async connection; cheap to clone
/// (clones share the connection and the chosen backend).
///
/// Every call is bounded by `Timeouts::command` (default 200 ms), whatever
/// the connection's own settings: a hung Redis gives [`Error::Timeout`]
/// quickly. (Choosing the backend, once, may take a few such round trips.)
pub struct AsyncRateLimiter<C> {
    con: C,
    opts: Arc<Options>,
    state: Arc<State>,
    blocking: Option<redis::Client>,
}

impl<C: Clone> Clone for AsyncRateLimiter<C> {
    fn clone(&self) -> Self {
        AsyncRateLimiter {
            con: self.con.clone(),
            opts: self.opts.clone(),
            state: self.state.clone(),
            blocking: self.blocking.clone(),
        }
    }
}

impl AsyncRateLimiter<ConnectionManager> {
    /// A limiter on a `ConnectionManager` (reconnects by itself) to `url`,
    /// with the default timeouts; `wait_take` gets dedicated connections to
    /// the same server for TB.BTAKE.
    pub async fn connect_url<T: IntoConnectionInfo>(url: T) -> Result<Self> {
        Self::from_client(redis::Client::open(url)?, Timeouts::default()).await
    }

    /// As [`connect_url`](Self::connect_url), from a client, with `timeouts`.
    pub async fn from_client(client: redis::Client, timeouts: Timeouts) -> Result<Self> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(timeouts.connect)
            .set_response_timeout(timeouts.command)
            .set_number_of_retries(1)
            .set_max_delay(100);
        let con = timed(
            timeouts.connect + timeouts.command,
            ConnectionManager::new_with_config(client.clone(), config),
        )
        .await?;
        Ok(AsyncRateLimiter::new(con)
            .with_timeouts(timeouts)
            .with_blocking_client(client))
    }
}

async fn timed<T, F>(limit: Duration, future: F) -> Result<T>
where
    F: Future<Output = RedisResult<T>>,
{
    match tokio::time::timeout(limit, future).await {
        Ok(result) => Ok(result?),
        Err(_) => Err(Error::Timeout(limit)),
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
            blocking: None,
        }
    }

    fn opts_mut(&mut self) -> &mut Options {
        Arc::make_mut(&mut self.opts)
    }

    /// Forces a backend instead of choosing one.
    pub fn with_backend(mut self, backend: Backend) -> Self {
        self.opts_mut().backend = Some(backend);
        self
    }

    /// Sends the log lines to `logger` instead of the `log` crate.
    pub fn with_logger(mut self, logger: Logger) -> Self {
        self.opts_mut().logger = Some(logger);
        self
    }

    /// The policy name of single-limit decisions (default `"default"`).
    pub fn with_policy_name(mut self, name: impl Into<String>) -> Self {
        self.opts_mut().policy_name = name.into();
        self
    }

    /// The per-call timeout (`command`) and the connect timeout of the
    /// connections `wait_take` makes.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.opts_mut().timeouts = timeouts;
        self
    }

    /// A client for the dedicated connections `wait_take` uses for TB.BTAKE
    /// (a blocking command on a shared multiplexed connection would hold up
    /// every command queued behind it). Without one, `wait_take` polls.
    pub fn with_blocking_client(mut self, client: redis::Client) -> Self {
        self.blocking = Some(client);
        self
    }

    /// The backend in use, once chosen.
    pub fn backend(&self) -> Option<Backend> {
        self.state.resolved.get().map(|r| r.backend)
    }

    #[cfg(feature = "tower")]
    pub(crate) fn logger(&self) -> &Option<Logger> {
        &self.opts.logger
    }

    /// Chooses the backend now instead of at the first call.
    pub async fn connect(&self) -> Result<Backend> {
        Ok(self.resolve().await?.backend)
    }

    async fn query(&self, con: &mut C, cmd: &Cmd) -> Result<Value> {
        timed(self.opts.timeouts.command, cmd.query_async::<Value>(con)).await
    }

    async fn resolve(&self) -> Result<Resolved> {
        let resolved = self
            .state
            .resolved
            .get_or_try_init(|| async {
                let mut con = self.con.clone();
                let (resolved, why) = match self.opts.backend {
                    Some(Backend::Module) => (
                        resolved(Backend::Module, None),
                        backend::WHY_FORCED.to_string(),
                    ),
                    Some(Backend::Function) => {
                        self.query(&mut con, &backend::function_load()).await?;
                        (
                            resolved(Backend::Function, None),
                            backend::WHY_FORCED.to_string(),
                        )
                    }
                    Some(Backend::Script) => {
                        let sha =
                            backend::sha_of(&self.query(&mut con, &backend::script_load()).await?);
                        (
                            resolved(Backend::Script, sha),
                            backend::WHY_FORCED.to_string(),
                        )
                    }
                    None => self.detect(&mut con).await?,
                };
                chosen(&self.opts.logger, resolved.backend, &why);
                Ok::<Resolved, Error>(resolved)
            })
            .await?;
        Ok(resolved.clone())
    }

    async fn detect(&self, con: &mut C) -> Result<(Resolved, String)> {
        // A server error (e.g. an ACL without COMMAND) counts as "no module":
        // the Lua fallback gives the same answers.
        match self.query(con, &backend::command_info()).await {
            Ok(info) if command_info_has_entry(&info) => {
                return Ok((resolved(Backend::Module, None), backend::WHY_MODULE.into()));
            }
            Err(Error::Redis(e)) if !is_connection_problem(&e) => {}
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let cluster = match self.query(con, &backend::cluster_info()).await {
            Ok(_) => true,
            Err(Error::Redis(e)) if !is_connection_problem(&e) => false,
            Err(e) => return Err(e),
        };
        if !cluster {
            match self.query(con, &backend::function_load()).await {
                Ok(_) => {
                    return Ok((
                        resolved(Backend::Function, None),
                        backend::WHY_FUNCTION.into(),
                    ))
                }
                Err(Error::Redis(e)) if !is_connection_problem(&e) => {
                    let sha = backend::sha_of(&self.query(con, &backend::script_load()).await?);
                    let why =
                        format!("the module is not loaded; FUNCTION LOAD failed ({e}): EVALSHA");
                    return Ok((resolved(Backend::Script, sha), why));
                }
                Err(e) => return Err(e),
            }
        }
        let sha = backend::sha_of(&self.query(con, &backend::script_load()).await?);
        Ok((resolved(Backend::Script, sha), backend::WHY_CLUSTER.into()))
    }

    async fn run(&self, call: &Call) -> Result<Decision> {
        let resolved = self.resolve().await?;
        let mut con = self.con.clone();
        let first = timed(
            self.opts.timeouts.command,
            call.command(&resolved, false)
                .query_async::<Value>(&mut con),
        )
        .await;
        let value = match first {
            Ok(v) => v,
            Err(Error::Redis(e)) if resolved.backend == Backend::Script && is_noscript(&e) => {
                self.query(&mut con, &call.command(&resolved, true)).await?
            }
            Err(Error::Redis(e))
                if resolved.backend == Backend::Function && is_function_missing(&e) =>
            {
                self.query(&mut con, &backend::function_load()).await?;
                self.query(&mut con, &call.command(&resolved, false))
                    .await?
            }
            Err(e) => return Err(e),
        };
        call.decision(&value)
    }

    /// Takes `n` tokens from the bucket at `key` (burst `capacity`, refilled
    /// at `rate` tokens per second) if it holds them.
    pub async fn take(
        &self,
        key: &str,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
        n: impl Into<f64>,
    ) -> Result<Decision> {
        let call = Call::single(
            Op::Take,
            key,
            capacity.into(),
            rate.into(),
            n.into(),
            &self.opts.policy_name,
        )?;
        self.run(&call).await
    }

    /// What `take` would answer now; writes nothing.
    pub async fn peek(
        &self,
        key: &str,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
        n: impl Into<f64>,
    ) -> Result<Decision> {
        let call = Call::single(
            Op::Peek,
            key,
            capacity.into(),
            rate.into(),
            n.into(),
            &self.opts.policy_name,
        )?;
        self.run(&call).await
    }

    /// Gives `n` tokens back (capped at `capacity`).
    pub async fn refund(
        &self,
        key: &str,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
        n: impl Into<f64>,
    ) -> Result<Decision> {
        let call = Call::single(
            Op::Refund,
            key,
            capacity.into(),
            rate.into(),
            n.into(),
            &self.opts.policy_name,
        )?;
        self.run(&call).await
    }

    /// Several limits, all or nothing; the decision names the deciding one
    /// (`index`). In a cluster the keys must share a hash slot.
    pub async fn take_all(&self, limits: &[Limit]) -> Result<Decision> {
        self.run(&Call::all(limits)?).await
    }

    /// Takes `n` tokens, waiting up to `timeout_ms` (0: no limit); on
    /// timeout the last denial.
    ///
    /// Module backend with a blocking client (set by [`AsyncRateLimiter::connect_url`]
    /// or [`with_blocking_client`](Self::with_blocking_client)): TB.BTAKE on
    /// a dedicated connection with a response timeout of `timeout_ms` plus a
    /// margin; the server serves waiters first come, first served.
    ///
    /// **Otherwise this polls** (take, sleep `min(retry_after_ms, time
    /// left)`, again): NOT first come, first served.
    pub async fn wait_take(
        &self,
        key: &str,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
        n: impl Into<f64>,
        timeout_ms: u64,
    ) -> Result<Decision> {
        let call = Call::single(
            Op::Take,
            key,
            capacity.into(),
            rate.into(),
            n.into(),
            &self.opts.policy_name,
        )?;
        let resolved = self.resolve().await?;
        if resolved.backend == Backend::Module {
            if let Some(client) = &self.blocking {
                return self.btake(client, &call, timeout_ms).await;
            }
            if !self.state.polling_logged.swap(true, Ordering::SeqCst) {
                emit(
                    &self.opts.logger,
                    log::Level::Info,
                    "redis-tb: wait_take polls (not FIFO): no client for a dedicated TB.BTAKE connection",
                );
            }
        }
        self.poll(&call, timeout_ms).await
    }

    async fn btake(
        &self,
        client: &redis::Client,
        call: &Call,
        timeout_ms: u64,
    ) -> Result<Decision> {
        let timeouts = self.opts.timeouts;
        let mut config = AsyncConnectionConfig::new().set_connection_timeout(timeouts.connect);
        if timeout_ms > 0 {
            config = config
                .set_response_timeout(Duration::from_millis(timeout_ms) + btake_margin(&timeouts));
        }
        let mut con = timed(
            timeouts.connect + timeouts.command,
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await?;
        let value = call
            .btake(timeout_ms)
            .query_async::<Value>(&mut con)
            .await?;
        call.decision(&value)
    }

    async fn poll(&self, call: &Call, timeout_ms: u64) -> Result<Decision> {
        let deadline = match timeout_ms {
            0 => None,
            ms => Instant::now().checked_add(Duration::from_millis(ms)),
        };
        loop {
            let decision = self.run(call).await?;
            if decision.allowed || decision.retry_after_ms < 0 {
                return Ok(decision);
            }
            let mut wait = Duration::from_millis(decision.retry_after_ms.unsigned_abs().max(1));
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(decision);
                }
                wait = wait.min(left);
            }
            tokio::time::sleep(wait).await;
        }
    }
}

fn resolved(backend: Backend, sha: Option<String>) -> Resolved {
    Resolved { backend, sha }
}

impl<C> std::fmt::Debug for AsyncRateLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AsyncRateLimiter")
            .field("backend", &self.state.resolved.get().map(|r| r.backend))
            .finish()
    }
}
