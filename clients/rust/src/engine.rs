//! The sans-IO engine: the backend choice with its retries as a state
//! machine over replies, judged by the one failure rule of [`crate::error`],
//! the waits' rules (polling, redirections), and the [`Shield`]: what is
//! answered without Redis (the denial cache, the local limiter during an
//! outage; their state is in [`crate::local`]).
//! The sync and async drivers only send what [`Exchange`] asks for and hand
//! back what the server answered.

use crate::backend::{self, emit, Backend, Line, Logger, Request, Resolved};
use crate::error::{classify, is_dropped, limiter_error, reply_text, Error, FailureClass, Result};
use crate::local::{now_ms, DenialCache, LocalLimiter, LocalSettings, Outage};
use redis::{Cmd, RedisError, Value};
use std::time::{Duration, Instant};

/// How often a limiter on Lua that has seen the module looks for it again.
pub(crate) const MODULE_RECHECK: Duration = Duration::from_secs(30);

/// What a limiter knows of the server between calls.
#[derive(Debug, Clone, Default)]
pub(crate) struct BackendState {
    pub forced: Option<Backend>,
    pub resolved: Option<Resolved>,
    seen_module: bool,
    checked_at: Option<Instant>,
}

/// Where a call starts.
#[derive(Debug, Clone)]
pub(crate) enum Plan {
    /// The backend is known.
    Use(Resolved),
    /// Detect it first (the first call, or after a server change).
    Detect,
    /// On Lua after having seen the module: look for the module first.
    Recheck(Resolved),
}

impl BackendState {
    pub fn forced(forced: Option<Backend>) -> BackendState {
        BackendState {
            forced,
            ..BackendState::default()
        }
    }

    pub fn backend(&self) -> Option<Backend> {
        self.resolved.as_ref().map(|r| r.backend)
    }

    pub fn plan(&self, now: Instant, recheck: Duration) -> Plan {
        match &self.resolved {
            None => Plan::Detect,
            Some(r)
                if self.forced.is_none()
                    && self.seen_module
                    && r.backend != Backend::Module
                    && self
                        .checked_at
                        .is_none_or(|at| now.duration_since(at) >= recheck) =>
            {
                Plan::Recheck(r.clone())
            }
            Some(r) => Plan::Use(r.clone()),
        }
    }

    /// Records what an exchange learned, and says what to log: the first
    /// choice (info), the module gone (warning), the module back (info).
    pub fn learn(&mut self, learned: Learned, now: Instant) -> Option<Line> {
        match learned {
            Learned::Checked => {
                self.checked_at = Some(now);
                None
            }
            Learned::Stale => {
                self.resolved = None;
                None
            }
            Learned::Backend(resolved, why) => {
                let before = self.backend();
                let after = resolved.backend;
                self.checked_at = Some(now);
                self.seen_module |= after == Backend::Module;
                self.resolved = Some(resolved);
                match before {
                    Some(b) if b == after => None,
                    Some(Backend::Module) => Some((
                        log::Level::Warn,
                        format!(
                            "redis-tb backend: the module is gone, going on with {after} ({why})"
                        ),
                    )),
                    Some(_) if after == Backend::Module => Some((
                        log::Level::Info,
                        format!("redis-tb backend: the module is back, moving to it ({why})"),
                    )),
                    // A Lua fallback chosen because the module is missing
                    // is a warning, as in the other two libraries; the
                    // module, or a backend the caller forced, is news.
                    _ if after != Backend::Module && why != backend::WHY_FORCED => Some((
                        log::Level::Warn,
                        format!("redis-tb backend: {after} ({why})"),
                    )),
                    _ => Some((
                        log::Level::Info,
                        format!("redis-tb backend: {after} ({why})"),
                    )),
                }
            }
        }
    }
}

/// What an exchange found out about the server.
#[derive(Debug, Clone)]
pub(crate) enum Learned {
    Backend(Resolved, String),
    /// Looked for the module and it is still not there.
    Checked,
    /// The backend must be detected again (a wait found the module gone).
    Stale,
}

#[derive(Debug, Clone)]
enum Phase {
    CommandInfo { recheck: Option<Resolved> },
    FunctionLoad { forced: bool },
    ScriptLoad { why: String },
    Call(Resolved),
}

/// What the driver does next.
pub(crate) enum Step<T> {
    /// Send this command and give the reply to [`Exchange::on_reply`].
    Send(Cmd),
    /// The call's outcome.
    Done(Result<T>),
}

/// One limiter call, from the backend choice to the decision: detection,
/// one retry after a server change, and the failure rule.
pub(crate) struct Exchange<'a, R: Request> {
    call: &'a R,
    forced: Option<Backend>,
    phase: Phase,
    retried: bool,
    /// The command in flight is the script's full text (EVAL), not EVALSHA.
    eval: bool,
    /// The call was sent again after a dropped connection (once at most).
    resent: bool,
    /// What to record in the limiter's [`BackendState`] when done (in order).
    pub learned: Vec<Learned>,
}

impl<'a, R: Request> Exchange<'a, R> {
    pub fn start(
        call: &'a R,
        forced: Option<Backend>,
        plan: Plan,
    ) -> (Exchange<'a, R>, Step<R::Output>) {
        let mut ex = Exchange {
            call,
            forced,
            phase: Phase::CommandInfo { recheck: None },
            retried: false,
            eval: false,
            resent: false,
            learned: Vec::new(),
        };
        let step = match plan {
            Plan::Use(resolved) => ex.send_call(resolved),
            Plan::Recheck(resolved) => ex.go(
                Phase::CommandInfo {
                    recheck: Some(resolved),
                },
                backend::command_info(),
            ),
            Plan::Detect => ex.detect(),
        };
        (ex, step)
    }

    fn go(&mut self, phase: Phase, cmd: Cmd) -> Step<R::Output> {
        self.phase = phase;
        Step::Send(cmd)
    }

    fn detect(&mut self) -> Step<R::Output> {
        match self.forced {
            Some(Backend::Module) => self.learn(
                Resolved::new(Backend::Module, None),
                backend::WHY_FORCED.into(),
            ),
            Some(Backend::Function) => self.go(
                Phase::FunctionLoad { forced: true },
                backend::function_load(),
            ),
            Some(Backend::Script) => self.go(
                Phase::ScriptLoad {
                    why: backend::WHY_FORCED.into(),
                },
                backend::script_load(),
            ),
            None => self.go(
                Phase::CommandInfo { recheck: None },
                backend::command_info(),
            ),
        }
    }

    /// No module: the Lua backend already in use (a recheck), or the
    /// function library.
    fn without_module(&mut self, recheck: Option<Resolved>) -> Step<R::Output> {
        match recheck {
            Some(resolved) => {
                self.learned.push(Learned::Checked);
                self.send_call(resolved)
            }
            // In a cluster FUNCTION LOAD goes to every primary, and FCALL is
            // routed by its key.
            None => self.go(
                Phase::FunctionLoad { forced: false },
                backend::function_load(),
            ),
        }
    }

    fn learn(&mut self, resolved: Resolved, why: String) -> Step<R::Output> {
        self.learned.push(Learned::Backend(resolved.clone(), why));
        self.send_call(resolved)
    }

    fn send_call(&mut self, resolved: Resolved) -> Step<R::Output> {
        self.eval = false;
        let cmd = self.call.command(&resolved, false);
        self.go(Phase::Call(resolved), cmd)
    }

    /// The command of the phase in flight, to send again on a new connection.
    fn resend(&mut self) -> Step<R::Output> {
        self.resent = true;
        Step::Send(match &self.phase {
            Phase::CommandInfo { .. } => backend::command_info(),
            Phase::FunctionLoad { .. } => backend::function_load(),
            Phase::ScriptLoad { .. } => backend::script_load(),
            Phase::Call(resolved) => self.call.command(resolved, self.eval),
        })
    }

    pub fn on_reply(&mut self, reply: std::result::Result<Value, RedisError>) -> Step<R::Output> {
        let phase = self.phase.clone();
        let error = match reply {
            Ok(value) => return self.on_value(phase, &value),
            Err(e) => e,
        };
        let class = classify(&error);
        if class == FailureClass::Unavailable {
            // A dropped connection is not an outage: the driver's next
            // command goes out on a new one. Once, and only for calls that
            // may run twice (not a refund or a settle).
            if is_dropped(&error) && !self.resent && self.call.resend_on_drop() {
                return self.resend();
            }
            return Step::Done(Err(limiter_error(&error)));
        }
        match phase {
            // The server refused COMMAND INFO (an ACL without `command`): it
            // tells nothing of the module, so the Lua backend is tried, as in
            // the Python and Node libraries (docs/clients.md).
            Phase::CommandInfo { recheck } => self.without_module(recheck),
            Phase::ScriptLoad { .. } => Step::Done(Err(limiter_error(&error))),
            Phase::FunctionLoad { forced: true } => Step::Done(Err(limiter_error(&error))),
            // FUNCTION is missing (Redis < 7) or refused: the script works everywhere.
            Phase::FunctionLoad { forced: false } => self.go(
                Phase::ScriptLoad {
                    why: format!(
                        "the module is not loaded; FUNCTION LOAD failed ({}): EVALSHA",
                        reply_text(&error).unwrap_or_else(|| error.to_string())
                    ),
                },
                backend::script_load(),
            ),
            Phase::Call(resolved) if class == FailureClass::ServerChanged && !self.retried => {
                self.retried = true;
                if resolved.backend == Backend::Script
                    && reply_text(&error).is_some_and(|r| r.starts_with("NOSCRIPT"))
                {
                    // EVAL with the whole text also caches it on the node
                    // that answered (in a cluster, scripts are per node).
                    self.eval = true;
                    let cmd = self.call.command(&resolved, true);
                    return self.go(Phase::Call(resolved), cmd);
                }
                self.detect()
            }
            Phase::Call(_) => Step::Done(Err(limiter_error(&error))),
        }
    }

    fn on_value(&mut self, phase: Phase, value: &Value) -> Step<R::Output> {
        match phase {
            Phase::CommandInfo { recheck } => {
                if backend::command_info_has_entry(value) {
                    return self.learn(
                        Resolved::new(Backend::Module, None),
                        backend::WHY_MODULE.into(),
                    );
                }
                self.without_module(recheck)
            }
            Phase::FunctionLoad { forced } => {
                let why = if forced {
                    backend::WHY_FORCED
                } else {
                    backend::WHY_FUNCTION
                };
                self.learn(Resolved::new(Backend::Function, None), why.into())
            }
            Phase::ScriptLoad { why } => {
                let sha = backend::sha_of(value);
                self.learn(Resolved::new(Backend::Script, sha), why)
            }
            Phase::Call(_) => Step::Done(self.call.parse(value)),
        }
    }
}

/// What a limiter answers without a round trip: the denial cache
/// (`cache_denials`), and with [`OnUnavailable::Local`](crate::OnUnavailable::Local)
/// the local limiter, which answers during an [`Outage`] (while Redis is
/// unreachable, probing it again every `probe_ms`). Both drivers ask it
/// before a call (`before`) and give it the call's outcome (`after`).
/// `Shield` in all three libraries; shared by a limiter's clones and by a
/// middleware made from it.
#[derive(Default)]
pub(crate) struct Shield {
    pub local: LocalLimiter,
    pub denials: DenialCache,
    pub outage: Outage,
}

impl Shield {
    /// The answer given without a round trip, if there is one: a cached
    /// denial, or (in an outage, before its next probe) the local limiter's
    /// answer or `Unavailable`. `None`: send the call.
    pub fn before<R: Request>(
        &self,
        settings: &LocalSettings,
        call: &R,
    ) -> Option<Result<R::Output>> {
        if !settings.cache_denials && !settings.local() {
            return None;
        }
        let now = now_ms();
        if settings.cache_denials {
            if let Some(denied) = call.cached(&self.denials, settings, now) {
                return Some(Ok(denied));
            }
        }
        if settings.local() && !self.outage.should_send(settings.probe_ms, now) {
            return Some(self.locally(
                settings,
                call,
                now,
                "Redis unreachable: waiting to probe it again",
            ));
        }
        None
    }

    /// The server's `outcome` of `call`, through the outage and the denial
    /// cache: an unreachable Redis answered locally (with `local`), a
    /// reachable one ending the outage, a denial kept.
    pub fn after<R: Request>(
        &self,
        settings: &LocalSettings,
        logger: &Option<Logger>,
        call: &R,
        outcome: Result<R::Output>,
    ) -> Result<R::Output> {
        match outcome {
            Err(Error::Unavailable(reason)) if settings.local() => {
                let now = now_ms();
                if self.outage.failed(settings.probe_ms, now) {
                    let line = format!(
                        "redis-tb: Redis unreachable ({reason}); limiting in process at 1/{} of each limit",
                        settings.instances.max(1)
                    );
                    emit(logger, log::Level::Warn, &line);
                }
                self.locally(settings, call, now, &reason)
            }
            Err(Error::Unavailable(reason)) => Err(Error::Unavailable(reason)),
            outcome => {
                if settings.local() && self.outage.succeeded() {
                    self.local.clear();
                    emit(
                        logger,
                        log::Level::Warn,
                        "redis-tb: Redis reachable again; limits come from Redis",
                    );
                }
                if let (true, Ok(answer)) = (settings.cache_denials, &outcome) {
                    call.observe(answer, &self.denials, settings, now_ms());
                }
                outcome
            }
        }
    }

    /// The local limiter's answer to `call`, or `Unavailable` for a call it
    /// does not serve.
    fn locally<R: Request>(
        &self,
        settings: &LocalSettings,
        call: &R,
        now: i64,
        reason: &str,
    ) -> Result<R::Output> {
        call.local(&self.local, settings, now)
            .ok_or_else(|| Error::Unavailable(reason.to_string()))
    }
}

/// Logged once by a limiter whose `wait_take` or `wait_acquire` polls
/// although the module is there.
pub(crate) const POLLING_NOTE: &str =
    "redis-tb: wait_take and wait_acquire: polls (not FIFO): no client for a dedicated blocking connection";

/// The answer of a call that a wait repeats: done, or worth another try in
/// so many ms.
pub(crate) trait Awaited {
    /// `None`: done (granted, or it can never be). `Some(ms)`: try again in `ms`.
    fn retry_in(&self) -> Option<Duration>;
    /// A reservation's grant: how long to sleep before acting (`None`: at once).
    fn reserved_for(&self) -> Option<Duration> {
        None
    }
    /// The answer once its reservation's sleep is over: nothing left to
    /// wait, and times counted from the sleep's end.
    fn waited(self) -> Self
    where
        Self: Sized,
    {
        self
    }
}

impl Awaited for crate::decision::Decision {
    fn retry_in(&self) -> Option<Duration> {
        if self.allowed || self.retry_after_ms < 0 {
            return None;
        }
        Some(Duration::from_millis(self.retry_after_ms.unsigned_abs()))
    }
    fn reserved_for(&self) -> Option<Duration> {
        (self.wait_ms() > 0).then(|| Duration::from_millis(self.wait_ms()))
    }
    /// A grant's reset counts from the sleep's end, as TB.BTAKE counts it
    /// from its grant: the reservation's reply counts from the reservation.
    fn waited(mut self) -> Self {
        if self.allowed {
            self.reset_after_ms = self.reset_after_ms.saturating_sub(self.wait_ms());
            self.retry_after_ms = 0;
        }
        self
    }
}

/// When a wait of `timeout_ms` from now ends (0: never).
pub(crate) fn deadline_after(timeout_ms: u64) -> Option<Instant> {
    match timeout_ms {
        0 => None,
        ms => Instant::now().checked_add(Duration::from_millis(ms)),
    }
}

/// How long a polling wait sleeps after `answer`, or `None` when it is done
/// (granted, never possible, or out of time): `min(retry, cap, time left)`,
/// the retry at least 1 ms.
pub(crate) fn poll_wait(
    answer: &impl Awaited,
    cap: Option<Duration>,
    deadline: Option<Instant>,
    now: Instant,
) -> Option<Duration> {
    let retry = answer.retry_in()?.max(Duration::from_millis(1));
    let wait = cap.map_or(retry, |cap| retry.min(cap));
    match deadline {
        None => Some(wait),
        Some(deadline) => {
            let left = deadline.saturating_duration_since(now);
            (!left.is_zero()).then(|| wait.min(left))
        }
    }
}

/// Where the error reply `e` sends a command, if it is a `MOVED` or `ASK`.
pub(crate) fn redirection(e: &RedisError) -> Option<(bool, String)> {
    reply_text(e).and_then(|reply| redirect(&reply))
}

/// Where a `MOVED` or `ASK` reply sends a command: `(ask, "host:port")`.
fn redirect(reply: &str) -> Option<(bool, String)> {
    let mut words = reply.split_ascii_whitespace();
    let ask = match words.next()? {
        "MOVED" => false,
        "ASK" => true,
        _ => return None,
    };
    let _slot = words.next()?;
    Some((ask, words.next()?.to_string()))
}

/// A client for the node at `addr` (`host:port`), with `seed`'s settings
/// (database, user, password).
pub(crate) fn client_at(seed: &redis::Client, addr: Option<&str>) -> Result<redis::Client> {
    let mut info = seed.get_connection_info().clone();
    if let Some(addr) = addr {
        let (host, port) = addr
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h.to_string(), p.parse::<u16>().ok()?)))
            .ok_or_else(|| Error::Other(format!("bad redirect address {addr}")))?;
        info = info.set_addr(redis::ConnectionAddr::Tcp(host, port));
    }
    Ok(redis::Client::open(info)?)
}

/// How many `MOVED`/`ASK` a wait follows before it gives up.
pub(crate) const MAX_REDIRECTIONS: usize = 5;

/// The error of a call that hit the limiter's own time bound (async only:
/// the sync connections carry their timeouts themselves).
#[cfg(feature = "tokio")]
pub(crate) fn timed_out(started: Instant, limit: Duration) -> Error {
    Error::Unavailable(format!(
        "timed out after {} ms",
        started.elapsed().max(limit).as_millis()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redirects_name_the_node() {
        assert_eq!(
            redirect("MOVED 3999 127.0.0.1:6381"),
            Some((false, "127.0.0.1:6381".into()))
        );
        assert_eq!(
            redirect("ASK 3999 10.0.0.1:7000"),
            Some((true, "10.0.0.1:7000".into()))
        );
        assert_eq!(redirect("ERR nope"), None);
    }
}
