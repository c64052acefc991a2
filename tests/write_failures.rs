//! Writes the server refuses: a failed `RM_HashSet` or a failed expiry replies an error,
//! propagates nothing and leaves every key as it was, so a replica never holds what the master
//! does not.
//!
//! The server refuses a bucket write only in states the module rules out beforehand, so these
//! tests load the `fault-injection` build (`src/fault.rs`, built by `make test` into
//! `target/fault`), whose load argument `fault hash-set|expire EVERY` fails every EVERY-th
//! attempt at that step as the server would.

mod common;

use common::*;

const REFUSED: &str = "ERR tb: the server refused to store the bucket; nothing was changed";
/// One token per 1000 s: nothing refills noticeably during a test.
const SLOW: &str = "0.001";

/// A master with the fault build (`fault STEP EVERY`) and a replica of it.
fn master_and_replica(step: &str, every: &str) -> (Server, Server) {
    let master = Server::start_with_module(fault_module_path(), &["fault", step, every], &[]);
    let replica = start_replica_of(&master);
    (master, replica)
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

/// The master and its replica hold the same, unchanged key, and nothing was propagated.
fn assert_untouched(
    master: &Server,
    replica: &Server,
    key: &str,
    before: &KeySnapshot,
    offset: i64,
) {
    let mut mcon = master.conn();
    assert_eq!(
        &snapshot(&mut mcon, key.as_bytes()),
        before,
        "{key} on the master"
    );
    assert_eq!(repl_offset(&mut mcon), offset, "something was propagated");
    wait_for_replica(master, replica);
    let mut rcon = replica.conn();
    assert_eq!(
        &snapshot(&mut rcon, key.as_bytes()),
        before,
        "{key} on the replica"
    );
}

#[test]
fn a_refused_hash_write_replies_an_error_and_changes_nothing() {
    let (master, replica) = master_and_replica("hash-set", "1");
    let mut con = master.conn();
    bucket_by_hand(&mut con, "rl:a", "5");
    wait_for_replica(&master, &replica);
    let before = snapshot(&mut con, b"rl:a");
    let offset = repl_offset(&mut con);
    refused(&mut con, &["TB.TAKE", "rl:a", "10", SLOW, "1"]);
    refused(&mut con, &["TB.REFUND", "rl:a", "10", SLOW, "1"]);
    assert_untouched(&master, &replica, "rl:a", &before, offset);
}

#[test]
fn a_refused_expiry_puts_the_stored_fields_back() {
    let (master, replica) = master_and_replica("expire", "1");
    let mut con = master.conn();
    bucket_by_hand(&mut con, "rl:a", "5");
    wait_for_replica(&master, &replica);
    let before = snapshot(&mut con, b"rl:a");
    let offset = repl_offset(&mut con);
    refused(&mut con, &["TB.TAKE", "rl:a", "10", SLOW, "1"]);
    assert_untouched(&master, &replica, "rl:a", &before, offset);
    assert_eq!(stored_tokens(&mut con, "rl:a"), 5.0);
}

#[test]
fn a_refused_expiry_on_a_new_bucket_leaves_no_key() {
    let (master, replica) = master_and_replica("expire", "1");
    let mut con = master.conn();
    let offset = repl_offset(&mut con);
    let missing = snapshot(&mut con, b"rl:new");
    refused(&mut con, &["TB.TAKE", "rl:new", "10", SLOW, "1"]);
    assert!(!exists(&mut con, "rl:new"));
    assert_untouched(&master, &replica, "rl:new", &missing, offset);
}

#[test]
fn a_takeall_whose_second_write_fails_takes_back_the_first() {
    // The first expiry succeeds, the second fails: the first bucket was already written.
    let (master, replica) = master_and_replica("expire", "2");
    let mut con = master.conn();
    bucket_by_hand(&mut con, "{u}:a", "5");
    bucket_by_hand(&mut con, "{u}:b", "7");
    wait_for_replica(&master, &replica);
    let before_a = snapshot(&mut con, b"{u}:a");
    let before_b = snapshot(&mut con, b"{u}:b");
    let offset = repl_offset(&mut con);
    refused(&mut con, TAKEALL_A_AND_B);
    assert_untouched(&master, &replica, "{u}:a", &before_a, offset);
    assert_untouched(&master, &replica, "{u}:b", &before_b, offset);
}

#[test]
fn a_takeall_whose_second_write_fails_deletes_a_first_bucket_it_created() {
    let (master, replica) = master_and_replica("expire", "2");
    let mut con = master.conn();
    bucket_by_hand(&mut con, "{u}:b", "7");
    wait_for_replica(&master, &replica);
    let missing = snapshot(&mut con, b"{u}:a");
    let before_b = snapshot(&mut con, b"{u}:b");
    let offset = repl_offset(&mut con);
    refused(&mut con, TAKEALL_A_AND_B);
    assert_untouched(&master, &replica, "{u}:a", &missing, offset);
    assert_untouched(&master, &replica, "{u}:b", &before_b, offset);
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
    // Every 1000th write fails: the first ones go through, replicated as always.
    let (master, replica) = master_and_replica("hash-set", "1000");
    let mut con = master.conn();
    assert_eq!(take(&mut con, "rl:a", "10", SLOW, "1")[..2], [1, 9]);
    wait_for_replica(&master, &replica);
    let mut rcon = replica.conn();
    assert_eq!(stored_tokens(&mut rcon, "rl:a"), 9.0);
}
