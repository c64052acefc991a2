//! redis-cell 0.2.2 (`CL.THROTTLE`), the module TB.THROTTLE answers like, for tests that
//! load it beside redis-tb: built outside the tree by `scripts/build-redis-cell.sh` (cached
//! after the first build; needs crates.io once), or taken from `TB_CELL_MODULE`.
//!
//! If it cannot be had, a test that needs it fails under `CI=true` and otherwise skips with
//! a loud message on stderr ([`redis_cell_module`] returns `None`).

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

/// The path of redis-cell's .so, built once per test binary; `None` (after a loud message)
/// when it cannot be built outside CI. Panics under `CI=true` when it cannot be built.
pub fn redis_cell_module() -> Option<PathBuf> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let built = BUILT.get_or_init(|| {
        if let Ok(path) = std::env::var("TB_CELL_MODULE") {
            let path = PathBuf::from(path);
            return if path.is_file() {
                Ok(path)
            } else {
                Err(format!("TB_CELL_MODULE={} is not a file", path.display()))
            };
        }
        let root = env!("CARGO_MANIFEST_DIR");
        let output = Command::new("bash")
            .arg(format!("{root}/scripts/build-redis-cell.sh"))
            .current_dir(root)
            .output()
            .map_err(|e| format!("could not run scripts/build-redis-cell.sh: {e}"))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let path = stdout.lines().last().map(PathBuf::from);
        match path {
            Some(path) if output.status.success() && path.is_file() => Ok(path),
            _ => Err(format!(
                "scripts/build-redis-cell.sh failed:\n{}",
                String::from_utf8_lossy(&output.stderr)
            )),
        }
    });
    match built {
        Ok(path) => Some(path.clone()),
        Err(why) if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("redis-cell is required in CI (CI=true): {why}")
        }
        Err(why) => {
            eprintln!(
                "\n*** SKIPPED: redis-cell is not available, so this test checks nothing. ***\n\
                 *** {why}\n\
                 *** (Under CI=true this is a failure.)\n"
            );
            None
        }
    }
}

/// `CL.THROTTLE` / `TB.THROTTLE` (`command`) with its five integers.
pub fn throttle(
    con: &mut redis::Connection,
    command: &str,
    key: &str,
    args: &[i64],
) -> redis::RedisResult<Vec<i64>> {
    let mut cmd = redis::cmd(command);
    cmd.arg(key);
    for arg in args {
        cmd.arg(*arg);
    }
    cmd.query(con)
}
