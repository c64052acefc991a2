//! The crate ships the Lua text: `cargo package` follows the `lua` symlink,
//! and a path dependency from a fresh crate sees the same bytes as
//! lua/tb.lua. And its version is the module's.

use crate::common::repo_root;
use std::path::Path;
use std::process::Command;

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn cargo(dir: &Path, args: &[&str], target: &Path) -> String {
    let out = Command::new(env!("CARGO"))
        .args(args)
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", target)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn version_is_the_modules() {
    let root = std::fs::read_to_string(repo_root().join("Cargo.toml")).unwrap();
    let version = root
        .lines()
        .skip_while(|l| l.trim() != "[package]")
        .find_map(|l| l.strip_prefix("version = "))
        .unwrap()
        .trim_matches('"');
    assert_eq!(version, env!("CARGO_PKG_VERSION"));
    assert_eq!(version, redis_tb_client::VERSION);
}

#[test]
fn cargo_package_ships_the_lua_text() {
    let tmp = tempfile::tempdir().unwrap();
    let list = cargo(
        manifest_dir(),
        &["package", "--list", "--allow-dirty", "--offline"],
        tmp.path(),
    );
    assert!(list.lines().any(|l| l == "lua/tb.lua"), "{list}");
    // The crate depends on the pure core (`redis-tb-core`) by path, which is
    // not on crates.io: no lock file can be resolved for the package, so it
    // is left out (a library's lock file is not used by its dependents).
    cargo(
        manifest_dir(),
        &[
            "package",
            "--no-verify",
            "--allow-dirty",
            "--offline",
            "--exclude-lockfile",
        ],
        tmp.path(),
    );
    let crate_file = tmp.path().join("package/redis-tb-client-0.1.0.crate");
    let status = Command::new("tar")
        .arg("xzf")
        .arg(&crate_file)
        .arg("-C")
        .arg(tmp.path())
        .status()
        .unwrap();
    assert!(status.success());
    let shipped = tmp.path().join("redis-tb-client-0.1.0/lua/tb.lua");
    assert!(!shipped.symlink_metadata().unwrap().file_type().is_symlink());
    assert_eq!(
        std::fs::read(shipped).unwrap(),
        std::fs::read(repo_root().join("lua/tb.lua")).unwrap()
    );
}
