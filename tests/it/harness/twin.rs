//! The Lua twin of the module (`lua/tb.lua`, by EVALSHA or as a FUNCTION LOAD library) and
//! the differential harness that runs the same calls through both and compares them.

use std::collections::BTreeMap;

use redis::Value;

use super::aof::aof_commands;
use super::commands::{error_text, incarnation_of_score, raw, snapshot};
use super::server::Server;

/// The one Lua source, `lua/tb.lua`: loaded as it is by FUNCTION LOAD, and without its first
/// line as an EVAL script (see `tb_lua_script`).
pub const TB_LUA: &str = include_str!("../../../lua/tb.lua");

/// `TB_LUA` as an EVAL script: without the `#!lua name=tb` shebang, whose `name=` EVAL refuses.
pub fn tb_lua_script() -> &'static str {
    TB_LUA.split_once('\n').map_or("", |(_, rest)| rest)
}

/// Where the fallback runs: an EVALSHA of `lua/tb.lua` as a script, or an FCALL of it loaded
/// as a library. Both take the same keys and arguments; the script takes the command name as
/// its first argument, the library has one function per command (`tb_<command>`).
#[derive(Clone)]
pub enum Fallback {
    Script { sha: String },
    Function,
}

impl Fallback {
    /// SCRIPT LOAD of `lua/tb.lua` on `con`'s server.
    pub fn script(con: &mut redis::Connection) -> Fallback {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(tb_lua_script())
            .query(con)
            .expect("SCRIPT LOAD lua/tb.lua");
        Fallback::Script { sha }
    }

    /// FUNCTION LOAD of `lua/tb.lua` on `con`'s server; REPLACE, so loading it twice on one
    /// server is no error.
    pub fn function(con: &mut redis::Connection) -> Fallback {
        let name: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(TB_LUA)
            .query(con)
            .expect("FUNCTION LOAD lua/tb.lua");
        assert_eq!(name, "tb");
        Fallback::Function
    }

    /// The twin of TB.<COMMAND> on one key (`command` in lower case: take, acquire, ...).
    pub fn cmd(&self, command: &str, key: &[u8], args: &[&[u8]]) -> redis::Cmd {
        self.cmd_for(command, &[key], args)
    }

    /// The twin of TB.<COMMAND> on `keys` (several for takeall, or to test the key count).
    pub fn cmd_for(&self, command: &str, keys: &[&[u8]], args: &[&[u8]]) -> redis::Cmd {
        let mut cmd = match self {
            Fallback::Script { sha } => {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(sha);
                cmd
            }
            Fallback::Function => {
                let mut cmd = redis::cmd("FCALL");
                cmd.arg(format!("tb_{command}"));
                cmd
            }
        };
        cmd.arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        if let Fallback::Script { .. } = self {
            cmd.arg(command);
        }
        for arg in args {
            cmd.arg(*arg);
        }
        cmd
    }

    /// What a run's keys start with, so that the script's and the library's keys never meet.
    pub fn key_prefix(&self) -> &'static str {
        match self {
            Fallback::Script { .. } => "s",
            Fallback::Function => "f",
        }
    }

    /// How failure messages name it.
    pub fn name(&self) -> &'static str {
        match self {
            Fallback::Script { .. } => "EVALSHA lua/tb.lua",
            Fallback::Function => "FCALL tb_*",
        }
    }
}

// --- The differential harness: one call through each, compared in one millisecond -----------
//
// The module and the twin both read the server's clock, so each pair of calls runs in one
// transaction between two clock probes, with the keys read before and after:
//
//   MULTI; TIME; TB.TAKE probe1; <read A, B>; TB.<CMD> A ..; <twin> B ..; TB.TAKE probe2; TIME;
//          HGET probe1 last_refill; HGET probe2 last_refill; <read A, B>; EXEC
//
// The probes are TB.TAKE calls that always write, so their `last_refill` is the module's clock
// just before and just after the pair; the TIMEs are the script's clock. A pair is compared
// only when every clock shows the same millisecond (then both calls saw the same `now`); when
// they disagree, B is re-synced from A and the call is tried again.

/// Keys whose `last_refill` shows the module's clock before and after each pair of calls.
pub const PROBE_BEFORE: &str = "probe:before";
pub const PROBE_AFTER: &str = "probe:after";

/// `TB.<COMMAND> key args...` (`command` in lower case, as the twin names it: take, acquire).
pub fn module_cmd(command: &str, key: &[u8], args: &[&[u8]]) -> redis::Cmd {
    let mut cmd = redis::cmd(&format!("TB.{}", command.to_uppercase()));
    cmd.arg(key);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd
}

/// A reply, or the exact error text.
pub fn outcome(con: &mut redis::Connection, cmd: &redis::Cmd) -> Result<Value, String> {
    cmd.query::<Value>(con).map_err(|e| error_text(&e))
}

/// The seed of a random sequence: `TB_SEED=<u64>` replays another than `default`.
pub fn seed_or(default: u64) -> u64 {
    std::env::var("TB_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

/// Starts a server, loads the twin with `load` (`Fallback::script` or `Fallback::function`)
/// and runs `check` with it.
pub fn with_twin(
    load: fn(&mut redis::Connection) -> Fallback,
    check: impl FnOnce(&Fallback, &mut redis::Connection),
) {
    let server = Server::start();
    let mut con = server.conn();
    let fallback = load(&mut con);
    check(&fallback, &mut con);
}

/// Runs `check` with the script, then with the library, each on a new server with the module
/// loaded, started with `extra` (e.g. `AOF_ARGS`).
pub fn with_each_twin(
    extra: &[&str],
    mut check: impl FnMut(&Server, &Fallback, &mut redis::Connection),
) {
    let loads: [fn(&mut redis::Connection) -> Fallback; 2] = [Fallback::script, Fallback::function];
    for load in loads {
        let server = Server::start_with(extra);
        let mut con = server.conn();
        let fallback = load(&mut con);
        check(&server, &fallback, &mut con);
    }
}

/// The two tests of a differential check `fn check(fallback: &Fallback, con)`: one through the
/// script, one through the library, each on its own server with the module loaded.
macro_rules! on_both_twins {
    ($check:ident: $script_test:ident, $library_test:ident) => {
        #[test]
        fn $script_test() {
            with_twin(Fallback::script, $check);
        }

        #[test]
        fn $library_test() {
            with_twin(Fallback::function, $check);
        }
    };
}
pub(crate) use on_both_twins;

/// How a key is read for comparison, byte for byte: a bucket as `HGETALL` (field, value ...),
/// a lease set as `ZRANGE key 0 -1 WITHSCORES` (member, score ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Hash,
    SortedSet,
}

impl View {
    fn read(self, pipe: &mut redis::Pipeline, key: &str) {
        match self {
            View::Hash => pipe.cmd("HGETALL").arg(key),
            View::SortedSet => pipe.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES"),
        };
    }

    /// The pairs as `field=value` (or `member=score`), for failure messages.
    pub fn show(self, items: &[Vec<u8>]) -> String {
        items
            .chunks(2)
            .map(|kv| {
                let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
                format!(
                    "{}={}",
                    text(&kv[0]),
                    kv.get(1).map_or(String::new(), |v| text(v))
                )
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

// --- Incarnations: random, so compared by shape -------------------------------------------
//
// A lease set made by a call draws its incarnation from the server's random source (the
// module) or from a digest of the server's state (the twin): twin keys made in the same ms
// hold the same members but for it. Each key's own incarnation is set aside, and everything
// else is compared byte for byte as before.

/// What an incarnation reads as once set aside.
pub const INCARNATION: &str = "<inc>";

/// The incarnation of a lease set read as `member, score, ...`, as its text.
pub fn incarnation_text(items: &[Vec<u8>]) -> Option<String> {
    items.chunks(2).find_map(|pair| match pair {
        [member, score] if member.as_slice() == b"inc" => std::str::from_utf8(score)
            .ok()
            .and_then(|score| score.parse::<f64>().ok())
            .and_then(incarnation_of_score)
            .map(|incarnation| incarnation.to_string()),
        _ => None,
    })
}

/// `text` with the incarnation `incarnation` at its end (`<ms>-<n>-<incarnation>`, an id of
/// that set) written as `<inc>`; anything else as it is.
pub fn id_without_incarnation(text: &[u8], incarnation: Option<&str>) -> Vec<u8> {
    let Some(incarnation) = incarnation else {
        return text.to_vec();
    };
    let suffix = format!("-{incarnation}");
    match text.strip_suffix(suffix.as_bytes()) {
        Some(head) if head.iter().filter(|byte| **byte == b'-').count() == 1 => {
            [head, b"-", INCARNATION.as_bytes()].concat()
        }
        _ => text.to_vec(),
    }
}

/// A lease set read as `member, score, ...` with its own incarnation set aside: its `inc`
/// member first (where a score puts the other `inc`, in its twin, may differ), scored
/// `<inc>`, and its ids' last part `<inc>`. A set without an incarnation comes back as read.
pub fn without_incarnation(items: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let Some(incarnation) = incarnation_text(items) else {
        return items.to_vec();
    };
    let mut out = vec![b"inc".to_vec(), INCARNATION.as_bytes().to_vec()];
    for pair in items.chunks(2) {
        if let [member, score] = pair {
            if member.as_slice() != b"inc" {
                out.push(id_without_incarnation(member, Some(&incarnation)));
                out.push(score.clone());
            }
        }
    }
    out
}

/// A reply with the lease id in it (TB.ACQUIRE's fourth item) with `incarnation` set aside.
fn reply_without_incarnation(reply: &Value, incarnation: Option<&str>) -> Value {
    match reply {
        Value::Array(items) => Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::BulkString(id) if i == 3 => {
                        Value::BulkString(id_without_incarnation(id, incarnation))
                    }
                    other => other.clone(),
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// One pair of twin keys as read at one instant: the module's key A and the twin's key B, each
/// with its absolute expiry (`PEXPIRETIME`: -1 none, -2 no key).
#[derive(Clone, Debug, PartialEq)]
pub struct TwinKeys {
    pub a: Vec<Vec<u8>>,
    pub b: Vec<Vec<u8>>,
    pub expire_a: i64,
    pub expire_b: i64,
}

/// One call through the module (on the A keys) and through the twin (on the B keys).
#[derive(Clone)]
pub struct TwinCall {
    pub module: redis::Cmd,
    pub twin: redis::Cmd,
    /// The key pairs the calls touch, as (A, B); the first is the one failures name.
    pub keys: Vec<(String, String)>,
    pub view: View,
}

/// What one transaction showed.
#[derive(Debug)]
pub struct Observed {
    /// TIME before and after, and the module's clock before and after (the probes).
    pub clocks_ms: [i64; 4],
    pub module: Value,
    pub twin: Value,
    /// Every key pair of the call, before and after it.
    pub before: Vec<TwinKeys>,
    pub after: Vec<TwinKeys>,
    view: View,
}

fn time_ms((secs, micros): (i64, i64)) -> i64 {
    secs * 1000 + micros / 1000
}

fn read_keys(pipe: &mut redis::Pipeline, view: View, keys: &[(String, String)]) {
    for (a, b) in keys {
        view.read(pipe, a);
        view.read(pipe, b);
        pipe.cmd("PEXPIRETIME").arg(a).cmd("PEXPIRETIME").arg(b);
    }
}

fn twin_keys(values: &[Value]) -> Result<Vec<TwinKeys>, String> {
    values
        .chunks(4)
        .map(|chunk| {
            let (a, b, expire_a, expire_b) = redis::from_redis_value(&Value::Array(chunk.to_vec()))
                .map_err(|e| e.to_string())?;
            Ok(TwinKeys {
                a,
                b,
                expire_a,
                expire_b,
            })
        })
        .collect()
}

/// Runs `call` in one transaction between two clock probes, with every key pair read before
/// and after; `setup` commands run first, inside it.
pub fn run_twin_call(
    con: &mut redis::Connection,
    call: &TwinCall,
    setup: &[redis::Cmd],
) -> Result<Observed, String> {
    // Always allowed, always written: `last_refill` is the module's clock.
    let probe: [&[u8]; 3] = [b"1e15", b"1", b"1"];
    let mut pipe = redis::pipe();
    pipe.atomic();
    for cmd in setup {
        pipe.add_command(cmd.clone());
    }
    pipe.cmd("TIME")
        .add_command(module_cmd("take", PROBE_BEFORE.as_bytes(), &probe));
    read_keys(&mut pipe, call.view, &call.keys);
    pipe.add_command(call.module.clone())
        .add_command(call.twin.clone())
        .add_command(module_cmd("take", PROBE_AFTER.as_bytes(), &probe))
        .cmd("TIME")
        .cmd("HGET")
        .arg(PROBE_BEFORE)
        .arg("last_refill")
        .cmd("HGET")
        .arg(PROBE_AFTER)
        .arg("last_refill");
    read_keys(&mut pipe, call.view, &call.keys);
    // EXEC's replies, one a command: setup, TIME, probe, reads before, the module's call, the
    // twin's, probe, TIME, HGET, HGET, reads after.
    let exec = exec_replies(con, &pipe)?;
    let reads = 4 * call.keys.len();
    let at = setup.len() + 2 + reads;
    let (module, twin) = match exec.get(at..at + 2) {
        Some([module, twin]) => (module.clone(), twin.clone()),
        _ => return Err(format!("EXEC replied {} values", exec.len())),
    };
    // Only the two calls may fail (they are compared, errors included).
    if let Some(failed) = exec
        .iter()
        .enumerate()
        .find(|(i, value)| *i != at && *i != at + 1 && matches!(value, Value::ServerError(_)))
    {
        return Err(format!(
            "command {} of the transaction: {:?}",
            failed.0, failed.1
        ));
    }
    let values = &exec[setup.len()..];
    let at = at - setup.len();
    let int = |value: &Value| -> Result<i64, String> {
        redis::from_redis_value(value).map_err(|e| e.to_string())
    };
    let time = |value: &Value| -> Result<i64, String> {
        redis::from_redis_value::<(i64, i64)>(value)
            .map(time_ms)
            .map_err(|e| e.to_string())
    };
    Ok(Observed {
        clocks_ms: [
            time(&values[0])?,
            time(&values[at + 3])?,
            int(&values[at + 4])?,
            int(&values[at + 5])?,
        ],
        module,
        twin,
        before: twin_keys(&values[2..at])?,
        after: twin_keys(&values[at + 6..])?,
        view: call.view,
    })
}

/// The replies of an atomic pipeline's commands, as EXEC gives them: an error reply is a
/// value among the others (`Pipeline::query` would give up the whole reply for it).
fn exec_replies(con: &mut redis::Connection, pipe: &redis::Pipeline) -> Result<Vec<Value>, String> {
    let queued = pipe.cmd_iter().count() + 1;
    let mut replies =
        redis::ConnectionLike::req_packed_commands(con, &pipe.get_packed_pipeline(), queued, 1)
            .map_err(|e| error_text(&e))?;
    match replies.pop() {
        Some(Value::Array(values)) => Ok(values),
        other => Err(format!("EXEC replied {other:?}")),
    }
}

impl Observed {
    /// Every clock showed the same ms: both calls saw the same `now`.
    pub fn clocks_agree(&self) -> bool {
        self.clocks_ms.iter().all(|&ms| ms == self.clocks_ms[0])
    }

    /// The clocks agree, and no key was still there past its expiry: Redis 7.0 fixes the
    /// expiry clock when EXEC starts, a script takes its own when it starts, so such a key may
    /// have been judged a ms apart by the two.
    pub fn comparable(&self) -> bool {
        let now = self.clocks_ms[0];
        let stale = |expire: i64| (0..=now).contains(&expire);
        self.clocks_agree()
            && !self
                .before
                .iter()
                .chain(&self.after)
                .any(|keys| stale(keys.expire_a) || stale(keys.expire_b))
    }

    /// The pair of keys the call is about (the first), after it.
    pub fn first(&self) -> &TwinKeys {
        &self.after[0]
    }

    pub fn context(&self) -> String {
        let mut text = format!("now {}:", self.clocks_ms[0]);
        for (i, (before, after)) in self.before.iter().zip(&self.after).enumerate() {
            let show = |items: &[Vec<u8>]| self.view.show(items);
            text += &format!(
                "\n  key pair {i}:\
                 \n    before A [{}] expire {}\n    after  A [{}] expire {}\
                 \n    before B [{}] expire {}\n    after  B [{}] expire {}",
                show(&before.a),
                before.expire_a,
                show(&after.a),
                after.expire_a,
                show(&before.b),
                before.expire_b,
                show(&after.b),
                after.expire_b,
            );
        }
        text + &format!("\n  module {:?}\n  twin   {:?}", self.module, self.twin)
    }

    /// The keys were twins before, and the two calls left them twins: the same replies, the
    /// same bytes and the same absolute expiry on every key pair. A lease set's incarnation,
    /// random, is set aside on each side (`without_incarnation`): twin sets must both have
    /// one or both none, and their ids must carry it alike.
    pub fn assert_twins(&self, what: &str) {
        let context = || format!("{what}: {}", self.context());
        let comparable = |items: &[Vec<u8>]| match self.view {
            View::SortedSet => without_incarnation(items),
            View::Hash => items.to_vec(),
        };
        for (when, pairs) in [("before", &self.before), ("after", &self.after)] {
            for (i, keys) in pairs.iter().enumerate() {
                assert_eq!(
                    comparable(&keys.a),
                    comparable(&keys.b),
                    "key pair {i} differs {when}: {}",
                    context()
                );
                assert_eq!(
                    keys.expire_a,
                    keys.expire_b,
                    "expiries of key pair {i} differ {when}: {}",
                    context()
                );
            }
            if when == "before" {
                let (module, twin) = match (self.view, self.after.first()) {
                    (View::SortedSet, Some(after)) => (
                        reply_without_incarnation(
                            &self.module,
                            incarnation_text(&after.a).as_deref(),
                        ),
                        reply_without_incarnation(
                            &self.twin,
                            incarnation_text(&after.b).as_deref(),
                        ),
                    ),
                    _ => (self.module.clone(), self.twin.clone()),
                };
                assert_eq!(module, twin, "replies differ: {}", context());
            }
        }
    }

    /// Whether the first key pair holds lease sets of different incarnations after the call
    /// (each made its own): then B is re-synced from A, so that both hand out the same ids
    /// again.
    pub fn incarnations_differ(&self) -> bool {
        self.after
            .first()
            .is_some_and(|keys| incarnation_text(&keys.a) != incarnation_text(&keys.b))
    }
}

/// Runs `call` after `setup` (in its transaction) until every clock in it agrees, at most 50
/// times; returns what the agreeing run showed and how many runs it took. For fixed cases,
/// whose keys `setup` makes again on each run.
pub fn run_until_clocks_agree(
    con: &mut redis::Connection,
    call: &TwinCall,
    setup: &[redis::Cmd],
    what: &str,
) -> (Observed, usize) {
    for runs in 1..=50 {
        let seen = run_twin_call(con, call, setup).unwrap_or_else(|e| panic!("{what}: {e}"));
        if seen.clocks_agree() {
            return (seen, runs);
        }
    }
    panic!("{what}: the clocks never agreed");
}

// --- What the twins append: the AOF of the runs, transaction by transaction --------------

/// One command as the AOF holds it: its arguments.
pub type Logged = Vec<Vec<u8>>;

/// The AOF's transactions that hold the first probe, in order (one per `run_twin_call`), each
/// from that probe on (without the `setup` before it).
pub fn probed_transactions(server: &Server) -> Vec<Vec<Logged>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<Logged>> = None;
    for command in aof_commands(&server.dir) {
        match command[0].to_ascii_uppercase().as_slice() {
            b"MULTI" => current = Some(Vec::new()),
            b"EXEC" => {
                let block = current.take().expect("EXEC after MULTI");
                let probe = block
                    .iter()
                    .position(|c| c.get(1).map(Vec::as_slice) == Some(PROBE_BEFORE.as_bytes()));
                if let Some(probe) = probe {
                    blocks.push(block[probe..].to_vec());
                }
            }
            _ => {
                if let Some(block) = current.as_mut() {
                    block.push(command);
                }
            }
        }
    }
    blocks
}

/// The commands of `block` on `key`, with the key written `as_key` (so that A's and B's
/// compare).
pub fn commands_on(block: &[Logged], key: &str, as_key: &str) -> Vec<Logged> {
    block
        .iter()
        .filter(|c| c.get(1).map(Vec::as_slice) == Some(key.as_bytes()))
        .map(|c| {
            let mut c = c.clone();
            c[1] = as_key.as_bytes().to_vec();
            c
        })
        .collect()
}

/// Commands as text, `;` between them, for comparisons and failure messages.
pub fn show_commands(commands: &[Logged]) -> String {
    commands
        .iter()
        .map(|c| {
            c.iter()
                .map(|x| String::from_utf8_lossy(x).into_owned())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// One compared call appended the same commands through the module and through `fallback`,
/// and appended something exactly when it `writes`.
pub fn assert_appended_alike(
    fallback: &Fallback,
    what: &str,
    from_module: &[Logged],
    from_twin: &[Logged],
    writes: bool,
) {
    let shown = show_commands(from_module);
    println!("{} {what}: {shown}", fallback.name());
    assert_eq!(
        show_commands(from_twin),
        shown,
        "{} {what}: the AOF differs",
        fallback.name()
    );
    assert_eq!(!from_module.is_empty(), writes, "{what}: appended {shown}");
}

/// B := A, expiry included, atomically.
pub fn resync(con: &mut redis::Connection, a: &str, b: &str) {
    let _: Value = redis::pipe()
        .atomic()
        .cmd("DEL")
        .arg(b)
        .cmd("COPY")
        .arg(a)
        .arg(b)
        .query(con)
        .expect("DEL + COPY");
}

/// Runs `call` (named `what` in failures) until one run is comparable, at most `attempts` times. Before each attempt
/// `remake` (if given) makes both keys again; without it, B is re-synced from A after each run
/// that is not comparable. `tally` counts the runs given up. None when no run was comparable.
pub fn compared_call(
    con: &mut redis::Connection,
    call: &TwinCall,
    what: &str,
    attempts: usize,
    remake: Option<&dyn Fn(&mut redis::Connection)>,
    tally: &mut Tally,
) -> Option<Observed> {
    for _ in 0..attempts {
        if let Some(remake) = remake {
            remake(con);
        }
        let observed = run_twin_call(con, call, &[])
            .unwrap_or_else(|e| panic!("{what}: the transaction failed: {e}"));
        if observed.comparable() {
            return Some(observed);
        }
        if remake.is_none() {
            for (a, b) in &call.keys {
                resync(con, a, b);
            }
        }
        tally.resynced += 1;
    }
    None
}

/// How a differential run went: how many calls were compared and re-synced, and how often
/// each kind of call and outcome was seen, for the final assertions.
#[derive(Default, Debug)]
pub struct Tally {
    pub compared: usize,
    pub resynced: usize,
    pub seen: BTreeMap<&'static str, usize>,
}

impl Tally {
    /// Counts one `what` (a command, an outcome) among the compared calls.
    pub fn saw(&mut self, what: &'static str) {
        *self.seen.entry(what).or_default() += 1;
    }

    pub fn count(&self, what: &str) -> usize {
        self.seen.get(what).copied().unwrap_or(0)
    }

    /// More than half of `steps` were compared, and each of `expected` at least once.
    pub fn assert_well_covered(&self, steps: usize, expected: &[&str]) {
        assert!(
            self.compared * 2 > steps,
            "only {} of {steps} steps ran within one millisecond: {self:?}",
            self.compared
        );
        for what in expected {
            assert!(self.count(what) > 0, "no {what} compared: {self:?}");
        }
    }
}

/// `module` and `twin` both fail with the same error text and leave `key` untouched; returns
/// that text.
pub fn assert_same_error(
    con: &mut redis::Connection,
    key: &[u8],
    module: &redis::Cmd,
    twin: &redis::Cmd,
    what: &str,
) -> String {
    let before = snapshot(con, key);
    let from_module = outcome(con, module);
    let from_twin = outcome(con, twin);
    let Err(module_error) = from_module else {
        panic!("{what}: the module accepted it: {from_module:?}");
    };
    assert_eq!(
        from_twin,
        Err(module_error.clone()),
        "{what}: the twin disagrees"
    );
    assert_eq!(snapshot(con, key), before, "{what}: key touched");
    module_error
}

/// Creates a value of every type but `own` (`"hash"` for buckets, `"zset"` for lease sets)
/// under `t:<type>`; returns the keys.
pub fn foreign_values(con: &mut redis::Connection, own: &str) -> Vec<&'static [u8]> {
    // (type, key, the command that creates it)
    type Foreign = (&'static str, &'static [u8], &'static [&'static [u8]]);
    let all: [Foreign; 6] = [
        ("string", b"t:string", &[b"SET", b"t:string", b"1"]),
        ("hash", b"t:hash", &[b"HSET", b"t:hash", b"tokens", b"1"]),
        ("list", b"t:list", &[b"RPUSH", b"t:list", b"1"]),
        ("set", b"t:set", &[b"SADD", b"t:set", b"1"]),
        ("zset", b"t:zset", &[b"ZADD", b"t:zset", b"1", b"m"]),
        (
            "stream",
            b"t:stream",
            &[b"XADD", b"t:stream", b"*", b"f", b"v"],
        ),
    ];
    all.into_iter()
        .filter(|(kind, ..)| *kind != own)
        .map(|(_, key, create)| {
            raw(con, create).expect("create a foreign value");
            key
        })
        .collect()
}

/// Keys the error messages must escape or cut, each with `prefix`, and as the module shows it:
/// a plain one, one with control, quote, backslash and non-UTF-8 bytes, and one of 103 bytes.
pub fn keys_that_need_escaping(prefix: &str) -> Vec<(Vec<u8>, String)> {
    let long_key = [prefix.as_bytes(), &[b'k'; 100]].concat();
    vec![
        (
            format!("{prefix}corrupt").into_bytes(),
            format!("{prefix}corrupt"),
        ),
        (
            b"a\r\n\0'\\\x7f\xff".to_vec(),
            "a\\x0d\\x0a\\x00\\'\\\\\\x7f\\xff".to_string(),
        ),
        (long_key, format!("{prefix}{}...", "k".repeat(61))),
    ]
}
