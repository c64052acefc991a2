//! redis-tb in a real cluster: three masters (and a replica where a test needs one), every
//! node a server of `TB_SERVER` with the module loaded, driven through the `redis` crate's
//! cluster client.
//!
//! What is checked:
//! - buckets land on the node that owns their slot, on every master; a node that does not
//!   own a key answers MOVED and the cluster client follows it;
//! - hash tags put the buckets of one caller on one node, so TB.TAKEALL (several limits at
//!   once) works there, and keys of different slots get CROSSSLOT;
//! - a manual failover (`CLUSTER FAILOVER` on the replica) keeps every bucket's fields
//!   byte-identical and its absolute deadline (PEXPIRETIME) equal: a client that keeps
//!   taking after the failover continues from the same tokens, not from a full bucket;
//! - moving a slot that holds buckets keeps their state: the classic way
//!   (`SETSLOT IMPORTING/MIGRATING`, `MIGRATE ... KEYS`, `SETSLOT NODE`, with the client
//!   following ASK during the move and MOVED after it), and on servers that have it,
//!   Valkey 9's atomic `CLUSTER MIGRATESLOTS` (which refuses to run unless every loaded
//!   module opted in; the module does on Valkey >= 9).
//!
//! The cluster is assembled by hand (`SET-CONFIG-EPOCH`, `ADDSLOTSRANGE`, `MEET`), the way
//! `redis-cli --cluster create` does it, so no CLI is needed. Every wait is a bounded poll
//! (`CLUSTER_TIMEOUT`). Buckets use a refill rate of 1 token per 1000 s, so the few seconds
//! a test runs never show up in `remaining`: the numbers asserted are exact.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::harness;
use crate::harness::{
    drain, hgetall_bytes, id_parts, members, pexpiretime, start_cluster_node, RawClient, Resp,
    Server,
};
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::{ConnectionLike, Value};

/// Upper bound of every wait for the cluster to agree on something.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

/// Slot ranges of the three masters, as `redis-cli --cluster create` splits them.
const SLOT_RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

/// A slow bucket: 10 tokens, 1 token back per 1000 s.
const CAPACITY: &str = "10";
const RATE: &str = "0.001";

// ---------------------------------------------------------------------------------------
// The cluster
// ---------------------------------------------------------------------------------------

/// One cluster node: a server with the module and `cluster-enabled yes`.
struct Node {
    server: Server,
    /// The cluster bus port, given explicitly: the default (port + 10000) can overflow
    /// for the ephemeral ports the harness picks.
    bus_port: u16,
    /// `CLUSTER MYID`.
    id: String,
}

impl Node {
    /// Starts a node; if the bus port we picked was taken in the meantime (the harness only
    /// retries its own port), tries again with another one.
    fn start() -> Node {
        const ATTEMPTS: usize = 3;
        for attempt in 1..=ATTEMPTS {
            let bus_port = free_port();
            let started = std::panic::catch_unwind(|| Node::start_on(bus_port));
            match started {
                Ok(node) => return node,
                Err(panic) if attempt == ATTEMPTS => std::panic::resume_unwind(panic),
                Err(_) => {
                    eprintln!("cluster node with bus port {bus_port} did not start; retrying")
                }
            }
        }
        unreachable!("the last attempt returns or panics")
    }

    fn start_on(bus_port: u16) -> Node {
        // Only manual failovers happen here; a short timeout just makes a lost node noticed
        // sooner. 5 s leaves room for a loaded 2-core machine.
        let server = start_cluster_node(bus_port, &["--cluster-node-timeout", "5000"]);
        let id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut server.conn())
            .expect("CLUSTER MYID");
        Node {
            server,
            bus_port,
            id,
        }
    }

    fn port(&self) -> u16 {
        self.server.port
    }

    fn con(&self) -> redis::Connection {
        self.server.conn()
    }
}

struct Cluster {
    nodes: Vec<Node>,
}

impl Cluster {
    /// Three masters owning all 16384 slots, every node agreeing on who owns what.
    fn start() -> Cluster {
        let nodes: Vec<Node> = (0..3).map(|_| Node::start()).collect();
        for (i, (node, (first, last))) in nodes.iter().zip(SLOT_RANGES).enumerate() {
            let mut con = node.con();
            // Distinct epochs up front, as `redis-cli --cluster create` does, so no epoch
            // collision has to be resolved by gossip later.
            ok(
                &mut con,
                redis::cmd("CLUSTER").arg("SET-CONFIG-EPOCH").arg(i + 1),
            );
            ok(
                &mut con,
                redis::cmd("CLUSTER")
                    .arg("ADDSLOTSRANGE")
                    .arg(first)
                    .arg(last),
            );
        }
        let cluster = Cluster { nodes };
        let mut first = cluster.nodes[0].con();
        for node in &cluster.nodes[1..] {
            cluster.meet(&mut first, node);
        }
        cluster.wait_converged();
        cluster
    }

    fn meet(&self, con: &mut redis::Connection, node: &Node) {
        ok(
            con,
            redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(node.port())
                .arg(node.bus_port),
        );
    }

    /// Adds a replica of `master` (by port); returns its index in `nodes` once it has
    /// finished its initial sync and every node knows it as that master's replica.
    fn add_replica(&mut self, master_port: u16) -> usize {
        let master_id = self.node(master_port).id.clone();
        let replica = Node::start();
        self.meet(&mut self.node(master_port).con(), &replica);
        let mut con = replica.con();
        // REPLICATE needs the replica to know the master already (gossip after MEET).
        wait_for("the new node to accept CLUSTER REPLICATE", || {
            redis::cmd("CLUSTER")
                .arg("REPLICATE")
                .arg(&master_id)
                .query::<String>(&mut con)
                .map_err(|e| e.to_string())
        });
        self.nodes.push(replica);
        let index = self.nodes.len() - 1;
        let replica_id = self.nodes[index].id.clone();
        wait_for("the replica's initial sync", || {
            let info = info(&mut con, "replication");
            match (
                field(&info, "master_link_status"),
                field(&info, "master_sync_in_progress"),
            ) {
                (Some("up"), Some("0")) => Ok(()),
                _ => Err(info),
            }
        });
        for node in &self.nodes {
            let mut con = node.con();
            wait_for("every node to know the replica", || {
                let nodes = cluster_nodes(&mut con);
                match nodes.get(&replica_id) {
                    Some(line) if line.flags.contains("slave") && line.master == master_id => {
                        Ok(())
                    }
                    other => Err(format!("{other:?}")),
                }
            });
        }
        self.wait_converged();
        index
    }

    fn node(&self, port: u16) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .unwrap_or_else(|| panic!("no node on port {port}"))
    }

    /// Waits until every node reports `cluster_state:ok`, knows every other node (no
    /// handshake or failure flag left) and has the same slot map as the others.
    fn wait_converged(&self) {
        let total = self.nodes.len();
        wait_for("the cluster to converge", || {
            let mut maps = Vec::new();
            for node in &self.nodes {
                let mut con = node.con();
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut con)
                    .map_err(|e| e.to_string())?;
                if field(&info, "cluster_state") != Some("ok") {
                    return Err(format!("node {}: {info}", node.port()));
                }
                let nodes = cluster_nodes(&mut con);
                let settled = nodes.len() == total
                    && nodes.values().all(|n| {
                        !["handshake", "fail", "noaddr"]
                            .iter()
                            .any(|f| n.flags.split(',').any(|g| g.starts_with(f)))
                    });
                if !settled {
                    return Err(format!("node {} sees {nodes:?}", node.port()));
                }
                maps.push(slot_map(&mut con));
            }
            if maps.windows(2).all(|w| w[0] == w[1]) {
                Ok(())
            } else {
                Err(format!("slot maps differ: {maps:?}"))
            }
        });
    }

    /// Waits until every node says `slot` belongs to the node on `port`.
    fn wait_owner(&self, slot: u16, port: u16) {
        for node in &self.nodes {
            let mut con = node.con();
            wait_for(
                &format!("node {} to see slot {slot} on {port}", node.port()),
                || {
                    let owner = owner_port(&slot_map(&mut con), slot);
                    if owner == port {
                        Ok(())
                    } else {
                        Err(format!("owner is {owner}"))
                    }
                },
            );
        }
    }

    /// A cluster client seeded with every node; reads time out instead of hanging.
    fn client(&self) -> ClusterConnection {
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}/", n.port()))
            .collect();
        let con = ClusterClient::new(seeds)
            .expect("cluster client")
            .get_connection()
            .expect("cluster connection");
        con.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        con.set_write_timeout(Some(Duration::from_secs(10)))
            .expect("write timeout");
        con
    }

    /// The current owner of `key`'s slot, by port (asking the first node).
    fn owner_of(&self, key: &str) -> u16 {
        let mut con = self.nodes[0].con();
        owner_port(&slot_map(&mut con), keyslot(&mut con, key))
    }

    /// A key (without a hash tag) whose slot `port` owns, made from `prefix`.
    fn key_on(&self, port: u16, prefix: &str) -> String {
        let mut con = self.nodes[0].con();
        let map = slot_map(&mut con);
        (0..100_000)
            .map(|i| format!("{prefix}-{i}"))
            .find(|key| owner_port(&map, keyslot(&mut con, key)) == port)
            .unwrap_or_else(|| panic!("no key for node {port}"))
    }

    /// Three masters, the first with a replica: the cluster, the first master's port and
    /// the replica's index in `nodes`.
    fn start_with_replica() -> (Cluster, u16, usize) {
        let mut cluster = Cluster::start();
        let master = cluster.master_ports()[0];
        let replica = cluster.add_replica(master);
        (cluster, master, replica)
    }

    /// Waits until the node at `index` in `nodes` reports itself a master.
    fn wait_promoted(&self, index: usize) {
        wait_for("the replica to become a master", || {
            let info = info(&mut self.nodes[index].con(), "replication");
            if field(&info, "role") == Some("master") {
                Ok(())
            } else {
                Err(info)
            }
        });
    }

    /// `count` keys (without a hash tag) whose slots `port` owns, made from `prefix` and a
    /// number.
    fn keys_on(&self, port: u16, prefix: &str, count: usize) -> Vec<String> {
        (0..count)
            .map(|i| self.key_on(port, &format!("{prefix}{i}")))
            .collect()
    }

    fn master_ports(&self) -> Vec<u16> {
        let mut con = self.nodes[0].con();
        let mut ports: Vec<u16> = slot_map(&mut con).iter().map(|r| r.2).collect();
        ports.sort_unstable();
        ports.dedup();
        ports
    }
}

// ---------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------

/// Calls `check` every 50 ms until it returns Ok; panics with its last error after
/// `CLUSTER_TIMEOUT`.
fn wait_for<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + CLUSTER_TIMEOUT;
    loop {
        match check() {
            Ok(value) => return value,
            Err(why) if Instant::now() >= deadline => {
                panic!("timed out after {CLUSTER_TIMEOUT:?} waiting for {what}; last: {why}")
            }
            Err(_) => sleep(Duration::from_millis(50)),
        }
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// A classic move of one slot from the first master (`source`) to the second (`target`):
/// `SETSLOT IMPORTING/MIGRATING`, `MIGRATE ... KEYS`, then `SETSLOT NODE`; with a
/// connection to each of the two.
struct SlotMove<'a> {
    cluster: &'a Cluster,
    slot: u16,
    source: u16,
    target: u16,
    src: redis::Connection,
    dst: redis::Connection,
}

/// Returns once `con`'s node has one client waiting (`tb_waiting` 1).
fn wait_for_one_waiter(con: &mut redis::Connection) {
    wait_for("the waiter to queue", || {
        match field(&info(con, "tb"), "tb_waiting") {
            Some("1") => Ok(()),
            other => Err(format!("tb_waiting {other:?}")),
        }
    });
}

impl<'a> SlotMove<'a> {
    /// The move of `key`'s slot, which must be the first master's.
    fn of(cluster: &'a Cluster, key: &str) -> SlotMove<'a> {
        let ports = cluster.master_ports();
        let (source, target) = (ports[0], ports[1]);
        assert_eq!(
            cluster.owner_of(key),
            source,
            "{key} is on the first master"
        );
        let mut src = cluster.node(source).con();
        SlotMove {
            cluster,
            slot: keyslot(&mut src, key),
            source,
            target,
            src,
            dst: cluster.node(target).con(),
        }
    }

    /// Marks the slot IMPORTING on the target and MIGRATING on the source, checks that
    /// `keys` are all the slot holds, and MIGRATEs them: the slot is left mid-move, its keys
    /// on the target, the source answering ASK for them.
    fn move_keys_mid_slot(&mut self, keys: &[String]) {
        let src_id = self.cluster.node(self.source).id.clone();
        let dst_id = self.cluster.node(self.target).id.clone();
        ok(
            &mut self.dst,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(self.slot)
                .arg("IMPORTING")
                .arg(&src_id),
        );
        ok(
            &mut self.src,
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(self.slot)
                .arg("MIGRATING")
                .arg(&dst_id),
        );
        let mut in_slot: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(self.slot)
            .arg(100)
            .query(&mut self.src)
            .expect("GETKEYSINSLOT");
        in_slot.sort();
        let mut moving = keys.to_vec();
        moving.sort();
        assert_eq!(in_slot, moving, "the keys of slot {}", self.slot);
        ok(
            &mut self.src,
            redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(self.target)
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(keys),
        );
    }

    /// [`SlotMove::move_keys_mid_slot`] for a slot holding one key.
    fn move_key_mid_slot(&mut self, key: &str) {
        self.move_keys_mid_slot(&[key.to_string()]);
    }

    /// `CLUSTER SETSLOT slot NODE <target>` on the target, then the source, then the third
    /// master; returns once every node sees the slot on the target.
    fn finish(&self) {
        let dst_id = self.cluster.node(self.target).id.clone();
        let third = self.cluster.master_ports()[2];
        for port in [self.target, self.source, third] {
            ok(
                &mut self.cluster.node(port).con(),
                redis::cmd("CLUSTER")
                    .arg("SETSLOT")
                    .arg(self.slot)
                    .arg("NODE")
                    .arg(&dst_id),
            );
        }
        self.cluster.wait_owner(self.slot, self.target);
    }

    /// The redirection to the target a client gets for the slot: `ASK` mid-move, `MOVED`
    /// after.
    fn redirect(&self, kind: &str) -> String {
        format!("{kind} {} 127.0.0.1:{}", self.slot, self.target)
    }

    /// Moves the slot under a client waiting on `key`, its only key, on the source: the
    /// waiter is not answered while the slot is mid-move (the key already left, so it reads
    /// as missing on the source: a full bucket, an empty lease set, were the slot still the
    /// source's), gets MOVED once the slot has moved, and leaves nothing on the source: no
    /// key in the slot, nobody waiting, one wait abandoned.
    fn move_under_waiter(&mut self, key: &str, waiter: &mut RawClient) {
        wait_for_one_waiter(&mut self.src);
        self.move_key_mid_slot(key);
        assert_eq!(
            waiter.reply_within(Duration::from_millis(300)),
            None,
            "served mid-move"
        );
        self.finish();
        match waiter.reply_within(Duration::from_secs(10)) {
            Some(Resp::Error(text)) => assert_eq!(text, self.redirect("MOVED")),
            other => panic!("expected MOVED, got {other:?}"),
        }
        assert_eq!(self.left_on_source(), 0, "nothing written on the old node");
        let waiting = info(&mut self.src, "tb");
        assert_eq!(field(&waiting, "tb_waiting"), Some("0"));
        assert_eq!(field(&waiting, "tb_waits_abandoned"), Some("1"));
    }

    /// How many keys of the slot the source holds.
    fn left_on_source(&mut self) -> i64 {
        redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(self.slot)
            .query(&mut self.src)
            .expect("COUNTKEYSINSLOT")
    }
}

/// Runs a command that must answer OK.
fn ok(con: &mut impl ConnectionLike, cmd: &redis::Cmd) {
    let reply: String = cmd
        .query(con)
        .unwrap_or_else(|e| panic!("{:?} failed: {e}", cmd_text(cmd)));
    assert_eq!(reply, "OK", "{:?}", cmd_text(cmd));
}

fn cmd_text(cmd: &redis::Cmd) -> String {
    String::from_utf8_lossy(&cmd.get_packed_command()).replace("\r\n", " ")
}

fn info(con: &mut redis::Connection, section: &str) -> String {
    redis::cmd("INFO").arg(section).query(con).expect("INFO")
}

fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.trim())
}

fn keyslot(con: &mut redis::Connection, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(con)
        .expect("CLUSTER KEYSLOT")
}

/// `CLUSTER SLOTS` as sorted `(first, last, master port)`.
fn slot_map(con: &mut redis::Connection) -> Vec<(u16, u16, u16)> {
    let reply: Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(con)
        .expect("CLUSTER SLOTS");
    let Value::Array(ranges) = reply else {
        panic!("CLUSTER SLOTS: {reply:?}")
    };
    let mut map: Vec<(u16, u16, u16)> = ranges
        .into_iter()
        .map(|range| {
            let Value::Array(parts) = range else {
                panic!("CLUSTER SLOTS range: {range:?}")
            };
            let first: u16 = redis::from_redis_value(&parts[0]).expect("first slot");
            let last: u16 = redis::from_redis_value(&parts[1]).expect("last slot");
            let Value::Array(master) = &parts[2] else {
                panic!("CLUSTER SLOTS master: {:?}", parts[2])
            };
            let port: u16 = redis::from_redis_value(&master[1]).expect("master port");
            (first, last, port)
        })
        .collect();
    map.sort_unstable();
    map
}

fn owner_port(map: &[(u16, u16, u16)], slot: u16) -> u16 {
    map.iter()
        .find(|(first, last, _)| (*first..=*last).contains(&slot))
        .map(|r| r.2)
        .unwrap_or_else(|| panic!("slot {slot} is not served: {map:?}"))
}

/// One line of `CLUSTER NODES`.
#[derive(Debug)]
struct NodeLine {
    flags: String,
    master: String,
}

fn cluster_nodes(con: &mut redis::Connection) -> BTreeMap<String, NodeLine> {
    let text: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(con)
        .expect("CLUSTER NODES");
    text.lines()
        .filter_map(|line| {
            let parts: Vec<&str> = line.split(' ').collect();
            (parts.len() >= 8).then(|| {
                (
                    parts[0].to_string(),
                    NodeLine {
                        flags: parts[2].to_string(),
                        master: parts[3].to_string(),
                    },
                )
            })
        })
        .collect()
}

/// `TB.TAKE` through any connection (a node's or the cluster client's).
fn tb_take(con: &mut impl ConnectionLike, key: &str, n: &str) -> Vec<i64> {
    redis::cmd("TB.TAKE")
        .arg(key)
        .arg(CAPACITY)
        .arg(RATE)
        .arg(n)
        .query(con)
        .unwrap_or_else(|e| panic!("TB.TAKE {key} {CAPACITY} {RATE} {n} failed: {e}"))
}

fn tb_peek(con: &mut impl ConnectionLike, key: &str) -> Vec<i64> {
    redis::cmd("TB.PEEK")
        .arg(key)
        .arg(CAPACITY)
        .arg(RATE)
        .arg("1")
        .query(con)
        .unwrap_or_else(|e| panic!("TB.PEEK {key} failed: {e}"))
}

/// A bucket as stored: its fields byte for byte and its absolute deadline.
type Stored = (BTreeMap<Vec<u8>, Vec<u8>>, i64);

fn stored(con: &mut redis::Connection, key: &str) -> Stored {
    (hgetall_bytes(con, key), pexpiretime(con, key))
}

/// The stored state of `keys` on the node owning them, after checking it is a real bucket.
fn stored_all(con: &mut redis::Connection, keys: &[String]) -> Vec<Stored> {
    keys.iter()
        .map(|key| {
            let s = stored(con, key);
            assert!(
                s.0.contains_key(&b"tokens"[..]) && s.1 > 0,
                "{key} is not a bucket with a deadline: {s:?}"
            );
            s
        })
        .collect()
}

/// `TB.TAKE key` of one token from a slow bucket, as a command.
fn take_cmd(key: &str) -> redis::Cmd {
    harness::tb_cmd("TB.TAKE", key, CAPACITY, RATE, "1")
}

/// Three slow buckets of one caller (a hash tag on the first master), in one slot, taken
/// through `client` to different fill levels (9, 5.5 and 4 tokens left).
fn tagged_buckets(cluster: &Cluster, client: &mut ClusterConnection) -> Vec<String> {
    let tag = cluster.key_on(cluster.master_ports()[0], "tenant");
    let keys: Vec<String> = ["a", "b", "c"]
        .iter()
        .map(|suffix| format!("{{{tag}}}:{suffix}"))
        .collect();
    for (key, n) in keys.iter().zip(["1", "4.5", "6"]) {
        assert_eq!(tb_take(client, key, n)[0], 1);
    }
    keys
}

/// A key's deadline on the node it moved to, against the one it had: a move sends the
/// time to live, not the deadline, so the new deadline is the old one plus the transfer
/// time: never earlier, a few ms later (up to seconds on a loaded machine; a lost or reset
/// deadline would be off by far more: what is moved here is 600 s or more from its end).
fn assert_deadline_kept(key: &str, before_ms: i64, after_ms: i64) {
    let shift = after_ms - before_ms;
    assert!(
        (0..=10_000).contains(&shift),
        "{key}: deadline moved by {shift} ms"
    );
}

/// Buckets that moved to another node: fields byte-identical, deadlines kept.
fn assert_moved_as_they_were(keys: &[String], before: &[Stored], after: &[Stored]) {
    for ((key, before), after) in keys.iter().zip(before).zip(after) {
        assert_eq!(after.0, before.0, "{key} fields byte-identical");
        assert_deadline_kept(key, before.1, after.1);
    }
}

/// The error a command gets from a node, as `CODE detail`.
fn error_of(con: &mut redis::Connection, cmd: &redis::Cmd) -> String {
    match cmd.query::<Value>(con) {
        Ok(v) => panic!("expected an error from {:?}, got {v:?}", cmd_text(cmd)),
        Err(e) => harness::error_text(&e),
    }
}

// ---------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------

#[test]
fn buckets_live_on_the_node_owning_their_slot_and_other_nodes_redirect() {
    let cluster = Cluster::start();
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3, "three masters");
    let keys: Vec<String> = masters
        .iter()
        .map(|port| cluster.key_on(*port, "bucket"))
        .collect();

    let mut client = cluster.client();
    for key in &keys {
        assert_eq!(tb_take(&mut client, key, "3")[..2], [1, 7], "{key}");
        assert_eq!(tb_take(&mut client, key, "3")[..2], [1, 4], "{key}");
    }

    for (key, owner) in keys.iter().zip(&masters) {
        let mut con = cluster.node(*owner).con();
        let slot = keyslot(&mut con, key);
        // The bucket is a plain hash on its owner, with the absolute deadline.
        // 4 tokens, plus the refill of the ms between the two takes.
        let tokens = harness::stored_tokens(&mut con, key);
        assert!((4.0..4.01).contains(&tokens), "{key} on {owner}: {tokens}");
        assert!(pexpiretime(&mut con, key) > 0);
        assert_eq!(tb_peek(&mut con, key)[..2], [1, 3]);
        // Every other master redirects, for TB.TAKE and TB.PEEK alike: the module's key
        // spec tells the server which argument is the key.
        for other in masters.iter().filter(|p| *p != owner) {
            let mut con = cluster.node(*other).con();
            let moved = format!("MOVED {slot} 127.0.0.1:{owner}");
            for cmd in ["TB.TAKE", "TB.PEEK"] {
                let error = error_of(
                    &mut con,
                    redis::cmd(cmd).arg(key).arg(CAPACITY).arg(RATE).arg("1"),
                );
                assert_eq!(error, moved, "{cmd} {key} on {other}");
            }
            let count: i64 = redis::cmd("DBSIZE").query(&mut con).expect("DBSIZE");
            assert_eq!(count, 1, "node {other} holds only its own bucket");
        }
    }
}

#[test]
fn hash_tags_keep_one_callers_buckets_on_one_node() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    let per_second = "{user:42}:per-second";
    let per_hour = "{user:42}:per-hour";

    let mut any = cluster.nodes[0].con();
    assert_eq!(keyslot(&mut any, per_second), keyslot(&mut any, per_hour));
    assert_eq!(keyslot(&mut any, per_second), keyslot(&mut any, "user:42"));

    // Both limits in one atomic call: allowed, charged together, on one node.
    let reply: Vec<i64> = redis::cmd("TB.TAKEALL")
        .arg(per_second)
        .arg("5")
        .arg(RATE)
        .arg("2")
        .arg(per_hour)
        .arg(CAPACITY)
        .arg(RATE)
        .arg("2")
        .query(&mut client)
        .expect("TB.TAKEALL on hash-tagged keys");
    assert_eq!(reply[..3], [1, 3, 0]);
    assert_eq!(reply[4], 0, "the per-second bucket has fewer tokens left");
    let owner = cluster.owner_of(per_second);
    let mut con = cluster.node(owner).con();
    let both: i64 = redis::cmd("EXISTS")
        .arg(per_second)
        .arg(per_hour)
        .query(&mut con)
        .expect("EXISTS");
    assert_eq!(both, 2, "both buckets live on node {owner}");
    assert_eq!(harness::stored_tokens(&mut con, per_second), 3.0);
    assert_eq!(harness::stored_tokens(&mut con, per_hour), 8.0);

    // A MULTI/EXEC over the tagged buckets runs on their node.
    let replies: Vec<Vec<i64>> = redis::pipe()
        .atomic()
        .cmd("TB.TAKE")
        .arg(per_second)
        .arg("5")
        .arg(RATE)
        .arg("1")
        .cmd("TB.TAKE")
        .arg(per_hour)
        .arg(CAPACITY)
        .arg(RATE)
        .arg("1")
        .query(&mut con)
        .expect("MULTI/EXEC on the owner");
    assert_eq!(replies[0][..2], [1, 2]);
    assert_eq!(replies[1][..2], [1, 7]);

    // Without a shared tag, keys on different slots cannot be taken together.
    let a = cluster.key_on(cluster.master_ports()[0], "untagged");
    let b = cluster.key_on(cluster.master_ports()[1], "untagged");
    let error = redis::cmd("TB.TAKEALL")
        .arg(&a)
        .arg(CAPACITY)
        .arg(RATE)
        .arg("1")
        .arg(&b)
        .arg(CAPACITY)
        .arg(RATE)
        .arg("1")
        .query::<Value>(&mut client)
        .expect_err("TB.TAKEALL across slots");
    assert_eq!(error.code(), Some("CROSSSLOT"), "{error}");
    let mut owner_a = cluster.node(cluster.owner_of(&a)).con();
    assert!(!harness::exists(&mut owner_a, &a), "nothing was taken");
}

#[test]
fn a_cluster_failover_keeps_tokens_and_deadlines() {
    let (cluster, old_master, replica) = Cluster::start_with_replica();
    let new_master = cluster.nodes[replica].port();
    let keys = cluster.keys_on(old_master, "failover", 4);

    let mut client = cluster.client();
    for (i, key) in keys.iter().enumerate() {
        // Different fill levels, including a fractional one.
        let n = ["1", "2.5", "7", "9.75"][i];
        assert_eq!(tb_take(&mut client, key, n)[0], 1, "{key}");
    }
    let mut master = cluster.node(old_master).con();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut master)
        .expect("WAIT");
    assert_eq!(acked, 1, "the replica acknowledged the writes");
    let before = stored_all(&mut master, &keys);
    let peek_before: Vec<Vec<i64>> = keys.iter().map(|k| tb_peek(&mut master, k)).collect();

    // A replica with the module answers TB.PEEK for its master's slots (after READONLY),
    // from the same state.
    let mut on_replica = cluster.nodes[replica].con();
    ok(&mut on_replica, &redis::cmd("READONLY"));
    // WAIT's acknowledgement can come before a replica that has just finished its first
    // sync shows the write (seen once on a loaded Valkey 8.1): wait until it does.
    wait_for("the replica to show the master's buckets", || {
        // Not `stored_all`, which asserts: until the replica shows them, a key may
        // still be missing there.
        let seen: Vec<Stored> = keys.iter().map(|k| stored(&mut on_replica, k)).collect();
        if seen == before {
            Ok(())
        } else {
            Err(format!("{seen:?}"))
        }
    });
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(
            stored(&mut on_replica, key),
            before[i],
            "{key} on the replica"
        );
        // Same allowance and remaining; the waits count down with the clock.
        assert_eq!(
            tb_peek(&mut on_replica, key)[..2],
            peek_before[i][..2],
            "{key}"
        );
    }

    // Manual failover: the master stops writes, the replica catches up and takes over.
    ok(
        &mut cluster.nodes[replica].con(),
        redis::cmd("CLUSTER").arg("FAILOVER"),
    );
    cluster.wait_promoted(replica);
    for key in &keys {
        let slot = keyslot(&mut cluster.nodes[0].con(), key);
        cluster.wait_owner(slot, new_master);
    }
    cluster.wait_converged();

    let mut promoted = cluster.node(new_master).con();
    assert_eq!(
        stored_all(&mut promoted, &keys),
        before,
        "fields and PEXPIRETIME on the promoted node"
    );
    // The same client, still pointing at the old master, is sent on by MOVED and
    // continues from the replicated tokens: 10 - 1 - 1 = 8, not a fresh 9.
    let expected = [8, 6, 2, 0];
    for (key, remaining) in keys.iter().zip(expected) {
        let reply = tb_take(&mut client, key, "1");
        if remaining > 0 {
            assert_eq!(reply[..2], [1, remaining], "{key}");
        } else {
            // 0.25 tokens left: denied, and told to wait for the missing 0.75 token.
            assert_eq!(reply[..2], [0, 0], "{key}");
            assert!(reply[2] > 700_000, "{key}: retry after {} ms", reply[2]);
        }
    }
    // The old master now replicates from the promoted node.
    let info = info(&mut cluster.node(old_master).con(), "replication");
    assert_eq!(field(&info, "role"), Some("slave"), "{info}");
}

#[test]
fn moving_a_slot_with_setslot_and_migrate_keeps_bucket_state_and_ttl() {
    let cluster = Cluster::start();
    let mut client = cluster.client();
    // Several buckets in one slot, one of them taken during the move.
    let keys = tagged_buckets(&cluster, &mut client);
    let mut moving = SlotMove::of(&cluster, &keys[0]);
    let before = stored_all(&mut moving.src, &keys);

    moving.move_keys_mid_slot(&keys);
    // Mid-move: the source no longer has the keys and answers ASK; the client follows it
    // to the target, where the bucket continues (10 - 1 - 1 = 8).
    let error = error_of(&mut moving.src, &take_cmd(&keys[0]));
    assert_eq!(error, moving.redirect("ASK"));
    assert_eq!(tb_take(&mut client, &keys[0], "1")[..2], [1, 8]);

    // Finish the move: the target first, then the source, then the third master.
    moving.finish();
    let after = stored_all(&mut moving.dst, &keys);
    assert_moved_as_they_were(&keys[1..], &before[1..], &after[1..]);
    // After the move the source answers MOVED; the client follows and continues.
    let error = error_of(&mut moving.src, &take_cmd(&keys[1]));
    assert_eq!(error, moving.redirect("MOVED"));
    assert_eq!(tb_take(&mut client, &keys[1], "1")[..2], [1, 4]);
    assert_eq!(tb_take(&mut client, &keys[2], "1")[..2], [1, 3]);
}

/// Valkey 9's `CLUSTER MIGRATESLOTS` moves whole slots atomically; it refuses to start while
/// a loaded module has not declared it can handle that. On servers without the command the
/// test only checks that (and passes).
#[test]
fn atomic_slot_migration_keeps_bucket_state_and_deadlines_where_the_server_has_it() {
    let cluster = Cluster::start();
    let mut any = cluster.nodes[0].con();
    let docs: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg("CLUSTER|MIGRATESLOTS")
        .query(&mut any)
        .expect("COMMAND INFO");
    if docs == Value::Array(vec![Value::Nil]) {
        eprintln!("skipped: this server has no CLUSTER MIGRATESLOTS");
        return;
    }
    let ports = cluster.master_ports();
    let (source, target) = (ports[0], ports[1]);
    let mut client = cluster.client();
    let keys = tagged_buckets(&cluster, &mut client);
    let mut src = cluster.node(source).con();
    let slot = keyslot(&mut src, &keys[0]);
    let before = stored_all(&mut src, &keys);

    let dst_id = cluster.node(target).id.clone();
    ok(
        &mut src,
        redis::cmd("CLUSTER")
            .arg("MIGRATESLOTS")
            .arg("SLOTSRANGE")
            .arg(slot)
            .arg(slot)
            .arg("NODE")
            .arg(&dst_id),
    );
    cluster.wait_owner(slot, target);
    let mut dst = cluster.node(target).con();
    let after = wait_for("the buckets to arrive on the target", || {
        let count: i64 = redis::cmd("CLUSTER")
            .arg("COUNTKEYSINSLOT")
            .arg(slot)
            .query(&mut dst)
            .map_err(|e| e.to_string())?;
        if count == keys.len() as i64 {
            Ok(stored_all(&mut dst, &keys))
        } else {
            Err(format!("{count} keys in slot {slot}"))
        }
    });
    assert_moved_as_they_were(&keys, &before, &after);
    assert_eq!(tb_take(&mut client, &keys[0], "1")[..2], [1, 8]);
}

/// A TB.BTAKE waiter on a bucket whose slot moves to another node gets the redirection the
/// server gives any blocked client, and takes nothing on the old node: while the slot is
/// migrating, the bucket already moved reads as missing there (a full bucket), and serving
/// from it would write a key this node no longer owns.
#[test]
fn a_waiter_on_a_slot_that_moves_away_is_redirected_and_takes_nothing() {
    let cluster = Cluster::start();
    let key = cluster.key_on(cluster.master_ports()[0], "waiting");
    let mut moving = SlotMove::of(&cluster, &key);
    // Drained, and refilled at one token per 1000 s: the waiter cannot be served in time.
    drain(&mut moving.src, &key, "1", RATE);
    let before = stored(&mut moving.src, &key);

    let mut waiter = RawClient::connect(&cluster.node(moving.source).server);
    waiter.send(&["TB.BTAKE", &key, "1", RATE, "1", "0"]);
    moving.move_under_waiter(&key, &mut waiter);
    assert_eq!(
        stored(&mut moving.dst, &key).0,
        before.0,
        "the bucket moved as it was"
    );
}

/// CLUSTER FAILOVER pauses writes on the master until its replica has caught
/// up. Waiters whose tokens come due meanwhile must not be served then (a
/// write propagated during the pause aborts the server); each gets exactly
/// one answer, a grant from before or after the pause or the server's error
/// when the role change ends its wait, and both nodes end with one state.
#[test]
fn a_cluster_failover_with_waiters_coming_due_never_writes_during_its_pause() {
    let (cluster, old_master, replica) = Cluster::start_with_replica();
    let new_master = cluster.nodes[replica].port();
    let keys = cluster.keys_on(old_master, "due", 6);
    let mut master = cluster.node(old_master).con();
    // Drained at 100 tokens/s: waiter i's 2 + 2i tokens come due 20-120 ms on. A capacity
    // of 2000 keeps each bucket 20 s from full, so none expires however long the failover
    // takes (at 20 they did, on a loaded machine, and the states compared were gone).
    let mut waiters = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let drained: Vec<i64> = redis::cmd("TB.TAKE")
            .arg(&[key.as_str(), "2000", "100", "2000"])
            .query(&mut master)
            .expect("TB.TAKE");
        assert_eq!(drained[0], 1, "{key}");
        let n = (2 + 2 * i).to_string();
        let mut waiter = RawClient::connect(&cluster.node(old_master).server);
        waiter.send(&["TB.BTAKE", key, "2000", "100", &n, "0"]);
        waiters.push(waiter);
    }
    ok(
        &mut cluster.nodes[replica].con(),
        redis::cmd("CLUSTER").arg("FAILOVER"),
    );
    for (i, waiter) in waiters.iter_mut().enumerate() {
        let reply = waiter.reply_within(Duration::from_secs(15));
        eprintln!("waiter {i}: {reply:?}");
        match reply {
            Some(Resp::Ints(reply)) => assert_eq!(reply[0], 1, "waiter {i}: {reply:?}"),
            Some(Resp::Error(text)) => assert!(
                text.starts_with("UNBLOCKED") || text.starts_with("MOVED"),
                "waiter {i}: {text}"
            ),
            other => panic!("waiter {i}: {other:?}"),
        }
    }
    cluster.wait_promoted(replica);
    assert!(
        cluster.node(old_master).server.is_alive(),
        "the old master is alive"
    );
    let mut promoted = cluster.node(new_master).con();
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(5000)
        .query(&mut promoted)
        .expect("WAIT");
    assert_eq!(acked, 1, "the old master follows the new one");
    let mut old = cluster.node(old_master).con();
    ok(&mut old, &redis::cmd("READONLY"));
    assert_eq!(
        stored_all(&mut old, &keys),
        stored_all(&mut promoted, &keys)
    );
    let waiting = info(&mut old, "tb");
    assert_eq!(field(&waiting, "tb_waiting"), Some("0"));
}

/// During a classic slot move, a client sent on by ASK to the importing node
/// may wait there (`ASKING` then TB.BTAKE) on a bucket already moved in; it
/// is served there, from that bucket, when its tokens come.
#[test]
fn a_waiter_sent_on_by_ask_is_served_on_the_importing_node() {
    let cluster = Cluster::start();
    let key = cluster.key_on(cluster.master_ports()[0], "asked");
    let mut moving = SlotMove::of(&cluster, &key);
    drain(&mut moving.src, &key, "2", RATE);
    moving.move_key_mid_slot(&key);
    let target = &cluster.node(moving.target).server;
    let mut waiter = RawClient::connect(target);
    waiter.send(&["ASKING"]);
    assert_eq!(waiter.reply(), Resp::Other("OK".into()));
    waiter.send(&["TB.BTAKE", &key, "2", "0.001", "1", "0"]);
    assert_eq!(
        waiter.reply_within(Duration::from_millis(300)),
        None,
        "it waits"
    );
    let mut refunder = RawClient::connect(target);
    refunder.send(&["ASKING"]);
    assert_eq!(refunder.reply(), Resp::Other("OK".into()));
    refunder.send(&["TB.REFUND", &key, "2", "0.001", "1"]);
    assert!(matches!(refunder.reply(), Resp::Ints(_)));
    match waiter.reply_within(Duration::from_secs(5)) {
        Some(Resp::Ints(reply)) => assert_eq!(reply[..3], [1, 0, 0], "{reply:?}"),
        other => panic!("expected a grant, got {other:?}"),
    }
    moving.finish();
}

/// `[acquired, available, retry_after_ms, lease]` through the cluster client.
fn tb_acquire(con: &mut impl ConnectionLike, key: &str, limit: i64) -> (i64, Option<String>) {
    let reply: Value = redis::cmd("TB.ACQUIRE")
        .arg(key)
        .arg(limit)
        .arg(600_000)
        .query(con)
        .expect("TB.ACQUIRE");
    let Value::Array(items) = reply else {
        panic!("TB.ACQUIRE replied {reply:?}");
    };
    let acquired = redis::from_redis_value(&items[0]).expect("acquired");
    let lease = redis::from_redis_value(&items[3]).expect("lease");
    (acquired, lease)
}

#[test]
fn leases_follow_their_slot_and_a_slot_move_keeps_them_and_their_count() {
    let cluster = Cluster::start();
    let key = format!(
        "{{{}}}:inflight",
        cluster.key_on(cluster.master_ports()[0], "tenant")
    );
    let mut client = cluster.client();
    let (_, first) = tb_acquire(&mut client, &key, 2);
    let (_, second) = tb_acquire(&mut client, &key, 2);
    let (first, second) = (first.expect("a lease"), second.expect("a lease"));
    assert_eq!(tb_acquire(&mut client, &key, 2), (0, None));
    let mut moving = SlotMove::of(&cluster, &key);
    let before = members(&mut moving.src, &key);

    moving.move_key_mid_slot(&key);
    moving.finish();

    assert_eq!(
        members(&mut moving.dst, &key),
        before,
        "the lease set moved as it was"
    );
    // The source redirects; the client follows, and the leases and count carry on.
    let error = error_of(
        &mut moving.src,
        redis::cmd("TB.RELEASE").arg(&key).arg(&first),
    );
    assert_eq!(error, moving.redirect("MOVED"));
    assert_eq!(tb_acquire(&mut client, &key, 2), (0, None));
    let released: i64 = redis::cmd("TB.RELEASE")
        .arg(&key)
        .arg(&first)
        .query(&mut client)
        .expect("TB.RELEASE");
    assert_eq!(released, 1);
    let (acquired, third) = tb_acquire(&mut client, &key, 2);
    assert_eq!(acquired, 1);
    let third = third.expect("a lease");
    let (_, n, of) = id_parts(&third);
    assert_eq!(
        (n, of),
        (3, id_parts(&first).2),
        "the count and the incarnation go on"
    );
    let renewed: i64 = redis::cmd("TB.RENEW")
        .arg(&key)
        .arg(&second)
        .arg(1000)
        .query(&mut client)
        .expect("TB.RENEW");
    assert_eq!(renewed, 1);
}

/// A TB.ACQUIRE waiter with a timeout, on a lease set whose slot moves to another node, is
/// redirected as a TB.BTAKE waiter is, and granted nothing on the old node (where the set
/// already moved reads as empty); the set arrives on the target as it was: its leases with
/// their deadlines, its `seq` count, and its expiry, the latest deadline it handed out.
/// A waiter whose own timeout passes while its slot is mid-move (its key already on the
/// target) cannot read the key on the old node, where it reads as missing: the denial has
/// the most cautious figures instead of those of an empty lease set or a full bucket, and
/// nothing is written on the old node.
#[test]
fn a_waiter_timing_out_mid_move_gets_the_most_cautious_denial() {
    let cluster = Cluster::start();
    let key = cluster.key_on(cluster.master_ports()[0], "jobs");
    let mut moving = SlotMove::of(&cluster, &key);
    for _ in 0..2 {
        assert_eq!(tb_acquire(&mut moving.src, &key, 2).0, 1);
    }
    let mut waiter = RawClient::connect(&cluster.node(moving.source).server);
    waiter.send(&["TB.ACQUIRE", &key, "2", "600000", "1500"]);
    wait_for_one_waiter(&mut moving.src);
    moving.move_key_mid_slot(&key);
    match waiter.reply_within(Duration::from_secs(10)) {
        Some(Resp::Items(items)) => assert_eq!(
            items,
            [Some("0".into()), Some("0".into()), Some("100".into()), None],
            "no slot available, ask again in 100 ms"
        ),
        other => panic!("expected a denial, got {other:?}"),
    }
    assert_eq!(
        moving.left_on_source(),
        0,
        "nothing written on the old node"
    );

    let bucket = cluster.key_on(cluster.master_ports()[0], "bucket");
    let mut moving = SlotMove::of(&cluster, &bucket);
    drain(&mut moving.src, &bucket, "5", RATE);
    let mut waiter = RawClient::connect(&cluster.node(moving.source).server);
    waiter.send(&["TB.BTAKE", &bucket, "5", RATE, "2", "1500"]);
    wait_for_one_waiter(&mut moving.src);
    moving.move_key_mid_slot(&bucket);
    match waiter.reply_within(Duration::from_secs(10)) {
        Some(Resp::Ints(reply)) => {
            assert_eq!(reply[..2], [0, 0], "denied, none left: {reply:?}");
            assert!(
                reply[2] > 0 && reply[3] >= reply[2],
                "the waits of an empty bucket: {reply:?}"
            );
        }
        other => panic!("expected a denial, got {other:?}"),
    }
    assert_eq!(
        moving.left_on_source(),
        0,
        "nothing written on the old node"
    );
}

#[test]
fn a_lease_waiter_on_a_slot_that_moves_away_is_redirected_and_the_lease_set_moves_intact() {
    let cluster = Cluster::start();
    let key = cluster.key_on(cluster.master_ports()[0], "jobs");
    let mut moving = SlotMove::of(&cluster, &key);
    // Both leases of a limit of 2, held for 600 s: the waiter cannot be served in time.
    for _ in 0..2 {
        assert_eq!(tb_acquire(&mut moving.src, &key, 2).0, 1);
    }
    let before = members(&mut moving.src, &key);
    let expiry = pexpiretime(&mut moving.src, &key);
    assert_eq!(before.len(), 4, "two leases, seq and inc: {before:?}");
    assert!(
        before.contains(&("seq".to_string(), -2)),
        "two ids handed out"
    );
    assert_eq!(
        expiry, before[3].1,
        "the key lives until its latest deadline"
    );

    let mut waiter = RawClient::connect(&cluster.node(moving.source).server);
    waiter.send(&["TB.ACQUIRE", &key, "2", "600000", "60000"]);
    moving.move_under_waiter(&key, &mut waiter);
    assert_eq!(
        members(&mut moving.dst, &key),
        before,
        "the leases, their deadlines, seq and inc moved as they were"
    );
    assert_deadline_kept(&key, expiry, pexpiretime(&mut moving.dst, &key));
    let counted = info(&mut moving.src, "tb");
    assert_eq!(field(&counted, "tb_leases_acquired"), Some("2"));
    assert_eq!(field(&counted, "tb_leases_denied"), Some("0"));
}
