//! The Lua twin replays the core's vectors (clients/conformance/vectors/, written by
//! core/tests/vectors) in a real server: for each vector, the stored state is written as the
//! module would have stored it (a hash, a redis-cell string, a lease set), the twin's command
//! runs at the vector's instant, and its reply and what it wrote (hash fields byte for byte,
//! members and scores, the key's absolute expiry) must be the vector's.
//!
//! The clock: the twin reads the server's `TIME`, once per call, and nothing else. So the
//! replay runs `lua/tb.lua` unchanged as an EVAL script behind a short prelude that shadows the
//! global `redis` with a table whose `call('TIME')` answers the vector's instant (seconds and
//! microseconds, as TIME does) and passes every other call to the server, and shadows `ARGV`
//! without those two arguments. Every instant of the vectors is after 2100-01-01, so the
//! expiries the twin sets are in the real server's future and the keys stay to be read.
//!
//! The rules the twin runs: take, peek, refund, charge, reserve, lockout, takeall, throttle
//! and leases. (`first_ms_when` and the denial cache's window are the libraries' to replay.)
//! And the argument rules (args.json), which need no clock: each vector's arguments through
//! the twin loaded both ways, by FCALL and by EVALSHA, must give the core's error text
//! exactly, or be accepted. (The module replays the same file: tests/it/commands/arg_vectors.rs.)

use crate::harness::*;
use redis::Value as Reply;
use serde_json::{json, Value};

/// The prelude that gives `lua/tb.lua` the caller's clock (see the module docs). ARGV[1] and
/// ARGV[2] are TIME's two fields; the command and its arguments follow.
const PINNED_CLOCK: &str = "\
local server_redis = redis
local pinned_time = {ARGV[1], ARGV[2]}
local redis = setmetatable({call = function(command, ...)
  if command == 'TIME' then return pinned_time end
  return server_redis.call(command, ...)
end}, {__index = server_redis})
local ARGV = {unpack(ARGV, 3)}
";

/// A server without the module, with the twin loaded behind the pinned clock.
struct Twin {
    _server: Server,
    con: redis::Connection,
    sha: String,
}

impl Twin {
    fn start() -> Twin {
        let server = Server::start_without_module(&[]);
        let mut con = server.conn();
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(format!("{PINNED_CLOCK}{}", tb_lua_script()))
            .query(&mut con)
            .expect("SCRIPT LOAD the pinned-clock twin");
        Twin {
            _server: server,
            con,
            sha,
        }
    }

    /// The twin's `command` on `keys` at `now_ms`: its reply, or its error's text.
    fn call(&mut self, now_ms: i64, command: &str, keys: &[&str], args: &[String]) -> Value {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        cmd.arg(now_ms.div_euclid(1000))
            .arg(now_ms.rem_euclid(1000) * 1000)
            .arg(command);
        for arg in args {
            cmd.arg(arg);
        }
        match cmd.query::<Reply>(&mut self.con) {
            Ok(reply) => as_json(&reply),
            Err(e) => json!({ "error": error_text(&e) }),
        }
    }

    fn run(&mut self, args: &[String]) -> Reply {
        let mut cmd = redis::cmd(&args[0]);
        for arg in &args[1..] {
            cmd.arg(arg);
        }
        cmd.query(&mut self.con)
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    fn hash(&mut self, key: &str) -> Vec<(String, String)> {
        let items: Vec<String> = redis::cmd("HGETALL")
            .arg(key)
            .query(&mut self.con)
            .expect("HGETALL");
        items
            .chunks(2)
            .map(|pair| (pair[0].clone(), pair[1].clone()))
            .collect()
    }

    fn expiry(&mut self, key: &str) -> i64 {
        redis::cmd("PEXPIRETIME")
            .arg(key)
            .query(&mut self.con)
            .expect("PEXPIRETIME")
    }

    fn score(&mut self, key: &str, member: &str) -> Option<String> {
        redis::cmd("ZSCORE")
            .arg(key)
            .arg(member)
            .query(&mut self.con)
            .expect("ZSCORE")
    }

    fn members(&mut self, key: &str) -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(&mut self.con)
            .expect("ZRANGE")
    }
}

fn as_json(reply: &Reply) -> Value {
    match reply {
        Reply::Nil => Value::Null,
        Reply::Int(i) => json!(i),
        Reply::BulkString(bytes) => json!(String::from_utf8_lossy(bytes)),
        Reply::SimpleString(text) => json!(text),
        Reply::Okay => json!("OK"),
        Reply::Array(items) => Value::Array(items.iter().map(as_json).collect()),
        other => json!(format!("{other:?}")),
    }
}

fn f64_of(value: &Value) -> f64 {
    value
        .as_f64()
        .unwrap_or_else(|| panic!("not a number: {value}"))
}

fn i64_of(value: &Value) -> i64 {
    value
        .as_i64()
        .unwrap_or_else(|| panic!("not an integer: {value}"))
}

/// A double as an argument or a stored field: the shortest text that reads back as it
/// (what Rust's `{:?}` writes; tb.lua's grammar takes it).
fn text(value: &Value) -> String {
    format!("{:?}", f64_of(value))
}

/// The checks of one file: the names of the vectors that failed, each with what differed.
#[derive(Default)]
struct Report {
    failures: Vec<String>,
    replayed: usize,
}

impl Report {
    fn check(&mut self, vector: &Value, what: &str, got: Value, want: &Value) {
        if got != *want {
            self.failures.push(format!(
                "{:?}: {what}\n    twin: {got}\n    core: {want}",
                vector["name"].as_str().unwrap_or("?")
            ));
        }
    }

    fn finish(self, rule: &str) {
        assert!(self.replayed > 0, "no vectors in {rule}.json");
        assert!(
            self.failures.is_empty(),
            "lua/tb.lua differs from the core on {} of {} vectors of {rule}.json:\n  {}",
            self.failures.len(),
            self.replayed,
            self.failures.join("\n  ")
        );
        eprintln!(
            "{rule}.json: {} vectors replayed by the twin",
            self.replayed
        );
    }
}

// --- Buckets ------------------------------------------------------------------------------

/// Stores `state` (a vector's bucket, or null) at `key`, with no expiry, as the module would
/// have: `tokens` and `last_refill`, and the lock's fields when it has one.
fn store_bucket(twin: &mut Twin, key: &str, state: &Value) -> Vec<(String, String)> {
    twin.run(&["DEL".into(), key.into()]);
    if state.is_null() {
        return Vec::new();
    }
    let mut fields = vec![
        ("tokens".to_string(), text(&state["tokens"])),
        ("last_refill".to_string(), text(&state["last_refill_ms"])),
    ];
    if let Some(lock) = state.get("lock") {
        fields.extend(lock_fields(lock));
    }
    let mut hset = vec!["HSET".to_string(), key.to_string()];
    for (field, value) in &fields {
        hset.push(field.clone());
        hset.push(value.clone());
    }
    twin.run(&hset);
    fields
}

fn lock_fields(lock: &Value) -> Vec<(String, String)> {
    [
        ("locked_until", "locked_until_ms"),
        ("strikes", "strikes"),
        ("probation_until", "probation_until_ms"),
    ]
    .iter()
    .map(|(field, name)| (field.to_string(), i64_of(&lock[*name]).to_string()))
    .collect()
}

/// The hash and expiry `write` leaves at `key` that held `before` (with no expiry).
fn expected_bucket(before: &[(String, String)], write: &Value) -> (Vec<(String, String)>, i64) {
    if write.is_null() {
        let expiry = if before.is_empty() { -2 } else { -1 };
        return (sorted(before.to_vec()), expiry);
    }
    let mut fields: Vec<(String, String)> = before
        .iter()
        .filter(|(field, _)| field != "tokens" && field != "last_refill")
        .cloned()
        .collect();
    fields.push((
        "tokens".into(),
        write["tokens_text"].as_str().expect("tokens_text").into(),
    ));
    fields.push((
        "last_refill".into(),
        format!("{}", f64_of(&write["last_refill_ms"]) as i64),
    ));
    if let Some(lock) = write.get("lock") {
        fields.retain(|(field, _)| {
            !matches!(
                field.as_str(),
                "locked_until" | "strikes" | "probation_until"
            )
        });
        fields.extend(lock_fields(lock));
    }
    (sorted(fields), i64_of(&write["expire_at_ms"]))
}

/// Checks the bucket hash and expiry the twin left at `key` against what the vector's write
/// makes of the hash stored `before` it.
fn check_bucket_write(
    twin: &mut Twin,
    report: &mut Report,
    vector: &Value,
    key: &str,
    before: &[(String, String)],
) {
    let (fields, expiry) = expected_bucket(before, &vector["expect"]["write"]);
    let got = (sorted(twin.hash(key)), twin.expiry(key));
    report.check(
        vector,
        "hash and expiry",
        json!(got),
        &json!((fields, expiry)),
    );
}

fn sorted(mut fields: Vec<(String, String)>) -> Vec<(String, String)> {
    fields.sort();
    fields
}

fn bucket_args(vector: &Value) -> Vec<String> {
    vec![
        text(&vector["config"]["capacity"]),
        text(&vector["config"]["rate"]),
        text(&vector["n"]),
    ]
}

fn option_args(options: &Value) -> Vec<String> {
    let mut args = Vec::new();
    for (name, word) in [
        ("max_wait_ms", "MAXWAIT"),
        ("block_ms", "BLOCK"),
        ("max_block_ms", "MAXBLOCK"),
    ] {
        if let Some(ms) = options.get(name) {
            args.push(word.to_string());
            args.push(i64_of(ms).to_string());
        }
    }
    if let Some(debt) = options.get("max_debt") {
        args.push("MAXDEBT".to_string());
        args.push(text(debt));
    }
    args
}

/// TB.TAKE's four figures as the vectors write them.
fn figures(reply: &Value) -> Value {
    match reply.as_array().map(Vec::as_slice) {
        Some([allowed, remaining, retry, reset, ..]) => json!({
            "allowed": allowed == &json!(1),
            "remaining": remaining,
            "retry_after_ms": retry,
            "reset_after_ms": reset,
        }),
        _ => reply.clone(),
    }
}

/// Replays a file of one-bucket vectors through the twin's `command`.
fn replay_bucket_rule(rule: &str, command: &str) {
    let mut twin = Twin::start();
    let mut report = Report::default();
    for vector in vectors(rule) {
        let key = "vector";
        let before = store_bucket(&mut twin, key, &vector["state"]);
        let mut args = bucket_args(&vector);
        args.extend(option_args(&vector["options"]));
        let reply = twin.call(i64_of(&vector["now_ms"]), command, &[key], &args);
        let expect = &vector["expect"];
        report.check(&vector, "reply", figures(&reply), &expect["reply"]);
        check_bucket_write(&mut twin, &mut report, &vector, key, &before);
        report.replayed += 1;
    }
    report.finish(rule);
}

#[test]
fn the_twin_takes_as_the_core_does() {
    replay_bucket_rule("take", "take");
}

#[test]
fn the_twin_peeks_as_the_core_does() {
    replay_bucket_rule("peek", "peek");
}

#[test]
fn the_twin_refunds_as_the_core_does() {
    replay_bucket_rule("refund", "refund");
}

#[test]
fn the_twin_charges_down_to_the_debt_floor_as_the_core_does() {
    replay_bucket_rule("charge", "charge");
}

#[test]
fn the_twin_reserves_within_maxwait_as_the_core_does() {
    replay_bucket_rule("reserve", "take");
}

#[test]
fn the_twin_locks_escalates_and_forgets_as_the_core_does() {
    replay_bucket_rule("lockout", "take");
}

#[test]
fn the_twin_takes_from_every_bucket_or_none_as_the_core_does() {
    let mut twin = Twin::start();
    let mut report = Report::default();
    for vector in vectors("takeall") {
        let buckets = vector["buckets"].as_array().expect("buckets");
        let keys: Vec<String> = (0..buckets.len()).map(|i| format!("vector:{i}")).collect();
        let mut befores = Vec::new();
        let mut args = Vec::new();
        for (key, bucket) in keys.iter().zip(buckets) {
            befores.push(store_bucket(&mut twin, key, &bucket["state"]));
            args.extend(bucket_args(bucket));
        }
        args.extend(option_args(&vector["options"]));
        let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reply = twin.call(i64_of(&vector["now_ms"]), "takeall", &key_refs, &args);
        let mut got = figures(&reply);
        if let Some(index) = reply.get(4) {
            got["index"] = index.clone();
        }
        let expect = &vector["expect"];
        report.check(&vector, "reply", got, &expect["reply"]);
        let writes = expect["writes"].as_array().expect("writes");
        for ((key, before), write) in keys.iter().zip(&befores).zip(writes) {
            let (fields, expiry) = expected_bucket(before, write);
            let got = (sorted(twin.hash(key)), twin.expiry(key));
            report.check(&vector, key, json!(got), &json!((fields, expiry)));
        }
        report.replayed += 1;
    }
    report.finish("takeall");
}

#[test]
fn the_twin_throttles_as_the_core_does() {
    let mut twin = Twin::start();
    let mut report = Report::default();
    for vector in vectors("throttle") {
        let key = "vector";
        let state = &vector["state"];
        let cell = state.get("cell_tat_ns").and_then(Value::as_str);
        let before = match cell {
            Some(tat) => {
                twin.run(&["DEL".into(), key.into()]);
                twin.run(&["SET".into(), key.into(), tat.into()]);
                Vec::new()
            }
            None => store_bucket(&mut twin, key, state),
        };
        let mut args = Vec::new();
        for name in ["max_burst", "count", "period", "quantity"] {
            if let Some(arg) = vector["args"].get(name).and_then(Value::as_str) {
                args.push(arg.to_string());
            }
        }
        let reply = twin.call(i64_of(&vector["now_ms"]), "throttle", &[key], &args);
        let expect = &vector["expect"];
        report.check(&vector, "reply", reply, &expect["reply"]);
        match (cell, expect["write"].is_null()) {
            // A denial leaves redis-cell's string as it was.
            (Some(tat), true) => {
                let got: Option<String> = redis::cmd("GET")
                    .arg(key)
                    .query(&mut twin.con)
                    .expect("GET");
                report.check(&vector, "the cell string", json!(got), &json!(tat));
            }
            _ => check_bucket_write(&mut twin, &mut report, &vector, key, &before),
        }
        report.replayed += 1;
    }
    report.finish("throttle");
}

// --- Leases -------------------------------------------------------------------------------

/// Stores a vector's lease set at `key`: its leases, `seq`, `inc` and expiry.
fn store_leases(twin: &mut Twin, key: &str, state: &Value) {
    twin.run(&["DEL".into(), key.into()]);
    if state.is_null() {
        return;
    }
    let mut zadd = vec!["ZADD".to_string(), key.to_string()];
    for lease in state["leases"].as_array().expect("leases") {
        zadd.push(i64_of(&lease["deadline_ms"]).to_string());
        zadd.push(lease["id"].as_str().expect("id").to_string());
    }
    zadd.push((-i64_of(&state["issued"])).to_string());
    zadd.push("seq".to_string());
    if let Some(incarnation) = state["incarnation"].as_i64() {
        zadd.push((-incarnation).to_string());
        zadd.push("inc".to_string());
    }
    twin.run(&zadd);
    if let Some(at) = state["expire_at_ms"].as_i64() {
        twin.run(&["PEXPIREAT".into(), key.into(), at.to_string()]);
    }
}

/// The id the twin handed out, with its incarnation replaced by the vector's when the call
/// made the set (the twin draws its own, which must be the one the set stores); otherwise,
/// or when the id or the stored incarnation is not as expected, the id as handed out (with
/// what differed), so the comparison fails and shows it.
fn id_as_drawn(twin: &mut Twin, key: &str, got: &str, made_the_set: bool, want: &str) -> String {
    if !made_the_set {
        return got.to_string();
    }
    let (Some((got_head, got_inc)), Some((want_head, want_inc))) =
        (got.rsplit_once('-'), want.rsplit_once('-'))
    else {
        return got.to_string();
    };
    // The drawn incarnation must be the one the set stores (`inc`, scored by minus it).
    let stored = twin.score(key, "inc");
    if stored.as_deref() != Some(&format!("-{got_inc}")) {
        return format!("{got} (inc scored {stored:?})");
    }
    if got_head == want_head {
        want.to_string()
    } else {
        format!("{got_head}-{want_inc} (drawn {got_inc})")
    }
}

#[test]
fn the_twin_grants_renews_and_releases_leases_as_the_core_does() {
    let mut twin = Twin::start();
    let mut report = Report::default();
    for vector in vectors("leases") {
        let key = "vector";
        let state = &vector["state"];
        store_leases(&mut twin, key, state);
        let members_before = twin.members(key);
        let expiry_before = twin.expiry(key);
        let op = vector["op"].as_str().expect("op");
        let args_of = |names: &[&str]| -> Vec<String> {
            names
                .iter()
                .map(|name| match &vector["args"][*name] {
                    Value::String(text) => text.clone(),
                    number => i64_of(number).to_string(),
                })
                .collect()
        };
        let args = match op {
            "acquire" => args_of(&["limit", "lease_ms"]),
            "renew" => args_of(&["lease", "lease_ms"]),
            _ => args_of(&["lease"]),
        };
        let reply = twin.call(i64_of(&vector["now_ms"]), op, &[key], &args);
        let expect = &vector["expect"];
        if let Some(error) = expect.get("error") {
            report.check(&vector, "error", reply["error"].clone(), error);
        } else if op == "acquire" {
            let want = &expect["reply"];
            let id = match (reply.get(3).and_then(Value::as_str), want["id"].as_str()) {
                (Some(got), Some(want_id)) => {
                    json!(id_as_drawn(&mut twin, key, got, state.is_null(), want_id))
                }
                (got, _) => json!(got),
            };
            let got = match reply.as_array().map(Vec::as_slice) {
                Some([acquired, available, retry, ..]) => json!({
                    "acquired": acquired == &json!(1),
                    "available": available,
                    "retry_after_ms": retry,
                    "id": id,
                }),
                _ => reply.clone(),
            };
            report.check(&vector, "reply", got, want);
        } else {
            report.check(&vector, "reply", json!({ "held": reply }), &expect["reply"]);
        }
        let write = &expect["write"];
        if write.is_null() {
            let got = (twin.members(key), twin.expiry(key));
            report.check(
                &vector,
                "the set, untouched",
                json!(got),
                &json!((members_before, expiry_before)),
            );
        } else {
            let member = write
                .get("removed")
                .or_else(|| write.get("id"))
                .or_else(|| vector["args"].get("lease"))
                .and_then(Value::as_str)
                .expect("the lease written");
            // The lease the twin wrote (its own id, when it drew the incarnation).
            let member = match (op, reply.get(3).and_then(Value::as_str)) {
                ("acquire", Some(id)) => id.to_string(),
                _ => member.to_string(),
            };
            let deadline = write.get("deadline_ms").map(|ms| i64_of(ms).to_string());
            let score = twin.score(key, &member);
            report.check(&vector, "the lease's score", json!(score), &json!(deadline));
            if let Some(issued) = write.get("issued") {
                let seq = twin.score(key, "seq");
                report.check(
                    &vector,
                    "seq",
                    json!(seq),
                    &json!((-i64_of(issued)).to_string()),
                );
            }
            let expiry = write["expire_at_ms"].as_i64().unwrap_or(expiry_before);
            report.check(
                &vector,
                "the expiry",
                json!(twin.expiry(key)),
                &json!(expiry),
            );
        }
        report.replayed += 1;
    }
    report.finish("leases");
}

// --- Arguments ----------------------------------------------------------------------------

/// Every vector of args.json through the twin, `fallback`-loaded, on a fresh key: the core's
/// error text exactly, or accepted. Not TB.BTAKE, and not TB.ACQUIRE with a timeout: a
/// script cannot wait (it has neither; one more argument is its arity error).
fn replay_args(fallback: impl Fn(&mut redis::Connection) -> Fallback) {
    let server = Server::start_without_module(&[]);
    let mut con = server.conn();
    let fallback = fallback(&mut con);
    let mut failures = Vec::new();
    let mut replayed = 0;
    for vector in arg_vectors() {
        let waits = vector.command == "TB.ACQUIRE" && vector.args.len() == 3;
        if vector.command == "TB.BTAKE" || waits {
            continue;
        }
        let _: () = redis::cmd("FLUSHALL").query(&mut con).expect("FLUSHALL");
        let (keys, args) = vector.keys_and_args("vector");
        let keys: Vec<&[u8]> = keys.iter().map(|key| key.as_bytes()).collect();
        let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
        let result = fallback
            .cmd_for(&vector.twin_command(), &keys, &args)
            .query::<Reply>(&mut con);
        failures.extend(vector.differs(result));
        replayed += 1;
    }
    finish_arg_replay(fallback.name(), &failures, replayed);
}

#[test]
fn the_twin_by_fcall_reads_arguments_as_the_core_does() {
    replay_args(Fallback::function);
}

#[test]
fn the_twin_by_evalsha_reads_arguments_as_the_core_does() {
    replay_args(Fallback::script);
}
