//! Keys no id can break (docs/clients.md#keys-no-id-can-break), in a real
//! 3-master cluster: the server's own CLUSTER KEYSLOT, and a two-limit
//! layer keyed on a header that the caller controls.

use crate::api::GENEROUS;
use crate::common::*;
use crate::web::{get_with, serve, x_user};
use redis_tb_client::{bucket_key, key_slot, AsyncRateLimiter, Policy, RateLimitLayer};

const HOSTILE: [&str; 8] = ["}", "}x", "}{", "{}", "{", "", "50%", "%7D"];

fn server_slot(con: &mut redis::Connection, key: &str) -> u16 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(con)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_ids_keep_every_bucket_of_a_caller_in_one_slot_and_are_limited() {
    let cluster = Cluster::start(true);
    let mut con = cluster.nodes[0].conn();
    for id in HOSTILE {
        let keys = [
            bucket_key("ratelimit:", id, "sec"),
            bucket_key("ratelimit:", id, "day"),
        ];
        let slots = keys.clone().map(|k| server_slot(&mut con, &k));
        assert_eq!(slots[0], slots[1], "{id:?}: {keys:?}");
        assert_eq!(
            key_slot(&keys[0]),
            slots[0],
            "our slot function agrees: {keys:?}"
        );
    }

    let limiter = AsyncRateLimiter::new(cluster.client().get_async_connection().await.unwrap())
        .with_timeouts(GENEROUS);
    let layer = RateLimitLayer::all(
        limiter,
        vec![Policy::new("sec", 2, SLOW), Policy::new("day", 3, SLOW)],
    )
    .unwrap()
    .key_fn(x_user);
    let addr = serve(layer).await;
    for id in HOSTILE.iter().filter(|id| !id.is_empty()) {
        let mut statuses = Vec::new();
        for _ in 0..3 {
            let r = get_with(addr, "/", &[("x-user", id)]).await;
            assert!(
                r.has_rate_limit_headers() || r.status == 429,
                "{id:?}: {}",
                r.body
            );
            statuses.push(r.status);
        }
        assert_eq!(
            statuses,
            [200, 200, 429],
            "{id:?}: limited, not let through"
        );
    }
}
