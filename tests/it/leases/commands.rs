//! TB.ACQUIRE, TB.RELEASE and TB.RENEW against a real server: the replies,
//! the errors, the stored sorted set, leases ending by themselves, ids that
//! are never handed out twice, and what replicas, the AOF, restarts and
//! failovers see (docs/leases.md).

use crate::harness;
use crate::harness::{
    aof_commands, expect_error, id_parts, incarnation, members, pexpiretime, repl_offset,
    server_time_ms, sleep_ms, start_replica_of, wait_for_replica, wait_until, FakeClock, Server,
    QUIET_MASTER_ARGS, SYNC_TIMEOUT, TEN_AM, TEN_AM_AND_30_S, TEN_AM_MS,
};
use redis::Value;

/// `[acquired, available, retry_after_ms, lease]` as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Acquired {
    acquired: i64,
    available: i64,
    retry_after_ms: i64,
    lease: Option<String>,
}

fn acquire(con: &mut redis::Connection, key: &str, limit: i64, lease_ms: i64) -> Acquired {
    let reply: Value = redis::cmd("TB.ACQUIRE")
        .arg(key)
        .arg(limit)
        .arg(lease_ms)
        .query(con)
        .expect("TB.ACQUIRE");
    parse_acquired(reply)
}

fn parse_acquired(reply: Value) -> Acquired {
    let Value::Array(items) = reply else {
        panic!("TB.ACQUIRE replied {reply:?}");
    };
    let int = |value: &Value| match value {
        Value::Int(n) => *n,
        other => panic!("expected an integer, got {other:?}"),
    };
    let lease = match &items[3] {
        Value::Nil => None,
        Value::BulkString(bytes) => Some(String::from_utf8(bytes.clone()).expect("UTF-8 id")),
        other => panic!("expected a bulk string or nil, got {other:?}"),
    };
    Acquired {
        acquired: int(&items[0]),
        available: int(&items[1]),
        retry_after_ms: int(&items[2]),
        lease,
    }
}

fn release(con: &mut redis::Connection, key: &str, lease: &str) -> i64 {
    redis::cmd("TB.RELEASE")
        .arg(key)
        .arg(lease)
        .query(con)
        .expect("TB.RELEASE")
}

fn renew(con: &mut redis::Connection, key: &str, lease: &str, lease_ms: i64) -> i64 {
    redis::cmd("TB.RENEW")
        .arg(key)
        .arg(lease)
        .arg(lease_ms)
        .query(con)
        .expect("TB.RENEW")
}

fn id_of(reply: &Acquired) -> String {
    reply.lease.clone().expect("a lease id")
}

/// The `<n>` part of an id.
fn count_of(id: &str) -> i64 {
    id_parts(id).1
}

/// The leases of a lease set, `(id, deadline)`, earliest first: its members but `seq` and
/// `inc`.
fn leases(con: &mut redis::Connection, key: &str) -> Vec<(String, i64)> {
    members(con, key)
        .into_iter()
        .filter(|(member, _)| member != "seq" && member != "inc")
        .collect()
}

/// The score of `member`, if present.
fn score_of(con: &mut redis::Connection, key: &str, member: &str) -> Option<i64> {
    members(con, key)
        .into_iter()
        .find(|(m, _)| m == member)
        .map(|(_, score)| score)
}

#[test]
fn acquire_grants_up_to_limit_then_denies_with_the_wait_for_the_earliest_lease() {
    let server = Server::start();
    let mut con = server.conn();
    let first = acquire(&mut con, "jobs", 2, 30_000);
    assert_eq!(
        (first.acquired, first.available, first.retry_after_ms),
        (1, 1, 0)
    );
    let second = acquire(&mut con, "jobs", 2, 60_000);
    assert_eq!((second.acquired, second.available), (1, 0));
    let third = acquire(&mut con, "jobs", 2, 30_000);
    assert_eq!(
        (third.acquired, third.available, third.lease.as_deref()),
        (0, 0, None)
    );
    assert!(
        (29_000..=30_000).contains(&third.retry_after_ms),
        "the first lease ends in ~30 s: {third:?}"
    );
    assert_eq!(count_of(&id_of(&first)), 1);
    assert_eq!(count_of(&id_of(&second)), 2);
}

#[test]
fn the_lease_set_is_a_plain_sorted_set_of_ids_by_deadline_with_a_seq_member() {
    let server = Server::start();
    let mut con = server.conn();
    let before = server_time_ms(&mut con);
    let lease = id_of(&acquire(&mut con, "jobs", 3, 40_000));
    let after = server_time_ms(&mut con);
    let stored = members(&mut con, "jobs");
    assert_eq!(stored.len(), 3, "{stored:?}");
    let (granted_ms, n, made_with) = id_parts(&lease);
    assert_eq!(n, 1);
    let made_with = made_with.expect("a new set's ids carry its incarnation");
    // Both bookkeeping members scored below every deadline: `inc` by minus the incarnation
    // (at most -1), `seq` by minus the count.
    let mut bookkeeping = stored[..2].to_vec();
    bookkeeping.sort();
    assert_eq!(
        bookkeeping,
        vec![("inc".to_string(), -made_with), ("seq".to_string(), -1)]
    );
    assert_eq!(stored[2].0, lease);
    assert!((before..=after).contains(&granted_ms));
    assert_eq!(
        stored[2].1,
        granted_ms + 40_000,
        "the score is the deadline"
    );
    assert_eq!(pexpiretime(&mut con, "jobs"), granted_ms + 40_000);
}

#[test]
fn release_frees_the_slot_once_and_a_second_release_is_a_harmless_zero() {
    let server = Server::start();
    let mut con = server.conn();
    let lease = id_of(&acquire(&mut con, "jobs", 1, 30_000));
    assert_eq!(acquire(&mut con, "jobs", 1, 30_000).acquired, 0);
    assert_eq!(release(&mut con, "jobs", &lease), 1);
    assert_eq!(release(&mut con, "jobs", &lease), 0);
    assert_eq!(release(&mut con, "jobs", "123-456"), 0);
    assert_eq!(release(&mut con, "missing", &lease), 0);
    let next = acquire(&mut con, "jobs", 1, 30_000);
    assert_eq!(next.acquired, 1);
    assert_eq!(
        count_of(&id_of(&next)),
        2,
        "the count goes on after a release"
    );
}

/// TB.RELEASE looks a lease up only when its read of the ended leases was
/// not complete; every shape of set must give the same answers.
#[test]
fn only_a_live_lease_is_released_whatever_else_the_set_holds() {
    let server = Server::start();
    let mut con = server.conn();
    let far = 4_000_000_000_000i64; // a deadline in the year 2096
    let shapes: [(&str, Vec<(i64, String)>); 5] = [
        ("plain", vec![]),
        ("with an incarnation", vec![(-77, "inc".into())]),
        (
            "with other members scored <= 0",
            vec![(-5, "a".into()), (0, "b".into())],
        ),
        (
            "with an incarnation and a member shaped like an id scored <= 0",
            vec![(-77, "inc".into()), (-3, "600-82".into())],
        ),
        (
            "with more than 64 ended leases",
            (1..=70).map(|n| (1_000 + n, format!("1000-{n}"))).collect(),
        ),
    ];
    for (shape, extra) in shapes {
        let key = format!("jobs:{shape}");
        let mut zadd = redis::cmd("ZADD");
        zadd.arg(&key).arg(-90).arg("seq");
        zadd.arg(500).arg("500-80").arg(far).arg("600-81");
        for (score, member) in &extra {
            zadd.arg(*score).arg(member);
        }
        let _: () = zadd.query(&mut con).unwrap();
        let before = members(&mut con, &key);
        // Ended (the earliest of all, and past the first 64 when there are
        // more), unknown, and not shaped like an id: 0, and nothing written.
        for lease in [
            "500-80",
            "1000-70",
            "7-7",
            "b",
            "inc",
            "600-82",
            "600-81-77",
        ] {
            assert_eq!(release(&mut con, &key, lease), 0, "{shape}: {lease}");
        }
        assert_eq!(members(&mut con, &key), before, "{shape}");
        assert_eq!(
            release(&mut con, &key, "600-81"),
            1,
            "{shape}: the live one"
        );
        assert!(
            !members(&mut con, &key).iter().any(|(id, _)| id == "600-81"),
            "{shape}"
        );
    }
}

/// Only TB.ACQUIRE counts the live leases (past 64 ended ones, with ZCOUNT):
/// a release or a renewal works on a set of any shape, even where ZCOUNT is
/// renamed away.
#[test]
fn release_and_renew_need_no_count_of_the_live_leases() {
    let server = Server::start_with(&["--rename-command", "ZCOUNT", ""]);
    let mut con = server.conn();
    let far = 4_000_000_000_000i64;
    let mut zadd = redis::cmd("ZADD");
    zadd.arg("jobs").arg(-90).arg("seq");
    for n in 1..=70 {
        zadd.arg(1_000 + n).arg(format!("1000-{n}"));
    }
    zadd.arg(far).arg("600-80").arg(far).arg("600-81");
    let _: () = zadd.query(&mut con).unwrap();
    let before = members(&mut con, "jobs");
    let error = expect_error(&mut con, &[b"TB.ACQUIRE", b"jobs", b"5", b"1000"]);
    assert!(error.contains("internal error"), "{error}");
    assert!(
        server.log().contains("ZCOUNT through RM_Call failed"),
        "the reason is logged"
    );
    assert_eq!(members(&mut con, "jobs"), before, "and nothing written");
    assert_eq!(renew(&mut con, "jobs", "600-80", 100_000), 1);
    assert_eq!(release(&mut con, "jobs", "600-81"), 1);
}

#[test]
fn no_argument_can_release_or_renew_the_seq_or_inc_member() {
    let server = Server::start();
    let mut con = server.conn();
    acquire(&mut con, "jobs", 1, 30_000);
    let stored = members(&mut con, "jobs");
    for bogus in ["seq", "inc", "", "-1", "x-1", "1-2-3", "1-2-3-4"] {
        assert_eq!(release(&mut con, "jobs", bogus), 0, "{bogus:?}");
        assert_eq!(renew(&mut con, "jobs", bogus, 10), 0, "{bogus:?}");
    }
    assert_eq!(members(&mut con, "jobs"), stored);
}

#[test]
fn a_crashed_holders_slot_comes_back_at_its_deadline() {
    let server = Server::start();
    let mut con = server.conn();
    // The holder takes the only slot for 300 ms and never comes back.
    let crashed = id_of(&acquire(&mut con, "jobs", 1, 300));
    let denied = acquire(&mut con, "jobs", 1, 300);
    assert_eq!(denied.acquired, 0);
    sleep_ms(denied.retry_after_ms + 5);
    let next = acquire(&mut con, "jobs", 1, 30_000);
    assert_eq!(next.acquired, 1, "the slot returned by itself: {next:?}");
    // Its ended lease was removed by that grant, and cannot be released.
    assert!(!members(&mut con, "jobs")
        .iter()
        .any(|(id, _)| *id == crashed));
    assert_eq!(release(&mut con, "jobs", &crashed), 0);
}

#[test]
fn renewal_keeps_a_lease_past_its_first_deadline_and_an_ended_one_cannot_come_back() {
    let server = Server::start();
    let mut con = server.conn();
    // Leases of 2 s renewed every 0.5 s: a slow server (valgrind) has 1.5 s for each
    // renewal to arrive before the lease would end.
    let lease = id_of(&acquire(&mut con, "jobs", 1, 2000));
    for _ in 0..5 {
        sleep_ms(500);
        assert_eq!(renew(&mut con, "jobs", &lease, 2000), 1);
    }
    // 2.5 s after the grant, past its first deadline, the lease still holds the slot.
    assert_eq!(acquire(&mut con, "jobs", 1, 2000).acquired, 0);
    let now = server_time_ms(&mut con);
    let deadline = leases(&mut con, "jobs")[0].1;
    assert!(deadline > now && deadline <= now + 2000);
    // A renewal may shorten the lease; the key's expiry never shrinks.
    let expiry = pexpiretime(&mut con, "jobs");
    assert_eq!(renew(&mut con, "jobs", &lease, 50), 1);
    assert_eq!(pexpiretime(&mut con, "jobs"), expiry);
    sleep_ms(80);
    assert_eq!(
        renew(&mut con, "jobs", &lease, 10_000),
        0,
        "ended: no renewal"
    );
    assert_eq!(release(&mut con, "jobs", &lease), 0);
}

#[test]
fn a_lower_limit_denies_until_enough_leases_end_and_revokes_none() {
    let server = Server::start();
    let mut con = server.conn();
    let ids: Vec<String> = (0..3)
        .map(|_| id_of(&acquire(&mut con, "jobs", 3, 30_000)))
        .collect();
    let denied = acquire(&mut con, "jobs", 1, 30_000);
    assert_eq!((denied.acquired, denied.available), (0, 0));
    assert_eq!(leases(&mut con, "jobs").len(), 3, "nothing revoked");
    for id in &ids[..2] {
        assert_eq!(release(&mut con, "jobs", id), 1);
    }
    assert_eq!(acquire(&mut con, "jobs", 1, 30_000).acquired, 0);
    assert_eq!(release(&mut con, "jobs", &ids[2]), 1);
    assert_eq!(acquire(&mut con, "jobs", 1, 30_000).acquired, 1);
}

#[test]
fn ids_are_never_handed_out_twice_even_after_the_key_expires_and_is_made_anew() {
    let server = Server::start();
    let mut con = server.conn();
    let mut seen = std::collections::HashSet::new();
    for round in 0..3 {
        for _ in 0..3 {
            let lease = id_of(&acquire(&mut con, "jobs", 5, 40));
            assert!(seen.insert(lease.clone()), "round {round}: {lease} twice");
        }
        wait_until("the lease set to expire", SYNC_TIMEOUT, || {
            !harness::exists(&mut con, "jobs")
        });
    }
    // And in one MULTI, where every call sees the same instant.
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("TB.ACQUIRE")
        .arg("jobs")
        .arg(5)
        .arg(1000)
        .cmd("TB.ACQUIRE")
        .arg("jobs")
        .arg(5)
        .arg(1000)
        .query(&mut con)
        .expect("MULTI");
    for reply in replies {
        let lease = id_of(&parse_acquired(reply));
        assert!(seen.insert(lease.clone()), "{lease} twice");
    }
}

#[test]
fn the_count_survives_a_restart() {
    let mut server = Server::start_with(&["--appendonly", "yes"]);
    let mut con = server.conn();
    let first = id_of(&acquire(&mut con, "jobs", 5, 600_000));
    release(&mut con, "jobs", &first);
    server.restart();
    let mut con = server.conn();
    let next = id_of(&acquire(&mut con, "jobs", 5, 600_000));
    assert_eq!(count_of(&next), 2);
    assert_eq!(
        id_parts(&next).2,
        id_parts(&first).2,
        "and so does the incarnation"
    );
}

/// Issue 25: at 10:00:00 a lease set hands out `<10:00:00 in ms>-1-...`, the set expires at
/// 10:00:30, the clock steps back to 10:00:00 (an NTP step, a restored VM snapshot, a promoted
/// replica whose clock is behind), and the set made anew hands out the same instant and count
/// again: with ids of `<ms>-<n>` alone, the old holder's TB.RELEASE released the new holder's
/// lease. The new set's incarnation is another, so its id is too. The server's own clock is
/// moved (libfaketime), the module's time and the key's expiry with it.
#[test]
fn an_id_is_never_handed_out_again_after_the_clock_steps_back() {
    let Some(clock) = FakeClock::new() else {
        return;
    };
    let server = clock.start(TEN_AM, &[]);
    let mut con = server.conn();
    assert_eq!(server_time_ms(&mut con), TEN_AM_MS, "the fake clock");
    let old = id_of(&acquire(&mut con, "lc:1", 1, 1000));
    clock.set(TEN_AM_AND_30_S);
    assert!(!harness::exists(&mut con, "lc:1"), "the set expired");
    clock.set(TEN_AM);
    assert_eq!(
        server_time_ms(&mut con),
        TEN_AM_MS,
        "the clock stepped back"
    );
    let new = id_of(&acquire(&mut con, "lc:1", 1, 1000));
    let (old_ms, old_n, old_incarnation) = id_parts(&old);
    let (new_ms, new_n, new_incarnation) = id_parts(&new);
    assert_eq!((old_ms, old_n), (TEN_AM_MS, 1), "{old}");
    assert_eq!(
        (new_ms, new_n),
        (TEN_AM_MS, 1),
        "the same instant and count: {new}"
    );
    assert!(
        old_incarnation.is_some() && old_incarnation != new_incarnation,
        "{old} handed out again as {new}"
    );
    assert_eq!(
        release(&mut con, "lc:1", &old),
        0,
        "the old holder releases nothing"
    );
    assert_eq!(renew(&mut con, "lc:1", &old, 1000), 0, "nor renews");
    assert_eq!(
        release(&mut con, "lc:1", &new),
        1,
        "the new holder's lease is its own"
    );
}

/// A DEL by hand starts the count again, also within one ms (one MULTI, where every call
/// sees the same instant on Redis 7.2+ and Valkey), and the ids of the set made anew are
/// still not the old ones.
#[test]
fn a_set_made_anew_by_hand_hands_out_other_ids_than_the_one_deleted() {
    let server = Server::start();
    let mut con = server.conn();
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("TB.ACQUIRE")
        .arg("jobs")
        .arg(1)
        .arg(60_000)
        .cmd("DEL")
        .arg("jobs")
        .ignore()
        .cmd("TB.ACQUIRE")
        .arg("jobs")
        .arg(1)
        .arg(60_000)
        .query(&mut con)
        .expect("MULTI");
    let old = id_of(&parse_acquired(replies[0].clone()));
    let new = id_of(&parse_acquired(replies[1].clone()));
    assert_eq!((count_of(&old), count_of(&new)), (1, 1));
    assert_ne!(old, new);
    assert_ne!(id_parts(&old).2, id_parts(&new).2, "another incarnation");
    assert_eq!(release(&mut con, "jobs", &old), 0);
    assert_eq!(release(&mut con, "jobs", &new), 1);
}

/// A lease set made before incarnations (no `inc` member) keeps working as it did: its ids,
/// `<ms>-<n>`, release and renew, and it hands out more of that shape, its count going on,
/// until it is gone; the set made after it has an incarnation.
#[test]
fn a_set_made_before_incarnations_keeps_its_ids_and_their_shape() {
    let server = Server::start();
    let mut con = server.conn();
    let far = 4_000_000_000_000i64;
    let _: () = redis::cmd("ZADD")
        .arg("old")
        .arg(-2)
        .arg("seq")
        .arg(far)
        .arg("1764633600123-1")
        .arg(far)
        .arg("1764633600140-2")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("PEXPIREAT")
        .arg("old")
        .arg(far)
        .query(&mut con)
        .unwrap();
    assert_eq!(renew(&mut con, "old", "1764633600140-2", 60_000), 1);
    assert_eq!(release(&mut con, "old", "1764633600123-1"), 1);
    let third = id_of(&acquire(&mut con, "old", 5, 60_000));
    let (_, n, of) = id_parts(&third);
    assert_eq!((n, of), (3, None), "{third}");
    assert_eq!(incarnation(&mut con, "old"), None, "nothing added");
    assert_eq!(release(&mut con, "old", &third), 1);
    let _: () = redis::cmd("DEL").arg("old").query(&mut con).unwrap();
    let anew = id_of(&acquire(&mut con, "old", 5, 60_000));
    assert_eq!(id_parts(&anew).2, incarnation(&mut con, "old"));
    assert!(id_parts(&anew).2.is_some(), "{anew}");
}

#[test]
fn bad_arguments_get_their_own_error_and_touch_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    acquire(&mut con, "jobs", 2, 30_000);
    let stored = members(&mut con, "jobs");
    let limit = "ERR limit must be a positive integer, at most 9007199254740992 (2^53)";
    let lease_ms =
        "ERR lease_ms must be a positive integer number of ms, at most 9007199254740992 (2^53)";
    let timeout = "ERR timeout_ms must be a non-negative finite number of ms, at most 2^53";
    let cases: &[(&[&[u8]], &str)] = &[
        (&[b"TB.ACQUIRE", b"jobs", b"0", b"10"], limit),
        (&[b"TB.ACQUIRE", b"jobs", b"1.5", b"10"], limit),
        (&[b"TB.ACQUIRE", b"jobs", b"9007199254740993", b"10"], limit),
        (&[b"TB.ACQUIRE", b"jobs", b"-1", b"x"], limit),
        (&[b"TB.ACQUIRE", b"jobs", b"1", b"0"], lease_ms),
        (&[b"TB.ACQUIRE", b"jobs", b"1", b"1e3"], lease_ms),
        (&[b"TB.ACQUIRE", b"jobs", b"1", b"10", b"-1"], timeout),
        (&[b"TB.RENEW", b"jobs", b"1-1", b"0"], lease_ms),
        (&[b"TB.RENEW", b"jobs", b"1-1", b" 5"], lease_ms),
        (
            &[b"TB.ACQUIRE", b"jobs", b"1"],
            "ERR wrong number of arguments for 'tb.acquire' command",
        ),
        (
            &[b"TB.ACQUIRE", b"jobs", b"1", b"1", b"1", b"1"],
            "ERR wrong number of arguments for 'tb.acquire' command",
        ),
        (
            &[b"TB.RELEASE", b"jobs"],
            "ERR wrong number of arguments for 'tb.release' command",
        ),
        (
            &[b"TB.RENEW", b"jobs", b"1-1"],
            "ERR wrong number of arguments for 'tb.renew' command",
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(expect_error(&mut con, args), *expected, "{args:?}");
    }
    assert_eq!(members(&mut con, "jobs"), stored);
}

#[test]
fn a_key_that_is_not_a_lease_set_is_refused_and_left_alone() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = redis::cmd("SET")
        .arg("text")
        .arg("x")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg("scores")
        .arg(1)
        .arg("a")
        .query(&mut con)
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg("halfseq")
        .arg(-1.5)
        .arg("seq")
        .query(&mut con)
        .unwrap();
    let wrong = "WRONGTYPE Operation against a key holding the wrong kind of value";
    for command in [
        &[&b"TB.ACQUIRE"[..], b"text", b"1", b"1"][..],
        &[b"TB.RELEASE", b"text", b"1-1"],
        &[b"TB.RENEW", b"text", b"1-1", b"1"],
    ] {
        assert_eq!(expect_error(&mut con, command), wrong);
    }
    for key in ["scores", "halfseq"] {
        let corrupt =
            format!("ERR corrupt lease set '{key}': no seq member scored from -2^53 to 0");
        for command in [
            &[&b"TB.ACQUIRE"[..], key.as_bytes(), b"1", b"1"][..],
            &[b"TB.RELEASE", key.as_bytes(), b"1-1"],
            &[b"TB.RENEW", key.as_bytes(), b"1-1", b"1"],
        ] {
            assert_eq!(expect_error(&mut con, command), corrupt);
        }
    }
    assert_eq!(members(&mut con, "scores"), vec![("a".to_string(), 1)]);
}

#[test]
fn a_writing_call_removes_at_most_64_ended_leases_and_still_counts_exactly() {
    let server = Server::start();
    let mut con = server.conn();
    // 100 leases of 5 s, so that none ends while a slow server (valgrind) grants the rest,
    // then one that lasts; then the wait until all 100 have ended, read from their stored
    // deadlines and the server's clock.
    for _ in 0..100 {
        assert_eq!(acquire(&mut con, "jobs", 1000, 5000).acquired, 1);
    }
    let short_deadlines: Vec<i64> = leases(&mut con, "jobs").iter().map(|(_, d)| *d).collect();
    let lasting = acquire(&mut con, "jobs", 1000, 60_000);
    let all_ended_at = short_deadlines.into_iter().max().unwrap_or(0);
    wait_until("the 100 leases' deadlines", Duration::from_secs(60), || {
        server_time_ms(&mut con) > all_ended_at
    });
    let grant = acquire(&mut con, "jobs", 3, 60_000);
    assert_eq!(
        (grant.acquired, grant.available),
        (1, 1),
        "two live leases: {grant:?}"
    );
    assert_eq!(leases(&mut con, "jobs").len(), 100 - 64 + 2);
    // Two calls later every ended lease is gone; the live ones stay.
    let next = id_of(&acquire(&mut con, "jobs", 3, 60_000));
    assert_eq!(release(&mut con, "jobs", &next), 1);
    let left: Vec<String> = leases(&mut con, "jobs")
        .into_iter()
        .map(|(id, _)| id)
        .collect();
    assert_eq!(left, vec![id_of(&lasting), id_of(&grant)]);
    assert_eq!(members(&mut con, "jobs").len(), 4, "and seq and inc");
    let info = harness::info_field(&mut con, "tb", "tb_leases_expired").unwrap();
    assert_eq!(info, "100");
}

#[test]
fn replies_and_counters_show_in_info_tb() {
    let server = Server::start();
    let mut con = server.conn();
    let lease = id_of(&acquire(&mut con, "jobs", 1, 30_000));
    acquire(&mut con, "jobs", 1, 30_000);
    renew(&mut con, "jobs", &lease, 30_000);
    release(&mut con, "jobs", &lease);
    release(&mut con, "jobs", &lease);
    for (field, value) in [
        ("tb_leases_acquired", "1"),
        ("tb_leases_denied", "1"),
        ("tb_leases_renewed", "1"),
        ("tb_leases_released", "1"),
    ] {
        assert_eq!(
            harness::info_field(&mut con, "tb", field).as_deref(),
            Some(value),
            "{field}"
        );
    }
}

/// A master and its replica, synced.
fn pair() -> (Server, Server) {
    let master = Server::start_with(QUIET_MASTER_ARGS);
    let replica = start_replica_of(&master);
    (master, replica)
}

#[test]
fn a_denial_and_a_release_of_nothing_replicate_zero_bytes() {
    let (master, replica) = pair();
    let mut con = master.conn();
    let lease = id_of(&acquire(&mut con, "jobs", 1, 30_000));
    release(&mut con, "jobs", &lease);
    acquire(&mut con, "jobs", 1, 30_000);
    wait_for_replica(&master, &replica);
    let before = repl_offset(&mut con);
    assert_eq!(acquire(&mut con, "jobs", 1, 30_000).acquired, 0);
    assert_eq!(release(&mut con, "jobs", &lease), 0);
    assert_eq!(renew(&mut con, "jobs", &lease, 10), 0);
    assert_eq!(release(&mut con, "nothing", "1-1"), 0);
    assert_eq!(repl_offset(&mut con), before);
}

#[test]
fn replicas_and_the_aof_end_with_exactly_the_masters_lease_sets() {
    let master = Server::start_with(&[
        "--appendonly",
        "yes",
        "--aof-use-rdb-preamble",
        "no",
        "--repl-ping-replica-period",
        "3600",
    ]);
    let replica = start_replica_of(&master);
    let mut con = master.conn();
    let mut held = Vec::new();
    for step in 0..60 {
        let key = format!("jobs:{}", step % 3);
        match step % 5 {
            0..=2 => {
                if let Some(id) = acquire(&mut con, &key, 4, 20 + step * 7).lease {
                    held.push((key, id));
                }
            }
            3 => {
                if let Some((key, id)) = held.pop() {
                    release(&mut con, &key, &id);
                }
            }
            _ => {
                if let Some((key, id)) = held.first() {
                    renew(&mut con, key, id, 5_000);
                }
            }
        }
        sleep_ms(3);
    }
    wait_for_replica(&master, &replica);
    let mut rcon = replica.conn();
    for key in ["jobs:0", "jobs:1", "jobs:2"] {
        assert_eq!(members(&mut rcon, key), members(&mut con, key), "{key}");
        assert_eq!(
            pexpiretime(&mut rcon, key),
            pexpiretime(&mut con, key),
            "{key}"
        );
    }
    // The AOF holds only plain commands: a server without the module loads it.
    let commands = aof_commands(&master.dir);
    assert!(commands
        .iter()
        .all(|command| !String::from_utf8_lossy(&command[0])
            .to_uppercase()
            .starts_with("TB.")));
    let mut plain = Server::start_without_module(&["--appendonly", "yes"]);
    plain.stop();
    let target = plain.dir.join("appendonlydir");
    let _ = std::fs::remove_dir_all(&target);
    copy_dir(&master.dir.join("appendonlydir"), &target);
    plain.restart();
    let mut pcon = plain.conn();
    for key in ["jobs:0", "jobs:1", "jobs:2"] {
        assert_eq!(members(&mut pcon, key), members(&mut con, key), "{key}");
        assert_eq!(
            pexpiretime(&mut pcon, key),
            pexpiretime(&mut con, key),
            "{key}"
        );
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

#[test]
fn a_promoted_replica_keeps_the_leases_and_the_count() {
    let (master, replica) = pair();
    let mut con = master.conn();
    let held = id_of(&acquire(&mut con, "jobs", 2, 600_000));
    let released = id_of(&acquire(&mut con, "jobs", 2, 600_000));
    release(&mut con, "jobs", &released);
    wait_for_replica(&master, &replica);
    drop(master);
    let mut rcon = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut rcon)
        .unwrap();
    // The held lease still holds its slot; the next id counts on, of the same incarnation:
    // the replica kept the master's, it never drew its own.
    let next = id_of(&acquire(&mut rcon, "jobs", 2, 600_000));
    assert_eq!(count_of(&next), 3);
    assert_eq!(id_parts(&next).2, id_parts(&held).2);
    assert_eq!(acquire(&mut rcon, "jobs", 2, 600_000).acquired, 0);
    assert_eq!(release(&mut rcon, "jobs", &held), 1);
    assert_eq!(
        release(&mut rcon, "jobs", &released),
        0,
        "a stale id stays stale"
    );
}

#[test]
fn leases_work_inside_multi_and_scripts() {
    let server = Server::start();
    let mut con = server.conn();
    let lease: String = redis::cmd("EVAL")
        .arg("return redis.call('TB.ACQUIRE', KEYS[1], 1, 30000)[4]")
        .arg(1)
        .arg("jobs")
        .query(&mut con)
        .expect("TB.ACQUIRE from a script");
    let released: i64 = redis::cmd("EVAL")
        .arg("return redis.call('TB.RELEASE', KEYS[1], ARGV[1])")
        .arg(1)
        .arg("jobs")
        .arg(&lease)
        .query(&mut con)
        .expect("TB.RELEASE from a script");
    assert_eq!(released, 1);
    // With a timeout inside MULTI: answered at once, never blocked.
    acquire(&mut con, "jobs", 1, 30_000);
    let replies: Vec<Value> = redis::pipe()
        .atomic()
        .cmd("TB.ACQUIRE")
        .arg("jobs")
        .arg(1)
        .arg(30_000)
        .arg(10_000)
        .query(&mut con)
        .expect("MULTI");
    assert_eq!(parse_acquired(replies[0].clone()).acquired, 0);
}

// --- Waiting: TB.ACQUIRE with timeout_ms ------------------------------------------------

use crate::harness::{turn_replica_under_waiter, wait_for_waiting, RawClient, Resp};
use std::time::{Duration, Instant};

/// `INFO tb` field `tb_<field>` as an integer.
fn tb_field(con: &mut redis::Connection, field: &str) -> i64 {
    harness::info_field(con, "tb", field)
        .unwrap_or_else(|| panic!("INFO tb {field}"))
        .parse::<f64>()
        .unwrap_or_else(|e| panic!("{field}: {e}")) as i64
}

/// TB.ACQUIRE key limit lease_ms timeout_ms on a fresh connection, its reply to come.
fn waiter(server: &Server, key: &str, limit: &str, lease_ms: &str, timeout_ms: &str) -> RawClient {
    let mut client = RawClient::connect(server);
    client.send(&["TB.ACQUIRE", key, limit, lease_ms, timeout_ms]);
    client
}

/// A waiter's reply as `(acquired, available, retry_after_ms, lease)`.
fn waited(reply: Resp) -> Acquired {
    let Resp::Items(items) = reply else {
        panic!("TB.ACQUIRE replied {reply:?}");
    };
    let int = |index: usize| -> i64 {
        items[index]
            .as_deref()
            .and_then(|text| text.parse().ok())
            .unwrap_or_else(|| panic!("{items:?}"))
    };
    Acquired {
        acquired: int(0),
        available: int(1),
        retry_after_ms: int(2),
        lease: items[3].clone(),
    }
}

#[test]
fn waiters_get_leases_first_come_first_served_as_holders_release() {
    let server = Server::start();
    let mut con = server.conn();
    let mut held = id_of(&acquire(&mut con, "jobs", 1, 600_000));
    let mut waiters: Vec<RawClient> = Vec::new();
    for index in 0..20 {
        waiters.push(waiter(&server, "jobs", "1", "600000", "0"));
        wait_for_waiting(&mut con, index + 1);
    }
    // A caller without timeout_ms does not jump the queue, even at a free slot.
    assert_eq!(release(&mut con, "jobs", &held), 1);
    for index in 0..waiters.len() {
        let reply = waited(waiters[index].reply());
        assert_eq!(
            (reply.acquired, reply.retry_after_ms),
            (1, 0),
            "waiter {index}"
        );
        if let Some(next) = waiters.get_mut(index + 1) {
            assert_eq!(
                next.reply_within(Duration::from_millis(20)),
                None,
                "{index} overtaken"
            );
            assert_eq!(
                acquire(&mut con, "jobs", 1, 1000).acquired,
                0,
                "queue jumped"
            );
        }
        held = reply.lease.expect("a lease");
        assert_eq!(release(&mut con, "jobs", &held), 1);
    }
    assert_eq!(tb_field(&mut con, "tb_waits_served"), 20);
    assert_eq!(tb_field(&mut con, "tb_waiting"), 0);
}

#[test]
fn a_waiter_is_served_when_the_earliest_lease_ends_by_itself() {
    let server = Server::start();
    let mut con = server.conn();
    acquire(&mut con, "jobs", 2, 60_000);
    acquire(&mut con, "jobs", 2, 400);
    let started = Instant::now();
    let mut client = waiter(&server, "jobs", "2", "60000", "5000");
    let reply = waited(client.reply());
    let waited_for = started.elapsed();
    assert_eq!(reply.acquired, 1, "{reply:?}");
    assert!(
        waited_for >= Duration::from_millis(350) && waited_for < Duration::from_millis(3000),
        "served after {waited_for:?}, the short lease ended at 400 ms"
    );
    assert_eq!(
        leases(&mut con, "jobs").len(),
        2,
        "the ended lease was removed"
    );
}

#[test]
fn one_release_wakes_exactly_one_waiter_and_a_delete_wakes_up_to_the_limit() {
    let server = Server::start();
    let mut con = server.conn();
    let ids: Vec<String> = (0..3)
        .map(|_| id_of(&acquire(&mut con, "jobs", 3, 600_000)))
        .collect();
    let mut waiters: Vec<RawClient> = Vec::new();
    for index in 0..5 {
        waiters.push(waiter(&server, "jobs", "3", "600000", "0"));
        wait_for_waiting(&mut con, index + 1);
    }
    release(&mut con, "jobs", &ids[0]);
    assert_eq!(waited(waiters[0].reply()).acquired, 1);
    assert_eq!(waiters[1].reply_within(Duration::from_millis(50)), None);
    // DEL frees every slot: the next three are served, the last waits on.
    let _: () = redis::cmd("DEL").arg("jobs").query(&mut con).unwrap();
    for (index, client) in waiters[1..4].iter_mut().enumerate() {
        assert_eq!(waited(client.reply()).acquired, 1, "waiter {}", index + 1);
    }
    assert_eq!(waiters[4].reply_within(Duration::from_millis(50)), None);
    let _: () = redis::cmd("FLUSHALL").query(&mut con).unwrap();
    assert_eq!(
        waited(waiters[4].reply()).acquired,
        1,
        "a flush wakes it too"
    );
}

#[test]
fn a_waiter_that_times_out_gets_a_denial_that_replicates_nothing() {
    let (master, replica) = pair();
    let mut con = master.conn();
    acquire(&mut con, "jobs", 1, 600_000);
    wait_for_replica(&master, &replica);
    let before = repl_offset(&mut con);
    let started = Instant::now();
    let mut client = waiter(&master, "jobs", "1", "1000", "200");
    let reply = waited(client.reply());
    assert!(started.elapsed() >= Duration::from_millis(190));
    assert_eq!(
        (reply.acquired, reply.available, reply.lease.clone()),
        (0, 0, None)
    );
    assert!(reply.retry_after_ms > 590_000, "{reply:?}");
    assert_eq!(repl_offset(&mut con), before);
    assert_eq!(tb_field(&mut con, "tb_leases_denied"), 1);
}

#[test]
fn a_waiter_that_disconnects_takes_nothing_and_the_next_is_served() {
    let server = Server::start();
    let mut con = server.conn();
    let held = id_of(&acquire(&mut con, "jobs", 1, 600_000));
    let gone = waiter(&server, "jobs", "1", "600000", "0");
    wait_for_waiting(&mut con, 1);
    let mut next = waiter(&server, "jobs", "1", "600000", "0");
    wait_for_waiting(&mut con, 2);
    drop(gone);
    wait_for_waiting(&mut con, 1);
    release(&mut con, "jobs", &held);
    let reply = waited(next.reply());
    assert_eq!(reply.acquired, 1);
    assert_eq!(leases(&mut con, "jobs").len(), 1, "one lease");
    assert_eq!(tb_field(&mut con, "tb_waits_abandoned"), 1);
}

/// Waiters stay on their database number, as BLPOP's do: after SWAPDB they
/// wait on the swapped-in data. A lease set there with a free slot serves
/// the first at once; the set swapped away is left as it was.
#[test]
fn swapdb_serves_a_waiter_from_the_lease_set_it_swaps_in() {
    let server = Server::start();
    let mut con = server.conn();
    let held = id_of(&acquire(&mut con, "jobs", 2, 600_000));
    acquire(&mut con, "jobs", 2, 600_000);
    let _: () = redis::cmd("SELECT").arg(1).query(&mut con).unwrap();
    acquire(&mut con, "jobs", 2, 600_000);
    let _: () = redis::cmd("SELECT").arg(0).query(&mut con).unwrap();
    let full = members(&mut con, "jobs");
    let mut first = waiter(&server, "jobs", "2", "600000", "0");
    wait_for_waiting(&mut con, 1);
    let mut second = waiter(&server, "jobs", "2", "600000", "0");
    wait_for_waiting(&mut con, 2);
    let _: () = redis::cmd("SWAPDB").arg(0).arg(1).query(&mut con).unwrap();
    let served = waited(first.reply());
    assert_eq!((served.acquired, served.available), (1, 0), "{served:?}");
    assert_eq!(
        count_of(&id_of(&served)),
        2,
        "the swapped-in set's count goes on"
    );
    assert_eq!(
        second.reply_within(Duration::from_millis(100)),
        None,
        "the limit of 2 is reached: the second waits"
    );
    let _: () = redis::cmd("SELECT").arg(1).query(&mut con).unwrap();
    assert_eq!(
        members(&mut con, "jobs"),
        full,
        "the set swapped away is untouched"
    );
    assert_eq!(release(&mut con, "jobs", &held), 1);
    let _: () = redis::cmd("SELECT").arg(0).query(&mut con).unwrap();
    assert_eq!(
        tb_field(&mut con, "tb_waiting"),
        1,
        "a release in db 1 wakes nobody"
    );
    assert_eq!(release(&mut con, "jobs", &id_of(&served)), 1);
    assert_eq!(
        waited(second.reply()).acquired,
        1,
        "served by a release in its db"
    );
}

#[test]
fn a_key_overwritten_while_waiting_ends_the_wait_with_an_error() {
    let server = Server::start();
    let mut con = server.conn();
    acquire(&mut con, "jobs", 1, 600_000);
    let mut client = waiter(&server, "jobs", "1", "1000", "0");
    wait_for_waiting(&mut con, 1);
    let _: () = redis::cmd("SET")
        .arg("jobs")
        .arg("x")
        .query(&mut con)
        .unwrap();
    assert_eq!(
        client.reply(),
        Resp::Error(
            "ERR tb: the lease set was overwritten with a value that is not a lease set while waiting"
                .into()
        )
    );
}

#[test]
fn nothing_is_granted_while_writes_are_paused_and_waiters_are_served_after() {
    let server = Server::start();
    let mut con = server.conn();
    // The holder's lease outlasts the waiter's arrival, however slow the server (valgrind);
    // once it waits, a renewal makes the lease end 1 s later, inside a 4 s pause.
    let holder = id_of(&acquire(&mut con, "jobs", 1, 60_000));
    let mut client = waiter(&server, "jobs", "1", "60000", "0");
    wait_for_waiting(&mut con, 1);
    assert_eq!(renew(&mut con, "jobs", &holder, 1000), 1);
    let _: () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(4000)
        .arg("WRITE")
        .query(&mut con)
        .unwrap();
    // The lease ends inside the pause: nobody is served yet.
    assert_eq!(client.reply_within(Duration::from_millis(2000)), None);
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut con).unwrap();
    assert_eq!(waited(client.reply()).acquired, 1);
}

#[test]
fn leases_granted_to_waiters_reach_the_replica_exactly() {
    let (master, replica) = pair();
    let mut con = master.conn();
    let held: Vec<String> = (0..2)
        .map(|_| id_of(&acquire(&mut con, "jobs", 2, 600_000)))
        .collect();
    let mut waiters: Vec<RawClient> = Vec::new();
    for index in 0..3 {
        waiters.push(waiter(&master, "jobs", "2", "600000", "0"));
        wait_for_waiting(&mut con, index + 1);
    }
    // A DEL by hand starts the count again, maybe within the ms of the held ids: the wake-up
    // that makes the set anew draws another incarnation, stored with the first waiter's lease.
    let held_with = incarnation(&mut con, "jobs");
    let _: () = redis::cmd("DEL").arg("jobs").query(&mut con).unwrap();
    let served: Vec<String> = waiters[..2]
        .iter_mut()
        .map(|client| {
            let reply = waited(client.reply());
            assert_eq!(reply.acquired, 1);
            id_of(&reply)
        })
        .collect();
    assert_eq!(release(&mut con, "jobs", &held[0]), 0, "gone with the DEL");
    let made_with = incarnation(&mut con, "jobs");
    assert!(made_with.is_some() && made_with != held_with);
    for (id, n) in served.iter().zip(1..) {
        assert_eq!((id_parts(id).1, id_parts(id).2), (n, made_with), "{id}");
    }
    wait_for_replica(&master, &replica);
    let mut rcon = replica.conn();
    assert_eq!(members(&mut rcon, "jobs"), members(&mut con, "jobs"));
    assert_eq!(
        pexpiretime(&mut rcon, "jobs"),
        pexpiretime(&mut con, "jobs")
    );
    assert_eq!(score_of(&mut con, "jobs", "seq"), Some(-2));
}

#[test]
fn members_scored_at_or_below_zero_never_hold_a_slot_nor_shorten_the_removal() {
    let server = Server::start();
    let mut con = server.conn();
    let mut zadd = redis::cmd("ZADD");
    zadd.arg("jobs").arg(-70).arg("seq");
    for (score, member) in [(-5, "a"), (0, "b"), (-2, "c"), (-3, "d")] {
        zadd.arg(score).arg(member);
    }
    for index in 1..=70 {
        zadd.arg(1_000 + index).arg(format!("1000-{index}"));
    }
    let _: () = zadd.query(&mut con).unwrap();
    let grant = acquire(&mut con, "jobs", 1, 60_000);
    assert_eq!((grant.acquired, grant.available), (1, 0), "{grant:?}");
    let left = members(&mut con, "jobs");
    let ended: Vec<&String> = left
        .iter()
        .filter(|(_, score)| (1..=2_000).contains(score))
        .map(|(member, _)| member)
        .collect();
    assert_eq!(ended.len(), 6, "the 64 earliest were removed: {left:?}");
    assert_eq!(count_of(&id_of(&grant)), 71);
}

#[test]
fn a_master_turning_replica_ends_every_lease_wait_with_an_error_and_grants_nothing() {
    let other = Server::start();
    let server = Server::start();
    let mut con = server.conn();
    acquire(&mut con, "jobs", 1, 600_000);
    let before = members(&mut con, "jobs");
    let mut client = waiter(&server, "jobs", "1", "1000", "0");
    turn_replica_under_waiter(&server, &other, &mut client);
    assert_eq!(before.len(), 3, "seq, inc and one lease: {before:?}");
}

#[test]
fn tb_max_waiters_caps_the_lease_waiters_of_a_key() {
    let server = Server::start();
    let mut con = server.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("tb.max-waiters")
        .arg(2)
        .query(&mut con)
        .unwrap();
    acquire(&mut con, "jobs", 1, 600_000);
    let _first = waiter(&server, "jobs", "1", "1000", "0");
    let _second = waiter(&server, "jobs", "1", "1000", "0");
    wait_for_waiting(&mut con, 2);
    let mut third = waiter(&server, "jobs", "1", "1000", "0");
    assert_eq!(
        third.reply(),
        Resp::Error("ERR tb: too many clients wait on this key (see tb.max-waiters)".into())
    );
}
