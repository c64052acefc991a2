//! Releases: one version everywhere, and the artifacts `make dist` writes (scripts/dist.sh),
//! each installed the way a user would install it and loaded by a real server.
//!
//! Each artifact test builds its own artifacts from the module under test (`TB_MODULE`) into a
//! directory of its own, so it never reads a stale `dist/` and tests can run in parallel.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The package name of the .deb, as in scripts/dist.sh.
const DEB_PACKAGE: &str = "redis-tb";
/// Where the .deb puts its two files (scripts/dist.sh, packaging/redis-tb.conf).
const DEB_MODULE: &str = "/usr/lib/redis/modules/redis-tb.so";
const DEB_SNIPPET: &str = "/etc/redis/modules/redis-tb.conf";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(relative: &str) -> String {
    fs::read_to_string(root().join(relative)).unwrap_or_else(|e| panic!("read {relative}: {e}"))
}

/// The `version = "..."` of a TOML file's `[section]`: a line parser, enough for the
/// manifests here (a trailing `# comment` is allowed, as in pyproject.toml).
fn toml_version(relative: &str, section: &str) -> String {
    let text = read(relative);
    let mut in_section = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == format!("[{section}]");
        } else if in_section {
            if let Some(value) = line.strip_prefix("version") {
                if let Some(value) = value.trim_start().strip_prefix('=') {
                    if let Some(quoted) = value.trim().strip_prefix('"') {
                        if let Some(end) = quoted.find('"') {
                            return quoted[..end].to_string();
                        }
                    }
                }
            }
        }
    }
    panic!("{relative}: no version in [{section}]");
}

/// The top-level `"version"` of a package.json as npm writes it (two-space indent; nested
/// objects are indented further, so their "version" keys do not match).
fn package_json_version(relative: &str) -> String {
    let text = read(relative);
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("  \"version\":") {
            let rest = rest.trim().trim_end_matches(',');
            return rest.trim_matches('"').to_string();
        }
    }
    panic!("{relative}: no top-level \"version\"");
}

/// What MODULE LIST shows for `version`: major * 10000 + minor * 100 + patch.
fn encoded(version: &str) -> i64 {
    let mut parts = version
        .split(['.', '-'])
        .map(|part| part.parse::<i64>().unwrap_or(0));
    let (major, minor, patch) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    major * 10000 + minor * 100 + patch
}

/// The root Cargo.toml's version: the one place it is set.
fn version() -> String {
    toml_version("Cargo.toml", "package")
}

fn run(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn debian_arch() -> String {
    run(Command::new("dpkg").arg("--print-architecture"))
        .trim()
        .to_string()
}

/// The highest GLIBC_x.y symbol version `so` imports, measured here as dist.sh does.
fn glibc_needed(so: &Path) -> String {
    let symbols = run(Command::new("objdump").arg("-T").arg(so));
    symbols
        .split(|c: char| c.is_whitespace() || c == '(' || c == ')')
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .max_by_key(|v| {
            v.split('.')
                .map(|part| part.parse::<u32>().unwrap_or(0))
                .collect::<Vec<_>>()
        })
        .expect("a GLIBC_ symbol version")
        .to_string()
}

/// A directory of the test's own, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        let base = match option_env!("CARGO_TARGET_TMPDIR") {
            Some(tmp) => PathBuf::from(tmp),
            None => root().join("target"),
        };
        let dir = base.join(format!("tb-release-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// scripts/dist.sh run on the module under test, writing into `out`; checks the checksum
/// file of the whole and returns the paths of the tarball and the .deb.
fn build_dist(out: &Path) -> (PathBuf, PathBuf) {
    run(Command::new("bash")
        .arg(root().join("scripts/dist.sh"))
        .env("TB_MODULE", module_path())
        .env("DIST_DIR", out));
    let names = dist_names();
    let listed: BTreeSet<String> = fs::read_dir(out)
        .expect("read dist dir")
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let expected: BTreeSet<String> = [names[0].clone(), names[1].clone(), "SHA256SUMS".into()]
        .into_iter()
        .collect();
    assert_eq!(listed, expected, "what dist.sh wrote");
    run(Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(out));
    (out.join(&names[0]), out.join(&names[1]))
}

/// The artifact names dist.sh gives, without building anything.
fn dist_names() -> Vec<String> {
    let names = run(Command::new("bash")
        .arg(root().join("scripts/dist.sh"))
        .arg("--names"));
    names.lines().map(str::to_string).collect()
}

/// TB.TAKE answers, and MODULE LIST shows module `tb` with the version of the root
/// Cargo.toml.
fn assert_module_serves(server: &Server) {
    let mut con = server.conn();
    assert_eq!(
        take(&mut con, "release:smoke", "10", "0.001", "1")[..2],
        [1, 9]
    );
    let list: Vec<std::collections::HashMap<String, redis::Value>> = redis::cmd("MODULE")
        .arg("LIST")
        .query(&mut con)
        .expect("MODULE LIST");
    let tb = list
        .iter()
        .find(|module| module.get("name") == Some(&redis::Value::BulkString(b"tb".to_vec())))
        .expect("tb in MODULE LIST");
    assert_eq!(tb.get("ver"), Some(&redis::Value::Int(encoded(&version()))));
}

/// Every manifest that carries a version carries the root Cargo.toml's, and so do the
/// artifact names and the changelog. No server: this is the cheap half; the loaded module's
/// MODULE LIST ver is checked by the artifact tests below (and tests/lifecycle.rs).
///
/// lua/tb.lua carries no version of its own (its text is compared with the clients' copies,
/// so a version line would have to be added there too); nothing to compare for it yet.
#[test]
fn one_version_everywhere() {
    let version = version();
    let versions = [
        (
            "core/Cargo.toml",
            toml_version("core/Cargo.toml", "package"),
        ),
        (
            "clients/rust/Cargo.toml",
            toml_version("clients/rust/Cargo.toml", "package"),
        ),
        (
            "clients/python/pyproject.toml",
            toml_version("clients/python/pyproject.toml", "project"),
        ),
        (
            "clients/node/package.json",
            package_json_version("clients/node/package.json"),
        ),
        ("the compiled crate", env!("CARGO_PKG_VERSION").to_string()),
    ];
    for (source, theirs) in &versions {
        assert_eq!(
            theirs, &version,
            "{source} says {theirs}, the root Cargo.toml {version}: one version for all"
        );
    }

    let arch = debian_arch();
    assert_eq!(
        dist_names(),
        [
            format!("redis-tb-{version}-linux-{arch}.tar.gz"),
            format!("redis-tb_{}_{arch}.deb", version.replacen('-', "~", 1)),
        ]
    );

    let changelog = read("CHANGELOG.md");
    assert!(
        changelog
            .lines()
            .any(|line| line.starts_with(&format!("## [{version}] - "))),
        "CHANGELOG.md has no `## [{version}] - <date>` entry"
    );
}

/// The README states the glibc the module needs, as measured from the module under test (a
/// new toolchain or dependency can raise it; then the README, and the claim about older
/// distributions, must be looked at again).
#[test]
fn readme_states_the_measured_glibc() {
    let glibc = glibc_needed(&module_path());
    // Words, not lines: a claim may be wrapped anywhere.
    let readme = read("README.md")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    for claim in [
        format!("glibc {glibc} or newer"),
        format!("`GLIBC_{glibc}`"),
        format!("`libc6 (>= {glibc})`"),
    ] {
        assert!(
            readme.contains(&claim),
            "README.md does not say {claim:?}; the module needs glibc {glibc}"
        );
    }
}

/// The tarball, unpacked as a user would: its checksums hold, INSTALL states the glibc the
/// module needs, and a plain server loads its module.
#[test]
fn release_tarball_loads_in_a_plain_server() {
    let dir = TempDir::new("tarball");
    let (tarball, _) = build_dist(&dir.0.join("dist"));
    let unpacked = dir.0.join("unpacked");
    fs::create_dir(&unpacked).unwrap();
    run(Command::new("tar")
        .arg("-xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(&unpacked));

    let top = tarball
        .file_name()
        .unwrap()
        .to_string_lossy()
        .trim_end_matches(".tar.gz")
        .to_string();
    let folder = unpacked.join(&top);
    let files: BTreeSet<String> = fs::read_dir(&folder)
        .unwrap_or_else(|e| panic!("the tarball holds no folder {top}: {e}"))
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let expected: BTreeSet<String> = [
        "INSTALL",
        "LICENSE",
        "SHA256SUMS",
        "redis-tb.conf",
        "redis-tb.so",
    ]
    .into_iter()
    .map(String::from)
    .collect();
    assert_eq!(files, expected, "the tarball's files");
    run(Command::new("sha256sum")
        .args(["--check", "--strict", "SHA256SUMS"])
        .current_dir(&folder));

    let so = folder.join("redis-tb.so");
    let glibc = glibc_needed(&so);
    let install = fs::read_to_string(folder.join("INSTALL")).unwrap();
    assert!(
        install.contains(&format!("glibc {glibc} or newer")),
        "INSTALL does not state the measured glibc {glibc}:\n{install}"
    );
    assert!(
        !install.contains('@'),
        "a placeholder left in INSTALL:\n{install}"
    );

    let server = Server::start_with_module(so, &[], &[]);
    assert_module_serves(&server);
}

/// `dpkg -P` when the test ends, however it ends, so a failure leaves no package behind.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = Command::new("dpkg").args(["--purge", DEB_PACKAGE]).output();
    }
}

/// dpkg's status of the package ("ii ", "rc ", ...), or None when dpkg does not know it.
fn deb_status() -> Option<String> {
    let output = Command::new("dpkg-query")
        .args(["-W", "-f=${db:Status-Abbrev}", DEB_PACKAGE])
        .output()
        .expect("run dpkg-query");
    let status = String::from_utf8_lossy(&output.stdout).trim().to_string();
    (output.status.success() && !status.is_empty() && !status.starts_with('u')).then_some(status)
}

/// The .deb: installed with dpkg, its snippet included by Debian's redis-server, TB.TAKE
/// served, then removed (only the conffile stays) and purged (nothing stays).
#[test]
fn debian_package_installs_serves_and_removes_cleanly() {
    // The .deb is for Debian's redis-server; the Valkey runs of the suite skip it, by design.
    if server_binary() != "redis-server" {
        eprintln!(
            "\n*** SKIPPED: the .deb is for Debian's redis-server, and TB_SERVER is {}; \
             the run with redis-server tests it ***\n",
            server_binary()
        );
        return;
    }
    // Installing needs root, and a redis-tb the machine already has (installed, or its files
    // copied there by hand) must not be replaced and then removed. CI runs as root on a
    // clean machine, where neither skip happens.
    let cannot = if run(Command::new("id").arg("-u")).trim() != "0" {
        Some("dpkg -i needs root; run the suite as root to test the .deb".to_string())
    } else if let Some(status) = deb_status() {
        Some(format!(
            "package {DEB_PACKAGE} is already on this machine ({status}); not touching it"
        ))
    } else {
        [DEB_MODULE, DEB_SNIPPET]
            .into_iter()
            .find(|path| Path::new(path).exists())
            .map(|path| format!("{path} exists, not from the package; not touching it"))
    };
    if let Some(why) = cannot {
        eprintln!("\n*** SKIPPED: the .deb test: {why} ***\n");
        return;
    }

    let dir = TempDir::new("deb");
    let (_, deb) = build_dist(&dir.0.join("dist"));
    let field = |name: &str| {
        run(Command::new("dpkg-deb").arg("--field").arg(&deb).arg(name))
            .trim()
            .to_string()
    };
    assert_eq!(field("Package"), DEB_PACKAGE);
    // Debian spells a pre-release with a tilde (scripts/dist.sh).
    assert_eq!(field("Version"), version().replacen('-', "~", 1));
    assert_eq!(field("Architecture"), debian_arch());
    let glibc = glibc_needed(&module_path());
    assert!(
        field("Depends").contains(&format!("libc6 (>= {glibc})")),
        "Depends {:?} does not ask for the measured glibc {glibc}",
        field("Depends")
    );

    // Which of the package's paths are there before: the folders it shares with the system
    // (/usr, /etc/redis) stay after a purge; everything else must go.
    let contents = run(Command::new("dpkg-deb").arg("--contents").arg(&deb));
    let paths: Vec<String> = contents
        .lines()
        .filter_map(|line| line.split_whitespace().last())
        .map(|path| {
            path.trim_start_matches('.')
                .trim_end_matches('/')
                .to_string()
        })
        .filter(|path| !path.is_empty())
        .collect();
    let there_before: BTreeSet<String> = paths
        .iter()
        .filter(|path| Path::new(path).exists())
        .cloned()
        .collect();

    let _purge = Purge;
    run(Command::new("dpkg").arg("--install").arg(&deb));
    assert_eq!(deb_status().as_deref(), Some("ii"));
    let listed = run(Command::new("dpkg").args(["--listfiles", DEB_PACKAGE]));
    let listed: Vec<&str> = listed.lines().filter(|l| *l != "/.").collect();
    for path in [DEB_MODULE, DEB_SNIPPET] {
        assert!(
            listed.contains(&path),
            "dpkg -L does not list {path}: {listed:?}"
        );
        assert!(Path::new(path).is_file(), "{path} not installed");
    }
    let conffiles = run(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", DEB_PACKAGE]));
    assert!(
        conffiles.contains(DEB_SNIPPET),
        "{DEB_SNIPPET} is not a conffile: {conffiles:?}"
    );

    // As the README says to use it: the server's config includes the snippet, which loads
    // the module (a command-line `--include` is the same directive as a line in redis.conf).
    {
        let server = Server::start_without_module(&["--include", DEB_SNIPPET]);
        assert_module_serves(&server);
    }

    let left = |paths: &[&str]| -> Vec<String> {
        paths
            .iter()
            .filter(|path| !there_before.contains(**path) && Path::new(path).exists())
            .map(|path| path.to_string())
            .collect()
    };
    run(Command::new("dpkg").args(["--remove", DEB_PACKAGE]));
    assert_eq!(
        deb_status().as_deref(),
        Some("rc"),
        "removed, conffiles kept"
    );
    assert!(
        Path::new(DEB_SNIPPET).is_file(),
        "dpkg -r keeps the conffile"
    );
    let not_conffiles: Vec<&str> = listed
        .iter()
        .copied()
        .filter(|path| *path != DEB_SNIPPET && !DEB_SNIPPET.starts_with(&format!("{path}/")))
        .collect();
    assert_eq!(
        left(&not_conffiles),
        Vec::<String>::new(),
        "left after dpkg -r"
    );

    run(Command::new("dpkg").args(["--purge", DEB_PACKAGE]));
    assert_eq!(
        deb_status(),
        None,
        "dpkg still knows the package after dpkg -P"
    );
    assert_eq!(left(&listed), Vec::<String>::new(), "left after dpkg -P");
    let paths: Vec<&str> = paths.iter().map(String::as_str).collect();
    assert_eq!(
        left(&paths),
        Vec::<String>::new(),
        "left after dpkg -P (from the .deb's contents)"
    );
}
