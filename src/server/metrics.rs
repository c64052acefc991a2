//! Counters for `INFO tb`, read by dashboards (redis_exporter scrapes INFO).
//!
//! Commands run only on the server's main thread, so each counter is bumped
//! with a relaxed load and store: plain moves, no locked instruction on the
//! hot path. Atomics are used only so the statics are `Sync`.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use redis_tb_core::wait::leases::Leases;
use redis_tb_core::wait::tokens::Tokens;
use redis_tb_core::wait::Machine;

use super::config::MAX_WAITERS;
use super::machines::with_machine;
use redis_module::raw::{
    RedisModuleInfoCtx, RedisModule_InfoAddFieldCString, RedisModule_InfoAddFieldDouble,
    RedisModule_InfoAddFieldULongLong, RedisModule_InfoAddSection,
};

pub struct Counter(AtomicU64);

impl Counter {
    const fn new() -> Self {
        Counter(AtomicU64::new(0))
    }

    pub fn bump(&self) {
        self.0.store(self.0.load(Relaxed).wrapping_add(1), Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }

    pub fn add_count(&self, count: usize) {
        let count = u64::try_from(count).unwrap_or(u64::MAX);
        self.0
            .store(self.0.load(Relaxed).wrapping_add(count), Relaxed);
    }
}

/// A value that is set rather than counted.
pub struct Gauge(AtomicU64);

impl Gauge {
    const fn new() -> Self {
        Gauge(AtomicU64::new(0))
    }

    pub fn set(&self, value: u64) {
        self.0.store(value, Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Relaxed)
    }
}

/// A running sum of token amounts (which may be fractional), kept as f64 bits.
pub struct Sum(AtomicU64);

impl Sum {
    const fn new() -> Self {
        Sum(AtomicU64::new(0))
    }

    pub fn add(&self, amount: f64) {
        let total = f64::from_bits(self.0.load(Relaxed)) + amount;
        if total.is_finite() {
            self.0.store(total.to_bits(), Relaxed);
        }
    }

    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Relaxed))
    }
}

/// Every request a TB command answered with a decision (not an error).
pub static CALLS: Counter = Counter::new();
pub static ALLOWED: Counter = Counter::new();
pub static DENIED: Counter = Counter::new();
/// Denials let through because `tb.shadow-mode` is on.
pub static SHADOW_DENIED: Counter = Counter::new();
pub static TOKENS_GRANTED: Sum = Sum::new();
pub static TOKENS_REFUNDED: Sum = Sum::new();
/// Writes to a key that did not exist: new buckets.
pub static BUCKETS_CREATED: Counter = Counter::new();
pub static ERRORS: Counter = Counter::new();
/// Locks started by a denial with `BLOCK`.
pub static LOCKS_STARTED: Counter = Counter::new();
/// TB.CHARGE calls, and the tokens they really took (less than asked once
/// MAXDEBT held the debt).
pub static CHARGES: Counter = Counter::new();
pub static TOKENS_CHARGED: Sum = Sum::new();
/// Reservations (`MAXWAIT`) allowed with a wait: the caller acts later.
pub static RESERVATIONS_WAITED: Counter = Counter::new();
/// TB.BTAKE and TB.ACQUIRE: waits begun, and how each ended.
pub static WAITS_STARTED: Counter = Counter::new();
pub static WAITS_SERVED: Counter = Counter::new();
/// Timed out, or ended by CLIENT UNBLOCK: answered with a denial.
pub static WAITS_TIMED_OUT: Counter = Counter::new();
/// The client left without an answer (disconnect, CLIENT KILL, failover,
/// a slot moved away): it took nothing.
pub static WAITS_ABANDONED: Counter = Counter::new();
/// Milliseconds waited in all, over every wait that ended.
pub static WAIT_MS: Sum = Sum::new();
/// TB.BTAKE: clients whose wait has not ended, set by src/bucket/btake.rs.
pub static WAITING: Gauge = Gauge::new();
/// TB.ACQUIRE: the same, set by src/lease/commands.rs.
pub static LEASE_WAITING: Gauge = Gauge::new();
/// TB.ACQUIRE: leases granted (at once or after a wait), and denials
/// (timed-out waits included).
pub static LEASES_ACQUIRED: Counter = Counter::new();
pub static LEASES_DENIED: Counter = Counter::new();
/// TB.RELEASE and TB.RENEW that found their lease live.
pub static LEASES_RELEASED: Counter = Counter::new();
pub static LEASES_RENEWED: Counter = Counter::new();
/// Leases a call removed after their deadline.
pub static LEASES_EXPIRED: Counter = Counter::new();
/// Which clock the commands read (see `Api::now_ms`), set at load: the
/// server's cached command time (Redis 7.2+, Valkey) or the wall clock.
pub static CACHED_CLOCK: AtomicBool = AtomicBool::new(false);

/// The `INFO tb` callback: section `tb_stats`, fields `tb_<name>`.
pub extern "C" fn info(ctx: *mut RedisModuleInfoCtx, _for_crash_report: c_int) {
    // SAFETY: called by the server with a live info context; a missing API
    // simply leaves the section out.
    unsafe {
        let (Some(section), Some(add_u64), Some(add_f64)) = (
            RedisModule_InfoAddSection,
            RedisModule_InfoAddFieldULongLong,
            RedisModule_InfoAddFieldDouble,
        ) else {
            return;
        };
        section(ctx, c"stats".as_ptr());
        for (name, counter) in [
            (c"calls", &CALLS),
            (c"allowed", &ALLOWED),
            (c"denied", &DENIED),
            (c"shadow_denied", &SHADOW_DENIED),
            (c"buckets_created", &BUCKETS_CREATED),
            (c"errors", &ERRORS),
            (c"locks_started", &LOCKS_STARTED),
            (c"charges", &CHARGES),
            (c"reservations_waited", &RESERVATIONS_WAITED),
        ] {
            add_u64(ctx, name.as_ptr(), counter.get());
        }
        add_f64(ctx, c"tokens_granted".as_ptr(), TOKENS_GRANTED.get());
        add_f64(ctx, c"tokens_refunded".as_ptr(), TOKENS_REFUNDED.get());
        add_f64(ctx, c"tokens_charged".as_ptr(), TOKENS_CHARGED.get());
        add_u64(
            ctx,
            c"waiting".as_ptr(),
            WAITING.get().saturating_add(LEASE_WAITING.get()),
        );
        for (name, counter) in [
            (c"waits_started", &WAITS_STARTED),
            (c"waits_served", &WAITS_SERVED),
            (c"waits_timed_out", &WAITS_TIMED_OUT),
            (c"waits_abandoned", &WAITS_ABANDONED),
        ] {
            add_u64(ctx, name.as_ptr(), counter.get());
        }
        add_f64(ctx, c"wait_ms".as_ptr(), WAIT_MS.get());
        // The longest queue of either kind against the limit each kind has:
        // a queue near it turns the next waiters away.
        let longest = with_machine(|tokens: &mut Machine<Tokens>| tokens.longest_queue())
            .unwrap_or(0)
            .max(with_machine(|leases: &mut Machine<Leases>| leases.longest_queue()).unwrap_or(0));
        add_u64(
            ctx,
            c"longest_queue".as_ptr(),
            u64::try_from(longest).unwrap_or(u64::MAX),
        );
        add_u64(
            ctx,
            c"max_waiters".as_ptr(),
            u64::try_from(MAX_WAITERS.load(Relaxed)).unwrap_or(0),
        );
        for (name, counter) in [
            (c"leases_acquired", &LEASES_ACQUIRED),
            (c"leases_denied", &LEASES_DENIED),
            (c"leases_released", &LEASES_RELEASED),
            (c"leases_renewed", &LEASES_RENEWED),
            (c"leases_expired", &LEASES_EXPIRED),
        ] {
            add_u64(ctx, name.as_ptr(), counter.get());
        }
        // `cached`, the server's command time (Redis 7.2+, Valkey), or
        // `wall` (Redis 7.0).
        if let Some(add_text) = RedisModule_InfoAddFieldCString {
            let clock = if CACHED_CLOCK.load(Relaxed) {
                c"cached"
            } else {
                c"wall"
            };
            add_text(ctx, c"clock".as_ptr(), clock.as_ptr());
        }
    }
}
