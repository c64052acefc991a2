//! Command metadata: COMMAND INFO, COMMAND DOCS, COMMAND GETKEYS for tb.take and tb.peek.

use crate::harness::*;
use redis::Value;
use std::collections::BTreeMap;

fn text(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Okay => "OK".to_string(),
        Value::Int(i) => i.to_string(),
        other => panic!("expected text, got {other:?}"),
    }
}

fn int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("expected an integer, got {other:?}"),
    }
}

fn items(v: &Value) -> &[Value] {
    match v {
        Value::Array(a) | Value::Set(a) => a,
        other => panic!("expected an array, got {other:?}"),
    }
}

/// A RESP2 flat `[k1, v1, k2, v2, ...]` (or a RESP3 map) as a map.
fn pairs(v: &Value) -> BTreeMap<String, Value> {
    match v {
        Value::Map(m) => m.iter().map(|(k, v)| (text(k), v.clone())).collect(),
        Value::Array(a) => {
            assert!(a.len() % 2 == 0, "odd key/value list {a:?}");
            a.chunks(2)
                .map(|kv| (text(&kv[0]), kv[1].clone()))
                .collect()
        }
        other => panic!("expected key/value pairs, got {other:?}"),
    }
}

/// The single entry of `COMMAND INFO name`.
fn command_info(con: &mut redis::Connection, name: &str) -> Vec<Value> {
    let reply: Value = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(name)
        .query(con)
        .unwrap();
    let entries = items(&reply);
    assert_eq!(entries.len(), 1, "COMMAND INFO {name}: {reply:?}");
    let entry = items(&entries[0]).to_vec();
    assert!(
        entry.len() >= 6,
        "COMMAND INFO {name}: no such command (is the module loaded?) {reply:?}"
    );
    entry
}

fn flags(entry: &[Value]) -> Vec<String> {
    items(&entry[2]).iter().map(text).collect()
}

/// The docs map of `COMMAND DOCS name`.
fn command_docs(con: &mut redis::Connection, name: &str) -> BTreeMap<String, Value> {
    let reply: Value = redis::cmd("COMMAND")
        .arg("DOCS")
        .arg(name)
        .query(con)
        .unwrap();
    let top = pairs(&reply);
    let docs = top
        .get(name)
        .unwrap_or_else(|| panic!("COMMAND DOCS {name} has no entry: {reply:?}"));
    pairs(docs)
}

fn argument_names(docs: &BTreeMap<String, Value>) -> Vec<String> {
    let args = docs.get("arguments").expect("docs have arguments");
    items(args)
        .iter()
        .map(|a| text(pairs(a).get("name").expect("argument has a name")))
        .collect()
}

#[test]
fn tb_take_info_has_arity_minus_5_write_denyoom_fast_and_key_1_1_1() {
    let server = Server::start();
    let mut con = server.conn();
    let entry = command_info(&mut con, "tb.take");
    assert_eq!(text(&entry[0]), "tb.take");
    assert_eq!(int(&entry[1]), -5, "arity: options may follow n");
    let f = flags(&entry);
    for want in ["write", "denyoom", "fast"] {
        assert!(
            f.iter().any(|x| x == want),
            "tb.take flags {f:?} lack {want}"
        );
    }
    assert!(!f.iter().any(|x| x == "readonly"), "tb.take flags {f:?}");
    assert_eq!(
        (int(&entry[3]), int(&entry[4]), int(&entry[5])),
        (1, 1, 1),
        "first/last/step key"
    );
}

#[test]
fn tb_peek_info_has_arity_minus_4_readonly_fast_and_key_1_1_1() {
    let server = Server::start();
    let mut con = server.conn();
    let entry = command_info(&mut con, "tb.peek");
    assert_eq!(text(&entry[0]), "tb.peek");
    assert_eq!(int(&entry[1]), -4, "arity");
    let f = flags(&entry);
    for want in ["readonly", "fast"] {
        assert!(
            f.iter().any(|x| x == want),
            "tb.peek flags {f:?} lack {want}"
        );
    }
    for unwanted in ["write", "denyoom"] {
        assert!(
            !f.iter().any(|x| x == unwanted),
            "tb.peek flags {f:?} have {unwanted}"
        );
    }
    assert_eq!((int(&entry[3]), int(&entry[4]), int(&entry[5])), (1, 1, 1));
}

#[test]
fn command_info_is_case_insensitive() {
    let server = Server::start();
    let mut con = server.conn();
    assert_eq!(text(&command_info(&mut con, "TB.TAKE")[0]), "tb.take");
}

#[test]
fn tb_take_docs_have_summary_since_complexity_group_and_arguments() {
    let server = Server::start();
    let mut con = server.conn();
    let docs = command_docs(&mut con, "tb.take");
    for field in ["summary", "since", "complexity"] {
        let value = docs
            .get(field)
            .unwrap_or_else(|| panic!("tb.take docs lack {field}: {docs:?}"));
        assert!(
            !text(value).trim().is_empty(),
            "tb.take docs {field} is empty"
        );
    }
    assert_eq!(text(docs.get("group").expect("group")), "module");
    assert_eq!(
        argument_names(&docs),
        vec!["key", "capacity", "rate", "n", "max_wait_ms", "lockout"]
    );
}

#[test]
fn the_new_commands_have_docs_key_specs_and_arity() {
    let server = Server::start();
    let mut con = server.conn();
    for (command, arity, arguments) in [
        (
            "tb.charge",
            -5,
            &["key", "capacity", "rate", "n", "max_debt"][..],
        ),
        ("tb.unblock", 2, &["key"][..]),
        (
            "tb.throttle",
            -5,
            &["key", "max_burst", "count", "period", "quantity"][..],
        ),
    ] {
        let entry = command_info(&mut con, command);
        assert_eq!(int(&entry[1]), arity, "{command} arity");
        assert_eq!(
            (int(&entry[3]), int(&entry[4]), int(&entry[5])),
            (1, 1, 1),
            "{command} keys"
        );
        let docs = command_docs(&mut con, command);
        assert!(!text(docs.get("summary").expect("summary")).is_empty());
        assert_eq!(argument_names(&docs), arguments, "{command} arguments");
    }
}

#[test]
fn tb_takeall_names_its_keys_before_its_options() {
    let server = Server::start();
    let mut con = server.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("TB.TAKEALL")
        .arg(
            "a 1 1 1 b 1 1 1 MAXWAIT 5 BLOCK 10"
                .split(' ')
                .collect::<Vec<_>>(),
        )
        .query(&mut con)
        .expect("COMMAND GETKEYS");
    assert_eq!(keys, ["a", "b"]);
}

#[test]
fn tb_peek_docs_have_summary_since_complexity_and_arguments() {
    let server = Server::start();
    let mut con = server.conn();
    let docs = command_docs(&mut con, "tb.peek");
    for field in ["summary", "since", "complexity"] {
        let value = docs
            .get(field)
            .unwrap_or_else(|| panic!("tb.peek docs lack {field}: {docs:?}"));
        assert!(
            !text(value).trim().is_empty(),
            "tb.peek docs {field} is empty"
        );
    }
    assert_eq!(text(docs.get("group").expect("group")), "module");
    assert_eq!(argument_names(&docs), vec!["key", "capacity", "rate", "n"]);
}

#[test]
fn docs_name_the_module_tb() {
    let server = Server::start();
    let mut con = server.conn();
    for name in ["tb.take", "tb.peek"] {
        let docs = command_docs(&mut con, name);
        assert_eq!(text(docs.get("module").expect("module")), "tb", "{name}");
    }
}

#[test]
fn getkeys_finds_the_bucket_key() {
    let server = Server::start();
    let mut con = server.conn();
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("tb.take")
        .arg("k")
        .arg("1")
        .arg("1")
        .arg("1")
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, vec!["k"]);
    let keys: Vec<String> = redis::cmd("COMMAND")
        .arg("GETKEYS")
        .arg("tb.peek")
        .arg("k")
        .arg("1")
        .arg("1")
        .query(&mut con)
        .unwrap();
    assert_eq!(keys, vec!["k"]);
}

#[test]
fn commands_are_listed_under_the_module() {
    let server = Server::start();
    let mut con = server.conn();
    let names: Vec<String> = redis::cmd("COMMAND")
        .arg("LIST")
        .arg("FILTERBY")
        .arg("MODULE")
        .arg("tb")
        .query(&mut con)
        .unwrap();
    for want in ["tb.take", "tb.peek"] {
        assert!(
            names.iter().any(|n| n == want),
            "module tb lists {names:?}, lacks {want}"
        );
    }
}
