//! A Redis outage does not flood the agent's log (issue 13, item 8): a real
//! `leasehold agent` process on a real redis-server, which is then killed;
//! 500 Checks degrade per fail mode and the process writes a handful of
//! "store unavailable" WARN lines, not 500. The warnings dropped are counted
//! in the `suppressed` field of the next line of the same cause.
//!
//! Every wait is bounded by a deadline and waits for a condition; no sleep
//! decides the outcome.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::testing::RedisServer;
use tonic::transport::Channel;

/// Checks sent while Redis is down.
const CHECKS: u64 = 500;
/// The agent's log limiter interval (`leasehold_logging::DEFAULT_INTERVAL`).
const LOG_INTERVAL: Duration = leasehold_logging::DEFAULT_INTERVAL;
/// Kinds of store error a killed Redis can produce: the cached connection
/// breaking (ambiguous), refused connects (unreachable), the open breaker.
const STORE_CAUSES_MAX: usize = 3;
/// Bound on the agent's start and on waiting for the counted line.
const DEADLINE: Duration = Duration::from_secs(60);
/// The WARN line of a degraded decision.
const STORE_WARNING: &str = "store unavailable: degrading per fail mode";

const POLICY: &str = r#"
version = 1
[[domain]]
name = "api"
[[domain.rule]]
id = "flood"
scope = "tenant"
algorithm = "token_bucket"
capacity = 1000000
refill = 1000
period_ms = 1000
fail_mode = "open"
"#;

/// The agent process, killed on drop (also when the test fails).
struct AgentProcess {
    child: Child,
    dir: PathBuf,
    /// Every line it wrote on stderr so far.
    stderr: Arc<Mutex<Vec<String>>>,
    grpc_addr: String,
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl AgentProcess {
    fn start(redis_url: &str) -> AgentProcess {
        let dir = std::env::temp_dir().join(format!(
            "leasehold-log-floods-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        write(&dir, "pepper.txt", "log-floods-test-pepper-0123456789");
        write(&dir, "policy.toml", POLICY);
        write(
            &dir,
            "agent.toml",
            &format!(
                r#"
plaintext = true
region = "eu"
listen = "127.0.0.1:0"
http_listen = "127.0.0.1:0"
redis_url = "{redis_url}"
pepper_file = "pepper.txt"
policy_file = "policy.toml"

[store]
# Patient while Redis is up (a slow machine never degrades a healthy call);
# a killed Redis refuses connects at once.
call_deadline_ms = 5000
connect_timeout_ms = 5000
breaker_failures = 5
breaker_open_ms = 1000
"#
            ),
        );
        let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .arg("agent")
            .arg("--config")
            .arg(dir.join("agent.toml"))
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn leasehold agent");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let pipe = child.stderr.take().expect("stderr piped");
        let lines = stderr.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(pipe).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        // The first stdout line names the bound gRPC address.
        let (sender, receiver) = std::sync::mpsc::channel();
        let stdout = child.stdout.take().expect("stdout piped");
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = sender.send(line);
            }
            // Keep draining so the agent never blocks on a full pipe.
            for _ in lines {}
        });
        let mut agent = AgentProcess {
            child,
            dir,
            stderr,
            grpc_addr: String::new(),
        };
        let banner = receiver.recv_timeout(DEADLINE).unwrap_or_else(|_| {
            panic!("the agent did not start; stderr:\n{}", agent.stderr_text())
        });
        agent.grpc_addr = banner
            .split_once("gRPC ")
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .unwrap_or_else(|| panic!("no gRPC address in {banner:?}"))
            .to_string();
        agent
    }

    fn stderr_text(&self) -> String {
        self.stderr.lock().unwrap().join("\n")
    }

    /// The store warnings so far: (cause, suppressed) of each line.
    fn store_warnings(&self) -> Vec<(String, u64)> {
        self.stderr
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line.contains(STORE_WARNING))
            .map(|line| {
                assert!(line.contains("WARN"), "{line}");
                (field(line, "cause"), parse_count(line))
            })
            .collect()
    }
}

fn write(dir: &Path, name: &str, text: &str) {
    std::fs::write(dir.join(name), text).expect("write test file");
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The value of `name=` in a fmt log line (quotes removed).
fn field(line: &str, name: &str) -> String {
    let key = format!("{name}=");
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(key.as_str()))
        .unwrap_or_else(|| panic!("no {name} in {line}"))
        .trim_matches('"')
        .to_string()
}

fn parse_count(line: &str) -> u64 {
    field(line, "suppressed")
        .parse()
        .unwrap_or_else(|_| panic!("suppressed is not a count in {line}"))
}

fn check(n: u64) -> pb::CheckRequest {
    pb::CheckRequest {
        request_id: format!("flood-{n}"),
        target: Some(pb::Target {
            domain: "api".into(),
            tenant: "atlas".into(),
            principal: Some(pb::Principal {
                r#type: "user".into(),
                id: "u-1".into(),
            }),
            route_group: "read".into(),
            method: "GET".into(),
            descriptors: vec![],
        }),
        cost: 1,
        policy_version_seen: 0,
    }
}

/// One Check; with Redis down it degrades (fail open, fallback set).
async fn degraded_check(client: &mut AgentClient<Channel>, n: u64) {
    let decision = client.check(check(n)).await.expect("check").into_inner();
    assert!(decision.allowed && decision.fallback, "{decision:?}");
}

/// Warnings accounted for: each line, plus the ones it says it dropped.
fn accounted(warnings: &[(String, u64)]) -> u64 {
    warnings.iter().map(|(_, suppressed)| 1 + suppressed).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_outage_logs_one_counted_line_per_cause_per_interval() {
    let mut redis = RedisServer::start().expect("redis-server");
    let agent = AgentProcess::start(&redis.url());
    let mut client = AgentClient::connect(format!("http://{}", agent.grpc_addr))
        .await
        .expect("connect to the agent");

    // Healthy first: decided by Redis, no warning.
    let decision = client.check(check(0)).await.expect("check").into_inner();
    assert!(decision.allowed && !decision.fallback, "{decision:?}");

    redis.kill();
    let started = Instant::now();
    for n in 1..=CHECKS {
        degraded_check(&mut client, n).await;
    }
    let outage_elapsed = started.elapsed();
    // The decisions are answered; their warnings may still be in the pipe:
    // wait (bounded) until the line of the first degraded decision is read.
    let until = Instant::now() + DEADLINE;
    while agent.store_warnings().is_empty() && Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let first = agent.store_warnings();
    let causes: std::collections::BTreeSet<&str> =
        first.iter().map(|(cause, _)| cause.as_str()).collect();
    assert!(
        !first.is_empty(),
        "no store warning:\n{}",
        agent.stderr_text()
    );
    assert!(causes.len() <= STORE_CAUSES_MAX, "{causes:?}");
    // One line per cause per interval begun during the outage.
    let intervals = 1 + (outage_elapsed.as_millis() / LOG_INTERVAL.as_millis()) as usize;
    assert!(
        first.len() <= causes.len() * intervals,
        "{} store warnings for {CHECKS} checks in {outage_elapsed:?}:\n{}",
        first.len(),
        agent.stderr_text()
    );

    // Keep the outage going until the dropped warnings are reported: the
    // next line of a cause (after its interval) carries the count.
    let mut sent = CHECKS;
    let until = Instant::now() + DEADLINE;
    let outage_started = started;
    while accounted(&agent.store_warnings()) < CHECKS && Instant::now() < until {
        sent += 1;
        degraded_check(&mut client, sent).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let warnings = agent.store_warnings();
    let total = accounted(&warnings);
    assert!(
        total >= CHECKS,
        "only {total} of {CHECKS} degraded decisions accounted for by {warnings:?}"
    );
    // Never counted twice: one degraded decision is one warning, logged or counted.
    assert!(
        total <= sent,
        "{total} accounted for {sent} checks: {warnings:?}"
    );
    // Still one line per cause per interval, however long the outage took
    // on this machine: the rest were counted, not written.
    let causes: std::collections::BTreeSet<&str> =
        warnings.iter().map(|(cause, _)| cause.as_str()).collect();
    let intervals = 1 + (outage_started.elapsed().as_millis() / LOG_INTERVAL.as_millis()) as usize;
    assert!(
        warnings.len() <= causes.len() * intervals,
        "{} lines for {sent} checks in {:?}: {warnings:?}",
        warnings.len(),
        outage_started.elapsed()
    );
    let suppressed: u64 = warnings.iter().map(|(_, s)| *s).sum();
    assert!(
        suppressed > 0,
        "nothing was counted instead of written: {warnings:?}"
    );
    // No request data in the lines: the cause is a kind of error.
    for (cause, _) in &warnings {
        assert!(cause.starts_with("store."), "{cause}");
    }
    assert!(
        !agent.stderr_text().contains("u-1"),
        "a principal id was logged"
    );
}
