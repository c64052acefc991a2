//! Starts a throwaway redis-server with the redis-tb module on a free
//! loopback port; stopped when dropped (so also when a test panics).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
}

/// `$TB_MODULE`, or the module built by `cargo build --release` in the repository root.
pub fn module_path() -> PathBuf {
    let path = std::env::var_os("TB_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/libredis_tb.so")
        });
    path.canonicalize().unwrap_or_else(|_| {
        panic!(
            "module not found at {} (run `cargo build --release` in the repository root, or set TB_MODULE)",
            path.display()
        )
    })
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl RedisServer {
    pub fn start() -> RedisServer {
        let module = module_path();
        let bin = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        // The port is free when picked but could be taken before the server binds it: retry.
        for _ in 0..5 {
            let port = free_port();
            let child = Command::new(&bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .arg("--loadmodule")
                .arg(&module)
                .args(["--save", "", "--appendonly", "no", "--dir"])
                .arg(std::env::temp_dir())
                .stdout(Stdio::null())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
            let mut server = RedisServer {
                child: Some(child),
                port,
            };
            if server.wait_ready() {
                return server;
            }
        }
        panic!("redis-server with {} did not start", module.display());
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn connection(&self) -> redis::Connection {
        let con = redis::Client::open(self.url())
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .unwrap();
        con.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        con
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.as_mut().unwrap().try_wait() {
                self.child = None; // exited: port taken, or the module failed to load
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

    /// Stops the server now (kill and reap); dropping does the same.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}
