//! The spec of redis-tb's pure rules, written by the core: one JSON file
//! per rule under `clients/conformance/vectors/` (what each holds, and who
//! replays it: that directory's README.md).
//!
//! Every rule that a client library or the Lua twin writes again (take,
//! peek, refund, charge, reservation, lockout, TB.TAKEALL, throttle, the
//! lease rules, `first_ms_when`, the denial cache's priming window, the
//! local limiter, the arguments) is computed here with this crate's own
//! functions, over hand-picked inputs (awkward doubles among them: 2^53, 1e-300, just under
//! the capacity, a clock behind `last_refill`) and seeded random ones. The
//! twin replays them in a real server (tests/it/twin/vectors.rs at the repository
//! root), and Python, Node and the Rust library replay the ones they
//! implement.
//!
//! This test fails when a checked-in file differs from what the core
//! computes today, or when the directory holds a file it does not write.
//! After a deliberate change to a rule, rewrite them all with
//! `UPDATE_VECTORS=1 cargo test -p redis-tb-core --test vectors`.

mod args;
mod bucket_rules;
mod file;
mod leases;
mod local;
mod throttle;

use std::path::{Path, PathBuf};

use file::VectorFile;

/// Where the files go, from the repository root.
const DIR: &str = "clients/conformance/vectors";

/// Every file, with its text as it must be checked in.
fn files() -> Vec<(String, String)> {
    let mut rules: Vec<VectorFile> = bucket_rules::files();
    rules.push(throttle::file());
    rules.push(leases::file());
    rules.push(args::file());
    let mut all: Vec<(String, String)> = rules
        .iter()
        .map(|file| (format!("{}.json", file.rule), file.render()))
        .collect();
    all.push(("local.json".to_string(), local::render()));
    all
}

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(DIR)
}

const REGENERATE: &str =
    "after a deliberate change to a rule, run: UPDATE_VECTORS=1 cargo test -p redis-tb-core --test vectors";

#[test]
fn the_checked_in_vectors_are_what_the_core_computes() {
    let dir = dir();
    let files = files();
    if std::env::var_os("UPDATE_VECTORS").is_some() {
        for (name, text) in &files {
            std::fs::write(dir.join(name), text).unwrap_or_else(|e| panic!("write {name}: {e}"));
        }
    }
    let mut problems = Vec::new();
    for (name, expected) in &files {
        let committed = std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        if let Some(line) = first_difference(&committed, expected) {
            problems.push(format!(
                "{DIR}/{name} differs from what the core computes, first at line {line}:\n  \
                 checked in: {}\n  the core:   {}",
                committed.lines().nth(line - 1).unwrap_or("(end of file)"),
                expected.lines().nth(line - 1).unwrap_or("(end of file)"),
            ));
        }
    }
    // A file the core no longer writes would be replayed as if it were the spec.
    let written: Vec<&str> = files.iter().map(|(name, _)| name.as_str()).collect();
    for entry in std::fs::read_dir(&dir).expect("read the vectors directory") {
        let name = entry.expect("a directory entry").file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".json") && !written.contains(&name.as_ref()) {
            problems.push(format!(
                "{DIR}/{name} is not written by the core: delete it"
            ));
        }
    }
    assert!(problems.is_empty(), "{}\n{REGENERATE}", problems.join("\n"));
}

/// The first line (from 1) where the two texts differ, if they do.
fn first_difference(a: &str, b: &str) -> Option<usize> {
    if a == b {
        return None;
    }
    let mut lines_a = a.lines();
    let mut lines_b = b.lines();
    let mut line = 1;
    loop {
        match (lines_a.next(), lines_b.next()) {
            (Some(x), Some(y)) if x == y => line += 1,
            (None, None) => return Some(line), // only a final newline differs
            _ => return Some(line),
        }
    }
}
