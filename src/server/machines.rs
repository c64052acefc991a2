//! Each kind of wait's one machine: the process-wide state of waiting, kept
//! here on the server side so that the core's machine stays a plain value.
//! Only the server's main thread reaches it (commands, timers,
//! blocked-client and keyspace callbacks all run there).

use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use redis_tb_core::wait::leases::Leases;
use redis_tb_core::wait::tokens::Tokens;
use redis_tb_core::wait::{Kind, Machine};

/// A kind's machine, in a static of its own.
pub struct MainThread<K: Kind> {
    machine: UnsafeCell<Option<Machine<K>>>,
    borrowed: AtomicBool,
}

// SAFETY: see `with_machine`: one thread, and never two borrows at once.
unsafe impl<K: Kind> Sync for MainThread<K> {}

impl<K: Kind> MainThread<K> {
    const fn new() -> Self {
        MainThread {
            machine: UnsafeCell::new(None),
            borrowed: AtomicBool::new(false),
        }
    }
}

/// A kind that has its one machine here. A new kind of wait is one more
/// static and impl below.
pub trait HasMachine: Kind {
    fn machine() -> &'static MainThread<Self>;
}

static TOKEN_MACHINE: MainThread<Tokens> = MainThread::new();
static LEASE_MACHINE: MainThread<Leases> = MainThread::new();

impl HasMachine for Tokens {
    fn machine() -> &'static MainThread<Tokens> {
        &TOKEN_MACHINE
    }
}

impl HasMachine for Leases {
    fn machine() -> &'static MainThread<Leases> {
        &LEASE_MACHINE
    }
}

/// Runs `f` on the server's machine of kind `K`. The glue makes every
/// server call that can call back into the module outside `f`; should one
/// ever nest regardless (a bug), the inner call gets `None` instead of a
/// second, aliasing borrow. The machines of two kinds are separate: each
/// may be borrowed while the other is.
pub fn with_machine<K: HasMachine, R>(f: impl FnOnce(&mut Machine<K>) -> R) -> Option<R> {
    let main = K::machine();
    if main.borrowed.swap(true, Relaxed) {
        return None;
    }
    struct Release(&'static AtomicBool);
    impl Drop for Release {
        fn drop(&mut self) {
            self.0.store(false, Relaxed);
        }
    }
    let _release = Release(&main.borrowed);
    // SAFETY: main thread only, and the flag above rules out a second
    // borrow while this one lives.
    let machine = unsafe { &mut *main.machine.get() };
    Some(f(machine.get_or_insert_with(Machine::default)))
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
