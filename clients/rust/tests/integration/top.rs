//! `top(count)` (docs/clients.md#the-most-denied-keys): TB.TOP on a
//! standalone server, and on every master of a cluster, merged; a key that
//! is not UTF-8 comes back with its exact bytes; without the module, or
//! without the ACL's grant, the server's error; unreachable, `Unavailable`.

use crate::api::GENEROUS;
use crate::common::*;
use redis_tb_client::{key_slot, AsyncRateLimiter, Error, RateLimiter, TopKey};

/// `times` denials of `key` (a bucket of 1 token: its first take is allowed).
fn deny(con: &mut impl redis::ConnectionLike, key: &[u8], times: usize) {
    for i in 0..=times {
        let reply: Vec<i64> = redis::cmd("TB.TAKE")
            .arg(key)
            .arg(1)
            .arg(SLOW)
            .arg(1)
            .query(con)
            .unwrap();
        assert_eq!(
            reply[0],
            i64::from(i == 0),
            "{:?} take {i}",
            String::from_utf8_lossy(key)
        );
    }
}

/// (key bytes, count) of each row.
fn rows(top: &[TopKey]) -> Vec<(Vec<u8>, u64)> {
    top.iter().map(|r| (r.key_bytes.clone(), r.count)).collect()
}

fn want(rows: &[(&[u8], u64)]) -> Vec<(Vec<u8>, u64)> {
    rows.iter().map(|(k, n)| (k.to_vec(), *n)).collect()
}

const NOT_UTF8: &[u8] = b"top:\xff\xfe";

#[test]
fn standalone_top_sorts_cuts_and_keeps_a_keys_bytes() {
    let server = Server::with_module();
    let mut con = server.conn();
    deny(&mut con, b"top:a", 3);
    deny(&mut con, b"top:b", 1);
    deny(&mut con, b"top:c", 2);
    deny(&mut con, NOT_UTF8, 2);
    let all = want(&[(b"top:a", 3), (b"top:c", 2), (NOT_UTF8, 2), (b"top:b", 1)]);

    let mut limiter = RateLimiter::from_client(server.client(), GENEROUS);
    let top = limiter.top(10).unwrap();
    assert_eq!(rows(&top), all);
    let odd = &top[2];
    assert_eq!(odd.key, "top:\u{fffd}\u{fffd}");
    assert_eq!((odd.error, odd.shadow, odd.truncated), (0, 0, false));
    assert_eq!(rows(&limiter.top(2).unwrap()), all[..2]);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let limiter = AsyncRateLimiter::from_client(server.client(), GENEROUS);
        assert_eq!(rows(&limiter.top(10).await.unwrap()), all);
        assert_eq!(rows(&limiter.top(3).await.unwrap()), all[..3]);
        assert!(matches!(
            limiter.top(0).await,
            Err(Error::InvalidArgument(_))
        ));
    });
    assert!(matches!(limiter.top(0), Err(Error::InvalidArgument(_))));
}

/// The index of the master that owns `key`'s slot (the harness's ranges).
fn master_of(key: &[u8]) -> usize {
    let slot = key_slot(&String::from_utf8_lossy(key));
    match slot {
        0..=5460 => 0,
        5461..=10922 => 1,
        _ => 2,
    }
}

/// A hash tag per master: `top:{<tag>}` keys, one owned by each.
fn key_on(master: usize, name: &str) -> Vec<u8> {
    (0..)
        .map(|i| format!("top:{{{name}{i}}}").into_bytes())
        .find(|k| master_of(k) == master)
        .unwrap()
}

fn tb_top(node: &Server) -> usize {
    let rows: Vec<redis::Value> = redis::cmd("TB.TOP").query(&mut node.conn()).unwrap();
    rows.len()
}

#[test]
fn cluster_top_merges_every_masters_rows() {
    let cluster = Cluster::start(true);
    let mut con = cluster.client().get_connection().unwrap();
    let (a, b, c) = (key_on(0, "a"), key_on(1, "b"), key_on(2, "c"));
    let d = key_on(2, "d");
    // Not UTF-8, with a hash tag on master 1.
    let mut odd = b"top:\xff".to_vec();
    odd.extend_from_slice(&key_on(1, "e")[4..]);
    deny(&mut con, &a, 2);
    deny(&mut con, &b, 4);
    deny(&mut con, &c, 2);
    deny(&mut con, &d, 1);
    deny(&mut con, &odd, 3);
    // The rows are spread over the masters: the merge has work to do.
    let per_node: Vec<usize> = cluster.nodes.iter().map(tb_top).collect();
    assert_eq!(per_node, [1, 2, 2]);
    let mut two = [(a.clone(), 2), (c.clone(), 2)];
    two.sort();
    let all: Vec<(Vec<u8>, u64)> = [(b.clone(), 4), (odd.clone(), 3)]
        .into_iter()
        .chain(two)
        .chain([(d.clone(), 1)])
        .collect();

    let mut limiter = RateLimiter::new(cluster.client().get_connection().unwrap());
    let top = limiter.top(10).unwrap();
    assert_eq!(rows(&top), all);
    assert_eq!(top[1].key, String::from_utf8_lossy(&odd));
    assert_eq!(rows(&limiter.top(3).unwrap()), all[..3]);
    assert_eq!(rows(&limiter.top(1).unwrap()), all[..1]);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let con = cluster.client().get_async_connection().await.unwrap();
        let limiter = AsyncRateLimiter::new(con).with_timeouts(GENEROUS);
        assert_eq!(rows(&limiter.top(10).await.unwrap()), all);
        assert_eq!(rows(&limiter.top(4).await.unwrap()), all[..4]);
    });
}

fn is_unknown_command(e: &Error) -> bool {
    matches!(e, Error::Reply(r) if r.starts_with("ERR unknown command"))
}

#[test]
fn without_the_module_top_raises_the_servers_error() {
    let server = Server::without_module();
    let mut limiter = RateLimiter::from_client(server.client(), GENEROUS);
    let e = limiter.top(10).unwrap_err();
    assert!(is_unknown_command(&e), "{e:?}");
    let cluster = Cluster::start(false);
    let mut limiter = RateLimiter::new(cluster.client().get_connection().unwrap());
    let e = limiter.top(10).unwrap_err();
    assert!(is_unknown_command(&e), "{e:?}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let limiter = AsyncRateLimiter::from_client(server.client(), GENEROUS);
        let e = limiter.top(10).await.unwrap_err();
        assert!(is_unknown_command(&e), "{e:?}");
        let con = cluster.client().get_async_connection().await.unwrap();
        let limiter = AsyncRateLimiter::new(con).with_timeouts(GENEROUS);
        let e = limiter.top(10).await.unwrap_err();
        assert!(is_unknown_command(&e), "{e:?}");
    });
}

#[test]
fn a_user_without_the_grant_gets_noperm_and_no_server_is_unavailable() {
    let server = Server::with_module();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "limiter", "on", ">pw", "~*", "+@all", "-tb.top"][..])
        .query(&mut server.conn())
        .unwrap();
    let url = format!("redis://limiter:pw@127.0.0.1:{}/", server.port);
    let mut limiter = RateLimiter::from_client(redis::Client::open(url).unwrap(), GENEROUS);
    let e = limiter.top(10).unwrap_err();
    assert!(
        matches!(&e, Error::Reply(r) if r.starts_with("NOPERM")),
        "{e:?}"
    );

    let nowhere = format!("redis://127.0.0.1:{}/", free_port());
    let mut limiter = RateLimiter::open(nowhere.as_str()).unwrap();
    assert!(matches!(limiter.top(10), Err(Error::Unavailable(_))));
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let limiter = AsyncRateLimiter::connect_url(nowhere.as_str())
            .await
            .unwrap();
        assert!(matches!(limiter.top(10).await, Err(Error::Unavailable(_))));
    });
}
