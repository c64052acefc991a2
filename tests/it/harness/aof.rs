//! The append-only file: the commands a server appended, read back from its directory, to
//! check what a call persists (effects, never the TB.* command itself) and what it does not.

use std::fs;
use std::path::{Path, PathBuf};

use super::commands::{hgetall, pexpiretime, ping};
use super::server::Server;

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

/// Server arguments for an AOF that is written and fsynced before every reply, so what a test
/// reads from it after a reply is complete.
pub const AOF_ARGS: &[&str] = &["--appendonly", "yes", "--appendfsync", "always"];

/// The AOF's commands without SELECT (which the server adds whenever it likes), complete up to
/// now: `server` runs with `AOF_ARGS`, and `con` is a connection to it.
pub fn aof_without_select(server: &Server, con: &mut redis::Connection) -> Vec<Vec<Vec<u8>>> {
    // With `appendfsync always` the AOF is written before any reply: after this PING every
    // earlier command is on disk.
    assert!(ping(con));
    aof_commands(&server.dir)
        .into_iter()
        .filter(|argv| !argv[0].eq_ignore_ascii_case(b"SELECT"))
        .collect()
}

/// A command as the AOF holds it: each argument as bytes.
pub fn argv(args: &[&str]) -> Vec<Vec<u8>> {
    args.iter().map(|a| a.as_bytes().to_vec()).collect()
}

/// What the AOF must hold for a bucket the module wrote: `HSET key tokens .. last_refill ..`
/// and `PEXPIREAT key <deadline>`, with the values `key` holds now.
pub fn bucket_write(con: &mut redis::Connection, key: &str) -> [Vec<Vec<u8>>; 2] {
    let fields = hgetall(con, key);
    let deadline_ms = pexpiretime(con, key).to_string();
    [
        argv(&[
            "HSET",
            key,
            "tokens",
            &fields["tokens"],
            "last_refill",
            &fields["last_refill"],
        ]),
        argv(&["PEXPIREAT", key, &deadline_ms]),
    ]
}

/// Asserts that no TB.* command reached the AOF: the module appends its effects only.
pub fn assert_no_tb_command(logged: &[Vec<Vec<u8>>]) {
    assert!(
        !logged
            .iter()
            .any(|argv| argv[0].to_ascii_uppercase().starts_with(b"TB.")),
        "a TB.* command reached the AOF"
    );
}
