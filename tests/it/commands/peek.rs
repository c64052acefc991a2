//! TB.PEEK: the reply TB.TAKE would give, without writing anything.

use crate::harness::*;

#[test]
fn peek_on_a_missing_key_reports_a_full_bucket_and_creates_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(peek(&mut con, "b", "10", "2", "3"), vec![1, 7, 0, 1500]);
    assert!(!exists(&mut con, "b"), "TB.PEEK created the key");
}

#[test]
fn peek_defaults_n_to_one() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(peek_default_n(&mut con, "b", "10", "2"), vec![1, 9, 0, 500]);
    assert_eq!(
        peek_default_n(&mut con, "b", "10", "2"),
        peek(&mut con, "b", "10", "2", "1")
    );
}

#[test]
fn peek_default_n_on_a_drained_bucket_is_denied() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "b", "2", "0.001", "2");
    let reply = peek_default_n(&mut con, "b", "2", "0.001");
    assert_eq!(&reply[..2], &[0, 0], "reply {reply:?}");
    assert!(
        reply[2] > 990_000 && reply[2] <= 1_000_000,
        "retry_after_ms {}",
        reply[2]
    );
}

#[test]
fn peek_replies_what_take_then_replies() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "b", "10", "0.001", "6.5");
    // Allowed (n 2), denied (n 5), never possible (n 11), n = 0.
    for n in ["2", "5", "11", "0"] {
        let t0 = server_time_ms(&mut con);
        let peeked = peek(&mut con, "b", "10", "0.001", n);
        let taken = take(&mut con, "b", "10", "0.001", n);
        let t1 = server_time_ms(&mut con);
        let slack = t1 - t0 + 1; // ms that can pass between the two calls
        assert_eq!(
            &peeked[..2],
            &taken[..2],
            "n {n}: peek {peeked:?} vs take {taken:?}"
        );
        for field in [2, 3] {
            assert!(
                (peeked[field] - taken[field]).abs() <= slack,
                "n {n}: field {field} peek {peeked:?} vs take {taken:?} (slack {slack} ms)"
            );
        }
    }
}

#[test]
fn peek_never_writes_an_existing_bucket() {
    let server = Server::start();
    let mut con = server.conn();
    let t0 = server_time_ms(&mut con);
    seed_bucket(&mut con, "b", "4", t0);
    hset(&mut con, "b", &[("owner", "alice")]);
    let far = t0 + 3_600_000;
    let _: i64 = redis::cmd("PEXPIREAT")
        .arg("b")
        .arg(far)
        .query(&mut con)
        .unwrap();
    let before = snapshot(&mut con, b"b");
    let hash_before = hgetall(&mut con, "b");
    for n in ["1", "4", "5", "11", "0", "0.5"] {
        peek(&mut con, "b", "10", "0.001", n);
        assert_eq!(
            snapshot(&mut con, b"b"),
            before,
            "TB.PEEK n {n} changed the key"
        );
    }
    peek_default_n(&mut con, "b", "10", "0.001");
    assert_eq!(hgetall(&mut con, "b"), hash_before);
    assert_eq!(pexpiretime(&mut con, "b"), far);
}

#[test]
fn peek_after_a_take_does_not_touch_the_ttl() {
    let server = Server::start();
    let mut con = server.conn();
    // Full again in 500 s: the key cannot expire between the reads below.
    take(&mut con, "b", "10", "0.01", "5");
    let deadline = pexpiretime(&mut con, "b");
    let before = pttl(&mut con, "b");
    let reply = peek(&mut con, "b", "10", "0.01", "5");
    assert_eq!(reply[0], 1);
    assert_eq!(pexpiretime(&mut con, "b"), deadline);
    assert!(pttl(&mut con, "b") <= before);
}

#[test]
fn peek_does_not_signal_a_watched_key() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "b", "5", "0.001", "1");
    let peeked = |other: &mut redis::Connection| {
        assert_eq!(peek(other, "b", "5", "0.001", "1")[0], 1);
    };
    assert!(
        watch_survives(&server, &mut con, "b", peeked),
        "EXEC aborted: TB.PEEK signalled WATCH"
    );
}

#[test]
fn peek_reports_minus_one_when_n_exceeds_capacity() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(peek(&mut con, "b", "5", "1", "6"), vec![0, 5, -1, 0]);
    assert!(!exists(&mut con, "b"));
}

#[test]
fn peek_floors_fractional_remaining() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(&peek(&mut con, "b", "10", "0.001", "2.5")[..3], &[1, 7, 0]);
    take(&mut con, "b", "10", "0.001", "2.5");
    assert_eq!(&peek(&mut con, "b", "10", "0.001", "0.6")[..3], &[1, 6, 0]);
}

#[test]
fn peek_sees_tokens_refill_over_real_time() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "b", "100", "1000", "100");
    sleep_ms(50);
    let reply = peek(&mut con, "b", "100", "1000", "10");
    assert_eq!(reply[0], 1, "reply {reply:?}");
    assert!(
        reply[1] >= 40,
        "only {} left after 50 ms at 1000/s",
        reply[1]
    );
    // Peeking took nothing: a take now sees at least as much.
    let taken = take(&mut con, "b", "100", "1000", "10");
    assert!(taken[1] >= reply[1], "take {taken:?} after peek {reply:?}");
}

#[test]
fn peek_works_inside_multi_exec_and_eval() {
    let server = Server::start();
    let mut con = server.conn();
    let (peeked,): (Vec<i64>,) = redis::pipe()
        .atomic()
        .cmd("TB.PEEK")
        .arg("b")
        .arg("10")
        .arg("2")
        .query(&mut con)
        .unwrap();
    assert_eq!(peeked, vec![1, 9, 0, 500]);
    let from_eval = eval_tb(&mut con, "EVAL", "TB.PEEK", "b", &["10", "2", "3"]);
    assert_eq!(from_eval, vec![1, 7, 0, 1500]);
    // EVAL_RO only allows read-only commands.
    let from_eval_ro = eval_tb(&mut con, "EVAL_RO", "TB.PEEK", "b", &["10", "2"]);
    assert_eq!(from_eval_ro, vec![1, 9, 0, 500]);
    assert!(!exists(&mut con, "b"));
}
