//! wait_take: TB.BTAKE on a dedicated connection with the module, polling
//! otherwise; the same observable results.

use crate::api::GENEROUS;
use crate::common::*;
use redis_tb_client::{AsyncRateLimiter, Backend, RateLimiter};
use std::time::{Duration, Instant};

fn waits_started(server: &Server) -> Option<i64> {
    let info: String = redis::cmd("INFO")
        .arg("tb")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("tb_waits_started:"))
        .map(|v| v.trim().parse::<f64>().unwrap() as i64)
}

#[test]
fn sync_wait_take_on_both() {
    for server in Server::both() {
        let mut l = RateLimiter::from_client(server.client(), GENEROUS);
        // 20 per second: a token every 50 ms after the drain.
        let started = Instant::now();
        assert!(l.take("w", 2, 20, 2).unwrap().allowed);
        let d = l.wait_take("w", 2, 20, 1, 5000).unwrap();
        let took = started.elapsed();
        assert!(d.allowed, "{d:?}");
        assert!(
            took >= Duration::from_millis(45) && took < Duration::from_secs(4),
            "{took:?}"
        );

        // Times out with a denial.
        assert!(l.take("slow", 2, SLOW, 2).unwrap().allowed);
        let started = Instant::now();
        let d = l.wait_take("slow", 2, SLOW, 1, 300).unwrap();
        let took = started.elapsed();
        assert!(!d.allowed && d.retry_after_ms > 0, "{d:?}");
        assert!(
            took >= Duration::from_millis(280) && took < Duration::from_secs(3),
            "{took:?}"
        );

        // Never possible: answered at once.
        let d = l.wait_take("slow", 2, SLOW, 3, 5000).unwrap();
        assert_eq!((d.allowed, d.retry_after_ms), (false, -1));

        // 0 = no limit.
        assert!(l.take("nolimit", 1, 20, 1).unwrap().allowed);
        assert!(l.wait_take("nolimit", 1, 20, 1, 0).unwrap().allowed);

        if server.module {
            assert_eq!(l.backend(), Some(Backend::Module));
            assert!(waits_started(&server).unwrap() >= 3, "TB.BTAKE was used");
        } else {
            assert_eq!(waits_started(&server), None);
        }
    }
}

/// The server's bound on `timeout_ms` is 2^53, judged on the exact text: 2^53 + 1 is refused
/// before anything is sent, on every backend (the module's TB.BTAKE and TB.ACQUIRE refuse it,
/// the Lua path would have clamped it), and 2^53 itself is a timeout like any other.
#[test]
fn a_timeout_above_2_pow_53_is_refused_before_sending_on_both() {
    let above = (1u64 << 53) + 1;
    for server in Server::both() {
        let mut l = RateLimiter::from_client(server.client(), GENEROUS);
        assert!(
            matches!(
                l.wait_take("big", 5, 1, 1, above),
                Err(redis_tb_client::Error::InvalidArgument(_))
            ),
            "module: {}",
            server.module
        );
        assert!(matches!(
            l.wait_acquire("big:jobs", 1, 1000, above),
            Err(redis_tb_client::Error::InvalidArgument(_))
        ));
        let exists: bool = redis::cmd("EXISTS")
            .arg("big")
            .query(&mut server.conn())
            .unwrap();
        assert!(!exists, "nothing sent");
        assert!(l.wait_take("big", 5, 1, 1, 1 << 53).unwrap().allowed);
        assert!(
            l.wait_acquire("big:jobs", 1, 1000, 1 << 53)
                .unwrap()
                .acquired
        );
    }
}

/// 10 tokens, 2/s, drained: the waiter is served when one token is back
/// (~500 ms) and takes it, so the bucket is full 5 s after the grant, not
/// 5.5 s after the wait began (what a reservation's reply says).
#[test]
fn a_grant_counts_its_reset_from_when_it_is_served() {
    for server in Server::both() {
        let mut l = RateLimiter::from_client(server.client(), GENEROUS);
        let started = Instant::now();
        assert!(l.take("reset", 10, 2, 10).unwrap().allowed);
        let d = l.wait_take("reset", 10, 2, 1, 5000).unwrap();
        let took_ms = started.elapsed().as_millis() as u64;
        assert!(d.allowed && d.retry_after_ms == 0, "{d:?}");
        // Served at most took_ms after the drain: at most 2 * took_ms / 1000
        // tokens back, one taken, so full in at least 5500 - took_ms ms (1 ms
        // of rounding).
        let least = 5500u64.saturating_sub(took_ms + 1);
        assert!(
            (least..=5000).contains(&d.reset_after_ms),
            "module {}: reset {} ms after a {took_ms} ms wait",
            server.module,
            d.reset_after_ms
        );
    }
}

#[test]
fn without_a_client_the_module_backend_polls_and_says_so() {
    let server = Server::with_module();
    let lines = Lines::default();
    let mut l = RateLimiter::new(server.conn()).with_logger(lines.logger());
    assert!(l.take("w", 2, 20, 2).unwrap().allowed);
    assert!(l.wait_take("w", 2, 20, 1, 3000).unwrap().allowed);
    assert!(l.take("w2", 2, 20, 2).unwrap().allowed);
    assert!(l.wait_take("w2", 2, 20, 1, 3000).unwrap().allowed);
    assert_eq!(waits_started(&server), Some(0));
    let polls: Vec<_> = lines
        .all()
        .into_iter()
        .filter(|(_, m)| m.contains("polls"))
        .collect();
    assert_eq!(polls.len(), 1, "{polls:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_wait_take_on_both() {
    for server in Server::both() {
        let l = AsyncRateLimiter::from_client(server.client(), GENEROUS);
        // 20 per second: a token every 50 ms after the drain.
        let started = Instant::now();
        assert!(l.take("w", 2, 20, 2).await.unwrap().allowed);
        let d = l.wait_take("w", 2, 20, 1, 5000).await.unwrap();
        let took = started.elapsed();
        assert!(d.allowed, "{d:?}");
        assert!(
            took >= Duration::from_millis(45) && took < Duration::from_secs(4),
            "{took:?}"
        );
        assert!(l.take("slow", 2, SLOW, 2).await.unwrap().allowed);
        let started = Instant::now();
        let d = l.wait_take("slow", 2, SLOW, 1, 300).await.unwrap();
        assert!(!d.allowed, "{d:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(280),
            "{:?}",
            started.elapsed()
        );
        // A waiter blocks only its own connection: other calls go on meanwhile,
        // answered long before the waiter's 3 s are out.
        let waiter = {
            let l = l.clone();
            tokio::spawn(async move { l.wait_take("slow", 2, SLOW, 1, 3000).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        let quick = Instant::now();
        assert!(l.take("other", 2, SLOW, 1).await.unwrap().allowed);
        assert!(
            quick.elapsed() < Duration::from_secs(2),
            "{:?}",
            quick.elapsed()
        );
        assert!(!waiter.await.unwrap().unwrap().allowed);
        if server.module {
            assert!(waits_started(&server).unwrap() >= 3);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_waiters_are_served_first_come_first_served() {
    let server = Server::with_module();
    let l = AsyncRateLimiter::from_client(server.client(), GENEROUS);
    assert!(l.take("fifo", 1, SLOW, 1).await.unwrap().allowed);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for name in ["first", "second"] {
        let (l, tx) = (l.clone(), tx.clone());
        tokio::spawn(async move {
            let d = l.wait_take("fifo", 1, SLOW, 1, 20_000).await.unwrap();
            tx.send((name, d.allowed)).unwrap();
        });
        // The first waiter is queued in the server before the second starts.
        let want = if name == "first" { 1 } else { 2 };
        let mut con = server.conn();
        wait_for("the waiter to queue", || {
            let info: String = redis::cmd("INFO").arg("tb").query(&mut con).unwrap();
            let waiting = info
                .lines()
                .find_map(|l| l.strip_prefix("tb_waiting:"))
                .map(|v| v.trim().parse::<f64>().unwrap() as i64);
            if waiting == Some(want) {
                Ok(())
            } else {
                Err(info)
            }
        });
    }
    for expected in ["first", "second"] {
        let _ = l.refund("fifo", 1, SLOW, 1).await.unwrap();
        let (name, allowed) = rx.recv().await.unwrap();
        assert_eq!((name, allowed), (expected, true));
    }
}

fn waiting(server: &Server) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("tb")
        .query(&mut server.conn())
        .unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("tb_waiting:"))
        .map(|v| v.trim().parse::<f64>().unwrap() as i64)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_waits_are_tb_btake_on_the_slot_owner_first_come_first_served() {
    let cluster = Cluster::start(true);
    let con = cluster.client().get_async_connection().await.unwrap();
    // Node 0 is only the seed: the key lives on node 2, found through MOVED.
    let l = AsyncRateLimiter::new(con)
        .with_timeouts(GENEROUS)
        .with_blocking_client(cluster.nodes[0].client());
    let key = (0..)
        .map(|i| format!("wait:{i}"))
        .find(|k| redis_tb_client::key_slot(k) > 10922)
        .unwrap();
    let owner = &cluster.nodes[2];
    assert!(l.take(&key, 1, SLOW, 1).await.unwrap().allowed);
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (want, name) in [(1, "first"), (2, "second")] {
        let (l, tx, key) = (l.clone(), tx.clone(), key.clone());
        tokio::spawn(async move {
            // 0: no limit.
            let d = l.wait_take(&key, 1, SLOW, 1, 0).await.unwrap();
            tx.send((name, d.allowed)).unwrap();
        });
        wait_for("the waiter to queue on the owner", || {
            match waiting(owner) {
                n if n == want => Ok(()),
                n => Err(format!("{n} waiting")),
            }
        });
    }
    for expected in ["first", "second"] {
        let _ = l.refund(&key, 1, SLOW, 1).await.unwrap();
        let (name, allowed) = rx.recv().await.unwrap();
        assert_eq!((name, allowed), (expected, true));
    }
    assert_eq!(
        waits_started(&cluster.nodes[0]),
        Some(0),
        "nothing waited on the seed"
    );
}

fn connected_clients(con: &mut redis::Connection) -> i64 {
    let info: String = redis::cmd("INFO").arg("clients").query(con).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("connected_clients:"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_releases_every_connection_the_limiter_opened() {
    let server = Server::with_module();
    let mut watcher = server.conn();
    let before = connected_clients(&mut watcher);
    let l = AsyncRateLimiter::from_client(server.client(), GENEROUS);
    assert!(l.take("c", 3, 20, 3).await.unwrap().allowed);
    let waits: Vec<_> = (0..3)
        .map(|_| {
            let l = l.clone();
            tokio::spawn(async move { l.wait_take("c", 3, 20, 1, 5000).await })
        })
        .collect();
    for w in waits {
        assert!(w.await.unwrap().unwrap().allowed);
    }
    // One shared connection and one per wait; a wait that began after another ended
    // reuses its idle connection (on a busy machine the 50 ms waits need not overlap).
    let during = connected_clients(&mut watcher);
    assert!(
        (before + 2..=before + 4).contains(&during),
        "one shared, up to three waits: {during} clients, {before} before"
    );

    l.close();
    wait_for("the connections to close", || {
        match connected_clients(&mut watcher) {
            n if n == before => Ok(()),
            n => Err(format!("{n} clients, {before} before")),
        }
    });
    // A call after close connects again.
    assert!(l.take("c2", 3, SLOW, 1).await.unwrap().allowed);

    let mut sync = RateLimiter::from_client(server.client(), GENEROUS);
    assert!(sync.take("s", 3, 20, 3).unwrap().allowed);
    assert!(sync.wait_take("s", 3, 20, 1, 5000).unwrap().allowed);
    let open = connected_clients(&mut watcher);
    sync.close();
    wait_for(
        "the sync connections to close",
        || match connected_clients(&mut watcher) {
            n if n == open - 2 => Ok(()),
            n => Err(format!("{n} clients, {open} open")),
        },
    );
}
