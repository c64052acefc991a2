//! TB.TOP: the keys denied most, from one summary per server process
//! (`redis_tb_core::top`), fed by every denial the module answers:
//! TB.TAKE, TB.BTAKE (at once or at its timeout), TB.THROTTLE, TB.ACQUIRE,
//! and TB.TAKEALL's deciding key; never TB.PEEK.
//!
//! The summary is memory only: not replicated (a replica applies the
//! master's writes, never its commands, so it counts nothing), not
//! persisted, empty after a restart and after `TB.TOP RESET`. In a cluster
//! each node answers for its own keys.

use std::sync::atomic::Ordering::Relaxed;

use redis_tb_core::error::TbError;
use redis_tb_core::top::{parse_top_args, Top, TopRequest};

use super::config::{TOP_SLOTS, TOP_WINDOW_MS};
use super::context::Context;
use super::machines::MainThread;
use super::reply::{entry_point, Reply};
use super::strings::ServerStr;

static TOP: MainThread<Top> = MainThread::new();

/// Runs `f` on the summary, made anew when `tb.top-slots` changed and
/// told a changed `tb.top-window-ms`; `None` when it is off (0 slots).
fn with_top<R>(now_ms: i64, f: impl FnOnce(&mut Top) -> R) -> Option<R> {
    let slots = usize::try_from(TOP_SLOTS.load(Relaxed)).unwrap_or(0);
    let window_ms = TOP_WINDOW_MS.load(Relaxed);
    let make = || Top::new(slots, window_ms, now_ms);
    TOP.with(make, |top| {
        if top.slot_limit() != slots {
            *top = make();
        }
        if top.window_ms() != window_ms {
            top.set_window_ms(window_ms);
        }
        (slots > 0).then(|| f(top))
    })
    .flatten()
}

/// Drops the summary: at unload, so its memory goes with the module, and at
/// load, so a reload starts empty.
pub fn forget() {
    TOP.forget();
}

/// Counts one denial of `key` at `now_ms` (`shadow`: shadow mode reported
/// it as allowed).
#[inline]
pub fn denied(key: &[u8], shadow: bool, now_ms: i64) {
    if TOP_SLOTS.load(Relaxed) == 0 {
        return;
    }
    with_top(now_ms, |top| top.observe(key, shadow, now_ms));
}

/// TB.TOP [COUNT k] | TB.TOP RESET
///
/// The most-denied keys over at least the last `tb.top-window-ms`, the
/// most denied first: `[key, count, error, shadow, truncated]` rows.
fn top(ctx: Context, args: &[ServerStr]) -> Result<Reply, TbError> {
    let words: Vec<&[u8]> = args.iter().skip(1).map(ServerStr::bytes).collect();
    let request = parse_top_args(&words)?;
    let now_ms = ctx.now_ms();
    match request {
        TopRequest::Reset => {
            with_top(now_ms, |top| top.reset(now_ms));
            Ok(Reply::Ok)
        }
        TopRequest::List { rows } => {
            let mut listed = with_top(now_ms, |top| top.rows(now_ms)).unwrap_or_default();
            listed.truncate(rows);
            Ok(Reply::Top(listed))
        }
    }
}

entry_point!(pub tb_top => top);
