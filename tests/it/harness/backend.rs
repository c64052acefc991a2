//! What answers the TB.* commands in a behaviour case: the module, or its Lua twin
//! (`lua/tb.lua` as a FUNCTION library) on a server without the module. A case is written
//! once, as `fn case(backend: Backend)`, and [`on_every_backend!`] makes one test of it per
//! backend; where the two legitimately differ (docs/lua-fallback.md, "Differences from the
//! module") a case stays a plain `#[test]` of one of them, saying why.

use redis::Value;

use super::buckets::stored_lock;
use super::commands::{server_time_ms, stored_last_refill, tb_field};
use super::server::Server;
use super::twin::{outcome, Fallback};

/// The module's commands, or their twins in `lua/tb.lua`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// `TB.<COMMAND> ...` on a server with the module loaded.
    Module,
    /// `FCALL tb_<command> ...` on a server without the module, the library loaded.
    Twin,
}

impl Backend {
    /// A server for this backend, and a connection to it.
    pub fn start(self) -> (Server, redis::Connection) {
        self.start_with(&[])
    }

    /// A server for this backend with the defaults followed by `extra` (e.g. `AOF_ARGS`).
    pub fn start_with(self, extra: &[&str]) -> (Server, redis::Connection) {
        let server = match self {
            Backend::Module => Server::start_with(extra),
            Backend::Twin => Server::start_without_module(extra),
        };
        let mut con = server.conn();
        if self == Backend::Twin {
            Fallback::function(&mut con);
        }
        (server, con)
    }

    /// The call of `command` (lower case: take, takeall, unblock, ...) on `keys` with `args`,
    /// written as the twin takes them: the keys apart from the numbers. The module's
    /// TB.TAKEALL takes each key before its three numbers, so there they are interleaved.
    pub fn cmd_for(self, command: &str, keys: &[&[u8]], args: &[&[u8]]) -> redis::Cmd {
        match self {
            Backend::Twin => Fallback::Function.cmd_for(command, keys, args),
            Backend::Module => {
                let mut cmd = redis::cmd(&format!("TB.{}", command.to_uppercase()));
                let per_key = if command == "takeall" { 3 } else { 0 };
                let mut args = args.iter();
                for key in keys {
                    cmd.arg(*key);
                    for arg in args.by_ref().take(per_key) {
                        cmd.arg(*arg);
                    }
                }
                for arg in args {
                    cmd.arg(*arg);
                }
                cmd
            }
        }
    }

    /// `cmd_for` with the keys and the arguments each given as words, e.g.
    /// `backend.cmd("takeall", "a b", "5 1 1 5 1 1 BLOCK 100")`.
    pub fn cmd(self, command: &str, keys: &str, args: &str) -> redis::Cmd {
        let keys: Vec<&[u8]> = keys.split_whitespace().map(str::as_bytes).collect();
        let args: Vec<&[u8]> = args.split_whitespace().map(str::as_bytes).collect();
        self.cmd_for(command, &keys, &args)
    }

    /// The reply of `command` on `keys` with `args` (both as words), or its exact error text.
    pub fn call(
        self,
        con: &mut redis::Connection,
        command: &str,
        keys: &str,
        args: &str,
    ) -> Result<Value, String> {
        outcome(con, &self.cmd(command, keys, args))
    }

    /// `call`'s reply as integers; panics, naming the call, on an error.
    pub fn ints(
        self,
        con: &mut redis::Connection,
        command: &str,
        keys: &str,
        args: &str,
    ) -> Vec<i64> {
        let shown = || format!("{} {command} {keys} {args}", self.name());
        let reply = self
            .call(con, command, keys, args)
            .unwrap_or_else(|e| panic!("{}: {e}", shown()));
        redis::from_redis_value(&reply).unwrap_or_else(|e| panic!("{}: {e}: {reply:?}", shown()))
    }

    /// `call`'s error text; panics if the call succeeds.
    pub fn error(
        self,
        con: &mut redis::Connection,
        command: &str,
        keys: &str,
        args: &str,
    ) -> String {
        match self.call(con, command, keys, args) {
            Ok(reply) => panic!(
                "{} {command} {keys} {args} accepted: {reply:?}",
                self.name()
            ),
            Err(e) => e,
        }
    }

    /// TB.UNBLOCK's reply: 1 when it removed a lock, 0 when there was none.
    pub fn unblock(self, con: &mut redis::Connection, key: &str) -> i64 {
        let reply = self
            .call(con, "unblock", key, "")
            .unwrap_or_else(|e| panic!("{} unblock {key}: {e}", self.name()));
        redis::from_redis_value(&reply)
            .unwrap_or_else(|e| panic!("{} unblock {key}: {e}: {reply:?}", self.name()))
    }

    /// Empties a new bucket: one allowed take of its whole `capacity`. Returns the stored
    /// `last_refill`, the instant the bucket was empty, from which a case times its refill.
    pub fn drain(self, con: &mut redis::Connection, key: &str, capacity: &str, rate: &str) -> i64 {
        let reply = self.ints(con, "take", key, &format!("{capacity} {rate} {capacity}"));
        assert_eq!(reply[..2], [1, 0], "{key} drained: {reply:?}");
        stored_last_refill(con, key)
    }

    /// Runs a call (as `ints`) between two readings of the server clock:
    /// `(before, reply, after)`.
    pub fn timed(
        self,
        con: &mut redis::Connection,
        command: &str,
        keys: &str,
        args: &str,
    ) -> (i64, Vec<i64>, i64) {
        let before = server_time_ms(con);
        let reply = self.ints(con, command, keys, args);
        (before, reply, server_time_ms(con))
    }

    /// A drained bucket of one token refilled at one per 1000 s, locked by a denial with
    /// `BLOCK block_ms`: every call on it is denied for the whole case. Returns the stored
    /// lock.
    pub fn locked_slow_bucket(
        self,
        con: &mut redis::Connection,
        key: &str,
        block_ms: &str,
    ) -> (i64, i64, i64) {
        self.drain(con, key, "1", "0.001");
        let reply = self.ints(con, "take", key, &format!("1 0.001 1 BLOCK {block_ms}"));
        assert_eq!(reply[0], 0, "the denial that locks: {reply:?}");
        stored_lock(con, key)
    }

    /// On the module, INFO tb's counter `name` reads `want`. The twin keeps no counters
    /// (docs/lua-fallback.md): there this checks nothing.
    pub fn assert_counter(self, con: &mut redis::Connection, name: &str, want: i64) {
        if self == Backend::Module {
            assert_eq!(tb_field(con, name), want.to_string(), "INFO tb {name}");
        }
    }

    /// How failure messages name it.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Module => "module",
            Backend::Twin => "twin",
        }
    }
}

/// One test per backend of each case named (`fn case(backend: Backend)` beside it):
/// `case::on_module` and `case::on_twin`.
macro_rules! on_every_backend {
    ($($case:ident),+ $(,)?) => {
        $(
            mod $case {
                #[test]
                fn on_module() {
                    super::$case(crate::harness::Backend::Module);
                }

                #[test]
                fn on_twin() {
                    super::$case(crate::harness::Backend::Twin);
                }
            }
        )+
    };
}
pub(crate) use on_every_backend;
