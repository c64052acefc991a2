//! What the blocking and the async limiter share: their settings
//! ([`Options`]), the pure part of their calls, and (the macros
//! [`limiter_methods!`] and [`lease_methods!`]) the public methods whose
//! only difference between the two is `&mut self` or `&self`, `async` and
//! `.await`: written once, so that their code and docs cannot drift apart.

use crate::backend::{Call, Logger, Op, Timeouts};
use crate::engine::{Shield, MODULE_RECHECK};
use crate::error::Result;
use crate::lease::{self, AcquireCall, LeaseDecision};
use crate::local::LocalSettings;
use crate::metrics::Metrics;
use std::sync::Arc;
use std::time::Duration;

/// Settings shared by both limiters.
#[derive(Clone)]
pub(crate) struct Options {
    pub logger: Option<Logger>,
    pub timeouts: Timeouts,
    pub policy_name: String,
    pub recheck: Duration,
    /// Leases: an unavailable limiter gives a failed-open `LeaseDecision`
    /// (plain calls) or `Permit::FailedOpen` (guards).
    pub lease_fail_open: bool,
    /// The longest sleep of a polling `wait_acquire` (`poll_ms`).
    pub lease_poll: Duration,
    /// Where `wait_take` and `wait_acquire` open their dedicated
    /// connections; `None`: they poll.
    pub blocking: Option<redis::Client>,
    /// `on_unavailable`, `instances`, `local_max_keys`, `local_probe_ms`,
    /// `cache_denials`.
    pub local: LocalSettings,
    /// The local limiter, the denial cache and the outage (shared by
    /// clones of the limiter, and by a middleware made from it).
    pub shield: Arc<Shield>,
    /// Where decisions, waits and leases are recorded (docs/clients.md#metrics).
    pub metrics: Metrics,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            logger: None,
            timeouts: Timeouts::default(),
            policy_name: "default".into(),
            recheck: MODULE_RECHECK,
            lease_fail_open: false,
            lease_poll: lease::LEASE_POLL_DEFAULT,
            blocking: None,
            local: LocalSettings::default(),
            shield: Arc::default(),
            metrics: Metrics::default(),
        }
    }
}

/// The calls both limiters build, from their settings alone: the pure part
/// of each limiter method, so that only the I/O differs between sync and async.
impl Options {
    /// A one-bucket call (`take`, `peek`, `refund`, `wait_take`) under the
    /// limiter's policy name.
    pub fn single(
        &self,
        op: Op,
        key: &str,
        capacity: impl Into<f64>,
        rate: impl Into<f64>,
        n: impl Into<f64>,
    ) -> Result<Call> {
        let (capacity, rate, n) = (capacity.into(), rate.into(), n.into());
        Call::single(op, key, capacity, rate, n, &self.policy_name)
    }

    /// An acquire under the limiter's policy name and polling cap.
    pub fn acquire_call(&self, key: &str, limit: u64, lease_ms: u64) -> Result<AcquireCall> {
        Ok(AcquireCall::new(key, limit, lease_ms, &self.policy_name)?.poll(self.lease_poll))
    }

    /// An acquire's `outcome`, an outage turned into a failed-open decision
    /// when leases fail open.
    pub fn lease_fail_open(
        &self,
        call: &AcquireCall,
        outcome: Result<LeaseDecision>,
    ) -> Result<LeaseDecision> {
        match outcome {
            Err(e) if self.lease_fail_open && e.is_unavailable() => {
                Ok(LeaseDecision::failed_open(call))
            }
            other => other,
        }
    }
}

/// How long the reply of a wait in the server (TB.BTAKE, TB.ACQUIRE with a
/// timeout) may take: its own `timeout_ms` plus a margin; `None` for a wait
/// without a limit (0).
pub(crate) fn wait_read_bound(timeouts: &Timeouts, timeout_ms: u64) -> Option<Duration> {
    let margin = timeouts.command + Duration::from_secs(1);
    (timeout_ms > 0).then(|| Duration::from_millis(timeout_ms) + margin)
}

/// The methods of both limiters other than leases, expanded inside
/// `impl RateLimiter<C>` (`receiver: [&mut], asyncness: [], dot_await: []`)
/// and `impl AsyncRateLimiter<C>` (`receiver: [&], asyncness: [async],
/// dot_await: [.await]`).
///
/// A macro rather than a trait: the two differ in the receiver and in
/// `async`, which one trait cannot cover without boxing every future.
///
/// They rest on what each driver has of its own: the field `opts`
/// ([`Options`]), `opts_mut`, `force_backend`, `backend`, `run` (one call
/// under the failure rule, through [`Options::before`] and
/// [`Options::after`]), `learn`, `btake` (a wait in the server on a dedicated
/// connection) and `first_poll` (true once, when a wait first polls
/// although the module is there). The rest comes in as arguments: `sleep`
/// (the driver's sleep function), and the doc lines that differ between the
/// two, `blocking_client` (a sentence on which constructors set one) and
/// `lease_fail_open` (appended to that method's doc).
macro_rules! limiter_methods {
    (
        receiver: [$($recv:tt)+],
        asyncness: [$($asy:ident)?],
        dot_await: [$($aw:tt)*],
        sleep: $sleep:path,
        $(#[$blocking_client:meta])* blocking_client;
        $(#[$lease_fail_open:meta])* lease_fail_open;
    ) => {
        /// Forces a backend instead of choosing one.
        pub fn with_backend(mut self, backend: $crate::backend::Backend) -> Self {
            self.force_backend(backend);
            self
        }

        /// Timeouts of the dedicated connections `wait_take` and
        /// `wait_acquire` open (`command` is also the margin added to a
        /// wait's own timeout); the async limiter also bounds every command
        /// by `command`. Default 200 ms each.
        pub fn with_timeouts(mut self, timeouts: $crate::backend::Timeouts) -> Self {
            self.opts_mut().timeouts = timeouts;
            self
        }

        /// What an unreachable Redis does to the plain API (after the one
        /// resend of a dropped connection): [`OnUnavailable::Raise`](crate::OnUnavailable::Raise)
        /// (the default), [`Error::Unavailable`](crate::Error::Unavailable);
        /// [`OnUnavailable::Local`](crate::OnUnavailable::Local), takes,
        /// `take_limit`, `take_all` and peeks are answered by the local
        /// limiter (the module's arithmetic at `1/instances` of each limit,
        /// [`Source::Local`](crate::Source::Local)). The outage's start and
        /// end are logged once each at warning level; meanwhile nothing is
        /// sent for `local_probe_ms`, then one call tries Redis again.
        /// Charges, refunds, `settle`, `unblock`, waits and leases are not
        /// served locally: they stay `Error::Unavailable`.
        pub fn on_unavailable(mut self, mode: $crate::local::OnUnavailable) -> Self {
            self.opts_mut().local.on_unavailable = mode;
            self
        }

        /// How many processes share each limit (default 1, at least 1): the
        /// local limiter allows each `1/instances` of it.
        pub fn instances(mut self, instances: u32) -> Self {
            self.opts_mut().local.instances = instances.max(1);
            self
        }

        /// The most keys the local limiter and the denial cache each keep
        /// (default 10,000, at least 1), the least recently used forgotten first.
        pub fn local_max_keys(mut self, keys: usize) -> Self {
            self.opts_mut().local.max_keys = keys.max(1);
            self
        }

        /// How long an outage sends nothing before one call tries Redis
        /// again (default 1,000 ms).
        pub fn local_probe_ms(mut self, ms: u64) -> Self {
            self.opts_mut().local.probe_ms = ms;
            self
        }

        /// `true`: a take denied until time T (`retry_after_ms > 0`) is
        /// denied in process until T for takes of at least as many tokens,
        /// without a round trip ([`Source::Cache`](crate::Source::Cache)).
        /// An allowed take that leaves fewer than its `n` tokens is cached
        /// the same way, as denied until `n` is back (the flood bound).
        /// A refund, charge, settle or unblock through this limiter drops
        /// the key's entry; a refund or unblock by another process is not
        /// seen until T. Default `false` (docs/clients.md#the-denial-cache).
        pub fn cache_denials(mut self, cache: bool) -> Self {
            self.opts_mut().local.cache_denials = cache;
            self
        }

        /// Sends the log lines to `logger` instead of the `log` crate.
        pub fn with_logger(mut self, logger: $crate::backend::Logger) -> Self {
            self.opts_mut().logger = Some(logger);
            self
        }

        /// The policy name of the decisions on one bucket or lease set
        /// (`take`, `peek`, `refund`, `wait_take`, `acquire`,
        /// `wait_acquire`; `take_all` names its limits itself). Default
        /// `"default"`; a name that is not printable ASCII makes those calls
        /// fail with [`Error::InvalidArgument`](crate::Error::InvalidArgument).
        pub fn with_policy_name(mut self, name: impl Into<String>) -> Self {
            self.opts_mut().policy_name = name.into();
            self
        }

        /// How often a limiter that fell back to Lua after the module went away
        /// looks for the module again (default 30 s).
        pub fn with_module_recheck(mut self, every: std::time::Duration) -> Self {
            self.opts_mut().recheck = every;
            self
        }

        /// A client for the dedicated connections `wait_take` and
        /// `wait_acquire` use for TB.BTAKE and TB.ACQUIRE with a timeout: a
        /// blocking command holds its connection until it is answered, so
        /// it must not share one (on a multiplexed connection it would hold
        /// up every command queued behind it), and its reply is awaited for
        /// longer than its own timeout. Without one, they poll.
        pub fn with_blocking_client(mut self, client: redis::Client) -> Self {
            self.opts_mut().blocking = Some(client);
            self
        }

        /// `true`: when the limiter is unavailable, [`acquire`](Self::acquire)
        /// and [`wait_acquire`](Self::wait_acquire) answer a
        /// [`LeaseDecision`](crate::LeaseDecision) with `acquired` true,
        /// `lease` `None` and `failed_open` true, and
        /// [`acquire_guard`](Self::acquire_guard) and
        /// [`wait_acquire_guard`](Self::wait_acquire_guard) answer
        /// [`Permit::FailedOpen`](crate::Permit::FailedOpen): go ahead
        /// WITHOUT a lease (nothing is held, counted or released). Default
        /// `false` (fail closed): [`Error::Unavailable`](crate::Error::Unavailable),
        /// like every call.
        $(#[$lease_fail_open])*
        pub fn with_lease_fail_open(mut self, fail_open: bool) -> Self {
            self.opts_mut().lease_fail_open = fail_open;
            self
        }

        /// The longest sleep between two tries of a polling
        /// [`wait_acquire`](Self::wait_acquire) (`poll_ms`, default 100 ms, at
        /// least 1 ms): it sleeps `min(retry_after_ms, poll)`.
        pub fn with_lease_poll(mut self, poll: std::time::Duration) -> Self {
            self.opts_mut().lease_poll = poll.max(std::time::Duration::from_millis(1));
            self
        }

        /// Records this limiter's decisions, waits and leases
        /// (docs/clients.md#metrics) through `provider`'s meter `redis-tb`
        /// instead of the global meter provider's (feature `metrics`). The
        /// global one is read at the first record of a limiter without
        /// one: install it before the limiter's first call.
        #[cfg(feature = "metrics")]
        pub fn with_meter_provider(
            mut self,
            provider: &impl opentelemetry::metrics::MeterProvider,
        ) -> Self {
            self.opts_mut().metrics = $crate::metrics::Metrics::with_provider(provider);
            self
        }

        /// Chooses the backend now (loading the Lua library or script if
        /// needed) instead of at the first call: a peek of a key that is never
        /// written.
        pub $($asy)? fn connect($($recv)+ self) -> $crate::error::Result<$crate::backend::Backend> {
            self.run(&$crate::backend::Call::probe("redis-tb:connect")?) $($aw)* ?;
            self.backend()
                .ok_or_else(|| $crate::error::Error::Other("no backend chosen".into()))
        }

        $crate::limiter::limiter_methods!(@bucket [$($recv)+] [$($asy)?] [$($aw)*]
            /// Takes `n` tokens from the bucket at `key` (burst `capacity`, refilled
            /// at `rate` tokens per second) if it holds them.
            take Take);
        $crate::limiter::limiter_methods!(@bucket [$($recv)+] [$($asy)?] [$($aw)*]
            /// What `take` would answer now; writes nothing.
            peek Peek);
        $crate::limiter::limiter_methods!(@bucket [$($recv)+] [$($asy)?] [$($aw)*]
            /// Gives `n` tokens back (capped at `capacity`).
            refund Refund);

        /// Several limits, all or nothing; the decision names the deciding one
        /// (`index`). In a cluster the keys must share a hash slot.
        pub $($asy)? fn take_all(
            $($recv)+ self,
            limits: &[$crate::decision::Limit],
        ) -> $crate::error::Result<$crate::decision::Decision> {
            self.decide(&$crate::backend::Call::all(limits)?) $($aw)*
        }

        /// One call; a take's answer is a decision, recorded as one.
        $($asy)? fn decide(
            $($recv)+ self,
            call: &$crate::backend::Call,
        ) -> $crate::error::Result<$crate::decision::Decision> {
            let started = std::time::Instant::now();
            let outcome = self.run(call) $($aw)*;
            if call.decides() {
                self.opts.metrics.decided(&outcome, started);
            }
            outcome
        }

        /// [`take`](Self::take) with options: `max_wait_ms`, a reservation
        /// (`MAXWAIT`: allowed into debt when the tokens arrive within that
        /// many ms; act after [`Decision::wait_ms`](crate::Decision::wait_ms)),
        /// and a lockout (`BLOCK`/`MAXBLOCK`: a denial locks the key, every
        /// take and peek is denied while the lock holds).
        pub $($asy)? fn take_with(
            $($recv)+ self,
            key: &str,
            capacity: impl Into<f64>,
            rate: impl Into<f64>,
            n: impl Into<f64>,
            options: $crate::decision::TakeOptions,
        ) -> $crate::error::Result<$crate::decision::Decision> {
            let call = self.opts.single($crate::backend::Op::Take, key, capacity, rate, n)?;
            let call = $crate::backend::Call::take_with(call, &options)?;
            self.decide(&call) $($aw)*
        }

        /// A take of one [`Limit`](crate::Limit): its key, numbers, name and
        /// lockout; `max_wait_ms` a reservation as in [`take_with`](Self::take_with) (0: none).
        pub $($asy)? fn take_limit(
            $($recv)+ self,
            limit: &$crate::decision::Limit,
            max_wait_ms: u64,
        ) -> $crate::error::Result<$crate::decision::Decision> {
            self.decide(&$crate::backend::Call::limit_take(limit, max_wait_ms)?) $($aw)*
        }

        /// [`take_all`](Self::take_all) with a reservation of `max_wait_ms`
        /// on every bucket (0: none). The limits' lockouts, which must be the
        /// same, are sent as `BLOCK`/`MAXBLOCK` (also by `take_all`).
        pub $($asy)? fn take_all_with(
            $($recv)+ self,
            limits: &[$crate::decision::Limit],
            max_wait_ms: u64,
        ) -> $crate::error::Result<$crate::decision::Decision> {
            self.decide(&$crate::backend::Call::all_with(limits, max_wait_ms)?) $($aw)*
        }

        /// TB.CHARGE: a cost learned after the work, always taken, into debt
        /// down to `-max_debt` (`None`: the capacity). The decision's
        /// [`wait_ms`](crate::Decision::wait_ms) is the wait until the debt is
        /// repaid (later takes are denied until then).
        pub $($asy)? fn charge(
            $($recv)+ self,
            limit: &$crate::decision::Limit,
            n: impl Into<f64>,
            max_debt: Option<f64>,
        ) -> $crate::error::Result<$crate::decision::Decision> {
            self.decide(&$crate::backend::Call::charge(limit, n.into(), max_debt)?) $($aw)*
        }

        /// After a take of `reserved` for work that cost `actual`: refunds the
        /// difference (`actual < reserved`) or charges it (`actual > reserved`)
        /// in one call; `None`, without a call, when they are equal.
        pub $($asy)? fn settle(
            $($recv)+ self,
            limit: &$crate::decision::Limit,
            reserved: impl Into<f64>,
            actual: impl Into<f64>,
        ) -> $crate::error::Result<Option<$crate::decision::Decision>> {
            match $crate::backend::Call::settle(limit, reserved.into(), actual.into())? {
                Some(call) => Ok(Some(self.decide(&call) $($aw)* ?)),
                None => Ok(None),
            }
        }

        /// TB.UNBLOCK: ends the key's lock and forgets its strikes; `true` if
        /// there was a lock or a strike to forget. Takes a key or a `Limit`.
        pub $($asy)? fn unblock(
            $($recv)+ self,
            target: impl $crate::decision::BucketKey,
        ) -> $crate::error::Result<bool> {
            self.run(&$crate::backend::UnblockCall::new(target.bucket_key())?) $($aw)*
        }

        /// Takes `n` tokens, waiting up to `timeout_ms` (0: no limit) for them;
        /// on timeout the last denial.
        ///
        /// Module backend with a blocking client: TB.BTAKE on a dedicated
        /// connection (on the node that owns the key's slot) whose reply is
        /// awaited for `timeout_ms` plus a margin; waiters are served first
        /// come, first served by the server.
        $(#[$blocking_client])*
        ///
        /// Without the module (function, script): ONE reservation (`TB.TAKE`'s
        /// `MAXWAIT timeout_ms`) and one sleep for the delay it returns;
        /// reservations queue in the bucket's debt, so this is first come,
        /// first served too. The grant comes back with `retry_after_ms` 0 (the
        /// wait is done); a denial after the timeout, as TB.BTAKE.
        ///
        /// **The module without a blocking client polls**: take, sleep
        /// `min(retry_after_ms, time left)`, again; NOT in arrival order.
        pub $($asy)? fn wait_take(
            $($recv)+ self,
            key: &str,
            capacity: impl Into<f64>,
            rate: impl Into<f64>,
            n: impl Into<f64>,
            timeout_ms: u64,
        ) -> $crate::error::Result<$crate::decision::Decision> {
            let started = std::time::Instant::now();
            let call = self.opts.single($crate::backend::Op::Take, key, capacity, rate, n)?.waiting();
            let probe = $crate::backend::Call::probe(key)?;
            let outcome = self.wait(&call, &probe, timeout_ms) $($aw)*;
            self.opts.metrics.waited(&outcome, started);
            outcome
        }

        /// A wait for `call`: its blocking form on a dedicated connection with
        /// the module and a blocking client, else polling (`probe` chooses the
        /// backend first).
        $($asy)? fn wait<R>(
            $($recv)+ self,
            call: &R,
            probe: &$crate::backend::Call,
            timeout_ms: u64,
        ) -> $crate::error::Result<R::Output>
        where
            R: $crate::backend::Blocking,
            R::Output: $crate::engine::Awaited,
        {
            use $crate::backend::Backend;
            use $crate::error::{classify_reply, Error, FailureClass};
            $crate::decision::check_timeout_ms(timeout_ms)?;
            if self.backend().is_none() {
                self.run(probe) $($aw)* ?;
            }
            if self.backend() == Some(Backend::Module) {
                if let Some(client) = self.opts.blocking.clone() {
                    match self.btake(&client, call, timeout_ms) $($aw)* {
                        Err(Error::Reply(r))
                            if classify_reply(&r) == FailureClass::ServerChanged =>
                        {
                            // The module went away: detect again, then poll on Lua.
                            self.learn(vec![$crate::engine::Learned::Stale]);
                        }
                        other => return other,
                    }
                } else if self.first_poll() {
                    $crate::backend::emit(
                        &self.opts.logger,
                        log::Level::Info,
                        $crate::engine::POLLING_NOTE,
                    );
                }
            }
            if self.backend() != Some(Backend::Module) {
                if let Some(reservation) = call.reservation(timeout_ms) {
                    return self.reserve(call, &reservation, timeout_ms) $($aw)*;
                }
            }
            self.poll(call, timeout_ms) $($aw)*
        }

        /// A wait without the module: `reservation`, then one sleep for the
        /// delay it returns. A denial (the tokens do not come within the
        /// timeout) sleeps out the timeout, as TB.BTAKE would wait, then
        /// answers one plain `call`.
        $($asy)? fn reserve<R>(
            $($recv)+ self,
            call: &R,
            reservation: &R,
            timeout_ms: u64,
        ) -> $crate::error::Result<R::Output>
        where
            R: $crate::backend::Blocking,
            R::Output: $crate::engine::Awaited,
        {
            use $crate::engine::Awaited;
            let deadline = $crate::engine::deadline_after(timeout_ms);
            let answer = self.run(reservation) $($aw)* ?;
            if let Some(wait) = answer.reserved_for() {
                $sleep(wait) $($aw)*;
                return Ok(answer.waited());
            }
            let Some(deadline) = deadline.filter(|_| answer.retry_in().is_some()) else {
                return Ok(answer.waited());
            };
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if !left.is_zero() {
                $sleep(left) $($aw)*;
            }
            self.run(call) $($aw)*
        }

        /// Repeats `call` until it is done or the time is out, sleeping as
        /// its answer says.
        $($asy)? fn poll<R>(
            $($recv)+ self,
            call: &R,
            timeout_ms: u64,
        ) -> $crate::error::Result<R::Output>
        where
            R: $crate::backend::Blocking,
            R::Output: $crate::engine::Awaited,
        {
            let deadline = $crate::engine::deadline_after(timeout_ms);
            loop {
                let decision = self.run(call) $($aw)* ?;
                let now = std::time::Instant::now();
                match $crate::engine::poll_wait(&decision, call.poll_cap(), deadline, now) {
                    None => return Ok(decision),
                    Some(wait) => $sleep(wait) $($aw)*,
                }
            }
        }
    };

    // One of the calls on one bucket under the limiter's policy name.
    (
        @bucket [$($recv:tt)+] [$($asy:ident)?] [$($aw:tt)*]
        $(#[$doc:meta])* $name:ident $op:ident
    ) => {
        $(#[$doc])*
        pub $($asy)? fn $name(
            $($recv)+ self,
            key: &str,
            capacity: impl Into<f64>,
            rate: impl Into<f64>,
            n: impl Into<f64>,
        ) -> $crate::error::Result<$crate::decision::Decision> {
            let call = self.opts.single($crate::backend::Op::$op, key, capacity, rate, n)?;
            self.decide(&call) $($aw)*
        }
    };
}
pub(crate) use limiter_methods;

/// The lease methods of both limiters (docs/leases.md), expanded as
/// [`limiter_methods!`] is. Beyond what that one needs, they rest on the
/// driver's method `guard` (an acquire's outcome and when it was sent,
/// turned into a `Permit` of the guard type); the argument
/// `guard` names that type, and the doc line `guard_does` says what the
/// guard does while held and when dropped.
macro_rules! lease_methods {
    (
        receiver: [$($recv:tt)+],
        asyncness: [$($asy:ident)?],
        dot_await: [$($aw:tt)*],
        guard: $guard:ty,
        $(#[$guard_does:meta])* guard_does;
    ) => {
        /// Takes a lease on the lease set at `key` if fewer than `limit` are
        /// live; it ends by itself `lease_ms` after it was granted (server
        /// clock) unless released or renewed. The denial says when the earliest
        /// live lease ends by itself. An unavailable limiter is
        /// [`Error::Unavailable`](crate::Error::Unavailable), or, with
        /// [`with_lease_fail_open(true)`](Self::with_lease_fail_open), a
        /// failed-open decision (`acquired`, no `lease`, `failed_open`).
        pub $($asy)? fn acquire(
            $($recv)+ self,
            key: &str,
            limit: u64,
            lease_ms: u64,
        ) -> $crate::error::Result<$crate::lease::LeaseDecision> {
            let call = self.opts.acquire_call(key, limit, lease_ms)?;
            let outcome = self.run(&call) $($aw)*;
            let outcome = self.opts.lease_fail_open(&call, outcome);
            self.opts.metrics.leased(call.policy(), &outcome, false, false);
            outcome
        }

        /// Releases `lease` (an id, a [`LeaseDecision`](crate::LeaseDecision),
        /// or an `Option` of one): `true` if it was live, `false` if it was not
        /// (released already, expired, never handed out). Safe to repeat. No
        /// id (`None`: a denial's or a failed-open decision's) answers `false`
        /// without a call.
        pub $($asy)? fn release(
            $($recv)+ self,
            key: &str,
            lease: impl $crate::lease::LeaseId,
        ) -> $crate::error::Result<bool> {
            match $crate::lease::FlagCall::release(key, lease.lease_id())? {
                Some(call) => self.run(&call) $($aw)*,
                None => Ok(false),
            }
        }

        /// Makes the live `lease` end `lease_ms` from now: `true`, or `false`
        /// if it is not held (an expired lease cannot come back). No id answers
        /// `false` without a call.
        pub $($asy)? fn renew(
            $($recv)+ self,
            key: &str,
            lease: impl $crate::lease::LeaseId,
            lease_ms: u64,
        ) -> $crate::error::Result<bool> {
            match $crate::lease::FlagCall::renew(key, lease.lease_id(), lease_ms)? {
                Some(call) => self.run(&call) $($aw)*,
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
        pub $($asy)? fn wait_acquire(
            $($recv)+ self,
            key: &str,
            limit: u64,
            lease_ms: u64,
            timeout_ms: u64,
        ) -> $crate::error::Result<$crate::lease::LeaseDecision> {
            let call = self.opts.acquire_call(key, limit, lease_ms)?;
            let outcome = self.wait_acquire_call(&call, timeout_ms) $($aw)*;
            let outcome = self.opts.lease_fail_open(&call, outcome);
            self.opts.metrics.leased(call.policy(), &outcome, false, true);
            outcome
        }

        $($asy)? fn wait_acquire_call(
            $($recv)+ self,
            call: &$crate::lease::AcquireCall,
            timeout_ms: u64,
        ) -> $crate::error::Result<$crate::lease::LeaseDecision> {
            let probe = $crate::backend::Call::probe("redis-tb:connect")?;
            self.wait(call, &probe, timeout_ms) $($aw)*
        }

        /// [`acquire`](Self::acquire) as a guard: [`Permit::Held`](crate::Permit::Held),
        /// [`Permit::Denied`](crate::Permit::Denied), or, when the limiter is
        /// unavailable and [`with_lease_fail_open(true)`](Self::with_lease_fail_open),
        /// [`Permit::FailedOpen`](crate::Permit::FailedOpen).
        $(#[$guard_does])*
        pub $($asy)? fn acquire_guard(
            $($recv)+ self,
            key: &str,
            limit: u64,
            lease_ms: u64,
        ) -> $crate::error::Result<$crate::lease::Permit<$guard>> {
            let started = std::time::Instant::now();
            let call = self.opts.acquire_call(key, limit, lease_ms)?;
            let outcome = self.run(&call) $($aw)*;
            let fail_open = self.opts.lease_fail_open;
            self.opts.metrics.leased(call.policy(), &outcome, fail_open, false);
            self.guard(outcome, started)
        }

        /// [`wait_acquire`](Self::wait_acquire) as a guard, as
        /// [`acquire_guard`](Self::acquire_guard).
        pub $($asy)? fn wait_acquire_guard(
            $($recv)+ self,
            key: &str,
            limit: u64,
            lease_ms: u64,
            timeout_ms: u64,
        ) -> $crate::error::Result<$crate::lease::Permit<$guard>> {
            let call = self.opts.acquire_call(key, limit, lease_ms)?;
            let outcome = self.wait_acquire_call(&call, timeout_ms) $($aw)*;
            let fail_open = self.opts.lease_fail_open;
            self.opts.metrics.leased(call.policy(), &outcome, fail_open, true);
            // Granted during the wait, at most a round trip before its reply.
            self.guard(outcome, std::time::Instant::now())
        }
    };
}
pub(crate) use lease_methods;
