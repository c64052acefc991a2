//! The core's vector files (clients/conformance/vectors/, written by core/tests/vectors), read
//! for the replays: the rules' files as JSON, and args.json as the argument lists each server
//! command is sent.

use serde_json::Value;

use super::commands::error_text;

/// One rule's vectors, from the checked-in file.
pub fn vectors(rule: &str) -> Vec<Value> {
    let path = format!(
        "{}/clients/conformance/vectors/{rule}.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let file: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
    file["vectors"].as_array().expect("vectors").clone()
}

/// One vector of args.json: a command's arguments and what the core's parsers made of them.
pub struct ArgVector {
    pub name: String,
    /// The module's name, `TB.TAKE`.
    pub command: String,
    /// After the key; TB.TAKEALL's are all of them, keys included.
    pub args: Vec<String>,
    /// TB.TAKEALL: how many `key capacity rate n` groups come before the options.
    pub groups: usize,
    /// The exact error reply, or `None` when the core accepts the arguments.
    pub error: Option<String>,
}

impl ArgVector {
    /// The twin's name for the command: `take` for TB.TAKE.
    pub fn twin_command(&self) -> String {
        self.command.trim_start_matches("TB.").to_lowercase()
    }

    /// The keys and the other arguments, apart: TB.TAKEALL's keys are the first word of each
    /// group; every other command has one key, `key`.
    pub fn keys_and_args<'a>(&'a self, key: &'a str) -> (Vec<&'a str>, Vec<&'a str>) {
        if self.command != "TB.TAKEALL" {
            return (vec![key], self.args.iter().map(String::as_str).collect());
        }
        let (keys, args) = self
            .args
            .iter()
            .enumerate()
            .partition::<Vec<_>, _>(|(at, _)| at % 4 == 0 && at / 4 < self.groups);
        let words = |pairs: Vec<(usize, &'a String)>| -> Vec<&'a str> {
            pairs.into_iter().map(|(_, word)| word.as_str()).collect()
        };
        (words(keys), words(args))
    }

    /// `None` when `result` is what the core says of the arguments (its error, exactly; or
    /// no error), else what differs.
    pub fn differs(&self, result: redis::RedisResult<redis::Value>) -> Option<String> {
        let got = match &result {
            Ok(_) => None,
            Err(e) => Some(error_text(e)),
        };
        (got != self.error).then(|| {
            let show = |verdict: &Option<String>| match verdict {
                Some(error) => format!("{error:?}"),
                None => "accepted".to_string(),
            };
            format!(
                "{:?} ({} {}):\n    server: {}\n    core:   {}",
                self.name,
                self.command,
                self.args.join(" "),
                show(&got),
                show(&self.error)
            )
        })
    }
}

/// args.json's vectors.
pub fn arg_vectors() -> Vec<ArgVector> {
    vectors("args")
        .iter()
        .map(|vector| {
            let text = |value: &Value| value.as_str().expect("a string").to_string();
            ArgVector {
                name: text(&vector["name"]),
                command: text(&vector["command"]),
                args: vector["args"]
                    .as_array()
                    .expect("args")
                    .iter()
                    .map(text)
                    .collect(),
                groups: vector["groups"].as_u64().unwrap_or(1) as usize,
                error: vector["expect"]["error"].as_str().map(str::to_string),
            }
        })
        .collect()
}

/// Fails, listing every vector `differs` reported, or says how many were replayed.
pub fn finish_arg_replay(who: &str, failures: &[String], replayed: usize) {
    assert!(replayed > 0, "no argument vectors replayed by {who}");
    assert!(
        failures.is_empty(),
        "{who} differs from the core on {} of {replayed} argument vectors (args.json):\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
    eprintln!("args.json: {replayed} vectors replayed by {who}");
}
