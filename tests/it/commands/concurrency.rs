//! Many clients at once: the total granted is exactly what the arithmetic allows.
//!
//! Each thread has its own connection; a barrier starts them together so their commands
//! interleave on the server. Rates are tiny (one token per 1000 s), so over the few seconds a
//! test runs the refill adds well under one token: the exact bound `floor(capacity + rate *
//! elapsed)` equals the capacity, and is also asserted as computed from the measured time.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::Instant;

use crate::harness::*;

const THREADS: usize = 8;
/// One token per 1000 s.
const SLOW: &str = "0.001";
const SLOW_PER_SEC: f64 = 0.001;

/// Runs `work(thread_index, connection)` on `THREADS` threads started together; returns
/// their results in thread order and the wall time they took, in seconds.
fn hammer<T: Send + 'static>(
    server: &Server,
    work: impl Fn(usize, &mut redis::Connection) -> T + Send + Sync + 'static,
) -> (Vec<T>, f64) {
    let work = Arc::new(work);
    let barrier = Arc::new(Barrier::new(THREADS));
    let started = Instant::now();
    let handles: Vec<_> = (0..THREADS)
        .map(|index| {
            let mut con = server.conn();
            let work = Arc::clone(&work);
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                work(index, &mut con)
            })
        })
        .collect();
    let results = handles
        .into_iter()
        .map(|h| h.join().expect("client thread panicked"))
        .collect();
    (results, started.elapsed().as_secs_f64())
}

/// The most a bucket may grant in `elapsed_s`: a full bucket plus the refill, whole tokens.
fn refill_bound(capacity: f64, elapsed_s: f64) -> i64 {
    (capacity + SLOW_PER_SEC * elapsed_s).floor() as i64
}

#[test]
fn many_clients_on_one_bucket_get_exactly_its_capacity() {
    const CALLS: usize = 500;
    let server = Server::start();
    let (replies, elapsed_s) = hammer(&server, |_, con| {
        (0..CALLS)
            .map(|_| take(con, "shared", "1000", SLOW, "1"))
            .collect::<Vec<_>>()
    });
    let replies: Vec<Vec<i64>> = replies.into_iter().flatten().collect();
    assert_eq!(replies.len(), THREADS * CALLS);
    let allowed = replies.iter().filter(|r| r[0] == 1).count() as i64;
    assert!(
        allowed <= refill_bound(1000.0, elapsed_s),
        "{allowed} granted"
    );
    assert_eq!(allowed, 1000, "4000 requests on a bucket of 1000");

    // Each allowed call saw a different count: 999, 998, ..., 0, each exactly once.
    let mut remaining: Vec<i64> = replies.iter().filter(|r| r[0] == 1).map(|r| r[1]).collect();
    remaining.sort_unstable();
    assert_eq!(remaining, (0..1000).collect::<Vec<i64>>());
    // Every denial saw an empty bucket and a wait of up to one token's time.
    for reply in replies.iter().filter(|r| r[0] == 0) {
        assert_eq!(reply[1], 0, "{reply:?}");
        assert!((1..=1_000_000).contains(&reply[2]), "{reply:?}");
    }
    let stored = stored_tokens(&mut server.conn(), "shared");
    assert!((0.0..1.0).contains(&stored), "stored tokens {stored}");
}

#[test]
fn many_clients_on_many_buckets_get_exactly_each_capacity() {
    // Per thread: 4 buckets of its own (capacity 30, 50 calls each) and 4 shared by all
    // (capacity 100, 50 calls each from every thread: 400 in all).
    const OWN: usize = 4;
    const SHARED: usize = 4;
    const CALLS_PER_KEY: usize = 50;
    let server = Server::start();
    let (counts, elapsed_s) = hammer(&server, |thread_index, con| {
        let mut own = [0i64; OWN];
        let mut shared = [0i64; SHARED];
        for round in 0..CALLS_PER_KEY {
            for (slot, own_granted) in own.iter_mut().enumerate() {
                // Threads walk the shared keys in different orders.
                let shared_slot = (slot + thread_index + round) % SHARED;
                let key = format!("shared:{shared_slot}");
                shared[shared_slot] += take(con, &key, "100", SLOW, "1")[0];
                let key = format!("own:{thread_index}:{slot}");
                *own_granted += take(con, &key, "30", SLOW, "1")[0];
            }
        }
        (own, shared)
    });
    let mut con = server.conn();
    for (thread_index, (own, _)) in counts.iter().enumerate() {
        for (slot, granted) in own.iter().enumerate() {
            assert!(*granted <= refill_bound(30.0, elapsed_s));
            assert_eq!(*granted, 30, "own:{thread_index}:{slot}");
        }
    }
    for slot in 0..SHARED {
        let granted: i64 = counts.iter().map(|(_, shared)| shared[slot]).sum();
        assert!(granted <= refill_bound(100.0, elapsed_s));
        assert_eq!(granted, 100, "shared:{slot}");
        let stored = stored_tokens(&mut con, &format!("shared:{slot}"));
        assert!((0.0..1.0).contains(&stored), "shared:{slot}: {stored}");
    }
}

#[test]
fn many_clients_taking_varied_amounts_never_overdraw_a_bucket() {
    // n cycles through 1..=5, so the last tokens go to whoever asks for few enough: the
    // grants plus what is left must add up to the capacity, to within the refill.
    const CALLS: usize = 300;
    let server = Server::start();
    let (results, elapsed_s) = hammer(&server, |thread_index, con| {
        let mut granted = 0i64;
        for call in 0..CALLS {
            let n = 1 + (call + thread_index) % 5;
            let reply = take(con, "varied", "777", SLOW, &n.to_string());
            if reply[0] == 1 {
                granted += n as i64;
            } else {
                // A denial is only right when fewer than n whole tokens are left.
                assert!(reply[1] < n as i64, "denied {n} with {reply:?}");
            }
        }
        granted
    });
    let granted: i64 = results.iter().sum();
    let left = stored_tokens(&mut server.conn(), "varied");
    let refill = SLOW_PER_SEC * elapsed_s;
    assert!(granted <= refill_bound(777.0, elapsed_s));
    assert!(
        granted as f64 + left >= 777.0 - 1e-9 && granted as f64 + left <= 777.0 + refill + 1e-9,
        "granted {granted} + left {left} != 777 (+ refill {refill})"
    );
    // Had 5 or more been left at the end, every request for 5 would have been granted: 480
    // of them, 2400 tokens, more than the bucket ever held.
    assert!(left < 5.0, "{left} left");
}

#[test]
fn takeall_under_contention_charges_every_bucket_or_none() {
    // Each thread alternates TB.TAKEALL over [shared A (100), shared B (60), its own C (1000)]
    // with a lone TB.TAKE on A. A takeall that is charged takes 1 from each of its three
    // buckets, so: B's grants = takeall grants, C_t's = thread t's takeall grants, and A's =
    // takeall grants + lone grants. Nothing else can explain the stored tokens.
    const ROUNDS: usize = 100;
    let server = Server::start();
    let (results, elapsed_s) = hammer(&server, |thread_index, con| {
        let own = format!("C:{thread_index}");
        let (mut all_granted, mut lone_granted) = (0i64, 0i64);
        for _ in 0..ROUNDS {
            let reply: Vec<i64> = redis::cmd("TB.TAKEALL")
                .arg("A")
                .arg("100")
                .arg(SLOW)
                .arg("1")
                .arg("B")
                .arg("60")
                .arg(SLOW)
                .arg("1")
                .arg(&own)
                .arg("1000")
                .arg(SLOW)
                .arg("1")
                .query(con)
                .expect("TB.TAKEALL");
            assert_eq!(reply.len(), 5);
            if reply[0] == 1 {
                all_granted += 1;
            } else {
                // The deciding bucket is one of the shared ones, and it is empty.
                assert!(reply[4] == 0 || reply[4] == 1, "{reply:?}");
                assert_eq!(reply[1], 0, "{reply:?}");
            }
            lone_granted += take(con, "A", "100", SLOW, "1")[0];
        }
        (all_granted, lone_granted)
    });
    let mut con = server.conn();
    let all: i64 = results.iter().map(|r| r.0).sum();
    let lone: i64 = results.iter().map(|r| r.1).sum();
    let consumed = |con: &mut redis::Connection, key: &str, capacity: f64| {
        let stored = stored_tokens(con, key);
        assert!(stored >= 0.0, "{key}: {stored}");
        // Whole takes of 1; the refill adds less than one token.
        (capacity - stored).ceil() as i64
    };
    assert!(all + lone <= refill_bound(100.0, elapsed_s));
    assert_eq!(all + lone, 100, "A ran dry: 800 requests for 100 tokens");
    assert_eq!(consumed(&mut con, "A", 100.0), all + lone, "A");
    assert_eq!(consumed(&mut con, "B", 60.0), all, "B");
    for (thread_index, (thread_all, _)) in results.iter().enumerate() {
        let key = format!("C:{thread_index}");
        if *thread_all == 0 {
            assert!(!exists(&mut con, &key), "{key} charged without a grant");
        } else {
            assert_eq!(consumed(&mut con, &key, 1000.0), *thread_all, "{key}");
        }
    }
}
