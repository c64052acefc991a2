//! monitoring/ against the parts users run: Debian's `prometheus-redis-exporter` with
//! monitoring/exporter.lua, Prometheus scraping it with monitoring/rules.yml, every query of
//! monitoring/dashboard.json, and `promtool test rules` (all on loopback).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::harness::*;

fn monitoring(file: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("monitoring")
        .join(file)
}

/// A helper process, killed when dropped (the test may fail first).
struct Helper {
    child: Child,
    port: u16,
    log: PathBuf,
}

impl Drop for Helper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Helper {
    fn start(program: &str, args: &[String], port: u16, dir: &Path) -> Helper {
        let log = dir.join(format!("{program}.log"));
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(program)
            .args(args)
            .current_dir(dir)
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .stdin(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("{program}: {e} (scripts/ensure-deps.sh installs prometheus-redis-exporter and prometheus)")
            });
        let helper = Helper { child, port, log };
        wait_until(
            &format!("{program} on port {port}"),
            Duration::from_secs(60),
            || http_get(port, "/metrics").is_some() || http_get(port, "/-/ready").is_some(),
        );
        helper
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// The body of `GET path` on 127.0.0.1:port, if it answered 200.
fn http_get(port: u16, path: &str) -> Option<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let (head, body) = response.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_string())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_string()))
}

fn exporter(server: &Server, dir: &Path) -> Helper {
    let port = free_port();
    let args = [
        "-redis.addr".to_string(),
        format!("redis://127.0.0.1:{}", server.port),
        "-script".to_string(),
        monitoring("exporter.lua").display().to_string(),
        "-web.listen-address".to_string(),
        format!("127.0.0.1:{port}"),
    ];
    Helper::start("prometheus-redis-exporter", &args, port, dir)
}

/// `redis_script_values{key="..."}` of one scrape: key -> value.
fn scrape(exporter: &Helper) -> BTreeMap<String, f64> {
    let body = http_get(exporter.port, "/metrics").expect("a scrape of the exporter");
    body.lines()
        .filter_map(|line| line.strip_prefix("redis_script_values{key=\""))
        .filter_map(|rest| {
            let (key, value) = rest.rsplit_once("\"} ")?;
            Some((key.replace("\\\\", "\\"), value.parse().ok()?))
        })
        .collect()
}

/// Every numeric field of INFO tb, and tb_clock as the script turns it into a number.
fn info_tb_numbers(con: &mut redis::Connection) -> BTreeMap<String, f64> {
    let info: String = redis::cmd("INFO").arg("tb").query(con).expect("INFO tb");
    info.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .filter_map(|(name, value)| match (name, value.parse::<f64>()) {
            ("tb_clock", _) => Some((
                "tb_clock_cached".to_string(),
                if value == "cached" { 1.0 } else { 0.0 },
            )),
            (_, Ok(number)) => Some((name.to_string(), number)),
            (_, Err(_)) => None,
        })
        .collect()
}

/// Allowed and denied traffic on a few keys, one of them not valid UTF-8; `round` names the
/// key that each round locks.
fn drive_traffic(con: &mut redis::Connection, round: u32) {
    for _ in 0..5 {
        take(con, "api:allowed", "1000", "100", "1");
    }
    for _ in 0..6 {
        take(con, "api:hot", "1", "0.001", "1");
    }
    for _ in 0..3 {
        redis::cmd("TB.TAKE")
            .arg(&b"bin\xffkey"[..])
            .arg(&["1", "0.001", "2"])
            .exec(con)
            .expect("TB.TAKE");
    }
    // A key named like a counter stays a key.
    take(con, "tb_denied", "1", "0.001", "5");
    let locked = format!("locked:{round}");
    drain(con, &locked, "1", "0.001");
    redis::cmd("TB.TAKE")
        .arg(&[locked.as_str(), "1", "0.001", "1", "BLOCK", "60000"])
        .exec(con)
        .expect("TB.TAKE with BLOCK");
}

#[test]
fn every_scrape_of_the_exporter_carries_every_tb_field_and_the_keys_denied_most() {
    let server = Server::start();
    let mut con = server.conn();
    drive_traffic(&mut con, 1);
    let dir = fresh_dir();
    let exporter = exporter(&server, &dir);
    let info = info_tb_numbers(&mut con);
    assert!(info.len() > 20, "INFO tb: {info:?}");
    // Ten scrapes in a row, each with every field: the exporter reads the reply into a map and
    // stops at the first value that is not a number, in the map's random order.
    for scrape_number in 1..=10 {
        let scraped = scrape(&exporter);
        for (name, value) in &info {
            assert_eq!(
                scraped.get(name),
                Some(value),
                "scrape {scrape_number}: {name} (INFO tb says {value}); exporter log:\n{}",
                exporter.log()
            );
        }
        assert_eq!(scraped.get("tb_top_available"), Some(&1.0));
        assert_eq!(
            scraped.get("tb_top_denied:api:hot"),
            Some(&5.0),
            "{scraped:?}"
        );
        assert_eq!(
            scraped.get("tb_top_denied:bin\\xFFkey"),
            Some(&3.0),
            "{scraped:?}"
        );
        assert_eq!(
            scraped.get("tb_top_denied:tb_denied"),
            Some(&1.0),
            "{scraped:?}"
        );
        assert_eq!(scraped.get("tb_denied"), info.get("tb_denied"));
    }
}

#[test]
fn a_server_without_the_module_exports_no_tb_series() {
    let server = Server::start_without_module(&[]);
    let dir = fresh_dir();
    let exporter = exporter(&server, &dir);
    let scraped = scrape(&exporter);
    assert!(!scraped.contains_key("tb_calls"), "{scraped:?}");
    assert_eq!(scraped.get("tb_top_available"), Some(&0.0), "{scraped:?}");
}

/// The `data.result` of a Prometheus instant query.
fn prometheus_query(prometheus: &Helper, expr: &str) -> Vec<serde_json::Value> {
    let encoded: String = expr
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect();
    let Some(body) = http_get(prometheus.port, &format!("/api/v1/query?query={encoded}")) else {
        return Vec::new();
    };
    let reply: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    reply["data"]["result"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[test]
fn prometheus_scrapes_the_exporter_and_every_dashboard_panel_returns_data() {
    let server = Server::start();
    let mut con = server.conn();
    drive_traffic(&mut con, 1);
    let dir = fresh_dir();
    let exporter = exporter(&server, &dir);
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: redis\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            monitoring("rules.yml").display(),
            exporter.port
        ),
    )
    .expect("prometheus.yml");
    let port = free_port();
    let args = [
        format!("--config.file={}", config.display()),
        format!("--storage.tsdb.path={}", dir.join("data").display()),
        format!("--web.listen-address=127.0.0.1:{port}"),
    ];
    let prometheus = Helper::start("prometheus", &args, port, &dir);
    // More traffic once Prometheus scrapes, so every rate has two different samples.
    let deadline = Instant::now() + Duration::from_secs(120);
    while prometheus_query(&prometheus, "redis_script_values{key=\"tb_calls\"}").is_empty() {
        assert!(
            Instant::now() < deadline,
            "no scrape; prometheus log:\n{}",
            prometheus.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    drive_traffic(&mut con, 2);
    // Each tb_ counter as Prometheus holds it equals INFO tb, once a scrape after the traffic
    // has landed.
    let info = info_tb_numbers(&mut con);
    wait_until(
        "Prometheus to hold INFO tb's counters",
        Duration::from_secs(120),
        || {
            info.iter().all(|(name, value)| {
                let result = prometheus_query(
                    &prometheus,
                    &format!("redis_script_values{{key=\"{name}\"}}"),
                );
                result
                    .first()
                    .and_then(|series| series["value"][1].as_str()?.parse::<f64>().ok())
                    == Some(*value)
            })
        },
    );
    let hot = prometheus_query(
        &prometheus,
        "redis_script_values{key=\"tb_top_denied:api:hot\"}",
    );
    assert_eq!(hot[0]["value"][1], "11", "{hot:?}");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(monitoring("dashboard.json")).unwrap())
            .expect("dashboard.json");
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(!panels.is_empty());
    for panel in panels {
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("expr");
            wait_until(
                &format!("data for panel {:?}: {expr}", panel["title"]),
                Duration::from_secs(120),
                || !prometheus_query(&prometheus, expr).is_empty(),
            );
        }
    }
    // The picture of it all (monitoring/draw.py). With TB_MONITORING_PICTURE=path, a longer
    // run of varied traffic first, and the picture kept there (docs/monitoring.svg is one).
    let keep = std::env::var_os("TB_MONITORING_PICTURE");
    let minutes = if keep.is_some() {
        for second in 0..90u32 {
            for _ in 0..(20 + second % 30) {
                take(&mut con, "api:allowed", "1000000", "100000", "1");
            }
            for call in 0..(second % 20) {
                take(
                    &mut con,
                    &format!("api:user:{}", call % 4),
                    "1",
                    "0.001",
                    "1",
                );
            }
            std::thread::sleep(Duration::from_secs(1));
        }
        "2"
    } else {
        "1"
    };
    let picture = dir.join("picture.svg");
    let drawn = Command::new("python3")
        .arg(monitoring("draw.py"))
        .args([
            "--prometheus",
            &format!("http://127.0.0.1:{}", prometheus.port),
        ])
        .args(["--minutes", minutes])
        .arg("--out")
        .arg(&picture)
        .output()
        .expect("python3 monitoring/draw.py");
    assert!(
        drawn.status.success(),
        "draw.py: {}",
        String::from_utf8_lossy(&drawn.stderr)
    );
    let svg = std::fs::read_to_string(&picture).expect("the picture");
    for panel in panels {
        assert!(
            svg.contains(panel["title"].as_str().unwrap_or("?")),
            "{svg}"
        );
    }
    assert!(
        !svg.contains("no data"),
        "a panel drawn without data:\n{svg}"
    );
    if let Some(keep) = keep {
        std::fs::copy(&picture, keep).expect("keep the picture");
    }
}

#[test]
fn promtool_checks_the_rules_and_each_alert_fires_and_stays_quiet_as_its_tests_say() {
    for args in [
        vec!["check", "rules", "rules.yml"],
        vec!["test", "rules", "rules.test.yml"],
    ] {
        let output = Command::new("promtool")
            .args(&args)
            .current_dir(monitoring(""))
            .output()
            .expect("promtool (scripts/ensure-deps.sh installs prometheus)");
        assert!(
            output.status.success(),
            "promtool {args:?}:\n{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
}
