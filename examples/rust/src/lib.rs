//! Calling redis-tb's `TB.TAKE` with the [`redis`] crate, and turning its reply
//! into HTTP rate-limit response headers.
//!
//! `TB.TAKE key capacity rate n` replies `[allowed, remaining, retry_after_ms,
//! reset_after_ms]`; [`Decision`] is that reply, and it implements
//! [`FromRedisValue`], so it works with any connection (sync, async, pooled,
//! cluster, pipelines):
//!
//! ```no_run
//! # fn main() -> redis::RedisResult<()> {
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let mut con = client.get_connection()?;
//! // 20 requests of burst, refilled at 5 per second; this request costs 1.
//! let d = redis_tb_client_example::take(&mut con, "ratelimit:user:42", 20.0, 5.0, 1.0)?;
//! for (name, value) in d.headers(20.0, 5.0) {
//!     println!("{name}: {value}");
//! }
//! if !d.allowed {
//!     // answer 429 Too Many Requests
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Headers
//!
//! [`Decision::headers`] follows the shape of
//! draft-ietf-httpapi-ratelimit-headers-07 (`RateLimit-Policy` and a single
//! `RateLimit` field); later drafts rename the parameters, and only this
//! function needs to change to follow them.
//!
//! | header              | value                                                     | when              |
//! |---------------------|-----------------------------------------------------------|-------------------|
//! | `RateLimit-Policy`  | `<limit>;w=<ceil(capacity / rate)>`                       | always            |
//! | `RateLimit`         | `limit=<limit>, remaining=<remaining>, reset=<ceil(reset_after_ms / 1000)>` | always |
//! | `Retry-After`       | `ceil(retry_after_ms / 1000)` seconds (at least 1)        | denied and retry is possible |
//!
//! `limit` is `floor(capacity)` (whole requests of cost 1). `w` is the time
//! to refill an empty bucket. `reset` is the time until the bucket is full
//! again. Seconds are always rounded *up*, so a client that waits as told is
//! never early.
//!
//! When the call can never succeed (`n > capacity`, reply `retry_after_ms =
//! -1`) there is no `Retry-After`: waiting does not help, and a client that
//! honours `Retry-After` would retry forever. Such a request is a
//! misconfiguration of its cost (or an over-sized batch) and is better
//! answered with a 4xx that says so; [`Decision::can_never_succeed`] tells
//! this case apart.
//!
//! # Failing open
//!
//! [`take`] returns the client error as it is. Whether a rate limiter that
//! cannot reach Redis lets requests through is the caller's choice; the
//! usual one (and the one in `src/bin/tb-headers.rs`) is to fail open: log a
//! warning and allow, with short connect/read timeouts so that an outage
//! does not also make every request slow.

use redis::{ConnectionLike, FromRedisValue, RedisResult, ToRedisArgs, Value};
use std::time::Duration;

/// The reply of `TB.TAKE` (and `TB.PEEK` / `TB.REFUND`): exactly the four
/// integers the module sends, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// The tokens were taken.
    pub allowed: bool,
    /// Whole tokens left after this call (or available now, when denied).
    pub remaining: u64,
    /// 0 when allowed; when denied the minimal wait in ms after which the same
    /// call would be allowed; -1 when it never can be (`n > capacity`).
    pub retry_after_ms: i64,
    /// Minimal wait in ms until the bucket is full again (0 if full).
    pub reset_after_ms: u64,
}

/// Builds `TB.TAKE key capacity rate n`, for use with `query`, `query_async`
/// or a pipeline.
pub fn take_cmd<K: ToRedisArgs>(key: K, capacity: f64, rate: f64, n: f64) -> redis::Cmd {
    let mut cmd = redis::cmd("TB.TAKE");
    cmd.arg(key).arg(capacity).arg(rate).arg(n);
    cmd
}

/// Takes `n` tokens from the bucket at `key` (burst `capacity`, refilled at
/// `rate` tokens per second).
///
/// Errors are the client's: connection and timeout errors, and the module's
/// argument errors (for example `rate must be a positive finite number`).
pub fn take<C, K>(con: &mut C, key: K, capacity: f64, rate: f64, n: f64) -> RedisResult<Decision>
where
    C: ConnectionLike,
    K: ToRedisArgs,
{
    take_cmd(key, capacity, rate, n).query(con)
}

/// Milliseconds to whole seconds, rounded up.
fn ceil_secs(ms: u64) -> u64 {
    ms.div_ceil(1000)
}

impl Decision {
    /// True when the call was denied and no wait would make it succeed
    /// (`n > capacity`).
    pub fn can_never_succeed(&self) -> bool {
        !self.allowed && self.retry_after_ms < 0
    }

    /// How long to wait before the same call would be allowed: `None` when
    /// allowed or when it never can be.
    pub fn retry_after(&self) -> Option<Duration> {
        match self.retry_after_ms {
            ms if !self.allowed && ms > 0 => Some(Duration::from_millis(ms as u64)),
            _ => None,
        }
    }

    /// Time until the bucket is full again.
    pub fn reset_after(&self) -> Duration {
        Duration::from_millis(self.reset_after_ms)
    }

    /// HTTP response headers for this decision, for a bucket of `capacity`
    /// refilled at `rate` per second (the same values given to `TB.TAKE`).
    /// See the crate documentation for the exact mapping.
    pub fn headers(&self, capacity: f64, rate: f64) -> Vec<(&'static str, String)> {
        // `as` saturates: NaN becomes 0 and huge values u64::MAX.
        let limit = capacity.floor() as u64;
        let window = ((capacity / rate).ceil() as u64).max(1);
        let mut headers = vec![
            ("RateLimit-Policy", format!("{limit};w={window}")),
            (
                "RateLimit",
                format!(
                    "limit={limit}, remaining={}, reset={}",
                    self.remaining,
                    ceil_secs(self.reset_after_ms)
                ),
            ),
        ];
        if let Some(wait) = self.retry_after() {
            headers.push((
                "Retry-After",
                ceil_secs(wait.as_millis() as u64).max(1).to_string(),
            ));
        }
        headers
    }
}

impl FromRedisValue for Decision {
    fn from_redis_value(v: &Value) -> RedisResult<Self> {
        let (allowed, remaining, retry_after_ms, reset_after_ms): (i64, u64, i64, u64) =
            FromRedisValue::from_redis_value(v)?;
        Ok(Decision {
            allowed: allowed == 1,
            remaining,
            retry_after_ms,
            reset_after_ms,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header<'a>(h: &'a [(&'static str, String)], name: &str) -> Option<&'a str> {
        h.iter().find(|(n, _)| *n == name).map(|(_, v)| v.as_str())
    }

    fn decision(allowed: bool, remaining: u64, retry: i64, reset: u64) -> Decision {
        Decision {
            allowed,
            remaining,
            retry_after_ms: retry,
            reset_after_ms: reset,
        }
    }

    #[test]
    fn allowed_has_no_retry_after() {
        let h = decision(true, 19, 0, 200).headers(20.0, 5.0);
        assert_eq!(
            h,
            vec![
                ("RateLimit-Policy", "20;w=4".to_string()),
                ("RateLimit", "limit=20, remaining=19, reset=1".to_string()),
            ]
        );
    }

    #[test]
    fn denied_rounds_retry_after_up() {
        let h = decision(false, 0, 1, 3999).headers(20.0, 5.0);
        assert_eq!(header(&h, "Retry-After"), Some("1"));
        assert_eq!(
            header(&h, "RateLimit"),
            Some("limit=20, remaining=0, reset=4")
        );
        let h = decision(false, 0, 1000, 4000).headers(20.0, 5.0);
        assert_eq!(header(&h, "Retry-After"), Some("1"));
        let h = decision(false, 0, 1001, 4000).headers(20.0, 5.0);
        assert_eq!(header(&h, "Retry-After"), Some("2"));
        let h = decision(false, 2, 120_500, 0).headers(20.0, 5.0);
        assert_eq!(header(&h, "Retry-After"), Some("121"));
    }

    #[test]
    fn never_possible_omits_retry_after() {
        let d = decision(false, 20, -1, 0);
        assert!(d.can_never_succeed());
        assert_eq!(d.retry_after(), None);
        let h = d.headers(20.0, 5.0);
        assert_eq!(header(&h, "Retry-After"), None);
        assert_eq!(
            header(&h, "RateLimit"),
            Some("limit=20, remaining=20, reset=0")
        );
    }

    #[test]
    fn full_bucket_resets_now() {
        let h = decision(true, 20, 0, 0).headers(20.0, 5.0);
        assert_eq!(
            header(&h, "RateLimit"),
            Some("limit=20, remaining=20, reset=0")
        );
    }

    #[test]
    fn policy_window_is_time_to_refill_rounded_up() {
        let d = decision(true, 0, 0, 0);
        assert_eq!(
            header(&d.headers(10.0, 3.0), "RateLimit-Policy"),
            Some("10;w=4")
        );
        assert_eq!(
            header(&d.headers(60.0, 1.0), "RateLimit-Policy"),
            Some("60;w=60")
        );
        assert_eq!(
            header(&d.headers(100.0, 0.5), "RateLimit-Policy"),
            Some("100;w=200")
        );
        // A window under a second still says 1, never 0.
        assert_eq!(
            header(&d.headers(5.0, 1000.0), "RateLimit-Policy"),
            Some("5;w=1")
        );
    }

    #[test]
    fn fractional_capacity_advertises_whole_requests() {
        let h = decision(true, 1, 0, 500).headers(2.5, 1.0);
        assert_eq!(header(&h, "RateLimit-Policy"), Some("2;w=3"));
        assert_eq!(
            header(&h, "RateLimit"),
            Some("limit=2, remaining=1, reset=1")
        );
    }

    #[test]
    fn parses_the_module_reply() {
        let v = Value::Array(vec![
            Value::Int(0),
            Value::Int(3),
            Value::Int(-1),
            Value::Int(250),
        ]);
        assert_eq!(
            Decision::from_redis_value(&v).unwrap(),
            decision(false, 3, -1, 250)
        );
        let v = Value::Array(vec![
            Value::Int(1),
            Value::Int(0),
            Value::Int(0),
            Value::Int(1),
        ]);
        assert_eq!(
            Decision::from_redis_value(&v).unwrap(),
            decision(true, 0, 0, 1)
        );
    }

    #[test]
    fn rejects_other_shapes() {
        let five = Value::Array((0..5).map(Value::Int).collect());
        assert!(Decision::from_redis_value(&five).is_err());
        assert!(Decision::from_redis_value(&Value::Int(1)).is_err());
    }

    #[test]
    fn builds_the_command() {
        let cmd = take_cmd("k", 20.0, 2.5, 1.0);
        let args: Vec<Vec<u8>> = cmd
            .args_iter()
            .map(|a| match a {
                redis::Arg::Simple(b) => b.to_vec(),
                redis::Arg::Cursor => unreachable!(),
            })
            .collect();
        let args: Vec<&str> = args
            .iter()
            .map(|a| std::str::from_utf8(a).unwrap())
            .collect();
        assert_eq!(args, ["TB.TAKE", "k", "20.0", "2.5", "1.0"]);
    }
}
