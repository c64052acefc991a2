//! Each kind of wait's one machine: the process-wide state of waiting, kept
//! here on the server side so that the core's machine stays a plain value.
//! Only the server's main thread reaches it (commands, timers,
//! blocked-client and keyspace callbacks all run there).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use redis_tb_core::wait::leases::Leases;
use redis_tb_core::wait::tokens::Tokens;
use redis_tb_core::wait::{Kind, Machine};

/// A value only the server's main thread reaches, in a static of its own:
/// each kind's machine here, and TB.TOP's summary (top.rs).
pub struct MainThread<T> {
    value: UnsafeCell<Option<T>>,
    borrowed: AtomicBool,
}

// SAFETY: see `MainThread::with`: one thread, and never two borrows at once.
unsafe impl<T> Sync for MainThread<T> {}

impl<T> MainThread<T> {
    pub const fn new() -> Self {
        MainThread {
            value: UnsafeCell::new(None),
            borrowed: AtomicBool::new(false),
        }
    }

    /// Runs `f` on the value, made by `make` the first time. Should a call
    /// ever nest regardless (a bug), the inner one gets `None` instead of a
    /// second, aliasing borrow.
    pub fn with<R>(
        &'static self,
        make: impl FnOnce() -> T,
        f: impl FnOnce(&mut T) -> R,
    ) -> Option<R> {
        if self.borrowed.swap(true, Relaxed) {
            return None;
        }
        struct Release(&'static AtomicBool);
        impl Drop for Release {
            fn drop(&mut self) {
                self.0.store(false, Relaxed);
            }
        }
        let _release = Release(&self.borrowed);
        // SAFETY: main thread only, and the flag above rules out a second
        // borrow while this one lives.
        let value = unsafe { &mut *self.value.get() };
        Some(f(value.get_or_insert_with(make)))
    }
}

impl<T> MainThread<T> {
    /// Drops the value (at unload, so nothing of it outlives the module; at
    /// load, should the loader have kept the library mapped). `false`,
    /// keeping it, if it is borrowed (never at load or unload).
    pub fn forget(&'static self) -> bool {
        if self.borrowed.swap(true, Relaxed) {
            return false;
        }
        // SAFETY: main thread only, and the flag rules out a borrow.
        let value = unsafe { (*self.value.get()).take() };
        self.borrowed.store(false, Relaxed);
        drop(value);
        true
    }
}

/// A kind that has its one machine here. A new kind of wait is one more
/// static and impl below.
pub trait HasMachine: Kind {
    fn machine() -> &'static MainThread<Machine<Self>>;
}

static TOKEN_MACHINE: MainThread<Machine<Tokens>> = MainThread::new();
static LEASE_MACHINE: MainThread<Machine<Leases>> = MainThread::new();

impl HasMachine for Tokens {
    fn machine() -> &'static MainThread<Machine<Tokens>> {
        &TOKEN_MACHINE
    }
}

impl HasMachine for Leases {
    fn machine() -> &'static MainThread<Machine<Leases>> {
        &LEASE_MACHINE
    }
}

/// Runs `f` on the server's machine of kind `K`. The glue makes every
/// server call that can call back into the module outside `f`; should one
/// ever nest regardless (a bug), the inner call gets `None` instead of a
/// second, aliasing borrow. The machines of two kinds are separate: each
/// may be borrowed while the other is.
pub fn with_machine<K: HasMachine, R>(f: impl FnOnce(&mut Machine<K>) -> R) -> Option<R> {
    K::machine().with(Machine::default, f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One test, so no other test thread borrows the statics meanwhile.
    #[test]
    fn each_kind_has_a_machine_of_its_own_and_a_nested_borrow_gets_none() {
        let both = with_machine(|leases: &mut Machine<Leases>| {
            let id = leases.reserve();
            let tokens_empty = with_machine(|tokens: &mut Machine<Tokens>| tokens.is_empty());
            let nested = with_machine(|_: &mut Machine<Leases>| ());
            (id, tokens_empty, nested)
        });
        assert_eq!(both, Some((1, Some(true), None)));
        // The outer borrow has ended: the machine is reachable again.
        assert_eq!(with_machine(|_: &mut Machine<Leases>| ()), Some(()));
    }
}
