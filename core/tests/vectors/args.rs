//! The argument rules as vectors: each command's arguments, read as the
//! module's handler reads them (in its order, with the core's parsers in
//! core/src/args.rs and core/src/throttle.rs), and what they become: the
//! parsed values, or the exact error text. The awkward spellings are here:
//! 2^53 written many ways, just above it (texts whose double is 2^53),
//! tiny rates, zero, signs, NaN, infinities, hex, padding, 65 bytes, and
//! the options' keywords missing a value, given twice in another case, or
//! unknown.
//!
//! Every vector has the command's arity: the server's own arity error is
//! not a rule of the parsers.

use redis_tb_core::args::{
    parse_charge_options, parse_lease_ms, parse_limit, parse_request, parse_take_options,
    parse_timeout, take_all_options_start, Request,
};
use redis_tb_core::bucket::TakeOptions;
use redis_tb_core::error::{OptionName, TbError};
use redis_tb_core::number::{above_max_exact_integer, parse_decimal, Sign, MAX_EXACT_INTEGER};
use redis_tb_core::throttle::parse_throttle;
use serde_json::{json, Value};

use crate::file::{object, VectorFile};

#[derive(Clone, Copy, PartialEq)]
enum Command {
    Take,
    Peek,
    Refund,
    Charge,
    TakeAll,
    BTake,
    Acquire,
    Renew,
    Throttle,
}

impl Command {
    fn name(self) -> &'static str {
        match self {
            Command::Take => "TB.TAKE",
            Command::Peek => "TB.PEEK",
            Command::Refund => "TB.REFUND",
            Command::Charge => "TB.CHARGE",
            Command::TakeAll => "TB.TAKEALL",
            Command::BTake => "TB.BTAKE",
            Command::Acquire => "TB.ACQUIRE",
            Command::Renew => "TB.RENEW",
            Command::Throttle => "TB.THROTTLE",
        }
    }

    /// `args` (after the key; TB.TAKEALL: all of them, keys included) as the
    /// module's handler reads them: the parsed values, or its error. Panics
    /// on a wrong arity, which no vector may have.
    fn parse(self, args: &[&[u8]]) -> Result<Value, TbError> {
        let arity = || wrong_arity(self, args);
        match (self, args) {
            (Command::Take, [capacity, rate, n, options @ ..]) => {
                let request = parse_request(capacity, rate, Some(*n))?;
                let options = parse_take_options(options)?;
                Ok(object(
                    [request_fields(&request), option_fields(&options)].concat(),
                ))
            }
            (Command::Peek, [capacity, rate]) => Ok(object(request_fields(&parse_request(
                capacity, rate, None,
            )?))),
            (Command::Peek | Command::Refund, [capacity, rate, n]) => Ok(object(request_fields(
                &parse_request(capacity, rate, Some(*n))?,
            ))),
            (Command::Charge, [capacity, rate, n, options @ ..]) => {
                let request = parse_request(capacity, rate, Some(*n))?;
                let max_debt = parse_charge_options(options)?;
                let mut fields = request_fields(&request);
                fields.push(("max_debt", json!(max_debt)));
                Ok(object(fields))
            }
            (Command::TakeAll, _) => {
                let (groups, options) = args.split_at(take_all_options_start(args));
                if groups.is_empty() || groups.len() % 4 != 0 {
                    arity();
                }
                let mut buckets = Vec::new();
                for group in groups.chunks_exact(4) {
                    let [_, capacity, rate, n] = group else {
                        arity()
                    };
                    buckets.push(object(request_fields(&parse_request(
                        capacity,
                        rate,
                        Some(*n),
                    )?)));
                }
                let options = parse_take_options(options)?;
                let keys: Vec<&[u8]> = groups.iter().step_by(4).copied().collect();
                if (1..keys.len()).any(|i| keys[..i].contains(&keys[i])) {
                    return Err(TbError::DuplicateKey);
                }
                let mut fields = vec![("buckets", Value::Array(buckets))];
                fields.extend(option_fields(&options));
                Ok(object(fields))
            }
            (Command::BTake, [capacity, rate, n, timeout]) => {
                let request = parse_request(capacity, rate, Some(*n))?;
                let timeout_ms = parse_timeout(timeout)?;
                let mut fields = request_fields(&request);
                fields.push(("timeout_ms", json!(timeout_ms)));
                Ok(object(fields))
            }
            (Command::Acquire, [limit, lease_ms, timeout @ ..]) if timeout.len() <= 1 => {
                let limit = parse_limit(limit)?;
                let lease_ms = parse_lease_ms(lease_ms)?;
                let timeout_ms = timeout.first().map(|t| parse_timeout(t)).transpose()?;
                Ok(object(vec![
                    ("limit", json!(limit)),
                    ("lease_ms", json!(lease_ms)),
                    ("timeout_ms", json!(timeout_ms)),
                ]))
            }
            (Command::Renew, [_lease, lease_ms]) => {
                Ok(object(vec![("lease_ms", json!(parse_lease_ms(lease_ms)?))]))
            }
            (Command::Throttle, [max_burst, count, period, quantity @ ..])
                if quantity.len() <= 1 =>
            {
                let throttle = parse_throttle(max_burst, count, period, quantity.first().copied())?;
                Ok(object(vec![
                    ("capacity", json!(throttle.limit.capacity)),
                    ("rate", json!(throttle.limit.refill_per_sec)),
                    ("n", json!(throttle.n)),
                ]))
            }
            _ => arity(),
        }
    }
}

fn wrong_arity(command: Command, args: &[&[u8]]) -> ! {
    panic!("{} with a wrong arity: {args:?}", command.name())
}

fn request_fields(request: &Request) -> Vec<(&'static str, Value)> {
    vec![
        ("capacity", json!(request.limit.capacity)),
        ("rate", json!(request.limit.refill_per_sec)),
        ("n", json!(request.n)),
    ]
}

fn option_fields(options: &TakeOptions) -> Vec<(&'static str, Value)> {
    vec![
        ("max_wait_ms", json!(options.max_wait_ms)),
        ("block_ms", json!(options.block.map(|b| b.block_ms))),
        ("max_block_ms", json!(options.block.map(|b| b.max_block_ms))),
    ]
}

/// The argument an error names, as the module's message names it (`null`:
/// none, an unknown option or a repeated key).
fn argument(error: TbError) -> Option<&'static str> {
    let option = |name| match name {
        OptionName::MaxWait => "MAXWAIT",
        OptionName::Block => "BLOCK",
        OptionName::MaxBlock => "MAXBLOCK",
        OptionName::MaxDebt => "MAXDEBT",
    };
    Some(match error {
        TbError::Capacity | TbError::CapacityTooLarge => "capacity",
        TbError::Rate => "rate",
        TbError::Count | TbError::CountTooLarge => "n",
        TbError::Timeout => "timeout_ms",
        TbError::Limit => "limit",
        TbError::LeaseMs => "lease_ms",
        TbError::RepeatedOption(name) | TbError::MissingOptionValue(name) => option(name),
        TbError::MaxWait => "MAXWAIT",
        TbError::Block => "BLOCK",
        TbError::MaxBlock | TbError::MaxBlockWithoutBlock => "MAXBLOCK",
        TbError::MaxDebt => "MAXDEBT",
        TbError::MaxBurst => "max_burst",
        TbError::ThrottleCount => "count",
        TbError::Period => "period",
        TbError::Quantity => "quantity",
        TbError::UnknownOption | TbError::DuplicateKey => return None,
        other => panic!("{other:?} is no argument error"),
    })
}

/// Whether every argument that is a number keeps its verdict when read as
/// the nearest double: false when one is above 2^53 by its text but its
/// double is 2^53 (`9007199254740993`, `9007199254740992.5`), which a
/// caller holding doubles cannot write.
fn doubles_suffice(args: &[String]) -> bool {
    args.iter().all(|text| {
        parse_decimal(text.as_bytes(), Sign::Forbidden).is_none_or(|double| {
            above_max_exact_integer(text.as_bytes()) == (double > MAX_EXACT_INTEGER as f64)
        })
    })
}

struct Case {
    name: String,
    command: Command,
    args: Vec<String>,
}

impl Case {
    fn vector(&self) -> Value {
        let words: Vec<&[u8]> = self.args.iter().map(String::as_bytes).collect();
        let expect = match self.command.parse(&words) {
            Ok(parsed) => object(vec![("parsed", parsed)]),
            Err(error) => object(vec![
                (
                    "error",
                    json!(error.message().to_str().expect("ASCII messages")),
                ),
                ("argument", json!(argument(error))),
            ]),
        };
        let mut pairs = vec![
            ("name", json!(self.name)),
            ("command", json!(self.command.name())),
            ("args", json!(self.args)),
        ];
        if self.command == Command::TakeAll {
            pairs.push(("groups", json!(take_all_options_start(&words) / 4)));
        }
        pairs.push(("doubles_suffice", json!(doubles_suffice(&self.args))));
        pairs.push(("expect", expect));
        object(pairs)
    }
}

/// Ways to write a decimal argument (capacity, rate, n, MAXDEBT,
/// timeout_ms), each with what it is.
fn decimals() -> Vec<(String, String)> {
    let mut spellings = twos_53();
    spellings.extend(pairs(&[
        ("1e16", "10^16"),
        ("1e300", "10^300"),
        ("1e400", "10^400, beyond every double"),
        ("1e-300", "10^-300"),
        ("4.9e-324", "the least double"),
        ("1e-400", "10^-400, whose double is 0"),
        ("2.5", "a fraction"),
        ("5.", "a trailing point"),
        (".5", "a leading point"),
        ("0", "zero"),
        ("0.0", "zero with a fraction"),
        ("-0", "minus zero"),
        ("-1", "minus one"),
        ("+1", "a plus sign"),
        ("-inf", "minus infinity"),
        ("inf", "inf"),
        ("infinity", "infinity"),
        ("nan", "nan"),
        ("NaN", "NaN"),
        ("0x10", "hex"),
        (" 5", "a leading space"),
        ("5 ", "a trailing space"),
        ("", "empty"),
        (".", "a point alone"),
        ("1e", "an exponent without digits"),
        ("1_000", "an underscore"),
    ]));
    spellings.push((
        format!("{}5", "0".repeat(63)),
        "64 bytes: 5 after 63 zeros".into(),
    ));
    spellings.push((
        format!("{}5", "0".repeat(64)),
        "65 bytes: 5 after 64 zeros".into(),
    ));
    spellings
}

/// 2^53 written many ways, and the texts just around it.
fn twos_53() -> Vec<(String, String)> {
    pairs(&[
        ("9007199254740992", "2^53"),
        ("9007199254740992.0", "2^53 with a fraction of zeros"),
        ("9.007199254740992e15", "2^53 in exponent form"),
        ("9.007199254740992E+15", "2^53 with E+"),
        ("90071992547409920e-1", "2^53 with a negative exponent"),
        ("0.9007199254740992e16", "2^53 as 0.9...e16"),
        ("0009007199254740992", "2^53 after leading zeros"),
        ("9007199254740991.5", "2^53 - 0.5"),
        ("9007199254740993", "2^53 + 1 (its double is 2^53)"),
        ("9007199254740992.5", "2^53 + 0.5 (its double is 2^53)"),
        (
            "9007199254740992.000001",
            "2^53 + 10^-6 (its double is 2^53)",
        ),
        ("9.007199254740993e15", "2^53 + 1 in exponent form"),
        (
            "90071992547409921e-1",
            "2^53 + 0.1 with a negative exponent",
        ),
        ("9007199254740994", "2^53 + 2, the next double"),
    ])
}

/// Ways to write a whole-number argument (MAXWAIT, BLOCK, MAXBLOCK, limit,
/// lease_ms, TB.THROTTLE's), each with what it is.
fn wholes() -> Vec<(String, String)> {
    let mut spellings = pairs(&[
        ("0", "zero"),
        ("1", "one"),
        ("0009", "leading zeros"),
        ("9007199254740991", "2^53 - 1"),
        ("9007199254740992", "2^53"),
        ("0009007199254740992", "2^53 after leading zeros"),
        ("9007199254740993", "2^53 + 1"),
        ("18446744073709551616", "2^64"),
        ("9007199254740992.0", "2^53 with a fraction of zeros"),
        ("1.0", "one with a fraction of zeros"),
        ("1.5", "a fraction"),
        ("1e3", "exponent form"),
        ("-1", "minus one"),
        ("-0", "minus zero"),
        ("+1", "a plus sign"),
        ("nan", "nan"),
        ("inf", "inf"),
        ("0x10", "hex"),
        (" 1", "a leading space"),
        ("1 ", "a trailing space"),
        ("", "empty"),
    ]);
    spellings.push(("0".repeat(64), "64 zeros".into()));
    spellings.push((
        format!("{}1", "0".repeat(63)),
        "64 bytes: 1 after 63 zeros".into(),
    ));
    spellings.push((
        format!("{}1", "0".repeat(64)),
        "65 bytes: 1 after 64 zeros".into(),
    ));
    spellings
}

fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
    list.iter()
        .map(|(text, what)| (text.to_string(), what.to_string()))
        .collect()
}

fn words(list: &[&str]) -> Vec<String> {
    list.iter().map(|word| word.to_string()).collect()
}

/// The cases: every spelling in each argument of each command (the others
/// plain), then the options' and the orders' own cases.
fn cases() -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |command: Command, name: String, args: Vec<String>| {
        cases.push(Case {
            name: format!("{} {name}", command.name()),
            command,
            args,
        });
    };
    // One argument spelled each way, the others plain: `base` with
    // `base[at]` replaced.
    let mut vary =
        |command: Command, base: &[&str], at: usize, what: &str, spellings: &[(String, String)]| {
            for (text, spelled) in spellings {
                let mut args = words(base);
                args[at] = text.clone();
                add(command, format!("{what}: {spelled}"), args);
            }
        };
    let decimals = decimals();
    let twos_53 = twos_53();
    let wholes = wholes();
    let plain = ["10", "1", "1"];

    // TB.TAKE key capacity rate n [MAXWAIT ms] [BLOCK ms [MAXBLOCK ms]]
    vary(Command::Take, &plain, 0, "capacity", &decimals);
    vary(Command::Take, &plain, 1, "rate", &decimals);
    vary(Command::Take, &plain, 2, "n", &decimals);
    vary(
        Command::Take,
        &["10", "1", "1", "MAXWAIT", "5"],
        4,
        "MAXWAIT",
        &wholes,
    );
    vary(
        Command::Take,
        &["10", "1", "1", "BLOCK", "5"],
        4,
        "BLOCK",
        &wholes,
    );
    let block_then = ["10", "1", "1", "BLOCK", "1", "MAXBLOCK", "5"];
    vary(Command::Take, &block_then, 6, "MAXBLOCK", &wholes);
    // TB.PEEK key capacity rate [n]
    vary(Command::Peek, &plain, 0, "capacity", &twos_53);
    vary(Command::Peek, &plain, 2, "n", &twos_53);
    vary(Command::Peek, &["10", "1"], 0, "capacity, no n", &twos_53);
    // TB.REFUND key capacity rate n
    vary(Command::Refund, &plain, 0, "capacity", &twos_53);
    vary(Command::Refund, &plain, 2, "n", &twos_53);
    // TB.CHARGE key capacity rate n [MAXDEBT d]
    vary(Command::Charge, &plain, 2, "n", &twos_53);
    vary(
        Command::Charge,
        &["10", "1", "1", "MAXDEBT", "5"],
        4,
        "MAXDEBT",
        &decimals,
    );
    // TB.TAKEALL key capacity rate n [key capacity rate n ...] [options]
    let two = ["a", "10", "1", "1", "b", "10", "1", "1"];
    vary(Command::TakeAll, &two, 5, "the second capacity", &twos_53);
    vary(Command::TakeAll, &two, 7, "the second n", &twos_53);
    let with_wait = ["a", "10", "1", "1", "b", "10", "1", "1", "MAXWAIT", "5"];
    vary(Command::TakeAll, &with_wait, 9, "MAXWAIT", &wholes);
    // TB.BTAKE key capacity rate n timeout_ms
    vary(
        Command::BTake,
        &["10", "1", "1", "0"],
        3,
        "timeout_ms",
        &decimals,
    );
    vary(
        Command::BTake,
        &["10", "1", "1", "0"],
        0,
        "capacity",
        &twos_53,
    );
    // TB.ACQUIRE key limit lease_ms [timeout_ms]
    vary(Command::Acquire, &["5", "1000"], 0, "limit", &wholes);
    vary(Command::Acquire, &["5", "1000"], 1, "lease_ms", &wholes);
    vary(
        Command::Acquire,
        &["5", "1000", "0"],
        2,
        "timeout_ms",
        &decimals,
    );
    // TB.RENEW key lease lease_ms
    vary(Command::Renew, &["1-1", "1000"], 1, "lease_ms", &wholes);
    // TB.THROTTLE key max_burst count period [quantity]
    let cell = ["15", "30", "60", "1"];
    vary(Command::Throttle, &cell, 0, "max_burst", &wholes);
    vary(Command::Throttle, &cell, 1, "count", &wholes);
    vary(Command::Throttle, &cell, 2, "period", &wholes);
    vary(Command::Throttle, &cell, 3, "quantity", &wholes);

    #[rustfmt::skip]
    let listed: &[(Command, &str, &[&str])] = &[
        // The options: none, each, all in any order and case.
        (Command::Take, "no option", &["10", "1", "1"]),
        (Command::Take, "MAXWAIT 0 is no reservation", &["10", "1", "1", "MAXWAIT", "0"]),
        (Command::Take, "every option, in another order and case", &["10", "1", "1", "block", "100", "MaxWait", "0", "maxblock", "800"]),
        (Command::Take, "MAXBLOCK before BLOCK", &["10", "1", "1", "MAXBLOCK", "20", "BLOCK", "10"]),
        (Command::Take, "MAXBLOCK equal to BLOCK", &["10", "1", "1", "BLOCK", "10", "MAXBLOCK", "10"]),
        (Command::Take, "MAXBLOCK below BLOCK", &["10", "1", "1", "BLOCK", "10", "MAXBLOCK", "9"]),
        (Command::Take, "MAXBLOCK without BLOCK", &["10", "1", "1", "MAXBLOCK", "10"]),
        // A keyword without its value.
        (Command::Take, "MAXWAIT without a value", &["10", "1", "1", "MAXWAIT"]),
        (Command::Take, "BLOCK without a value", &["10", "1", "1", "BLOCK"]),
        (Command::Take, "MAXBLOCK without a value, after BLOCK", &["10", "1", "1", "BLOCK", "100", "MAXBLOCK"]),
        (Command::Take, "maxwait in lower case without a value", &["10", "1", "1", "maxwait"]),
        // An option given twice: named in upper case, whatever case it came in.
        (Command::Take, "BLOCK given twice, the second in lower case", &["10", "1", "1", "BLOCK", "10", "block", "10"]),
        (Command::Take, "MAXWAIT given twice, the first in lower case", &["10", "1", "1", "maxwait", "1", "MAXWAIT", "2"]),
        (Command::Take, "MAXBLOCK given twice in mixed case", &["10", "1", "1", "MAXBLOCK", "5", "BLOCK", "1", "MaxBlock", "6"]),
        (Command::Take, "MAXWAIT given twice, the second without a value", &["10", "1", "1", "MAXWAIT", "5", "MAXWAIT"]),
        // Unknown options.
        (Command::Take, "an unknown option", &["10", "1", "1", "WAIT", "5"]),
        (Command::Take, "TB.CHARGE's MAXDEBT", &["10", "1", "1", "MAXDEBT", "5"]),
        (Command::Take, "a flag", &["10", "1", "1", "NX"]),
        (Command::Take, "an empty keyword", &["10", "1", "1", "", "5"]),
        (Command::Take, "an unknown word after a whole option", &["10", "1", "1", "MAXWAIT", "5", "EXTRA"]),
        // Checked in argument order: the first bad one is named.
        (Command::Take, "three bad numbers: capacity is named", &["x", "y", "z"]),
        (Command::Take, "a bad rate and n: rate is named", &["10", "0", "-1"]),
        (Command::Take, "a bad capacity and option: capacity is named", &["0", "1", "1", "MAXWAIT", "-1"]),
        (Command::Take, "a bad n and an unknown option: n is named", &["10", "1", "x", "WAIT", "5"]),
        (Command::Take, "a bad MAXWAIT before an unknown option", &["10", "1", "1", "MAXWAIT", "-1", "WAIT"]),
        (Command::Take, "an unknown option before a bad MAXWAIT", &["10", "1", "1", "WAIT", "5", "MAXWAIT", "-1"]),
        (Command::Take, "a bad BLOCK after MAXBLOCK: BLOCK is named", &["10", "1", "1", "MAXBLOCK", "10", "BLOCK", "x"]),
        // TB.PEEK without n, TB.REFUND plain.
        (Command::Peek, "no n (1)", &["10", "1"]),
        (Command::Peek, "n 0", &["10", "1", "0"]),
        (Command::Refund, "plain", &["10", "1", "1"]),
        // TB.CHARGE's one option.
        (Command::Charge, "no option", &["10", "1", "1"]),
        (Command::Charge, "maxdebt in lower case", &["10", "1", "1", "maxdebt", "2.5"]),
        (Command::Charge, "MAXDEBT without a value", &["10", "1", "1", "MAXDEBT"]),
        (Command::Charge, "MAXDEBT given twice, the second in lower case", &["10", "1", "1", "MAXDEBT", "1", "maxdebt", "2"]),
        (Command::Charge, "MAXDEBT given twice, the second without a value", &["10", "1", "1", "MAXDEBT", "1", "MAXDEBT"]),
        (Command::Charge, "MAXDEBT given twice, the first value bad: the repeat is named", &["10", "1", "1", "MAXDEBT", "-1", "MAXDEBT", "2"]),
        (Command::Charge, "TB.TAKE's MAXWAIT", &["10", "1", "1", "MAXWAIT", "5"]),
        (Command::Charge, "an unknown word after MAXDEBT", &["10", "1", "1", "MAXDEBT", "1", "x"]),
        (Command::Charge, "a bad n before a bad MAXDEBT: n is named", &["10", "1", "-1", "MAXDEBT", "-1"]),
        // TB.TAKEALL: its groups, its options, its keys.
        (Command::TakeAll, "one group", &["a", "10", "1", "1"]),
        (Command::TakeAll, "two groups and every option", &["a", "10", "1", "1", "b", "5", "2", "1", "BLOCK", "10", "maxblock", "20", "MAXWAIT", "5"]),
        (Command::TakeAll, "a key named like an option comes first", &["MAXWAIT", "10", "1", "1", "MAXWAIT", "5"]),
        (Command::TakeAll, "a later group starting with a keyword begins the options", &["a", "10", "1", "1", "block", "1", "1", "1"]),
        (Command::TakeAll, "a key given twice", &["a", "10", "1", "1", "a", "10", "1", "1"]),
        (Command::TakeAll, "a key given twice and a bad option: the option is named", &["a", "10", "1", "1", "a", "10", "1", "1", "MAXWAIT", "-1"]),
        (Command::TakeAll, "a bad second capacity before a bad option", &["a", "10", "1", "1", "b", "x", "1", "1", "MAXWAIT", "-1"]),
        (Command::TakeAll, "MAXBLOCK without a value", &["a", "10", "1", "1", "BLOCK", "100", "MAXBLOCK"]),
        (Command::TakeAll, "BLOCK given twice", &["a", "10", "1", "1", "BLOCK", "10", "block", "10"]),
        (Command::TakeAll, "an unknown word after an option", &["a", "10", "1", "1", "MAXWAIT", "5", "WAIT"]),
        // TB.BTAKE, TB.ACQUIRE: the first bad one is named.
        (Command::BTake, "a bad n before a bad timeout: n is named", &["10", "1", "-1", "-1"]),
        (Command::Acquire, "no timeout", &["5", "1000"]),
        (Command::Acquire, "a bad limit before a bad lease_ms: limit is named", &["0", "0"]),
        (Command::Acquire, "a bad lease_ms before a bad timeout: lease_ms is named", &["5", "0", "-1"]),
        (Command::Renew, "any lease id", &["x", "1000"]),
        (Command::Throttle, "no quantity", &["15", "30", "60"]),
        (Command::Throttle, "max_burst 2^53 - 1 and count 2^53", &["9007199254740991", "9007199254740992", "1"]),
        (Command::Throttle, "a bad count before a bad period: count is named", &["15", "0", "0"]),
    ];
    for (command, name, args) in listed {
        add(*command, name.to_string(), words(args));
    }
    cases
}

pub fn file() -> VectorFile {
    let cases = cases();
    let mut names: Vec<&str> = cases.iter().map(|case| case.name.as_str()).collect();
    names.sort_unstable();
    if let Some(twice) = names.windows(2).find(|pair| pair[0] == pair[1]) {
        panic!("two argument vectors are named {:?}", twice[0]);
    }
    VectorFile {
        rule: "args",
        about: ABOUT.to_string(),
        vectors: cases.iter().map(Case::vector).collect(),
    }
}

const ABOUT: &str = "The argument rules (core/src/args.rs, core/src/throttle.rs): `command`'s arguments `args`, as text, after the key (TB.TAKEALL: all of them, keys included, and `groups` is how many `key capacity rate n` groups come before its options), read in the module handler's order. `expect.parsed` is what they become (doubles for capacity, rate, n and MAXDEBT, whole ms and counts as integers; null for an option not given; TB.THROTTLE: the bucket), or `expect.error` is the exact error reply and `expect.argument` the argument it names (null: an unknown option or a repeated key). `doubles_suffice` is false when a number above 2^53 by its text reads as the double 2^53, so a caller holding doubles cannot write it. Every vector has the command's arity.";
