//! Every config value is bounded, and every refusal names its file.
//!
//! Table-driven: each numeric setting of the allocator node config, the
//! pools file and the agent config (its `[global]` part included) is written
//! into a real file at its minimum and its maximum (loaded by the real
//! loaders) and just past them, and at -1 and `i64::MAX` (refused with the
//! file, the line and the range, by the loaders and by the real `leasehold`
//! binary). The same table is compared with the bounds the code exports and
//! with `docs/configuration.md`. Then the caps on counts, the pools file's
//! strictness, and start-up failures (a taken port, a malformed Redis URL, a
//! short pepper) through the binary.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use leasehold_allocator::node_config::{
    Bound, NodeConfig, GRPC_LIMITS_BOUNDS, HTTP_LIMITS_BOUNDS, MAX_PEERS, MAX_POOLS_IN_FILE,
    MAX_PROBED_REGIONS, NODE_BOUNDS, POOL_BOUNDS,
};
use leasehold_region_agent::config::{AgentConfig, AGENT_BOUNDS};
use leasehold_region_agent::global::settings::{GLOBAL_BOUNDS, MAX_ALLOCATORS, MAX_GLOBAL_POOLS};

const MAX_VALUE: i64 = 1 << 40;

// ---------------------------------------------------------------------------
// Files built from sections, so a test can set any key and know its line.
// ---------------------------------------------------------------------------

/// A TOML document as ordered sections (`""` is the root) of `key = value`.
#[derive(Clone)]
struct Doc {
    sections: Vec<(String, Vec<(String, String)>)>,
}

impl Doc {
    fn new(sections: &[(&str, &[(&str, &str)])]) -> Doc {
        Doc {
            sections: sections
                .iter()
                .map(|(header, entries)| {
                    let entries = entries
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect();
                    (header.to_string(), entries)
                })
                .collect(),
        }
    }

    /// Sets `key` in the (first) section `header`, adding either if missing.
    fn set(&mut self, header: &str, key: &str, value: &str) -> &mut Doc {
        let index = match self.sections.iter().position(|(h, _)| h == header) {
            Some(index) => index,
            None => {
                self.sections.push((header.to_string(), Vec::new()));
                self.sections.len() - 1
            }
        };
        let entries = &mut self.sections[index].1;
        match entries.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value.to_string(),
            None => entries.push((key.to_string(), value.to_string())),
        }
        self
    }

    /// The text, and the 1-based line of every `(header, key)`.
    fn render(&self) -> (String, BTreeMap<(String, String), usize>) {
        let mut text = String::new();
        let mut lines = BTreeMap::new();
        let mut line = 1;
        for (header, entries) in &self.sections {
            if !header.is_empty() {
                text.push_str(header);
                text.push('\n');
                line += 1;
            }
            for (key, value) in entries {
                text.push_str(&format!("{key} = {value}\n"));
                lines.insert((header.clone(), key.clone()), line);
                line += 1;
            }
            text.push('\n');
            line += 1;
        }
        (text, lines)
    }
}

fn node_doc() -> Doc {
    Doc::new(&[
        (
            "",
            &[
                ("plaintext", "true"),
                ("node_id", "1"),
                ("listen", "\"127.0.0.1:0\""),
                ("data_dir", "\"data\""),
            ],
        ),
        ("[peers]", &[("1", "\"127.0.0.1:7301\"")]),
        ("[raft]", &[("heartbeat_ms", "100")]),
        ("[prober]", &[("interval_ms", "1000")]),
        (
            "[[prober.region]]",
            &[
                ("region", "\"eu\""),
                ("health", "\"http://127.0.0.1:7191/health\""),
            ],
        ),
    ])
}

fn window_pools() -> Doc {
    Doc::new(&[(
        "[[pool]]",
        &[
            ("id", "\"api-window\""),
            ("kind", "\"window\""),
            ("capacity_millitokens_per_window", "1000000"),
            ("window_ms", "60000"),
            ("lease_ttl_ms", "10000"),
        ],
    )])
}

fn rate_pools(reclaim: &[(&str, &str)]) -> Doc {
    Doc::new(&[
        (
            "[[pool]]",
            &[
                ("id", "\"api-rate\""),
                ("kind", "\"rate\""),
                ("limit_millitokens_per_s", "10000000"),
                ("burst_millitokens", "20000000"),
                ("burst_seconds", "2"),
                ("floor_basis_points", "500"),
                ("interval_ms", "5000"),
                ("max_raise_basis_points", "1000"),
                ("fallback_allowance_millitokens_per_s", "500000"),
            ],
        ),
        ("[pool.reclaim]", reclaim),
    ])
}

fn two_signal_pools() -> Doc {
    rate_pools(&[("policy", "\"two_signal\""), ("silent_intervals", "3")])
}

fn lease_pools() -> Doc {
    rate_pools(&[
        ("policy", "\"lease\""),
        ("share_ttl_ms", "15000"),
        ("max_drift_ms", "100"),
    ])
}

fn agent_doc() -> Doc {
    Doc::new(&[
        (
            "",
            &[
                ("plaintext", "true"),
                ("region", "\"eu\""),
                ("listen", "\"127.0.0.1:0\""),
                ("http_listen", "\"127.0.0.1:0\""),
                ("pepper_file", "\"pepper\""),
                ("policy_file", "\"policy.toml\""),
            ],
        ),
        ("[store]", &[("call_deadline_ms", "50")]),
        ("[fallback]", &[("max_keys", "100000")]),
        ("[global]", &[("allocators", "[\"127.0.0.1:7301\"]")]),
        ("[[global.pool]]", &[("id", "\"api-rate\"")]),
    ])
}

/// A fresh directory under the system's temp dir.
fn scratch() -> PathBuf {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "leasehold-config-bounds-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

// ---------------------------------------------------------------------------
// The table.
// ---------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Node,
    WindowPool,
    TwoSignalPool,
    LeasePool,
    Agent,
}

/// One numeric setting: where it is written, its range, and the other
/// settings its extremes need (`$v` in a companion stands for the value).
struct Case {
    kind: Kind,
    header: &'static str,
    key: &'static str,
    min: i64,
    max: i64,
    zero_is_off: bool,
    with: &'static [(&'static str, &'static str, &'static str)],
}

const fn case(kind: Kind, header: &'static str, key: &'static str, min: i64, max: i64) -> Case {
    Case {
        kind,
        header,
        key,
        min,
        max,
        zero_is_off: false,
        with: &[],
    }
}

const fn with(
    mut case: Case,
    companions: &'static [(&'static str, &'static str, &'static str)],
) -> Case {
    case.with = companions;
    case
}

const fn off(mut case: Case) -> Case {
    case.zero_is_off = true;
    case
}

use Kind::*;

const TWO_40: &str = "1099511627776";

/// `[http_limits]` of a node config limits `metrics_listen` (refused alone).
const METRICS_LISTEN: &[(&str, &str, &str)] = &[("", "metrics_listen", "\"127.0.0.1:0\"")];

const CASES: &[Case] = &[
    // Allocator node config.
    with(
        case(Node, "", "node_id", 1, 4_294_967_295),
        &[("[peers]", "$v", "\"127.0.0.1:7301\"")],
    ),
    off(case(Node, "", "tick_interval_ms", 10, 60_000)),
    with(
        case(Node, "[raft]", "heartbeat_ms", 1, 10_000),
        &[
            ("[raft]", "election_min_ms", "20000"),
            ("[raft]", "election_max_ms", "40000"),
        ],
    ),
    with(
        case(Node, "[raft]", "election_min_ms", 2, 60_000),
        &[
            ("[raft]", "heartbeat_ms", "1"),
            ("[raft]", "election_max_ms", "120000"),
        ],
    ),
    with(
        case(Node, "[raft]", "election_max_ms", 3, 120_000),
        &[
            ("[raft]", "heartbeat_ms", "1"),
            ("[raft]", "election_min_ms", "2"),
        ],
    ),
    case(Node, "[raft]", "write_timeout_ms", 1, 60_000),
    case(Node, "[raft]", "max_payload_entries", 1, 65_536),
    case(Node, "[raft]", "snapshot_every_entries", 1, 10_000_000),
    case(Node, "[raft]", "logs_kept_after_snapshot", 0, 10_000_000),
    case(Node, "[prober]", "interval_ms", 10, 60_000),
    case(Node, "[prober]", "timeout_ms", 1, 60_000),
    case(Node, "[prober]", "failures_to_unhealthy", 1, 1_000),
    case(Node, "[limits]", "concurrency_per_connection", 1, 65_536),
    case(Node, "[limits]", "max_concurrent_streams", 1, 65_536),
    case(Node, "[limits]", "request_timeout_ms", 1, 60_000),
    case(Node, "[limits]", "keepalive_interval_ms", 1_000, 3_600_000),
    case(Node, "[limits]", "keepalive_timeout_ms", 1_000, 60_000),
    case(Node, "[limits]", "max_message_bytes", 4_096, 268_435_456),
    case(Node, "[limits]", "max_header_list_bytes", 1_024, 1_048_576),
    case(Node, "[limits]", "shutdown_drain_ms", 0, 600_000),
    case(Node, "[limits]", "max_connection_age_ms", 1_000, 86_400_000),
    case(Node, "[limits]", "max_connections", 1, 65_536),
    with(
        case(Node, "[limits]", "max_connections_per_address", 1, 65_536),
        &[("[limits]", "max_connections", "65536")],
    ),
    case(Node, "[write_limit]", "rate_per_s", 1, 1_000_000),
    case(Node, "[write_limit]", "burst", 1, 1_000_000),
    with(
        case(Node, "[http_limits]", "max_header_bytes", 1_024, 1_048_576),
        METRICS_LISTEN,
    ),
    with(
        case(Node, "[http_limits]", "max_body_bytes", 0, 16_777_216),
        METRICS_LISTEN,
    ),
    with(
        case(Node, "[http_limits]", "header_read_timeout_ms", 1, 60_000),
        METRICS_LISTEN,
    ),
    with(
        case(Node, "[http_limits]", "idle_timeout_ms", 1, 3_600_000),
        METRICS_LISTEN,
    ),
    // Pools file.
    case(
        WindowPool,
        "[[pool]]",
        "capacity_millitokens_per_window",
        1,
        MAX_VALUE,
    ),
    case(WindowPool, "[[pool]]", "window_ms", 1_000, 31_622_400_000),
    case(WindowPool, "[[pool]]", "lease_ttl_ms", 1, 31_622_400_000),
    with(
        case(
            TwoSignalPool,
            "[[pool]]",
            "limit_millitokens_per_s",
            1,
            MAX_VALUE,
        ),
        &[
            ("[[pool]]", "burst_seconds", "1"),
            ("[[pool]]", "burst_millitokens", TWO_40),
            ("[[pool]]", "fallback_allowance_millitokens_per_s", "0"),
        ],
    ),
    with(
        case(TwoSignalPool, "[[pool]]", "burst_millitokens", 1, MAX_VALUE),
        &[
            ("[[pool]]", "limit_millitokens_per_s", "1"),
            ("[[pool]]", "burst_seconds", "1"),
            ("[[pool]]", "fallback_allowance_millitokens_per_s", "0"),
        ],
    ),
    with(
        case(TwoSignalPool, "[[pool]]", "burst_seconds", 1, 3_600),
        &[("[[pool]]", "burst_millitokens", TWO_40)],
    ),
    case(TwoSignalPool, "[[pool]]", "floor_basis_points", 0, 10_000),
    case(TwoSignalPool, "[[pool]]", "interval_ms", 100, 3_600_000),
    case(
        TwoSignalPool,
        "[[pool]]",
        "max_raise_basis_points",
        1,
        10_000,
    ),
    case(TwoSignalPool, "[[pool]]", "max_demand_multiple", 1, 100),
    case(
        TwoSignalPool,
        "[pool.reclaim]",
        "silent_intervals",
        1,
        1_000,
    ),
    case(LeasePool, "[pool.reclaim]", "share_ttl_ms", 1, 86_400_000),
    case(LeasePool, "[pool.reclaim]", "max_drift_ms", 0, 3_600_000),
    with(
        case(
            TwoSignalPool,
            "[[pool]]",
            "fallback_allowance_millitokens_per_s",
            0,
            MAX_VALUE,
        ),
        &[
            ("[[pool]]", "limit_millitokens_per_s", TWO_40),
            ("[[pool]]", "burst_seconds", "1"),
            ("[[pool]]", "burst_millitokens", TWO_40),
        ],
    ),
    // Agent config.
    case(Agent, "[store]", "call_deadline_ms", 1, 60_000),
    case(Agent, "[store]", "connect_timeout_ms", 1, 60_000),
    case(Agent, "[store]", "max_in_flight", 1, 1_000_000),
    case(Agent, "[store]", "breaker_failures", 1, 1_000),
    case(Agent, "[store]", "breaker_open_ms", 1, 600_000),
    case(Agent, "[store]", "memory_max_keys", 1, 100_000_000),
    case(Agent, "[store]", "max_batch", 1, 64),
    case(Agent, "[store]", "max_wait_us", 0, 10_000),
    case(Agent, "[store]", "max_queue", 1, 1_000_000),
    case(Agent, "[fallback]", "max_keys", 1, 10_000_000),
    case(Agent, "[denials]", "max_keys", 0, 10_000_000),
    case(Agent, "[agent_leasing]", "hot_keys", 2, 1_000_000),
    case(Agent, "[agent_leasing]", "max_keys", 1, 1_000_000),
    case(
        Agent,
        "[agent_leasing]",
        "hot_rate_tokens_per_s",
        1,
        1_000_000_000,
    ),
    case(Agent, "[agent_leasing]", "block_window_ms", 10, 10_000),
    case(Agent, "[agent_leasing]", "block_span_ms", 10, 10_000),
    case(Agent, "[agent_leasing]", "max_capacity_percent", 1, 50),
    case(Agent, "[agent_leasing]", "idle_ms", 100, 60_000),
    case(Agent, "[agent_leasing]", "sweep_ms", 10, 10_000),
    case(Agent, "[metering]", "flush_ms", 100, 60_000),
    case(Agent, "[metering]", "max_keys", 1, 1_000_000),
    case(Agent, "[metering]", "max_senders", 1, 65_536),
    case(Agent, "[metering]", "silent_after_ms", 1_000, 86_400_000),
    case(Agent, "[metering]", "quota_refresh_ms", 100, 60_000),
    case(Agent, "[metering]", "quota_max_keys", 1, 1_000_000),
    with(
        case(Agent, "[forwarding]", "timeout_ms", 10, 10_000),
        &[("[forwarding.agents]", "eu", "\"127.0.0.1:1\"")],
    ),
    case(Agent, "[rlqs]", "quiet_after_ms", 5_000, 3_600_000),
    case(Agent, "[rlqs]", "max_streams", 1, 1_000_000),
    case(Agent, "[rlqs]", "max_buckets_per_stream", 1, 100_000),
    case(Agent, "[rlqs]", "max_subscriptions", 1, 10_000_000),
    case(Agent, "[rlqs]", "tick_ms", 100, 60_000),
    case(Agent, "[rlqs]", "region_agents", 1, 1_000),
    case(Agent, "[fallback]", "policy_poll_ms", 100, 3_600_000),
    case(Agent, "[limits]", "concurrency_per_connection", 1, 65_536),
    case(Agent, "[limits]", "max_concurrent_streams", 1, 65_536),
    case(Agent, "[limits]", "request_timeout_ms", 1, 60_000),
    case(Agent, "[limits]", "keepalive_interval_ms", 1_000, 3_600_000),
    case(Agent, "[limits]", "keepalive_timeout_ms", 1_000, 60_000),
    case(Agent, "[limits]", "max_message_bytes", 4_096, 268_435_456),
    case(Agent, "[limits]", "max_header_list_bytes", 1_024, 1_048_576),
    case(Agent, "[limits]", "shutdown_drain_ms", 0, 600_000),
    case(
        Agent,
        "[limits]",
        "max_connection_age_ms",
        1_000,
        86_400_000,
    ),
    case(Agent, "[limits]", "max_connections", 1, 65_536),
    with(
        case(Agent, "[limits]", "max_connections_per_address", 1, 65_536),
        &[("[limits]", "max_connections", "65536")],
    ),
    case(Agent, "[http_limits]", "max_header_bytes", 1_024, 1_048_576),
    case(Agent, "[http_limits]", "max_body_bytes", 0, 16_777_216),
    case(Agent, "[http_limits]", "header_read_timeout_ms", 1, 60_000),
    case(Agent, "[http_limits]", "idle_timeout_ms", 1, 3_600_000),
    with(
        case(Agent, "[ratelimit]", "poll_ms", 100, 3_600_000),
        &[("[ratelimit]", "config_dir", "\"rl\"")],
    ),
    with(
        case(Agent, "[ratelimit]", "near_limit_percent", 1, 100),
        &[("[ratelimit]", "config_dir", "\"rl\"")],
    ),
    with(
        case(
            Agent,
            "[ratelimit]",
            "expiration_jitter_max_seconds",
            0,
            86_400,
        ),
        &[("[ratelimit]", "config_dir", "\"rl\"")],
    ),
    with(
        case(Agent, "[ratelimit]", "local_cache_max_keys", 0, 1_000_000),
        &[("[ratelimit]", "config_dir", "\"rl\"")],
    ),
    case(Agent, "[global]", "request_timeout_ms", 1, 60_000),
    case(Agent, "[global]", "tick_ms", 10, 10_000),
    case(Agent, "[global]", "syncer_lease_ttl_ms", 300, 60_000),
    case(Agent, "[[global.pool]]", "phase_ms", 0, 3_600_000),
    case(Agent, "[[global.pool]]", "chunk_millitokens", 1, MAX_VALUE),
    with(
        case(
            Agent,
            "[[global.pool]]",
            "low_water_millitokens",
            0,
            MAX_VALUE - 1,
        ),
        &[("[[global.pool]]", "chunk_millitokens", TWO_40)],
    ),
];

impl Case {
    /// The setting's path as the code's bound tables and the docs spell it.
    fn path(&self) -> String {
        let prefix = match self.header {
            "" | "[[pool]]" => "",
            "[pool.reclaim]" => "reclaim.",
            "[[global.pool]]" => "global.pool.",
            header => &header[1..header.len() - 1],
        };
        match prefix {
            "" | "reclaim." | "global.pool." => format!("{prefix}{}", self.key),
            section => format!("{section}.{}", self.key),
        }
    }

    /// How a refusal names the setting.
    fn shown(&self) -> String {
        match self.kind {
            Node => self.path(),
            WindowPool => format!("pool api-window: {}", self.path()),
            TwoSignalPool | LeasePool => format!("pool api-rate: {}", self.path()),
            Agent => format!(
                "field {}",
                self.path().replace("global.pool.", "global.pool[0].")
            ),
        }
    }

    fn range(&self) -> String {
        let range = format!("[{}, {}]", self.min, self.max);
        if self.zero_is_off {
            format!("{range} (or 0: off)")
        } else {
            range
        }
    }

    fn exported(&self) -> Bound {
        let path = self.path();
        let table: &[Bound] = match self.kind {
            Node | Agent if path.starts_with("limits.") => GRPC_LIMITS_BOUNDS,
            Node if path.starts_with("http_limits.") => HTTP_LIMITS_BOUNDS,
            Node => NODE_BOUNDS,
            WindowPool | TwoSignalPool | LeasePool => POOL_BOUNDS,
            Agent if path.starts_with("global.") => GLOBAL_BOUNDS,
            Agent => AGENT_BOUNDS,
        };
        *table
            .iter()
            .find(|b| b.path == path)
            .unwrap_or_else(|| panic!("{path} is not in the code's bounds"))
    }

    /// Values the loaders must accept and refuse.
    fn accepted(&self) -> Vec<i64> {
        let mut values = vec![self.min, self.max];
        if self.zero_is_off {
            values.push(0);
        }
        values
    }

    fn refused(&self) -> Vec<i64> {
        let mut values = vec![self.max + 1, -1, i64::MAX];
        let below = self.min - 1;
        if below >= 0 && !(below == 0 && self.zero_is_off) {
            values.push(below);
        }
        if self.zero_is_off && self.min > 1 {
            values.push(1);
        }
        values
    }
}

/// Written files: the one to load (and give the binary), the one a refusal
/// names, that file's text and the line of the case's key in it.
struct Written {
    load: PathBuf,
    named: PathBuf,
    line: usize,
}

fn write_case(dir: &Path, case: &Case, value: i64) -> Written {
    let value_text = value.to_string();
    let mut doc = match case.kind {
        Node => node_doc(),
        WindowPool => window_pools(),
        TwoSignalPool => two_signal_pools(),
        LeasePool => lease_pools(),
        Agent => agent_doc(),
    };
    for (header, key, companion) in case.with {
        let key = key.replace("$v", &value_text);
        doc.set(header, &key, companion);
    }
    doc.set(case.header, case.key, &value_text);
    let (text, lines) = doc.render();
    let line = lines[&(case.header.to_string(), case.key.to_string())];
    match case.kind {
        Node => {
            let path = dir.join("allocator.toml");
            std::fs::write(&path, text).unwrap();
            Written {
                load: path.clone(),
                named: path,
                line,
            }
        }
        WindowPool | TwoSignalPool | LeasePool => {
            let pools = dir.join("pools.toml");
            std::fs::write(&pools, text).unwrap();
            let mut node = node_doc();
            node.set("", "pools_file", "\"pools.toml\"");
            let path = dir.join("allocator.toml");
            std::fs::write(&path, node.render().0).unwrap();
            Written {
                load: path,
                named: pools,
                line,
            }
        }
        Agent => {
            let path = dir.join("agent.toml");
            std::fs::write(&path, text).unwrap();
            Written {
                load: path.clone(),
                named: path,
                line,
            }
        }
    }
}

fn load(kind: Kind, path: &Path) -> Result<(), String> {
    match kind {
        Agent => AgentConfig::load(path).map(drop).map_err(|e| e.to_string()),
        _ => NodeConfig::load(path).map(drop).map_err(|e| e.to_string()),
    }
}

fn expected_refusal(case: &Case, written: &Written, value: i64) -> String {
    format!(
        "{}:{}: {}: {value} is outside {}",
        written.named.display(),
        written.line,
        case.shown(),
        case.range()
    )
}

#[test]
fn every_numeric_setting_is_accepted_at_its_bounds_and_refused_past_them() {
    let dir = scratch();
    for case in CASES {
        for value in case.accepted() {
            let written = write_case(&dir, case, value);
            if let Err(error) = load(case.kind, &written.load) {
                panic!("{} = {value} refused: {error}", case.path());
            }
        }
        for value in case.refused() {
            let written = write_case(&dir, case, value);
            match load(case.kind, &written.load) {
                Ok(()) => panic!("{} = {value} accepted", case.path()),
                Err(error) => assert_eq!(error, expected_refusal(case, &written, value)),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs the binary (which must exit by itself); kills it after a deadline.
fn run(args: &[&std::ffi::OsStr]) -> (bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("leasehold {args:?} did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn run_config(kind: Kind, path: &Path) -> (bool, String) {
    let command = if kind == Agent { "agent" } else { "allocator" };
    run(&[command.as_ref(), "--config".as_ref(), path.as_os_str()])
}

#[test]
fn the_binary_refuses_each_setting_past_its_bounds_with_file_line_and_range() {
    let dir = scratch();
    for case in CASES {
        for value in [case.max + 1, i64::MAX] {
            let written = write_case(&dir, case, value);
            let (success, stderr) = run_config(case.kind, &written.load);
            assert!(!success, "{} = {value} accepted", case.path());
            let expected = expected_refusal(case, &written, value);
            assert!(stderr.contains(&expected), "{expected}\n{stderr}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_table_covers_every_bound_the_code_checks() {
    for case in CASES {
        let bound = case.exported();
        assert_eq!(
            (bound.min, bound.max, bound.zero_is_off),
            (case.min as u64, case.max as u64, case.zero_is_off),
            "{}",
            case.path()
        );
    }
    let tables = [
        (NODE_BOUNDS, &[Node][..]),
        (GRPC_LIMITS_BOUNDS, &[Node, Agent][..]),
        (HTTP_LIMITS_BOUNDS, &[Node, Agent][..]),
        (POOL_BOUNDS, &[WindowPool, TwoSignalPool, LeasePool][..]),
        (AGENT_BOUNDS, &[Agent][..]),
        (GLOBAL_BOUNDS, &[Agent][..]),
    ];
    for (bounds, kinds) in tables {
        for bound in bounds {
            assert!(
                CASES
                    .iter()
                    .any(|c| kinds.contains(&c.kind) && c.path() == bound.path),
                "{} has no case",
                bound.path
            );
        }
    }
}

/// The integer rows of one section of `docs/configuration.md`: setting →
/// (min, max, 0 = off).
fn documented(section: &str) -> BTreeMap<String, (u64, u64, bool)> {
    let docs = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md"),
    )
    .unwrap();
    let start = docs
        .find(&format!("## {section}"))
        .unwrap_or_else(|| panic!("docs lack ## {section}"));
    let body = &docs[start + 3..];
    let body = &body[..body.find("\n## ").unwrap_or(body.len())];
    let number = |cell: &str| -> u64 {
        let digits: String = cell
            .trim()
            .chars()
            .take_while(|c| c.is_ascii_digit() || *c == '_')
            .filter(char::is_ascii_digit)
            .collect();
        digits
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {cell:?}"))
    };
    let mut rows = BTreeMap::new();
    for line in body.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        // ["", setting, type, default, min, max, meaning, ""]
        if cells.len() < 7 || cells[2] != "integer" {
            continue;
        }
        let setting = cells[1].trim_matches('`').to_string();
        let off = cells[4].contains("0 = off");
        rows.insert(setting, (number(cells[4]), number(cells[5]), off));
    }
    rows
}

#[test]
fn documented_ranges_are_the_enforced_ones() {
    let sections = [
        (
            "Allocator node config",
            [NODE_BOUNDS, GRPC_LIMITS_BOUNDS, HTTP_LIMITS_BOUNDS].concat(),
        ),
        ("Pools file", POOL_BOUNDS.to_vec()),
        (
            "Agent config",
            [AGENT_BOUNDS, GRPC_LIMITS_BOUNDS, GLOBAL_BOUNDS].concat(),
        ),
    ];
    for (section, bounds) in sections {
        let rows = documented(section);
        let enforced: BTreeMap<String, (u64, u64, bool)> = bounds
            .iter()
            .map(|b| (b.path.to_string(), (b.min, b.max, b.zero_is_off)))
            .collect();
        assert_eq!(rows, enforced, "docs/configuration.md, {section}");
    }
}

// ---------------------------------------------------------------------------
// Caps on counts.
// ---------------------------------------------------------------------------

fn load_text(kind: Kind, dir: &Path, text: &str) -> (PathBuf, Result<(), String>) {
    let name = if kind == Agent {
        "agent.toml"
    } else {
        "allocator.toml"
    };
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    let result = load(kind, &path);
    (path, result)
}

#[test]
fn a_wrong_typed_store_coalesce_names_the_file_line_and_field() {
    let dir = scratch();
    for (value, ok) in [
        ("true", true),
        ("false", true),
        ("1", false),
        ("\"yes\"", false),
    ] {
        let mut doc = agent_doc();
        doc.set("[store]", "coalesce", value);
        let (text, lines) = doc.render();
        let (path, result) = load_text(Agent, &dir, &text);
        if ok {
            result.unwrap();
            continue;
        }
        let line = lines[&("[store]".to_string(), "coalesce".to_string())];
        let refusal = result.unwrap_err();
        let prefix = format!("{}:{line}: field store.coalesce: invalid", path.display());
        assert!(refusal.starts_with(&prefix), "{refusal}");
        // The binary says the same.
        let (started, output) = run_config(Agent, &path);
        assert!(!started && output.contains(&prefix), "{output}");
    }
}

#[test]
fn counted_settings_are_accepted_at_their_cap_and_refused_past_it() {
    let dir = scratch();
    // peers
    for (count, ok) in [(MAX_PEERS, true), (MAX_PEERS + 1, false)] {
        let mut doc = node_doc();
        for id in 2..=count {
            doc.set(
                "[peers]",
                &id.to_string(),
                &format!("\"127.0.0.1:{}\"", 7300 + id),
            );
        }
        let (text, lines) = doc.render();
        let (path, result) = load_text(Node, &dir, &text);
        if ok {
            result.unwrap();
        } else {
            let line = lines[&("[peers]".to_string(), "1".to_string())] - 1;
            assert_eq!(
                result.unwrap_err(),
                format!(
                    "{}:{line}: peers: 10 peers, above the cap of 9",
                    path.display()
                )
            );
        }
    }
    // prober.region
    for (count, ok) in [(MAX_PROBED_REGIONS, true), (MAX_PROBED_REGIONS + 1, false)] {
        let (mut text, _) = node_doc().render();
        for i in 1..count {
            text.push_str(&format!(
                "[[prober.region]]\nregion = \"r{i}\"\nhealth = \"127.0.0.1:{}\"\n",
                8000 + i
            ));
        }
        let (path, result) = load_text(Node, &dir, &text);
        if ok {
            result.unwrap();
        } else {
            let line = text.lines().count() - 2;
            assert_eq!(
                result.unwrap_err(),
                format!(
                    "{}:{line}: prober.region: 257 Regions, above the cap of 256",
                    path.display()
                )
            );
        }
    }
    // pools
    for (count, ok) in [(MAX_POOLS_IN_FILE, true), (MAX_POOLS_IN_FILE + 1, false)] {
        let text: String = (0..count)
            .map(|i| {
                format!(
                    "[[pool]]\nid = \"p{i}\"\nkind = \"window\"\ncapacity_millitokens_per_window = 1\nwindow_ms = 1000\nlease_ttl_ms = 1\n"
                )
            })
            .collect();
        let pools = dir.join("pools.toml");
        std::fs::write(&pools, &text).unwrap();
        let (node, _) = node_doc().set("", "pools_file", "\"pools.toml\"").render();
        let (_, result) = load_text(Node, &dir, &node);
        if ok {
            result.unwrap();
        } else {
            assert_eq!(
                result.unwrap_err(),
                format!(
                    "{}:{}: pool: 1025 pools, above the cap of 1024",
                    pools.display(),
                    1_024 * 6 + 1
                )
            );
        }
    }
    // global.pool and global.allocators
    for (count, ok) in [(MAX_GLOBAL_POOLS, true), (MAX_GLOBAL_POOLS + 1, false)] {
        let (mut text, _) = agent_doc().render();
        for i in 1..count {
            text.push_str(&format!("[[global.pool]]\nid = \"p{i}\"\n"));
        }
        let (path, result) = load_text(Agent, &dir, &text);
        if ok {
            result.unwrap();
        } else {
            let line = text.lines().count() - 1;
            assert_eq!(
                result.unwrap_err(),
                format!(
                    "{}:{line}: field global.pool[64]: 65 pools, above the cap of 64",
                    path.display()
                )
            );
        }
    }
    for (count, ok) in [(MAX_ALLOCATORS, true), (MAX_ALLOCATORS + 1, false)] {
        let list: Vec<String> = (0..count).map(|i| format!("\"a{i}:7301\"")).collect();
        let mut doc = agent_doc();
        doc.set("[global]", "allocators", &format!("[{}]", list.join(", ")));
        let (text, lines) = doc.render();
        let (path, result) = load_text(Agent, &dir, &text);
        if ok {
            result.unwrap();
        } else {
            let line = lines[&("[global]".to_string(), "allocators".to_string())];
            assert_eq!(
                result.unwrap_err(),
                format!(
                    "{}:{line}: field global.allocators[16]: 17 addresses, above the cap of 16",
                    path.display()
                )
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// The pools file is as strict as the node config.
// ---------------------------------------------------------------------------

fn load_pools(dir: &Path, pools: &str) -> String {
    let path = dir.join("pools.toml");
    std::fs::write(&path, pools).unwrap();
    let (node, _) = node_doc().set("", "pools_file", "\"pools.toml\"").render();
    let (_, result) = load_text(Node, dir, &node);
    match result {
        Ok(()) => String::new(),
        Err(error) => error.replacen(&format!("{}:", path.display()), "pools.toml:", 1),
    }
}

#[test]
fn pools_file_refuses_unknown_keys_and_fields_of_the_other_kind() {
    let dir = scratch();
    let (window, _) = window_pools().render();
    let (rate, _) = two_signal_pools().render();
    assert_eq!(load_pools(&dir, &window), "");
    assert_eq!(load_pools(&dir, &rate), "");
    let cases = [
        (
            window_pools().set("[[pool]]", "burst_seconds", "2").render().0,
            "pools.toml:7: pool api-window: burst_seconds: a field of rate pools, not of window pools",
        ),
        (
            two_signal_pools().set("[[pool]]", "window_ms", "1000").render().0,
            "pools.toml:11: pool api-rate: window_ms: a field of window pools, not of rate pools",
        ),
        (
            window_pools().set("[[pool]]", "colour", "\"blue\"").render().0,
            "pools.toml:7: pool api-window: colour: unknown field; a window pool takes id, kind, \
             capacity_millitokens_per_window, window_ms, lease_ttl_ms, regions",
        ),
        (
            two_signal_pools().set("[pool.reclaim]", "share_ttl_ms", "5").render().0,
            "pools.toml:15: pool api-rate: reclaim.share_ttl_ms: not a field of policy two_signal \
             (it takes silent_intervals)",
        ),
        (
            format!("version = 2\n{window}"),
            "pools.toml:1: unknown field `version`, expected `pool`",
        ),
    ];
    for (text, expected) in cases {
        assert_eq!(load_pools(&dir, &text), expected);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------------------
// Start-up failures name the file and the setting.
// ---------------------------------------------------------------------------

/// An agent config with real pepper and policy files, in `dir`.
fn agent_files(dir: &Path, pepper: &str, set: &[(&str, &str)]) -> PathBuf {
    std::fs::write(dir.join("pepper"), pepper).unwrap();
    let policy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/policies/dev.toml");
    std::fs::copy(policy, dir.join("policy.toml")).unwrap();
    let mut doc = agent_doc();
    // No allocator here: start-up must fail before any sync matters.
    doc.sections
        .retain(|(header, _)| !header.contains("global"));
    for (key, value) in set {
        doc.set("", key, value);
    }
    let path = dir.join("agent.toml");
    std::fs::write(&path, doc.render().0).unwrap();
    path
}

const PEPPER: &str = "a-pepper-of-at-least-16-bytes";

#[test]
fn a_taken_port_names_the_config_file_and_the_listener_setting() {
    let dir = scratch();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let quoted = format!("\"{addr}\"");
    for setting in ["listen", "http_listen"] {
        let path = agent_files(&dir, PEPPER, &[(setting, &quoted)]);
        let (success, stderr) = run_config(Agent, &path);
        assert!(!success);
        let expected = format!("agent config {}: {setting} = {addr}: ", path.display());
        assert!(stderr.contains(&expected), "{expected}\n{stderr}");
    }
    drop(taken);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_malformed_redis_url_names_the_file_line_and_setting_without_echoing_it() {
    let dir = scratch();
    let path = agent_files(
        &dir,
        PEPPER,
        &[("redis_url", "\"redis//user:hunter2@127.0.0.1:6379\"")],
    );
    let (success, stderr) = run_config(Agent, &path);
    assert!(!success);
    let expected = format!(
        "{}:7: field redis_url: not a usable Redis URL",
        path.display()
    );
    assert!(stderr.contains(&expected), "{expected}\n{stderr}");
    assert!(!stderr.contains("hunter2"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_short_or_missing_pepper_names_the_config_file_and_the_pepper_file() {
    let dir = scratch();
    let path = agent_files(&dir, "short\n", &[]);
    let (success, stderr) = run_config(Agent, &path);
    assert!(!success);
    let expected = format!(
        "agent config {}: pepper_file: {}: pepper must be at least 16 bytes (the file holds 5 bytes after trimming whitespace)",
        path.display(),
        dir.join("pepper").display()
    );
    assert!(stderr.contains(&expected), "{expected}\n{stderr}");

    let path = agent_files(&dir, PEPPER, &[("pepper_file", "\"absent\"")]);
    let (success, stderr) = run_config(Agent, &path);
    assert!(!success);
    let expected = format!(
        "agent config {}: pepper_file: {}: ",
        path.display(),
        dir.join("absent").display()
    );
    assert!(stderr.contains(&expected), "{expected}\n{stderr}");

    let path = agent_files(&dir, PEPPER, &[("policy_file", "\"absent.toml\"")]);
    let (success, stderr) = run_config(Agent, &path);
    assert!(!success);
    let expected = format!("agent config {}: policy_file: ", path.display());
    assert!(stderr.contains(&expected), "{expected}\n{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_pools_file_names_the_node_config_line_and_setting() {
    let dir = scratch();
    let mut doc = node_doc();
    doc.set("", "pools_file", "\"absent.toml\"");
    let (text, lines) = doc.render();
    let (path, result) = load_text(Node, &dir, &text);
    let line = lines[&(String::new(), "pools_file".to_string())];
    let expected = format!(
        "{}:{line}: pools_file: {}: ",
        path.display(),
        dir.join("absent.toml").display()
    );
    let error = result.unwrap_err();
    assert!(error.starts_with(&expected), "{expected}\n{error}");
    let (success, stderr) = run_config(Node, &path);
    assert!(!success);
    assert!(stderr.contains(&expected), "{expected}\n{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
