//! Keyspace notifications from TB.TAKE, with `notify-keyspace-events KEA`.
//!
//! The module writes through the low-level key API, which emits no
//! notifications by itself; the contract says a write notifies `hset` (class h)
//! and `expire` (class g), and a call that writes nothing notifies nothing.
//!
//! "Nothing" is checked with a marker: after the call under test the test
//! sends a plain `SET` on another key, and the first event the subscriber
//! receives must be the marker's. Events are delivered in order on one
//! connection, so anything TB.TAKE published would arrive first.

use std::time::Duration;

use crate::harness::{take, Server};

/// Upper bound for any single wait for an event.
const EVENT_TIMEOUT: Duration = Duration::from_secs(5);

/// (channel, payload), e.g. ("__keyevent@0__:hset", "tb:k").
type Event = (String, String);

fn enable_notifications(con: &mut redis::Connection) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("KEA")
        .query(con)
        .expect("CONFIG SET notify-keyspace-events");
}

fn subscribe(sub: &mut redis::PubSub<'_>) {
    sub.set_read_timeout(Some(EVENT_TIMEOUT))
        .expect("set_read_timeout");
    // Returns once the server has confirmed the subscription.
    sub.psubscribe("__key*__:*").expect("PSUBSCRIBE");
}

fn next_event(sub: &mut redis::PubSub<'_>) -> Event {
    let msg = sub
        .get_message()
        .unwrap_or_else(|e| panic!("no keyspace event within {EVENT_TIMEOUT:?}: {e}"));
    let payload = String::from_utf8_lossy(msg.get_payload_bytes()).into_owned();
    (msg.get_channel_name().to_string(), payload)
}

fn is_about(event: &Event, key: &str) -> bool {
    event.0.strip_prefix("__keyspace@0__:") == Some(key)
        || (event.0.starts_with("__keyevent@0__:") && event.1 == key)
}

/// Sends `SET marker x` and returns every event received before the marker's.
fn events_until_marker(
    con: &mut redis::Connection,
    sub: &mut redis::PubSub<'_>,
    marker: &str,
) -> Vec<Event> {
    let _: () = redis::cmd("SET")
        .arg(marker)
        .arg("x")
        .query(con)
        .expect("SET marker");
    let mut events = Vec::new();
    loop {
        let event = next_event(sub);
        if is_about(&event, marker) {
            return events;
        }
        events.push(event);
        assert!(events.len() < 1000, "marker never arrived: {events:?}");
    }
}

/// The event names published for `key`, from both channel kinds, sorted.
fn names_for(events: &[Event], key: &str) -> (Vec<String>, Vec<String>) {
    let mut keyspace: Vec<String> = events
        .iter()
        .filter(|(channel, _)| channel.strip_prefix("__keyspace@0__:") == Some(key))
        .map(|(_, payload)| payload.clone())
        .collect();
    let mut keyevent: Vec<String> = events
        .iter()
        .filter(|(channel, payload)| channel.starts_with("__keyevent@0__:") && payload == key)
        .filter_map(|(channel, _)| channel.strip_prefix("__keyevent@0__:"))
        .map(str::to_string)
        .collect();
    keyspace.sort();
    keyevent.sort();
    (keyspace, keyevent)
}

#[test]
fn an_allowed_take_notifies_hset_and_expire() {
    let server = Server::start();
    let mut con = server.conn();
    enable_notifications(&mut con);
    let mut sub_con = server.conn();
    let mut sub = sub_con.as_pubsub();
    subscribe(&mut sub);

    // One token per 1000 s: the bucket cannot expire (an `expired` event) before the marker.
    assert_eq!(take(&mut con, "tb:n", "10", "0.001", "3")[0], 1);
    let events = events_until_marker(&mut con, &mut sub, "marker");

    let expected = vec!["expire".to_string(), "hset".to_string()];
    assert_eq!(
        names_for(&events, "tb:n"),
        (expected.clone(), expected),
        "events: {events:?}"
    );
}

/// An empty bucket that refills one token per 1000 s.
/// Runs `calls`, then `SET other x`: the first event `sub` sees must be about `other`.
fn assert_notifies_nothing(
    con: &mut redis::Connection,
    sub: &mut redis::PubSub<'_>,
    what: &str,
    calls: impl FnOnce(&mut redis::Connection),
) {
    calls(con);
    let _: () = redis::cmd("SET")
        .arg("other")
        .arg("x")
        .query(con)
        .expect("SET other");
    let first = next_event(sub);
    assert!(
        is_about(&first, "other"),
        "first event after {what}: {first:?}"
    );
}

fn exhaust(con: &mut redis::Connection, key: &str) {
    assert_eq!(take(con, key, "1", "0.001", "1")[0], 1);
}

#[test]
fn a_denied_take_notifies_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    enable_notifications(&mut con);
    exhaust(&mut con, "tb:d");
    let mut sub_con = server.conn();
    let mut sub = sub_con.as_pubsub();
    subscribe(&mut sub);

    assert_notifies_nothing(&mut con, &mut sub, "a denied take", |con| {
        assert_eq!(take(con, "tb:d", "1", "0.001", "1")[0], 0);
        // Denied on a missing key too (n > capacity).
        assert_eq!(take(con, "tb:missing", "1", "0.001", "2")[0], 0);
    });
}

#[test]
fn a_take_of_zero_tokens_notifies_nothing() {
    let server = Server::start();
    let mut con = server.conn();
    enable_notifications(&mut con);
    // One token per 1000 s: the bucket cannot expire (an `expired` event) before the marker.
    assert_eq!(take(&mut con, "tb:z", "10", "0.001", "4")[0], 1);
    let mut sub_con = server.conn();
    let mut sub = sub_con.as_pubsub();
    subscribe(&mut sub);

    assert_notifies_nothing(&mut con, &mut sub, "n = 0", |con| {
        assert_eq!(take(con, "tb:z", "10", "0.001", "0")[0], 1);
        assert_eq!(take(con, "tb:z-missing", "10", "1", "0")[0], 1);
    });
}
