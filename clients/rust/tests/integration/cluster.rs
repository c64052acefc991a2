//! A 3-master cluster, with the module on every node and without it (the
//! function library, loaded on every primary), through the redis-rs
//! cluster clients, sync and async.

use crate::api::GENEROUS;
use crate::common::*;
use redis_tb_client::{AsyncRateLimiter, Backend, Limit, RateLimiter};

fn dbsizes(cluster: &Cluster) -> Vec<i64> {
    cluster
        .nodes
        .iter()
        .map(|n| redis::cmd("DBSIZE").query(&mut n.conn()).unwrap())
        .collect()
}

fn run(module: bool) {
    let cluster = Cluster::start(module);
    let client = cluster.client();
    let expected = if module {
        Backend::Module
    } else {
        Backend::Function
    };

    let lines = Lines::default();
    let mut sync = RateLimiter::new(client.get_connection().unwrap()).with_logger(lines.logger());
    // Buckets on every node.
    for i in 0..12 {
        let d = sync.take(&format!("c:{i}"), 5, SLOW, 2).unwrap();
        assert_eq!((d.allowed, d.remaining), (true, 3), "c:{i}");
    }
    assert_eq!(sync.backend(), Some(expected));
    assert_eq!(lines.all().len(), 1, "{:?}", lines.all());
    assert!(
        dbsizes(&cluster).iter().all(|&n| n > 0),
        "{:?}",
        dbsizes(&cluster)
    );

    let limits = |day_cost: u32| {
        vec![
            Limit::new("{user:7}:sec", 5, SLOW).name("sec"),
            Limit::new("{user:7}:day", 3, SLOW)
                .name("day")
                .cost(day_cost),
        ]
    };
    let d = sync.take_all(&limits(1)).unwrap();
    assert_eq!((d.allowed, d.remaining, d.index), (true, 2, Some(1)));
    let e = sync
        .take_all(&[Limit::new("a", 5, SLOW), Limit::new("b", 5, SLOW)])
        .unwrap_err();
    assert!(
        e.reply().is_some() && e.to_string().to_lowercase().contains("crossslot"),
        "{e}"
    );

    // The async cluster client continues the same buckets.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let con = client.get_async_connection().await.unwrap();
        let l = AsyncRateLimiter::new(con).with_timeouts(GENEROUS);
        for i in 0..12 {
            let d = l.take(&format!("c:{i}"), 5, SLOW, 2).await.unwrap();
            assert_eq!((d.allowed, d.remaining), (true, 1), "c:{i}");
        }
        assert_eq!(l.backend(), Some(expected));
        let d = l.take_all(&limits(2)).await.unwrap();
        assert_eq!((d.allowed, d.remaining, d.index), (true, 0, Some(1)));
        let d = l.take_all(&limits(1)).await.unwrap();
        assert_eq!((d.allowed, d.remaining, d.index), (false, 0, Some(1)));
        assert_eq!(d.headers()[0].1, "\"sec\";q=5;w=5000, \"day\";q=3;w=3000");
        if !module {
            // The library flushed everywhere: loaded again on every primary.
            for node in &cluster.nodes {
                let _: () = redis::cmd("FUNCTION")
                    .arg("FLUSH")
                    .query(&mut node.conn())
                    .unwrap();
            }
            for i in 0..12 {
                let d = l.peek(&format!("c:{i}"), 5, SLOW, 1).await.unwrap();
                assert_eq!((d.allowed, d.remaining), (true, 0), "c:{i}");
            }
        }
    });
    if !module {
        for i in 0..12 {
            let d = sync.refund(&format!("c:{i}"), 5, SLOW, 1).unwrap();
            assert_eq!((d.allowed, d.remaining), (true, 2), "c:{i}");
        }
    }
}

#[test]
fn cluster_with_the_module() {
    run(true);
}

#[test]
fn cluster_without_the_module() {
    run(false);
}
