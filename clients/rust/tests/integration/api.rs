//! Every API call on a server WITH the module and one WITHOUT it (Lua
//! function library), sync and async: identical decisions (modulo the few
//! ms between calls: rates are slow, so only the ms-valued waits may differ
//! slightly) and identical headers.

use crate::common::*;
use redis_tb_client::{AsyncRateLimiter, Backend, Decision, Error, Limit, RateLimiter, Timeouts};
use std::time::Duration;

pub const GENEROUS: Timeouts = Timeouts {
    connect: Duration::from_secs(5),
    command: Duration::from_secs(10),
};

#[derive(Debug, Clone)]
pub enum Step {
    Take(&'static str, f64, f64, f64),
    Peek(&'static str, f64, f64, f64),
    Refund(&'static str, f64, f64, f64),
    All(Vec<Limit>),
}

use Step::*;

pub fn scenario(prefix: &str) -> Vec<Step> {
    let k = |s: &str| -> &'static str { Box::leak(format!("{prefix}{s}").into_boxed_str()) };
    let (a, b, c) = (k("a"), k("b"), k("frac"));
    vec![
        Take(a, 10.0, SLOW, 1.0),
        Take(a, 10.0, SLOW, 9.0),
        Take(a, 10.0, SLOW, 1.0),
        Peek(a, 10.0, SLOW, 1.0),
        Refund(a, 10.0, SLOW, 3.0),
        Peek(a, 10.0, SLOW, 4.0),
        Take(a, 10.0, SLOW, 11.0),
        Take(b, 10.0, SLOW, 0.0),
        Take(c, 2.5, 0.0005, 1.5),
        Take(c, 2.5, 0.0005, 1.5),
        All(vec![
            Limit::new(format!("{{{prefix}}}:sec"), 5, SLOW).name("sec"),
            Limit::new(format!("{{{prefix}}}:day"), 3, SLOW),
        ]),
        All(vec![
            Limit::new(format!("{{{prefix}}}:sec"), 5, SLOW).name("sec"),
            Limit::new(format!("{{{prefix}}}:day"), 3, SLOW).cost(2),
        ]),
        All(vec![
            Limit::new(format!("{{{prefix}}}:sec"), 5, SLOW).name("sec"),
            Limit::new(format!("{{{prefix}}}:day"), 3, SLOW),
        ]),
        All(vec![
            Limit::new(format!("{{{prefix}}}:sec"), 5, SLOW)
                .cost(6)
                .name("sec"),
            Limit::new(format!("{{{prefix}}}:day"), 3, SLOW),
        ]),
    ]
}

/// Equal up to the waits' ms (a few ms pass between calls).
pub fn assert_same(x: &Decision, y: &Decision) {
    assert_eq!(
        (x.allowed, x.remaining, x.index, &x.policies),
        (y.allowed, y.remaining, y.index, &y.policies),
        "{x:?} vs {y:?}"
    );
    assert!(
        (x.retry_after_ms - y.retry_after_ms).abs() < 2000,
        "{x:?} vs {y:?}"
    );
    assert_eq!(x.retry_after_ms < 0, y.retry_after_ms < 0, "{x:?} vs {y:?}");
    assert!(
        x.reset_after_ms.abs_diff(y.reset_after_ms) < 2000,
        "{x:?} vs {y:?}"
    );
    assert_eq!(x.headers(), y.headers());
}

/// What the scenario must answer (checked on the module's run; the Lua run
/// must then match it).
fn check_expected(d: &[Decision]) {
    let basics: Vec<(bool, u64, Option<usize>)> = d
        .iter()
        .map(|d| (d.allowed, d.remaining, d.index))
        .collect();
    assert_eq!(
        basics,
        [
            (true, 9, None),
            (true, 0, None),
            (false, 0, None),
            (false, 0, None),
            (true, 3, None),
            (false, 3, None),
            (false, 3, None),
            (true, 10, None),
            (true, 1, None),
            (false, 1, None),
            (true, 2, Some(1)),
            (true, 0, Some(1)),
            (false, 0, Some(1)),
            (false, 3, Some(0)),
        ]
    );
    assert!(
        (990_000..=1_000_000).contains(&d[2].retry_after_ms),
        "{:?}",
        d[2]
    );
    assert_eq!(d[6].retry_after_ms, -1);
    assert_eq!(
        d[13].retry_after_ms, -1,
        "cost 6 > capacity 5 can never succeed"
    );
    let h = d[0].headers();
    assert_eq!(
        h[0],
        ("RateLimit-Policy", "\"default\";q=10;w=10000".into())
    );
    assert_eq!(h[1], ("RateLimit", "\"default\";r=9;t=1000".into()));
    assert_eq!(h.len(), 2);
    let h = d[2].headers();
    assert_eq!(h[2], ("Retry-After", "1000".into()));
    assert_eq!(
        d[6].headers().len(),
        2,
        "no Retry-After when waiting cannot help"
    );
    let h = d[12].headers();
    assert_eq!(h[0].1, "\"sec\";q=5;w=5000, \"limit1\";q=3;w=3000");
    assert!(h[1].1.starts_with("\"limit1\";r=0;t="), "{h:?}");
    assert_eq!(h[2].0, "Retry-After");
    assert_eq!(d[8].headers()[0].1, "\"default\";q=2;w=5000");
}

pub fn run_sync<C: redis::ConnectionLike>(l: &mut RateLimiter<C>, steps: &[Step]) -> Vec<Decision> {
    steps
        .iter()
        .map(|s| match s {
            Take(k, c, r, n) => l.take(k, *c, *r, *n),
            Peek(k, c, r, n) => l.peek(k, *c, *r, *n),
            Refund(k, c, r, n) => l.refund(k, *c, *r, *n),
            All(limits) => l.take_all(limits),
        })
        .collect::<Result<_, _>>()
        .unwrap()
}

pub async fn run_async<C>(l: &AsyncRateLimiter<C>, steps: &[Step]) -> Vec<Decision>
where
    C: redis::aio::ConnectionLike + Clone + Send + Sync + 'static,
{
    let mut out = Vec::new();
    for s in steps {
        out.push(
            match s {
                Take(k, c, r, n) => l.take(k, *c, *r, *n).await,
                Peek(k, c, r, n) => l.peek(k, *c, *r, *n).await,
                Refund(k, c, r, n) => l.refund(k, *c, *r, *n).await,
                All(limits) => l.take_all(limits).await,
            }
            .unwrap(),
        );
    }
    out
}

fn compare(runs: &[Vec<Decision>]) {
    check_expected(&runs[0]);
    for run in &runs[1..] {
        assert_eq!(run.len(), runs[0].len());
        for (x, y) in runs[0].iter().zip(run) {
            assert_same(x, y);
        }
    }
}

#[test]
fn sync_same_decisions_with_and_without_the_module() {
    let servers = Server::both();
    let mut runs = Vec::new();
    for (server, backend) in servers.iter().zip([Backend::Module, Backend::Function]) {
        let lines = Lines::default();
        let mut l = RateLimiter::from_client(server.client(), GENEROUS).with_logger(lines.logger());
        assert_eq!(l.backend(), None);
        runs.push(run_sync(&mut l, &scenario("s:")));
        assert_eq!(l.backend(), Some(backend));
        let all = lines.all();
        assert_eq!(all.len(), 1, "{all:?}");
        assert!(
            all[0]
                .1
                .starts_with(&format!("redis-tb backend: {backend} (")),
            "{all:?}"
        );
        // A plain redis::Connection works too.
        let mut plain = RateLimiter::new(server.conn());
        runs.push(run_sync(&mut plain, &scenario("p:")));
    }
    compare(&runs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn async_same_decisions_with_and_without_the_module() {
    let servers = Server::both();
    let mut runs = Vec::new();
    for (server, backend) in servers.iter().zip([Backend::Module, Backend::Function]) {
        let multiplexed = server
            .client()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let l = AsyncRateLimiter::new(multiplexed).with_timeouts(GENEROUS);
        assert_eq!(l.connect().await.unwrap(), backend);
        runs.push(run_async(&l, &scenario("m:")).await);
        let manager = AsyncRateLimiter::from_client(server.client(), GENEROUS);
        runs.push(run_async(&manager, &scenario("cm:")).await);
        assert_eq!(manager.backend(), Some(backend));
    }
    compare(&runs);
}

#[test]
fn forced_script_backend_matches_and_survives_script_flush() {
    let server = Server::without_module();
    let mut l = RateLimiter::from_client(server.client(), GENEROUS).with_backend(Backend::Script);
    let forced = run_sync(&mut l, &scenario("x:"));
    assert_eq!(l.backend(), Some(Backend::Script));
    check_expected(&forced);
    // NOSCRIPT: reloaded and retried once.
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    let d = l.take("x:after-flush", 3, SLOW, 1).unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 2));
    let d = l.take("x:after-flush", 3, SLOW, 1).unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 1));
    // The function library gone (FUNCTION FLUSH): loaded again.
    let mut f = RateLimiter::from_client(server.client(), GENEROUS);
    assert_eq!(f.connect().unwrap(), Backend::Function);
    let _: () = redis::cmd("FUNCTION")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    let d = f.take("x:after-flush", 3, SLOW, 1).unwrap();
    assert_eq!((d.allowed, d.remaining), (true, 0));
}

#[tokio::test]
async fn async_forced_script_survives_script_flush() {
    let server = Server::without_module();
    let l = AsyncRateLimiter::from_client(server.client(), GENEROUS).with_backend(Backend::Script);
    assert_eq!(l.take("y", 3, SLOW, 1).await.unwrap().remaining, 2);
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(l.take("y", 3, SLOW, 1).await.unwrap().remaining, 1);
}

#[test]
fn errors_are_the_same_on_both() {
    for server in Server::both() {
        let mut l = RateLimiter::from_client(server.client(), GENEROUS);
        // Refused before sending: what the server would refuse.
        assert!(matches!(
            l.take("e", 5, 0, 1),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            l.take("e", -1, 1, 1),
            Err(Error::InvalidArgument(_))
        ));
        // Refused by the server: a bug, with the server's text.
        let e = l
            .take_all(&[Limit::new("{d}x", 5, 1), Limit::new("{d}x", 5, 1)])
            .unwrap_err();
        assert_eq!(
            e.server_detail(),
            Some("each key may appear only once in TB.TAKEALL"),
            "{e}"
        );
        let _: () = redis::cmd("SET")
            .arg("str")
            .arg("x")
            .query(&mut server.conn())
            .unwrap();
        let e = l.take("str", 5, 1, 1).unwrap_err();
        assert!(e.reply().is_some_and(|r| r.starts_with("WRONGTYPE")), "{e}");
        // Refused before sending.
        assert!(matches!(
            l.take("e", f64::NAN, 1, 1),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            l.peek("e", 5, f64::INFINITY, 1),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(l.take_all(&[]), Err(Error::InvalidArgument(_))));
        let exists: bool = redis::cmd("EXISTS")
            .arg("e")
            .query(&mut server.conn())
            .unwrap();
        assert!(!exists);
    }
}

#[test]
fn buckets_are_the_modules_hash_with_its_expiry() {
    // Both write the same hash (tokens, last_refill) with an absolute expiry.
    for server in Server::both() {
        let mut l = RateLimiter::from_client(server.client(), GENEROUS);
        l.take("h", 10, 2, 3).unwrap();
        let mut con = server.conn();
        let tokens: String = redis::cmd("HGET")
            .arg("h")
            .arg("tokens")
            .query(&mut con)
            .unwrap();
        assert_eq!(tokens, "7");
        let pttl: i64 = redis::cmd("PTTL").arg("h").query(&mut con).unwrap();
        assert!((1..=1500).contains(&pttl), "{pttl}");
    }
}

/// Issue 26 (item 8): the two drivers share one builder, so every setting
/// is spelled the same on both, and both answer the same with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_limiters_take_the_same_settings() {
    macro_rules! configure {
        ($limiter:expr) => {
            $limiter
                .with_timeouts(GENEROUS)
                .with_policy_name("same")
                .with_module_recheck(Duration::from_secs(5))
                .with_lease_fail_open(true)
                .with_lease_poll(Duration::from_millis(20))
                .with_backend(Backend::Module)
                .on_unavailable(redis_tb_client::OnUnavailable::Local)
                .instances(2)
                .local_max_keys(100)
                .local_probe_ms(500)
                .cache_denials(true)
        };
    }
    let server = Server::with_module();
    let mut sync = configure!(RateLimiter::from_client(server.client(), GENEROUS));
    let asynchronous = configure!(AsyncRateLimiter::from_client(server.client(), GENEROUS));
    // The same answers (but for the ms between the two calls), and the
    // denial cached by both.
    let same = |d: &Decision| (d.allowed, d.remaining, d.policy.clone(), d.source());
    for _ in 0..3 {
        let a = sync.take("same:sync", 1, SLOW, 1).unwrap();
        let b = asynchronous.take("same:async", 1, SLOW, 1).await.unwrap();
        assert_eq!(same(&a), same(&b));
        assert!(
            a.retry_after_ms.abs_diff(b.retry_after_ms) < 1000,
            "{a:?} {b:?}"
        );
    }
    let a = sync.take("same:sync", 1, SLOW, 1).unwrap();
    assert_eq!(
        (a.allowed, a.source()),
        (false, redis_tb_client::Source::Cache)
    );
}
