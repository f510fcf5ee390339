//! `leasehold dev` as a newcomer runs it: the built binary, one process
//! holding three allocator nodes and three Region agents on loopback, on
//! ports shifted by a random free `--port-offset`. The tests wait for the
//! system to do something (bounded), never for a duration, and assert no
//! timings.

mod common_ports;
use common_ports::{free_offset, port_is_free};

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;

/// Default ports of `leasehold dev` (deploy/regions/*.toml).
const ALLOCATOR_PORTS: [u16; 3] = [7301, 7302, 7303];
const AGENTS: [(&str, u16, u16); 3] = [("eu", 7101, 7191), ("us", 7102, 7192), ("ap", 7103, 7193)];
/// Bound on every wait for the cluster to reach a state (a loaded 2-core
/// CI machine runs the debug build).
const SETTLE: Duration = Duration::from_secs(90);
/// Bound on a stop after a signal.
const STOP: Duration = Duration::from_secs(30);

/// One cluster at a time: each is 3 nodes + 3 agents in one process, and
/// two would compete for the same few cores.
static ONE_CLUSTER: Mutex<()> = Mutex::new(());

/// The certificates every dev cluster of this test binary uses (`dev
/// --certs-dir` writes them once and reuses them; the CLI reads with them).
fn certs_dir() -> &'static str {
    static DIR: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("dev-certs-{}", std::process::id()));
        dir.display().to_string()
    })
}

fn leasehold() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
}

fn all_ports(offset: u16) -> Vec<u16> {
    // With `--cluster` each Region's second agent listens on grpc + 10 and
    // http − 10.
    let agents = AGENTS
        .iter()
        .flat_map(|(_, grpc, http)| [*grpc, *http, grpc + 10, http - 10]);
    // Each node's metrics_listen is its gRPC port + 90.
    let metrics = ALLOCATOR_PORTS.iter().map(|port| port + 90);
    ALLOCATOR_PORTS
        .iter()
        .copied()
        .chain(metrics)
        .chain(agents)
        .map(|port| port + offset)
        .collect()
}

/// The shifted allocators, each pinned to its node id (mTLS needs it).
fn allocator_list(offset: u16) -> String {
    ALLOCATOR_PORTS
        .iter()
        .zip(1..)
        .map(|(port, id)| format!("node/{id}@127.0.0.1:{}", port + offset))
        .collect::<Vec<_>>()
        .join(",")
}

/// A running `leasehold dev`; its output is collected as it comes. Dropping
/// it kills the process if a test failed before stopping it.
struct Dev {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    /// The reader threads of stdout and stderr; each ends at its stream's EOF.
    readers: Vec<JoinHandle<()>>,
    /// Disconnected once every reader thread has ended.
    readers_done: mpsc::Receiver<()>,
}

/// Reads `from` into `into` line by line until EOF; `done` is dropped (so
/// its receiver sees the disconnect) when the thread ends.
fn collect(
    from: impl Read + Send + 'static,
    into: Arc<Mutex<String>>,
    done: mpsc::Sender<()>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let _done = done;
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { return };
            let mut text = into.lock().unwrap();
            text.push_str(&line);
            text.push('\n');
        }
    })
}

impl Dev {
    fn start(offset: u16, extra: &[&str]) -> Dev {
        let mut child = leasehold()
            .args(["dev", "--port-offset", &offset.to_string()])
            .args(["--certs-dir", certs_dir()])
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (stdout, stderr) = (Arc::default(), Arc::default());
        let (done, readers_done) = mpsc::channel();
        let readers = vec![
            collect(
                child.stdout.take().unwrap(),
                Arc::clone(&stdout),
                done.clone(),
            ),
            collect(child.stderr.take().unwrap(), Arc::clone(&stderr), done),
        ];
        Dev {
            child,
            stdout,
            stderr,
            readers,
            readers_done,
        }
    }

    /// After the exit: waits (bounded) for the reader threads to reach EOF,
    /// so everything the process wrote last is collected, then joins them.
    fn join_readers(&mut self) {
        // The process held the only write ends of the pipes, so its exit
        // means EOF on both; the bound only turns a surprise into a failure.
        match self.readers_done.recv_timeout(STOP) {
            Err(mpsc::RecvTimeoutError::Disconnected) => {}
            Ok(()) => unreachable!("the readers never send"),
            Err(mpsc::RecvTimeoutError::Timeout) => panic!(
                "output readers not at EOF within {STOP:?} of the exit\n{}",
                self.output()
            ),
        }
        for reader in self.readers.drain(..) {
            reader.join().expect("an output reader panicked");
        }
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Both streams, for failure messages.
    fn output(&self) -> String {
        format!(
            "--- stdout\n{}--- stderr (last 4,000 bytes)\n{}",
            self.stdout(),
            tail(&self.stderr.lock().unwrap(), 4_000)
        )
    }

    /// Waits (bounded) until `ready` returns Some; panics with the output.
    fn wait_for<T>(&mut self, what: &str, mut ready: impl FnMut(&Dev) -> Option<T>) -> T {
        let started = Instant::now();
        loop {
            if let Some(value) = ready(self) {
                return value;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "leasehold dev exited ({status}) before {what}\n{}",
                    self.output()
                );
            }
            assert!(
                started.elapsed() < SETTLE,
                "not within {SETTLE:?}: {what}\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Sends `signal` (TERM, INT) and waits (bounded) for the exit.
    fn signal_and_wait(&mut self, signal: &str) -> ExitStatus {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal} failed");
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                self.join_readers();
                return status;
            }
            assert!(
                started.elapsed() < STOP,
                "no exit within {STOP:?} of SIG{signal}\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The temporary directory the banner names.
    fn data_dir(&self) -> Option<PathBuf> {
        let stdout = self.stdout();
        let after = stdout.split("(data in ").nth(1)?;
        let dir = after.split(", removed on exit)").next()?;
        Some(PathBuf::from(dir))
    }
}

impl Drop for Dev {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            if let Some(dir) = self.data_dir() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

fn tail(text: &str, bytes: usize) -> &str {
    let mut start = text.len().saturating_sub(bytes);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// `leasehold pool show api-rate --json` against the shifted allocators:
/// (L, [(Region, share)]) in millitokens per second, or None while the
/// cluster cannot answer yet.
fn rate_pool_shares(offset: u16) -> Option<(u64, Vec<(String, u64)>)> {
    let out = leasehold()
        .args(["pool", "show", "api-rate", "--json"])
        .args(["--allocator", &allocator_list(offset)])
        .args(["--tls-dir", certs_dir()])
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let data = &json["data"];
    let limit = data["config"]["limit_millitokens_per_s"].as_u64()?;
    let shares = data["members"]
        .as_array()?
        .iter()
        .map(|member| {
            let region = member["region"].as_str().unwrap_or_default().to_string();
            let share = member["account"]["share_millitokens_per_s"]
                .as_u64()
                .unwrap_or(0);
            (region, share)
        })
        .collect();
    Some((limit, shares))
}

/// Every Region holds a share and the shares fit in L.
fn every_region_holds_a_share(limit: u64, shares: &[(String, u64)]) -> bool {
    let regions: BTreeSet<&str> = shares.iter().map(|(r, _)| r.as_str()).collect();
    let expected: BTreeSet<&str> = AGENTS.iter().map(|(r, _, _)| *r).collect();
    let sum: u64 = shares.iter().map(|(_, s)| s).sum();
    assert!(sum <= limit, "Σ shares {sum} above L {limit}: {shares:?}");
    regions == expected && shares.iter().all(|(_, share)| *share > 0)
}

fn pooled_check(route_group: &str, id: &str) -> pb::CheckRequest {
    pb::CheckRequest {
        request_id: id.to_string(),
        target: Some(pb::Target {
            domain: "pooled".into(),
            tenant: "acme".into(),
            principal: None,
            route_group: route_group.into(),
            method: "GET".into(),
            descriptors: vec![],
        }),
        cost: 1,
        policy_version_seen: 0,
    }
}

/// POST `/json` (upstream ratelimit's JSON RLS) to `region`'s agent as its
/// gateway over HTTPS: the answer's JSON, or why none came.
async fn json_rls(region: &str, http_port: u16, body: &str) -> Result<serde_json::Value, String> {
    https_json(
        &format!("gateway-{region}"),
        region,
        http_port,
        "POST /json",
        body,
    )
    .await
}

/// An HTTPS call to `region`'s agent on `http_port` as the identity whose
/// certificate stem is `stem`: the JSON body of its answer.
async fn https_json(
    stem: &str,
    region: &str,
    http_port: u16,
    request_line: &str,
    body: &str,
) -> Result<serde_json::Value, String> {
    use leasehold_allocator::transport::{Connector, TlsNodeConnector};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tls = leasehold_tls::TlsSettings::in_dir(
        std::path::Path::new(certs_dir()),
        stem,
        "leasehold.local",
    );
    let connector = TlsNodeConnector::new(&tls).map_err(|e| e.to_string())?;
    let address = format!("127.0.0.1:{http_port}");
    let mut stream = connector
        .secure_stream(&address, region)
        .await
        .map_err(|e| e.to_string())?;
    let request = format!(
        "{request_line} HTTP/1.1\r\nHost: {address}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer).to_string();
    let body = text.split("\r\n\r\n").nth(1).ok_or(text.clone())?;
    serde_json::from_str(body).map_err(|e| format!("{e}: {text}"))
}

/// One Check on the `pooled` domain as `region`'s gateway (mTLS, the
/// agent verified as `/region/<region>`): (rule reported, allowed).
async fn check(
    region: &str,
    port: u16,
    route_group: &str,
    id: &str,
) -> Result<(String, bool), String> {
    let tls = leasehold_tls::TlsSettings::in_dir(
        std::path::Path::new(certs_dir()),
        &format!("gateway-{region}"),
        "leasehold.local",
    );
    let connector = leasehold_tls::TlsConnector::new(tls.files(), &tls.trust_domain)
        .map_err(|e| e.to_string())?;
    let expected =
        leasehold_tls::ExpectedPeer::Identity(leasehold_tls::Identity::Region(region.to_string()));
    let channel = leasehold_tls::channel(&format!("127.0.0.1:{port}"), connector, expected)
        .await
        .map_err(|e| e.to_string())?;
    let mut client = AgentClient::new(channel);
    let decision = client
        .check(pooled_check(route_group, id))
        .await
        .map_err(|status| status.to_string())?
        .into_inner();
    Ok((decision.policy_id, decision.allowed))
}

#[test]
fn dev_cluster_shares_the_rate_pool_serves_checks_and_stops_cleanly_on_sigterm() {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let offset = free_offset(all_ports);
    let mut dev = Dev::start(offset, &[]);

    let (limit, shares) = dev.wait_for("every Region holds a share of api-rate", |_| {
        rate_pool_shares(offset)
            .filter(|(limit, shares)| every_region_holds_a_share(*limit, shares))
    });
    assert_eq!(limit, 10_000_000, "L of the embedded api-rate pool");
    let sum: u64 = shares.iter().map(|(_, share)| share).sum();
    assert!(sum <= limit, "{shares:?}");
    // mTLS by default: the same read without certificates gets no answer.
    assert!(
        dev.stdout()
            .contains("mTLS on every listener: certificates in"),
        "{}",
        dev.stdout()
    );
    // Each node's /metrics is announced.
    assert!(
        dev.stdout()
            .contains(&format!("HTTP 127.0.0.1:{} (/metrics)", 7391 + offset)),
        "{}",
        dev.stdout()
    );
    let plain = leasehold()
        .args(["pool", "show", "api-rate", "--json"])
        .args(["--allocator", &allocator_list(offset)])
        .output()
        .unwrap();
    assert!(!plain.status.success(), "a plaintext read was answered");
    dev.wait_for("the report line once every agent enforces a share", |dev| {
        dev.stdout()
            .contains("every Region holds a share of api-rate")
            .then_some(())
    });

    let runtime = tokio::runtime::Runtime::new().unwrap();
    for (region, grpc, _) in AGENTS {
        for (route_group, rule) in [("rate", "g-rate"), ("minute", "g-minute")] {
            let mut attempt = 0;
            dev.wait_for(
                &format!("{region} admits a Check on pooled/{route_group}"),
                |_| {
                    attempt += 1;
                    let id = format!("dev-test-{region}-{route_group}-{attempt}");
                    match runtime.block_on(check(region, grpc + offset, route_group, &id)) {
                        Ok((policy_id, allowed)) => {
                            assert_eq!(policy_id, rule, "{region} {route_group}");
                            allowed.then_some(())
                        }
                        Err(error) => panic!("{region}: Check failed: {error}"),
                    }
                },
            );
        }
    }

    // The ratelimit YAML sample's global rule (leasehold: {pool:
    // edge-rate}) reports each Region's share of edge-rate: every Region
    // holds one and together they fit in the pool's 300/s.
    let checkout = r#"{"domain":"edge","descriptors":[{"entries":[{"key":"generic_key","value":"checkout"}]}]}"#;
    let shares = dev.wait_for(
        "every Region enforces a share of edge-rate on its RLS",
        |_| {
            let mut shares = Vec::new();
            for (region, _, http) in AGENTS {
                let answer = runtime
                    .block_on(json_rls(region, http + offset, checkout))
                    .ok()?;
                let per_s = answer["statuses"][0]["currentLimit"]["requestsPerUnit"].as_u64()?;
                shares.push(per_s);
            }
            shares.iter().all(|s| *s > 0).then_some(shares)
        },
    );
    assert!(shares.iter().sum::<u64>() <= 300, "{shares:?}");

    // The agents' gRPC listeners are mTLS too: a plaintext Check gets no
    // decision.
    let (_, eu_grpc, _) = AGENTS[0];
    let plaintext = runtime.block_on(async {
        let mut client = AgentClient::connect(format!("http://127.0.0.1:{}", eu_grpc + offset))
            .await
            .map_err(|e| e.to_string())?;
        client
            .check(pooled_check("rate", "dev-test-plaintext"))
            .await
            .map_err(|status| status.to_string())
    });
    assert!(plaintext.is_err(), "a plaintext Check was answered");

    let data_dir = dev.data_dir().expect("the banner names the data directory");
    assert!(data_dir.exists(), "{}", data_dir.display());
    let status = dev.signal_and_wait("TERM");
    assert!(status.success(), "exit {status}\n{}", dev.output());
    let stdout = dev.stdout();
    assert!(stdout.contains("SIGTERM: stopping"), "{stdout}");
    assert!(stdout.contains("stopped; removed"), "{stdout}");
    assert!(!data_dir.exists(), "{} left behind", data_dir.display());
    for port in all_ports(offset) {
        assert!(port_is_free(port), "port {port} still held after exit");
    }
}

/// `… admitted    5,600/s …` → 5600.
fn admitted_per_s(line: &str) -> Option<u64> {
    let mut words = line.split_whitespace();
    words.find(|word| *word == "admitted")?;
    words
        .next()?
        .trim_end_matches("/s")
        .replace(',', "")
        .parse()
        .ok()
}

#[test]
fn dev_demo_reports_each_region_and_the_sum_and_stops_on_ctrl_c() {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let offset = free_offset(all_ports);
    let mut dev = Dev::start(offset, &["--demo", "--demo-scale", "0.2"]);
    assert!(dev.wait_for("the demo's header", |dev| {
        dev.stdout()
            .contains("demo: Checks on domain pooled")
            .then_some(true)
    }));
    // A report after every Region holds a share has each Region admitting.
    let report = dev.wait_for("a demo report with every Region admitting", |dev| {
        let stdout = dev.stdout();
        let after = stdout.split("every Region holds a share").nth(1)?;
        let lines: Vec<&str> = after.lines().skip(1).collect();
        let admitting = |region: &str| {
            lines.iter().any(|line| {
                line.contains(&format!("s {region:<3} share"))
                    && admitted_per_s(line).is_some_and(|admitted| admitted > 0)
            })
        };
        let sum = lines
            .iter()
            .any(|line| line.contains("Σ   shares") && line.contains("of L 10,000/s"));
        (AGENTS.iter().all(|(r, _, _)| admitting(r)) && sum).then(|| after.to_string())
    });
    assert!(report.contains("refused"), "{report}");

    let status = dev.signal_and_wait("INT");
    assert!(status.success(), "exit {status}\n{}", dev.output());
    assert!(
        dev.stdout().contains("Ctrl-C: stopping"),
        "{}",
        dev.output()
    );
}

#[test]
fn dev_refuses_bad_flags_with_usage_errors_and_starts_nothing() {
    let cases: [(&[&str], &str); 6] = [
        (&["--port-offset", "60000"], "--port-offset"),
        (&["--port-offset", "many"], "--port-offset"),
        (
            &["--redis", "mars=redis://127.0.0.1:6381/"],
            "unknown Region",
        ),
        (&["--redis", "eu=http://127.0.0.1:6381/"], "not a Redis URL"),
        (
            &["--redis", "eu=redis://a:1/", "--redis", "eu=redis://b:2/"],
            "twice",
        ),
        (&["--demo-scale", "2"], "--demo"),
    ];
    for (flags, expected) in cases {
        let out = leasehold().arg("dev").args(flags).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {stderr}");
        assert!(stderr.contains(expected), "{flags:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{flags:?}: {stderr}");
    }
    let out = leasehold()
        .args(["dev", "--demo", "--demo-scale", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn dev_names_a_busy_port_and_exits_without_starting() {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let offset = free_offset(all_ports);
    let busy_port = 7192 + offset;
    let _holder = TcpListener::bind(("127.0.0.1", busy_port)).unwrap();
    let mut child = leasehold()
        .args(["dev", "--port-offset", &offset.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > STOP {
            let _ = child.kill();
            panic!("leasehold dev did not exit with port {busy_port} taken");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(!status.success());
    assert!(stderr.contains(&busy_port.to_string()), "{stderr}");
    assert!(stderr.contains("--port-offset"), "{stderr}");
    for port in all_ports(offset).into_iter().filter(|p| *p != busy_port) {
        assert!(port_is_free(port), "port {port} held after the refusal");
    }
}

/// `--cluster`: each Region on its own Redis Cluster, served by two agents
/// of which exactly one is the syncer; both decide; a stop ends every
/// Redis node too.
#[test]
fn dev_cluster_flag_runs_each_region_on_a_redis_cluster_with_two_agents_and_one_syncer() {
    let _one = ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner());
    let offset = free_offset(all_ports);
    let mut dev = Dev::start(offset, &["--cluster"]);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    // The second agent of a Region listens 10 above the first's gRPC port
    // and 10 below its HTTP port.
    let agents = |region_http: u16| [region_http + offset, region_http - 10 + offset];
    for (region, grpc, http) in AGENTS {
        let roles = dev.wait_for(
            &format!("{region}: one syncer among its two agents"),
            |_| {
                let roles: Vec<bool> = agents(http)
                    .iter()
                    .map(|port| {
                        runtime
                            .block_on(https_json("sre", region, *port, "GET /health", ""))
                            .ok()
                            .and_then(|h| h["syncer"].as_bool())
                    })
                    .collect::<Option<Vec<bool>>>()?;
                (roles.iter().filter(|s| **s).count() == 1).then_some(roles)
            },
        );
        assert_eq!(roles.len(), 2, "{region}: {roles:?}");
        for port in [grpc + offset, grpc + 10 + offset] {
            let mut attempt = 0;
            dev.wait_for(&format!("{region} agent on {port} admits a Check"), |_| {
                attempt += 1;
                let id = format!("dev-cluster-{region}-{port}-{attempt}");
                match runtime.block_on(check(region, port, "rate", &id)) {
                    Ok((_, allowed)) => allowed.then_some(()),
                    Err(error) => panic!("{region}: Check failed: {error}"),
                }
            });
        }
    }
    let stdout = dev.stdout();
    assert!(stdout.contains("agent eu-b"), "{stdout}");
    assert!(
        stdout.contains("store Redis Cluster redis://127.0.0.1:"),
        "{stdout}"
    );
    let seeds: Vec<u16> = stdout
        .lines()
        .filter_map(|l| l.split("store Redis Cluster redis://127.0.0.1:").nth(1))
        .filter_map(|rest| rest.split('/').next()?.parse().ok())
        .collect();
    assert_eq!(seeds.len(), 6, "{stdout}");
    let status = dev.signal_and_wait("TERM");
    assert!(status.success(), "exit {status}\n{}", dev.output());
    for port in seeds {
        assert!(
            port_is_free(port),
            "Redis node on {port} still running after exit"
        );
    }
    for port in all_ports(offset) {
        assert!(port_is_free(port), "port {port} still held after exit");
    }
}

#[test]
fn dev_refuses_a_certificates_directory_others_may_write_and_writes_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let base = tempfile::tempdir().unwrap();
    let planted = base.path().join("certs");
    std::fs::create_dir(&planted).unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = leasehold()
        .args([
            "dev",
            "--port-offset",
            &free_offset(all_ports).to_string(),
            "--certs-dir",
        ])
        .arg(&planted)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("writable by its group or by others"),
        "{stderr}"
    );
    assert!(stderr.contains(&planted.display().to_string()), "{stderr}");
    assert!(!planted.join("ca.pem").exists(), "a CA was written");
}
