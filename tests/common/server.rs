//! Shared integration-test harness: a real `redis-server` with the built module loaded.
//!
//! Every test starts its own server on a free port with its own directory, so tests run in
//! parallel without sharing state. The [`Server`] guard kills the process and removes the
//! directory on drop, also when the test panicked (then it prints the tail of the logs first).
//!
//! Nothing here is mocked: replies, errors and timings come from the server itself.
//!
//! Environment:
//! - `TB_MODULE`: path of the module to load (default `target/release/libredis_tb.so`).
//! - `TB_SERVER`: server binary (default `redis-server` from `PATH`).
//! - `TB_START_TIMEOUT_MS`: how long a starting server may take to answer PING (default
//!   10000); raised by `scripts/sanitize.sh`, whose server runs under valgrind.

// Each test file compiles its own copy of this module and uses only part of it.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How long a starting server may take to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `conn()` keeps retrying.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping server may take to exit before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);
/// Read/write timeout on test connections, so a hung server fails a test instead of hanging it.
const IO_TIMEOUT: Duration = Duration::from_secs(30);
/// Attempts at finding a port the server can bind.
const PORT_ATTEMPTS: usize = 5;

/// The reference Lua token bucket (our own version of the seeds' algorithm), the same file
/// `make bench` races. KEYS[1] bucket; ARGV capacity, rate, n, now_ms; returns
/// `{allowed, floor(tokens)}`.
pub const REFERENCE_LUA: &str = include_str!("../../bench/reference_token_bucket.lua");

/// Largest wait the module reports, in ms (contract: waits are capped at 2^53 ms).
pub const MAX_WAIT_MS: i64 = 1 << 53;

static NEXT_ID: AtomicUsize = AtomicUsize::new(0);

/// A running `redis-server` with the module loaded. Killed and cleaned up on drop.
pub struct Server {
    pub port: u16,
    pub dir: PathBuf,
    child: Mutex<Option<Child>>,
    /// Extra arguments given to `start_with`, kept for `restart`.
    extra: Vec<String>,
    /// The module and its load arguments; `None` for a server started by
    /// `start_without_module` (kept for `restart`).
    module: Option<(PathBuf, Vec<String>)>,
}

impl Server {
    /// A server with the module loaded and the default configuration.
    pub fn start() -> Server {
        Server::start_with(&[])
    }

    /// A server with the defaults followed by `extra` (later arguments win), e.g.
    /// `&["--appendonly", "yes"]`. Panics, with the server log, if it does not come up.
    pub fn start_with(extra: &[&str]) -> Server {
        Server::launch(extra, Some((module_path(), Vec::new())))
    }

    /// A server that loads `module` with the load arguments `module_args` (e.g. the
    /// fault-injection build, `fault_module_path()`), then the defaults and `extra`.
    pub fn start_with_module(module: PathBuf, module_args: &[&str], extra: &[&str]) -> Server {
        let module_args = module_args.iter().map(|s| s.to_string()).collect();
        Server::launch(extra, Some((module, module_args)))
    }

    fn launch(extra: &[&str], module: Option<(PathBuf, Vec<String>)>) -> Server {
        let dir = fresh_dir();
        let mut server = Server {
            port: 0,
            dir,
            child: Mutex::new(None),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            module,
        };
        let mut last_failure = String::new();
        for _ in 0..PORT_ATTEMPTS {
            server.port = free_port();
            match server.spawn_and_wait() {
                Ok(()) => return server,
                Err(failure) if failure.port_in_use => last_failure = failure.message,
                Err(failure) => panic!("{}", failure.message),
            }
        }
        panic!(
            "redis-server could not bind a port after {PORT_ATTEMPTS} attempts:\n{last_failure}"
        );
    }

    /// Like `start_with`, but the module is NOT loaded (e.g. a replica that holds the
    /// buckets as plain hashes). `restart` keeps it module-less.
    pub fn start_without_module(extra: &[&str]) -> Server {
        Server::launch(extra, None)
    }

    /// A synchronous connection, retried until the server answers PING (bounded).
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
            .expect("valid redis URL");
        let deadline = Instant::now() + CONNECT_TIMEOUT;
        loop {
            let last_error = match try_connect(&client) {
                Ok(con) => return con,
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                panic!(
                    "could not connect to redis-server on port {} within {:?}: {}\n{}",
                    self.port,
                    CONNECT_TIMEOUT,
                    last_error,
                    self.log_tail(40)
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Stops the server: SHUTDOWN NOSAVE, and a kill if it has not exited in time. Waits for
    /// the process to exit. A no-op when it is not running.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.lock().unwrap().take() else {
            return;
        };
        if child.try_wait().ok().flatten().is_none() {
            if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)) {
                if let Ok(mut con) = client.get_connection_with_timeout(Duration::from_secs(1)) {
                    let _ = con.set_read_timeout(Some(Duration::from_secs(5)));
                    // The connection closes under us; the error is expected.
                    let _: redis::RedisResult<redis::Value> =
                        redis::cmd("SHUTDOWN").arg("NOSAVE").query(&mut con);
                }
            }
            if !wait_exit(&mut child, STOP_TIMEOUT) {
                let _ = child.kill();
            }
        }
        let _ = child.wait();
    }

    /// Kills the server with SIGKILL (a crash: no AOF flush, no save) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server, then starts it again on the same port with the same directory and
    /// arguments (so persistence files are found again). Panics with the log if it fails.
    pub fn restart(&mut self) {
        self.stop();
        let mut last_failure = String::new();
        for attempt in 0..PORT_ATTEMPTS {
            match self.spawn_and_wait() {
                Ok(()) => return,
                Err(failure) if failure.port_in_use => {
                    last_failure = failure.message;
                    thread::sleep(Duration::from_millis(200 * (attempt as u64 + 1)));
                }
                Err(failure) => panic!("restart failed: {}", failure.message),
            }
        }
        panic!(
            "restart failed, port {} stayed in use:\n{last_failure}",
            self.port
        );
    }

    /// The server's log file (`<dir>/server.log`), accumulated over restarts.
    pub fn log(&self) -> String {
        read_lossy(&self.dir.join("server.log"))
    }

    /// What the process wrote to stdout/stderr (Rust panic messages from the module land here).
    pub fn stdio(&self) -> String {
        read_lossy(&self.dir.join("stdio.log"))
    }

    /// The process id, when running.
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(|c| c.id())
    }

    /// True when the process has not exited and PING answers PONG.
    pub fn is_alive(&self) -> bool {
        {
            let mut guard = self.child.lock().unwrap();
            match guard.as_mut() {
                None => return false,
                Some(child) => {
                    if !matches!(child.try_wait(), Ok(None)) {
                        return false;
                    }
                }
            }
        }
        let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)) else {
            return false;
        };
        try_connect(&client).is_ok()
    }

    /// The full command line arguments this server runs with.
    pub fn args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--port".into(),
            self.port.to_string(),
            "--bind".into(),
            "127.0.0.1".into(),
        ];
        if let Some((module, module_args)) = &self.module {
            args.push("--loadmodule".into());
            args.push(module.display().to_string());
            args.extend(module_args.iter().cloned());
        }
        args.extend([
            "--dir".into(),
            self.dir.display().to_string(),
            "--save".into(),
            "".into(),
            "--appendonly".into(),
            "no".into(),
            "--enable-debug-command".into(),
            "yes".into(),
            "--logfile".into(),
            self.dir.join("server.log").display().to_string(),
            "--daemonize".into(),
            "no".into(),
        ]);
        args.extend(self.extra.iter().cloned());
        args
    }

    fn log_tail(&self, lines: usize) -> String {
        format!(
            "--- server.log (last {lines} lines) ---\n{}\n--- stdout/stderr ---\n{}",
            tail(&self.log(), lines),
            tail(&self.stdio(), lines)
        )
    }

    /// Spawns the process with `self.port` and waits until this very process answers PING.
    fn spawn_and_wait(&mut self) -> Result<(), StartFailure> {
        let args = self.args();
        let stdio = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stdio.log"))
            .expect("create stdio.log");
        let stdio_err = stdio.try_clone().expect("clone stdio.log handle");
        let child = Command::new(server_binary())
            .args(&args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stdio_err)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run `{}` ({e}); install redis-server or set TB_SERVER",
                    server_binary()
                )
            });
        let pid = child.id();
        *self.child.lock().unwrap() = Some(child);

        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))
            .expect("valid redis URL");
        let deadline = Instant::now() + start_timeout();
        loop {
            let exited = {
                let mut guard = self.child.lock().unwrap();
                let child = guard.as_mut().expect("child just spawned");
                match child.try_wait() {
                    Ok(Some(status)) => Some(status),
                    _ => None,
                }
            };
            if let Some(status) = exited {
                *self.child.lock().unwrap() = None;
                let log = self.log_tail(60);
                return Err(StartFailure {
                    port_in_use: log.contains("Address already in use"),
                    message: format!(
                        "redis-server exited with {status} while starting on port {}\nargs: {:?}\n{log}",
                        self.port, args
                    ),
                });
            }
            // Make sure the process answering is ours, not another test's server that got the
            // same port between our probe and our bind.
            if let Ok(mut con) = try_connect(&client) {
                if server_pid(&mut con) == Some(pid) {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                let log = self.log_tail(60);
                self.kill();
                return Err(StartFailure {
                    port_in_use: log.contains("Address already in use"),
                    message: format!(
                        "redis-server did not answer PING on port {} within {:?}\nargs: {:?}\n{log}",
                        self.port, start_timeout(), args
                    ),
                });
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!(
                "redis-server on port {} (dir {}):\n{}",
                self.port,
                self.dir.display(),
                self.log_tail(40)
            );
        }
        self.kill();
        let _ = fs::remove_dir_all(&self.dir);
    }
}

struct StartFailure {
    port_in_use: bool,
    message: String,
}

/// The module to load: `TB_MODULE`, else `<crate>/target/release/libredis_tb.so`. Panics when
/// the file does not exist.
pub fn module_path() -> PathBuf {
    let path = match std::env::var_os("TB_MODULE") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/libredis_tb.so"),
    };
    if !path.is_file() {
        panic!(
            "redis-tb module not found at {}: build it first: cargo build --release (or set TB_MODULE)",
            path.display()
        );
    }
    path.canonicalize().unwrap_or(path)
}

/// The test-only build with the `fault-injection` feature (see `src/fault.rs`):
/// `TB_FAULT_MODULE`, else `<crate>/target/fault/debug/libredis_tb.so`, which `make test`
/// builds. Panics, saying how to build it, when the file does not exist.
pub fn fault_module_path() -> PathBuf {
    let path = match std::env::var_os("TB_FAULT_MODULE") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target/fault/debug/libredis_tb.so"),
    };
    if !path.is_file() {
        panic!(
            "fault-injection module not found at {}: build it first: \
             cargo build --features fault-injection --target-dir target/fault (make test does)",
            path.display()
        );
    }
    path.canonicalize().unwrap_or(path)
}

/// The server binary: `TB_SERVER`, else `redis-server`.
pub fn server_binary() -> String {
    std::env::var("TB_SERVER").unwrap_or_else(|_| "redis-server".to_string())
}

/// `TB.<COMMAND> key capacity rate n` as a command, e.g. for a pipeline (`command`: the
/// full name, `"TB.TAKE"`).
pub fn tb_cmd(command: &str, key: &str, capacity: &str, rate: &str, n: &str) -> redis::Cmd {
    let mut cmd = redis::cmd(command);
    cmd.arg(key).arg(capacity).arg(rate).arg(n);
    cmd
}

/// `TB.<COMMAND> key capacity rate n` (e.g. `tb(con, "TB.REFUND", ..)`); panics, naming the
/// call, on an error reply.
pub fn tb(
    con: &mut redis::Connection,
    command: &str,
    key: &str,
    capacity: &str,
    rate: &str,
    n: &str,
) -> Vec<i64> {
    tb_cmd(command, key, capacity, rate, n)
        .query(con)
        .unwrap_or_else(|e| panic!("{command} {key} {capacity} {rate} {n} failed: {e}"))
}

/// The exact error text of `TB.<COMMAND> key capacity rate n`; panics if the call succeeds.
pub fn tb_error(
    con: &mut redis::Connection,
    command: &str,
    key: &str,
    capacity: &str,
    rate: &str,
    n: &str,
) -> String {
    match tb_cmd(command, key, capacity, rate, n).query::<redis::Value>(con) {
        Ok(v) => panic!("expected an error from {command} {key} {capacity} {rate} {n}, got {v:?}"),
        Err(e) => error_text(&e),
    }
}

/// `TB.TAKE key capacity rate n`; panics (naming the call) on an error reply.
pub fn take(
    con: &mut redis::Connection,
    key: &str,
    capacity: &str,
    rate: &str,
    n: &str,
) -> Vec<i64> {
    tb(con, "TB.TAKE", key, capacity, rate, n)
}

/// `WATCH key` on `con`.
pub fn watch(con: &mut redis::Connection, key: &str) {
    let _: () = redis::cmd("WATCH").arg(key).query(con).expect("WATCH");
}

/// MULTI; PING; EXEC on `con`, after a `watch`: whether the transaction ran (`false`: a
/// write to a watched key aborted it).
pub fn watched_transaction_runs(con: &mut redis::Connection) -> bool {
    let _: () = redis::cmd("MULTI").query(con).expect("MULTI");
    let queued: String = redis::cmd("PING").query(con).expect("PING");
    assert_eq!(queued, "QUEUED");
    match redis::cmd("EXEC").query(con).expect("EXEC") {
        redis::Value::Nil => false,
        redis::Value::Array(replies) => {
            assert_eq!(
                replies,
                vec![redis::Value::SimpleString("PONG".into())],
                "EXEC ran something else"
            );
            true
        }
        other => panic!("unexpected EXEC reply {other:?}"),
    }
}

/// `TB.PEEK key capacity rate n`; panics (naming the call) on an error reply.
pub fn peek(
    con: &mut redis::Connection,
    key: &str,
    capacity: &str,
    rate: &str,
    n: &str,
) -> Vec<i64> {
    tb(con, "TB.PEEK", key, capacity, rate, n)
}

/// `TB.PEEK key capacity rate` (n left to its default); panics on an error reply.
pub fn peek_default_n(
    con: &mut redis::Connection,
    key: &str,
    capacity: &str,
    rate: &str,
) -> Vec<i64> {
    redis::cmd("TB.PEEK")
        .arg(key)
        .arg(capacity)
        .arg(rate)
        .query(con)
        .unwrap_or_else(|e| panic!("TB.PEEK {key} {capacity} {rate} failed: {e}"))
}

/// One call of the reference Lua script (`EVAL`), with `now_ms` as the script's clock.
pub fn lua_take(
    con: &mut redis::Connection,
    key: &str,
    capacity: &str,
    rate: &str,
    n: &str,
    now_ms: i64,
) -> Vec<i64> {
    redis::cmd("EVAL")
        .arg(REFERENCE_LUA)
        .arg(1)
        .arg(key)
        .arg(capacity)
        .arg(rate)
        .arg(n)
        .arg(now_ms)
        .query(con)
        .unwrap_or_else(|e| {
            panic!("reference Lua on {key} {capacity} {rate} {n} {now_ms} failed: {e}")
        })
}

/// Runs a raw command given as byte strings (first is the command name).
pub fn raw(con: &mut redis::Connection, args: &[&[u8]]) -> redis::RedisResult<redis::Value> {
    let mut cmd = redis::cmd(std::str::from_utf8(args[0]).expect("command name is UTF-8"));
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(con)
}

/// The reply exactly as sent, error replies (also nested ones, e.g. inside EXEC) kept as
/// `Value::ServerError` instead of failing the whole call.
pub fn reply_value(con: &mut redis::Connection, cmd: &redis::Cmd) -> redis::Value {
    redis::ConnectionLike::req_command(con, cmd).expect("connection error")
}

/// The exact error line the server sent (`CODE detail`), rebuilt from a client error.
pub fn error_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        (Some(code), None) => code.to_string(),
        _ => format!("<not a server error: {e}>"),
    }
}

/// Runs `args` expecting an error reply and returns its exact text; panics if the call succeeds.
pub fn expect_error(con: &mut redis::Connection, args: &[&[u8]]) -> String {
    match raw(con, args) {
        Ok(v) => panic!("expected an error from {}, got {v:?}", show_args(args)),
        Err(e) => error_text(&e),
    }
}

/// Arguments rendered for failure messages, non-printable bytes escaped.
pub fn show_args(args: &[&[u8]]) -> String {
    args.iter()
        .map(|a| format!("{:?}", String::from_utf8_lossy(&escape(a))))
        .collect::<Vec<_>>()
        .join(" ")
}

fn escape(bytes: &[u8]) -> Vec<u8> {
    bytes
        .iter()
        .flat_map(|b| std::ascii::escape_default(*b))
        .collect()
}

/// The server clock (TIME) in Unix ms, rounded down.
pub fn server_time_ms(con: &mut redis::Connection) -> i64 {
    let (secs, micros): (i64, i64) = redis::cmd("TIME").query(con).expect("TIME");
    secs * 1000 + micros / 1000
}

/// True when PING answers PONG on this connection.
pub fn ping(con: &mut redis::Connection) -> bool {
    matches!(redis::cmd("PING").query::<String>(con), Ok(ref s) if s == "PONG")
}

pub fn exists(con: &mut redis::Connection, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query::<i64>(con)
        .expect("EXISTS")
        == 1
}

pub fn pttl(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query(con).expect("PTTL")
}

/// Absolute expiry in Unix ms (`PEXPIRETIME`): -1 no expiry, -2 no key.
pub fn pexpiretime(con: &mut redis::Connection, key: &str) -> i64 {
    redis::cmd("PEXPIRETIME")
        .arg(key)
        .query(con)
        .expect("PEXPIRETIME")
}

pub fn hgetall(con: &mut redis::Connection, key: &str) -> BTreeMap<String, String> {
    redis::cmd("HGETALL").arg(key).query(con).expect("HGETALL")
}

/// Writes a bucket hash directly (e.g. to seed state or corrupt it).
pub fn hset(con: &mut redis::Connection, key: &str, fields: &[(&str, &str)]) {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(key);
    for (f, v) in fields {
        cmd.arg(*f).arg(*v);
    }
    let _: i64 = cmd.query(con).expect("HSET");
}

/// A stored `tokens` field as a number.
pub fn stored_tokens(con: &mut redis::Connection, key: &str) -> f64 {
    let text: String = redis::cmd("HGET")
        .arg(key)
        .arg("tokens")
        .query(con)
        .expect("HGET tokens");
    text.parse()
        .unwrap_or_else(|e| panic!("stored tokens {text:?} is not a number: {e}"))
}

/// A stored `last_refill` field as an integer.
pub fn stored_last_refill(con: &mut redis::Connection, key: &str) -> i64 {
    let text: String = redis::cmd("HGET")
        .arg(key)
        .arg("last_refill")
        .query(con)
        .expect("HGET last_refill");
    text.parse()
        .unwrap_or_else(|e| panic!("stored last_refill {text:?} is not an integer: {e}"))
}

/// Everything observable about a key that a command could change: its serialized value and
/// its absolute expiry. Two equal snapshots mean the key was not touched.
#[derive(Debug, PartialEq, Eq, Clone)]
pub struct KeySnapshot {
    pub key_type: String,
    pub dump: Option<Vec<u8>>,
    pub expire_at_ms: i64,
}

pub fn snapshot(con: &mut redis::Connection, key: &[u8]) -> KeySnapshot {
    KeySnapshot {
        key_type: redis::cmd("TYPE").arg(key).query(con).expect("TYPE"),
        dump: redis::cmd("DUMP").arg(key).query(con).expect("DUMP"),
        expire_at_ms: redis::cmd("PEXPIRETIME")
            .arg(key)
            .query(con)
            .expect("PEXPIRETIME"),
    }
}

/// Sleeps `ms` milliseconds.
pub fn sleep_ms(ms: i64) {
    if ms > 0 {
        thread::sleep(Duration::from_millis(ms as u64));
    }
}

fn try_connect(client: &redis::Client) -> Result<redis::Connection, String> {
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .map_err(|e| e.to_string())?;
    con.set_read_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    con.set_write_timeout(Some(IO_TIMEOUT))
        .map_err(|e| e.to_string())?;
    match redis::cmd("PING").query::<String>(&mut con) {
        Ok(s) if s == "PONG" => Ok(con),
        Ok(other) => Err(format!("PING answered {other:?}")),
        Err(e) => Err(e.to_string()),
    }
}

fn server_pid(con: &mut redis::Connection) -> Option<u32> {
    let info: String = redis::cmd("INFO").arg("server").query(con).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|v| v.trim().parse().ok())
}

fn wait_exit(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// `<CARGO_TARGET_TMPDIR or <crate>/target>/tb-it/<pid>-<n>-<nanos>`, created empty.
fn fresh_dir() -> PathBuf {
    let base = match option_env!("CARGO_TARGET_TMPDIR") {
        Some(tmp) => PathBuf::from(tmp),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("target"),
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let id = NEXT_ID.fetch_add(1, Ordering::SeqCst);
    let dir = base
        .join("tb-it")
        .join(format!("{}-{}-{}", std::process::id(), id, nanos));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    // Leave a breadcrumb naming the test thread, handy when a directory is left behind.
    if let Ok(mut f) = fs::File::create(dir.join("test.txt")) {
        let _ = writeln!(f, "{}", thread::current().name().unwrap_or("?"));
    }
    dir
}

fn read_lossy(path: &Path) -> String {
    fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `HGETALL` with fields and values as raw bytes, for byte-for-byte comparisons.
pub fn hgetall_bytes(con: &mut redis::Connection, key: &str) -> BTreeMap<Vec<u8>, Vec<u8>> {
    redis::cmd("HGETALL").arg(key).query(con).expect("HGETALL")
}

/// Every command in the incremental AOF files (`<dir>/appendonlydir/*.incr.aof`), in order,
/// each as its argv (MULTI and EXEC included). Call it after a reply from the server when
/// running with `appendfsync always`: the server fsyncs the AOF before it replies.
pub fn aof_commands(dir: &Path) -> Vec<Vec<Vec<u8>>> {
    let aof_dir = dir.join("appendonlydir");
    // Incremental files are numbered in the order they were created.
    let mut files: Vec<(u64, PathBuf)> = fs::read_dir(&aof_dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", aof_dir.display()))
        .map(|entry| entry.expect("appendonlydir entry").path())
        .filter_map(|path| {
            let name = path
                .file_name()?
                .to_str()?
                .strip_suffix(".incr.aof")?
                .to_string();
            let seq = name.rsplit('.').next()?.parse().ok()?;
            Some((seq, path))
        })
        .collect();
    files.sort();
    let mut commands = Vec::new();
    for (_, path) in files {
        let bytes = fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
        let mut rest = bytes.as_slice();
        while !rest.is_empty() {
            // Annotations (`#TS:...`) are whole lines starting with '#'.
            if rest[0] == b'#' {
                rest = resp_line(rest, b'#', &path).1;
                continue;
            }
            let (argc, mut tail) = resp_line(rest, b'*', &path);
            let mut argv = Vec::new();
            for _ in 0..argc.parse::<usize>().expect("AOF: argument count") {
                let (len, after) = resp_line(tail, b'$', &path);
                let len: usize = len.parse().expect("AOF: bulk length");
                assert!(
                    after.len() >= len + 2,
                    "AOF {} ends inside an argument",
                    path.display()
                );
                argv.push(after[..len].to_vec());
                tail = &after[len + 2..];
            }
            commands.push(argv);
            rest = tail;
        }
    }
    commands
}

/// Splits `<prefix><text>\r\n` off the front of `bytes`.
fn resp_line<'a>(bytes: &'a [u8], prefix: u8, path: &Path) -> (String, &'a [u8]) {
    assert_eq!(
        bytes.first(),
        Some(&prefix),
        "AOF {}: expected {:?} at {:?}",
        path.display(),
        prefix as char,
        String::from_utf8_lossy(&bytes[..bytes.len().min(40)])
    );
    let end = bytes
        .windows(2)
        .position(|w| w == b"\r\n")
        .unwrap_or_else(|| panic!("AOF {}: unterminated line", path.display()));
    (
        String::from_utf8_lossy(&bytes[1..end]).into_owned(),
        &bytes[end + 2..],
    )
}

// --- Replication helpers (first used by tests/takeall.rs and tests/refund.rs) ---

/// How long a replica may take to connect, sync and catch up.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(20);

/// Arguments for a master whose replication offset moves only when a command is propagated:
/// without `--repl-ping-replica-period 3600` it PINGs its replicas every 10 s; the sync delay
/// of 0 starts the initial sync at once instead of after 5 s.
pub const QUIET_MASTER_ARGS: &[&str] = &[
    "--repl-ping-replica-period",
    "3600",
    "--repl-diskless-sync-delay",
    "0",
];

/// Polls `ready` every 10 ms until it returns true; panics naming `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let start = Instant::now();
    while !ready() {
        assert!(
            start.elapsed() < timeout,
            "timed out after {timeout:?} waiting for {what}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// One `field:value` line of `INFO <section>`, if present.
pub fn info_field(con: &mut redis::Connection, section: &str, field: &str) -> Option<String> {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query(con)
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"));
    info.lines()
        .filter_map(|line| line.split_once(':'))
        .find(|(name, _)| *name == field)
        .map(|(_, value)| value.trim().to_string())
}

/// `master_repl_offset` from `INFO replication` (on a master or a replica).
pub fn repl_offset(con: &mut redis::Connection) -> i64 {
    info_field(con, "replication", "master_repl_offset")
        .expect("master_repl_offset in INFO replication")
        .parse()
        .expect("master_repl_offset is an integer")
}

/// Starts a server, makes it a replica of `master` and waits (bounded) until the link is up
/// and it has applied everything the master has sent so far.
pub fn start_replica_of(master: &Server) -> Server {
    let replica = Server::start();
    let mut rcon = replica.conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master.port)
        .query(&mut rcon)
        .expect("REPLICAOF");
    wait_until("master_link_status:up on the replica", SYNC_TIMEOUT, || {
        info_field(&mut rcon, "replication", "master_link_status").as_deref() == Some("up")
    });
    wait_for_replica(master, &replica);
    replica
}

/// Waits (bounded) until the replica's `master_repl_offset` equals the master's.
pub fn wait_for_replica(master: &Server, replica: &Server) {
    let mut mcon = master.conn();
    let mut rcon = replica.conn();
    let start = Instant::now();
    loop {
        let (m, r) = (repl_offset(&mut mcon), repl_offset(&mut rcon));
        if m == r {
            return;
        }
        assert!(
            start.elapsed() < SYNC_TIMEOUT,
            "replica did not catch up within {SYNC_TIMEOUT:?}: master offset {m}, replica offset {r}"
        );
        thread::sleep(Duration::from_millis(10));
    }
}

/// How long a starting server may take to answer PING: `TB_START_TIMEOUT_MS` if set (e.g. a
/// server under valgrind, `scripts/sanitize.sh`), else `START_TIMEOUT`.
pub fn start_timeout() -> Duration {
    std::env::var("TB_START_TIMEOUT_MS")
        .ok()
        .and_then(|ms| ms.trim().parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(START_TIMEOUT)
}

/// One reply read off the wire by `RawClient`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resp {
    Ints(Vec<i64>),
    /// An array with bulk strings or nils in it, each element as text
    /// (`None`: nil).
    Items(Vec<Option<String>>),
    Error(String),
    /// Anything else, as its first line.
    Other(String),
}

/// A bare RESP client on its own TCP connection, for blocking commands: it can send a command
/// and look for the reply later, with a timeout, without giving up the connection (a TB.BTAKE
/// waiter is a client whose reply has not come yet).
pub struct RawClient {
    stream: std::net::TcpStream,
    buffer: Vec<u8>,
}

impl RawClient {
    pub fn connect(server: &Server) -> RawClient {
        let stream = std::net::TcpStream::connect(("127.0.0.1", server.port)).expect("connect");
        stream.set_nodelay(true).expect("nodelay");
        RawClient {
            stream,
            buffer: Vec::new(),
        }
    }

    /// Sends one command; does not wait for its reply.
    pub fn send(&mut self, args: &[&str]) {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
        }
        self.stream.write_all(&out).expect("send");
    }

    /// The next reply, if one arrives within `within`.
    pub fn reply_within(&mut self, within: Duration) -> Option<Resp> {
        use std::io::Read;
        let deadline = Instant::now() + within;
        loop {
            if let Some((reply, used)) = parse_resp(&self.buffer) {
                self.buffer.drain(..used);
                return Some(reply);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            // Even with no time left, what has already arrived is read once.
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .expect("read timeout");
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => panic!("the server closed the connection"),
                Ok(read) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(e) => panic!("read: {e}"),
            }
            if Instant::now() >= deadline {
                return parse_resp(&self.buffer).map(|(reply, used)| {
                    self.buffer.drain(..used);
                    reply
                });
            }
        }
    }

    /// The next reply; panics if none comes within 10 s.
    pub fn reply(&mut self) -> Resp {
        self.reply_within(Duration::from_secs(10))
            .expect("a reply within 10 s")
    }

    /// True when the server has closed the connection (reads return end of file).
    pub fn closed_within(&mut self, within: Duration) -> bool {
        use std::io::Read;
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            self.stream
                .set_read_timeout(Some(Duration::from_millis(20)))
                .expect("read timeout");
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return true,
                Ok(read) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
                Err(_) => {}
            }
        }
        false
    }
}

/// One complete reply at the start of `bytes`, and how many bytes it used.
fn parse_resp(bytes: &[u8]) -> Option<(Resp, usize)> {
    let line_end = |from: usize| {
        bytes
            .get(from..)?
            .windows(2)
            .position(|w| w == b"\r\n")
            .map(|p| from + p)
    };
    let first = line_end(0)?;
    let line = String::from_utf8_lossy(&bytes[1..first]).into_owned();
    match bytes.first()? {
        b'-' => Some((Resp::Error(line), first + 2)),
        b'*' => {
            let count: usize = line.parse().ok()?;
            // Integers, bulk strings and nils (TB.ACQUIRE's lease); as text.
            let mut items: Vec<Option<String>> = Vec::with_capacity(count);
            let mut all_ints = true;
            let mut at = first + 2;
            for _ in 0..count {
                let end = line_end(at)?;
                let text = String::from_utf8_lossy(&bytes[at + 1..end]).into_owned();
                match bytes.get(at) {
                    Some(b':') => {
                        items.push(Some(text));
                        at = end + 2;
                    }
                    Some(b'$') if text == "-1" => {
                        all_ints = false;
                        items.push(None);
                        at = end + 2;
                    }
                    Some(b'$') => {
                        all_ints = false;
                        let len: usize = text.parse().ok()?;
                        let body = bytes.get(end + 2..end + 2 + len)?;
                        items.push(Some(String::from_utf8_lossy(body).into_owned()));
                        at = end + 2 + len + 2;
                        if bytes.len() < at {
                            return None;
                        }
                    }
                    _ => return Some((Resp::Other(line), end + 2)),
                }
            }
            if all_ints {
                let ints = items
                    .iter()
                    .map(|item| item.as_deref().and_then(|text| text.parse().ok()))
                    .collect::<Option<Vec<i64>>>()?;
                Some((Resp::Ints(ints), at))
            } else {
                Some((Resp::Items(items), at))
            }
        }
        _ => Some((Resp::Other(line), first + 2)),
    }
}

// --- Shared test vocabulary -------------------------------------------------------------------

/// The argument errors every TB.* command replies (checked in order: capacity, rate, n).
pub const CAPACITY_ERROR: &str = "ERR capacity must be a positive finite number";
pub const RATE_ERROR: &str = "ERR rate must be a positive finite number";
pub const N_ERROR: &str = "ERR n must be a non-negative finite number";
/// The server's reply for a key of another type.
pub const WRONGTYPE_ERROR: &str =
    "WRONGTYPE Operation against a key holding the wrong kind of value";

/// The error for a hash that is not a bucket, naming the key as the module shows it.
pub fn corrupt_error(shown_key: &str) -> String {
    format!("ERR corrupt bucket '{shown_key}': tokens and last_refill must be finite numbers")
}

/// Writes a bucket by hand: `tokens` and `last_refill` (ms, or any spelling of it).
pub fn seed_bucket(
    con: &mut redis::Connection,
    key: &str,
    tokens: &str,
    last_refill: impl std::fmt::Display,
) {
    hset(
        con,
        key,
        &[
            ("tokens", tokens),
            ("last_refill", &last_refill.to_string()),
        ],
    );
}

/// Everything about a bucket a command could change: its fields and its absolute expiry
/// (`PEXPIRETIME`: -2 when the key does not exist).
#[derive(Debug, PartialEq, Eq, Clone)]
pub struct Bucket {
    pub fields: BTreeMap<Vec<u8>, Vec<u8>>,
    pub expire_at_ms: i64,
}

pub fn bucket(con: &mut redis::Connection, key: &str) -> Bucket {
    Bucket {
        fields: hgetall_bytes(con, key),
        expire_at_ms: pexpiretime(con, key),
    }
}

pub fn buckets(con: &mut redis::Connection, keys: &[&str]) -> Vec<Bucket> {
    keys.iter().map(|key| bucket(con, key)).collect()
}

/// Asserts `low <= value <= high`, naming `what`.
pub fn assert_within(what: &str, value: i64, low: i64, high: i64) {
    assert!(
        low <= value && value <= high,
        "{what} = {value}, expected within [{low}, {high}]"
    );
}

/// WATCHes `key` on `con`, runs `call` on a second connection, and says whether the watching
/// transaction still runs (`false`: `call` signalled the key).
pub fn watch_survives(
    server: &Server,
    con: &mut redis::Connection,
    key: &str,
    call: impl FnOnce(&mut redis::Connection),
) -> bool {
    let mut other = server.conn();
    watch(con, key);
    call(&mut other);
    watched_transaction_runs(con)
}

/// `EVAL` (or `EVAL_RO`, ...) of `return redis.call('<command>', KEYS[1], ARGV[1], ...)` with
/// `key` and `args`; panics on an error reply.
pub fn eval_tb(
    con: &mut redis::Connection,
    eval: &str,
    command: &str,
    key: &str,
    args: &[&str],
) -> Vec<i64> {
    let argv: Vec<String> = (1..=args.len()).map(|i| format!(", ARGV[{i}]")).collect();
    let script = format!("return redis.call('{command}', KEYS[1]{})", argv.concat());
    redis::cmd(eval)
        .arg(&script)
        .arg(1)
        .arg(key)
        .arg(args)
        .query(con)
        .unwrap_or_else(|e| panic!("{eval} {command} {key} {args:?} failed: {e}"))
}

/// A sorted set (a lease set: the ids and `seq`) as `(member, score)` pairs, lowest score
/// first.
pub fn members(con: &mut redis::Connection, key: &str) -> Vec<(String, i64)> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(con)
        .expect("ZRANGE")
}

/// One field of `INFO tb`; panics when it is missing.
pub fn tb_field(con: &mut redis::Connection, name: &str) -> String {
    info_field(con, "tb", name).unwrap_or_else(|| panic!("INFO tb {name}"))
}

/// Waits (bounded, 10 s) until `INFO tb` shows `count` clients waiting.
pub fn wait_for_waiting(con: &mut redis::Connection, count: i64) {
    wait_until(
        &format!("tb_waiting = {count}"),
        Duration::from_secs(10),
        || tb_field(con, "tb_waiting") == count.to_string(),
    );
}

/// Makes `server` a replica of `other` while `waiter` (TB.BTAKE or TB.ACQUIRE) waits there:
/// the server ends the wait with its own `-UNBLOCKED` error, and afterwards nobody waits on
/// it and the wait counts as abandoned (`tb_waits_abandoned`), not answered by the module.
pub fn turn_replica_under_waiter(server: &Server, other: &Server, waiter: &mut RawClient) {
    let mut con = server.conn();
    wait_for_waiting(&mut con, 1);
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(other.port)
        .query(&mut con)
        .expect("REPLICAOF");
    match waiter.reply() {
        Resp::Error(text) => assert!(text.starts_with("UNBLOCKED"), "{text}"),
        reply => panic!("expected -UNBLOCKED, got {reply:?}"),
    }
    wait_for_waiting(&mut con, 0);
    assert_eq!(tb_field(&mut con, "tb_waits_abandoned"), "1");
}

/// SplitMix64: small, seeded, the same on every platform; for picking test inputs.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// `count` random decimal digits.
    pub fn digits(&mut self, count: usize) -> Vec<u8> {
        (0..count).map(|_| b'0' + self.below(10) as u8).collect()
    }

    /// A decimal in [low, low + span) with `places` decimals, as text.
    pub fn decimal(&mut self, low: f64, span: f64, places: usize) -> String {
        let unit = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        format!("{:.*}", places, low + unit * span)
    }
}

// --- Added for tests/btake_events.rs and tests/btake_soak.rs --------------------------------

/// The server closed a `RawClient`'s connection (it was killed, or the server died).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionClosed;

impl RawClient {
    /// Sends several commands in one write, so the server reads (and runs) them together.
    pub fn send_all(&mut self, commands: &[&[&str]]) {
        let mut out = Vec::new();
        for args in commands {
            out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
            for arg in *args {
                out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
            }
        }
        self.stream.write_all(&out).expect("send");
    }

    /// Like `send`, but a connection the server has closed is an `Err`, not a panic.
    pub fn try_send(&mut self, args: &[&str]) -> Result<(), ConnectionClosed> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for arg in args {
            out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
        }
        self.stream.write_all(&out).map_err(|_| ConnectionClosed)
    }

    /// Like `reply_within`, but a connection the server has closed (with no complete reply
    /// left to read) is an `Err`, not a panic.
    pub fn try_reply_within(&mut self, within: Duration) -> Result<Option<Resp>, ConnectionClosed> {
        use std::io::Read;
        let deadline = Instant::now() + within;
        loop {
            if let Some((reply, used)) = parse_resp(&self.buffer) {
                self.buffer.drain(..used);
                return Ok(Some(reply));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            self.stream
                .set_read_timeout(Some(left.max(Duration::from_millis(1))))
                .expect("read timeout");
            let mut chunk = [0u8; 4096];
            match self.stream.read(&mut chunk) {
                Ok(0) => return Err(ConnectionClosed),
                Ok(read) => self.buffer.extend_from_slice(&chunk[..read]),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return Err(ConnectionClosed),
            }
            if Instant::now() >= deadline {
                return Ok(parse_resp(&self.buffer).map(|(reply, used)| {
                    self.buffer.drain(..used);
                    reply
                }));
            }
        }
    }
}

/// The lines of the server log that tell why it died (a failed assertion, a crash), if any.
pub fn crash_lines(server: &Server) -> String {
    server
        .log()
        .lines()
        .filter(|line| {
            line.contains("ASSERTION FAILED")
                || line.contains("crashed by signal")
                || line.contains("Guru Meditation")
                || line.contains("==> ")
                || line.contains("panicked")
        })
        .take(10)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Sends `signal` (e.g. `libc::SIGSTOP`) to the server process.
pub fn signal(server: &Server, signal: i32) {
    let pid = server.pid().expect("the server is running") as i32;
    // SAFETY: a plain syscall on a child process of this test.
    let rc = unsafe { libc::kill(pid, signal) };
    assert_eq!(rc, 0, "kill({pid}, {signal})");
}

/// True while the server process exists and has not exited (without talking to it: a
/// server under CLIENT PAUSE ALL does not answer).
pub fn process_running(server: &Server) -> bool {
    let Some(pid) = server.pid() else {
        return false;
    };
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

// --- The Lua fallback, for tests/lua_fallback.rs and tests/leases_lua.rs ----------------------

/// The one Lua source, `lua/tb.lua`: loaded as it is by FUNCTION LOAD, and without its first
/// line as an EVAL script (see `tb_lua_script`).
pub const TB_LUA: &str = include_str!("../../lua/tb.lua");

/// `TB_LUA` as an EVAL script: without the `#!lua name=tb` shebang, whose `name=` EVAL refuses.
pub fn tb_lua_script() -> &'static str {
    TB_LUA.split_once('\n').map_or("", |(_, rest)| rest)
}

/// Where the fallback runs: an EVALSHA of `lua/tb.lua` as a script, or an FCALL of it loaded
/// as a library. Both take the same keys and arguments; the script takes the command name as
/// its first argument, the library has one function per command (`tb_<command>`).
#[derive(Clone)]
pub enum Fallback {
    Script { sha: String },
    Function,
}

impl Fallback {
    /// SCRIPT LOAD of `lua/tb.lua` on `con`'s server.
    pub fn script(con: &mut redis::Connection) -> Fallback {
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(tb_lua_script())
            .query(con)
            .expect("SCRIPT LOAD lua/tb.lua");
        Fallback::Script { sha }
    }

    /// FUNCTION LOAD of `lua/tb.lua` on `con`'s server; REPLACE, so loading it twice on one
    /// server is no error.
    pub fn function(con: &mut redis::Connection) -> Fallback {
        let name: String = redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(TB_LUA)
            .query(con)
            .expect("FUNCTION LOAD lua/tb.lua");
        assert_eq!(name, "tb");
        Fallback::Function
    }

    /// The twin of TB.<COMMAND> on one key (`command` in lower case: take, acquire, ...).
    pub fn cmd(&self, command: &str, key: &[u8], args: &[&[u8]]) -> redis::Cmd {
        self.cmd_for(command, &[key], args)
    }

    /// The twin of TB.<COMMAND> on `keys` (several for takeall, or to test the key count).
    pub fn cmd_for(&self, command: &str, keys: &[&[u8]], args: &[&[u8]]) -> redis::Cmd {
        let mut cmd = match self {
            Fallback::Script { sha } => {
                let mut cmd = redis::cmd("EVALSHA");
                cmd.arg(sha);
                cmd
            }
            Fallback::Function => {
                let mut cmd = redis::cmd("FCALL");
                cmd.arg(format!("tb_{command}"));
                cmd
            }
        };
        cmd.arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        if let Fallback::Script { .. } = self {
            cmd.arg(command);
        }
        for arg in args {
            cmd.arg(*arg);
        }
        cmd
    }

    /// How failure messages name it.
    pub fn name(&self) -> &'static str {
        match self {
            Fallback::Script { .. } => "EVALSHA lua/tb.lua",
            Fallback::Function => "FCALL tb_*",
        }
    }
}
