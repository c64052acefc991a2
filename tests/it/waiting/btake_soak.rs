//! A soak of TB.BTAKE waiters under faults: a master with AOF and a replica, a few buckets
//! whose only supply is the test's own TB.REFUND calls, and, all at once, waiters with random
//! timeouts (some without one), CLIENT UNBLOCK and CLIENT KILL on random waiters, a flood of
//! plain TB.TAKE, the replica killed and restarted, AOF rewrites and short write pauses.
//!
//! At the end, for each bucket: no token is made or lost (what was refunded and is no longer
//! there was granted to someone, and every grant but a killed waiter's was heard); every
//! waiter that was left alone got exactly one reply, within its timeout (plus slack); and the
//! replica and a reload of the AOF hold exactly the master's buckets.
//!
//! Environment: `TB_SOAK_SECS` (default 60) how long the faults run; `TB_SOAK_SEED` (default
//! fixed) the seed of every random choice, printed at the start to replay a run's choices
//! (the interleaving itself is the machine's).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

use crate::harness::*;

const BUCKETS: usize = 4;
/// Large enough never to be reached, so a refund always adds exactly what it says.
const CAPACITY: &str = "1000000000";
/// One token per 11.6 days: refill adds less than 10^-4 tokens in a run.
const RATE: &str = "0.000001";
/// Waiting clients at any time.
const WAITER_THREADS: u64 = 12;
/// How late a reply may come after a waiter's timeout, on a loaded machine.
const SLACK: Duration = Duration::from_secs(3);
/// How long a waiter without a timeout is watched before it counts as never answered.
const NO_TIMEOUT_PATIENCE: Duration = Duration::from_secs(90);
/// Refill over a whole run is below this, so token counts compare as whole numbers.
const REFILL_TOLERANCE: f64 = 0.001;

fn key(bucket: usize) -> String {
    format!("soak:{bucket}")
}

/// What the waiters, the killer and the checks share.
#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Set by the first failure; every thread stops soon after it.
    failures: Mutex<Vec<String>>,
    /// Waits in progress and what befell them. Its lock is also held across every send of a
    /// TB.BTAKE and every CLIENT KILL / UNBLOCK, so a kill or an unblock always hits the wait
    /// it was meant for, never the next one on the same connection.
    waits: Mutex<Waits>,
    refunded: [AtomicU64; BUCKETS],
    /// Sum of n over every allowed reply a client read (TB.TAKE and TB.BTAKE).
    granted_heard: [AtomicU64; BUCKETS],
    /// Sum of n over waiters killed while waiting: the most they can have taken unheard.
    killed_n: [AtomicU64; BUCKETS],
    stats: Stats,
}

#[derive(Default)]
struct Waits {
    /// Client id -> (bucket, n) of its wait in progress.
    waiting: BTreeMap<u64, (usize, u64)>,
    killed: BTreeSet<u64>,
    /// Clients unblocked with `CLIENT UNBLOCK id ERROR`: -UNBLOCKED is their due reply.
    unblocked_with_error: BTreeSet<u64>,
    /// Until when writes may be paused (CLIENT PAUSE): no CLIENT UNBLOCK then. A command
    /// held by a pause is a blocked client too, and Redis 7.0 crashes when one is unblocked
    /// ("Unknown btype in replyToBlockedClientTimedOut()", blocked.c:230), with or without
    /// this module.
    paused_until: Option<Instant>,
}

#[derive(Default)]
struct Stats {
    waits: AtomicU64,
    waits_granted: AtomicU64,
    waits_denied: AtomicU64,
    no_timeout_waits: AtomicU64,
    killed: AtomicU64,
    unblocked: AtomicU64,
    takes: AtomicU64,
    takes_granted: AtomicU64,
    refunds: AtomicU64,
}

impl Shared {
    fn fail(&self, message: String) {
        let mut failures = self.failures.lock().unwrap();
        if failures.is_empty() {
            eprintln!("soak: first failure: {message}");
        }
        failures.push(message);
        self.stop.store(true, Relaxed);
    }

    fn stopping(&self) -> bool {
        self.stop.load(Relaxed)
    }
}

/// A waiting client's connection and its CLIENT ID.
struct Connection {
    client: RawClient,
    id: u64,
}

fn connect_waiter(server: &Server) -> Connection {
    let mut client = RawClient::connect(server);
    client.send(&["CLIENT", "ID"]);
    let id = match client.reply() {
        Resp::Other(id) => id.trim().parse().expect("CLIENT ID is an integer"),
        other => panic!("CLIENT ID: {other:?}"),
    };
    Connection { client, id }
}

/// One waiting client, wait after wait, until the soak stops.
fn waiter(server: &Server, shared: &Shared, mut rng: Rng) {
    let mut connection: Option<Connection> = None;
    while !shared.stopping() {
        let con = connection.get_or_insert_with(|| connect_waiter(server));
        let id = con.id;
        let bucket = rng.below(BUCKETS);
        let n = 1 + rng.below(5) as u64;
        let timeout_ms = if rng.chance(20) {
            0
        } else {
            1 + rng.below(1_500) as u64
        };
        let (key, n_text, timeout_text) = (key(bucket), n.to_string(), timeout_ms.to_string());
        let sent = {
            let mut waits = shared.waits.lock().unwrap();
            waits.waiting.insert(id, (bucket, n));
            con.client
                .try_send(&["TB.BTAKE", &key, CAPACITY, RATE, &n_text, &timeout_text])
        };
        let sent_at = Instant::now();
        shared.stats.waits.fetch_add(1, Relaxed);
        if timeout_ms == 0 {
            shared.stats.no_timeout_waits.fetch_add(1, Relaxed);
        }
        let patience = if timeout_ms == 0 {
            NO_TIMEOUT_PATIENCE
        } else {
            Duration::from_millis(timeout_ms) + SLACK
        };
        let reply = match sent {
            Ok(()) => con.client.try_reply_within(patience),
            Err(closed) => Err(closed),
        };
        let elapsed = sent_at.elapsed();
        // Whether the killer picked this wait (killed or unblocked it).
        let (picked, killed, unblocked_with_error) = {
            let mut waits = shared.waits.lock().unwrap();
            let picked = waits.waiting.remove(&id).is_none();
            (
                picked,
                waits.killed.contains(&id),
                waits.unblocked_with_error.contains(&id),
            )
        };
        let what = format!("waiter {id} on {key} (n {n}, timeout {timeout_ms} ms)");
        match reply {
            Ok(Some(Resp::Ints(reply))) => {
                if reply.len() != 4 || !(reply[0] == 0 || reply[0] == 1) {
                    shared.fail(format!("{what}: reply {reply:?}"));
                    return;
                }
                if reply[0] == 1 {
                    shared.granted_heard[bucket].fetch_add(n, Relaxed);
                    shared.stats.waits_granted.fetch_add(1, Relaxed);
                } else {
                    shared.stats.waits_denied.fetch_add(1, Relaxed);
                }
                if timeout_ms > 0 && !picked && elapsed > Duration::from_millis(timeout_ms) + SLACK
                {
                    shared.fail(format!("{what}: answered only after {elapsed:?}"));
                    return;
                }
            }
            Ok(Some(Resp::Error(text)))
                if unblocked_with_error && text.starts_with("UNBLOCKED") =>
            {
                shared.stats.waits_denied.fetch_add(1, Relaxed);
            }
            Ok(Some(other)) => {
                shared.fail(format!("{what}: reply {other:?}"));
                return;
            }
            Ok(None) => {
                shared.fail(format!("{what}: no reply within {patience:?}"));
                return;
            }
            Err(ConnectionClosed) => {
                if !killed {
                    shared.fail(format!(
                        "{what}: connection closed, not killed:\n{}",
                        crash_lines(server)
                    ));
                    return;
                }
                connection = None;
                continue;
            }
        }
        // Exactly one reply: the next one on this connection is PING's.
        let pong = con
            .client
            .try_send(&["PING"])
            .and_then(|()| con.client.try_reply_within(Duration::from_secs(30)));
        match pong {
            Ok(Some(Resp::Other(pong))) if pong == "PONG" => {}
            Err(ConnectionClosed) if shared.waits.lock().unwrap().killed.contains(&id) => {
                connection = None;
            }
            other => {
                shared.fail(format!(
                    "{what}: after its reply, {other:?} instead of PONG"
                ));
                return;
            }
        }
    }
}

/// Picks random waits in progress and kills or unblocks their clients.
fn killer(server: &Server, shared: &Shared, mut rng: Rng) {
    let mut con = server.conn();
    while !shared.stopping() {
        thread::sleep(Duration::from_millis(20 + rng.below(120) as u64));
        let mut waits = shared.waits.lock().unwrap();
        if waits.waiting.is_empty() {
            continue;
        }
        let at = rng.below(waits.waiting.len());
        let (&id, &(bucket, n)) = waits.waiting.iter().nth(at).expect("an entry");
        waits.waiting.remove(&id);
        let id_text = id.to_string();
        let paused = waits
            .paused_until
            .is_some_and(|until| Instant::now() < until);
        let action = if paused { 0 } else { rng.below(10) };
        let result: redis::RedisResult<i64> = if action < 4 {
            waits.killed.insert(id);
            shared.killed_n[bucket].fetch_add(n, Relaxed);
            shared.stats.killed.fetch_add(1, Relaxed);
            redis::cmd("CLIENT")
                .arg(&["KILL", "ID", &id_text])
                .query(&mut con)
        } else {
            shared.stats.unblocked.fetch_add(1, Relaxed);
            let mut cmd = redis::cmd("CLIENT");
            cmd.arg(&["UNBLOCK", &id_text]);
            if action < 6 {
                waits.unblocked_with_error.insert(id);
                cmd.arg("ERROR");
            }
            cmd.query(&mut con)
        };
        drop(waits);
        if let Err(e) = result {
            shared.fail(format!("CLIENT KILL/UNBLOCK {id}: {e}"));
        }
    }
}

/// Plain TB.TAKE calls as fast as they come back (denied while waiters queue).
fn flood(server: &Server, shared: &Shared, mut rng: Rng) {
    let mut con = server.conn();
    while !shared.stopping() {
        let bucket = rng.below(BUCKETS);
        let n = 1 + rng.below(3) as u64;
        match tb_cmd("TB.TAKE", &key(bucket), CAPACITY, RATE, &n.to_string())
            .query::<Vec<i64>>(&mut con)
        {
            Ok(reply) => {
                shared.stats.takes.fetch_add(1, Relaxed);
                if reply[0] == 1 {
                    shared.granted_heard[bucket].fetch_add(n, Relaxed);
                    shared.stats.takes_granted.fetch_add(1, Relaxed);
                }
            }
            Err(e) => {
                shared.fail(format!("TB.TAKE: {e}\n{}", crash_lines(server)));
                return;
            }
        }
        thread::sleep(Duration::from_millis(1));
    }
}

fn refund(server: &Server, shared: &Shared, bucket: usize, n: u64) -> bool {
    let mut con = server.conn();
    match tb_cmd("TB.REFUND", &key(bucket), CAPACITY, RATE, &n.to_string())
        .query::<Vec<i64>>(&mut con)
    {
        Ok(_) => {
            shared.refunded[bucket].fetch_add(n, Relaxed);
            shared.stats.refunds.fetch_add(1, Relaxed);
            true
        }
        Err(e) => {
            shared.fail(format!("TB.REFUND: {e}\n{}", crash_lines(server)));
            false
        }
    }
}

/// The only supply: refunds of random size at random moments.
fn refunder(server: &Server, shared: &Shared, mut rng: Rng) {
    while !shared.stopping() {
        thread::sleep(Duration::from_millis(rng.below(150) as u64));
        if !refund(server, shared, rng.below(BUCKETS), 1 + rng.below(20) as u64) {
            return;
        }
    }
}

fn replica_args(master: &Server) -> Vec<String> {
    vec![
        "--replicaof".into(),
        "127.0.0.1".into(),
        master.port.to_string(),
    ]
}

fn wait_for_link(replica: &Server) {
    let mut rcon = replica.conn();
    wait_until("master_link_status:up on the replica", SYNC_TIMEOUT, || {
        info_field(&mut rcon, "replication", "master_link_status").as_deref() == Some("up")
    });
}

/// Every bucket as the server holds it, and how many keys it has.
fn state(con: &mut redis::Connection) -> (Vec<Bucket>, i64) {
    let keys: Vec<String> = (0..BUCKETS).map(key).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let dbsize: i64 = redis::cmd("DBSIZE").query(con).expect("DBSIZE");
    (buckets(con, &keys), dbsize)
}

/// One fault, chosen at random, on the main thread.
fn fault(master: &Server, replica: &mut Server, shared: &Shared, rng: &mut Rng) -> &'static str {
    let mut con = master.conn();
    match rng.below(5) {
        0 => {
            replica.kill();
            replica.restart();
            "replica killed and restarted"
        }
        1 => {
            replica.restart();
            "replica restarted"
        }
        2 => {
            // Refused (an error) while a rewrite runs already; scheduled while a fork runs.
            let _ = redis::cmd("BGREWRITEAOF").query::<String>(&mut con);
            "BGREWRITEAOF"
        }
        _ => {
            let ms = 200 + rng.below(600) as u64;
            let mut waits = shared.waits.lock().unwrap();
            // Until well after the pause, whatever the server's timer granularity.
            waits.paused_until = Some(Instant::now() + Duration::from_millis(ms + 500));
            let _: () = redis::cmd("CLIENT")
                .arg(&["PAUSE", &ms.to_string(), "WRITE"])
                .query(&mut con)
                .expect("CLIENT PAUSE");
            drop(waits);
            "CLIENT PAUSE WRITE"
        }
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(default)
}

#[test]
fn waiters_under_kills_unblocks_floods_replica_restarts_and_rewrites_conserve_every_token() {
    let seed: u64 = env_or("TB_SOAK_SEED", 0x50a4_b7a4_e000_0001);
    let soak = Duration::from_secs(env_or("TB_SOAK_SECS", 60));
    eprintln!("soak: seed {seed:#x}, {soak:?} of faults");
    let started = Instant::now();
    let mut master_args = QUIET_MASTER_ARGS.to_vec();
    master_args.extend_from_slice(&["--appendonly", "yes", "--appendfsync", "everysec"]);
    let mut master = Server::start_with(&master_args);
    let replica_args = replica_args(&master);
    let replica_args: Vec<&str> = replica_args.iter().map(String::as_str).collect();
    let mut replica = Server::start_with(&replica_args);
    wait_for_link(&replica);
    let mut con = master.conn();
    // Drained buckets: every token from here on is one the test refunded.
    let start: Vec<f64> = (0..BUCKETS)
        .map(|bucket| {
            let drained = take(&mut con, &key(bucket), CAPACITY, RATE, CAPACITY);
            assert_eq!(drained[..2], [1, 0], "drain {}", key(bucket));
            stored_tokens(&mut con, &key(bucket))
        })
        .collect();

    let shared = Shared::default();
    let mut rng = Rng(seed);
    let mut faults: BTreeMap<&str, usize> = BTreeMap::new();
    thread::scope(|scope| {
        let workers: Vec<_> = (0..WAITER_THREADS)
            .map(|index| {
                let (server, shared) = (&master, &shared);
                let rng = Rng(seed ^ (index + 1).wrapping_mul(0x9e37_79b9));
                scope.spawn(move || waiter(server, shared, rng))
            })
            .collect();
        let helpers = [
            scope.spawn(|| killer(&master, &shared, Rng(seed ^ 0x4b11))),
            scope.spawn(|| flood(&master, &shared, Rng(seed ^ 0xf100d))),
            scope.spawn(|| refunder(&master, &shared, Rng(seed ^ 0x7ef0))),
        ];
        while started.elapsed() < soak && !shared.stopping() {
            thread::sleep(Duration::from_millis(2_000 + rng.below(3_000) as u64));
            if shared.stopping() {
                break;
            }
            *faults
                .entry(fault(&master, &mut replica, &shared, &mut rng))
                .or_default() += 1;
        }
        shared.stop.store(true, Relaxed);
        for helper in helpers {
            helper.join().expect("a helper thread");
        }
        // Waiters without a timeout still wait: refund until every waiter is done.
        let until = Instant::now() + NO_TIMEOUT_PATIENCE;
        while workers.iter().any(|w| !w.is_finished()) && Instant::now() < until {
            for bucket in 0..BUCKETS {
                refund(&master, &shared, bucket, 50);
            }
            thread::sleep(Duration::from_millis(100));
        }
        for worker in workers {
            worker.join().expect("a waiter thread");
        }
    });
    let stats = &shared.stats;
    eprintln!(
        "soak: {:?}; waits {} ({} without timeout): {} granted, {} denied; {} killed, {} \
         unblocked; TB.TAKE {} ({} granted); refunds {}; faults {faults:?}",
        started.elapsed(),
        stats.waits.load(Relaxed),
        stats.no_timeout_waits.load(Relaxed),
        stats.waits_granted.load(Relaxed),
        stats.waits_denied.load(Relaxed),
        stats.killed.load(Relaxed),
        stats.unblocked.load(Relaxed),
        stats.takes.load(Relaxed),
        stats.takes_granted.load(Relaxed),
        stats.refunds.load(Relaxed),
    );
    let failures = shared.failures.lock().unwrap().clone();
    assert!(
        failures.is_empty(),
        "{} failures, the first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(3)].join("\n")
    );
    assert!(master.is_alive(), "{}", crash_lines(&master));
    let mut con = master.conn();
    assert_eq!(tb_field(&mut con, "tb_waiting"), "0", "nobody left waiting");

    // No token made or lost.
    for (bucket, start) in start.iter().enumerate() {
        let refunded = shared.refunded[bucket].load(Relaxed) as f64;
        let heard = shared.granted_heard[bucket].load(Relaxed) as f64;
        let killed = shared.killed_n[bucket].load(Relaxed) as f64;
        let left = stored_tokens(&mut con, &key(bucket));
        let taken = start + refunded - left;
        eprintln!(
            "{}: refunded {refunded}, left {left}, taken {taken}, heard {heard}, killed \
             waiters' n {killed}",
            key(bucket)
        );
        assert!(
            heard <= taken + REFILL_TOLERANCE,
            "{}: {heard} granted as heard, but only {taken} left the bucket",
            key(bucket)
        );
        assert!(
            taken <= heard + killed + REFILL_TOLERANCE,
            "{}: {taken} left the bucket, {heard} granted as heard, at most {killed} to \
             killed waiters",
            key(bucket)
        );
    }

    // The replica holds exactly the master's buckets.
    if !replica.is_alive() {
        replica.restart();
    }
    wait_for_link(&replica);
    wait_for_replica(&master, &replica);
    let on_master = state(&mut con);
    assert_eq!(
        state(&mut replica.conn()),
        on_master,
        "the replica holds the master's buckets"
    );

    // So does the AOF, reloaded.
    wait_until("no AOF rewrite running", Duration::from_secs(30), || {
        info_field(&mut con, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
            && info_field(&mut con, "persistence", "aof_rewrite_scheduled").as_deref() == Some("0")
    });
    master.restart();
    assert_eq!(
        state(&mut master.conn()),
        on_master,
        "the master reloaded from its AOF"
    );
}
