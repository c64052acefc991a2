//! Replicas of a test server: starting one, waiting until it has caught up, reading
//! replication offsets, and turning a server into a replica while a client waits on it.

use std::thread;
use std::time::{Duration, Instant};

use super::commands::{bucket, tb_field, wait_for_waiting};
use super::raw_client::{RawClient, Resp};
use super::server::{info_field, wait_until, Server};

/// How long a replica may take to connect, sync and catch up.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(20);

/// Arguments for a master whose replication offset moves only when a command is propagated:
/// without `--repl-ping-replica-period 3600` it PINGs its replicas every 10 s; the sync delay
/// of 0 starts the initial sync at once instead of after 5 s.
pub const QUIET_MASTER_ARGS: &[&str] = &[
    "--repl-ping-replica-period",
    "3600",
    "--repl-diskless-sync-delay",
    "0",
];

/// `master_repl_offset` from `INFO replication` (on a master or a replica).
pub fn repl_offset(con: &mut redis::Connection) -> i64 {
    info_field(con, "replication", "master_repl_offset")
        .expect("master_repl_offset in INFO replication")
        .parse()
        .expect("master_repl_offset is an integer")
}

/// Starts a server, makes it a replica of `master` and waits (bounded) until the link is up
/// and it has applied everything the master has sent so far.
pub fn start_replica_of(master: &Server) -> Server {
    let replica = Server::start();
    let mut rcon = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query(&mut rcon)
        .expect("REPLICAOF");
    wait_until("master_link_status:up on the replica", SYNC_TIMEOUT, || {
        info_field(&mut rcon, "replication", "master_link_status").as_deref() == Some("up")
    });
    wait_for_replica(master, &replica);
    replica
}

/// Waits (bounded) until the replica's `master_repl_offset` equals the master's.
pub fn wait_for_replica(master: &Server, replica: &Server) {
    let mut mcon = master.conn();
    let mut rcon = replica.conn();
    let start = Instant::now();
    loop {
        let (m, r) = (repl_offset(&mut mcon), repl_offset(&mut rcon));
        if m == r {
            return;
        }
        assert!(
            start.elapsed() < SYNC_TIMEOUT,
            "replica did not catch up within {SYNC_TIMEOUT:?}: master offset {m}, replica offset {r}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// Makes `server` a replica of `other` while `waiter` (TB.BTAKE or TB.ACQUIRE) waits there:
/// the server ends the wait with its own `-UNBLOCKED` error, and afterwards nobody waits on
/// it and the wait counts as abandoned (`tb_waits_abandoned`), not answered by the module.
pub fn turn_replica_under_waiter(server: &Server, other: &Server, waiter: &mut RawClient) {
    let mut con = server.conn();
    wait_for_waiting(&mut con, 1);
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(other.port)
        .query(&mut con)
        .expect("REPLICAOF");
    match waiter.reply() {
        Resp::Error(text) => assert!(text.starts_with("UNBLOCKED"), "{text}"),
        reply => panic!("expected -UNBLOCKED, got {reply:?}"),
    }
    wait_for_waiting(&mut con, 0);
    assert_eq!(tb_field(&mut con, "tb_waits_abandoned"), "1");
}

/// Waits until `replica` has caught up with `master`, then asserts that each of `keys` is a
/// bucket with a deadline on the master and byte-identical on the replica (fields and absolute
/// expiry).
pub fn assert_replica_holds_the_same_buckets(master: &Server, replica: &Server, keys: &[&str]) {
    wait_for_replica(master, replica);
    let (mut m, mut r) = (master.conn(), replica.conn());
    for key in keys {
        let on_master = bucket(&mut m, key);
        assert!(
            on_master.fields.contains_key(b"tokens".as_slice()),
            "{key}: {on_master:?}"
        );
        assert!(
            on_master.expire_at_ms > 0,
            "{key} has a deadline: {on_master:?}"
        );
        assert_eq!(bucket(&mut r, key), on_master, "{key} on the replica");
    }
}

/// `REPLICAOF NO ONE` on `con`: the replica becomes a master and keeps its data.
pub fn promote(con: &mut redis::Connection) {
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(con)
        .expect("REPLICAOF NO ONE");
}
