//! Concurrency leases (docs/leases.md) against real servers: the module,
//! and the Lua twin once lua/tb.lua has it; sync and async; guards released
//! on drop, on an early return and on a panic; renewal past lease_ms; lost
//! leases; wait_acquire woken by a release; failing open with the server down.

use crate::api::GENEROUS;
use crate::common::*;
use redis_tb_client::{
    AsyncRateLimiter, Backend, Error, LeaseDecision, Permit, RateLimiter, LUA_LIBRARY,
};
use std::time::{Duration, Instant};

/// The servers the lease tests run on: the module, and a server without it
/// once lua/tb.lua has the lease functions.
pub fn lease_servers() -> Vec<Server> {
    let mut servers = vec![Server::with_module()];
    if lua_has_leases() {
        servers.push(Server::without_module());
    }
    servers
}

pub fn lua_has_leases() -> bool {
    LUA_LIBRARY.contains("tb_acquire")
}

fn zcard(server: &Server, key: &str) -> i64 {
    redis::cmd("ZCARD")
        .arg(key)
        .query(&mut server.conn())
        .unwrap()
}

fn held(d: &LeaseDecision) -> &str {
    assert!(d.acquired, "{d:?}");
    d.lease.as_deref().unwrap()
}

#[test]
fn sync_acquire_release_renew() {
    for server in lease_servers() {
        let mut l = RateLimiter::from_client(server.client(), GENEROUS);
        let a = l.acquire("jobs", 2, 30_000).unwrap();
        assert_eq!((a.available, a.retry_after_ms, a.limit), (1, 0, 2), "{a:?}");
        let first = held(&a).to_string();
        let b = l.acquire("jobs", 2, 30_000).unwrap();
        assert_eq!(b.available, 0, "{b:?}");
        let second = held(&b).to_string();
        assert_ne!(first, second);

        let denied = l.acquire("jobs", 2, 30_000).unwrap();
        assert!(!denied.acquired && denied.lease.is_none(), "{denied:?}");
        assert!(
            denied.retry_after_ms > 29_000 && denied.retry_after_ms <= 30_000,
            "{denied:?}"
        );
        assert_eq!(denied.retry_after_secs(), Some(30));
        assert_eq!(
            denied.headers()[0].1,
            "\"default\";q=2;qu=\"concurrent-requests\""
        );

        assert!(l.release("jobs", &first).unwrap());
        assert!(
            !l.release("jobs", &first).unwrap(),
            "releasing twice is safe"
        );
        assert!(!l.release("jobs", "1-999").unwrap(), "never handed out");
        assert!(l.renew("jobs", &second, 60_000).unwrap());
        assert!(!l.renew("jobs", &first, 60_000).unwrap());
        assert_eq!(zcard(&server, "jobs"), 3, "one lease, seq and inc");
        assert!(l.acquire("jobs", 2, 30_000).unwrap().acquired);

        // Bad arguments never reach the server.
        assert!(matches!(
            l.acquire("jobs", 0, 1),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            l.acquire("jobs", 1, 0),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            l.renew("jobs", &second, 0),
            Err(Error::InvalidArgument(_))
        ));
        // Another type at the key is a bug, not an outage.
        let _: () = redis::cmd("SET")
            .arg("str")
            .arg("x")
            .query(&mut server.conn())
            .unwrap();
        let e = l.acquire("str", 1, 1000).unwrap_err();
        assert!(e.reply().unwrap().starts_with("WRONGTYPE"), "{e:?}");
        if server.module {
            assert_eq!(l.backend(), Some(Backend::Module));
        } else {
            assert_eq!(l.backend(), Some(Backend::Function));
        }
    }
}

#[test]
fn sync_script_backend_leases() {
    if !lua_has_leases() {
        return;
    }
    let server = Server::without_module();
    let mut l = RateLimiter::new(server.conn()).with_backend(Backend::Script);
    let a = l.acquire("s", 1, 30_000).unwrap();
    assert!(!l.acquire("s", 1, 30_000).unwrap().acquired);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    assert!(
        l.release("s", held(&a)).unwrap(),
        "EVAL again after NOSCRIPT"
    );
}

fn guarded_early_return(l: &mut RateLimiter, fail: bool) -> Result<(), String> {
    let permit = l.acquire_guard("g", 1, 30_000).map_err(|e| e.to_string())?;
    let _guard = permit.held().ok_or("denied")?;
    if fail {
        return Err("early".into());
    }
    Ok(())
}

#[test]
fn sync_guard_releases_on_drop_early_return_and_panic() {
    for server in lease_servers() {
        let mut l = RateLimiter::from_client(server.client(), GENEROUS);
        {
            let permit = l.acquire_guard("g", 1, 30_000).unwrap();
            let mut guard = permit.held().expect("held");
            assert!(!guard.is_lost());
            // The limiter stays usable through the guard.
            assert!(!guard.limiter().acquire("g", 1, 30_000).unwrap().acquired);
            assert!(guard.renew().unwrap());
        }
        assert_eq!(
            zcard(&server, "g"),
            2,
            "released on drop: only seq and inc are left"
        );

        assert_eq!(guarded_early_return(&mut l, true), Err("early".to_string()));
        assert_eq!(zcard(&server, "g"), 2, "released on the early return");

        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _guard = l.acquire_guard("g", 1, 30_000).unwrap().held().unwrap();
            panic!("the work failed");
        }));
        assert!(caught.is_err());
        assert_eq!(zcard(&server, "g"), 2, "released while the panic unwound");

        // An explicit release says whether the lease was still live.
        let guard = l.acquire_guard("g", 1, 30_000).unwrap().held().unwrap();
        assert!(guard.release().unwrap());
        // A denial holds nothing.
        let mut other = RateLimiter::from_client(server.client(), GENEROUS);
        let _held = l.acquire_guard("g", 1, 30_000).unwrap().held().unwrap();
        match other.acquire_guard("g", 1, 30_000).unwrap() {
            Permit::Denied(d) => assert!(d.retry_after_ms > 0, "{d:?}"),
            p => panic!("{p:?}"),
        };
    }
}

#[test]
fn sync_keep_alive_past_lease_ms_and_a_lost_lease_is_seen() {
    for server in lease_servers() {
        let mut l = RateLimiter::from_client(server.client(), GENEROUS);
        let mut other = RateLimiter::from_client(server.client(), GENEROUS);
        // keep_alive renews once 333 ms have passed: a pause of up to 667 ms
        // between two calls (a loaded machine) still finds the lease live.
        let mut guard = l.acquire_guard("k", 1, 1000).unwrap().held().unwrap();
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(1500) {
            assert!(guard.keep_alive().unwrap(), "{:?}", guard.lost_reason());
            std::thread::sleep(Duration::from_millis(30));
        }
        assert!(
            !other.acquire("k", 1, 1000).unwrap().acquired,
            "still held 1.5 lease_ms later"
        );
        drop(guard);
        assert!(other.acquire("k", 1, 300).unwrap().acquired);

        // Not renewed in time: the server ended it, the guard says so.
        let mut guard = l.acquire_guard("lost", 1, 100).unwrap().held().unwrap();
        std::thread::sleep(Duration::from_millis(250));
        assert!(!guard.renew().unwrap());
        assert!(guard.is_lost() && !guard.keep_alive().unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_acquire_release_renew_and_guards() {
    for server in lease_servers() {
        let l = AsyncRateLimiter::from_client(server.client(), GENEROUS);
        let a = l.acquire("ajobs", 1, 30_000).await.unwrap();
        assert!(!l.acquire("ajobs", 1, 30_000).await.unwrap().acquired);
        assert!(l.renew("ajobs", held(&a), 30_000).await.unwrap());
        assert!(l.release("ajobs", held(&a)).await.unwrap());
        assert!(!l.release("ajobs", held(&a)).await.unwrap());

        // Renewed by its task well past lease_ms, then released explicitly.
        let guard = l
            .acquire_guard("ag", 1, 1000)
            .await
            .unwrap()
            .held()
            .unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!guard.is_lost(), "{:?}", guard.lost_reason());
        assert!(!l.acquire("ag", 1, 1000).await.unwrap().acquired);
        assert!(guard.release().await.unwrap());
        assert!(l.acquire("ag", 1, 30_000).await.unwrap().acquired);

        // Dropped: released by a spawned task, long before lease_ms.
        let guard = l
            .acquire_guard("ad", 1, 30_000)
            .await
            .unwrap()
            .held()
            .unwrap();
        drop(guard);
        wait_released(&l, "ad").await;

        // A task that panics while holding a guard.
        let task = {
            let l = l.clone();
            tokio::spawn(async move {
                let _guard = l.acquire_guard("ap", 1, 30_000).await.unwrap().held();
                panic!("the work failed");
            })
        };
        assert!(task.await.is_err());
        wait_released(&l, "ap").await;

        // A future dropped mid-work (a timeout) drops its guard.
        let work = {
            let l = l.clone();
            async move {
                let _guard = l.acquire_guard("ac", 1, 30_000).await.unwrap().held();
                tokio::time::sleep(Duration::from_secs(60)).await;
            }
        };
        assert!(tokio::time::timeout(Duration::from_millis(200), work)
            .await
            .is_err());
        wait_released(&l, "ac").await;
    }
}

async fn wait_released<C>(l: &AsyncRateLimiter<C>, key: &str)
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let started = Instant::now();
    loop {
        let d = l.acquire(key, 1, 30_000).await.unwrap();
        if d.acquired {
            l.release(key, held(&d)).await.unwrap();
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{key} was not released"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_lost_lease_is_observable() {
    for server in lease_servers() {
        let l = AsyncRateLimiter::from_client(server.client(), GENEROUS);
        let guard = l
            .acquire_guard("alost", 1, 300)
            .await
            .unwrap()
            .held()
            .unwrap();
        let mut watch = guard.watch();
        // Someone deletes the lease set: the next renewal finds it gone.
        let _: () = redis::cmd("DEL")
            .arg("alost")
            .query(&mut server.conn())
            .unwrap();
        let why = tokio::time::timeout(Duration::from_secs(3), guard.lost())
            .await
            .expect("lost within a few renewals");
        assert!(why.contains("no longer holds"), "{why}");
        assert!(guard.is_lost());
        assert!(watch.borrow_and_update().is_some());
        assert!(!guard.release().await.unwrap());
    }
}

#[test]
fn sync_wait_acquire_is_woken_by_a_release() {
    for server in lease_servers() {
        let mut l = RateLimiter::from_client(server.client(), GENEROUS);
        let holder = l.acquire("w", 1, 30_000).unwrap();
        let id = held(&holder).to_string();
        let client = server.client();
        // Timed from before the releaser starts: it releases 300 ms or more later.
        let started = Instant::now();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let mut r = RateLimiter::from_client(client, GENEROUS);
            r.release("w", &id).unwrap()
        });
        let d = l.wait_acquire("w", 1, 30_000, 10_000).unwrap();
        let took = started.elapsed();
        assert!(releaser.join().unwrap());
        assert!(d.acquired, "{d:?}");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "woken by the release, not the lease's end: {took:?}"
        );

        // Times out with a denial.
        let started = Instant::now();
        let d = l.wait_acquire("w", 1, 30_000, 300).unwrap();
        assert!(!d.acquired && d.retry_after_ms > 0, "{d:?}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(280) && took < Duration::from_secs(3),
            "{took:?}"
        );
        // A free slot: at once.
        assert!(l.wait_acquire("w2", 1, 30_000, 0).unwrap().acquired);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_wait_acquire_guard_is_woken_by_a_release() {
    for server in lease_servers() {
        let l = AsyncRateLimiter::from_client(server.client(), GENEROUS);
        let first = l
            .acquire_guard("aw", 1, 30_000)
            .await
            .unwrap()
            .held()
            .unwrap();
        // Timed from before the waiter starts: the release comes 300 ms or more later.
        let started = Instant::now();
        let waiter = {
            let l = l.clone();
            tokio::spawn(async move {
                let permit = l.wait_acquire_guard("aw", 1, 30_000, 0).await.unwrap();
                (permit.held().map(|g| g.id().to_string()), started.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(first.release().await.unwrap());
        let (id, took) = tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken")
            .unwrap();
        assert!(id.is_some());
        assert!(took >= Duration::from_millis(300), "{took:?}");
        // The waiter's guard was dropped with its task: released.
        wait_released(&l, "aw").await;
    }
}

#[test]
fn fail_open_and_closed_with_the_server_down() {
    let server = Server::not_started(true);
    let timeouts = redis_tb_client::Timeouts::default();
    let mut closed = RateLimiter::from_client(server.client(), timeouts);
    let started = Instant::now();
    assert!(matches!(
        closed.acquire("f", 1, 1000),
        Err(Error::Unavailable(_))
    ));
    assert!(matches!(
        closed.acquire_guard("f", 1, 1000),
        Err(Error::Unavailable(_))
    ));
    let mut open = RateLimiter::from_client(server.client(), timeouts).with_lease_fail_open(true);
    match open.acquire_guard("f", 1, 1000).unwrap() {
        Permit::FailedOpen(e) => assert!(e.is_unavailable()),
        p => panic!("{p:?}"),
    }
    assert!(open
        .wait_acquire_guard("f", 1, 1000, 100)
        .unwrap()
        .may_proceed());
    // The plain calls, asked to fail open: acquired, no id, failed_open.
    for d in [
        open.acquire("f", 1, 1000).unwrap(),
        open.wait_acquire("f", 1, 1000, 100).unwrap(),
    ] {
        assert!(d.acquired && d.failed_open && d.lease.is_none(), "{d:?}");
        assert_eq!((d.limit, d.lease_ms, d.key.as_str()), (1, 1000, "f"));
        assert!(d.headers().is_empty(), "{d:?}");
        // Nothing to give back: false, and no call (the server is down).
        assert!(!open.release("f", &d).unwrap());
        assert!(!open.release("f", &d.lease).unwrap());
        assert!(!open.renew("f", &d, 1000).unwrap());
        assert!(!closed.release("f", None::<&str>).unwrap());
    }
    assert!(matches!(
        closed.wait_acquire("f", 1, 1000, 100),
        Err(Error::Unavailable(_))
    ));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "a refused connection fails at once: {:?}",
        started.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_fail_open_with_the_server_down() {
    let server = Server::not_started(true);
    let closed = AsyncRateLimiter::from_client(server.client(), Default::default());
    assert!(matches!(
        closed.acquire_guard("f", 1, 1000).await,
        Err(Error::Unavailable(_))
    ));
    assert!(matches!(
        closed.acquire("f", 1, 1000).await,
        Err(Error::Unavailable(_))
    ));
    let open = closed.clone().with_lease_fail_open(true);
    assert!(matches!(
        open.acquire_guard("f", 1, 1000).await.unwrap(),
        Permit::FailedOpen(_)
    ));
    for d in [
        open.acquire("f", 1, 1000).await.unwrap(),
        open.wait_acquire("f", 1, 1000, 100).await.unwrap(),
    ] {
        assert!(d.acquired && d.failed_open && d.lease.is_none(), "{d:?}");
        assert!(!open.release("f", &d).await.unwrap());
        assert!(!closed.renew("f", &d.lease, 1000).await.unwrap());
    }
}

fn lease_key_on_node(node: usize) -> String {
    let (first, last) = [(0, 5460), (5461, 10922), (10923, 16383)][node];
    (0..)
        .map(|i| format!("lease:{i}"))
        .find(|k| (first..=last).contains(&redis_tb_client::key_slot(k)))
        .unwrap()
}

#[test]
fn cluster_wait_acquire_goes_to_the_slot_owner() {
    let cluster = Cluster::start(true);
    // Node 0 is only the seed of the blocking client: the key lives on node 1.
    let key = lease_key_on_node(1);
    let mut l = RateLimiter::new(cluster.client().get_connection().unwrap())
        .with_blocking_client(cluster.nodes[0].client());
    let holder = l.acquire(&key, 1, 30_000).unwrap();
    let id = held(&holder).to_string();
    let (urls, k2) = (cluster.urls(), key.clone());
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        let client = redis::cluster::ClusterClient::new(urls).unwrap();
        let mut r = RateLimiter::new(client.get_connection().unwrap());
        r.release(&k2, &id).unwrap()
    });
    let started = Instant::now();
    let d = l.wait_acquire(&key, 1, 30_000, 5000).unwrap();
    assert!(releaser.join().unwrap());
    assert!(d.acquired, "{d:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(l.release(&key, held(&d)).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_async_waiters_are_served_first_come_first_served_on_the_owner() {
    let cluster = Cluster::start(true);
    let con = cluster.client().get_async_connection().await.unwrap();
    let l = AsyncRateLimiter::new(con)
        .with_timeouts(GENEROUS)
        .with_blocking_client(cluster.nodes[0].client());
    let key = lease_key_on_node(2);
    let holder = l.acquire(&key, 1, 30_000).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    for (want, name) in [(1, "first"), (2, "second")] {
        let (l, tx, key) = (l.clone(), tx.clone(), key.clone());
        tokio::spawn(async move {
            let d = l.wait_acquire(&key, 1, 30_000, 0).await.unwrap();
            tx.send((name, d)).unwrap();
        });
        // The first waiter is queued in the server before the second starts.
        wait_for(
            "the waiter to block on the owner",
            || match blocked_clients(&cluster.nodes[2]) {
                n if n == want => Ok(()),
                n => Err(format!("{n} blocked")),
            },
        );
    }
    let mut lease = holder.lease.unwrap();
    for expected in ["first", "second"] {
        assert!(l.release(&key, &lease).await.unwrap());
        let (name, d) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("a waiter was woken")
            .unwrap();
        assert_eq!((name, d.acquired), (expected, true), "{d:?}");
        lease = d.lease.unwrap();
    }
}

#[test]
fn polling_wait_acquire_hears_a_release_within_the_poll_cap() {
    // No blocking client: wait_acquire polls, also with the module (and so
    // does every wait on Lua). The poll sleeps at most 100 ms, not the
    // retry_after_ms of a 30 s lease.
    for server in lease_servers() {
        let lines = Lines::default();
        let mut l = RateLimiter::new(server.conn()).with_logger(lines.logger());
        let holder = l.acquire("p", 1, 30_000).unwrap();
        let (client, id) = (server.client(), held(&holder).to_string());
        // Timed from before the releaser starts: it releases 300 ms or more later.
        let started = Instant::now();
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let mut r = RateLimiter::from_client(client, GENEROUS);
            r.release("p", &id).unwrap()
        });
        let d = l.wait_acquire("p", 1, 30_000, 10_000).unwrap();
        let took = started.elapsed();
        assert!(releaser.join().unwrap());
        assert!(d.acquired, "{d:?}");
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(5),
            "heard within the poll cap, not at the lease's end in 30 s: {took:?}"
        );
        // Timed out: the last denial, after about the timeout.
        let started = Instant::now();
        assert!(!l.wait_acquire("p", 1, 30_000, 250).unwrap().acquired);
        assert!(started.elapsed() >= Duration::from_millis(240));
        if server.module {
            let polls = lines
                .all()
                .into_iter()
                .filter(|(_, m)| m.contains("polls"))
                .count();
            assert_eq!(polls, 1, "{:?}", lines.all());
        }
    }
}

#[test]
fn server_changes_are_detected_again_for_leases() {
    if !lua_has_leases() {
        eprintln!("SKIPPED: lua/tb.lua has no acquire/release/renew yet");
        return;
    }
    // The module goes away: the next lease call moves to Lua, once.
    let mut server = Server::with_module();
    let lines = Lines::default();
    let mut l = RateLimiter::from_client(server.client(), GENEROUS).with_logger(lines.logger());
    assert!(l.acquire("sc", 2, 30_000).unwrap().acquired);
    assert_eq!(l.backend(), Some(Backend::Module));
    server.restart_with_module(false);
    // The first call after the restart may meet the old, closed connection.
    let d = wait_for("the restarted server", || {
        l.acquire("sc", 2, 30_000).map_err(|e| e.to_string())
    });
    assert!(d.acquired, "{d:?}");
    assert_eq!(l.backend(), Some(Backend::Function));
    assert!(lines
        .all()
        .iter()
        .any(|(level, m)| *level == log::Level::Warn && m.contains("module is gone")));
    // The function library is flushed: loaded again, the call retried.
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    assert!(l.release("sc", held(&d)).unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_that_cannot_renew_for_lease_ms_is_lost() {
    let server = Server::with_module();
    let l = AsyncRateLimiter::from_client(server.client(), redis_tb_client::Timeouts::default());
    let mut guard = None;
    // The 200 ms default timeouts can miss right after a start.
    for _ in 0..50 {
        if let Ok(Permit::Held(g)) = l.acquire_guard("hung", 1, 600).await {
            guard = Some(g);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let guard = guard.expect("acquired");
    server.signal(libc::SIGSTOP);
    let outcome = tokio::time::timeout(Duration::from_secs(5), guard.lost()).await;
    server.signal(libc::SIGCONT);
    let why = outcome.expect("lost while the server hung");
    assert!(why.contains("within lease_ms"), "{why}");
    assert!(guard.is_lost());
}

#[test]
fn the_poll_of_wait_acquire_is_the_limiters_poll_ms() {
    // Lua: wait_acquire polls every min(retry_after_ms, poll_ms). With a
    // 1500 ms poll, a release 600 ms in (after the first try, however late
    // this thread runs, up to 600 ms) is heard at the second try, ~1500 ms.
    let server = Server::without_module();
    let mut l = RateLimiter::new(server.conn()).with_lease_poll(Duration::from_millis(1500));
    let holder = l.acquire("pp", 1, 30_000).unwrap();
    let (client, id) = (server.client(), held(&holder).to_string());
    let releaser = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(600));
        let mut r = RateLimiter::from_client(client, GENEROUS);
        r.release("pp", &id).unwrap()
    });
    let started = Instant::now();
    let d = l.wait_acquire("pp", 1, 30_000, 10_000).unwrap();
    let took = started.elapsed();
    assert!(releaser.join().unwrap());
    assert!(d.acquired, "{d:?}");
    assert!(
        took >= Duration::from_millis(1400) && took < Duration::from_secs(5),
        "{took:?}"
    );
    // The time left still caps the sleep: the denial comes at the timeout.
    let started = Instant::now();
    assert!(!l.wait_acquire("pp", 1, 30_000, 200).unwrap().acquired);
    assert!(started.elapsed() < Duration::from_millis(1400));
}
