//! The jobs of the options and new commands (locks, reservations, post-paid costs,
//! TB.THROTTLE) through what only the module has: TB.BTAKE's queue, replication, the AOF, a
//! failover, a cluster, shadow mode and COMMAND GETKEYS. What each job does, on the module
//! and on its Lua twin alike, is in locks.rs, unblock.rs, reservations.rs, charge.rs,
//! throttle.rs and options.rs.
//!
//! The contracts are in docs/commands.md; the hash and what is replicated,
//! src/bucket/hash.rs. Timing: figures are read from the fields the server stored and its
//! own clock (TIME), never from the test's sleeps. Every wait is a bounded poll.

use std::net::TcpListener;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::harness::*;
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{ConnectionLike, Value};

// ---------------------------------------------------------------------------------------
// Calls
// ---------------------------------------------------------------------------------------

/// A command from its words (the name first), e.g. `command("TB.TAKE k 5 1 1")`.
fn command(line: &str) -> redis::Cmd {
    let mut words = line.split_whitespace();
    let mut cmd = redis::cmd(words.next().unwrap_or(""));
    for word in words {
        cmd.arg(word);
    }
    cmd
}

/// The integer reply of `line`; panics, naming the call, on an error.
fn call(con: &mut impl ConnectionLike, line: &str) -> Vec<i64> {
    command(line)
        .query(con)
        .unwrap_or_else(|e| panic!("{line} failed: {e}"))
}

/// TB.UNBLOCK's reply: 1 when it lifted a lock.
fn unblock(con: &mut impl ConnectionLike, key: &str) -> i64 {
    command(&format!("TB.UNBLOCK {key}"))
        .query(con)
        .unwrap_or_else(|e| panic!("TB.UNBLOCK {key} failed: {e}"))
}

/// The exact error text of `line`; panics if the call succeeds.
fn error(con: &mut impl ConnectionLike, line: &str) -> String {
    match command(line).query::<Value>(con) {
        Ok(v) => panic!("expected an error from {line}, got {v:?}"),
        Err(e) => error_text(&e),
    }
}

/// The module's slow locked bucket (`Backend::locked_slow_bucket`): every call on it is
/// denied for the whole test.
fn locked_slow_bucket(con: &mut redis::Connection, key: &str, block_ms: &str) -> (i64, i64, i64) {
    Backend::Module.locked_slow_bucket(con, key, block_ms)
}

// ---------------------------------------------------------------------------------------
// TB.BTAKE's queue (the twin has no TB.BTAKE: a script cannot wait)
// ---------------------------------------------------------------------------------------

#[test]
fn tb_btake_on_a_locked_key_is_denied_at_once_and_adds_no_strike() {
    let server = Server::start();
    let mut con = server.conn();
    let lock = locked_slow_bucket(&mut con, "tb:lock", "60000");
    // A refund makes the bucket hold its token: only the lock denies it.
    assert_eq!(call(&mut con, "TB.REFUND tb:lock 1 0.001 1")[0], 1);
    let started = Instant::now();
    let reply = call(&mut con, "TB.BTAKE tb:lock 1 0.001 1 10000");
    assert_eq!(reply[..2], [0, 1], "{reply:?}");
    // Had it waited, it would have waited for its whole timeout of 10 s.
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_secs(5),
        "TB.BTAKE waited {waited:?}"
    );
    assert_eq!(stored_lock(&mut con, "tb:lock"), lock, "no new strike");
}

#[test]
fn tb_btake_waiters_queued_before_a_lock_are_served_as_their_tokens_come() {
    let server = Server::start();
    let mut con = server.conn();
    // 1 token, 2 per second: the waiter's token is back 500 ms after the drain.
    let drained_at = drain(&mut con, "tb:queued", "1", "2");
    let mut waiter = RawClient::connect(&server);
    waiter.send(&["TB.BTAKE", "tb:queued", "1", "2", "1", "10000"]);
    wait_for_waiting(&mut con, 1);
    // A denial with BLOCK locks the key for 5 s while the waiter waits.
    let reply = call(&mut con, "TB.TAKE tb:queued 1 2 1 BLOCK 5000");
    assert_eq!(reply[0], 0, "{reply:?}");
    let (until, _, probation) = stored_lock(&mut con, "tb:queued");
    // The waiter is served when its token is back, long before the lock ends.
    match waiter.reply_within(Duration::from_secs(4)) {
        Some(Resp::Ints(reply)) => assert_eq!(reply[..3], [1, 0, 0], "{reply:?}"),
        other => panic!("the waiter got {other:?}"),
    }
    let served_at = stored_last_refill(&mut con, "tb:queued");
    assert!(
        served_at >= drained_at + 500 && served_at < until,
        "served at {served_at}"
    );
    // Its write keeps the lock, and the deadline that covers the probation.
    assert_eq!(stored_lock(&mut con, "tb:queued").0, until);
    assert!(pexpiretime(&mut con, "tb:queued") >= probation);
    // A new TB.BTAKE is turned away at once.
    let reply = call(&mut con, "TB.BTAKE tb:queued 1 2 1 10000");
    assert_eq!(reply[0], 0, "{reply:?}");
}

// ---------------------------------------------------------------------------------------
// Replicas, the AOF, a failover
// ---------------------------------------------------------------------------------------
//
// On the module only: the twin's writes reach replicas and the AOF as the same commands,
// which tests/it/twin/differential.rs compares call by call.

#[test]
fn a_denial_during_a_lock_writes_nothing_to_the_replication_stream() {
    let master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    let mut m = master.conn();
    // 5 tokens, 1 per 1000 s, locked for a minute: nothing expires while the test runs.
    drain(&mut m, "tb:quiet", "5", "0.001");
    assert_eq!(call(&mut m, "TB.TAKE tb:quiet 5 0.001 1 BLOCK 60000")[0], 0);
    wait_for_replica(&master, &replica);
    let offset = repl_offset(&mut m);
    let before = snapshot(&mut m, b"tb:quiet");

    let denied = [
        "TB.TAKE tb:quiet 5 0.001 1",
        "TB.TAKE tb:quiet 5 0.001 0",
        "TB.TAKE tb:quiet 5 0.001 1 BLOCK 60000 MAXBLOCK 600000",
        "TB.TAKE tb:quiet 5 0.001 1 MAXWAIT 100000000",
        "TB.PEEK tb:quiet 5 0.001 1",
        "TB.BTAKE tb:quiet 5 0.001 1 1000",
        "TB.TAKEALL tb:quiet 5 0.001 1 tb:full 5 0.001 1",
        "TB.TAKEALL tb:full 5 0.001 1 tb:quiet 5 0.001 1 BLOCK 1000",
        "TB.THROTTLE tb:quiet 4 1 1000",
    ];
    for _ in 0..20 {
        for line in denied {
            let reply = call(&mut m, line);
            let limited = if line.starts_with("TB.THROTTLE") {
                1
            } else {
                0
            };
            assert_eq!(reply[0], limited, "{line} is denied: {reply:?}");
        }
    }
    assert_eq!(repl_offset(&mut m), offset, "master_repl_offset moved");
    let after = snapshot(&mut m, b"tb:quiet");
    assert_eq!(after, before, "the key is as it was");
    assert!(!exists(&mut m, "tb:full"), "TB.TAKEALL took nothing");
    assert_replica_holds_the_same_buckets(&master, &replica, &["tb:quiet"]);
}

/// Locks, charges and reservations on slow buckets (1 token per 1000 s: nothing expires
/// or refills visibly while a test runs); returns the keys.
fn jobs(con: &mut redis::Connection) -> Vec<&'static str> {
    // A lock: the hash holds all five fields.
    locked_slow_bucket(con, "tb:j:lock", "60000");
    // A lock lifted: only tokens and last_refill are left.
    locked_slow_bucket(con, "tb:j:lifted", "60000");
    assert_eq!(unblock(con, "tb:j:lifted"), 1);
    // A charge into debt, a refund on top of it.
    let charge = call(con, "TB.CHARGE tb:j:debt 10 0.001 13.5 MAXDEBT 2.25");
    assert_eq!(charge[0], 1);
    assert_eq!(call(con, "TB.REFUND tb:j:debt 10 0.001 0.75")[0], 1);
    // Reservations in a row.
    drain(con, "tb:j:res", "4", "0.001");
    for n in ["1", "0.5"] {
        let reply = call(
            con,
            &format!("TB.TAKE tb:j:res 4 0.001 {n} MAXWAIT 10000000"),
        );
        assert_eq!(reply[0], 1, "{reply:?}");
    }
    // TB.TAKEALL with options: one reservation, one lock from a denial.
    call(
        con,
        "TB.TAKEALL {t}:a 4 0.001 1 {t}:b 4 0.001 1 MAXWAIT 10000000",
    );
    drain(con, "{t}:c", "1", "0.001");
    call(
        con,
        "TB.TAKEALL {t}:a 4 0.001 1 {t}:c 1 0.001 1 BLOCK 60000 MAXBLOCK 120000",
    );
    // TB.THROTTLE writes the same bucket.
    assert_eq!(call(con, "TB.THROTTLE tb:j:cell 9 1 1000 3")[0], 0);
    vec![
        "tb:j:lock",
        "tb:j:lifted",
        "tb:j:debt",
        "tb:j:res",
        "{t}:a",
        "{t}:b",
        "{t}:c",
        "tb:j:cell",
    ]
}

#[test]
fn a_replica_ends_with_the_masters_fields_and_deadlines_after_locks_charges_and_reservations() {
    let master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    let mut m = master.conn();
    let keys = jobs(&mut m);
    assert!(has_lock_fields(&mut m, "tb:j:lock") && has_lock_fields(&mut m, "{t}:c"));
    assert!(!has_lock_fields(&mut m, "tb:j:lifted"));
    assert!(stored_tokens(&mut m, "tb:j:debt") < 0.0);
    assert!(stored_tokens(&mut m, "tb:j:res") < 0.0);
    assert_replica_holds_the_same_buckets(&master, &replica, &keys);
    // The replica answers from the lock: TB.PEEK is denied there too.
    let mut r = replica.conn();
    assert_eq!(call(&mut r, "TB.PEEK tb:j:lock 1 0.001 0")[0], 0);
}

#[test]
fn an_aof_reload_ends_with_the_masters_fields_and_deadlines_after_locks_charges_and_reservations() {
    let mut server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    let keys = jobs(&mut con);
    let logged = aof_without_select(&server, &mut con);
    assert_no_tb_command(&logged);
    // A lock starts with one HSET of all five fields, then the PEXPIREAT.
    let fields = hgetall(&mut con, "tb:j:lock");
    let lock_start = logged
        .iter()
        .position(|c| c[0].eq_ignore_ascii_case(b"HSET") && c[1] == b"tb:j:lock" && c.len() == 12)
        .unwrap_or_else(|| panic!("no HSET of five fields for tb:j:lock: {logged:?}"));
    let mut expected = vec![b"HSET".to_vec(), b"tb:j:lock".to_vec()];
    for name in [
        "tokens",
        "last_refill",
        "locked_until",
        "strikes",
        "probation_until",
    ] {
        expected.push(name.as_bytes().to_vec());
        expected.push(fields[name].as_bytes().to_vec());
    }
    let mut hset = logged[lock_start].clone();
    hset[0] = b"HSET".to_vec();
    assert_eq!(hset, expected);
    let deadline = pexpiretime(&mut con, "tb:j:lock").to_string();
    let pexpireat = argv(&["PEXPIREAT", "tb:j:lock", &deadline]);
    assert_eq!(logged[lock_start + 1], pexpireat);
    let before: Vec<_> = keys.iter().map(|key| bucket(&mut con, key)).collect();

    server.restart();
    let mut con = server.conn();
    let after: Vec<_> = keys.iter().map(|key| bucket(&mut con, key)).collect();
    assert_eq!(after, before, "fields and PEXPIRETIME after the reload");
    let reply = call(&mut con, "TB.TAKE tb:j:lock 1 0.001 0");
    assert_eq!(reply[0], 0, "still locked");
}

#[test]
fn a_lock_survives_a_failover_to_the_promoted_replica() {
    let mut master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    let mut m = master.conn();
    let lock = locked_slow_bucket(&mut m, "tb:fo", "60000");
    // A refund makes the bucket hold a token: only the lock denies it.
    assert_eq!(call(&mut m, "TB.REFUND tb:fo 1 0.001 1")[0], 1);
    wait_for_replica(&master, &replica);
    let held = bucket(&mut m, "tb:fo");
    master.stop();

    let mut r = replica.conn();
    promote(&mut r);
    let promoted = bucket(&mut r, "tb:fo");
    assert_eq!(
        promoted, held,
        "fields and deadline on the promoted replica"
    );
    let (before, reply, after) = Backend::Module.timed(&mut r, "take", "tb:fo", "1 0.001 1");
    let denied = &reply[..2];
    assert_eq!(
        denied,
        [0, 1],
        "locked there too, with the token in it: {reply:?}"
    );
    assert_within("retry_after_ms", reply[2], lock.0 - after, lock.0 - before);
    assert_eq!(bucket(&mut r, "tb:fo"), held, "the denial wrote nothing");
    // It can be lifted there.
    assert_eq!(unblock(&mut r, "tb:fo"), 1);
    assert_eq!(call(&mut r, "TB.TAKE tb:fo 1 0.001 1")[..2], [1, 0]);
}

// ---------------------------------------------------------------------------------------
// COMMAND GETKEYS (of the module's commands; FCALL names its keys by count)
// ---------------------------------------------------------------------------------------

#[test]
fn command_getkeys_of_tb_takeall_leaves_its_options_out() {
    let server = Server::start();
    let mut con = server.conn();
    let line = "COMMAND GETKEYS TB.TAKEALL a 1 1 1 b 1 1 1 MAXWAIT 10 BLOCK 5 MAXBLOCK 50";
    let keys: Vec<String> = command(line).query(&mut con).expect(line);
    assert_eq!(keys, ["a", "b"]);
    for line in [
        "COMMAND GETKEYS TB.TAKE k 1 1 1 BLOCK 5",
        "COMMAND GETKEYS TB.CHARGE k 1 1 1 MAXDEBT 5",
        "COMMAND GETKEYS TB.UNBLOCK k",
        "COMMAND GETKEYS TB.THROTTLE k 1 1 1 1",
    ] {
        let keys: Vec<String> = command(line).query(&mut con).expect(line);
        assert_eq!(keys, ["k"], "{line}");
    }
}

// ---------------------------------------------------------------------------------------
// A cluster
// ---------------------------------------------------------------------------------------
//
// On the module only: these are the module's key specs at work; an FCALL is routed by the
// keys it counts, as any script's.

/// How long the cluster may take to agree on something.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);
const SLOT_RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// Three masters owning every slot (assembled as tests/it/topology/cluster.rs does, without replicas).
struct Cluster {
    nodes: Vec<Server>,
}

impl Cluster {
    fn start() -> Cluster {
        let nodes: Vec<(Server, u16)> = (0..3).map(|_| cluster_node()).collect();
        for (i, ((node, _), (first, last))) in nodes.iter().zip(SLOT_RANGES).enumerate() {
            let mut con = node.conn();
            ok(&mut con, &format!("CLUSTER SET-CONFIG-EPOCH {}", i + 1));
            ok(&mut con, &format!("CLUSTER ADDSLOTSRANGE {first} {last}"));
        }
        let mut first = nodes[0].0.conn();
        for (node, bus) in &nodes[1..] {
            let meet = format!("CLUSTER MEET 127.0.0.1 {} {bus}", node.port);
            ok(&mut first, &meet);
        }
        let cluster = Cluster {
            nodes: nodes.into_iter().map(|(node, _)| node).collect(),
        };
        cluster.wait_converged();
        cluster
    }

    /// Every node says `cluster_state:ok` and serves the same three slot ranges.
    fn wait_converged(&self) {
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        loop {
            let maps: Vec<Option<Vec<(u16, u16, u16)>>> = self
                .nodes
                .iter()
                .map(|node| {
                    let mut con = node.conn();
                    let info: String = command("CLUSTER INFO").query(&mut con).ok()?;
                    info.contains("cluster_state:ok")
                        .then(|| slot_map(&mut con))
                })
                .collect();
            if maps
                .iter()
                .all(|m| m.as_ref().is_some_and(|m| m.len() == 3))
                && maps.windows(2).all(|w| w[0] == w[1])
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not converge: {maps:?}"
            );
            sleep(Duration::from_millis(50));
        }
    }

    fn client(&self) -> ClusterConnection {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port))
            .collect();
        let con = ClusterClient::new(seeds)
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection");
        con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        con
    }

    fn node(&self, port: u16) -> &Server {
        self.nodes
            .iter()
            .find(|n| n.port == port)
            .expect("a node on that port")
    }

    /// The port of the master owning `key`'s slot.
    fn owner_of(&self, key: &str) -> u16 {
        let mut con = self.nodes[0].conn();
        let slot: u16 = command(&format!("CLUSTER KEYSLOT {key}"))
            .query(&mut con)
            .unwrap();
        slot_map(&mut con)
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|r| r.2)
            .expect("every slot is served")
    }

    /// A key made from `prefix` whose slot the node on `port` owns.
    fn key_on(&self, port: u16, prefix: &str) -> String {
        (0..100_000)
            .map(|i| format!("{prefix}-{i}"))
            .find(|key| self.owner_of(key) == port)
            .expect("a key for that node")
    }

    fn masters(&self) -> Vec<u16> {
        let mut ports: Vec<u16> = self.nodes.iter().map(|n| n.port).collect();
        ports.sort_unstable();
        ports
    }
}

/// A cluster node on a free bus port (retried if another process took it meanwhile).
fn cluster_node() -> (Server, u16) {
    for attempt in 1..=3 {
        let bus = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        match std::panic::catch_unwind(|| {
            start_cluster_node(bus, &["--cluster-node-timeout", "5000"])
        }) {
            Ok(node) => return (node, bus),
            Err(panic) if attempt == 3 => std::panic::resume_unwind(panic),
            Err(_) => eprintln!("cluster node with bus port {bus} did not start; retrying"),
        }
    }
    unreachable!()
}

/// `line` answered OK.
fn ok(con: &mut redis::Connection, line: &str) {
    let reply: String = command(line)
        .query(con)
        .unwrap_or_else(|e| panic!("{line}: {e}"));
    assert_eq!(reply, "OK", "{line}");
}

/// `CLUSTER SLOTS` as sorted `(first, last, master port)`.
fn slot_map(con: &mut redis::Connection) -> Vec<(u16, u16, u16)> {
    let ranges: Vec<Value> = command("CLUSTER SLOTS").query(con).expect("CLUSTER SLOTS");
    let mut map: Vec<(u16, u16, u16)> = ranges
        .iter()
        .map(|range| {
            let Value::Array(parts) = range else {
                panic!("CLUSTER SLOTS range: {range:?}")
            };
            let Value::Array(master) = &parts[2] else {
                panic!("CLUSTER SLOTS master: {:?}", parts[2])
            };
            (
                redis::from_redis_value(&parts[0]).expect("first slot"),
                redis::from_redis_value(&parts[1]).expect("last slot"),
                redis::from_redis_value(&master[1]).expect("master port"),
            )
        })
        .collect();
    map.sort_unstable();
    map
}

#[test]
fn the_new_commands_and_options_are_routed_to_the_node_owning_their_keys() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let masters = cluster.masters();
    for port in &masters {
        let key = cluster.key_on(*port, "job");
        let tag = format!("{{{key}}}");
        let (a, b) = (format!("{tag}:a"), format!("{tag}:b"));
        let options = "MAXWAIT 5 BLOCK 60000 MAXBLOCK 120000";
        let calls = [
            format!("TB.TAKE {key} 10 0.001 4 MAXWAIT 1000 BLOCK 60000 MAXBLOCK 120000"),
            format!("TB.CHARGE {key} 10 0.001 2 MAXDEBT 5"),
            format!("TB.THROTTLE {key} 9 1 1000 1"),
            format!("TB.TAKEALL {a} 10 0.001 1 {b} 10 0.001 1 {options}"),
        ];
        for line in &calls {
            let limited = if line.starts_with("TB.THROTTLE") {
                0
            } else {
                1
            };
            assert_eq!(call(&mut client, line)[0], limited, "{line}");
        }
        // A denial with BLOCK through the cluster client locks the key on its owner.
        let reply = call(
            &mut client,
            &format!("TB.TAKE {key} 10 0.001 10 BLOCK 60000"),
        );
        assert_eq!(reply[0], 0);
        let mut owner = cluster.node(*port).conn();
        assert_eq!(stored_lock(&mut owner, &key).1, 1);
        assert!(stored_tokens(&mut owner, &key) > 0.0);
        assert!(exists(&mut owner, &a) && exists(&mut owner, &b));
        let lifted = unblock(&mut client, &key);
        assert_eq!(lifted, 1, "TB.UNBLOCK reaches the owner");
        assert!(!has_lock_fields(&mut owner, &key));

        // Every other node redirects each of them to the owner.
        let slot: u16 = command(&format!("CLUSTER KEYSLOT {key}"))
            .query(&mut owner)
            .unwrap();
        let moved = format!("MOVED {slot} 127.0.0.1:{port}");
        for other in masters.iter().filter(|p| *p != port) {
            let mut con = cluster.node(*other).conn();
            let unblock = format!("TB.UNBLOCK {key}");
            for line in calls.iter().chain([&unblock]) {
                assert_eq!(error(&mut con, line), moved, "{line} on {other}");
            }
            let count: i64 = command(&format!("CLUSTER COUNTKEYSINSLOT {slot}"))
                .query(&mut con)
                .unwrap();
            assert_eq!(count, 0, "node {other} holds nothing of this slot");
        }
    }
}

#[test]
fn tb_takeall_with_options_across_slots_is_crossslot_and_takes_nothing() {
    let cluster = Cluster::start();
    let masters = cluster.masters();
    let a = cluster.key_on(masters[0], "untagged");
    let b = cluster.key_on(masters[1], "untagged");
    let mut con = cluster.node(masters[0]).conn();
    for options in ["MAXWAIT 1000", "BLOCK 1000 MAXBLOCK 2000"] {
        let line = format!("TB.TAKEALL {a} 10 0.001 1 {b} 10 0.001 1 {options}");
        let text = error(&mut con, &line);
        assert!(text.starts_with("CROSSSLOT"), "{line}: {text}");
        let mut client = cluster.client();
        let text = error(&mut client, &line);
        assert!(
            text.starts_with("CROSSSLOT"),
            "through the cluster client: {text}"
        );
    }
    let mut owner_b = cluster.node(masters[1]).conn();
    assert!(
        !exists(&mut con, &a) && !exists(&mut owner_b, &b),
        "nothing was taken"
    );
}

// ---------------------------------------------------------------------------------------
// Shadow mode (the twin has none: docs/lua-fallback.md)
// ---------------------------------------------------------------------------------------

/// docs/operations.md#shadow-mode: "nothing is written" for a denial that shadow mode
/// reports as allowed; with `BLOCK`, that includes the lock.
#[test]
fn in_shadow_mode_a_denial_with_block_is_reported_allowed_and_writes_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    ok(&mut con, "CONFIG SET tb.shadow-mode yes");
    drain(&mut con, "tb:shadow", "1", "0.001");
    let before = snapshot(&mut con, b"tb:shadow");
    let reply = call(&mut con, "TB.TAKE tb:shadow 1 0.001 1 BLOCK 60000");
    assert_eq!(reply[0], 1, "reported allowed: {reply:?}");
    Backend::Module.assert_counter(&mut con, "tb_shadow_denied", 1);
    let stored = hgetall(&mut con, "tb:shadow");
    assert!(
        !has_lock_fields(&mut con, "tb:shadow"),
        "shadow mode stored a lock: {stored:?}"
    );
    assert_eq!(snapshot(&mut con, b"tb:shadow"), before, "nothing written");
}
