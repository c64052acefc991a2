//! Running redis-tb: the `INFO tb` counters, `tb.shadow-mode` (CONFIG SET, load argument,
//! config file) and ACL users, on whatever server `TB_SERVER` names (Redis 7.0 by default;
//! Valkey 8.1/9.1 from `scripts/fetch-servers.sh` when present).

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::harness::*;

/// Every field of `INFO tb`, in order.
const FIELDS: [&str; 26] = [
    "tb_calls",
    "tb_allowed",
    "tb_denied",
    "tb_shadow_denied",
    "tb_buckets_created",
    "tb_errors",
    "tb_locks_started",
    "tb_charges",
    "tb_reservations_waited",
    "tb_tokens_granted",
    "tb_tokens_refunded",
    "tb_tokens_charged",
    "tb_waiting",
    "tb_waits_started",
    "tb_waits_served",
    "tb_waits_timed_out",
    "tb_waits_abandoned",
    "tb_wait_ms",
    "tb_longest_queue",
    "tb_max_waiters",
    "tb_leases_acquired",
    "tb_leases_denied",
    "tb_leases_released",
    "tb_leases_renewed",
    "tb_leases_expired",
    "tb_clock",
];

/// `INFO tb` as field -> value, after checking the section header and the field order.
fn tb_stats(con: &mut redis::Connection) -> BTreeMap<String, String> {
    let info: String = redis::cmd("INFO").arg("tb").query(con).expect("INFO tb");
    let lines: Vec<&str> = info.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.first(), Some(&"# tb_stats"), "INFO tb:\n{info}");
    let fields: Vec<(String, String)> = lines[1..]
        .iter()
        .map(|line| {
            let (name, value) = line.split_once(':').expect("field:value");
            (name.to_string(), value.trim().to_string())
        })
        .collect();
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, FIELDS, "INFO tb fields");
    fields.into_iter().collect()
}

fn counter(stats: &BTreeMap<String, String>, field: &str) -> u64 {
    stats[field]
        .parse()
        .unwrap_or_else(|e| panic!("{field} = {:?}: {e}", stats[field]))
}

fn amount(stats: &BTreeMap<String, String>, field: &str) -> f64 {
    stats[field]
        .parse()
        .unwrap_or_else(|e| panic!("{field} = {:?}: {e}", stats[field]))
}

/// Asserts the integer counters (in `FIELDS` order, without the two token sums) and the sums.
fn assert_stats(con: &mut redis::Connection, counters: [u64; 6], granted: f64, refunded: f64) {
    let stats = tb_stats(con);
    let got: Vec<u64> = FIELDS[..6].iter().map(|f| counter(&stats, f)).collect();
    assert_eq!(got, counters, "INFO tb counters {:?}", &FIELDS[..6]);
    assert_eq!(
        amount(&stats, "tb_tokens_granted"),
        granted,
        "tb_tokens_granted"
    );
    assert_eq!(
        amount(&stats, "tb_tokens_refunded"),
        refunded,
        "tb_tokens_refunded"
    );
}

fn query_err(con: &mut redis::Connection, cmd: &redis::Cmd) -> String {
    match cmd.query::<redis::Value>(con) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => error_text(&e),
    }
}

fn cmd(args: &[&str]) -> redis::Cmd {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    cmd
}

fn takeall(con: &mut redis::Connection, args: &[&str]) -> Vec<i64> {
    let mut all = vec!["TB.TAKEALL"];
    all.extend_from_slice(args);
    cmd(&all).query(con).expect("TB.TAKEALL")
}

// ---------------------------------------------------------------------------------------------
// INFO tb

/// Rates of one token per 1000 s: nothing refills while the test runs, so every count is exact.
#[test]
fn info_tb_counts_every_decision_error_and_token() {
    let server = Server::start();
    let mut con = server.conn();
    assert_stats(&mut con, [0; 6], 0.0, 0.0);

    for _ in 0..3 {
        assert_eq!(take(&mut con, "k", "3", "0.001", "1")[0], 1);
    }
    for _ in 0..2 {
        assert_eq!(take(&mut con, "k", "3", "0.001", "1")[0], 0);
    }
    // calls allowed denied shadow created errors
    assert_stats(&mut con, [5, 3, 2, 0, 1, 0], 3.0, 0.0);

    // A bad argument, a foreign value and a corrupt bucket are errors, not calls.
    assert!(query_err(&mut con, &cmd(&["TB.TAKE", "k", "x", "1", "1"])).starts_with("ERR capacity"));
    let _: () = redis::cmd("SET").arg("s").arg("1").query(&mut con).unwrap();
    assert!(query_err(&mut con, &cmd(&["TB.TAKE", "s", "1", "1", "1"])).starts_with("WRONGTYPE"));
    hset(&mut con, "c", &[("foo", "1")]);
    assert!(query_err(&mut con, &cmd(&["TB.TAKE", "c", "1", "1", "1"])).starts_with("ERR corrupt"));
    // A wrong argument count is refused by the server before the module runs: it shows in
    // INFO errorstats, not in tb_errors.
    assert!(query_err(&mut con, &cmd(&["TB.TAKE", "k", "1", "1"])).contains("wrong number"));
    assert_stats(&mut con, [5, 3, 2, 0, 1, 3], 3.0, 0.0);

    // Fractional tokens add up exactly (0.25 is a binary fraction); n = 0 is allowed but
    // creates no bucket; PEEK and REFUND are calls without a decision.
    assert_eq!(take(&mut con, "f", "10", "0.001", "0.25")[0], 1);
    assert_eq!(take(&mut con, "f", "10", "0.001", "0.25")[0], 1);
    assert_eq!(take(&mut con, "z", "5", "0.001", "0")[0], 1);
    assert!(!exists(&mut con, "z"));
    assert_eq!(peek_default_n(&mut con, "k", "3", "0.001")[0], 0);
    let _: Vec<i64> = cmd(&["TB.REFUND", "f", "10", "0.001", "0.25"])
        .query(&mut con)
        .unwrap();
    assert_stats(&mut con, [10, 6, 2, 0, 2, 3], 3.5, 0.25);

    // TB.TAKEALL is one decision; every bucket it creates counts, its tokens are the sum.
    assert_eq!(
        takeall(
            &mut con,
            &["t1", "5", "0.001", "1", "t2", "5", "0.001", "2"]
        )[0],
        1
    );
    assert_eq!(
        takeall(
            &mut con,
            &["t1", "5", "0.001", "10", "t2", "5", "0.001", "1"]
        )[0],
        0
    );
    assert_stats(&mut con, [12, 7, 3, 0, 4, 3], 6.5, 0.25);

    // A refund capped at the capacity counts what it added: 5 into 9 of 10 adds 1.
    assert_eq!(take(&mut con, "q", "10", "0.001", "1")[..2], [1, 9]);
    let refunded: Vec<i64> = cmd(&["TB.REFUND", "q", "10", "0.001", "5"])
        .query(&mut con)
        .unwrap();
    assert_eq!(refunded[1], 10);
    // 1 less the refill of the few ms since the take (rate 0.001): well under 1e-3.
    let added = amount(&tb_stats(&mut con), "tb_tokens_refunded") - 0.25;
    assert!((0.999..=1.0).contains(&added), "refund counted {added}");

    // The server checks only a minimum count for TB.PEEK (3 arguments) and TB.TAKEALL (4):
    // too many for TB.PEEK, or a partial group, reach the module, which refuses them with the
    // same message and counts them as errors.
    for args in [
        &["TB.PEEK", "k", "1", "1", "1", "extra"][..],
        &["TB.TAKEALL", "k", "1", "1", "1", "k2"][..],
    ] {
        let err = query_err(&mut con, &cmd(args));
        assert!(err.contains("wrong number of arguments"), "{args:?}: {err}");
    }
    let stats = tb_stats(&mut con);
    let counters: Vec<u64> = FIELDS[..6].iter().map(|f| counter(&stats, f)).collect();
    assert_eq!(counters, [14, 8, 3, 0, 5, 5]);
}

#[test]
fn info_tb_is_its_own_section_and_part_of_info_modules_and_everything() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "k", "3", "1", "1");
    for section in ["tb", "tb_stats", "modules", "everything"] {
        let info: String = redis::cmd("INFO").arg(section).query(&mut con).unwrap();
        assert!(info.contains("tb_calls:1"), "INFO {section}:\n{info}");
    }
    // Like every module section, not in the default INFO nor in INFO all.
    for section in ["default", "all"] {
        let info: String = redis::cmd("INFO").arg(section).query(&mut con).unwrap();
        assert!(!info.contains("tb_calls"), "INFO {section} shows tb_*");
    }
    // redis_exporter's --include-modules-metrics reads INFO MODULES but keeps only fields it
    // knows, so tb_* need its --script option: this script (in the README) returns them as
    // name/value pairs.
    let pairs: Vec<String> = redis::cmd("EVAL")
        .arg(INFO_TB_SCRIPT)
        .arg(0)
        .query(&mut con)
        .unwrap();
    let names: Vec<&str> = pairs.iter().step_by(2).map(String::as_str).collect();
    assert_eq!(names, FIELDS);
    assert_eq!(pairs[1], "1");
}

/// README: the INFO tb fields as name/value pairs, for redis_exporter's `--script`.
const INFO_TB_SCRIPT: &str = r"local out = {}
for name, value in string.gmatch(redis.call('INFO', 'tb'), '(tb_[%w_]+):([^\r\n]+)') do
  out[#out + 1] = name
  out[#out + 1] = value
end
return out
";

/// The module API has no hook for CONFIG RESETSTAT (no server event for it, on 7.0 nor later),
/// so the counters run from module load: graph them as counters (rate()), as with
/// any counter that survives a reset.
#[test]
fn config_resetstat_leaves_the_tb_counters_alone() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "k", "1", "0.001", "1");
    take(&mut con, "k", "1", "0.001", "1");
    let _ = query_err(&mut con, &cmd(&["TB.TAKE", "k", "0", "1", "1"]));
    let before = tb_stats(&mut con);
    assert!(info_field(&mut con, "errorstats", "errorstat_ERR").is_some());

    let _: () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut con)
        .unwrap();
    // The server's own statistics were reset...
    assert_eq!(info_field(&mut con, "errorstats", "errorstat_ERR"), None);
    // ...the module's were not.
    assert_eq!(tb_stats(&mut con), before);
    assert_stats(&mut con, [2, 1, 1, 0, 1, 1], 1.0, 0.0);
}

// ---------------------------------------------------------------------------------------------
// tb.shadow-mode

fn shadow_mode(con: &mut redis::Connection) -> String {
    let (name, value): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg("tb.shadow-mode")
        .query(con)
        .expect("CONFIG GET tb.shadow-mode");
    assert_eq!(name, "tb.shadow-mode");
    value
}

fn set_shadow_mode(con: &mut redis::Connection, value: &str) -> redis::RedisResult<()> {
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("tb.shadow-mode")
        .arg(value)
        .query(con)
}

/// TB.PEEK (never shadowed: it reports the real decision) and TB.TAKE at one instant: both
/// inside one transaction between two TIMEs that agree (retried, bounded). Also returns how many
/// transactions it took.
fn peek_then_take(
    con: &mut redis::Connection,
    key: &str,
    args: [&str; 3],
) -> (Vec<i64>, Vec<i64>, u64) {
    for attempt in 1..=50 {
        type Time = (i64, i64);
        let ((s1, u1), peeked, taken, (s2, u2)): (Time, Vec<i64>, Vec<i64>, Time) = redis::pipe()
            .atomic()
            .cmd("TIME")
            .add_command(cmd(&["TB.PEEK", key, args[0], args[1], args[2]]))
            .add_command(cmd(&["TB.TAKE", key, args[0], args[1], args[2]]))
            .cmd("TIME")
            .query(con)
            .expect("TIME/PEEK/TAKE/TIME");
        if s1 * 1000 + u1 / 1000 == s2 * 1000 + u2 / 1000 {
            return (peeked, taken, attempt);
        }
    }
    panic!("50 transactions in a row crossed a millisecond");
}

/// Denials are replied as allowed with the real retry_after_ms, nothing is written, and INFO
/// tells how many: tb_shadow_denied, also counted in tb_denied (the real decision).
#[test]
fn shadow_mode_set_at_runtime_reports_denials_as_allowed_and_writes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(shadow_mode(&mut con), "no");
    assert_eq!(take(&mut con, "k", "2", "0.001", "2")[..3], [1, 0, 0]);
    assert_eq!(
        take(&mut con, "k", "2", "0.001", "1")[0],
        0,
        "enforced by default"
    );

    set_shadow_mode(&mut con, "yes").unwrap();
    assert_eq!(shadow_mode(&mut con), "yes");
    let before = snapshot(&mut con, b"k");
    let (peeked, taken, attempts) = peek_then_take(&mut con, "k", ["2", "0.001", "1"]);
    assert_eq!(peeked[0], 0, "TB.PEEK shows the real decision");
    assert!(peeked[2] > 0, "{peeked:?}");
    assert_eq!(taken, vec![1, peeked[1], peeked[2], peeked[3]]);
    // More than the capacity: still let through, still "never" in retry_after_ms.
    let never = take(&mut con, "k", "2", "0.001", "5");
    assert_eq!(never[..3], [1, 0, -1]);
    assert_eq!(snapshot(&mut con, b"k"), before, "a shadow denial wrote");

    // Allowed requests still take their tokens.
    assert_eq!(take(&mut con, "j", "5", "0.001", "1")[..3], [1, 4, 0]);
    assert_eq!(stored_tokens(&mut con, "j"), 4.0);
    // TB.TAKEALL: all or nothing still holds; a shadowed denial charges no bucket.
    let j_before = snapshot(&mut con, b"j");
    let all = takeall(&mut con, &["j", "5", "0.001", "1", "k", "2", "0.001", "1"]);
    assert_eq!((all[0], all[4]), (1, 1), "{all:?}");
    assert_eq!(snapshot(&mut con, b"j"), j_before);
    assert_eq!(snapshot(&mut con, b"k"), before);

    // Each PEEK + TAKE attempt was two calls and one shadowed denial; besides: the drain, the
    // enforced denial, the "never", j, and the TB.TAKEALL.
    // calls allowed denied shadow created errors
    let expected = [5 + 2 * attempts, 2, 3 + attempts, 2 + attempts, 2, 0];
    assert_stats(&mut con, expected, 3.0, 0.0);

    set_shadow_mode(&mut con, "no").unwrap();
    assert_eq!(
        take(&mut con, "k", "2", "0.001", "1")[0],
        0,
        "enforced again"
    );
    let err = set_shadow_mode(&mut con, "maybe").expect_err("CONFIG SET maybe");
    assert!(error_text(&err).starts_with("ERR"), "{err}");
    assert_eq!(shadow_mode(&mut con), "no");
}

fn module_arg_server(module_args: &[&str]) -> Server {
    let module = module_path().display().to_string();
    let mut extra = vec!["--loadmodule", module.as_str()];
    extra.extend_from_slice(module_args);
    Server::start_without_module(&extra)
}

#[test]
fn shadow_mode_can_be_switched_on_at_load_time() {
    // `loadmodule <path> shadow-mode yes`
    let server = module_arg_server(&["shadow-mode", "yes"]);
    let mut con = server.conn();
    assert_eq!(shadow_mode(&mut con), "yes");
    take(&mut con, "k", "1", "0.001", "1");
    assert_eq!(take(&mut con, "k", "1", "0.001", "1")[..2], [1, 0]);
    assert_eq!(counter(&tb_stats(&mut con), "tb_shadow_denied"), 1);
    // And off again at runtime.
    set_shadow_mode(&mut con, "no").unwrap();
    assert_eq!(take(&mut con, "k", "1", "0.001", "1")[0], 0);

    // The module config in the configuration file (here: on the command line).
    let server = Server::start_with(&["--tb.shadow-mode", "yes"]);
    let mut con = server.conn();
    assert_eq!(shadow_mode(&mut con), "yes");
}

fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// A typo in `loadmodule` stops the server from starting, with the reason in its log,
/// rather than running with defaults the operator did not ask for.
#[test]
fn a_bad_load_argument_keeps_the_server_from_starting() {
    for (args, reason) in [
        (
            &["shadow-mode", "maybe"][..],
            "shadow-mode must be followed by yes or no",
        ),
        (
            &["shadow-mode"][..],
            "shadow-mode must be followed by yes or no",
        ),
        (
            &["shadow_mode", "yes"][..],
            "unknown load argument 'shadow_mode'",
        ),
    ] {
        let started = catch_unwind(AssertUnwindSafe(|| module_arg_server(args)));
        let text = match started {
            Ok(_) => panic!("the server started with loadmodule args {args:?}"),
            Err(payload) => panic_text(payload),
        };
        assert!(text.contains(reason), "{args:?}: {text}");
    }
}

// ---------------------------------------------------------------------------------------------
// ACL

fn acl_setuser(con: &mut redis::Connection, rules: &[&str]) {
    let mut setuser = cmd(&["ACL", "SETUSER"]);
    for rule in rules {
        setuser.arg(*rule);
    }
    let _: () = setuser.query(con).expect("ACL SETUSER");
}

/// A connection authenticated as `user`.
fn conn_as(server: &Server, user: &str, password: &str) -> redis::Connection {
    let mut con = server.conn();
    let _: () = redis::cmd("AUTH")
        .arg(user)
        .arg(password)
        .query(&mut con)
        .expect("AUTH");
    con
}

fn assert_noperm(con: &mut redis::Connection, args: &[&str]) {
    let err = query_err(con, &cmd(args));
    assert!(err.starts_with("NOPERM"), "{args:?}: {err}");
}

/// The rules README documents for Redis 7.0, where module commands are in no ACL category:
/// grant the commands by name and the keys by pattern. Works on every server.
#[test]
fn a_user_granted_tb_take_and_tb_peek_by_name_may_use_only_its_keys() {
    let server = Server::start();
    let mut admin = server.conn();
    acl_setuser(
        &mut admin,
        &["limiter", "on", ">pw", "~rl:*", "+tb.take", "+tb.peek"],
    );
    let mut limiter = conn_as(&server, "limiter", "pw");

    // One token per 1000 s, so the bucket is still there for the last check.
    assert_eq!(
        take(&mut limiter, "rl:user:1", "5", "0.001", "1")[..3],
        [1, 4, 0]
    );
    assert_eq!(peek(&mut limiter, "rl:user:1", "5", "0.001", "1")[0], 1);
    // Other keys, other commands: refused, nothing touched.
    assert_noperm(&mut limiter, &["TB.TAKE", "other:1", "5", "1", "1"]);
    assert!(!exists(&mut admin, "other:1"));
    assert_noperm(&mut limiter, &["TB.REFUND", "rl:user:1", "5", "1", "1"]);
    assert_noperm(&mut limiter, &["HSET", "rl:user:1", "tokens", "100"]);
    assert_noperm(&mut limiter, &["GET", "rl:user:1"]);
    assert_noperm(&mut limiter, &["FLUSHALL"]);
    assert_noperm(&mut limiter, &["EVAL", "return 1", "0"]);
    assert!(exists(&mut admin, "rl:user:1"));
}

fn acl_cat(con: &mut redis::Connection) -> Vec<String> {
    cmd(&["ACL", "CAT"]).query(con).expect("ACL CAT")
}

/// The ACL categories `command` carries, as COMMAND INFO reports them (its seventh field),
/// sorted. This is where the server documents them: on Redis 7.2 and 7.4 `ACL CAT <category>`
/// leaves module commands out although the categories apply.
fn categories_of(con: &mut redis::Connection, command: &str) -> Vec<String> {
    let info: redis::Value = cmd(&["COMMAND", "INFO", command])
        .query(con)
        .expect("COMMAND INFO");
    let redis::Value::Array(entries) = info else {
        panic!("COMMAND INFO {command}: {info:?}");
    };
    let Some(redis::Value::Array(entry)) = entries.first() else {
        panic!("COMMAND INFO {command}: {entries:?}");
    };
    let mut categories: Vec<String> = match entry.get(6) {
        Some(value) => redis::from_redis_value(value).expect("categories are strings"),
        None => Vec::new(), // before 7.0 there is no such field
    };
    categories.sort();
    categories
}

fn may_run(con: &mut redis::Connection, args: &[&str]) -> bool {
    match cmd(args).query::<redis::Value>(con) {
        Ok(_) => true,
        Err(e) if error_text(&e).starts_with("NOPERM") => false,
        Err(e) => panic!("{args:?}: {e}"),
    }
}

const TB_CALLS: [&[&str]; 8] = [
    &["TB.TAKE", "rl:1", "5", "1", "1"],
    &["TB.PEEK", "rl:1", "5", "1", "1"],
    &["TB.REFUND", "rl:1", "5", "1", "1"],
    &["TB.TAKEALL", "rl:1", "5", "1", "1", "rl:2", "5", "1", "1"],
    // Granted at once (a full bucket): no wait.
    &["TB.BTAKE", "rl:3", "5", "1", "1", "0"],
    // Granted at once (a free slot): no wait.
    &["TB.ACQUIRE", "rl:4", "1000", "60000", "0"],
    &["TB.RELEASE", "rl:4", "1-1"],
    &["TB.RENEW", "rl:4", "1-1", "1000"],
];

/// The TB commands, in the order of `TB_CALLS`.
const TB_COMMANDS: [&str; 8] = [
    "tb.take",
    "tb.peek",
    "tb.refund",
    "tb.takeall",
    "tb.btake",
    "tb.acquire",
    "tb.release",
    "tb.renew",
];

/// Which of the `TB_CALLS` a user with `rules` (and `~rl:*`) may run.
fn granted(
    server: &Server,
    admin: &mut redis::Connection,
    user: &str,
    rules: &[&str],
) -> [bool; 8] {
    let mut all = vec![user, "on", ">pw", "~rl:*"];
    all.extend_from_slice(rules);
    acl_setuser(admin, &all);
    let mut con = conn_as(server, user, "pw");
    TB_CALLS.map(|args| may_run(&mut con, args))
}

/// Categories where the server can set them (RM_SetCommandACLCategories: Redis 7.2+, Valkey)
/// and the module's own `@tb` where it can create one (RM_AddACLCategory: Redis 7.4+, Valkey
/// 8+). Detected from COMMAND INFO, never from a version number, and proven by running the
/// commands as restricted users. On Redis 7.0 the commands are in no category, so a category
/// rule such as `+@write` does not grant them.
#[test]
fn acl_categories_are_those_the_server_supports() {
    let server = Server::start();
    let mut admin = server.conn();
    let categories: Vec<Vec<String>> = TB_COMMANDS
        .iter()
        .map(|command| categories_of(&mut admin, command))
        .collect();
    let has_categories = !categories[0].is_empty();
    let has_tb = categories[0].iter().any(|c| c == "@tb");
    println!("COMMAND INFO categories: {categories:?}");

    if has_categories {
        let with_tb = |list: &[&str]| {
            let mut list: Vec<String> = list.iter().map(|c| c.to_string()).collect();
            if has_tb {
                list.push("@tb".into());
            }
            list.sort();
            list
        };
        assert_eq!(
            categories,
            [
                with_tb(&["@write", "@fast"]),
                with_tb(&["@read", "@fast"]),
                with_tb(&["@write", "@fast"]),
                with_tb(&["@write", "@slow"]),
                with_tb(&["@write", "@slow", "@blocking"]),
                with_tb(&["@write", "@slow", "@blocking"]),
                with_tb(&["@write", "@fast"]),
                with_tb(&["@write", "@fast"]),
            ]
        );
        // take, peek, refund, takeall, btake, acquire, release, renew
        let (t, f) = (true, false);
        assert_eq!(
            granted(&server, &mut admin, "w", &["+@write"]),
            [t, f, t, t, t, t, t, t]
        );
        assert_eq!(
            granted(&server, &mut admin, "r", &["+@read"]),
            [f, t, f, f, f, f, f, f]
        );
        assert_eq!(
            granted(&server, &mut admin, "f", &["+@fast"]),
            [t, t, t, f, f, f, t, t]
        );
        assert_eq!(
            granted(&server, &mut admin, "b", &["+@blocking"]),
            [f, f, f, f, t, t, f, f]
        );
    } else {
        assert!(categories.iter().all(|c| c.is_empty()), "{categories:?}");
        let rules = ["+@write", "+@read", "+@fast", "+@slow", "+@blocking"];
        assert_eq!(granted(&server, &mut admin, "w", &rules), [false; 8]);
    }

    // A server that lists the category `tb` gives it to every TB command.
    if acl_cat(&mut admin).iter().any(|c| c == "tb") {
        assert!(
            has_tb,
            "ACL CAT lists tb, COMMAND INFO does not: {categories:?}"
        );
    }
    if has_tb {
        assert_eq!(
            granted(&server, &mut admin, "limiter", &["+@tb"]),
            [true; 8]
        );
        let mut limiter = conn_as(&server, "limiter", "pw");
        assert_noperm(&mut limiter, &["TB.TAKE", "other:1", "5", "1", "1"]);
        assert_noperm(&mut limiter, &["HSET", "rl:1", "tokens", "100"]);
        assert_noperm(&mut limiter, &["FLUSHALL"]);
        assert!(!exists(&mut admin, "other:1"));
    }
}

#[test]
fn info_tb_shows_the_longest_queue_against_tb_max_waiters() {
    let server = Server::start_with(&["--tb.max-waiters", "50"]);
    let mut con = server.conn();
    assert_eq!(tb_field(&mut con, "tb_longest_queue"), "0");
    assert_eq!(tb_field(&mut con, "tb_max_waiters"), "50");
    drain(&mut con, "busy", "1", "0.001");
    drain(&mut con, "quiet", "1", "0.001");
    let mut waiters: Vec<RawClient> = Vec::new();
    for key in ["busy", "busy", "busy", "quiet"] {
        let mut waiter = RawClient::connect(&server);
        waiter.send(&["TB.BTAKE", key, "1", "0.001", "1", "0"]);
        waiters.push(waiter);
    }
    wait_for_waiting(&mut con, 4);
    assert_eq!(tb_field(&mut con, "tb_longest_queue"), "3");
    redis::cmd("CONFIG")
        .arg(&["SET", "tb.max-waiters", "3"])
        .exec(&mut con)
        .unwrap();
    assert_eq!(tb_field(&mut con, "tb_max_waiters"), "3");
    drop(waiters);
    wait_for_waiting(&mut con, 0);
    assert_eq!(tb_field(&mut con, "tb_longest_queue"), "0");
}
