//! Writes the server refuses: a failed `RM_HashSet` or a failed expiry replies an error,
//! propagates nothing and leaves every key as it was, so a replica never holds what the master
//! does not.
//!
//! The server refuses a bucket write only in states the module rules out beforehand, so these
//! tests load the `fault-injection` build (`src/testing/fault.rs`, built by `make test` into
//! `target/fault`), whose load argument `fault hash-set|expire EVERY` fails every EVERY-th
//! attempt at that step as the server would, counting each attempt once.
//!
//! A rollback test would pass without reaching the rollback if its fault hit the wrong write
//! (the first bucket's fails, so nothing is left to take back). So each TB.TAKEALL rollback
//! scenario is a function that returns what the refused call left different: its test asserts
//! that nothing is, and its `without_the_rollback_` twin, loaded with `fault-skip-rollback yes`
//! (the rollback is skipped), asserts that the first bucket then differs on the master.

use crate::harness::*;

const REFUSED: &str = "ERR tb: the server refused to store the bucket; nothing was changed";
/// One token per 1000 s: nothing refills noticeably during a test.
const SLOW: &str = "0.001";

/// A master with the fault build loaded with `load_args`, and a replica of it. The master is
/// quiet (`QUIET_MASTER_ARGS`): its periodic PING to the replica would move the replication
/// offset, which the tests read as "something was propagated".
fn master_and_replica_loading(load_args: &[&str]) -> (Server, Server) {
    let master = Server::start_with_module(fault_module_path(), load_args, QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    (master, replica)
}

/// A master with the fault build (`fault STEP EVERY`) and a replica of it.
fn master_and_replica(step: &str, every: &str) -> (Server, Server) {
    master_and_replica_loading(&["fault", step, every])
}

/// A bucket written by hand (plain HSET + PEXPIREAT, as a replica would receive it), so it
/// exists whatever the fault plan does to the module's own writes.
fn bucket_by_hand(con: &mut redis::Connection, key: &str, tokens: &str) {
    let now = server_time_ms(con);
    hset(
        con,
        key,
        &[("tokens", tokens), ("last_refill", &now.to_string())],
    );
    let _: () = redis::cmd("PEXPIREAT")
        .arg(key)
        .arg(now + 3_600_000)
        .query(con)
        .expect("PEXPIREAT");
}

/// TB.TAKEALL of `{u}:a` then `{u}:b` (both 10 tokens, SLOW), one token each.
const TAKEALL_A_AND_B: &[&str] = &[
    "TB.TAKEALL",
    "{u}:a",
    "10",
    SLOW,
    "1",
    "{u}:b",
    "10",
    SLOW,
    "1",
];

fn refused(con: &mut redis::Connection, args: &[&str]) {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    assert_eq!(expect_error(con, &args), REFUSED, "{}", show_args(&args));
}

/// Keys as the master holds them before a refused call, and its replication offset.
struct Before {
    keys: Vec<(&'static str, KeySnapshot)>,
    offset: i64,
}

/// `Before`, taken once the replica has caught up (so it holds the same keys).
fn record(master: &Server, replica: &Server, keys: &[&'static str]) -> Before {
    wait_for_replica(master, replica);
    let mut con = master.conn();
    Before {
        keys: keys
            .iter()
            .map(|&key| (key, snapshot(&mut con, key.as_bytes())))
            .collect(),
        offset: repl_offset(&mut con),
    }
}

/// One thing a refused call left different from `Before`.
struct Divergence {
    /// "{u}:a on the master", "{u}:a on the replica" or "the replication offset".
    what: String,
    was: String,
    is: String,
}

/// Everything a refused call changed: the replication offset (something was propagated), or
/// a key on the master or on the replica once it has caught up. Empty if nothing.
fn divergence(master: &Server, replica: &Server, before: &Before) -> Vec<Divergence> {
    let mut found = Vec::new();
    let mut mcon = master.conn();
    let offset = repl_offset(&mut mcon);
    if offset != before.offset {
        found.push(Divergence {
            what: "the replication offset".into(),
            was: before.offset.to_string(),
            is: offset.to_string(),
        });
    }
    wait_for_replica(master, replica);
    let mut rcon = replica.conn();
    for (key, was) in &before.keys {
        for (server, con) in [("master", &mut mcon), ("replica", &mut rcon)] {
            let is = snapshot(con, key.as_bytes());
            if &is != was {
                found.push(Divergence {
                    what: format!("{key} on the {server}"),
                    was: format!("{was:?}"),
                    is: format!("{is:?}"),
                });
            }
        }
    }
    found
}

/// What diverged, e.g. `["{u}:a on the master"]`.
fn what(divergence: &[Divergence]) -> Vec<&str> {
    divergence.iter().map(|d| d.what.as_str()).collect()
}

/// The divergence in full, for a failing assertion.
fn describe(divergence: &[Divergence]) -> String {
    divergence
        .iter()
        .map(|d| format!("{} was {} and is {}\n", d.what, d.was, d.is))
        .collect()
}

/// The master and its replica hold the keys as they were, and nothing was propagated.
fn assert_untouched(master: &Server, replica: &Server, before: &Before) {
    let divergence = divergence(master, replica, before);
    assert!(divergence.is_empty(), "{}", describe(&divergence));
}

#[test]
fn a_refused_hash_write_replies_an_error_and_changes_nothing() {
    let (master, replica) = master_and_replica("hash-set", "1");
    let mut con = master.conn();
    bucket_by_hand(&mut con, "rl:a", "5");
    let before = record(&master, &replica, &["rl:a"]);
    refused(&mut con, &["TB.TAKE", "rl:a", "10", SLOW, "1"]);
    refused(&mut con, &["TB.REFUND", "rl:a", "10", SLOW, "1"]);
    assert_untouched(&master, &replica, &before);
}

#[test]
fn a_refused_expiry_puts_the_stored_fields_back() {
    let (master, replica) = master_and_replica("expire", "1");
    let mut con = master.conn();
    bucket_by_hand(&mut con, "rl:a", "5");
    let before = record(&master, &replica, &["rl:a"]);
    refused(&mut con, &["TB.TAKE", "rl:a", "10", SLOW, "1"]);
    assert_untouched(&master, &replica, &before);
    assert_eq!(stored_tokens(&mut con, "rl:a"), 5.0);
}

#[test]
fn a_refused_expiry_on_a_new_bucket_leaves_no_key() {
    let (master, replica) = master_and_replica("expire", "1");
    let mut con = master.conn();
    let before = record(&master, &replica, &["rl:new"]);
    refused(&mut con, &["TB.TAKE", "rl:new", "10", SLOW, "1"]);
    assert!(!exists(&mut con, "rl:new"));
    assert_untouched(&master, &replica, &before);
}

/// `{u}:a` before the TB.TAKEALL of the rollback scenarios.
#[derive(Clone, Copy)]
enum First {
    /// A bucket with 5 tokens: the rollback puts its fields and expiry back.
    Stored,
    /// No key: the rollback deletes the bucket the call created.
    Missing,
}

/// Whether `store` takes back what a refused TB.TAKEALL had applied.
#[derive(Clone, Copy)]
enum Rollback {
    /// `fault-skip-rollback no`: as the module runs in production.
    Done,
    /// `fault-skip-rollback yes`: shows that the rollback test fails without the rollback.
    Skipped,
}

/// TB.TAKEALL of `{u}:a` then `{u}:b` (a bucket with 7 tokens) under `fault expire 2`:
/// `{u}:a`'s expiry is the 1st attempt and succeeds, so `{u}:a` is written; `{u}:b`'s is the
/// 2nd and fails, and `{u}:b`'s write undoes itself. Only `store`'s rollback can then put
/// `{u}:a` back. Returns what the refused call left different.
fn takeall_whose_second_write_fails(first: First, rollback: Rollback) -> Vec<Divergence> {
    let skip = match rollback {
        Rollback::Done => "no",
        Rollback::Skipped => "yes",
    };
    let (master, replica) =
        master_and_replica_loading(&["fault", "expire", "2", "fault-skip-rollback", skip]);
    let mut con = master.conn();
    if let First::Stored = first {
        bucket_by_hand(&mut con, "{u}:a", "5");
    }
    bucket_by_hand(&mut con, "{u}:b", "7");
    let before = record(&master, &replica, &["{u}:a", "{u}:b"]);
    refused(&mut con, TAKEALL_A_AND_B);
    divergence(&master, &replica, &before)
}

#[test]
fn a_takeall_whose_second_write_fails_takes_back_the_first() {
    let divergence = takeall_whose_second_write_fails(First::Stored, Rollback::Done);
    assert!(divergence.is_empty(), "{}", describe(&divergence));
}

#[test]
fn a_takeall_whose_second_write_fails_deletes_a_first_bucket_it_created() {
    let divergence = takeall_whose_second_write_fails(First::Missing, Rollback::Done);
    assert!(divergence.is_empty(), "{}", describe(&divergence));
}

// The two tests below prove that the two above reach the rollback. Without it, exactly the
// first bucket differs, and only on the master: `{u}:b` undid itself (so its expiry, not
// `{u}:a`'s, was refused) and nothing was propagated, so the replica still has the old one.

/// Without the rollback, a TB.TAKEALL whose second write fails leaves `{u}:a` written on the
/// master only (the write was never propagated), whether it was stored or missing before.
fn assert_only_the_first_bucket_diverges_without_rollback(first: First) {
    let divergence = takeall_whose_second_write_fails(first, Rollback::Skipped);
    assert_eq!(
        what(&divergence),
        ["{u}:a on the master"],
        "{}",
        describe(&divergence)
    );
}

#[test]
fn without_the_rollback_a_takeall_whose_second_write_fails_leaves_the_first_written() {
    assert_only_the_first_bucket_diverges_without_rollback(First::Stored);
}

#[test]
fn without_the_rollback_a_takeall_whose_second_write_fails_leaves_the_first_bucket_it_created() {
    assert_only_the_first_bucket_diverges_without_rollback(First::Missing);
}

#[test]
fn a_refused_write_counts_as_an_error_not_a_decision() {
    let (master, _replica) = master_and_replica("hash-set", "1");
    let mut con = master.conn();
    refused(&mut con, &["TB.TAKE", "rl:a", "10", SLOW, "1"]);
    assert_eq!(tb_field(&mut con, "tb_errors"), "1");
    assert_eq!(tb_field(&mut con, "tb_allowed"), "0");
    assert_eq!(tb_field(&mut con, "tb_buckets_created"), "0");
}

#[test]
fn without_a_fault_the_fault_build_writes_as_usual() {
    // Every 1000th hash write fails: the first ones go through, replicated as always.
    let (master, replica) = master_and_replica("hash-set", "1000");
    let mut con = master.conn();
    assert_eq!(take(&mut con, "rl:a", "10", SLOW, "1")[..2], [1, 9]);
    wait_for_replica(&master, &replica);
    let mut rcon = replica.conn();
    assert_eq!(stored_tokens(&mut rcon, "rl:a"), 9.0);
}
