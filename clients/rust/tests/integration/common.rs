//! Real servers for the tests: `redis-server` (env `TB_SERVER`) on a free
//! 127.0.0.1 port, in a temp dir, with the module (env `TB_MODULE`, default
//! <repo>/target/release/libredis_tb.so) or without it; killed on drop, also
//! when a test panics. Plus a 3-master cluster.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis_tb_client::Logger;

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn module_path() -> PathBuf {
    let path = std::env::var_os("TB_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target/release/libredis_tb.so"));
    path.canonicalize().unwrap_or_else(|_| {
        panic!(
            "module not found at {} (cargo build --release at the repository root, or set TB_MODULE)",
            path.display()
        )
    })
}

fn server_bin() -> String {
    std::env::var("TB_SERVER").unwrap_or_else(|_| "redis-server".into())
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The command line of a throwaway server on `port`: no persistence, its
/// files and log in `dir`, with or without the module.
fn server_args(port: u16, dir: &tempfile::TempDir, module: bool) -> Vec<String> {
    let mut args: Vec<String> = vec![
        "--port".into(),
        port.to_string(),
        "--bind".into(),
        "127.0.0.1".into(),
        "--save".into(),
        "".into(),
        "--appendonly".into(),
        "no".into(),
        "--dir".into(),
        dir.path().display().to_string(),
        "--logfile".into(),
        "server.log".into(),
    ];
    if module {
        args.push("--loadmodule".into());
        args.push(module_path().display().to_string());
    }
    args
}

pub struct Server {
    pub port: u16,
    pub module: bool,
    child: Option<Child>,
    args: Vec<String>,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    pub fn with_module() -> Server {
        Server::start(true, &[])
    }

    pub fn without_module() -> Server {
        Server::start(false, &[])
    }

    /// The two kinds every API test runs on.
    pub fn both() -> [Server; 2] {
        [Server::with_module(), Server::without_module()]
    }

    /// A server that is not running yet, on a free port: `restart` starts it.
    pub fn not_started(module: bool) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let args = server_args(port, &dir, module);
        Server {
            port,
            module,
            child: None,
            args,
            _dir: Some(dir),
        }
    }

    pub fn start(module: bool, extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        for _ in 0..5 {
            let port = free_port();
            let mut args = server_args(port, &dir, module);
            args.extend(extra.iter().map(|s| s.to_string()));
            let mut server = Server {
                port,
                module,
                child: None,
                args,
                _dir: None,
            };
            if server.launch() {
                server._dir = Some(dir);
                return server;
            }
        }
        panic!("{} did not start", server_bin());
    }

    fn launch(&mut self) -> bool {
        let child = Command::new(server_bin())
            .args(&self.args)
            .stdout(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", server_bin()));
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Some(Ok(Some(_))) = self.child.as_mut().map(|c| c.try_wait()) {
                self.child = None;
                return false;
            }
            let ping = redis::Client::open(self.url())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c));
            if ping.is_ok() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.stop();
        false
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    /// A plain test connection with generous timeouts.
    pub fn conn(&self) -> redis::Connection {
        let con = self
            .client()
            .get_connection_with_timeout(Duration::from_secs(5))
            .unwrap();
        con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        con
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("running").id() as i32
    }

    pub fn signal(&self, sig: i32) {
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0);
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = unsafe { libc::kill(child.id() as i32, libc::SIGCONT) };
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Restarts the server on the same port, with or without the module.
    pub fn restart_with_module(&mut self, module: bool) {
        self.stop();
        if let Some(at) = self.args.iter().position(|a| a == "--loadmodule") {
            self.args.drain(at..at + 2);
        }
        if module {
            self.args.push("--loadmodule".into());
            self.args.push(module_path().display().to_string());
        }
        self.module = module;
        assert!(self.launch(), "restart on port {}", self.port);
    }

    /// Starts the stopped server again on the same port and directory.
    pub fn restart(&mut self) {
        self.stop();
        assert!(self.launch(), "restart on port {}", self.port);
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Log lines collected from a limiter or layer.
#[derive(Clone, Default)]
pub struct Lines(pub Arc<Mutex<Vec<(log::Level, String)>>>);

impl Lines {
    pub fn logger(&self) -> Logger {
        let lines = self.0.clone();
        Arc::new(move |level, message| lines.lock().unwrap().push((level, message.to_string())))
    }
    pub fn all(&self) -> Vec<(log::Level, String)> {
        self.0.lock().unwrap().clone()
    }
    /// How many lines at `level` contain `text`.
    pub fn count(&self, level: log::Level, text: &str) -> usize {
        self.all()
            .iter()
            .filter(|(l, m)| *l == level && m.contains(text))
            .count()
    }
}

/// A slow bucket: nothing refills while a test runs (1 token per 1000 s).
pub const SLOW: f64 = 0.001;

pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f() {
            Ok(v) => return v,
            Err(e) if Instant::now() > deadline => panic!("timed out waiting for {what}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// How many clients `server` has blocked (TB.BTAKE or TB.ACQUIRE waiters among them).
pub fn blocked_clients(server: &Server) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("clients")
        .query(&mut server.conn())
        .unwrap();
    field(&info, "blocked_clients")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no blocked_clients in {info}"))
}

fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .map(str::trim)
}

/// Three masters owning all 16384 slots.
pub struct Cluster {
    pub nodes: Vec<Server>,
}

const SLOT_RANGES: [(u16, u16); 3] = [(0, 5460), (5461, 10922), (10923, 16383)];

impl Cluster {
    pub fn start(module: bool) -> Cluster {
        let mut nodes = Vec::new();
        let mut buses = Vec::new();
        for _ in 0..3 {
            let bus = free_port().to_string();
            nodes.push(Server::start(
                module,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    "5000",
                ],
            ));
            buses.push(bus);
        }
        for (i, (node, (first, last))) in nodes.iter().zip(SLOT_RANGES).enumerate() {
            let mut con = node.conn();
            let _: () = redis::cmd("CLUSTER")
                .arg("SET-CONFIG-EPOCH")
                .arg(i + 1)
                .query(&mut con)
                .unwrap();
            let _: () = redis::cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(first)
                .arg(last)
                .query(&mut con)
                .unwrap();
        }
        let mut first = nodes[0].conn();
        for (node, bus) in nodes.iter().zip(&buses).skip(1) {
            let _: () = redis::cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(node.port)
                .arg(bus)
                .query(&mut first)
                .unwrap();
        }
        for node in &nodes {
            let mut con = node.conn();
            wait_for("the cluster to converge", || {
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut con)
                    .map_err(|e| e.to_string())?;
                let slots: Vec<redis::Value> = redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query(&mut con)
                    .map_err(|e| e.to_string())?;
                if field(&info, "cluster_state") == Some("ok")
                    && field(&info, "cluster_known_nodes") == Some("3")
                    && slots.len() == 3
                {
                    Ok(())
                } else {
                    Err(info)
                }
            });
        }
        Cluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }

    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClientBuilder::new(self.urls())
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(10))
            .build()
            .unwrap()
    }
}
