//! From the Lua fallback to the module on the same keys: nothing is lost.

use crate::api::GENEROUS;
use crate::common::*;
use redis_tb_client::{Backend, Limit, RateLimiter};

#[test]
fn module_after_script_continues_the_buckets() {
    let server = Server::start(false, &["--enable-module-command", "yes"]);
    let limits = || {
        vec![
            Limit::new("{m}:sec", 5, SLOW).name("sec"),
            Limit::new("{m}:day", 4, SLOW).name("day"),
        ]
    };
    let mut lua = RateLimiter::from_client(server.client(), GENEROUS);
    let mut remaining = Vec::new();
    for _ in 0..4 {
        remaining.push(lua.take("mig", 10, SLOW, 1).unwrap().remaining);
    }
    assert_eq!(remaining, [9, 8, 7, 6]);
    assert_eq!(lua.take_all(&limits()).unwrap().remaining, 3);
    assert_eq!(lua.backend(), Some(Backend::Function));
    // The script form writes the same buckets as the function form.
    let mut script =
        RateLimiter::from_client(server.client(), GENEROUS).with_backend(Backend::Script);
    assert_eq!(script.take("mig", 10, SLOW, 1).unwrap().remaining, 5);

    let _: () = redis::cmd("MODULE")
        .arg("LOAD")
        .arg(module_path().display().to_string())
        .query(&mut server.conn())
        .unwrap();
    let mut module = RateLimiter::from_client(server.client(), GENEROUS);
    let before = lua.peek("mig", 10, SLOW, 1).unwrap();
    let after = module.peek("mig", 10, SLOW, 1).unwrap();
    assert_eq!(module.backend(), Some(Backend::Module));
    assert_eq!((before.remaining, after.remaining), (4, 4));
    assert_eq!(module.take("mig", 10, SLOW, 1).unwrap().remaining, 4);
    assert_eq!(module.take("mig", 10, SLOW, 4).unwrap().remaining, 0);
    assert!(!module.take("mig", 10, SLOW, 1).unwrap().allowed);
    let d = module.take_all(&limits()).unwrap();
    assert_eq!((d.remaining, d.index), (2, Some(1)));
}
