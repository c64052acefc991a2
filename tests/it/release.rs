//! Releases: one version everywhere, and the artifacts `make dist` writes (scripts/dist.sh),
//! each installed the way a user would install it and loaded by a real server.
//!
//! The artifact tests share one run of scripts/dist.sh on the module under test (`TB_MODULE`),
//! made by the first test that needs it into a directory of this test process's own
//! (`dist()`), so no test reads a stale `dist/`. One run, not one per test: a run builds
//! seven artifacts (two `cargo package` verification builds among them), and the tests only
//! read what it wrote; each test unpacks or installs into a directory of its own.

use crate::harness::*;
use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

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

/// The artifacts of scripts/dist.sh run once on the module under test, for every test of
/// this process: the first caller builds them (checking that dist.sh wrote exactly the
/// files `--names` gives, and that SHA256SUMS holds for all of them), the others wait.
/// The directory stays until the next run of this test binary, which removes it first.
fn dist() -> &'static Path {
    static DIST: OnceLock<PathBuf> = OnceLock::new();
    DIST.get_or_init(|| {
        let base = match option_env!("CARGO_TARGET_TMPDIR") {
            Some(tmp) => PathBuf::from(tmp),
            None => root().join("target"),
        };
        let out = base.join("tb-release-dist");
        let _ = fs::remove_dir_all(&out);
        let started = Instant::now();
        run(Command::new("bash")
            .arg(root().join("scripts/dist.sh"))
            .env("TB_MODULE", module_path())
            .env("DIST_DIR", &out));
        eprintln!("dist.sh took {:.1?}", started.elapsed());
        let listed: BTreeSet<String> = fs::read_dir(&out)
            .expect("read dist dir")
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let mut expected: BTreeSet<String> = dist_names().into_iter().collect();
        expected.insert("SHA256SUMS".into());
        assert_eq!(listed, expected, "what dist.sh wrote");
        let sums = fs::read_to_string(out.join("SHA256SUMS")).unwrap();
        assert_eq!(
            sums.lines().count(),
            expected.len() - 1,
            "SHA256SUMS covers every artifact:\n{sums}"
        );
        run(Command::new("sha256sum")
            .args(["--check", "--strict", "SHA256SUMS"])
            .current_dir(&out));
        out
    })
}

/// The path in `dist()` of the artifact whose name ends with `suffix` (one of them).
fn artifact(suffix: &str) -> PathBuf {
    let names: Vec<String> = dist_names()
        .into_iter()
        .filter(|name| name.ends_with(suffix))
        .collect();
    assert_eq!(names.len(), 1, "one artifact named *{suffix}: {names:?}");
    dist().join(&names[0])
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
    let ver = redis::Value::Int(encoded_version(&version()));
    assert_eq!(tb_module_version(&mut con), Some(ver));
}

/// Every manifest that carries a version carries the root Cargo.toml's, and so do the
/// artifact names and the changelog. No server: this is the cheap half; the loaded module's
/// MODULE LIST ver is checked by the artifact tests below (and tests/it/server/lifecycle.rs).
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

    // lua/tb.lua's second line (the first is the FUNCTION library's `#!lua name=tb`).
    let lua = read("lua/tb.lua");
    let lua_version = lua
        .lines()
        .nth(1)
        .and_then(|line| line.strip_prefix("-- version "))
        .and_then(|rest| rest.split(':').next())
        .unwrap_or_else(|| panic!("lua/tb.lua's second line is not `-- version X.Y.Z: ...`"));
    assert_eq!(
        lua_version, version,
        "lua/tb.lua says {lua_version}, the root Cargo.toml {version}"
    );

    let arch = debian_arch();
    assert_eq!(
        dist_names(),
        [
            format!("redis-tb-{version}-linux-{arch}.tar.gz"),
            format!("redis-tb_{}_{arch}.deb", version.replacen('-', "~", 1)),
            format!("redis_tb-{version}.tar.gz"),
            format!("redis_tb-{version}-py3-none-any.whl"),
            format!("redis-tb-{version}.tgz"),
            format!("redis-tb-core-{version}.crate"),
            format!("redis-tb-client-{version}.crate"),
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

/// What each library package says its version is, read from the built package itself: the
/// wheel's and the sdist's METADATA / PKG-INFO, the npm tarball's package.json, each
/// .crate's Cargo.toml. All of them are the root Cargo.toml's.
#[test]
fn every_library_package_carries_the_one_version() {
    let version = version();
    let wheel = artifact(".whl");
    let wheel_metadata = run(Command::new("python3")
        .arg("-c")
        .arg(
            "import sys, zipfile\n\
             z = zipfile.ZipFile(sys.argv[1])\n\
             name = next(n for n in z.namelist() if n.endswith('.dist-info/METADATA'))\n\
             print(z.read(name).decode())",
        )
        .arg(&wheel));
    let sdist = artifact(&format!("redis_tb-{version}.tar.gz"));
    let in_tar = |tarball: &Path, member: &str| {
        run(Command::new("tar").arg("-xzOf").arg(tarball).arg(member))
    };
    let sdist_metadata = in_tar(&sdist, &format!("redis_tb-{version}/PKG-INFO"));
    let npm = in_tar(&artifact(".tgz"), "package/package.json");
    let crate_version = |name: &str| {
        let manifest = in_tar(
            &artifact(&format!("{name}-{version}.crate")),
            &format!("{name}-{version}/Cargo.toml"),
        );
        manifest_version(&manifest)
    };
    let metadata_version = |text: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix("Version: "))
            .map(str::to_string)
    };
    let npm_version = npm
        .lines()
        .find_map(|line| line.strip_prefix("  \"version\": \""))
        .map(|rest| rest.trim_end_matches(',').trim_end_matches('"').to_string());
    for (package, theirs) in [
        ("the wheel's METADATA", metadata_version(&wheel_metadata)),
        ("the sdist's PKG-INFO", metadata_version(&sdist_metadata)),
        ("the npm tarball's package.json", npm_version),
        ("redis-tb-core's .crate", crate_version("redis-tb-core")),
        ("redis-tb-client's .crate", crate_version("redis-tb-client")),
    ] {
        assert_eq!(
            theirs.as_deref(),
            Some(version.as_str()),
            "{package} says {theirs:?}, the root Cargo.toml {version}"
        );
    }
}

/// The `[package]` version of a manifest's text (as `cargo package` writes it).
fn manifest_version(manifest: &str) -> Option<String> {
    let mut in_package = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package {
            if let Some(value) = line.strip_prefix("version = \"") {
                return value.strip_suffix('"').map(str::to_string);
            }
        }
    }
    None
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
    let tarball = artifact(&format!("-linux-{}.tar.gz", debian_arch()));
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

    let deb = artifact(".deb");
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

// -- the library packages: each installed alone, its README's quick start run ----------

/// The text of the first ```lang block after the line `heading` of a README.
fn readme_block(readme: &str, heading: &str, lang: &str) -> String {
    let text = read(readme);
    let after = text
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("{readme} has no {heading}"))
        .1;
    let block = after
        .split_once(&format!("```{lang}\n"))
        .and_then(|(_, rest)| rest.split_once("```"))
        .unwrap_or_else(|| panic!("{readme}: no ```{lang} block after {heading}"));
    block.0.to_string()
}

/// Every ```lang block of a README (fenced at the start of a line), in order.
fn readme_blocks(readme: &str, lang: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut open: Option<String> = None;
    for line in read(readme).lines() {
        match &mut open {
            None if line == format!("```{lang}") => open = Some(String::new()),
            None => {}
            Some(_) if line.starts_with("```") => blocks.extend(open.take()),
            Some(block) => {
                block.push_str(line);
                block.push('\n');
            }
        }
    }
    assert!(open.is_none(), "{readme}: a ```{lang} block is not closed");
    assert!(!blocks.is_empty(), "{readme} has no ```{lang} block");
    blocks
}

/// The version of `name` that a requirements file pins (`name==version`).
fn pinned(requirements: &str, name: &str) -> String {
    read(requirements)
        .lines()
        .find(|line| line.starts_with(&format!("{name}==")))
        .unwrap_or_else(|| panic!("{requirements} pins no {name}"))
        .to_string()
}

fn url(server: &Server) -> String {
    format!("redis://127.0.0.1:{}/", server.port)
}

/// Runs `command` until its stdout holds every one of `patterns` (each in some line), then
/// kills it, for a program that serves until stopped; its stdout so far.
fn run_until(command: &mut Command, patterns: &[&str], timeout: Duration) -> String {
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let (lines, received) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    let deadline = Instant::now() + timeout;
    let mut out = String::new();
    let seen_all = |out: &str| patterns.iter().all(|p| out.contains(p));
    while !seen_all(&out) {
        let left = deadline.saturating_duration_since(Instant::now());
        match received.recv_timeout(left) {
            Ok(line) => {
                out.push_str(&line);
                out.push('\n');
            }
            Err(_) => break,
        }
    }
    let _ = child.kill();
    let output = child.wait_with_output().expect("wait for the child");
    assert!(
        seen_all(&out),
        "{command:?} did not print {patterns:?} within {timeout:?}\nstdout:\n{out}\nstderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    out
}

/// A new venv with `package` (a wheel or an sdist) installed by pip, alone, with the
/// dependencies it declares from PyPI (and the web frameworks the README's middleware
/// blocks import, at the versions the client's tests pin); then every ```python block of
/// the README run in it, each as its own program, against a server with the module and one
/// without (the Lua fallback, FUNCTION LOAD of the package's own tb.lua, which must be the
/// repository's text). The quick start, the first block, must say which backend it used.
fn python_package_runs_the_readme(package: &Path) {
    let started = Instant::now();
    let name = package.file_name().unwrap().to_string_lossy().into_owned();
    let dir = TempDir::new(&name);
    let venv = dir.0.join("venv");
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv));
    let python = venv.join("bin/python");
    let pip_install = |what: &[std::ffi::OsString]| {
        run(Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(what)
            .current_dir(&dir.0));
    };
    pip_install(&[package.into()]);
    pip_install(
        &["Flask", "starlette"]
            .map(|framework| pinned("clients/python/requirements-test.txt", framework).into()),
    );
    // Run from the test's own directory, so `import redis_tb` finds only the venv's.
    let lua = run(Command::new(&python)
        .args([
            "-c",
            "import redis_tb; print(redis_tb.lua_library(), end='')",
        ])
        .current_dir(&dir.0));
    assert!(
        lua == read("lua/tb.lua"),
        "{name}'s tb.lua is not lua/tb.lua's text"
    );

    let blocks = readme_blocks("clients/python/README.md", "python");
    assert_eq!(
        blocks[0],
        readme_block("clients/python/README.md", "## Quick start", "python"),
        "the README's first python block is its quick start"
    );
    for (server, backend) in [
        (Server::start(), "module"),
        (Server::start_without_module(&[]), "function"),
    ] {
        for (index, block) in blocks.iter().enumerate() {
            let program = dir.0.join(format!("block{index}.py"));
            fs::write(&program, block).unwrap();
            let out = run(Command::new(&python)
                .arg(&program)
                .env("REDIS_URL", url(&server))
                .current_dir(&dir.0));
            assert!(
                index > 0
                    || out
                        .lines()
                        .any(|line| line.starts_with(&format!("{backend} "))),
                "{name}: the quick start did not use the {backend} backend:\n{out}"
            );
        }
    }
    eprintln!(
        "{name}: installed and ran {} README blocks twice in {:.1?}",
        blocks.len(),
        started.elapsed()
    );
}

#[test]
fn the_wheel_alone_in_a_new_venv_runs_every_readme_block() {
    python_package_runs_the_readme(&artifact(".whl"));
}

#[test]
fn the_sdist_alone_in_a_new_venv_runs_every_readme_block() {
    python_package_runs_the_readme(&artifact(&format!("redis_tb-{}.tar.gz", version())));
}

/// The version clients/node/package.json's devDependencies pin for `name` (the one
/// package-lock.json holds, so npm finds it in its cache).
fn node_dev_dependency(name: &str) -> String {
    let manifest = read("clients/node/package.json");
    // After "devDependencies": ioredis is a peer dependency too (">=5"), which would
    // install whatever is newest (ioredis 6.1.0's own types fail tsc --strict).
    let dev = manifest
        .split_once("\"devDependencies\"")
        .map_or("", |(_, rest)| rest);
    let version = dev
        .lines()
        .find_map(|line| line.trim().strip_prefix(&format!("\"{name}\": \"")))
        .unwrap_or_else(|| panic!("clients/node/package.json pins no {name}"));
    format!(
        "{name}@{}",
        version.trim_end_matches(',').trim_end_matches('"')
    )
}

/// A new npm project with the npm tarball installed, and `extra` (ioredis and the like).
fn npm_project(name: &str, extra: &[&str]) -> TempDir {
    let dir = TempDir::new(name);
    fs::write(
        dir.0.join("package.json"),
        "{ \"name\": \"tb-release-npm\", \"version\": \"0.0.0\", \"private\": true }\n",
    )
    .unwrap();
    let mut install = Command::new("npm");
    install
        .args(["install", "--no-audit", "--no-fund", "--silent"])
        .arg(artifact(".tgz"))
        .arg(node_dev_dependency("ioredis"))
        .args(extra.iter().map(|name| node_dev_dependency(name)))
        .current_dir(&dir.0);
    run(&mut install);
    let installed = dir.0.join("node_modules/redis-tb");
    assert!(
        fs::read_to_string(installed.join("dist/tb.lua")).ok() == Some(read("lua/tb.lua")),
        "the npm tarball's dist/tb.lua is not lua/tb.lua's text"
    );
    dir
}

#[test]
fn the_npm_tarball_alone_in_a_new_project_runs_the_readme_quick_start() {
    let started = Instant::now();
    // The quick start's app part needs express (the README says so).
    let dir = npm_project("npm-quickstart", &["express"]);
    fs::write(
        dir.0.join("app.js"),
        readme_block("clients/node/README.md", "## Quick start", "js"),
    )
    .unwrap();
    for server in [Server::start(), Server::start_without_module(&[])] {
        run_until(
            Command::new("node")
                .arg("app.js")
                .env("REDIS_URL", url(&server))
                .env("PORT", "0")
                .current_dir(&dir.0),
            &["listening on ", "true 19 \"default\";r=19;t=1"],
            Duration::from_secs(20),
        );
    }
    eprintln!("npm quick start: {:.1?}", started.elapsed());
}

#[test]
fn the_npm_tarball_types_pass_tsc_strict_in_a_new_project() {
    let started = Instant::now();
    let dir = npm_project("npm-tsc", &["typescript", "@types/node"]);
    fs::write(
        dir.0.join("app.ts"),
        r#"import { RateLimiter, createClient, expressRateLimit, Decision } from 'redis-tb';
const limiter = new RateLimiter(createClient(process.env.REDIS_URL, { lazyConnect: true }));
async function main(): Promise<void> {
  const d: Decision = await limiter.take('user:42', 20, 5);
  const allowed: boolean = d.allowed;
  console.log(allowed, d.remaining, d.headers().RateLimit);
}
void main;
void expressRateLimit({ limiter, capacity: 20, rate: 5 });
"#,
    )
    .unwrap();
    run(Command::new(dir.0.join("node_modules/.bin/tsc"))
        .args(["--strict", "--noEmit", "--module", "nodenext"])
        .args([
            "--moduleResolution",
            "nodenext",
            "--types",
            "node",
            "app.ts",
        ])
        .current_dir(&dir.0));
    eprintln!("npm tsc: {:.1?}", started.elapsed());
}

/// One program of every ```rust block of clients/rust/README.md, each the body of a
/// function as the README says (`async` where it awaits, run on a tokio runtime as
/// `#[tokio::main]` would), its Redis URL the one in `REDIS_URL` and its listening port 0;
/// `main` runs the block that its first argument numbers.
fn rust_readme_program(blocks: &[String]) -> String {
    let mut program = String::from("#![allow(unused)]\n");
    let mut arms = String::new();
    for (index, block) in blocks.iter().enumerate() {
        let awaits = block.contains(".await");
        let body = block
            .replace("\"redis://127.0.0.1/\"", "url.as_str()")
            .replace("127.0.0.1:3000", "127.0.0.1:0");
        program.push_str(&format!(
            "{}fn block_{index}() -> Result<(), Box<dyn std::error::Error>> {{\n\
             let url = std::env::var(\"REDIS_URL\")?;\n{body}Ok(())\n}}\n\n",
            if awaits { "async " } else { "" }
        ));
        arms.push_str(&if awaits {
            format!("\"{index}\" => tokio::runtime::Runtime::new()?.block_on(block_{index}()),\n")
        } else {
            format!("\"{index}\" => block_{index}(),\n")
        });
    }
    program.push_str(&format!(
        "fn main() -> Result<(), Box<dyn std::error::Error>> {{\n\
         match std::env::args().nth(1).unwrap_or_default().as_str() {{\n{arms}\
         other => Err(format!(\"no README block {{other}}\").into()),\n}}\n}}\n"
    ));
    program
}

/// The client's .crate unpacked and used as a path dependency of a new cargo project (the
/// core's .crate standing in for crates.io's, through [patch]) with the dependencies the
/// README names for its blocks, every ```rust block of the README in its main
/// (`rust_readme_program`), each run against a server with the module and one without: to
/// its end, or, for a block that serves HTTP, until it says it listens. The quick start,
/// the first block, must say which backend it used. The project gets clients/rust's
/// Cargo.lock and target directory, so the dependencies are built once.
#[test]
fn the_crate_as_a_path_dependency_of_a_new_project_runs_every_readme_block() {
    let started = Instant::now();
    let version = version();
    let dir = TempDir::new("crate");
    for name in ["redis-tb-core", "redis-tb-client"] {
        run(Command::new("tar")
            .arg("-xzf")
            .arg(artifact(&format!("{name}-{version}.crate")))
            .arg("-C")
            .arg(&dir.0));
    }
    let project = dir.0.join("app");
    fs::create_dir_all(project.join("src")).unwrap();
    fs::write(
        project.join("Cargo.toml"),
        format!(
            r#"[package]
name = "tb-release-crate"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
redis-tb-client = {{ path = "../redis-tb-client-{version}", features = ["axum"] }}
env_logger = {{ version = "0.11", default-features = false }}
tokio = {{ version = "1", features = ["rt-multi-thread", "macros", "net"] }}
axum = {{ version = "0.8", default-features = false, features = ["tokio", "http1"] }}

[patch.crates-io]
redis-tb-core = {{ path = "../redis-tb-core-{version}" }}

[workspace]
"#
        ),
    )
    .unwrap();
    fs::copy(
        root().join("clients/rust/Cargo.lock"),
        project.join("Cargo.lock"),
    )
    .unwrap();
    let blocks = readme_blocks("clients/rust/README.md", "rust");
    assert_eq!(
        blocks[0],
        readme_block("clients/rust/README.md", "## Quick start", "rust"),
        "the README's first rust block is its quick start"
    );
    fs::write(project.join("src/main.rs"), rust_readme_program(&blocks)).unwrap();
    let target = root().join("clients/rust/target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    run(Command::new(&cargo)
        .args(["build", "--quiet", "--target-dir"])
        .arg(&target)
        .current_dir(&project));
    for (server, backend) in [
        (Server::start(), "Module"),
        (Server::start_without_module(&[]), "Function"),
    ] {
        for (index, block) in blocks.iter().enumerate() {
            let mut program = Command::new(target.join("debug/tb-release-crate"));
            program
                .arg(index.to_string())
                .env("REDIS_URL", url(&server))
                .current_dir(&project);
            let out = if block.contains("axum::serve") {
                run_until(&mut program, &["listening on "], Duration::from_secs(30))
            } else {
                run(&mut program)
            };
            assert!(
                index > 0 || out.contains(&format!("backend: Some({backend})")),
                "the crate's quick start did not use the {backend} backend:\n{out}"
            );
        }
    }
    eprintln!(
        "crate: {} README blocks, built and run twice in {:.1?}",
        blocks.len(),
        started.elapsed()
    );
}
