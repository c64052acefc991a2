//! The Lua twin of the leases (`acquire`, `release`, `renew` in `lua/tb.lua`) against the
//! module's TB.ACQUIRE, TB.RELEASE and TB.RENEW (docs/leases.md): the same random call sequences
//! on twin keys must give the same replies, the same sorted set (`ZRANGE key 0 -1 WITHSCORES`,
//! byte for byte) and the same absolute expiry; bad input must give the same error text.
//!
//! As in tests/it/twin/differential.rs, both read the server's clock, so each pair of calls runs in one
//! transaction between two clock probes and is compared only when every clock in it shows the
//! same millisecond:
//!
//! ```text
//! MULTI; TIME; TB.TAKE probe1; ZRANGE A; ZRANGE B; PEXPIRETIME A; PEXPIRETIME B;
//!        TB.<CMD> A ..; <twin> B ..; TB.TAKE probe2; TIME; HGET probe1 last_refill;
//!        HGET probe2 last_refill; ZRANGE A; ZRANGE B; PEXPIRETIME A; PEXPIRETIME B; EXEC
//! ```
//!
//! Then both calls saw the same `now`, and since the keys were equal before, the ids they hand
//! out are equal too (`<ms>-<n>-<incarnation>`, the same ms, count and incarnation), so replies
//! are compared whole. Only a call that makes a set makes A and B differ: each draws its own
//! incarnation, at random, so that one is set aside (`without_incarnation`: compared by shape,
//! everything else byte for byte) and B is re-synced from A after the step. When the clocks
//! disagree, B is re-synced from A (`DEL B; COPY A B`, which keeps the absolute expiry) and the
//! step is tried again. Each compared step is also checked against the contract itself (the id,
//! the deadline, the expiry rule, which expired leases go, the incarnation a new set stores), so
//! the two cannot agree on a mistake. The sequences are seeded (`TB_SEED` to replay one).

use crate::harness::*;
use redis::Value;

/// The default seed of the random sequences; `TB_SEED=<u64>` replays another.
const DEFAULT_SEED: u64 = 0x1ea5_e5ee_d019_0001;

/// 2^53: the largest limit, lease_ms, deadline and count.
const MAX: i64 = 1 << 53;
const MAX_TEXT: &str = "9007199254740992";

const LIMIT_ERROR: &str = "ERR limit must be a positive integer, at most 9007199254740992 (2^53)";
const LEASE_MS_ERROR: &str =
    "ERR lease_ms must be a positive integer number of ms, at most 9007199254740992 (2^53)";
const EXHAUSTED_ERROR: &str =
    "ERR tb: this lease set has handed out 2^53 ids; delete it to start again";

fn corrupt_lease_error(shown_key: &str) -> String {
    format!("ERR corrupt lease set '{shown_key}': no seq member scored from -2^53 to 0")
}

fn seed() -> u64 {
    seed_or(DEFAULT_SEED)
}

/// `ZRANGE key 0 -1 WITHSCORES` as sent: member, score, member, score ...
type Members = Vec<Vec<u8>>;

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// (member, score) pairs; scores parsed as doubles (whole ms, exact).
fn pairs(members: &Members) -> Vec<(String, f64)> {
    members
        .chunks(2)
        .map(|kv| {
            let score: f64 = text(&kv[1]).parse().expect("a score");
            (text(&kv[0]), score)
        })
        .collect()
}

fn score_of(members: &Members, member: &str) -> Option<f64> {
    pairs(members)
        .into_iter()
        .find(|(m, _)| m == member)
        .map(|(_, s)| s)
}

/// How often one random step is tried before it is given up as never compared.
const STEP_ATTEMPTS: usize = 6;

/// How often a step of a fixed sequence, which must be compared, is tried: each try that
/// crosses a millisecond is thrown away, and a loaded machine crosses many in a row.
const MUST_COMPARE_ATTEMPTS: usize = 500;

/// One call, as the module and as its twin.
#[derive(Clone, Debug)]
struct Call {
    command: &'static str,
    args: Vec<Vec<u8>>,
}

impl Call {
    fn new(command: &'static str, args: &[&[u8]]) -> Call {
        Call {
            command,
            args: args.iter().map(|a| a.to_vec()).collect(),
        }
    }

    fn arg_refs(&self) -> Vec<&[u8]> {
        self.args.iter().map(Vec::as_slice).collect()
    }

    fn module(&self, key: &str) -> redis::Cmd {
        module_cmd(self.command, key.as_bytes(), &self.arg_refs())
    }

    fn twin(&self, fallback: &Fallback, key: &str) -> redis::Cmd {
        fallback.cmd(self.command, key.as_bytes(), &self.arg_refs())
    }

    /// The call through the module on `a`, and through `twin` on `b` (the module again when
    /// `twin` is None).
    fn on_twins(&self, twin: Option<&Fallback>, a: &str, b: &str) -> TwinCall {
        TwinCall {
            module: self.module(a),
            twin: match twin {
                Some(fallback) => self.twin(fallback, b),
                None => self.module(b),
            },
            keys: vec![(a.to_string(), b.to_string())],
            view: View::SortedSet,
        }
    }

    fn show(&self) -> String {
        format!(
            "TB.{} {}",
            self.command.to_uppercase(),
            show_args(&self.arg_refs())
        )
    }
}

/// Runs `call` on `a` (module) and `b` (`twin`, or the module when `twin` is None) until one
/// run is comparable (see `compared_call`); `remake` makes both keys before each attempt, if
/// given. None when none of `attempts` was comparable.
#[allow(clippy::too_many_arguments)]
fn compared_step(
    con: &mut redis::Connection,
    twin: Option<&Fallback>,
    call: &Call,
    a: &str,
    b: &str,
    remake: Option<&dyn Fn(&mut redis::Connection)>,
    attempts: usize,
    tally: &mut Tally,
) -> Option<Observed> {
    let twins = call.on_twins(twin, a, b);
    compared_call(con, &twins, &call.show(), attempts, remake, tally)
}

/// The contract, checked on one compared call (B's side; A's is equal by then): the reply's
/// shape, the id, the deadline, which expired leases went, `seq`, the expiry rule, and that
/// a call that does not write leaves the key alone.
fn check_contract(seen: &Observed, call: &Call, what: &str) -> Outcome {
    let now = seen.clocks_ms[0];
    let context = || format!("{what}: {}", seen.context());
    let before = pairs(&seen.before[0].b);
    let after = pairs(&seen.after[0].b);
    let arg = |i: usize| text(&call.args[i]);
    let int = |i: usize| -> i64 { arg(i).parse().expect("a valid integer argument") };
    let seq_before = score_of(&seen.before[0].b, "seq").map_or(0, |s| -s as i64);
    // A set made by this call stores a new incarnation; one made before keeps its own (or
    // none, as sets made before incarnations).
    let made = seen.before[0].b.is_empty();
    let incarnation = if made {
        incarnation_text(&seen.after[0].b)
    } else {
        incarnation_text(&seen.before[0].b)
    };
    let live_before = before
        .iter()
        .filter(|(m, s)| m != "seq" && *s > now as f64)
        .count() as i64;
    let deadline = |lease_ms: i64| (now + lease_ms).min(MAX);
    // What a write must leave: the expired leases from the earliest (at most 64, deadlines in
    // (0, now]) removed, and then the call's own change.
    let mut expired: Vec<(String, f64)> = before
        .iter()
        .filter(|(_, s)| *s > 0.0 && *s <= now as f64)
        .cloned()
        .collect();
    expired.sort_by(|x, y| x.1.total_cmp(&y.1).then(x.0.cmp(&y.0)));
    expired.truncate(64);
    let pruned: Vec<(String, f64)> = before
        .iter()
        .filter(|p| !expired.contains(p))
        .cloned()
        .collect();
    let expect_set = |mut expected: Vec<(String, f64)>| {
        let mut got = after.clone();
        expected.sort_by(|x, y| x.0.cmp(&y.0));
        got.sort_by(|x, y| x.0.cmp(&y.0));
        assert_eq!(got, expected, "the stored set: {}", context());
    };
    // The expiry after a write of `deadline`: grows only; a key without one gets the latest
    // deadline it holds.
    let expect_expiry = |written: i64, held_before: &[(String, f64)]| {
        let expected = match seen.before[0].expire_b {
            -2 => written,
            -1 => held_before
                .iter()
                .map(|(_, s)| s.ceil() as i64)
                .fold(written, i64::max),
            at => at.max(written),
        };
        assert_eq!(
            seen.after[0].expire_b,
            expected,
            "the expiry: {}",
            context()
        );
    };
    let unchanged = || {
        assert_eq!(
            seen.after[0].b,
            seen.before[0].b,
            "a call that writes nothing wrote: {}",
            context()
        );
        assert_eq!(
            seen.after[0].expire_b,
            seen.before[0].expire_b,
            "the expiry moved: {}",
            context()
        );
    };
    let removed_expired = !expired.is_empty();
    match call.command {
        "acquire" => {
            let limit = int(0);
            let reply: (i64, i64, i64, Option<String>) = redis::from_redis_value(&seen.twin)
                .unwrap_or_else(|e| panic!("reply shape {e}: {}", context()));
            if live_before < limit {
                let n = seq_before + 1;
                let id = match &incarnation {
                    Some(incarnation) => format!("{now}-{n}-{incarnation}"),
                    None => {
                        assert!(!made, "a new set without an incarnation: {}", context());
                        format!("{now}-{n}")
                    }
                };
                assert_eq!(id_parts(&id).2.is_some(), incarnation.is_some());
                assert_eq!(
                    reply,
                    (1, limit - live_before - 1, 0, Some(id.clone())),
                    "{}",
                    context()
                );
                let d = deadline(int(1));
                let mut expected: Vec<(String, f64)> =
                    pruned.into_iter().filter(|(m, _)| m != "seq").collect();
                expected.push((id, d as f64));
                expected.push(("seq".into(), -(n as f64)));
                if made {
                    let drawn: f64 = incarnation.as_deref().unwrap_or("0").parse().unwrap();
                    expected.push(("inc".into(), -drawn));
                }
                expect_set(expected);
                expect_expiry(d, &before);
                Outcome::Granted { removed_expired }
            } else {
                assert!(!made, "a denial on a missing key: {}", context());
                let earliest = before
                    .iter()
                    .filter(|(m, s)| m != "seq" && *s > now as f64)
                    .map(|(_, s)| s.ceil() as i64)
                    .min()
                    .expect("a denial with a live lease");
                assert_eq!(reply, (0, 0, earliest - now, None), "{}", context());
                unchanged();
                Outcome::Denied
            }
        }
        "release" | "renew" => {
            let lease = arg(0);
            let reply: i64 = redis::from_redis_value(&seen.twin)
                .unwrap_or_else(|e| panic!("reply shape {e}: {}", context()));
            let held =
                is_lease_id(&lease) && before.iter().any(|(m, s)| *m == lease && *s > now as f64);
            assert_eq!(reply, held as i64, "{}", context());
            if !held {
                unchanged();
                return Outcome::NotHeld;
            }
            if call.command == "release" {
                expect_set(pruned.into_iter().filter(|(m, _)| *m != lease).collect());
                assert_eq!(
                    seen.after[0].expire_b,
                    seen.before[0].expire_b,
                    "release moved the expiry: {}",
                    context()
                );
                Outcome::Released { removed_expired }
            } else {
                let d = deadline(int(1));
                let mut expected: Vec<(String, f64)> =
                    pruned.into_iter().filter(|(m, _)| *m != lease).collect();
                expected.push((lease, d as f64));
                expect_set(expected);
                expect_expiry(d, &before);
                Outcome::Renewed { removed_expired }
            }
        }
        other => panic!("no such call {other}"),
    }
}

/// Two or three groups of digits joined by dashes, at most 64 bytes: the only members a release
/// or renewal looks up.
fn is_lease_id(lease: &str) -> bool {
    let digits = |part: &str| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit());
    let groups = lease.split('-').count();
    lease.len() <= 64 && (2..=3).contains(&groups) && lease.split('-').all(digits)
}

#[derive(Debug, Clone, Copy)]
enum Outcome {
    Granted { removed_expired: bool },
    Denied,
    Released { removed_expired: bool },
    Renewed { removed_expired: bool },
    NotHeld,
}

/// limit: mostly small, so denials happen; sometimes spelled with leading zeros or huge.
fn random_limit(rng: &mut Rng) -> String {
    match rng.below(10) {
        0 => rng.pick(&["001", "1", MAX_TEXT, "0003", "100"]).to_string(),
        _ => (1 + rng.below(4)).to_string(),
    }
}

/// lease_ms: mostly short, so leases end during the run; sometimes long or the largest.
fn random_lease_ms(rng: &mut Rng) -> String {
    match rng.below(10) {
        0..=4 => (1 + rng.below(40)).to_string(),
        5..=6 => (40 + rng.below(400)).to_string(),
        7 => rng
            .pick(&[
                "1",
                "2",
                "0005",
                "60000",
                "3600000",
                MAX_TEXT,
                "9007199254740991",
            ])
            .to_string(),
        _ => (1 + rng.below(5)).to_string(),
    }
}

/// A lease argument: mostly one that is held now, else one handed out before (released or
/// expired by now, or live), else something that is not an id.
fn random_lease(rng: &mut Rng, live: &[String], history: &[String], now: i64) -> String {
    let roll = rng.below(10);
    if roll < 5 && !live.is_empty() {
        return rng.pick(live).clone();
    }
    if roll < 8 && !history.is_empty() {
        return rng.pick(history).clone();
    }
    let last = history.last().map(|id| id_parts(id));
    let last_n = last.map_or(0, |(_, n, _)| n);
    let incarnation = last
        .and_then(|(_, _, incarnation)| incarnation)
        .unwrap_or(1);
    match rng.below(12) {
        0 => "seq".to_string(),
        1 => "inc".to_string(),
        2 => String::new(),
        3 => "lease".to_string(),
        4 => format!("{now}-{}-{incarnation}", last_n + 1),
        5 => format!("{}-{last_n}", now - 1),
        6 => "1-1".to_string(),
        7 => "x".repeat(70),
        // The last id of another incarnation, and without its incarnation.
        8 => last.map_or("1-1-1".to_string(), |(ms, n, _)| {
            format!("{ms}-{n}-{}", incarnation + 1)
        }),
        9 => last.map_or("1-1".to_string(), |(ms, n, _)| format!("{ms}-{n}")),
        10 => format!("{now}-{last_n}-{incarnation}-1"),
        _ => format!("{now}-{last_n}\0"),
    }
}

/// Who answers for key B: always the Lua twin, or at random the twin or the module, so that
/// each takes over the other's keys mid-sequence.
#[derive(Clone, Copy, PartialEq)]
enum Driver {
    Twin,
    Mixed,
}

/// Runs `steps` random calls through the module (keys `<p>:a:*`) and `fallback` (keys
/// `<p>:b:*`), and asserts that every pair seen in one ms agrees and keeps the contract.
fn differential(
    con: &mut redis::Connection,
    fallback: &Fallback,
    driver: Driver,
    steps: usize,
    seed: u64,
) -> Tally {
    let mut rng = Rng(seed);
    let prefix = match (fallback, driver) {
        (_, Driver::Mixed) => "m",
        (Fallback::Script { .. }, _) => "s",
        (Fallback::Function, _) => "f",
    };
    let keys: Vec<(String, String)> = (0..2)
        .map(|i| (format!("{prefix}:a:{i}"), format!("{prefix}:b:{i}")))
        .collect();
    for (a, b) in &keys {
        let _: i64 = redis::cmd("DEL").arg(a).arg(b).query(con).expect("DEL");
    }
    let mut history: Vec<Vec<String>> = vec![Vec::new(); keys.len()];
    let mut tally = Tally::default();
    for step in 0..steps {
        let index = if rng.chance(85) { 0 } else { 1 };
        let (a, b) = (&keys[index].0, &keys[index].1);
        let now = server_time_ms(con);
        let live: Vec<String> = {
            let members: Members = redis::cmd("ZRANGE")
                .arg(a)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(con)
                .expect("ZRANGE");
            pairs(&members)
                .into_iter()
                .filter(|(m, s)| m != "seq" && *s > now as f64)
                .map(|(m, _)| m)
                .collect()
        };
        let call = match rng.below(100) {
            0..=49 => Call::new(
                "acquire",
                &[
                    random_limit(&mut rng).as_bytes(),
                    random_lease_ms(&mut rng).as_bytes(),
                ],
            ),
            50..=79 => Call::new(
                "release",
                &[random_lease(&mut rng, &live, &history[index], now).as_bytes()],
            ),
            _ => Call::new(
                "renew",
                &[
                    random_lease(&mut rng, &live, &history[index], now).as_bytes(),
                    random_lease_ms(&mut rng).as_bytes(),
                ],
            ),
        };
        let use_lua = driver == Driver::Twin || rng.chance(50);
        let twin = use_lua.then_some(fallback);
        let what = format!(
            "seed {seed} step {step} ({} on {} vs {})",
            call.show(),
            if use_lua {
                fallback.name()
            } else {
                "the module"
            },
            a
        );
        if let Some(seen) = compared_step(con, twin, &call, a, b, None, STEP_ATTEMPTS, &mut tally) {
            seen.assert_twins(&what);
            let outcome = check_contract(&seen, &call, &what);
            tally.compared += 1;
            tally.saw(if use_lua {
                "call by lua"
            } else {
                "call by the module"
            });
            let removed_expired = match outcome {
                Outcome::Granted { removed_expired } => {
                    tally.saw("grant");
                    if seen.before[0].b.is_empty() {
                        tally.saw("grant on a new key");
                    }
                    removed_expired
                }
                Outcome::Denied => {
                    tally.saw("denial");
                    false
                }
                Outcome::Released { removed_expired } => {
                    tally.saw("release");
                    removed_expired
                }
                Outcome::Renewed { removed_expired } => {
                    tally.saw("renewal");
                    removed_expired
                }
                Outcome::NotHeld => {
                    tally.saw("call on a lease not held");
                    false
                }
            };
            if removed_expired {
                tally.saw("write that removed expired leases");
            }
            if let Value::Array(items) = &seen.module {
                if let Some(Value::BulkString(id)) = items.get(3) {
                    history[index].push(text(id));
                }
            }
            // Each made its own set, with its own incarnation: from here on B is A again.
            if seen.incarnations_differ() {
                resync(con, a, b);
                tally.saw("set made by both, each with its own incarnation");
            }
        }
        // Let time pass now and then, so leases (and whole keys) end between calls.
        if rng.chance(12) {
            sleep_ms(40 + rng.below(120) as i64);
        } else if rng.chance(30) {
            sleep_ms(1 + rng.below(15) as i64);
        }
    }
    println!("{} seed {seed}: {tally:?}", fallback.name());
    tally
}

/// What a lease run must have compared at least once.
const LEASE_OUTCOMES: [&str; 8] = [
    "grant",
    "denial",
    "release",
    "renewal",
    "call on a lease not held",
    "write that removed expired leases",
    "grant on a new key",
    "set made by both, each with its own incarnation",
];

const STEPS: usize = 400;

/// The random sequence through `fallback`, each twin with a seed of its own.
fn matches_the_module_call_for_call(fallback: &Fallback, con: &mut redis::Connection) {
    let seed = match fallback {
        Fallback::Script { .. } => seed(),
        Fallback::Function => seed() ^ 1,
    };
    let tally = differential(con, fallback, Driver::Twin, STEPS, seed);
    tally.assert_well_covered(STEPS, &LEASE_OUTCOMES);
}

on_both_twins!(matches_the_module_call_for_call:
    the_script_matches_the_module_call_for_call,
    the_function_library_matches_the_module_call_for_call);

/// One key written by the Lua twin and by the module in turn, against a key only the module
/// writes: each continues the other's count, ids, deadlines and expiry.
#[test]
fn the_module_and_the_library_take_over_each_others_keys() {
    let server = Server::start();
    let mut con = server.conn();
    let fallback = Fallback::function(&mut con);
    let tally = differential(&mut con, &fallback, Driver::Mixed, STEPS, seed() ^ 2);
    tally.assert_well_covered(STEPS, &LEASE_OUTCOMES);
    assert!(
        tally.count("call by lua") > 0 && tally.count("call by the module") > 0,
        "{tally:?}"
    );

    // And by hand: leases from one are released and renewed by the other, and the count goes on.
    for (first, second) in [(Some(&fallback), None), (None, Some(&fallback))] {
        let key: &[u8] = b"takeover";
        let _: i64 = redis::cmd("DEL").arg(key).query(&mut con).unwrap();
        let acquire = |con: &mut redis::Connection, by: Option<&Fallback>| -> String {
            let args: [&[u8]; 2] = [b"10", b"60000"];
            let cmd = match by {
                Some(f) => f.cmd("acquire", key, &args),
                None => module_cmd("acquire", key, &args),
            };
            let (acquired, _, _, id): (i64, i64, i64, String) = cmd.query(con).unwrap();
            assert_eq!(acquired, 1);
            id
        };
        let call = |con: &mut redis::Connection,
                    by: Option<&Fallback>,
                    command: &str,
                    args: &[&[u8]]|
         -> i64 {
            let cmd = match by {
                Some(f) => f.cmd(command, key, args),
                None => module_cmd(command, key, args),
            };
            cmd.query(con).unwrap()
        };
        let one = acquire(&mut con, first);
        let two = acquire(&mut con, first);
        let three = acquire(&mut con, second);
        // The count goes on, and so does the incarnation the first one made the set with.
        let made_with = incarnation(&mut con, "takeover").expect("an incarnation");
        for (id, n) in [(&one, 1), (&two, 2), (&three, 3)] {
            let (_, count, of) = id_parts(id);
            assert_eq!((count, of), (n, Some(made_with)), "{id}");
        }
        assert_eq!(call(&mut con, second, "release", &[one.as_bytes()]), 1);
        assert_eq!(call(&mut con, second, "release", &[one.as_bytes()]), 0);
        assert_eq!(call(&mut con, first, "release", &[one.as_bytes()]), 0);
        assert_eq!(
            call(&mut con, second, "renew", &[two.as_bytes(), b"120000"]),
            1
        );
        assert_eq!(
            call(&mut con, first, "renew", &[three.as_bytes(), b"1000"]),
            1
        );
        assert_eq!(call(&mut con, first, "release", &[three.as_bytes()]), 1);
        let four = acquire(&mut con, first);
        assert_eq!(id_parts(&four).1, 4, "{four}");
        let mut stored = members(&mut con, "takeover");
        stored.sort_by(|x, y| x.0.cmp(&y.0));
        let names: Vec<&str> = stored.iter().map(|(m, _)| m.as_str()).collect();
        let mut expected = vec![four.as_str(), two.as_str(), "inc", "seq"];
        expected.sort_unstable();
        assert_eq!(names, expected);
        assert!(
            stored.contains(&("inc".to_string(), -made_with)),
            "{stored:?}"
        );
        assert!(stored.contains(&("seq".to_string(), -4)), "{stored:?}");
        let now = server_time_ms(&mut con);
        assert_within(
            "expiry",
            pexpiretime(&mut con, "takeover") - now,
            100_000,
            120_000,
        );
    }
}

/// Hand-made starting states, each compared once (made again before every attempt): a count
/// at 2^53 - 1 and at 2^53, deadlines capped at 2^53, a key without expiry, renewals that end
/// sooner, more than 64 expired leases with tied deadlines, members that are not ids.
#[test]
fn the_twins_agree_on_hand_made_lease_sets() {
    with_each_twin(&[], |_, fallback, con| hand_made_cases(con, fallback));
}

fn hand_made_cases(con: &mut redis::Connection, fallback: &Fallback) {
    let (a, b) = ("hm:a", "hm:b");
    // Members as (member, score relative to `now` unless absolute), then the expiry.
    #[derive(Clone)]
    enum Score {
        Ago(i64),
        Ahead(i64),
        AheadHalf(i64),
        Abs(f64),
    }
    enum Expiry {
        None,
        Ahead(i64),
        Latest,
    }
    let many_expired: Vec<(String, Score)> = (0..70)
        .map(|i| (format!("1-{i}"), Score::Ago(1000 - (i / 3) as i64)))
        .collect();
    let mut many = many_expired;
    many.push(("5-99".into(), Score::Ahead(60_000)));
    many.push(("seq".into(), Score::Abs(-99.0)));
    let live = |id: &str, ahead: i64| (id.to_string(), Score::Ahead(ahead));
    // Shaped like an id, but longer than one may be.
    let long_id = format!("1-{}", "1".repeat(63));
    let long_id = [long_id.as_bytes()];
    let seq = |count: f64| ("seq".to_string(), Score::Abs(-count));
    let inc = |incarnation: f64| ("inc".to_string(), Score::Abs(-incarnation));
    let max = MAX as f64;
    // More members scored <= 0 than the module's scan looks at: it looks `inc` up instead.
    let crowded: Vec<(String, Score)> = (0..9)
        .map(|i| (format!("z{i}"), Score::Abs(-(i as f64))))
        .chain([seq(1.0), inc(5.0), live("7-1-5", 5000)])
        .collect();
    type Case = (Vec<(String, Score)>, Expiry, Call);
    #[rustfmt::skip]
    let cases: Vec<Case> = vec![
        (vec![seq(max - 1.0)], Expiry::Latest, Call::new("acquire", &[b"1", b"1000"])),
        (vec![seq(max)], Expiry::Latest, Call::new("acquire", &[b"5", b"1000"])),
        (vec![seq(max), live("7-1", 5000)], Expiry::Latest, Call::new("release", &[b"7-1"])),
        (vec![seq(max), live("7-1", 5000)], Expiry::Latest, Call::new("renew", &[b"7-1", b"10"])),
        (vec![seq(max), live("7-1", 5000)], Expiry::Latest, Call::new("acquire", &[b"1", b"10"])),
        (vec![seq(0.0)], Expiry::None, Call::new("acquire", &[b"1", MAX_TEXT.as_bytes()])),
        (vec![], Expiry::None, Call::new("acquire", &[MAX_TEXT.as_bytes(), b"9007199254740991"])),
        (vec![seq(3.0), live("7-3", 10_000), live("7-2", 50_000)], Expiry::None, Call::new("acquire", &[b"3", b"100"])),
        (vec![seq(3.0), live("7-3", 10_000), live("7-2", 50_000)], Expiry::None, Call::new("renew", &[b"7-2", b"100"])),
        (vec![seq(3.0), live("7-3", 10_000)], Expiry::Ahead(100_000), Call::new("renew", &[b"7-3", b"100"])),
        (vec![seq(3.0), live("7-3", 10_000)], Expiry::Latest, Call::new("renew", &[b"7-3", b"20000"])),
        (vec![seq(3.0), live("7-3", 10_000)], Expiry::Latest, Call::new("renew", &[b"7-3", MAX_TEXT.as_bytes()])),
        (many.clone(), Expiry::Latest, Call::new("acquire", &[b"10", b"1000"])),
        (many.clone(), Expiry::Latest, Call::new("release", &[b"5-99"])),
        (many.clone(), Expiry::Latest, Call::new("renew", &[b"5-99", b"5"])),
        (many.clone(), Expiry::Latest, Call::new("release", &[b"1-0"])),
        (vec![seq(0.0), ("foo".into(), Score::Abs(5.0)), ("bar".into(), Score::Abs(-5.0)), ("zero".into(), Score::Abs(0.0))], Expiry::None, Call::new("acquire", &[b"1", b"10"])),
        (vec![("seq".into(), Score::Abs(-0.0)), live("7-1", 1000)], Expiry::Latest, Call::new("release", &[b"seq"])),
        (vec![seq(2.0), live("7-1", 1000), live("7-2", 2000)], Expiry::Latest, Call::new("acquire", &[b"1", b"10"])),
        (vec![seq(2.0), live("7-1", 1000), live("7-2", 2000)], Expiry::Latest, Call::new("acquire", &[b"2", b"10"])),
        (vec![seq(2.0), live("7-1", 1000), ("7-2".into(), Score::Ago(0))], Expiry::Latest, Call::new("acquire", &[b"2", b"10"])),
        (vec![seq(2.0), live("7-1", 1000), ("7-2".into(), Score::Ago(0))], Expiry::Latest, Call::new("renew", &[b"7-2", b"10"])),
        (vec![seq(2.0), live("7-1", 1), ("7-2".into(), Score::Ago(0))], Expiry::Latest, Call::new("release", &[b"7-1"])),
        (vec![seq(1.0), live("foo", 5000)], Expiry::Latest, Call::new("release", &[b"foo"])),
        (vec![seq(1.0), live("foo", 5000)], Expiry::Latest, Call::new("renew", &[b"foo", b"10"])),
        (vec![seq(1.0), live("foo", 5000)], Expiry::Latest, Call::new("acquire", &[b"1", b"10"])),
        (vec![seq(1.0), live(std::str::from_utf8(long_id[0]).unwrap(), 5000)], Expiry::Latest, Call::new("release", &long_id)),
        (vec![seq(1.0), live("7-1", 5000), ("7-2".into(), Score::AheadHalf(0))], Expiry::Latest, Call::new("release", &[b"7-2"])),
        (vec![seq(1.0), ("7-1".into(), Score::AheadHalf(1000))], Expiry::Latest, Call::new("acquire", &[b"1", b"10"])),
        (vec![seq(1.0), ("7-1".into(), Score::AheadHalf(50_000))], Expiry::None, Call::new("acquire", &[b"2", b"10"])),
        (vec![seq(1.0), ("7-1".into(), Score::AheadHalf(50_000))], Expiry::None, Call::new("renew", &[b"7-1", b"10"])),
        // Sets with an incarnation: their ids carry it, and only their own ids are theirs.
        (vec![seq(3.0), inc(77.0), live("7-3-77", 10_000)], Expiry::Latest, Call::new("acquire", &[b"5", b"100"])),
        (vec![seq(3.0), inc(77.0), live("7-3-77", 10_000)], Expiry::Latest, Call::new("release", &[b"7-3-77"])),
        (vec![seq(3.0), inc(77.0), live("7-3-77", 10_000)], Expiry::Latest, Call::new("renew", &[b"7-3-77", b"20"])),
        (vec![seq(3.0), inc(77.0), live("7-3-77", 10_000)], Expiry::Latest, Call::new("release", &[b"7-3-78"])),
        (vec![seq(3.0), inc(77.0), live("7-3-77", 10_000)], Expiry::Latest, Call::new("release", &[b"7-3"])),
        (vec![seq(3.0), inc(77.0), live("7-3-77", 10_000)], Expiry::Latest, Call::new("renew", &[b"inc", b"20"])),
        (vec![seq(2.0), inc(77.0), live("7-1", 5000), live("7-2-77", 5000)], Expiry::Latest, Call::new("acquire", &[b"5", b"10"])),
        (vec![seq(1.0), inc(max)], Expiry::Latest, Call::new("acquire", &[b"5", b"10"])),
        (vec![seq(1.0), inc(5.0), ("7-9-5".into(), Score::Abs(-3.0))], Expiry::Latest, Call::new("release", &[b"7-9-5"])),
        (vec![seq(1.0), inc(5.0), live("7-1-5", 5000)], Expiry::Latest, Call::new("release", &[b"7-1-5"])),
        (crowded.clone(), Expiry::Latest, Call::new("acquire", &[b"5", b"10"])),
        (crowded.clone(), Expiry::Latest, Call::new("release", &[b"7-1-5"])),
        // An `inc` scored otherwise is no incarnation: ids as before incarnations.
        (vec![seq(1.0), ("inc".into(), Score::Abs(0.0))], Expiry::Latest, Call::new("acquire", &[b"5", b"10"])),
        (vec![seq(1.0), ("inc".into(), Score::Abs(-0.5))], Expiry::Latest, Call::new("acquire", &[b"5", b"10"])),
        (vec![seq(1.0), inc(max + 2.0)], Expiry::Latest, Call::new("acquire", &[b"5", b"10"])),
        (vec![seq(1.0), ("inc".into(), Score::Ahead(5000))], Expiry::Latest, Call::new("acquire", &[b"1", b"10"])),
        (vec![seq(1.0), ("inc".into(), Score::Ahead(5000))], Expiry::Latest, Call::new("acquire", &[b"2", b"10"])),
    ];
    let mut tally = Tally::default();
    let mut errors_compared = 0;
    for (i, (members, expiry, call)) in cases.iter().enumerate() {
        let what = format!("{} case {i}: {}", fallback.name(), call.show());
        let setup = |con: &mut redis::Connection| {
            let now = server_time_ms(con);
            let mut pipe = redis::pipe();
            pipe.atomic();
            for key in [a, b] {
                pipe.cmd("DEL").arg(key).ignore();
                for (member, score) in members {
                    let score = match score {
                        Score::Ago(ms) => (now - ms) as f64,
                        Score::Ahead(ms) => (now + ms) as f64,
                        Score::AheadHalf(ms) => (now + ms) as f64 + 0.5,
                        Score::Abs(s) => *s,
                    };
                    pipe.cmd("ZADD")
                        .arg(key)
                        .arg(format!("{score}"))
                        .arg(member)
                        .ignore();
                }
                match expiry {
                    Expiry::None => {}
                    Expiry::Ahead(ms) => {
                        pipe.cmd("PEXPIREAT").arg(key).arg(now + ms).ignore();
                    }
                    Expiry::Latest => {
                        let latest = members
                            .iter()
                            .filter_map(|(_, s)| match s {
                                Score::Ahead(ms) => Some(now + ms),
                                _ => None,
                            })
                            .max()
                            .unwrap_or(now + 60_000);
                        pipe.cmd("PEXPIREAT").arg(key).arg(latest).ignore();
                    }
                }
            }
            let _: () = pipe.query(con).expect("make the lease sets");
        };
        // Errors (the exhausted count) fail the transaction: compare them outside it.
        setup(con);
        let from_module = outcome(con, &call.module(a));
        let from_twin = outcome(con, &call.twin(fallback, b));
        if let Err(module_error) = &from_module {
            assert_eq!(from_twin, from_module, "{what}");
            assert_eq!(module_error, EXHAUSTED_ERROR, "{what}");
            errors_compared += 1;
            continue;
        }
        let seen = compared_step(
            con,
            Some(fallback),
            call,
            a,
            b,
            Some(&setup),
            MUST_COMPARE_ATTEMPTS,
            &mut tally,
        )
        .unwrap_or_else(|| panic!("{what}: never ran within one ms"));
        seen.assert_twins(&what);
        check_contract(&seen, call, &what);
    }
    assert_eq!(
        errors_compared, 1,
        "only a grant on a count of 2^53 fails: on a full set it is a denial"
    );
    println!(
        "{}: {} cases, {} retried",
        fallback.name(),
        cases.len(),
        tally.resynced
    );
}

/// Spellings of limit and lease_ms that both refuse.
fn bad_integers() -> Vec<Vec<u8>> {
    let mut cases: Vec<Vec<u8>> = [
        "0",
        "00",
        "-1",
        "+1",
        "-0",
        "1.0",
        "1.",
        ".5",
        "1e3",
        "1E3",
        " 1",
        "1 ",
        "",
        "0x10",
        "abc",
        "nan",
        "inf",
        "9007199254740993",
        "09007199254740993",
        "18446744073709551616",
        "99999999999999999999",
        "1_000",
        "5\0",
        "\u{663}",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    cases.push(format!("{}1", "0".repeat(64)).into_bytes());
    cases.push(vec![0xff]);
    cases
}

/// Spellings both accept.
fn good_integers() -> Vec<Vec<u8>> {
    let mut cases: Vec<Vec<u8>> = ["1", "01", "0001", "7", MAX_TEXT, "09007199254740992"]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    cases.push(format!("{}1", "0".repeat(63)).into_bytes());
    cases
}

fn check_errors(fallback: &Fallback, con: &mut redis::Connection) {
    let key: &[u8] = b"le:ok";
    let _: Value = module_cmd("acquire", key, &[b"5", b"60000"])
        .query(con)
        .unwrap();
    let _: () = redis::cmd("SET").arg("le:str").arg("1").query(con).unwrap();
    let on = |con: &mut redis::Connection,
              key: &[u8],
              command: &str,
              args: &[&[u8]],
              expected: &str,
              what: &str| {
        let error = assert_same_error(
            con,
            key,
            &module_cmd(command, key, args),
            &fallback.cmd(command, key, args),
            &format!("{} {what}", fallback.name()),
        );
        assert_eq!(error, expected, "{} {what}", fallback.name());
    };

    // Bad numbers, in order, before the key is looked at (also on a key of another type).
    for bad in bad_integers() {
        let shown = format!("{:?}", text(&bad));
        for k in [key, b"le:str", b"le:none"] {
            on(
                con,
                k,
                "acquire",
                &[&bad, b"1000"],
                LIMIT_ERROR,
                &format!("limit {shown}"),
            );
            on(
                con,
                k,
                "acquire",
                &[b"1", &bad],
                LEASE_MS_ERROR,
                &format!("lease_ms {shown}"),
            );
            on(
                con,
                k,
                "acquire",
                &[&bad, &bad],
                LIMIT_ERROR,
                &format!("both {shown}"),
            );
            on(
                con,
                k,
                "renew",
                &[b"1-1", &bad],
                LEASE_MS_ERROR,
                &format!("renew lease_ms {shown}"),
            );
        }
    }
    // Good spellings pass the argument checks on both: the key's type is what is refused.
    for good in good_integers() {
        let shown = format!("{:?}", text(&good));
        let wrongtype = WRONGTYPE_ERROR;
        on(
            con,
            b"le:str",
            "acquire",
            &[&good, &good],
            wrongtype,
            &format!("good {shown}"),
        );
        on(
            con,
            b"le:str",
            "renew",
            &[b"x", &good],
            wrongtype,
            &format!("good {shown}"),
        );
    }

    // Arity: the server checks the module's; the twin checks its own, in the same words.
    #[rustfmt::skip]
    let arity: [(&str, Vec<&str>); 6] = [
        ("acquire", vec!["1"]),
        ("acquire", vec!["1", "1", "1", "1"]),
        ("release", vec![]),
        ("release", vec!["a", "b"]),
        ("renew", vec!["a"]),
        ("renew", vec!["a", "1", "1"]),
    ];
    for (command, args) in &arity {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        let args = &args;
        on(
            con,
            key,
            command,
            args,
            &arity_error(&format!("tb.{command}")),
            &format!("{} arguments", args.len()),
        );
    }
    // The twin cannot wait: a timeout_ms is one argument too many for it.
    let twin = fallback.cmd("acquire", key, &[b"1", b"1000", b"0"]);
    assert_eq!(
        outcome(con, &twin),
        Err(arity_error("tb.acquire")),
        "{}",
        fallback.name()
    );
    // Two keys: an argument more than the command takes (TB.ACQUIRE takes a timeout_ms, so
    // the module gets two more).
    for (command, args) in [
        ("acquire", vec![&b"1"[..], b"1000"]),
        ("release", vec![&b"a"[..]]),
        ("renew", vec![&b"a"[..], b"1"]),
    ] {
        let mut module = module_cmd(command, key, &[b"le:other"]);
        for arg in &args {
            module.arg(*arg);
        }
        if command == "acquire" {
            module.arg("0");
        }
        let what = format!("{} two keys for {command}", fallback.name());
        let error = assert_same_error(
            con,
            key,
            &module,
            &fallback.cmd_for(command, &[key, b"le:other"], &args),
            &what,
        );
        assert_eq!(error, arity_error(&format!("tb.{command}")), "{what}");
    }

    // Other types, then sorted sets that are not lease sets, under keys that need escaping.
    let calls: [(&str, Vec<&[u8]>); 3] = [
        ("acquire", vec![b"5", b"1000"]),
        ("release", vec![b"1-1"]),
        ("renew", vec![b"1-1", b"1000"]),
    ];
    for foreign_key in foreign_values(con, "zset") {
        for (command, args) in &calls {
            on(
                con,
                foreign_key,
                command,
                args,
                WRONGTYPE_ERROR,
                &format!("{command} on {}", text(foreign_key)),
            );
        }
    }
    let corrupt: [&[(&str, &str)]; 9] = [
        &[("1", "1-1")],
        &[("1", "seq")],
        &[("0.5", "seq")],
        &[("-0.5", "seq")],
        &[("-9007199254740994", "seq")],
        &[("-1e300", "seq")],
        &[("-inf", "seq")],
        &[("+inf", "seq")],
        &[("5", "SEQ"), ("99999999999999", "1-1")],
    ];
    for (bad_key, shown) in &keys_that_need_escaping("le:") {
        for members in corrupt {
            let _: i64 = redis::cmd("DEL").arg(bad_key).query(con).unwrap();
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(bad_key);
            for (score, member) in members {
                zadd.arg(*score).arg(*member);
            }
            let _: i64 = zadd.query(con).unwrap();
            for (command, args) in &calls {
                on(
                    con,
                    bad_key,
                    command,
                    args,
                    &corrupt_lease_error(shown),
                    &format!("{command} on {members:?}"),
                );
            }
        }
    }
}

on_both_twins!(check_errors:
    the_script_refuses_bad_input_in_the_module_words,
    the_function_library_refuses_bad_input_in_the_module_words);

/// ACL applies to the commands a script calls: a restricted user of the leases needs FCALL
/// and TYPE, ZSCORE, TIME, ZCOUNT, ZRANGEBYSCORE, ZRANGE, PEXPIRETIME, ZREM, ZADD, PEXPIREAT,
/// and INFO to make a set (its incarnation).
#[test]
fn a_restricted_user_needs_the_commands_the_lease_functions_call() {
    let server = Server::start();
    let mut admin = server.conn();
    Fallback::function(&mut admin);
    let rules = [
        "on",
        ">pw",
        "~le:*",
        "+fcall",
        "+type",
        "+zscore",
        "+time",
        "+zcount",
        "+zrangebyscore",
        "+zrange",
        "+pexpiretime",
        "+zrem",
        "+zadd",
        "+pexpireat",
        "+info",
    ];
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("leaser")
        .arg(&rules)
        .query(&mut admin)
        .expect("ACL SETUSER");
    let mut con = server.conn();
    let _: () = redis::cmd("AUTH")
        .arg("leaser")
        .arg("pw")
        .query(&mut con)
        .expect("AUTH");
    let f = Fallback::Function;
    let key: &[u8] = b"le:1";
    let mut ids = Vec::new();
    for _ in 0..2 {
        let (acquired, _, _, id): (i64, i64, i64, String) = f
            .cmd("acquire", key, &[b"2", b"60000"])
            .query(&mut con)
            .expect("acquire");
        assert_eq!(acquired, 1);
        ids.push(id);
    }
    let (acquired, available, retry, id): (i64, i64, i64, Option<String>) = f
        .cmd("acquire", key, &[b"2", b"60000"])
        .query(&mut con)
        .expect("a denial");
    assert_eq!((acquired, available, id), (0, 0, None));
    assert!(retry > 0 && retry <= 60_000, "{retry}");
    let renewed: i64 = f
        .cmd("renew", key, &[ids[0].as_bytes(), b"90000"])
        .query(&mut con)
        .expect("renew");
    let released: i64 = f
        .cmd("release", key, &[ids[1].as_bytes()])
        .query(&mut con)
        .expect("release");
    assert_eq!((renewed, released), (1, 1));
    // Leases that ended are removed by the next write (ZRANGEBYSCORE, ZREM).
    let (acquired, ..): (i64, i64, i64, Option<String>) = f
        .cmd("acquire", key, &[b"5", b"1"])
        .query(&mut con)
        .expect("acquire");
    assert_eq!(acquired, 1);
    sleep_ms(5);
    let (acquired, ..): (i64, i64, i64, Option<String>) = f
        .cmd("acquire", key, &[b"5", b"1"])
        .query(&mut con)
        .expect("acquire");
    assert_eq!(acquired, 1);
    let err = outcome(&mut con, &f.cmd("acquire", b"other:1", &[b"1", b"1"]))
        .expect_err("a key outside ~le:*");
    assert!(err.starts_with("NOPERM"), "{err}");

    // Without PEXPIRETIME (PTTL granted instead) the functions fail before they write: PTTL is
    // only the stand-in where the command does not exist, never where it is forbidden.
    let no_pexpiretime: Vec<&str> = rules
        .iter()
        .copied()
        .filter(|rule| *rule != "+pexpiretime")
        .chain(["+pttl"])
        .collect();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("partial")
        .arg(&no_pexpiretime)
        .query(&mut admin)
        .expect("ACL SETUSER");
    let mut partial = server.conn();
    let _: () = redis::cmd("AUTH")
        .arg("partial")
        .arg("pw")
        .query(&mut partial)
        .expect("AUTH");
    let err = outcome(&mut partial, &f.cmd("acquire", b"le:2", &[b"1", b"1000"]))
        .expect_err("no PEXPIRETIME");
    println!("without +pexpiretime: {err}");
    assert!(!exists(&mut admin, "le:2"));

    // Without INFO a set cannot be made (its incarnation is drawn from it), and nothing is
    // written; a set that exists is served as before.
    let no_info: Vec<&str> = rules
        .iter()
        .copied()
        .filter(|rule| *rule != "+info")
        .collect();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("noinfo")
        .arg(&no_info)
        .query(&mut admin)
        .expect("ACL SETUSER");
    let mut noinfo = server.conn();
    let _: () = redis::cmd("AUTH")
        .arg("noinfo")
        .arg("pw")
        .query(&mut noinfo)
        .expect("AUTH");
    let err =
        outcome(&mut noinfo, &f.cmd("acquire", b"le:3", &[b"1", b"1000"])).expect_err("no INFO");
    // Each server words it its own way (Redis 7.0: "can't run this command", Valkey: "no
    // permissions to run the 'info' command").
    assert!(
        ["NOPERM", "permissions", "can't run this command"]
            .iter()
            .any(|words| err.contains(words)),
        "{err}"
    );
    assert!(!exists(&mut admin, "le:3"));
    let (acquired, ..): (i64, i64, i64, Option<String>) = f
        .cmd("acquire", key, &[b"9", b"1000"])
        .query(&mut noinfo)
        .expect("acquire on a set that exists");
    assert_eq!(acquired, 1);
}

/// Replicas and the AOF get the same commands from both (docs/leases.md, "Replication is by
/// effects only"): a fixed sequence of grants, denials, releases and renewals, each compared
/// in one ms, then the AOF's commands on each key, transaction by transaction, must be the same
/// once B is renamed A; a call that writes nothing appends nothing.
#[test]
fn the_twins_append_the_same_commands() {
    with_each_twin(AOF_ARGS, |server, fallback, con| {
        let (a, b) = ("aof:a", "aof:b");
        let mut tally = Tally::default();
        let mut attempts = 0;
        // (index of the compared attempt among all attempts, whether the call writes)
        let mut compared: Vec<(usize, bool, String)> = Vec::new();
        let mut ids: Vec<String> = Vec::new();
        let mut step = |con: &mut redis::Connection, call: Call, writes: Option<bool>| {
            // An attempt that is not compared has written A all the same: each attempt starts
            // from the state before the step (a RESTORE outside the probes' transactions).
            let dump: Option<Vec<u8>> = redis::cmd("DUMP").arg(a).query(con).expect("DUMP");
            let expire = pexpiretime(con, a);
            let restore = |con: &mut redis::Connection| {
                let mut pipe = redis::pipe();
                pipe.atomic().cmd("DEL").arg(a).arg(b).ignore();
                if let Some(dump) = &dump {
                    for key in [a, b] {
                        let restore = pipe.cmd("RESTORE").arg(key);
                        if expire > 0 {
                            restore.arg(expire).arg(dump.as_slice()).arg("ABSTTL");
                        } else {
                            restore.arg(0).arg(dump.as_slice());
                        }
                        restore.ignore();
                    }
                }
                let _: () = pipe.query(con).expect("RESTORE");
            };
            let before = tally.resynced;
            let seen = compared_step(
                con,
                Some(fallback),
                &call,
                a,
                b,
                Some(&restore),
                MUST_COMPARE_ATTEMPTS,
                &mut tally,
            )
            .unwrap_or_else(|| panic!("{}: never ran within one ms", call.show()));
            seen.assert_twins(&call.show());
            attempts += tally.resynced - before + 1;
            let id = match &seen.module {
                Value::Array(items) => match items.get(3) {
                    Some(Value::BulkString(id)) => Some(text(id)),
                    _ => None,
                },
                _ => None,
            };
            let (before, after) = (&seen.before[0], &seen.after[0]);
            let wrote = after.a != before.a || after.expire_a != before.expire_a;
            if let Some(writes) = writes {
                assert_eq!(wrote, writes, "{}: {}", call.show(), seen.context());
            }
            compared.push((attempts - 1, wrote, call.show()));
            id
        };
        for lease_ms in [&b"10000"[..], b"5", b"5"] {
            let id = step(con, Call::new("acquire", &[b"3", lease_ms]), Some(true));
            ids.push(id.expect("granted"));
        }
        sleep_ms(10);
        let id = step(con, Call::new("acquire", &[b"3", b"10000"]), Some(true));
        ids.push(id.expect("granted"));
        step(con, Call::new("acquire", &[b"2", b"10000"]), Some(false));
        step(con, Call::new("release", &[ids[0].as_bytes()]), Some(true));
        step(con, Call::new("release", &[ids[0].as_bytes()]), Some(false));
        step(con, Call::new("release", &[ids[1].as_bytes()]), Some(false));
        step(
            con,
            Call::new("renew", &[ids[3].as_bytes(), b"20000"]),
            Some(true),
        );
        step(
            con,
            Call::new("renew", &[ids[3].as_bytes(), b"1000"]),
            Some(true),
        );
        step(con, Call::new("renew", &[b"garbage", b"10"]), Some(false));
        step(con, Call::new("release", &[ids[3].as_bytes()]), Some(true));

        // The transactions that hold the probes are the attempts, in order.
        let blocks = probed_transactions(server);
        assert_eq!(
            blocks.len(),
            attempts,
            "one transaction per attempt in the AOF"
        );
        // A set made by a step has an incarnation of its own on each side: set aside, as the
        // ZADD that makes the set shows it (`<-incarnation> inc`).
        let without_incarnation = |commands: Vec<Vec<Vec<u8>>>| -> Vec<Vec<Vec<u8>>> {
            let incarnation = commands.iter().find_map(|command| {
                let at = command.iter().position(|arg| arg.as_slice() == b"inc")?;
                let score = text(command.get(at.checked_sub(1)?)?);
                incarnation_of_score(score.parse().ok()?).map(|i| i.to_string())
            });
            commands
                .into_iter()
                .map(|command| {
                    command
                        .iter()
                        .map(|arg| match &incarnation {
                            Some(i) if text(arg) == format!("-{i}") => {
                                INCARNATION.as_bytes().to_vec()
                            }
                            _ => id_without_incarnation(arg, incarnation.as_deref()),
                        })
                        .collect()
                })
                .collect()
        };
        for (index, wrote, what) in &compared {
            let from_module = without_incarnation(commands_on(&blocks[*index], a, a));
            let from_twin = without_incarnation(commands_on(&blocks[*index], b, a));
            assert_appended_alike(fallback, what, &from_module, &from_twin, *wrote);
        }
    });
}

/// Over `maxmemory` (noeviction), TB.ACQUIRE and `tb_acquire` are refused with the server's OOM
/// error and write nothing, while TB.RELEASE, TB.RENEW, `tb_release` and `tb_renew` still
/// work (a holder can give its lease back or keep it when memory is short).
#[test]
fn over_maxmemory_only_acquire_is_refused_by_both() {
    const OOM_ERR: &str = "OOM command not allowed when used memory > 'maxmemory'.";
    let server = Server::start_with(&["--maxmemory-policy", "noeviction"]);
    let mut con = server.conn();
    let fallback = Fallback::function(&mut con);
    let mut ids = Vec::new();
    for key in ["oom:a", "oom:b"] {
        let mut held = Vec::new();
        for _ in 0..2 {
            let args: [&[u8]; 2] = [b"5", b"60000"];
            let cmd = if key == "oom:a" {
                module_cmd("acquire", key.as_bytes(), &args)
            } else {
                fallback.cmd("acquire", key.as_bytes(), &args)
            };
            let (acquired, _, _, id): (i64, i64, i64, String) = cmd.query(&mut con).unwrap();
            assert_eq!(acquired, 1);
            held.push(id);
        }
        ids.push(held);
    }
    let _: i64 = redis::cmd("SETRANGE")
        .arg("ballast")
        .arg(32 << 20)
        .arg("x")
        .query(&mut con)
        .expect("SETRANGE ballast");
    let used: i64 = info_field(&mut con, "memory", "used_memory")
        .expect("used_memory")
        .parse()
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used - (16 << 20))
        .query(&mut con)
        .unwrap();
    for (i, key) in ["oom:a", "oom:b"].into_iter().enumerate() {
        let by = |command: &str, args: &[&[u8]]| {
            if i == 0 {
                module_cmd(command, key.as_bytes(), args)
            } else {
                fallback.cmd(command, key.as_bytes(), args)
            }
        };
        let before = snapshot(&mut con, key.as_bytes());
        let refused = outcome(&mut con, &by("acquire", &[b"5", b"60000"]));
        assert_eq!(refused, Err(OOM_ERR.to_string()), "{key}");
        assert_eq!(snapshot(&mut con, key.as_bytes()), before, "{key}: written");
        let renewed = outcome(&mut con, &by("renew", &[ids[i][0].as_bytes(), b"90000"]));
        assert_eq!(renewed, Ok(Value::Int(1)), "{key}");
        let released = outcome(&mut con, &by("release", &[ids[i][1].as_bytes()]));
        assert_eq!(released, Ok(Value::Int(1)), "{key}");
    }
    // The script form has no flags: the server refuses its first write of a command that is
    // deny-oom (ZADD, so acquire and renew) and lets ZREM through (release).
    let script = Fallback::script(&mut con);
    let before = snapshot(&mut con, b"oom:b");
    let renewed = outcome(
        &mut con,
        &script.cmd("renew", b"oom:b", &[ids[1][0].as_bytes(), b"90000"]),
    );
    let err = renewed.expect_err("EVALSHA renew over maxmemory");
    assert!(err.starts_with(OOM_ERR), "{err}");
    assert_eq!(
        snapshot(&mut con, b"oom:b"),
        before,
        "a refused renewal wrote"
    );
    let released = outcome(
        &mut con,
        &script.cmd("release", b"oom:b", &[ids[1][0].as_bytes()]),
    );
    assert_eq!(released, Ok(Value::Int(1)));
}

/// Issue 25, on the twin as on the module: at 10:00:00 a lease set hands out
/// `<10:00:00 in ms>-1-...`, the set expires at 10:00:30, the clock steps back to 10:00:00 (an
/// NTP step, a restored snapshot, a promoted replica behind), and the set made anew hands out
/// the same instant and count again, but not the same id: its incarnation is another. So the
/// old holder's id releases and renews nothing, whichever of the module, the script and the
/// library made either set or is asked. The clock is the server's own (libfaketime), so the
/// script's TIME is moved too.
#[test]
fn no_twin_hands_an_id_out_again_after_the_clock_steps_back() {
    let Some(clock) = FakeClock::new() else {
        return;
    };
    let server = clock.start(TEN_AM, &[]);
    let mut con = server.conn();
    let script = Fallback::script(&mut con);
    let function = Fallback::function(&mut con);
    let by: [(&str, Option<&Fallback>); 3] = [
        ("the module", None),
        ("the script", Some(&script)),
        ("the library", Some(&function)),
    ];
    let run = |con: &mut redis::Connection,
               by: Option<&Fallback>,
               command: &str,
               key: &str,
               args: &[&[u8]]|
     -> Value {
        let cmd = match by {
            Some(fallback) => fallback.cmd(command, key.as_bytes(), args),
            None => module_cmd(command, key.as_bytes(), args),
        };
        cmd.query(con)
            .unwrap_or_else(|e| panic!("{command} on {key}: {e}"))
    };
    let acquire = |con: &mut redis::Connection, maker: Option<&Fallback>, key: &str| -> String {
        let reply = run(con, maker, "acquire", key, &[b"1", b"1000"]);
        let (acquired, _, _, id): (i64, i64, i64, String) =
            redis::from_redis_value(&reply).expect("a grant");
        assert_eq!(acquired, 1, "{key}");
        id
    };
    for (first_name, first) in by {
        for (second_name, second) in by {
            let key = format!("lc:{first_name}:{second_name}");
            let what = format!("made by {first_name}, then by {second_name}");
            clock.set(TEN_AM);
            assert_eq!(server_time_ms(&mut con), TEN_AM_MS, "the fake clock");
            let old = acquire(&mut con, first, &key);
            clock.set(TEN_AM_AND_30_S);
            let now = server_time_ms(&mut con);
            assert!(
                !exists(&mut con, &key),
                "{what}: the set expired (now {now}, expiry {})",
                pexpiretime(&mut con, &key)
            );
            clock.set(TEN_AM);
            assert_eq!(
                server_time_ms(&mut con),
                TEN_AM_MS,
                "the clock stepped back"
            );
            let new = acquire(&mut con, second, &key);
            let (old_ms, old_n, old_incarnation) = id_parts(&old);
            let (new_ms, new_n, new_incarnation) = id_parts(&new);
            assert_eq!((old_ms, old_n), (TEN_AM_MS, 1), "{what}: {old}");
            assert_eq!((new_ms, new_n), (TEN_AM_MS, 1), "{what}: {new}");
            assert!(
                old_incarnation.is_some() && old_incarnation != new_incarnation,
                "{what}: {old} handed out again as {new}"
            );
            assert_eq!(new_incarnation, incarnation(&mut con, &key), "{what}");
            for (name, caller) in by {
                let released = run(&mut con, caller, "release", &key, &[old.as_bytes()]);
                let renewed = run(&mut con, caller, "renew", &key, &[old.as_bytes(), b"1000"]);
                assert_eq!(
                    (released, renewed),
                    (Value::Int(0), Value::Int(0)),
                    "{what}: the old holder's {old} through {name}"
                );
            }
            let released = run(&mut con, second, "release", &key, &[new.as_bytes()]);
            assert_eq!(released, Value::Int(1), "{what}: the new holder's {new}");
        }
    }
    println!("under libfaketime on {}", clock.server().display());
}
