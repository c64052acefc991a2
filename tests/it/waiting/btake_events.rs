//! TB.BTAKE waiters and the server's own events: paused writes (CLIENT PAUSE, FAILOVER),
//! SWAPDB, RENAME and MOVE, many short waits behind a long one, deadlines that race the
//! tokens, and one supply that serves a whole queue.
//!
//! Each waiter is a `RawClient`: its command is sent, and its reply looked for later. Where
//! only the test's own TB.REFUND calls may supply tokens, the rate is one token per 1000 s
//! (`SLOW`); where tokens must appear by themselves at a known moment, the rate is a few per
//! second and the moment is checked against the stored `last_refill` of the drain.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Barrier;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::harness::*;

/// One token per 1000 s: nothing refills during a test.
const SLOW: &str = "0.001";

/// How long a reply that is due may take to arrive on a loaded machine.
const DUE: Duration = Duration::from_secs(10);

/// How long a waiter that must not be answered is watched.
const QUICK: Duration = Duration::from_millis(200);

// --- Helpers --------------------------------------------------------------------------------

/// An integer field of `INFO tb`.
fn tb_count(con: &mut redis::Connection, field: &str) -> i64 {
    tb_field(con, field)
        .parse::<f64>()
        .unwrap_or_else(|e| panic!("INFO tb {field}: {e}")) as i64
}

/// Waits (bounded) until `INFO tb` shows `count` clients waiting.
fn wait_for_waiting(con: &mut redis::Connection, count: i64) {
    wait_until(
        &format!("tb_waiting = {count}"),
        Duration::from_secs(20),
        || tb_count(con, "tb_waiting") == count,
    );
}

/// Sends TB.BTAKE on a fresh connection and returns it, its reply still to come.
fn btake(server: &Server, args: &[&str]) -> RawClient {
    btake_in_db(server, 0, args)
}

/// Like `btake`, on a connection that first SELECTs `db`.
fn btake_in_db(server: &Server, db: i64, args: &[&str]) -> RawClient {
    let mut client = RawClient::connect(server);
    if db != 0 {
        client.send(&["SELECT", &db.to_string()]);
        assert_eq!(client.reply(), Resp::Other("OK".into()), "SELECT {db}");
    }
    let mut all = vec!["TB.BTAKE"];
    all.extend_from_slice(args);
    client.send(&all);
    client
}

/// A drained bucket: `capacity` taken at once. Returns the drain's `last_refill`.
/// The waiter's reply, due within `within`; a dead server fails with the reason it died.
fn reply_of(server: &Server, waiter: &mut RawClient, within: Duration, what: &str) -> Resp {
    match waiter.try_reply_within(within) {
        Ok(Some(reply)) => reply,
        Ok(None) => panic!("{what}: no reply within {within:?}"),
        Err(ConnectionClosed) => panic!(
            "{what}: the server closed the connection (alive: {}):\n{}",
            process_running(server),
            crash_lines(server)
        ),
    }
}

/// Asserts that `waiter` gets no reply for `during`, and that the server is still up.
fn stays_quiet(server: &Server, waiter: &mut RawClient, during: Duration, what: &str) {
    match waiter.try_reply_within(during) {
        Ok(None) => {}
        Ok(Some(reply)) => panic!("{what}: answered too early: {reply:?}"),
        Err(ConnectionClosed) => panic!(
            "{what}: the server closed the connection (alive: {}):\n{}",
            process_running(server),
            crash_lines(server)
        ),
    }
}

/// Panics, with the reason from the log, unless the server runs and answers PING.
fn assert_alive(server: &Server, when: &str) {
    assert!(
        server.is_alive(),
        "the server died {when}:\n{}",
        crash_lines(server)
    );
}

/// How many HSETs on `key` the AOF holds (`appendfsync always`: up to date at each reply).
fn aof_hsets(server: &Server, key: &str) -> usize {
    aof_commands(&server.dir)
        .iter()
        .filter(|c| {
            c.len() > 1 && c[0].eq_ignore_ascii_case(b"HSET") && c[1].as_slice() == key.as_bytes()
        })
        .count()
}

/// Runs a command that must answer OK.
fn ok(con: &mut redis::Connection, args: &[&str]) {
    let mut cmd = redis::cmd(args[0]);
    for arg in &args[1..] {
        cmd.arg(*arg);
    }
    let reply: String = cmd
        .query(con)
        .unwrap_or_else(|e| panic!("{args:?}: {}", error_text(&e)));
    assert_eq!(reply, "OK", "{args:?}");
}

fn role(con: &mut redis::Connection) -> String {
    info_field(con, "replication", "role").expect("role in INFO replication")
}

fn failover_state(con: &mut redis::Connection) -> String {
    info_field(con, "replication", "master_failover_state")
        .expect("master_failover_state in INFO replication")
}

/// The client's wall clock in Unix µs (the same clock as the server's, on this machine).
fn wall_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_micros() as i64
}

/// `result`'s value; a failed call fails the test with the reason the server died, if it did.
fn alive<T>(server: &Server, result: redis::RedisResult<T>, what: &str) -> T {
    result.unwrap_or_else(|e| {
        panic!(
            "{what}: {e} (server alive: {}):\n{}",
            process_running(server),
            crash_lines(server)
        )
    })
}

/// Waits (bounded) until the server clock reaches `at_ms`.
fn wait_for_server_time(server: &Server, con: &mut redis::Connection, at_ms: i64) {
    wait_until(
        &format!("server time {at_ms}"),
        Duration::from_secs(20),
        || {
            let (secs, micros): (i64, i64) = alive(server, redis::cmd("TIME").query(con), "TIME");
            secs * 1000 + micros / 1000 >= at_ms
        },
    );
}

/// A master with AOF (fsync at every write) whose replication offset moves only with writes.
/// FAILOVER refuses a target the master does not list as `state=online` yet
/// (a replica that has only just synced, on a loaded machine).
fn wait_until_online(con: &mut redis::Connection) {
    wait_until("the replica to be online", Duration::from_secs(20), || {
        info_field(con, "replication", "slave0").is_some_and(|slave| slave.contains("state=online"))
    });
}

fn quiet_master_with_aof() -> Server {
    let mut args = QUIET_MASTER_ARGS.to_vec();
    args.extend_from_slice(AOF_ARGS);
    Server::start_with(&args)
}

/// A master as `quiet_master_with_aof` with a replica in sync, a connection to the master,
/// and there a drained `k` with a waiter queued on it, as `drained_k_with_a_waiter` makes
/// them (its `last_refill`, then the waiter).
fn replicated_waiter(rate: &str, n: &str) -> (Server, Server, redis::Connection, i64, RawClient) {
    let master = quiet_master_with_aof();
    let replica = start_replica_of(&master);
    let mut con = master.conn();
    let (drained_at, waiter) = drained_k_with_a_waiter(&master, &mut con, rate, n);
    (master, replica, con, drained_at, waiter)
}

/// The waiter was served once writes resumed (granted, told to wait no more), the master is
/// up, and the replica holds the master's bucket.
fn assert_served_and_replicated(master: &Server, replica: &Server, reply: &[i64], when: &str) {
    assert_eq!((reply[0], reply[2]), (1, 0), "served {when}: {reply:?}");
    assert_alive(master, when);
    assert_replica_holds(master, replica, &["k"]);
}

fn assert_replica_holds(master: &Server, replica: &Server, keys: &[&str]) {
    wait_for_replica(master, replica);
    let mut mcon = master.conn();
    let mut rcon = replica.conn();
    assert_eq!(
        buckets(&mut rcon, keys),
        buckets(&mut mcon, keys),
        "the replica holds the master's buckets"
    );
}

/// A drained bucket `k` of capacity 10 refilled at `rate` tokens/s, and a waiter for `n` of
/// its tokens, queued (no timeout). Returns the drain's `last_refill` and the waiter.
fn drained_k_with_a_waiter(
    server: &Server,
    con: &mut redis::Connection,
    rate: &str,
    n: &str,
) -> (i64, RawClient) {
    let drained_at = drain(con, "k", "10", rate);
    let waiter = btake(server, &["k", "10", rate, n, "0"]);
    wait_for_waiting(con, 1);
    (drained_at, waiter)
}

/// Starts `FAILOVER TO` the replica with `timeout_ms`, the replica stopped (SIGSTOP) before a
/// write it therefore cannot acknowledge: it cannot catch up, so the master stays paused
/// until the timeout, or until the replica is let go on.
fn failover_to_a_stopped_replica(con: &mut redis::Connection, replica: &Server, timeout_ms: &str) {
    wait_until_online(con);
    signal(replica, libc::SIGSTOP);
    ok(con, &["SET", "failover:unacknowledged", "1"]);
    let port = replica.port.to_string();
    ok(
        con,
        &["FAILOVER", "TO", "127.0.0.1", &port, "TIMEOUT", timeout_ms],
    );
}

/// While writes are paused: the waiter gets no reply for a while, the master stays up, and
/// nothing has been propagated since the pause began (at replication offset `offset`).
fn stays_paused(
    master: &Server,
    con: &mut redis::Connection,
    waiter: &mut RawClient,
    offset: i64,
    when: &str,
) {
    stays_quiet(master, waiter, QUICK, when);
    assert_alive(master, when);
    assert_eq!(repl_offset(con), offset, "nothing propagated {when}");
}

/// `k` is as `before` was taken: nothing taken while paused.
fn assert_nothing_taken(con: &mut redis::Connection, before: &KeySnapshot) {
    assert_eq!(&snapshot(con, b"k"), before, "nothing taken while paused");
}

/// The AOF holds `hsets` HSETs of `k`, as before the pause: nothing appended while paused.
fn assert_nothing_appended(server: &Server, hsets: usize) {
    assert_eq!(
        aof_hsets(server, "k"),
        hsets,
        "nothing in the AOF while paused"
    );
}

/// A look now is still inside the 5000 ms pause that began at `paused_at`.
fn assert_inside_the_pause(paused_at: Instant) {
    let elapsed = paused_at.elapsed();
    assert!(
        elapsed < Duration::from_millis(4_500),
        "too slow to look inside the pause ({elapsed:?})"
    );
}

/// The waiter's reply, which comes once the 5000 ms pause that began at `paused_at` ends,
/// not before.
fn reply_after_the_pause(server: &Server, waiter: &mut RawClient, paused_at: Instant) -> Vec<i64> {
    let reply = reply_of(server, waiter, DUE, "after the pause").ints();
    let elapsed = paused_at.elapsed();
    assert!(
        elapsed >= Duration::from_millis(4_990),
        "answered {elapsed:?} into a 5000 ms pause"
    );
    reply
}

/// A replicated waiter for `n` tokens at one per second whose master starts `FAILOVER TO`
/// its stopped replica with `timeout_ms`, looked at `look_ms` after the drain, when the
/// tokens exist: the pause holds the waiter, and nothing is propagated, appended or taken.
/// Returns the master, the replica, a connection to the master, the waiter and the drained
/// bucket.
fn a_waiter_held_by_a_failover(
    n: &str,
    timeout_ms: &str,
    look_ms: i64,
) -> (Server, Server, redis::Connection, RawClient, Bucket) {
    let (master, replica, mut con, drained_at, mut waiter) = replicated_waiter("1", n);
    failover_to_a_stopped_replica(&mut con, &replica, timeout_ms);
    let offset = repl_offset(&mut con);
    let (drained, hsets) = (bucket(&mut con, "k"), aof_hsets(&master, "k"));
    assert_eq!(stored_last_refill(&mut con, "k"), drained_at);
    wait_for_server_time(&master, &mut con, drained_at + look_ms);
    stays_paused(
        &master,
        &mut con,
        &mut waiter,
        offset,
        "during the failover",
    );
    assert_nothing_appended(&master, hsets);
    assert_eq!(bucket(&mut con, "k"), drained, "nothing taken while paused");
    (master, replica, con, waiter, drained)
}

// --- 1. Paused writes -----------------------------------------------------------------------

/// While CLIENT PAUSE WRITE holds, a write would go to the AOF during a pause, which the
/// server forbids (it aborts): the module must leave the waiter waiting, and serve it once
/// CLIENT UNPAUSE ends the pause.
#[test]
fn client_pause_write_with_aof_takes_nothing_and_serves_the_waiter_after_unpause() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    // One token per second, drained: the waiter's 2 tokens exist 2 s after the drain.
    let (drained_at, mut waiter) = drained_k_with_a_waiter(&server, &mut con, "1", "2");
    ok(&mut con, &["CLIENT", "PAUSE", "60000", "WRITE"]);
    let before = snapshot(&mut con, b"k");
    let hsets = aof_hsets(&server, "k");
    assert!(
        stored_last_refill(&mut con, "k") == drained_at,
        "the waiter was served before the pause began (a very slow machine?)"
    );
    // Past the moment the tokens exist, and a good while more.
    wait_for_server_time(&server, &mut con, drained_at + 3_000);
    stays_quiet(&server, &mut waiter, QUICK, "during the pause");
    assert_alive(&server, "during CLIENT PAUSE WRITE");
    assert_nothing_taken(&mut con, &before);
    assert_nothing_appended(&server, hsets);
    assert_eq!(tb_count(&mut con, "tb_waiting"), 1);

    ok(&mut con, &["CLIENT", "UNPAUSE"]);
    let reply = reply_of(&server, &mut waiter, DUE, "after UNPAUSE").ints();
    assert_eq!((reply[0], reply[2]), (1, 0), "served: {reply:?}");
    assert_alive(&server, "after the pause");
    assert!(stored_last_refill(&mut con, "k") > drained_at + 3_000);
    assert_eq!(aof_hsets(&server, "k"), hsets + 1, "the take, once");
}

/// With a replica attached, a write during a pause aborts the server too. The pause here
/// ends by its own timeout: the waiter is answered after it, not before, and the replica
/// receives nothing while it lasts.
#[test]
fn client_pause_write_with_a_replica_takes_nothing_and_serves_the_waiter_when_it_times_out() {
    let master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    let mut con = master.conn();
    let (drained_at, mut waiter) = drained_k_with_a_waiter(&master, &mut con, "1", "1");
    let paused_at = Instant::now();
    ok(&mut con, &["CLIENT", "PAUSE", "5000", "WRITE"]);
    let offset = repl_offset(&mut con);
    let before = snapshot(&mut con, b"k");
    assert_eq!(
        stored_last_refill(&mut con, "k"),
        drained_at,
        "the waiter was served before the pause began (a very slow machine?)"
    );
    wait_for_server_time(&master, &mut con, drained_at + 1_500);
    assert_inside_the_pause(paused_at);
    stays_paused(&master, &mut con, &mut waiter, offset, "during the pause");
    assert_nothing_taken(&mut con, &before);

    let reply = reply_after_the_pause(&master, &mut waiter, paused_at);
    assert_served_and_replicated(&master, &replica, &reply, "after the pause");
}

/// A bucket whose TTL runs out during a pause is expired for readers, but the server keeps
/// the key until the pause ends; recreating it then is another abort. The waiter must be
/// served from the full bucket once the pause ends, and the AOF and the replica get nothing
/// before that.
#[test]
fn a_bucket_whose_ttl_runs_out_during_a_pause_serves_its_waiter_after_the_pause() {
    // Five per second, capacity 10: full (and expired) 2 s after the drain, which is also
    // when the waiter's 10 tokens exist.
    let (master, replica, mut con, drained_at, mut waiter) = replicated_waiter("5", "10");
    assert_eq!(pexpiretime(&mut con, "k"), drained_at + 2_000);
    ok(&mut con, &["CLIENT", "PAUSE", "60000", "WRITE"]);
    let offset = repl_offset(&mut con);
    let hsets = aof_hsets(&master, "k");
    assert_eq!(stored_last_refill(&mut con, "k"), drained_at);
    wait_until("the bucket to expire", Duration::from_secs(20), || {
        let found: i64 = alive(
            &master,
            redis::cmd("EXISTS").arg("k").query(&mut con),
            "EXISTS",
        );
        found == 0
    });
    wait_for_server_time(&master, &mut con, drained_at + 2_500);
    stays_paused(&master, &mut con, &mut waiter, offset, "once expired");
    assert_nothing_appended(&master, hsets);

    ok(&mut con, &["CLIENT", "UNPAUSE"]);
    let reply = reply_of(&master, &mut waiter, DUE, "after UNPAUSE").ints();
    assert_eq!(reply[..3], [1, 0, 0], "10 of a full bucket of 10");
    assert_served_and_replicated(&master, &replica, &reply, "after the pause");
}

/// CLIENT PAUSE ALL holds every client, the test's own too (so the server is watched from
/// outside: its process and its AOF files). The waiter is served when the pause times out.
#[test]
fn client_pause_all_takes_nothing_and_serves_the_waiter_after_it_ends() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    let (drained_at, mut waiter) = drained_k_with_a_waiter(&server, &mut con, "1", "1");
    let hsets = aof_hsets(&server, "k");
    let paused_at = Instant::now();
    ok(&mut con, &["CLIENT", "PAUSE", "5000", "ALL"]);
    let paused_ms = wall_us() / 1000;
    assert!(
        paused_ms < drained_at + 900,
        "the waiter was served before the pause began (a very slow machine?)"
    );
    // The token exists 1 s after the drain; look 1.5 s later, still inside the pause.
    stays_quiet(
        &server,
        &mut waiter,
        Duration::from_millis((drained_at + 2_500 - paused_ms).max(0) as u64),
        "during the pause",
    );
    assert_inside_the_pause(paused_at);
    assert!(process_running(&server), "{}", crash_lines(&server));
    assert_nothing_appended(&server, hsets);

    let reply = reply_after_the_pause(&server, &mut waiter, paused_at);
    assert_eq!((reply[0], reply[2]), (1, 0), "served: {reply:?}");
    assert_alive(&server, "after CLIENT PAUSE ALL");
    assert_eq!(aof_hsets(&server, "k"), hsets + 1);
}

/// A waiter whose timeout passes during a pause gets its denial at its timeout (a denial
/// writes nothing, so the pause does not hold it), and is never served after it.
#[test]
fn a_waiter_whose_timeout_passes_during_a_pause_is_denied_on_time_and_takes_nothing() {
    let server = Server::start_with(AOF_ARGS);
    let mut con = server.conn();
    // The token exists 1 s after the drain, the timeout is at 2 s: both inside the pause.
    let drained_at = drain(&mut con, "k", "10", "1");
    let sent = Instant::now();
    let mut waiter = btake(&server, &["k", "10", "1", "1", "2000"]);
    wait_for_waiting(&mut con, 1);
    ok(&mut con, &["CLIENT", "PAUSE", "60000", "WRITE"]);
    assert_eq!(stored_last_refill(&mut con, "k"), drained_at);
    let before = snapshot(&mut con, b"k");
    let hsets = aof_hsets(&server, "k");
    let reply = reply_of(&server, &mut waiter, DUE, "at its timeout").ints();
    let after = sent.elapsed();
    assert_eq!(reply[0], 0, "denied: {reply:?}");
    assert!(
        after >= Duration::from_millis(1_990),
        "denied after {after:?}"
    );
    assert_alive(&server, "during the pause");
    assert_eq!(tb_count(&mut con, "tb_waits_timed_out"), 1);
    assert_eq!(tb_count(&mut con, "tb_waiting"), 0);
    ok(&mut con, &["CLIENT", "UNPAUSE"]);
    assert!(ping(&mut con));
    assert_eq!(
        snapshot(&mut con, b"k"),
        before,
        "nothing taken, then or after"
    );
    assert_eq!(aof_hsets(&server, "k"), hsets);
}

/// FAILOVER pauses writes while the replica catches up. With the replica stopped (SIGSTOP)
/// it cannot, so the master stays paused until the failover's TIMEOUT, then gives up and
/// resumes as master. A waiter whose tokens appear during that pause is served after it.
#[test]
fn a_failover_that_times_out_takes_nothing_during_its_pause_and_serves_the_waiter_after() {
    // Two tokens at one per second: they exist 2 s after the drain, inside the 5 s pause.
    let (master, replica, mut con, mut waiter, _) = a_waiter_held_by_a_failover("2", "5000", 2_500);
    let state = failover_state(&mut con);
    assert_eq!(
        state, "waiting-for-sync",
        "still inside the failover's pause"
    );

    wait_until("the failover to give up", Duration::from_secs(20), || {
        failover_state(&mut con) == "no-failover"
    });
    assert_eq!(role(&mut con), "master");
    let reply = reply_of(&master, &mut waiter, DUE, "after the failover").ints();
    signal(&replica, libc::SIGCONT);
    assert_served_and_replicated(&master, &replica, &reply, "after the failover");
}

/// A failover that completes turns the master into a replica while the waiter still waits
/// (its tokens appeared during the pause): it gets -UNBLOCKED and takes nothing, and the
/// two servers end with the same bucket.
#[test]
fn a_failover_that_completes_answers_the_waiter_unblocked_and_takes_nothing() {
    let (master, replica, mut con, mut waiter, drained) =
        a_waiter_held_by_a_failover("1", "60000", 2_000);

    signal(&replica, libc::SIGCONT);
    match reply_of(
        &master,
        &mut waiter,
        Duration::from_secs(30),
        "at the role change",
    ) {
        Resp::Error(text) => assert!(text.starts_with("UNBLOCKED"), "{text}"),
        other => panic!("expected -UNBLOCKED, got {other:?}"),
    }
    wait_until(
        "the old master to be a replica",
        Duration::from_secs(20),
        || role(&mut con) == "slave",
    );
    // The old master turns replica first, then sends the target its PSYNC
    // FAILOVER, which promotes it: on a loaded machine there is a gap.
    let mut rcon = replica.conn();
    wait_until(
        "the replica to be promoted",
        Duration::from_secs(20),
        || role(&mut rcon) == "master",
    );
    assert_eq!(bucket(&mut rcon, "k"), drained, "the waiter took nothing");
    assert_replica_holds(&replica, &master, &["k"]);
    assert_eq!(tb_count(&mut con, "tb_waiting"), 0);
}

// --- 2. SWAPDB ------------------------------------------------------------------------------

/// Starts a waiter in `db` for 2 tokens of `k` (capacity 5, `SLOW`), waits until it waits, then
/// swaps db 0 and db 1 under it; returns the waiter, its reply still to come.
fn swap_dbs_under_a_waiter(server: &Server, con: &mut redis::Connection, db: i64) -> RawClient {
    let waiter = btake_in_db(server, db, &["k", "5", SLOW, "2", "0"]);
    wait_for_waiting(con, 1);
    ok(con, &["SWAPDB", "0", "1"]);
    waiter
}

/// `k` in `db` is still as `before` was taken (SELECTs `db` on `con`).
fn assert_untouched_in_db(con: &mut redis::Connection, db: i64, before: &KeySnapshot) {
    ok(con, &["SELECT", &db.to_string()]);
    assert_eq!(&snapshot(con, b"k"), before, "k in db {db} was touched");
}

/// Waiters stay on their database number, as BLPOP's do: after SWAPDB they wait on the
/// swapped-in data. With no `k` there, theirs is a full bucket, which serves them at once,
/// and the drained bucket, swapped into the other database, is left as it was.
fn swapdb_serves_a_waiter_whose_key_is_missing_in_the_swapped_in_db(db: i64) {
    let server = Server::start();
    let mut con = server.conn();
    ok(&mut con, &["SELECT", &db.to_string()]);
    drain(&mut con, "k", "5", SLOW);
    let drained = snapshot(&mut con, b"k");
    let mut waiter = swap_dbs_under_a_waiter(&server, &mut con, db);
    let reply = reply_of(&server, &mut waiter, DUE, "after SWAPDB").ints();
    assert_eq!(reply[..3], [1, 3, 0], "2 of a full bucket of 5");
    assert_eq!(stored_tokens(&mut con, "k"), 3.0, "taken in db {db}");
    assert_untouched_in_db(&mut con, 1 - db, &drained);
    assert_eq!(tb_count(&mut con, "tb_waiting"), 0);
}

#[test]
fn swapdb_serves_a_db_0_waiter_whose_key_is_missing_in_the_swapped_in_db() {
    swapdb_serves_a_waiter_whose_key_is_missing_in_the_swapped_in_db(0);
}

#[test]
fn swapdb_serves_a_db_1_waiter_whose_key_is_missing_in_the_swapped_in_db() {
    swapdb_serves_a_waiter_whose_key_is_missing_in_the_swapped_in_db(1);
}

/// A swapped-in `k` that is not a bucket fails the waiter with an error, and is left alone.
#[test]
fn swapdb_bringing_in_a_string_fails_the_waiter_and_touches_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "5", SLOW);
    ok(&mut con, &["SELECT", "1"]);
    ok(&mut con, &["SET", "k", "not a bucket"]);
    ok(&mut con, &["SELECT", "0"]);
    let drained = snapshot(&mut con, b"k");
    let mut waiter = swap_dbs_under_a_waiter(&server, &mut con, 0);
    match reply_of(&server, &mut waiter, DUE, "after SWAPDB") {
        Resp::Error(text) => assert!(text.starts_with("ERR"), "{text}"),
        other => panic!("expected an error, got {other:?}"),
    }
    let value: String = redis::cmd("GET").arg("k").query(&mut con).expect("GET");
    assert_eq!(value, "not a bucket");
    assert_untouched_in_db(&mut con, 1, &drained);
    assert_eq!(tb_count(&mut con, "tb_waiting"), 0);
}

/// A swapped-in drained bucket keeps the waiter waiting; a refund to it (in the waiter's
/// db) serves it.
#[test]
fn swapdb_bringing_in_a_drained_bucket_keeps_the_waiter_until_a_refund() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k", "5", SLOW);
    ok(&mut con, &["SELECT", "1"]);
    drain(&mut con, "k", "4", SLOW);
    ok(&mut con, &["SELECT", "0"]);
    let mut waiter = swap_dbs_under_a_waiter(&server, &mut con, 0);
    stays_quiet(&server, &mut waiter, QUICK, "a drained bucket swapped in");
    assert_eq!(tb_count(&mut con, "tb_waiting"), 1);
    refund(&mut con, "k", "5", SLOW, "3");
    let reply = reply_of(&server, &mut waiter, DUE, "after the refund").ints();
    assert_eq!(reply[..3], [1, 1, 0], "3 refunded, 2 taken");
    ok(&mut con, &["SELECT", "1"]);
    assert!(
        stored_tokens(&mut con, "k") < 0.01,
        "db 1's bucket untouched"
    );
}

// --- 3. Memory of abandoned waiters ----------------------------------------------------------

fn used_memory(con: &mut redis::Connection) -> i64 {
    info_field(con, "memory", "used_memory")
        .expect("INFO memory used_memory")
        .parse()
        .expect("used_memory is an integer")
}

/// Runs `rounds` short waits (timeout 1 ms) on each client, each sent as soon as the
/// previous one is answered (a denial, since the head never leaves).
fn short_waits(clients: &mut [RawClient], rounds: usize) {
    let barrier = Barrier::new(clients.len());
    thread::scope(|scope| {
        for client in clients.iter_mut() {
            let barrier = &barrier;
            scope.spawn(move || {
                barrier.wait();
                for round in 0..rounds {
                    client.send(&["TB.BTAKE", "k", "1", SLOW, "1", "1"]);
                    let reply = client
                        .reply_within(Duration::from_secs(30))
                        .unwrap_or_else(|| panic!("short wait {round}: no reply"));
                    assert_eq!(reply.ints()[0], 0, "short wait {round}");
                }
            });
        }
    });
}

/// Waits that come and go behind a head that stays must not leave anything behind: the
/// queue's memory follows the clients waiting now, not all those that ever waited.
#[test]
fn short_waits_behind_a_long_one_leave_no_memory_behind() {
    const CLIENTS: usize = 50;
    const ROUNDS: usize = 4_000; // 200,000 waits in all
    let server = Server::start();
    let mut con = server.conn();
    // Client reply buffers are resized with traffic by the server's cron, by up to tens of
    // KB per client; fixed, the 50 clients' memory is the same before and after. (Their
    // query buffers only shrink after 2 s idle, which can only lower the "after" figure.)
    ok(&mut con, &["DEBUG", "REPLYBUFFER", "RESIZING", "0"]);
    drain(&mut con, "k", "1", SLOW);
    let mut head = btake(&server, &["k", "1", SLOW, "1", "0"]);
    wait_for_waiting(&mut con, 1);
    let mut clients: Vec<RawClient> = (0..CLIENTS).map(|_| RawClient::connect(&server)).collect();
    // A first round brings every structure to its working size (and every client's
    // buffers).
    short_waits(&mut clients, 20);
    let before = used_memory(&mut con);
    let started = Instant::now();
    short_waits(&mut clients, ROUNDS);
    let took = started.elapsed();
    let after = used_memory(&mut con);
    assert_eq!(tb_count(&mut con, "tb_waiting"), 1, "the head still waits");
    assert_eq!(
        tb_count(&mut con, "tb_waits_timed_out"),
        ((ROUNDS + 20) * CLIENTS) as i64
    );
    let growth = after - before;
    assert!(
        growth < 300_000,
        "used_memory grew by {growth} bytes over {} abandoned waits ({took:?})",
        ROUNDS * CLIENTS
    );
    refund(&mut con, "k", "1", SLOW, "1");
    assert_eq!(
        reply_of(&server, &mut head, DUE, "the head").ints()[..3],
        [1, 0, 0]
    );
    assert_eq!(tb_count(&mut con, "tb_waiting"), 0);
}

// --- 4. Never granted after its deadline -----------------------------------------------------

/// Waiters whose tokens appear within a few ms of their timeout, one key each, while the
/// server stalls now and then (DEBUG SLEEP, as a busy server would): a grant is stored (its
/// `last_refill`) no later than the deadline, a denial arrives no earlier. The server's
/// clock at arrival is read by a script sent in the same write as the TB.BTAKE.
#[test]
fn a_waiter_is_never_granted_after_its_deadline_nor_denied_before_it() {
    const WAITERS: usize = 200;
    /// Tolerance for ms rounding between the script's clock and the module's.
    const SLACK_MS: i64 = 3;
    const NOW_US: &str = "local t = redis.call('TIME') return t[1] * 1000000 + t[2]";
    let server = Server::start();
    let mut con = server.conn();
    let mut rng = Rng(0x5eed_dead_11e5);
    // 1000 tokens per second: one per ms. Capacity 10^6: far from full, never expires.
    let mut pipe = redis::pipe();
    for i in 0..WAITERS {
        pipe.add_command(tb_cmd(
            "TB.TAKE",
            &format!("k{i}"),
            "1000000",
            "1000",
            "1000000",
        ));
    }
    let _: Vec<Vec<i64>> = pipe.query(&mut con).expect("drain");
    struct Wait {
        client: RawClient,
        key: String,
        drained_at: i64,
        n: i64,
        timeout: i64,
    }
    let mut waits = Vec::new();
    for i in 0..WAITERS {
        let key = format!("k{i}");
        let drained_at = stored_last_refill(&mut con, &key);
        // Its tokens exist 400..1400 ms after the drain; the timeout ends within ±8 ms of it.
        let n = 400 + rng.below(1_000) as i64;
        let delta = rng.below(17) as i64 - 8;
        let timeout = (drained_at + n + delta - wall_us() / 1000).max(1);
        let mut client = RawClient::connect(&server);
        let (n_text, timeout_text) = (n.to_string(), timeout.to_string());
        client.send_all(&[
            &["EVAL", NOW_US, "0"],
            &["TB.BTAKE", &key, "1000000", "1000", &n_text, &timeout_text],
        ]);
        waits.push(Wait {
            client,
            key,
            drained_at,
            n,
            timeout,
        });
    }
    // Each waiter's replies, read as they come: (server µs at arrival, reply, client µs
    // when the reply was read).
    let done = AtomicBool::new(false);
    let answers: Vec<(i64, Vec<i64>, i64)> = thread::scope(|scope| {
        let stalls = scope.spawn(|| {
            let mut staller = server.conn();
            while !done.load(Relaxed) {
                let _: () = redis::cmd("DEBUG")
                    .arg("SLEEP")
                    .arg("0.02")
                    .query(&mut staller)
                    .expect("DEBUG SLEEP");
                thread::sleep(Duration::from_millis(15));
            }
        });
        let readers: Vec<_> = waits
            .iter_mut()
            .map(|wait| {
                let server = &server;
                scope.spawn(move || {
                    let Resp::Other(arrived) = reply_of(server, &mut wait.client, DUE, "TIME")
                    else {
                        panic!("the script's reply");
                    };
                    let reply = reply_of(server, &mut wait.client, DUE, &wait.key).ints();
                    (arrived.parse().expect("µs"), reply, wall_us())
                })
            })
            .collect();
        let answers = readers
            .into_iter()
            .map(|reader| reader.join().expect("a waiter's reader"))
            .collect();
        done.store(true, Relaxed);
        stalls.join().expect("the staller");
        answers
    });
    let (mut granted, mut denied) = (0, 0);
    let mut late = Vec::new();
    for (wait, (arrived_us, reply, answered_us)) in waits.iter().zip(answers) {
        let deadline_us = arrived_us + wait.timeout * 1000;
        if reply[0] == 1 {
            granted += 1;
            let at_ms = stored_last_refill(&mut con, &wait.key);
            assert!(
                at_ms >= wait.drained_at + wait.n,
                "{} granted before its tokens existed",
                wait.key
            );
            if at_ms > deadline_us / 1000 + SLACK_MS {
                late.push(format!(
                    "{} (n {}, timeout {} ms) granted {} ms after its deadline",
                    wait.key,
                    wait.n,
                    wait.timeout,
                    at_ms - deadline_us / 1000
                ));
            }
        } else {
            denied += 1;
            assert!(
                answered_us >= deadline_us - 1_000,
                "{} (n {}, timeout {} ms) denied {} µs before its deadline: {reply:?}",
                wait.key,
                wait.n,
                wait.timeout,
                deadline_us - answered_us
            );
            assert_eq!(
                stored_last_refill(&mut con, &wait.key),
                wait.drained_at,
                "{}: a denial takes nothing",
                wait.key
            );
        }
    }
    assert!(
        late.is_empty(),
        "{} of {granted} grants came after the deadline:\n{}",
        late.len(),
        late.join("\n")
    );
    assert!(
        granted > 0 && denied > 0,
        "both sides of the deadline: {granted} granted, {denied} denied"
    );
    assert_eq!(tb_count(&mut con, "tb_waiting"), 0);
}

// --- 5. One supply serves every head ---------------------------------------------------------

/// One refund that covers the whole queue serves every waiter in it, in arrival order,
/// without waiting for any other event.
#[test]
fn one_refund_serves_three_hundred_waiters_in_arrival_order() {
    const WAITERS: usize = 300;
    let server = Server::start();
    let mut con = server.conn();
    // Capacity 1000: the bucket is never full (nor its key expired) while the queue drains.
    drain(&mut con, "k", "1000", SLOW);
    let mut waiters = Vec::new();
    for index in 0..WAITERS {
        waiters.push(btake(&server, &["k", "1000", SLOW, "1", "0"]));
        wait_for_waiting(&mut con, index as i64 + 1);
    }
    let started = Instant::now();
    refund(&mut con, "k", "1000", SLOW, &WAITERS.to_string());
    for (index, waiter) in waiters.iter_mut().enumerate() {
        let reply = reply_of(&server, waiter, DUE, &format!("waiter {index}")).ints();
        assert_eq!(
            reply[..3],
            [1, (WAITERS - 1 - index) as i64, 0],
            "waiter {index} served in its turn"
        );
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(tb_count(&mut con, "tb_waiting"), 0);
    assert!(stored_tokens(&mut con, "k") < 0.01);
}

// --- 6. RENAME and MOVE ------------------------------------------------------------------------

/// A drained `k` of capacity 3 (`SLOW`) and a waiter for 2 of its tokens, queued: the
/// bucket as drained, and the waiter.
fn a_waiter_for_2_of_a_drained_3(
    server: &Server,
    con: &mut redis::Connection,
) -> (KeySnapshot, RawClient) {
    drain(con, "k", "3", SLOW);
    let drained = snapshot(con, b"k");
    let waiter = btake(server, &["k", "3", SLOW, "2", "0"]);
    wait_for_waiting(con, 1);
    (drained, waiter)
}

/// RENAME takes the bucket away from its key: the waiter there now sees a missing key, a
/// full bucket, and is served; the renamed bucket is left as it was.
#[test]
fn renaming_the_bucket_away_serves_its_waiter_from_a_full_one() {
    let server = Server::start();
    let mut con = server.conn();
    let (drained, mut waiter) = a_waiter_for_2_of_a_drained_3(&server, &mut con);
    ok(&mut con, &["RENAME", "k", "k2"]);
    let reply = reply_of(&server, &mut waiter, DUE, "after RENAME").ints();
    assert_eq!(reply[..3], [1, 1, 0], "a missing bucket is full");
    assert_eq!(
        snapshot(&mut con, b"k2"),
        drained,
        "the renamed bucket, untouched"
    );
}

/// RENAME onto the waiter's key replaces its bucket: the waiter is judged again with the
/// moved-in one, and served from it.
#[test]
fn renaming_a_bucket_onto_the_waiters_key_serves_it_from_the_moved_in_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k2", "5", SLOW);
    assert_eq!(take(&mut con, "k", "5", SLOW, "1")[..2], [1, 4]);
    let mut waiter = btake(&server, &["k2", "5", SLOW, "3", "0"]);
    wait_for_waiting(&mut con, 1);
    ok(&mut con, &["RENAME", "k", "k2"]);
    let reply = reply_of(&server, &mut waiter, DUE, "after RENAME").ints();
    assert_eq!(reply[..3], [1, 1, 0], "3 of the moved-in 4");
    assert!(!exists(&mut con, "k"));
}

/// RENAME onto the waiter's key with a bucket that cannot serve it either keeps it
/// waiting, on the moved-in bucket: a refund to that one serves it.
#[test]
fn renaming_a_drained_bucket_onto_the_waiters_key_keeps_it_waiting_on_the_new_one() {
    let server = Server::start();
    let mut con = server.conn();
    drain(&mut con, "k2", "5", SLOW);
    drain(&mut con, "k", "5", SLOW);
    refund(&mut con, "k", "5", SLOW, "1");
    let mut waiter = btake(&server, &["k2", "5", SLOW, "3", "0"]);
    wait_for_waiting(&mut con, 1);
    ok(&mut con, &["RENAME", "k", "k2"]);
    stays_quiet(&server, &mut waiter, QUICK, "1 token is not 3");
    refund(&mut con, "k2", "5", SLOW, "2");
    let reply = reply_of(&server, &mut waiter, DUE, "after the refund").ints();
    assert_eq!(reply[..3], [1, 0, 0], "the moved-in 1 and the refunded 2");
}

/// MOVE to another database takes the bucket from the waiter's: it is served from a full
/// one, and the moved bucket is left as it was.
#[test]
fn moving_the_bucket_to_another_db_serves_its_waiter_from_a_full_one() {
    let server = Server::start();
    let mut con = server.conn();
    let (drained, mut waiter) = a_waiter_for_2_of_a_drained_3(&server, &mut con);
    let moved: i64 = redis::cmd("MOVE")
        .arg("k")
        .arg(1)
        .query(&mut con)
        .expect("MOVE");
    assert_eq!(moved, 1);
    let reply = reply_of(&server, &mut waiter, DUE, "after MOVE").ints();
    assert_eq!(reply[..3], [1, 1, 0], "a missing bucket is full");
    ok(&mut con, &["SELECT", "1"]);
    assert_eq!(
        snapshot(&mut con, b"k"),
        drained,
        "the moved bucket, untouched"
    );
}
