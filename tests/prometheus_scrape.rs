//! A real Prometheus (Debian's `prometheus` package, which `.ci/run`
//! installs) scrapes every allocator node and every Region agent of a
//! `leasehold dev` over mTLS, presenting the `sre` certificate and
//! verifying the servers' certificates against the dev CA (no
//! `insecure_skip_verify`), with the scrape config docs/observability.md
//! prints ("Scraping with Prometheus"). The test waits (bounded) for
//! `up == 1` on every target and for the allocators' per-Region share
//! series, never for a duration, and asserts no timings.

mod common_ports;
use common_ports::free_offset;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Default ports of `leasehold dev` and of deploy/regions/*.toml.
const ALLOCATOR_PORTS: [u16; 3] = [7301, 7302, 7303];
/// Each node's `metrics_listen` is its gRPC port + 90.
const METRICS_PORTS: [u16; 3] = [7391, 7392, 7393];
const AGENTS: [(&str, u16, u16); 3] = [("eu", 7101, 7191), ("us", 7102, 7192), ("ap", 7103, 7193)];
/// Where this test's Prometheus listens, shifted by the same offset (the
/// dev layout leaves it free).
const PROMETHEUS_PORT: u16 = 7399;
/// The jobs of the scrape config.
const ALLOCATOR_JOB: &str = "leasehold-allocators";
const AGENT_JOB: &str = "leasehold-agents";
/// The pool whose share series the test looks for.
const POOL: &str = "api-rate";
/// Bound on every wait for the system to reach a state (a loaded 2-core CI
/// machine runs the debug build).
const SETTLE: Duration = Duration::from_secs(90);
/// Bound on a stop after SIGTERM.
const STOP: Duration = Duration::from_secs(30);
/// How often a wait looks again.
const POLL: Duration = Duration::from_millis(250);
/// Bound on one HTTP call to Prometheus.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// The certificates directory the docs' config names: `leasehold dev`'s
/// default for uid 1000 (`leasehold-dev-certs-<uid>` in the temporary
/// directory).
const DOCS_CERTS_DIR: &str = "/tmp/leasehold-dev-certs-1000";

/// The scrape config for a `leasehold dev` on ports shifted by `offset`
/// whose certificates are in `certs`: one job for the allocator nodes'
/// `metrics_listen`, one for the agents' `http_listen`, HTTPS presenting
/// the sre certificate. The certificates carry `IP:127.0.0.1` and
/// `DNS:localhost` beside their SPIFFE URI SAN, so Prometheus verifies
/// each server against the dev CA by the target's address: no
/// `server_name`, no `insecure_skip_verify`. With offset 0 and
/// [`DOCS_CERTS_DIR`] it is the config docs/observability.md prints.
fn scrape_config(certs: &Path, offset: u16) -> String {
    let targets = |ports: &mut dyn Iterator<Item = u16>| {
        ports
            .map(|port| format!("\"127.0.0.1:{}\"", port + offset))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let file = |name: &str| certs.join(name).display().to_string();
    let tls = format!(
        "    scheme: https\n    tls_config:\n      ca_file: {}\n      cert_file: {}\n      key_file: {}\n",
        file("ca.pem"),
        file("sre.pem"),
        file("sre.key")
    );
    format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n\nscrape_configs:\n  \
         - job_name: {ALLOCATOR_JOB}\n{tls}    static_configs:\n      - targets: [{}]\n  \
         - job_name: {AGENT_JOB}\n{tls}    static_configs:\n      - targets: [{}]\n",
        targets(&mut METRICS_PORTS.iter().copied()),
        targets(&mut AGENTS.iter().map(|(_, _, http)| *http)),
    )
}

fn all_ports(offset: u16) -> Vec<u16> {
    let agents = AGENTS.iter().flat_map(|(_, grpc, http)| [*grpc, *http]);
    ALLOCATOR_PORTS
        .iter()
        .chain(METRICS_PORTS.iter())
        .copied()
        .chain(agents)
        .chain([PROMETHEUS_PORT])
        .map(|port| port + offset)
        .collect()
}

/// `program` runs (`--version`), or the test fails saying how to install it.
fn require(program: &str) {
    match Command::new(program).arg("--version").output() {
        Ok(out) if out.status.success() => {}
        Ok(out) => panic!(
            "`{program} --version` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(error) => panic!(
            "{program} is not runnable ({error}): this test needs Debian's Prometheus \
             (`apt-get install prometheus`, which `.ci/run` does on CI)"
        ),
    }
}

/// Reads `from` into `into` line by line until EOF.
fn collect(from: impl Read + Send + 'static, into: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { return };
            let mut text = into.lock().unwrap();
            text.push_str(&line);
            text.push('\n');
        }
    });
}

fn tail(text: &str, bytes: usize) -> &str {
    let mut start = text.len().saturating_sub(bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// A child process whose output is collected as it comes; killed on drop.
struct Process {
    name: &'static str,
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Process {
    fn spawn(name: &'static str, command: &mut Command) -> Process {
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("start {name}: {error}"));
        let (stdout, stderr) = (Arc::default(), Arc::default());
        collect(child.stdout.take().unwrap(), Arc::clone(&stdout));
        collect(child.stderr.take().unwrap(), Arc::clone(&stderr));
        Process {
            name,
            child,
            stdout,
            stderr,
        }
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Both streams, for failure messages.
    fn output(&self) -> String {
        format!(
            "--- {name} stdout (last 4,000 bytes)\n{}--- {name} stderr (last 4,000 bytes)\n{}",
            tail(&self.stdout(), 4_000),
            tail(&self.stderr.lock().unwrap(), 4_000),
            name = self.name
        )
    }

    /// Sends SIGTERM and waits (bounded) for the exit.
    fn terminate(&mut self) -> std::process::ExitStatus {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -TERM {} failed", self.name);
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                started.elapsed() < STOP,
                "{} did not exit within {STOP:?} of SIGTERM\n{}",
                self.name,
                self.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Panics with the output if the process has exited.
    fn assert_running(&mut self, before: &str) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "{} exited ({status}) before {before}\n{}",
                self.name,
                self.output()
            );
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            // Killed, `leasehold dev` leaves the data directory its banner
            // names.
            let stdout = self.stdout();
            let data_dir = stdout
                .split("(data in ")
                .nth(1)
                .and_then(|after| after.split(", removed on exit)").next());
            if let Some(dir) = data_dir {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// Waits (bounded by [`SETTLE`]) until `ready` returns Some, while every
/// process of `running` is alive; panics with `why_not()` and their output.
fn wait_for<T>(
    what: &str,
    running: &mut [&mut Process],
    mut ready: impl FnMut() -> Option<T>,
    why_not: impl Fn() -> String,
) -> T {
    let started = Instant::now();
    loop {
        if let Some(value) = ready() {
            return value;
        }
        for process in running.iter_mut() {
            process.assert_running(what);
        }
        if started.elapsed() >= SETTLE {
            let output: Vec<String> = running.iter().map(|p| p.output()).collect();
            panic!(
                "not within {SETTLE:?}: {what}\n{}\n{}",
                why_not(),
                output.join("\n")
            );
        }
        std::thread::sleep(POLL);
    }
}

/// `query` with everything but RFC 3986's unreserved characters
/// percent-encoded.
fn url_encode(query: &str) -> String {
    query
        .bytes()
        .map(|byte| match byte {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (byte as char).to_string()
            }
            _ => format!("%{byte:02X}"),
        })
        .collect()
}

/// GET `path` from 127.0.0.1:`port` (HTTP/1.0: no chunked body, the
/// server closes): (status code, body), or why none came.
fn http_get(port: u16, path: &str) -> Result<(u16, String), String> {
    let address = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream =
        TcpStream::connect_timeout(&address, HTTP_TIMEOUT).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(HTTP_TIMEOUT))
        .and_then(|()| stream.set_write_timeout(Some(HTTP_TIMEOUT)))
        .map_err(|e| e.to_string())?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&answer);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("no end of the head: {text}"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status: {head}"))?;
    Ok((status, body.to_string()))
}

/// `GET /api/v1/<path>` answered with `status: success`: its `data`.
fn api(port: u16, path: &str) -> Result<serde_json::Value, String> {
    let (code, body) = http_get(port, &format!("/api/v1/{path}"))?;
    let json: serde_json::Value =
        serde_json::from_str(&body).map_err(|e| format!("{code} {e}: {body}"))?;
    if code != 200 || json["status"] != "success" {
        return Err(format!("{code}: {body}"));
    }
    Ok(json["data"].clone())
}

/// One series of an instant vector: its labels and value.
type Sample = (BTreeMap<String, String>, f64);

/// The instant vector of `query`.
fn query(port: u16, query: &str) -> Result<Vec<Sample>, String> {
    let data = api(port, &format!("query?query={}", url_encode(query)))?;
    let series = data["result"]
        .as_array()
        .ok_or_else(|| format!("no result vector: {data}"))?;
    Ok(series
        .iter()
        .map(|one| {
            let labels = one["metric"]
                .as_object()
                .map(|labels| {
                    labels
                        .iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                })
                .unwrap_or_default();
            let value = one["value"][1]
                .as_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN);
            (labels, value)
        })
        .collect())
}

/// Prometheus's own view of its targets, for failure messages: job,
/// instance, health and last error of each.
fn targets_report(port: u16) -> String {
    match api(port, "targets?state=active") {
        Ok(data) => data["activeTargets"]
            .as_array()
            .map(|targets| {
                targets
                    .iter()
                    .map(|t| {
                        format!(
                            "{} {} {} {}",
                            t["labels"]["job"],
                            t["labels"]["instance"],
                            t["health"],
                            t["lastError"]
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_else(|| data.to_string()),
        Err(error) => format!("/api/v1/targets: {error}"),
    }
}

/// The yaml block under docs/observability.md's "Scraping with
/// Prometheus" heading.
fn docs_scrape_config() -> String {
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/observability.md"),
    )
    .unwrap();
    let section = docs
        .split("\n## Scraping with Prometheus\n")
        .nth(1)
        .expect("docs/observability.md has a section \"Scraping with Prometheus\"");
    let block = section
        .split("```yaml\n")
        .nth(1)
        .and_then(|rest| rest.split("```\n").next())
        .expect("the section prints a ```yaml block");
    block.to_string()
}

#[test]
fn the_docs_print_the_scrape_config_this_test_uses() {
    assert_eq!(
        docs_scrape_config(),
        scrape_config(Path::new(DOCS_CERTS_DIR), 0),
        "docs/observability.md (Scraping with Prometheus) and scrape_config differ"
    );
}

#[test]
fn prometheus_scrapes_every_allocator_node_and_agent_of_leasehold_dev_over_mtls() {
    require("prometheus");
    require("promtool");
    let offset = free_offset(all_ports);
    let work = tempfile::tempdir().unwrap();
    let certs: PathBuf = work.path().join("certs");

    let mut dev = Process::spawn(
        "leasehold dev",
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["dev", "--port-offset", &offset.to_string(), "--certs-dir"])
            .arg(&certs)
            .env("RUST_LOG", "warn"),
    );
    // The banner comes once every node and agent runs (and the
    // certificates exist).
    let dev_stdout = Arc::clone(&dev.stdout);
    wait_for(
        "leasehold dev's banner",
        &mut [&mut dev],
        || {
            let stdout = dev_stdout.lock().unwrap();
            stdout.contains("Ctrl-C stops everything.").then_some(())
        },
        String::new,
    );

    let config = work.path().join("prometheus.yml");
    std::fs::write(&config, scrape_config(&certs, offset)).unwrap();
    let check = Command::new("promtool")
        .args(["check", "config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "promtool check config {}: {}{}",
        config.display(),
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );

    let port = PROMETHEUS_PORT + offset;
    let storage = work.path().join("tsdb");
    let mut prometheus = Process::spawn(
        "prometheus",
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", storage.display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--log.level=warn"),
    );
    wait_for(
        "Prometheus ready",
        &mut [&mut dev, &mut prometheus],
        || {
            http_get(port, "/-/ready")
                .ok()
                .filter(|(code, _)| *code == 200)
        },
        String::new,
    );

    // Every target up at once: each allocator node's metrics_listen and
    // each agent's http_listen, scraped over mTLS as sre.
    let expected: BTreeSet<(String, String)> = METRICS_PORTS
        .iter()
        .map(|p| (ALLOCATOR_JOB, *p))
        .chain(AGENTS.iter().map(|(_, _, http)| (AGENT_JOB, *http)))
        .map(|(job, p)| (job.to_string(), format!("127.0.0.1:{}", p + offset)))
        .collect();
    let up = wait_for(
        "up == 1 for every allocator node and agent",
        &mut [&mut dev, &mut prometheus],
        || {
            let series = query(port, "up").ok()?;
            let up: BTreeSet<(String, String)> = series
                .iter()
                .filter(|(_, value)| *value == 1.0)
                .filter_map(|(labels, _)| {
                    Some((labels.get("job")?.clone(), labels.get("instance")?.clone()))
                })
                .collect();
            (up == expected && series.len() == expected.len()).then_some(series)
        },
        || targets_report(port),
    );
    assert_eq!(up.len(), 6, "{up:?}");

    // The allocators' per-Region share series of the rate pool: at least
    // one per Region (every replica shows the same applied state).
    let share =
        format!("leasehold_allocator_member_share_millitokens_per_second{{pool=\"{POOL}\"}}");
    let regions: BTreeSet<String> = AGENTS.iter().map(|(r, _, _)| r.to_string()).collect();
    let shares = wait_for(
        &format!("{share} for every Region"),
        &mut [&mut dev, &mut prometheus],
        || {
            let series = query(port, &share).ok()?;
            let seen: BTreeSet<String> = series
                .iter()
                .filter(|(labels, _)| labels.get("job").map(String::as_str) == Some(ALLOCATOR_JOB))
                .filter_map(|(labels, _)| labels.get("region").cloned())
                .collect();
            (seen == regions).then_some(series)
        },
        || format!("{:?}", query(port, &share)),
    );
    for (labels, value) in &shares {
        assert!(value.is_finite() && *value >= 0.0, "{labels:?} {value}");
    }
    // And the pool's sum of shares from every node.
    let sum =
        format!("leasehold_allocator_pool_shares_sum_millitokens_per_second{{pool=\"{POOL}\"}}");
    let instances = wait_for(
        &format!("{sum} from every allocator node"),
        &mut [&mut dev, &mut prometheus],
        || {
            let series = query(port, &sum).ok()?;
            let instances: BTreeSet<String> = series
                .iter()
                .filter_map(|(labels, _)| labels.get("instance").cloned())
                .collect();
            (instances.len() == METRICS_PORTS.len()).then_some(instances)
        },
        || format!("{:?}", query(port, &sum)),
    );
    assert_eq!(instances.len(), 3, "{instances:?}");
    drop(prometheus);
    let status = dev.terminate();
    assert!(
        status.success(),
        "leasehold dev: exit {status}\n{}",
        dev.output()
    );
}
