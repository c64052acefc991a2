//! The shared conformance suite, clients/conformance/cases.json
//! (docs/clients.md#the-conformance-suite): every case on every backend and
//! topology it lists, through the sync and the async limiter.
//!
//! Translations for Rust: `timeout_ms` is a `u64` of ms; a call's `policy`
//! is the limiter's `with_policy_name` (take, peek, refund, wait_take) or
//! the `Limit`'s name (take_all); error classes are `Error` variants.
//!
//! The lease cases, clients/conformance/leases.json, run the same way
//! (acquire, wait_acquire, release, renew; `save`, `"$name"`, `result`,
//! `id_count`), with these translations: `limit`, `lease_ms` and
//! `timeout_ms` are `u64`, so a number that is not one (1.5, -5, -1) cannot
//! be passed at all: the type refuses it before anything is sent, which is
//! what such a case's `invalid_argument` asks (the runner checks that the
//! case expects exactly that); `policy` is the limiter's `with_policy_name`;
//! the `Lease` is a `LeaseDecision`; in a cluster the limiters get a
//! blocking client, so `wait_acquire` on the module is TB.ACQUIRE with a
//! timeout on the slot owner (following `MOVED`).
//!
//! The resend cases, clients/conformance/resend.json, run each case on one
//! limiter per driver, with `kill_clients` between its calls (below).

use crate::api::GENEROUS;
use crate::common::*;
use redis_tb_client::{
    bucket_key, classify_reply, AsyncRateLimiter, Decision, Error, FailureClass, LeaseDecision,
    Limit, RateLimiter, TakeOptions,
};
use serde_json::Value as Json;
use std::collections::HashMap;

/// `$sync` with `$l` a `&mut RateLimiter`, or `$async` with `$l` an
/// `&AsyncRateLimiter`, on `$env` under the policy name `$policy`: the
/// driver × topology limiter every runner needs (a cluster one with node 0
/// as its blocking client). A macro, because the four limiters have four
/// types.
macro_rules! on_limiter {
    ($env:expr, $driver:expr, $rt:expr, $policy:expr, |$l:ident| $sync:expr, $async:expr) => {
        if $driver == "sync" {
            match $env {
                Env::Standalone(s) => {
                    let $l = &mut RateLimiter::from_client(s.client(), GENEROUS)
                        .with_policy_name($policy);
                    $sync
                }
                Env::Cluster(c) => {
                    let $l = &mut RateLimiter::new(c.client().get_connection().unwrap())
                        .with_blocking_client(c.nodes[0].client())
                        .with_timeouts(GENEROUS)
                        .with_policy_name($policy);
                    $sync
                }
            }
        } else {
            $rt.block_on(async {
                match $env {
                    Env::Standalone(s) => {
                        let $l = &AsyncRateLimiter::from_client(s.client(), GENEROUS)
                            .with_policy_name($policy);
                        $async
                    }
                    Env::Cluster(c) => {
                        let con = c.client().get_async_connection().await.unwrap();
                        let $l = &AsyncRateLimiter::new(con)
                            .with_blocking_client(c.nodes[0].client())
                            .with_timeouts(GENEROUS)
                            .with_policy_name($policy);
                        $async
                    }
                }
            })
        }
    };
    // `sync(l, arg)` or `async(l, arg)` on a limiter with the call's policy
    // (`default` where it names none).
    ($env:expr, $driver:expr, $rt:expr, $call:expr => $sync:ident, $async:ident($arg:expr)) => {
        on_limiter!(
            $env,
            $driver,
            $rt,
            $call["policy"].as_str().unwrap_or("default"),
            |l| $sync(l, $arg),
            $async(l, $arg).await
        )
    };
}

/// The cases of clients/conformance/`file`, whose version this runner knows.
fn cases_of(file: &str) -> Vec<Json> {
    let path = repo_root().join("clients/conformance").join(file);
    let doc: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(doc["version"], 1, "a version of {file} this runner knows");
    doc["cases"].as_array().unwrap().clone()
}

/// A runner's four tests: the module and lua, standalone and in a cluster;
/// each asserts that some case ran there.
macro_rules! on_every_backend {
    ($run:ident: $module_standalone:ident, $lua_standalone:ident, $module_cluster:ident, $lua_cluster:ident) => {
        on_every_backend!(@one $module_standalone: $run("module", "standalone"));
        on_every_backend!(@one $lua_standalone: $run("lua", "standalone"));
        on_every_backend!(@one $module_cluster: $run("module", "cluster"));
        on_every_backend!(@one $lua_cluster: $run("lua", "cluster"));
    };
    (@one $test:ident: $run:ident($backend:literal, $topology:literal)) => {
        #[test]
        fn $test() {
            assert!($run($backend, $topology, &runtime()) > 0);
        }
    };
}

fn cases() -> Vec<Json> {
    cases_of("cases.json")
}

fn lists(case: &Json, field: &str, value: &str) -> bool {
    case[field].as_array().unwrap().iter().any(|v| v == value)
}

fn num(call: &Json, field: &str) -> f64 {
    call[field]
        .as_f64()
        .unwrap_or_else(|| panic!("{field} in {call}"))
}

fn text(call: &Json, field: &str) -> String {
    call[field]
        .as_str()
        .unwrap_or_else(|| panic!("{field} in {call}"))
        .to_string()
}

/// The servers of one backend and topology.
enum Env {
    Standalone(Server),
    Cluster(Cluster),
}

impl Env {
    fn start(backend: &str, topology: &str) -> Env {
        let module = backend == "module";
        match topology {
            "standalone" => Env::Standalone(Server::start(module, &[])),
            "cluster" => Env::Cluster(Cluster::start(module)),
            other => panic!("unknown topology {other}"),
        }
    }

    fn nodes(&self) -> Vec<&Server> {
        match self {
            Env::Standalone(s) => vec![s],
            Env::Cluster(c) => c.nodes.iter().collect(),
        }
    }

    /// Empties every node and runs a case's setup commands (routed by key in a cluster).
    fn prepare(&self, case: &Json) {
        for node in self.nodes() {
            let _: () = redis::cmd("FLUSHALL").query(&mut node.conn()).unwrap();
        }
        for command in case["setup"].as_array().into_iter().flatten() {
            let words: Vec<String> = command
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap().to_string())
                .collect();
            let cmd = redis::cmd(&words[0]).arg(&words[1..]).clone();
            let _: redis::Value = match self {
                Env::Standalone(s) => cmd.query(&mut s.conn()).unwrap(),
                Env::Cluster(c) => cmd
                    .query(&mut c.client().get_connection().unwrap())
                    .unwrap(),
            };
        }
    }

    fn slot(&self, key: &str) -> Option<u16> {
        match self {
            Env::Standalone(_) => None,
            Env::Cluster(c) => Some(
                redis::cmd("CLUSTER")
                    .arg("KEYSLOT")
                    .arg(key)
                    .query(&mut c.nodes[0].conn())
                    .unwrap(),
            ),
        }
    }
}

/// One limiter call the runner can make on either driver.
enum Call {
    Take(String, f64, f64, f64),
    Peek(String, f64, f64, f64),
    Refund(String, f64, f64, f64),
    WaitTake(String, f64, f64, f64, u64),
    TakeAll(Vec<Limit>),
}

fn limit_call(call: &Json) -> Call {
    let single = || {
        (
            text(call, "key"),
            num(call, "capacity"),
            num(call, "rate"),
            num(call, "n"),
        )
    };
    match call["op"].as_str().unwrap() {
        "take" => {
            let (k, c, r, n) = single();
            Call::Take(k, c, r, n)
        }
        "peek" => {
            let (k, c, r, n) = single();
            Call::Peek(k, c, r, n)
        }
        "refund" => {
            let (k, c, r, n) = single();
            Call::Refund(k, c, r, n)
        }
        "wait_take" => {
            let (k, c, r, n) = single();
            Call::WaitTake(k, c, r, n, call["timeout_ms"].as_u64().unwrap())
        }
        "take_all" => Call::TakeAll(
            call["limits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    let limit = Limit::new(text(l, "key"), num(l, "capacity"), num(l, "rate"))
                        .cost(num(l, "n"));
                    match l["policy"].as_str() {
                        Some(name) => limit.name(name),
                        None => limit,
                    }
                })
                .collect(),
        ),
        other => panic!("unknown op {other} in {call}"),
    }
}

fn sync_call<C: redis::ConnectionLike>(
    l: &mut RateLimiter<C>,
    call: &Call,
) -> Result<Decision, Error> {
    match call {
        Call::Take(k, c, r, n) => l.take(k, *c, *r, *n),
        Call::Peek(k, c, r, n) => l.peek(k, *c, *r, *n),
        Call::Refund(k, c, r, n) => l.refund(k, *c, *r, *n),
        Call::WaitTake(k, c, r, n, t) => l.wait_take(k, *c, *r, *n, *t),
        Call::TakeAll(limits) => l.take_all(limits),
    }
}

async fn async_call<C>(l: &AsyncRateLimiter<C>, call: &Call) -> Result<Decision, Error>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    match call {
        Call::Take(k, c, r, n) => l.take(k, *c, *r, *n).await,
        Call::Peek(k, c, r, n) => l.peek(k, *c, *r, *n).await,
        Call::Refund(k, c, r, n) => l.refund(k, *c, *r, *n).await,
        Call::WaitTake(k, c, r, n, t) => l.wait_take(k, *c, *r, *n, *t).await,
        Call::TakeAll(limits) => l.take_all(limits).await,
    }
}

/// A sync limiter, whatever its connection type.
type SyncDriver<'a> = Box<dyn FnMut(&Call) -> Result<Decision, Error> + 'a>;

/// A number, or a `[low, high]` range.
fn matches_number(expected: &Json, actual: f64) -> bool {
    match expected {
        Json::Array(range) => {
            range[0].as_f64().unwrap() <= actual && actual <= range[1].as_f64().unwrap()
        }
        n => n.as_f64() == Some(actual),
    }
}

/// A call that must fail with the case's error class and message start.
fn check_error<T: std::fmt::Debug>(call: &Json, outcome: Result<T, Error>, at: &str) {
    let class = call["error"].as_str().unwrap();
    let e = match outcome {
        Err(e) => e,
        Ok(answer) => panic!("{at}: expected {class}, got {answer:?}"),
    };
    let (actual, message) = match &e {
        Error::InvalidArgument(m) => ("invalid_argument", m.clone()),
        Error::Unavailable(m) => ("unavailable", m.clone()),
        Error::Reply(m) => ("reply", m.clone()),
        Error::Other(m) => ("other", m.clone()),
    };
    assert_eq!(actual, class, "{at}: {e}");
    let start = call["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with(start),
        "{at}: {message:?} starts with {start:?}"
    );
}

fn check(call: &Json, outcome: Result<Decision, Error>, at: &str) {
    if call["error"].is_string() {
        return check_error(call, outcome, at);
    }
    let d = outcome.unwrap_or_else(|e| panic!("{at}: {e}"));
    for (field, expected) in call["decision"].as_object().into_iter().flatten() {
        let ok = match field.as_str() {
            "allowed" => expected.as_bool() == Some(d.allowed),
            "remaining" => matches_number(expected, d.remaining as f64),
            "retry_after_ms" => matches_number(expected, d.retry_after_ms as f64),
            "reset_after_ms" => matches_number(expected, d.reset_after_ms as f64),
            "index" => expected.as_u64().map(|i| i as usize) == d.index,
            "policy" => expected.as_str() == Some(d.policy.as_str()),
            "capacity" => matches_number(expected, d.capacity),
            "rate" => matches_number(expected, d.rate),
            other => panic!("{at}: unknown decision field {other}"),
        };
        assert!(ok, "{at}: {field} should be {expected}: {d:?}");
    }
    let headers = d.headers();
    for (name, expected) in call["headers"].as_object().into_iter().flatten() {
        let actual = headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str());
        assert_eq!(actual, expected.as_str(), "{at}: header {name}");
    }
}

/// The calls that need no limiter: the key scheme and the failure rule.
fn check_pure(env: &Env, call: &Json, at: &str) -> bool {
    match call["op"].as_str().unwrap() {
        "keys" => {
            let (prefix, id) = (text(call, "prefix"), text(call, "id"));
            let keys: Vec<String> = call["policies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| bucket_key(&prefix, &id, p.as_str().unwrap()))
                .collect();
            assert_eq!(serde_json::json!(keys), call["expect"], "{at}");
            if let Some(first) = env.slot(&keys[0]) {
                for key in &keys {
                    assert_eq!(env.slot(key), Some(first), "{at}: {keys:?} share a slot");
                }
            }
            true
        }
        "classify" => {
            let class = match classify_reply(&text(call, "reply")) {
                FailureClass::Unavailable => "unavailable",
                FailureClass::ServerChanged => "server_changed",
                FailureClass::Bug => "bug",
            };
            assert_eq!(class, call["class"], "{at}");
            true
        }
        _ => false,
    }
}

/// In a cluster, every id of a `keys` call must also take from all its
/// buckets at once (no CROSSSLOT).
fn keys_take_all(call: &Json) -> Option<Call> {
    (call["op"] == "keys").then(|| {
        let (prefix, id) = (text(call, "prefix"), text(call, "id"));
        Call::TakeAll(
            call["policies"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| Limit::new(bucket_key(&prefix, &id, p.as_str().unwrap()), 5, SLOW))
                .collect(),
        )
    })
}

/// Runs `each` once per driver on every one of `cases` that lists this backend and topology,
/// on servers prepared for it: how many runs there were.
fn run_cases(
    env: &Env,
    backend: &str,
    topology: &str,
    cases: &[Json],
    mut each: impl FnMut(&str, &Json),
) -> usize {
    let mut ran = 0;
    for driver in ["sync", "async"] {
        for case in cases {
            if lists(case, "backends", backend) && lists(case, "topologies", topology) {
                env.prepare(case);
                each(driver, case);
                ran += 1;
            }
        }
    }
    ran
}

/// The call's arguments, or None where one is a number Rust's types cannot pass: the type
/// refuses it before anything is sent, so the case must expect that refusal.
fn passable<T>(call: &Json, parsed: Result<T, String>, at: &str) -> Option<T> {
    match parsed {
        Ok(arguments) => Some(arguments),
        Err(number) => {
            assert_eq!(
                call["error"], "invalid_argument",
                "{at}: {number} cannot be passed in Rust, so the case must refuse it"
            );
            None
        }
    }
}

fn run_env(backend: &str, topology: &str, rt: &tokio::runtime::Runtime) -> usize {
    let env = Env::start(backend, topology);
    run_cases(&env, backend, topology, &cases(), |driver, case| {
        let name = case["name"].as_str().unwrap();
        let sync = |policy: Option<&str>| -> SyncDriver<'_> {
            let name = policy.unwrap_or("default").to_string();
            match &env {
                Env::Standalone(s) => {
                    let mut l =
                        RateLimiter::from_client(s.client(), GENEROUS).with_policy_name(name);
                    Box::new(move |c| sync_call(&mut l, c))
                }
                Env::Cluster(c) => {
                    let mut l = RateLimiter::new(c.client().get_connection().unwrap())
                        .with_policy_name(name);
                    Box::new(move |c| sync_call(&mut l, c))
                }
            }
        };
        let mut plain = sync(None);
        for (i, call) in case["calls"].as_array().unwrap().iter().enumerate() {
            let at = format!("{backend}/{topology}/{driver}: {name:?} call {i}");
            if check_pure(&env, call, &at) {
                if let (Env::Cluster(_), Some(all)) = (&env, keys_take_all(call)) {
                    let d = plain(&all).unwrap_or_else(|e| panic!("{at}: take_all: {e}"));
                    assert!(d.allowed, "{at}: {d:?}");
                }
                continue;
            }
            let limit = limit_call(call);
            let policy = call["policy"].as_str();
            let outcome = if driver == "sync" {
                match policy {
                    Some(_) => sync(policy)(&limit),
                    None => plain(&limit),
                }
            } else {
                rt.block_on(async {
                    let name = policy.unwrap_or("default");
                    match &env {
                        Env::Standalone(s) => {
                            let l = AsyncRateLimiter::from_client(s.client(), GENEROUS)
                                .with_policy_name(name);
                            async_call(&l, &limit).await
                        }
                        Env::Cluster(c) => {
                            let con = c.client().get_async_connection().await.unwrap();
                            let l = AsyncRateLimiter::new(con)
                                .with_timeouts(GENEROUS)
                                .with_policy_name(name);
                            async_call(&l, &limit).await
                        }
                    }
                })
            };
            check(call, outcome, &at);
        }
    })
}

fn lease_cases() -> Vec<Json> {
    cases_of("leases.json")
}

/// One lease call the runner can make on either driver.
enum LeaseCall {
    Acquire(String, u64, u64),
    WaitAcquire(String, u64, u64, u64),
    Release(String, String),
    Renew(String, String, u64),
}

/// What a lease call answers.
#[derive(Debug)]
enum LeaseAnswer {
    Lease(LeaseDecision),
    Flag(bool),
}

/// A `u64` argument, or `Err` with the number a `u64` cannot hold.
fn whole(call: &Json, field: &str) -> Result<u64, String> {
    let v = &call[field];
    assert!(v.is_number(), "{field} in {call}");
    v.as_u64().ok_or_else(|| format!("{field} = {v}"))
}

/// The call, or `Err` when one of its numbers is not a `u64` (the type refuses it).
fn lease_call(call: &Json, saved: &HashMap<String, String>) -> Result<LeaseCall, String> {
    let key = text(call, "key");
    let lease = || {
        let lease = text(call, "lease");
        match lease.strip_prefix('$') {
            Some(name) => saved
                .get(name)
                .unwrap_or_else(|| panic!("no saved lease {name:?} for {call}"))
                .clone(),
            None => lease,
        }
    };
    Ok(match call["op"].as_str().unwrap() {
        "acquire" => LeaseCall::Acquire(key, whole(call, "limit")?, whole(call, "lease_ms")?),
        "wait_acquire" => LeaseCall::WaitAcquire(
            key,
            whole(call, "limit")?,
            whole(call, "lease_ms")?,
            whole(call, "timeout_ms")?,
        ),
        "release" => LeaseCall::Release(key, lease()),
        "renew" => LeaseCall::Renew(key, lease(), whole(call, "lease_ms")?),
        other => panic!("the runner does not know the op {other} in {call}"),
    })
}

fn sync_lease<C: redis::ConnectionLike>(
    l: &mut RateLimiter<C>,
    call: &LeaseCall,
) -> Result<LeaseAnswer, Error> {
    Ok(match call {
        LeaseCall::Acquire(k, n, ms) => LeaseAnswer::Lease(l.acquire(k, *n, *ms)?),
        LeaseCall::WaitAcquire(k, n, ms, t) => LeaseAnswer::Lease(l.wait_acquire(k, *n, *ms, *t)?),
        LeaseCall::Release(k, id) => LeaseAnswer::Flag(l.release(k, id)?),
        LeaseCall::Renew(k, id, ms) => LeaseAnswer::Flag(l.renew(k, id, *ms)?),
    })
}

async fn async_lease<C>(l: &AsyncRateLimiter<C>, call: &LeaseCall) -> Result<LeaseAnswer, Error>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    Ok(match call {
        LeaseCall::Acquire(k, n, ms) => LeaseAnswer::Lease(l.acquire(k, *n, *ms).await?),
        LeaseCall::WaitAcquire(k, n, ms, t) => {
            LeaseAnswer::Lease(l.wait_acquire(k, *n, *ms, *t).await?)
        }
        LeaseCall::Release(k, id) => LeaseAnswer::Flag(l.release(k, id).await?),
        LeaseCall::Renew(k, id, ms) => LeaseAnswer::Flag(l.renew(k, id, *ms).await?),
    })
}

/// `<ms>-<n>-<incarnation>`: the shape of a lease id (docs/leases.md#lease-ids; every case
/// makes its sets anew); its `<n>`.
fn lease_id_count(id: &str) -> Option<u64> {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match id.split('-').collect::<Vec<_>>()[..] {
        [ms, n, incarnation] if digits(ms) && digits(n) && digits(incarnation) => n.parse().ok(),
        _ => None,
    }
}

fn check_lease(
    call: &Json,
    outcome: Result<LeaseAnswer, Error>,
    saved: &mut HashMap<String, String>,
    at: &str,
) {
    if call["error"].is_string() {
        return check_error(call, outcome.map(|_| ()), at);
    }
    let answer = outcome.unwrap_or_else(|e| panic!("{at}: {e}"));
    if let Some(result) = call.get("result") {
        assert!(
            matches!(answer, LeaseAnswer::Flag(f) if Some(f) == result.as_bool()),
            "{at}: should answer {result}: {answer:?}"
        );
    }
    let LeaseAnswer::Lease(d) = answer else {
        assert!(
            call.get("decision").is_none() && call.get("save").is_none(),
            "{at}: a release or renew has no decision"
        );
        return;
    };
    if let Some(name) = call["save"].as_str() {
        let id = d
            .lease
            .clone()
            .unwrap_or_else(|| panic!("{at}: no id to save: {d:?}"));
        saved.insert(name.to_string(), id);
    }
    if let Some(count) = call.get("id_count") {
        let id = d
            .lease
            .as_deref()
            .unwrap_or_else(|| panic!("{at}: no id: {d:?}"));
        assert_eq!(lease_id_count(id), count.as_u64(), "{at}: id_count of {id}");
    }
    for (field, expected) in call["decision"].as_object().into_iter().flatten() {
        let ok = match field.as_str() {
            "acquired" => expected.as_bool() == Some(d.acquired),
            "available" => matches_number(expected, d.available as f64),
            "retry_after_ms" => matches_number(expected, d.retry_after_ms as f64),
            "lease" => match (expected, d.lease.as_deref()) {
                (Json::Null, None) => true,
                (Json::String(shape), Some(id)) if shape == "<id>" => lease_id_count(id).is_some(),
                (Json::String(want), Some(id)) => want == id,
                _ => false,
            },
            "failed_open" => expected.as_bool() == Some(d.failed_open),
            "policy" => expected.as_str() == Some(d.policy.as_str()),
            "limit" => matches_number(expected, d.limit as f64),
            "lease_ms" => matches_number(expected, d.lease_ms as f64),
            other => panic!("{at}: the runner does not know the field {other}"),
        };
        assert!(ok, "{at}: {field} should be {expected}: {d:?}");
    }
    if let Some(expected) = call["headers"].as_object() {
        // All of them, exactly: the shared lease headers, and no others.
        let actual: serde_json::Map<String, Json> = d
            .headers()
            .into_iter()
            .map(|(n, v)| (n.to_string(), Json::String(v)))
            .collect();
        assert_eq!(&actual, expected, "{at}: headers");
    }
}

fn run_lease_env(backend: &str, topology: &str, rt: &tokio::runtime::Runtime) -> usize {
    let env = Env::start(backend, topology);
    run_cases(&env, backend, topology, &lease_cases(), |driver, case| {
        let name = case["name"].as_str().unwrap();
        let mut saved = HashMap::new();
        for (i, call) in case["calls"].as_array().unwrap().iter().enumerate() {
            let at = format!("{backend}/{topology}/{driver}: lease case {name:?} call {i}");
            let Some(lease) = passable(call, lease_call(call, &saved), &at) else {
                continue;
            };
            let outcome = on_limiter!(&env, driver, rt, call => sync_lease, async_lease(&lease));
            check_lease(call, outcome, &mut saved, &at);
        }
    })
}

on_every_backend!(
    run_lease_env:
    lease_cases_on_the_module_standalone,
    lease_cases_on_lua_standalone,
    lease_cases_on_the_module_in_a_cluster,
    lease_cases_on_lua_in_a_cluster
);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

on_every_backend!(
    run_env:
    conformance_cases_on_the_module_standalone,
    conformance_cases_on_lua_standalone,
    conformance_cases_on_the_module_in_a_cluster,
    conformance_cases_on_lua_in_a_cluster
);

// --- clients/conformance/jobs.json: reservations, charges, settling, lockout ---------
//
// Translations for Rust: `max_wait_ms`, `block_ms` and `max_block_ms` are `u64`
// (a number that is not one, -1, 1.5 or 1e30, cannot be passed: the runner
// checks that the case expects `invalid_argument`, as for the leases); a
// take with options is `take_with(.., TakeOptions)`; `take_all` with
// `max_wait_ms` is `take_all_with`; `charge` and `settle` take a `Limit`;
// `settle`'s `result: null` is `Ok(None)`; `wait_ms` is `Decision::wait_ms()`.
// The lua runs wait for lua/tb.lua to have tb_charge (the file's "about").

fn job_cases() -> Vec<Json> {
    cases_of("jobs.json")
}

fn lua_has_jobs() -> bool {
    redis_tb_client::LUA_LIBRARY.contains("tb_charge")
}

/// One call of jobs.json on either driver.
enum JobCall {
    Plain(Call),
    TakeWith(String, f64, f64, f64, TakeOptions),
    TakeAllWith(Vec<Limit>, u64),
    Charge(Limit, f64, Option<f64>),
    Settle(Limit, f64, f64),
    Unblock(String),
}

#[derive(Debug)]
enum JobAnswer {
    Decision(Decision),
    Settled(Option<Decision>),
    Flag(bool),
}

/// An optional `u64` field; `Err` when it is there but not a `u64`.
fn optional_whole(call: &Json, field: &str) -> Result<Option<u64>, String> {
    match call.get(field) {
        None => Ok(None),
        Some(_) => whole(call, field).map(Some),
    }
}

fn job_limit(l: &Json) -> Result<Limit, String> {
    let mut limit = Limit::new(text(l, "key"), num(l, "capacity"), num(l, "rate"));
    if l.get("n").is_some() {
        limit = limit.cost(num(l, "n"));
    }
    if let Some(name) = l["policy"].as_str() {
        limit = limit.name(name);
    }
    limit.block_ms = optional_whole(l, "block_ms")?;
    limit.max_block_ms = optional_whole(l, "max_block_ms")?;
    Ok(limit)
}

fn job_call(call: &Json) -> Result<JobCall, String> {
    let options = || -> Result<TakeOptions, String> {
        Ok(TakeOptions {
            max_wait_ms: optional_whole(call, "max_wait_ms")?.unwrap_or(0),
            block_ms: optional_whole(call, "block_ms")?,
            max_block_ms: optional_whole(call, "max_block_ms")?,
        })
    };
    Ok(match call["op"].as_str().unwrap() {
        "take" => {
            let options = options()?;
            if options == TakeOptions::default() {
                JobCall::Plain(limit_call(call))
            } else {
                JobCall::TakeWith(
                    text(call, "key"),
                    num(call, "capacity"),
                    num(call, "rate"),
                    num(call, "n"),
                    options,
                )
            }
        }
        "take_all" => JobCall::TakeAllWith(
            call["limits"]
                .as_array()
                .unwrap()
                .iter()
                .map(job_limit)
                .collect::<Result<_, _>>()?,
            optional_whole(call, "max_wait_ms")?.unwrap_or(0),
        ),
        "charge" => JobCall::Charge(job_limit(call)?, num(call, "n"), call["max_debt"].as_f64()),
        "settle" => JobCall::Settle(job_limit(call)?, num(call, "reserved"), num(call, "actual")),
        "unblock" => JobCall::Unblock(text(call, "key")),
        _ => JobCall::Plain(limit_call(call)),
    })
}

fn sync_job<C: redis::ConnectionLike>(
    l: &mut RateLimiter<C>,
    call: &JobCall,
) -> Result<JobAnswer, Error> {
    Ok(match call {
        JobCall::Plain(c) => JobAnswer::Decision(sync_call(l, c)?),
        JobCall::TakeWith(k, c, r, n, o) => JobAnswer::Decision(l.take_with(k, *c, *r, *n, *o)?),
        JobCall::TakeAllWith(limits, w) => JobAnswer::Decision(l.take_all_with(limits, *w)?),
        JobCall::Charge(limit, n, d) => JobAnswer::Decision(l.charge(limit, *n, *d)?),
        JobCall::Settle(limit, r, a) => JobAnswer::Settled(l.settle(limit, *r, *a)?),
        JobCall::Unblock(k) => JobAnswer::Flag(l.unblock(k.as_str())?),
    })
}

async fn async_job<C>(l: &AsyncRateLimiter<C>, call: &JobCall) -> Result<JobAnswer, Error>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    Ok(match call {
        JobCall::Plain(c) => JobAnswer::Decision(async_call(l, c).await?),
        JobCall::TakeWith(k, c, r, n, o) => {
            JobAnswer::Decision(l.take_with(k, *c, *r, *n, *o).await?)
        }
        JobCall::TakeAllWith(limits, w) => JobAnswer::Decision(l.take_all_with(limits, *w).await?),
        JobCall::Charge(limit, n, d) => JobAnswer::Decision(l.charge(limit, *n, *d).await?),
        JobCall::Settle(limit, r, a) => JobAnswer::Settled(l.settle(limit, *r, *a).await?),
        JobCall::Unblock(k) => JobAnswer::Flag(l.unblock(k.as_str()).await?),
    })
}

fn check_job(call: &Json, outcome: Result<JobAnswer, Error>, at: &str) {
    if call["error"].is_string() {
        return check_error(call, outcome, at);
    }
    let answer = outcome.unwrap_or_else(|e| panic!("{at}: {e}"));
    let d = match answer {
        JobAnswer::Flag(flag) => {
            assert_eq!(Some(flag), call["result"].as_bool(), "{at}: {call}");
            return;
        }
        JobAnswer::Settled(None) => {
            assert!(
                call["result"].is_null() && call.get("result").is_some(),
                "{at}: no call"
            );
            return;
        }
        JobAnswer::Settled(Some(d)) | JobAnswer::Decision(d) => d,
    };
    if let Some(wait) = call["decision"].get("wait_ms") {
        assert!(
            matches_number(wait, d.wait_ms() as f64),
            "{at}: wait_ms should be {wait}: {d:?}"
        );
    }
    let mut rest = call.clone();
    if let Some(fields) = rest["decision"].as_object_mut() {
        fields.remove("wait_ms");
    }
    check(&rest, Ok(d), at);
}

fn run_jobs_env(backend: &str, topology: &str, rt: &tokio::runtime::Runtime) -> usize {
    if backend == "lua" && !lua_has_jobs() {
        eprintln!("jobs.json on lua: skipped, lua/tb.lua has no tb_charge yet");
        return 1;
    }
    let env = Env::start(backend, topology);
    run_cases(&env, backend, topology, &job_cases(), |driver, case| {
        let name = case["name"].as_str().unwrap();
        for (i, call) in case["calls"].as_array().unwrap().iter().enumerate() {
            let at = format!("{backend}/{topology}/{driver}: jobs case {name:?} call {i}");
            if call["op"] == "sleep" {
                std::thread::sleep(std::time::Duration::from_millis(
                    call["ms"].as_u64().unwrap(),
                ));
                continue;
            }
            let Some(job) = passable(call, job_call(call), &at) else {
                continue;
            };
            let outcome = on_limiter!(&env, driver, rt, call => sync_job, async_job(&job));
            check_job(call, outcome, &at);
        }
    })
}

on_every_backend!(
    run_jobs_env:
    job_cases_on_the_module_standalone,
    job_cases_on_lua_standalone,
    job_cases_on_the_module_in_a_cluster,
    job_cases_on_lua_in_a_cluster
);

// --- clients/conformance/resend.json: one resend after a dropped connection ---------
//
// Each case runs on ONE limiter per driver (a new limiter per call would
// never meet a killed connection). `kill_clients` is CLIENT KILL TYPE normal
// SKIPME yes on every node over a connection of the runner's own; the
// limiter's connections, its blocking-wait ones included, are all closed.
// In a cluster the limiters get a blocking client, so `wait_take` on the
// module is TB.BTAKE on a dedicated connection there too.

fn resend_cases() -> Vec<Json> {
    cases_of("resend.json")
}

/// Closes every client connection of every node, the runner's own excepted.
fn kill_clients(env: &Env) {
    for node in env.nodes() {
        let killed: i64 = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query(&mut node.conn())
            .unwrap();
        assert!(killed >= 0);
    }
}

/// One call of resend.json: a bucket call or an acquire.
enum ResendCall {
    Bucket(Call),
    Lease(LeaseCall),
    /// Not a limiter's call: close every client connection (`kill_clients`).
    KillClients,
}

fn resend_call(call: &Json) -> ResendCall {
    match call["op"].as_str().unwrap() {
        "kill_clients" => ResendCall::KillClients,
        "acquire" => ResendCall::Lease(
            lease_call(call, &HashMap::new()).unwrap_or_else(|n| panic!("{n} in {call}")),
        ),
        _ => ResendCall::Bucket(limit_call(call)),
    }
}

fn check_resend(call: &Json, outcome: Result<LeaseAnswer, Error>, at: &str) {
    check_lease(call, outcome, &mut HashMap::new(), at)
}

/// A resend case's calls, each with where it stands (`at`).
fn resend_calls<'a>(
    case: &'a Json,
    at: &'a str,
) -> impl Iterator<Item = (&'a Json, ResendCall, String)> + 'a {
    let calls = case["calls"].as_array().unwrap().iter().enumerate();
    calls.map(move |(i, call)| (call, resend_call(call), format!("{at} call {i}")))
}

fn resend_sync<C: redis::ConnectionLike>(l: &mut RateLimiter<C>, env: &Env, case: &Json, at: &str) {
    for (call, resend, at) in resend_calls(case, at) {
        match resend {
            ResendCall::KillClients => kill_clients(env),
            ResendCall::Bucket(c) => check(call, sync_call(l, &c), &at),
            ResendCall::Lease(c) => check_resend(call, sync_lease(l, &c), &at),
        }
    }
}

async fn resend_async<C>(l: &AsyncRateLimiter<C>, env: &Env, case: &Json, at: &str)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    for (call, resend, at) in resend_calls(case, at) {
        match resend {
            ResendCall::KillClients => kill_clients(env),
            ResendCall::Bucket(c) => check(call, async_call(l, &c).await, &at),
            ResendCall::Lease(c) => check_resend(call, async_lease(l, &c).await, &at),
        }
    }
}

/// A case with a refund, which must not be sent again.
fn has_a_refund(case: &Json) -> bool {
    case["calls"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["op"] == "refund")
}

fn run_resend_env(backend: &str, topology: &str, rt: &tokio::runtime::Runtime) -> usize {
    let env = Env::start(backend, topology);
    let mut cases = resend_cases();
    if topology == "cluster" {
        // redis-rs's cluster connections resend any command on a dropped
        // connection themselves (their `retries`), a refund too: the limiter
        // never sees the error (README, "A dropped connection").
        cases.retain(|case| {
            let skipped = has_a_refund(case);
            if skipped {
                eprintln!("resend.json: {:?} skipped in a cluster", case["name"]);
            }
            !skipped
        });
    }
    run_cases(&env, backend, topology, &cases, |driver, case| {
        let at = format!(
            "{backend}/{topology}/{driver}: resend case {:?}",
            case["name"].as_str().unwrap()
        );
        on_limiter!(
            &env,
            driver,
            rt,
            "default",
            |l| resend_sync(l, &env, case, &at),
            resend_async(l, &env, case, &at).await
        );
    })
}

on_every_backend!(
    run_resend_env:
    resend_cases_on_the_module_standalone,
    resend_cases_on_lua_standalone,
    resend_cases_on_the_module_in_a_cluster,
    resend_cases_on_lua_in_a_cluster
);

// --- clients/conformance/metrics.json: what a limiter records ----------------------
//
// Each case runs with a fresh meter provider (the SDK's in-memory exporter),
// given to the case's limiters alone, sync and async. Translations for Rust:
// the calls are those of jobs.json and leases.json, run by the same code; a
// case's `limiter` options are the builder methods of the same name
// (`cache_denials`, `on_unavailable`); a call's `policy` is the limiter's
// `with_policy_name` and its `fail_open` the limiter's `with_lease_fail_open`,
// so a case has one limiter per (policy, fail_open), each kept for all of
// its calls (a denial cache and an outage live in one limiter). `server:
// unreachable` is a limiter on a loopback port nothing listens on.

/// A call of metrics.json: one of jobs.json's or one of leases.json's.
enum MetricCall {
    Job(JobCall),
    Lease(LeaseCall),
}

fn metric_call(call: &Json, saved: &HashMap<String, String>) -> Result<MetricCall, String> {
    match call["op"].as_str().unwrap() {
        "acquire" | "wait_acquire" | "release" | "renew" => {
            lease_call(call, saved).map(MetricCall::Lease)
        }
        _ => job_call(call).map(MetricCall::Job),
    }
}

/// The limiter of one (policy, fail_open), with the case's options and meter provider.
macro_rules! metered {
    ($limiter:expr, $case:expr, $reader:expr, $policy:expr, $fail_open:expr) => {{
        let mut l = $limiter
            .with_meter_provider(&$reader.provider)
            .with_policy_name($policy)
            .with_lease_fail_open($fail_open);
        for (option, value) in $case["limiter"].as_object().into_iter().flatten() {
            l = match option.as_str() {
                "cache_denials" => l.cache_denials(value.as_bool().unwrap()),
                "on_unavailable" => l.on_unavailable(match value.as_str().unwrap() {
                    "local" => redis_tb_client::OnUnavailable::Local,
                    "raise" => redis_tb_client::OnUnavailable::Raise,
                    other => panic!("on_unavailable {other}"),
                }),
                other => panic!("the runner does not know the limiter option {other}"),
            };
        }
        l
    }};
}

/// Which limiter of the case makes `call`.
fn limiter_of(call: &Json) -> (String, bool) {
    let policy = call["policy"].as_str().unwrap_or("default").to_string();
    (policy, call["fail_open"] == true)
}

fn metrics_sync<C: redis::ConnectionLike>(
    case: &Json,
    at: &str,
    mut make: impl FnMut(&str, bool) -> RateLimiter<C>,
) {
    let mut limiters: HashMap<(String, bool), RateLimiter<C>> = HashMap::new();
    let mut saved = HashMap::new();
    for (i, call) in case["calls"].as_array().unwrap().iter().enumerate() {
        let at = format!("{at} call {i}");
        let Some(c) = passable(call, metric_call(call, &saved), &at) else {
            continue;
        };
        let (policy, fail_open) = limiter_of(call);
        let l = limiters
            .entry((policy.clone(), fail_open))
            .or_insert_with(|| make(&policy, fail_open));
        match c {
            MetricCall::Job(job) => check_job(call, sync_job(l, &job), &at),
            MetricCall::Lease(lease) => check_lease(call, sync_lease(l, &lease), &mut saved, &at),
        }
    }
}

async fn metrics_async<C>(case: &Json, at: &str, make: impl Fn(&str, bool) -> AsyncRateLimiter<C>)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut limiters: HashMap<(String, bool), AsyncRateLimiter<C>> = HashMap::new();
    let mut saved = HashMap::new();
    for (i, call) in case["calls"].as_array().unwrap().iter().enumerate() {
        let at = format!("{at} call {i}");
        let Some(c) = passable(call, metric_call(call, &saved), &at) else {
            continue;
        };
        let (policy, fail_open) = limiter_of(call);
        let l = limiters
            .entry((policy.clone(), fail_open))
            .or_insert_with(|| make(&policy, fail_open));
        match c {
            MetricCall::Job(job) => check_job(call, async_job(l, &job).await, &at),
            MetricCall::Lease(lease) => {
                check_lease(call, async_lease(l, &lease).await, &mut saved, &at)
            }
        }
    }
}

/// What the case's limiters recorded: for each instrument of the file,
/// exactly the data points the case lists (an instrument it does not name:
/// none), of the file's kind and unit.
fn check_metrics(instruments: &[Json], case: &Json, points: &[crate::metrics::Point], at: &str) {
    let expected = &case["metrics"];
    for instrument in instruments {
        let name = text(instrument, "name");
        let actual: Vec<_> = points.iter().filter(|p| p.instrument == name).collect();
        let wanted = expected[&name].as_array().cloned().unwrap_or_default();
        assert_eq!(
            actual.len(),
            wanted.len(),
            "{at}: {name}: {actual:?}, want {wanted:?}"
        );
        for want in &wanted {
            let attributes: std::collections::BTreeMap<String, String> = want["attributes"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            let point = actual
                .iter()
                .find(|p| p.attributes == attributes)
                .unwrap_or_else(|| panic!("{at}: {name}: no {attributes:?} in {actual:?}"));
            assert_eq!(point.kind, instrument["kind"], "{at}: {name}");
            assert_eq!(point.unit, instrument["unit"], "{at}: {name}");
            let field = if point.kind == "histogram" {
                "count"
            } else {
                "value"
            };
            assert_eq!(
                Some(point.value),
                want[field].as_u64(),
                "{at}: {name} {attributes:?}"
            );
            if let Some(sum) = point.sum {
                assert!(sum.is_finite() && sum >= 0.0, "{at}: {name} sum {sum}");
            }
        }
    }
}

fn run_metrics_env(backend: &str, topology: &str, rt: &tokio::runtime::Runtime) -> usize {
    let path = repo_root().join("clients/conformance/metrics.json");
    let doc: Json = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let instruments = doc["instruments"].as_array().unwrap().clone();
    let env = Env::start(backend, topology);
    run_cases(
        &env,
        backend,
        topology,
        &cases_of("metrics.json"),
        |driver, case| {
            let at = format!(
                "{backend}/{topology}/{driver}: metrics case {:?}",
                case["name"].as_str().unwrap()
            );
            let reader = crate::metrics::Reader::new();
            let unreachable = case["server"] == "unreachable";
            let nowhere = || {
                assert!(
                    matches!(env, Env::Standalone(_)),
                    "{at}: unreachable is standalone only"
                );
                redis::Client::open(format!("redis://127.0.0.1:{}/", free_port())).unwrap()
            };
            if driver == "sync" {
                match &env {
                    Env::Standalone(s) => metrics_sync(case, &at, |policy, fail_open| {
                        let client = if unreachable { nowhere() } else { s.client() };
                        let l = RateLimiter::from_client(client, GENEROUS);
                        metered!(l, case, reader, policy, fail_open)
                    }),
                    Env::Cluster(c) => metrics_sync(case, &at, |policy, fail_open| {
                        let l = RateLimiter::new(c.client().get_connection().unwrap())
                            .with_blocking_client(c.nodes[0].client())
                            .with_timeouts(GENEROUS);
                        metered!(l, case, reader, policy, fail_open)
                    }),
                }
            } else {
                rt.block_on(async {
                    match &env {
                        Env::Standalone(s) => {
                            metrics_async(case, &at, |policy, fail_open| {
                                let client = if unreachable { nowhere() } else { s.client() };
                                let l = AsyncRateLimiter::from_client(client, GENEROUS);
                                metered!(l, case, reader, policy, fail_open)
                            })
                            .await
                        }
                        Env::Cluster(c) => {
                            let con = c.client().get_async_connection().await.unwrap();
                            metrics_async(case, &at, |policy, fail_open| {
                                let l = AsyncRateLimiter::new(con.clone())
                                    .with_blocking_client(c.nodes[0].client())
                                    .with_timeouts(GENEROUS);
                                metered!(l, case, reader, policy, fail_open)
                            })
                            .await
                        }
                    }
                })
            }
            check_metrics(&instruments, case, &reader.collect(), &at);
        },
    )
}

on_every_backend!(
    run_metrics_env:
    metrics_cases_on_the_module_standalone,
    metrics_cases_on_lua_standalone,
    metrics_cases_on_the_module_in_a_cluster,
    metrics_cases_on_lua_in_a_cluster
);
