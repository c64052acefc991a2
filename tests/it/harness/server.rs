//! Starting a real server with the module loaded, connecting to it, and cleaning up: every
//! test gets its own server on a free port with its own directory, killed on drop.
//!
//! The [`Server`] guard kills the process and removes the directory on drop, also when the
//! test panicked (then it prints the tail of the logs first), so tests run in parallel
//! without sharing state.

use std::collections::HashMap;
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
    /// The binary, when not `server_binary()`, and variables added to the
    /// environment (`start_under`; kept for `restart`).
    binary: Option<PathBuf>,
    env: Vec<(String, String)>,
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

    /// The server `binary`, with the module loaded, `env` added to its environment
    /// (e.g. `LD_PRELOAD` of libfaketime, see `clock.rs`), then the defaults and `extra`.
    pub fn start_under(binary: &Path, env: &[(String, String)], extra: &[&str]) -> Server {
        let mut server = Server::unstarted(extra, Some((module_path(), Vec::new())));
        server.binary = Some(binary.to_path_buf());
        server.env = env.to_vec();
        server.bind_and_wait();
        server
    }

    fn launch(extra: &[&str], module: Option<(PathBuf, Vec<String>)>) -> Server {
        let mut server = Server::unstarted(extra, module);
        server.bind_and_wait();
        server
    }

    fn unstarted(extra: &[&str], module: Option<(PathBuf, Vec<String>)>) -> Server {
        Server {
            port: 0,
            dir: fresh_dir(),
            child: Mutex::new(None),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            module,
            binary: None,
            env: Vec::new(),
        }
    }

    /// Starts the process on a free port, trying another when the port was taken.
    fn bind_and_wait(&mut self) {
        let mut last_failure = String::new();
        for _ in 0..PORT_ATTEMPTS {
            self.port = free_port();
            match self.spawn_and_wait() {
                Ok(()) => return,
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
        let binary = match &self.binary {
            Some(binary) => binary.display().to_string(),
            None => server_binary(),
        };
        let child = Command::new(&binary)
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .args(&args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stdio_err)
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run `{binary}` ({e}); install redis-server or set TB_SERVER")
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

/// A server with the module and `cluster-enabled yes`, its cluster bus on `bus_port` (given
/// explicitly: the default, port + 10000, can pass 65535 for the ephemeral ports picked here),
/// its node file in its own directory; `extra` follows.
pub fn start_cluster_node(bus_port: u16, extra: &[&str]) -> Server {
    let bus_port = bus_port.to_string();
    let mut args = vec![
        "--cluster-enabled",
        "yes",
        // Relative to the server's --dir (its own test directory).
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-port",
        &bus_port,
    ];
    args.extend_from_slice(extra);
    Server::start_with(&args)
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

/// The test-only build with the `fault-injection` feature (see `src/testing/fault.rs`):
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

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    listener.local_addr().expect("local addr").port()
}

/// `<CARGO_TARGET_TMPDIR or <crate>/target>/tb-it/<pid>-<n>-<nanos>`, created empty.
pub fn fresh_dir() -> PathBuf {
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

/// `CONFIG GET name`: the name, then its value.
pub fn config_get(con: &mut redis::Connection, name: &str) -> Vec<String> {
    redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query(con)
        .expect("CONFIG GET")
}

/// MODULE LIST: one map a loaded module (`name`, `ver`, `path`, `args`).
pub fn module_list(con: &mut redis::Connection) -> Vec<HashMap<String, redis::Value>> {
    redis::cmd("MODULE")
        .arg("LIST")
        .query(con)
        .expect("MODULE LIST")
}

/// This module's `ver` in MODULE LIST (its name is `tb`).
pub fn tb_module_version(con: &mut redis::Connection) -> Option<redis::Value> {
    let tb = redis::Value::BulkString(b"tb".to_vec());
    module_list(con)
        .into_iter()
        .find(|module| module.get("name") == Some(&tb))
        .expect("tb in MODULE LIST")
        .remove("ver")
}

/// What MODULE LIST shows as `ver` for `version` (major.minor.patch, a pre-release after
/// `-` left out): major * 10000 + minor * 100 + patch.
pub fn encoded_version(version: &str) -> i64 {
    let mut parts = version
        .split(['.', '-'])
        .map(|part| part.parse::<i64>().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    let (major, minor, patch) = (next(), next(), next());
    major * 10000 + minor * 100 + patch
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

/// How long a starting server may take to answer PING: `TB_START_TIMEOUT_MS` if set (e.g. a
/// server under valgrind, `scripts/sanitize.sh`), else `START_TIMEOUT`.
pub fn start_timeout() -> Duration {
    std::env::var("TB_START_TIMEOUT_MS")
        .ok()
        .and_then(|ms| ms.trim().parse().ok())
        .map(Duration::from_millis)
        .unwrap_or(START_TIMEOUT)
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
