//! TB.TOP: the keys denied most, counted in the server from every denial.

use std::time::Duration;

use redis::Value;

use crate::harness::*;

/// One row of TB.TOP: `[key, count, error, shadow, truncated]`.
#[derive(Debug, PartialEq, Eq)]
struct Row {
    key: Vec<u8>,
    count: i64,
    error: i64,
    shadow: i64,
    truncated: i64,
}

fn top_rows(con: &mut redis::Connection, args: &[&str]) -> Vec<Row> {
    let mut cmd = redis::cmd("TB.TOP");
    for arg in args {
        cmd.arg(*arg);
    }
    let rows: Vec<(Vec<u8>, i64, i64, i64, i64)> = cmd.query(con).expect("TB.TOP");
    rows.into_iter()
        .map(|(key, count, error, shadow, truncated)| Row {
            key,
            count,
            error,
            shadow,
            truncated,
        })
        .collect()
}

/// (key, count) of each row, in order.
fn counts(con: &mut redis::Connection) -> Vec<(String, i64)> {
    top_rows(con, &["COUNT", "100"])
        .into_iter()
        .map(|row| (String::from_utf8_lossy(&row.key).into_owned(), row.count))
        .collect()
}

/// `times` denied TB.TAKEs of `key` (a bucket of 1 that refills once in 1000 s).
fn deny(con: &mut redis::Connection, key: &str, times: usize) {
    take(con, key, "1", "0.001", "1");
    for _ in 0..times {
        assert_eq!(
            take(con, key, "1", "0.001", "1")[0],
            0,
            "{key} was not denied"
        );
    }
}

#[test]
fn top_lists_the_most_denied_keys_first_with_their_counts() {
    let server = Server::start();
    let mut con = server.conn();
    deny(&mut con, "a", 2);
    deny(&mut con, "b", 5);
    deny(&mut con, "c", 1);
    assert_eq!(
        top_rows(&mut con, &[]),
        [
            Row {
                key: b"b".to_vec(),
                count: 5,
                error: 0,
                shadow: 0,
                truncated: 0
            },
            Row {
                key: b"a".to_vec(),
                count: 2,
                error: 0,
                shadow: 0,
                truncated: 0
            },
            Row {
                key: b"c".to_vec(),
                count: 1,
                error: 0,
                shadow: 0,
                truncated: 0
            },
        ]
    );
}

#[test]
fn top_count_limits_the_rows_and_defaults_to_ten() {
    let server = Server::start();
    let mut con = server.conn();
    for key in 0..12 {
        deny(&mut con, &format!("k{key:02}"), 1 + key);
    }
    assert_eq!(top_rows(&mut con, &[]).len(), 10);
    let two = top_rows(&mut con, &["count", "2"]);
    assert_eq!(
        (two.len(), &two[0].key[..], two[0].count),
        (2, &b"k11"[..], 12)
    );
}

#[test]
fn allowed_calls_and_peeks_count_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    take(&mut con, "k", "10", "1", "1");
    take(&mut con, "k", "1", "0.001", "5"); // never possible, but a denial: counted below
    drain(&mut con, "p", "1", "0.001");
    for _ in 0..3 {
        assert_eq!(peek(&mut con, "p", "1", "0.001", "1")[0], 0);
    }
    refund(&mut con, "p", "1", "0.001", "0");
    assert_eq!(counts(&mut con), [("k".to_string(), 1)]);
}

#[test]
fn every_denying_command_counts_its_key() {
    let server = Server::start();
    let mut con = server.conn();
    deny(&mut con, "take", 1);
    // TB.BTAKE: denied at once (n above capacity), and at its timeout.
    let at_once: Vec<i64> = redis::cmd("TB.BTAKE")
        .arg(&["btake", "1", "1", "2", "1000"])
        .query(&mut con)
        .unwrap();
    assert_eq!(at_once[0], 0);
    drain(&mut con, "waited", "1", "0.001");
    let timed_out: Vec<i64> = redis::cmd("TB.BTAKE")
        .arg(&["waited", "1", "0.001", "1", "50"])
        .query(&mut con)
        .unwrap();
    assert_eq!(timed_out[0], 0);
    // TB.THROTTLE: a burst of one, then a denial.
    let throttle = |con: &mut redis::Connection| -> Vec<i64> {
        redis::cmd("TB.THROTTLE")
            .arg(&["throttle", "0", "1", "3600"])
            .query(con)
            .unwrap()
    };
    throttle(&mut con);
    assert_eq!(throttle(&mut con)[0], 1, "TB.THROTTLE was not limited");
    // TB.ACQUIRE: denied at once, and at its timeout.
    let acquire = |con: &mut redis::Connection, timeout: Option<&str>| -> Value {
        let mut cmd = redis::cmd("TB.ACQUIRE");
        cmd.arg(&["leases", "1", "60000"]);
        if let Some(timeout) = timeout {
            cmd.arg(timeout);
        }
        cmd.query(con).unwrap()
    };
    acquire(&mut con, None);
    acquire(&mut con, None);
    acquire(&mut con, Some("50"));
    // TB.TAKEALL: the deciding key only.
    drain(&mut con, "all:b", "1", "0.001");
    let all: Vec<i64> = redis::cmd("TB.TAKEALL")
        .arg(&["all:a", "10", "1", "1", "all:b", "1", "0.001", "1"])
        .query(&mut con)
        .unwrap();
    assert_eq!((all[0], all[4]), (0, 1));
    let mut listed = counts(&mut con);
    listed.sort();
    assert_eq!(
        listed,
        [
            ("all:b".to_string(), 1),
            ("btake".to_string(), 1),
            ("leases".to_string(), 2),
            ("take".to_string(), 1),
            ("throttle".to_string(), 1),
            ("waited".to_string(), 1),
        ]
    );
}

#[test]
fn shadow_mode_denials_are_counted_as_shadow() {
    let server = Server::start_with(&["--tb.shadow-mode", "yes"]);
    let mut con = server.conn();
    take(&mut con, "k", "1", "0.001", "1");
    assert_eq!(
        take(&mut con, "k", "1", "0.001", "1")[0],
        1,
        "shadow mode reports allowed"
    );
    let rows = top_rows(&mut con, &[]);
    assert_eq!((rows[0].count, rows[0].shadow), (1, 1));
}

#[test]
fn top_reset_forgets_every_denial() {
    let server = Server::start();
    let mut con = server.conn();
    deny(&mut con, "k", 3);
    let reply: String = redis::cmd("TB.TOP").arg("RESET").query(&mut con).unwrap();
    assert_eq!(reply, "OK");
    assert!(top_rows(&mut con, &[]).is_empty());
}

#[test]
fn long_key_names_are_cut_at_256_bytes_and_say_so() {
    let server = Server::start();
    let mut con = server.conn();
    let long = format!("{}tail", "x".repeat(256));
    deny(&mut con, &long, 1);
    let rows = top_rows(&mut con, &[]);
    assert_eq!((rows[0].key.len(), rows[0].truncated), (256, 1));
}

#[test]
fn key_names_come_back_as_the_bytes_they_are() {
    let server = Server::start();
    let mut con = server.conn();
    let key = [0xffu8, 0x00, b'\n', 0xfe];
    redis::cmd("TB.TAKE")
        .arg(&key[..])
        .arg(&["1", "0.001", "2"])
        .exec(&mut con)
        .unwrap();
    assert_eq!(top_rows(&mut con, &[])[0].key, key);
}

#[test]
fn top_slots_zero_counts_nothing_and_a_new_slot_count_starts_afresh() {
    let server = Server::start_with(&["--tb.top-slots", "0"]);
    let mut con = server.conn();
    deny(&mut con, "k", 2);
    assert!(top_rows(&mut con, &[]).is_empty());
    redis::cmd("CONFIG")
        .arg(&["SET", "tb.top-slots", "2"])
        .exec(&mut con)
        .unwrap();
    deny(&mut con, "j", 2);
    assert_eq!(counts(&mut con), [("j".to_string(), 2)]);
    redis::cmd("CONFIG")
        .arg(&["SET", "tb.top-slots", "8"])
        .exec(&mut con)
        .unwrap();
    assert!(
        top_rows(&mut con, &[]).is_empty(),
        "a new slot count starts empty"
    );
    let refused = redis::cmd("CONFIG")
        .arg(&["SET", "tb.top-slots", "4097"])
        .exec(&mut con)
        .unwrap_err();
    assert!(error_text(&refused).contains("4096"), "{refused}");
}

#[test]
fn denials_older_than_two_windows_leave_the_list() {
    let server = Server::start_with(&["--tb.top-window-ms", "1000"]);
    let mut con = server.conn();
    deny(&mut con, "old", 2);
    // Listed for at least a window, then gone within two (and some slack
    // for a slow machine): waited for, not timed.
    assert_eq!(counts(&mut con), [("old".to_string(), 2)]);
    wait_until(
        "the old denials to leave TB.TOP",
        Duration::from_secs(30),
        || top_rows(&mut con, &[]).is_empty(),
    );
}

#[test]
fn top_errors_name_the_argument_and_change_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    deny(&mut con, "k", 1);
    for bad in ["0", "-1", "1.5", "x", "9007199254740993"] {
        let message = expect_error(&mut con, &[b"TB.TOP", b"COUNT", bad.as_bytes()]);
        assert!(
            message.starts_with("ERR COUNT must be a whole number"),
            "{bad}: {message}"
        );
    }
    assert!(expect_error(&mut con, &[b"TB.TOP", b"COUNT"]).starts_with("ERR COUNT"));
    for bad in [
        &[&b"TB.TOP"[..], b"RESET", b"now"][..],
        &[b"TB.TOP", b"everything"],
    ] {
        let message = expect_error(&mut con, bad);
        assert!(
            message.starts_with("ERR TB.TOP takes COUNT k or RESET"),
            "{message}"
        );
    }
    assert_eq!(counts(&mut con), [("k".to_string(), 1)]);
}

#[test]
fn top_is_callable_from_a_script_and_read_only_scripts() {
    let server = Server::start();
    let mut con = server.conn();
    deny(&mut con, "k", 1);
    for eval in ["EVAL", "EVAL_RO"] {
        let rows: Vec<(String, i64, i64, i64, i64)> = redis::cmd(eval)
            .arg("return redis.call('TB.TOP', 'COUNT', '1')")
            .arg(0)
            .query(&mut con)
            .unwrap();
        assert_eq!(rows, [("k".to_string(), 1, 0, 0, 0)], "{eval}");
    }
}

#[test]
fn a_replica_counts_nothing_the_master_denied() {
    let master = Server::start();
    let replica = start_replica_of(&master);
    let mut con = master.conn();
    deny(&mut con, "k", 3);
    wait_for_replica(&master, &replica);
    assert_eq!(counts(&mut con), [("k".to_string(), 3)]);
    assert!(top_rows(&mut replica.conn(), &[]).is_empty());
}

#[test]
fn top_is_not_in_the_tb_category_that_limiter_clients_are_granted() {
    let server = Server::start();
    let mut con = server.conn();
    let categories: Vec<String> = redis::cmd("ACL").arg("CAT").query(&mut con).unwrap();
    if !categories.iter().any(|category| category == "tb") {
        return; // a server without module ACL categories (before Redis 7.4)
    }
    redis::cmd("ACL")
        .arg(&["SETUSER", "limiter", "on", "nopass", "+@tb", "~*"])
        .exec(&mut con)
        .unwrap();
    redis::cmd("AUTH")
        .arg(&["limiter", "x"])
        .exec(&mut con)
        .unwrap();
    take(&mut con, "k", "1", "1", "1");
    let refused = redis::cmd("TB.TOP").exec(&mut con).unwrap_err();
    assert!(error_text(&refused).contains("permission"), "{refused}");
}
