//! TB.UNBLOCK, on the module and on its Lua twin (one case, two tests: `<case>::on_module`,
//! `<case>::on_twin`): it lifts a lock (docs/commands.md), writing only when there is one.

use crate::harness::*;

on_every_backend!(unblock_removes_the_lock_and_keeps_the_tokens_and_the_expiry);
fn unblock_removes_the_lock_and_keeps_the_tokens_and_the_expiry(backend: Backend) {
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "0");
    backend.ints(&mut con, "take", "k", "5 1 1 BLOCK 60000");
    let expiry = pexpiretime(&mut con, "k");
    let tokens = field(&mut con, "k", "tokens");
    assert_eq!(backend.unblock(&mut con, "k"), 1);
    let names: Vec<String> = fields(&mut con, "k")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(names, ["tokens", "last_refill"]);
    assert_eq!(field(&mut con, "k", "tokens"), tokens);
    assert_eq!(pexpiretime(&mut con, "k"), expiry);
    // No lock: the token, refilled within a second, can be taken again.
    sleep_ms(1000);
    assert_eq!(backend.ints(&mut con, "take", "k", "5 1 1")[0], 1);
}

on_every_backend!(tb_unblock_lifts_the_lock_answering_1_then_0_and_writes_only_when_it_answers_1);
fn tb_unblock_lifts_the_lock_answering_1_then_0_and_writes_only_when_it_answers_1(
    backend: Backend,
) {
    let (server, mut con) = backend.start_with(AOF_ARGS);
    // 5 tokens, 1 per 1000 s: 1 left, and a denial of 2 locks the key.
    assert_eq!(backend.ints(&mut con, "take", "tb:u", "5 0.001 4")[0], 1);
    let reply = backend.ints(&mut con, "take", "tb:u", "5 0.001 2 BLOCK 60000");
    assert_eq!(reply[0], 0);
    let reply = backend.ints(&mut con, "take", "tb:u", "5 0.001 1");
    assert_eq!(reply[0], 0, "locked");
    let deadline = pexpiretime(&mut con, "tb:u");
    let logged = effects_on(&server, &mut con, "tb:u");

    assert_eq!(backend.unblock(&mut con, "tb:u"), 1);
    let mut expected = logged.clone();
    let hdel = ["HDEL", "tb:u", "locked_until", "strikes", "probation_until"];
    expected.push(argv(&hdel));
    assert_eq!(effects_on(&server, &mut con, "tb:u"), expected, "one HDEL");
    let left = hgetall(&mut con, "tb:u");
    assert!(!has_lock_fields(&mut con, "tb:u"), "{left:?}");
    assert_eq!(pexpiretime(&mut con, "tb:u"), deadline, "the TTL stays");
    let reply = backend.ints(&mut con, "take", "tb:u", "5 0.001 1");
    assert_eq!(
        reply[..2],
        [1, 0],
        "the last token, the lock gone: {reply:?}"
    );

    // Nothing to lift: 0, and nothing written; a missing key is not created.
    let before = snapshot(&mut con, b"tb:u");
    let logged = aof_without_select(&server, &mut con);
    assert_eq!(backend.unblock(&mut con, "tb:u"), 0);
    assert_eq!(backend.unblock(&mut con, "tb:missing"), 0);
    assert_eq!(
        aof_without_select(&server, &mut con),
        logged,
        "nothing appended"
    );
    assert_eq!(snapshot(&mut con, b"tb:u"), before);
    assert!(!exists(&mut con, "tb:missing"));
    assert_eq!(
        backend.ints(&mut con, "take", "tb:plain", "5 0.001 1")[0],
        1
    );
    let plain = aof_without_select(&server, &mut con);
    assert_eq!(
        backend.unblock(&mut con, "tb:plain"),
        0,
        "a bucket never locked"
    );
    assert_eq!(aof_without_select(&server, &mut con), plain);

    // The strikes are forgotten too: the next lock is a first one.
    let reply = backend.ints(
        &mut con,
        "take",
        "tb:u",
        "5 0.001 1 BLOCK 500 MAXBLOCK 8000",
    );
    assert_eq!(reply[0], 0);
    let (until, strikes, probation) = stored_lock(&mut con, "tb:u");
    assert_eq!((strikes, probation - until), (1, 500));
}

on_every_backend!(unblock_without_a_lock_replies_0_and_writes_nothing);
fn unblock_without_a_lock_replies_0_and_writes_nothing(backend: Backend) {
    let (server, mut con) = backend.start();
    frozen(&mut con, "k", "1");
    let before = snapshot(&mut con, b"k");
    assert!(watch_survives(&server, &mut con, "k", |other| {
        assert_eq!(backend.unblock(other, "k"), 0);
    }));
    assert_eq!(snapshot(&mut con, b"k"), before);
}

on_every_backend!(unblock_of_a_missing_key_replies_0_and_creates_nothing);
fn unblock_of_a_missing_key_replies_0_and_creates_nothing(backend: Backend) {
    let (_server, mut con) = backend.start();
    assert_eq!(backend.unblock(&mut con, "k"), 0);
    assert!(!exists(&mut con, "k"));
}

on_every_backend!(unblock_removes_stray_lock_fields_too);
fn unblock_removes_stray_lock_fields_too(backend: Backend) {
    let (_server, mut con) = backend.start();
    // Damaged lock fields, which every other command refuses: TB.UNBLOCK is the way out.
    for (name, value) in [("strikes", "x"), ("locked_until", "soon"), ("strikes", "0")] {
        frozen(&mut con, "k", "1");
        hset(&mut con, "k", &[(name, value)]);
        assert_eq!(backend.unblock(&mut con, "k"), 1, "{name} = {value}");
        assert_eq!(field(&mut con, "k", name), None);
        assert_eq!(backend.ints(&mut con, "take", "k", "5 1 1")[0], 1);
    }
}

on_every_backend!(unblock_runs_when_memory_is_short_where_a_charge_is_refused);
fn unblock_runs_when_memory_is_short_where_a_charge_is_refused(backend: Backend) {
    // TB.UNBLOCK has no deny-oom flag and the library registers `tb_unblock` `allow-oom`:
    // lifting a lock only deletes. (The script form has no flags: docs/lua-fallback.md.)
    let (_server, mut con) = backend.start();
    frozen(&mut con, "k", "1");
    hset(&mut con, "k", &[("strikes", "1")]);
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "1"])
        .query(&mut con)
        .unwrap();
    assert_eq!(backend.unblock(&mut con, "k"), 1);
    let err = backend.error(&mut con, "charge", "k", "5 1 1");
    assert!(err.starts_with("OOM"), "{err}");
}

on_every_backend!(unblock_of_another_type_is_wrongtype);
fn unblock_of_another_type_is_wrongtype(backend: Backend) {
    let (_server, mut con) = backend.start();
    for key in foreign_values(&mut con, "hash") {
        let key = std::str::from_utf8(key).unwrap();
        let refused = backend.error(&mut con, "unblock", key, "");
        assert_eq!(refused, WRONGTYPE_ERROR, "{key}");
    }
}

on_every_backend!(unblock_takes_exactly_one_key_and_no_arguments);
fn unblock_takes_exactly_one_key_and_no_arguments(backend: Backend) {
    let (_server, mut con) = backend.start();
    for (keys, args) in [("k", "x"), ("k l", "")] {
        let refused = backend.error(&mut con, "unblock", keys, args);
        assert_eq!(refused, arity_error("tb.unblock"), "{keys} {args}");
    }
}

on_every_backend!(
    a_denial_during_a_lock_leaves_a_watch_alone_and_tb_unblock_signals_it_only_when_it_answers_1
);
fn a_denial_during_a_lock_leaves_a_watch_alone_and_tb_unblock_signals_it_only_when_it_answers_1(
    backend: Backend,
) {
    let (server, mut con) = backend.start();
    backend.locked_slow_bucket(&mut con, "tb:watched", "60000");
    let denied = |other: &mut redis::Connection| {
        for (command, args) in [
            ("take", "1 0.001 1 BLOCK 60000"),
            ("takeall", "1 0.001 0 MAXWAIT 5"),
            ("throttle", "0 1 1000"),
        ] {
            backend.ints(other, command, "tb:watched", args);
        }
    };
    assert!(watch_survives(&server, &mut con, "tb:watched", denied));
    let never_locked = |other: &mut redis::Connection| {
        assert_eq!(backend.unblock(other, "tb:never-locked"), 0);
    };
    assert!(watch_survives(
        &server,
        &mut con,
        "tb:never-locked",
        never_locked
    ));
    let lifted = |other: &mut redis::Connection| {
        assert_eq!(backend.unblock(other, "tb:watched"), 1);
    };
    assert!(!watch_survives(&server, &mut con, "tb:watched", lifted));
    let lifted_before = |other: &mut redis::Connection| {
        assert_eq!(backend.unblock(other, "tb:watched"), 0);
    };
    assert!(watch_survives(
        &server,
        &mut con,
        "tb:watched",
        lifted_before
    ));
}
