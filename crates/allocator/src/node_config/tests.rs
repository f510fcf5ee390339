//! Tests of `node_config.rs`, kept beside it so the code reads on its own.

use super::pools_file::*;
use super::*;

const GOOD: &str = r#"plaintext = true
node_id = 2
listen = "127.0.0.1:7302"
data_dir = "data/2"

[peers]
1 = "127.0.0.1:7301"
2 = "127.0.0.1:7302"
3 = "127.0.0.1:7303"

[prober]
failures_to_unhealthy = 2
[[prober.region]]
region = "eu"
health = "http://127.0.0.1:7191/health"
[[prober.region]]
region = "us"
health = "127.0.0.1:7192"
"#;

const POOLS: &str = r#"
[[pool]]
id = "api-window"
kind = "window"
capacity_millitokens_per_window = 1000000
window_ms = 60000
lease_ttl_ms = 10000

[[pool]]
id = "api-rate"
kind = "rate"
limit_millitokens_per_s = 10000000
burst_millitokens = 20000000
burst_seconds = 2
floor_basis_points = 500
interval_ms = 5000
max_raise_basis_points = 1000
reclaim = { policy = "two_signal", silent_intervals = 3 }
fallback_allowance_millitokens_per_s = 500000
"#;

fn node_error(text: &str) -> String {
    NodeConfig::parse("n2.toml", text, Path::new("."))
        .unwrap_err()
        .to_string()
}

fn pools_error(text: &str) -> String {
    parse_pools("pools.toml", text).unwrap_err().to_string()
}

#[test]
fn metrics_listen_is_optional_and_http_limits_need_it() {
    let config = NodeConfig::parse("n2.toml", GOOD, Path::new(".")).unwrap();
    assert_eq!(config.metrics, None);
    let text = format!(
        "metrics_listen = \"127.0.0.1:7392\"\n{GOOD}\n[http_limits]\nidle_timeout_ms = 9\n"
    );
    let config = NodeConfig::parse("n2.toml", &text, Path::new(".")).unwrap();
    let metrics = config.metrics.expect("metrics_listen set");
    assert_eq!(metrics.listen, "127.0.0.1:7392".parse().unwrap());
    assert_eq!(metrics.limits.idle_timeout_ms, 9);
    assert_eq!(metrics.limits.max_header_bytes, 16_384);
    let alone = format!("{GOOD}\n[http_limits]\nidle_timeout_ms = 9\n");
    assert!(node_error(&alone).contains("http_limits: set without metrics_listen"));
    let bad = format!("metrics_listen = \"nowhere\"\n{GOOD}");
    let error = node_error(&bad);
    assert!(error.contains("n2.toml:1: metrics_listen"), "{error}");
}

#[test]
fn limits_table_is_read_and_defaults_keep_the_peer_message_size() {
    let config = NodeConfig::parse("n2.toml", GOOD, Path::new(".")).unwrap();
    assert_eq!(config.limits, GrpcLimits::default());
    assert_eq!(
        config.limits.message_bytes(NODE_MAX_MESSAGE_BYTES),
        64 << 20
    );
    let text = format!("{GOOD}\n[limits]\nrequest_timeout_ms = 5\nmax_message_bytes = 8192\n");
    let config = NodeConfig::parse("n2.toml", &text, Path::new(".")).unwrap();
    assert_eq!(config.limits.request_timeout_ms, 5);
    assert_eq!(config.limits.message_bytes(NODE_MAX_MESSAGE_BYTES), 8_192);
    assert_eq!(config.limits.keepalive_interval_ms, 30_000);
    let unknown = format!("{GOOD}\n[limits]\nbogus = 1\n");
    assert!(node_error(&unknown).contains("bogus"));
}

#[test]
fn good_config_resolves_paths_and_defaults() {
    let config = NodeConfig::parse("n2.toml", GOOD, Path::new("/etc/lh")).unwrap();
    assert_eq!(config.node_id, 2);
    assert_eq!(config.data_dir, PathBuf::from("/etc/lh/data/2"));
    assert_eq!(config.advertised_address(), "127.0.0.1:7302");
    assert_eq!(config.raft, RaftSettings::default());
    assert_eq!(config.prober.failures_to_unhealthy, 2);
    assert_eq!(config.prober.interval_ms, 1_000);
    assert_eq!(config.prober.targets[1].path, "/health");
    assert_eq!(config.prober.targets[0].host_port, "127.0.0.1:7191");
    assert_eq!(config.tick_interval_ms, 1_000);
    assert_eq!(
        config.peer_list(),
        ["1=127.0.0.1:7301", "2=127.0.0.1:7302", "3=127.0.0.1:7303"]
    );
}

#[test]
fn errors_name_the_file_and_line() {
    let bad_listen = GOOD.replace("\"127.0.0.1:7302\"\ndata", "\"nope\"\ndata");
    let error = node_error(&bad_listen);
    assert!(
        error.starts_with("n2.toml:3: listen: nope is not"),
        "{error}"
    );

    let stranger = GOOD.replace("node_id = 2", "node_id = 7");
    assert_eq!(
        node_error(&stranger),
        "n2.toml:2: node_id: 7 is not in [peers]"
    );

    let bad_peer = GOOD.replace("3 = \"127.0.0.1:7303\"", "3 = \"no-port\"");
    let error = node_error(&bad_peer);
    assert!(error.starts_with("n2.toml:9: peers.3:"), "{error}");

    let unknown = GOOD.replace("data_dir", "data_dirr");
    assert!(node_error(&unknown).starts_with("n2.toml:4:"));

    let bad_raft = format!("{GOOD}\n[raft]\nheartbeat_ms = 700\n");
    let error = node_error(&bad_raft);
    assert!(
        error.starts_with("n2.toml:20: raft.election_min_ms: 600 must be above"),
        "{error}"
    );

    let syntax = GOOD.replace("node_id = 2", "node_id = = 2");
    assert!(node_error(&syntax).starts_with("n2.toml:2:"));
}

#[test]
fn numbers_past_their_range_are_refused_with_line_and_range() {
    let huge = format!("tick_interval_ms = {}\n{GOOD}", i64::MAX);
    assert_eq!(
        node_error(&huge),
        format!(
            "n2.toml:1: tick_interval_ms: {} is outside [10, 60000] (or 0: off)",
            i64::MAX
        )
    );
    let off = format!("tick_interval_ms = 0\n{GOOD}");
    let config = NodeConfig::parse("n2.toml", &off, Path::new(".")).unwrap();
    assert_eq!(config.tick_interval_ms, 0);

    let negative = format!("{GOOD}\n[raft]\nelection_max_ms = -1\n");
    assert_eq!(
        node_error(&negative),
        "n2.toml:21: raft.election_max_ms: -1 is outside [3, 120000]"
    );
    let zero_id = GOOD.replace("node_id = 2", "node_id = 0");
    assert_eq!(
        node_error(&zero_id),
        "n2.toml:2: node_id: 0 is outside [1, 4294967295]"
    );
    let timeout = GOOD.replace(
        "failures_to_unhealthy = 2",
        "failures_to_unhealthy = 2\ntimeout_ms = 60001",
    );
    assert_eq!(
        node_error(&timeout),
        "n2.toml:13: prober.timeout_ms: 60001 is outside [1, 60000]"
    );
}

#[test]
fn dotted_keys_are_located_like_tables() {
    let dotted = format!("raft.heartbeat_ms = 0\n{GOOD}");
    assert_eq!(
        node_error(&dotted),
        "n2.toml:1: raft.heartbeat_ms: 0 is outside [1, 10000]"
    );
    let ok = format!("raft.heartbeat_ms = 50\n{GOOD}");
    let config = NodeConfig::parse("n2.toml", &ok, Path::new(".")).unwrap();
    assert_eq!(config.raft.heartbeat_ms, 50);
}

#[test]
fn too_many_peers_and_oversized_addresses_are_refused() {
    let mut text = GOOD.to_string();
    for id in 4..=10 {
        text = text.replace(
            "3 = \"127.0.0.1:7303\"",
            &format!("3 = \"127.0.0.1:7303\"\n{id} = \"127.0.0.1:{}\"", 7300 + id),
        );
    }
    assert!(node_error(&text).starts_with("n2.toml:6: peers: 10 peers, above the cap of 9"));
    let long = GOOD.replace("127.0.0.1:7303", &format!("{}:1", "h".repeat(300)));
    let error = node_error(&long);
    assert!(error.contains("above the cap of 260"), "{error}");
    assert!(error.len() < 200, "the value is quoted short: {error}");
    let big_key = GOOD.replace("3 = ", "4294967296 = ");
    assert!(node_error(&big_key).contains("is not a node id"));
}

#[test]
fn pools_file_is_validated_per_pool() {
    let pools = parse_pools("pools.toml", POOLS).unwrap();
    assert_eq!(pools.len(), 2);
    assert!(matches!(pools[1].config, PoolConfig::Rate(_)));

    let simulated = POOLS.replace(
        "{ policy = \"two_signal\", silent_intervals = 3 }",
        "{ policy = \"silence_only\", silent_intervals = 3 }",
    );
    assert_ne!(simulated, POOLS);
    let error = pools_error(&simulated);
    assert!(
        error.starts_with("pools.toml:18: pool api-rate: reclaim: silence_only is simulation only"),
        "{error}"
    );

    let bad = POOLS.replace("window_ms = 60000", "window_ms = 0");
    assert_eq!(
        pools_error(&bad),
        "pools.toml:6: pool api-window: window_ms: 0 is outside [1000, 31622400000]"
    );
    let short_burst = POOLS.replace("burst_millitokens = 20000000", "burst_millitokens = 5");
    let error = pools_error(&short_burst);
    assert!(
        error.starts_with("pools.toml:13: pool api-rate: burst_millitokens: 5 is below"),
        "{error}"
    );
    let twice = POOLS.replace("\"api-rate\"", "\"api-window\"");
    assert_eq!(
        pools_error(&twice),
        "pools.toml:10: pool api-window: listed twice"
    );
}

#[test]
fn pools_file_refuses_unknown_fields_and_the_other_kinds_fields() {
    let other_kind = POOLS.replace(
        "lease_ttl_ms = 10000",
        "lease_ttl_ms = 10000\nburst_seconds = 2",
    );
    assert_eq!(
        pools_error(&other_kind),
        "pools.toml:8: pool api-window: burst_seconds: a field of rate pools, not of window pools"
    );
    let window_in_rate = POOLS.replace("burst_seconds = 2", "burst_seconds = 2\nwindow_ms = 1000");
    assert!(pools_error(&window_in_rate)
        .starts_with("pools.toml:15: pool api-rate: window_ms: a field of window pools"));
    let unknown = POOLS.replace("lease_ttl_ms = 10000", "lease_ttl_ms = 10000\nbogus = 1");
    let error = pools_error(&unknown);
    assert!(
            error.starts_with("pools.toml:8: pool api-window: bogus: unknown field; a window pool takes id, kind, capacity_millitokens_per_window"),
            "{error}"
        );
    let top = format!("bogus = 1\n{POOLS}");
    assert!(pools_error(&top).starts_with("pools.toml:1:"));
    let reclaim = POOLS.replace(
        "silent_intervals = 3 }",
        "silent_intervals = 3, share_ttl_ms = 9 }",
    );
    let error = pools_error(&reclaim);
    assert!(
        error.starts_with(
            "pools.toml:18: pool api-rate: reclaim.share_ttl_ms: not a field of policy two_signal"
        ),
        "{error}"
    );
    let policy = POOLS.replace("\"two_signal\"", "\"sometimes\"");
    assert!(pools_error(&policy).contains("reclaim.policy: sometimes is not freeze"));
    let kind = POOLS.replace("kind = \"window\"", "kind = \"hourly\"");
    assert!(pools_error(&kind).starts_with("pools.toml:4: pool api-window: kind: hourly"));
    let no_kind = POOLS.replace("kind = \"window\"\n", "");
    assert!(pools_error(&no_kind).starts_with("pools.toml:2: pool api-window: kind: missing"));
}

#[test]
fn pools_file_holds_at_most_the_machines_pool_cap() {
    let pool = |i: usize| {
        format!(
                "[[pool]]\nid = \"p{i}\"\nkind = \"window\"\ncapacity_millitokens_per_window = 1\nwindow_ms = 1000\nlease_ttl_ms = 1\n"
            )
    };
    let at_cap: String = (0..MAX_POOLS_IN_FILE).map(pool).collect();
    assert_eq!(parse_pools("pools.toml", &at_cap).unwrap().len(), 1_024);
    let past: String = (0..=MAX_POOLS_IN_FILE).map(pool).collect();
    assert_eq!(
        pools_error(&past),
        format!(
            "pools.toml:{}: pool: 1025 pools, above the cap of 1024",
            1_024 * 6 + 1
        )
    );
}

#[test]
fn pool_field_lists_match_the_config_structs() {
    fn keys(config: &PoolConfig) -> Vec<String> {
        // Optional fields are left out while unset or default: set them.
        let mut config = config.clone();
        match &mut config {
            PoolConfig::Window(window) => window.regions = Some(vec!["eu".into()]),
            PoolConfig::Rate(rate) => {
                rate.regions = Some(vec!["eu".into()]);
                rate.max_demand_multiple = 3;
            }
        }
        let value = serde_json::to_value(&config).unwrap();
        let mut keys: Vec<String> = value
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| *k != "kind")
            .cloned()
            .collect();
        keys.sort();
        keys
    }
    let sorted = |fields: &[&str]| {
        let mut fields: Vec<String> = fields.iter().map(|f| f.to_string()).collect();
        fields.sort();
        fields
    };
    let pools = parse_pools("pools.toml", POOLS).unwrap();
    assert_eq!(keys(&pools[0].config), sorted(WINDOW_FIELDS));
    assert_eq!(keys(&pools[1].config), sorted(RATE_FIELDS));
    for policy in [
        crate::ReclaimPolicy::Freeze,
        crate::ReclaimPolicy::two_signal_default(),
        crate::ReclaimPolicy::lease_default(1_000, 0),
        crate::ReclaimPolicy::SilenceOnly {
            silent_intervals: 1,
        },
    ] {
        let value = serde_json::to_value(&policy).unwrap();
        let object = value.as_object().unwrap();
        let name = object["policy"].as_str().unwrap();
        let (_, fields) = RECLAIM_FIELDS.iter().find(|(n, _)| *n == name).unwrap();
        let mut found: Vec<String> = object.keys().filter(|k| *k != "policy").cloned().collect();
        found.sort();
        assert_eq!(found, sorted(fields), "{name}");
    }
}

#[test]
fn odd_values_anywhere_are_refused_without_panicking() {
    let odd = [
        "-1",
        "0",
        "9223372036854775807",
        "-9223372036854775808",
        "1.5",
        "nan",
        "\"\"",
        "\"x\"",
        "[]",
        "[1, \"a\"]",
        "{}",
        "{ a = { b = 1 } }",
        "1979-05-27T07:32:00Z",
        "true",
        "\"\u{00e9}\u{1F600}\"",
    ];
    for source in [GOOD, POOLS] {
        let lines: Vec<&str> = source.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let Some((key, _)) = line.split_once(" = ") else {
                continue;
            };
            for value in odd {
                let mut changed = lines.clone();
                let replaced = format!("{key} = {value}");
                changed[i] = &replaced;
                let text = changed.join("\n");
                let _ = NodeConfig::parse("n.toml", &text, Path::new("."));
                let _ = parse_pools("p.toml", &text);
            }
        }
    }
    for text in [
        "",
        "[",
        "= 1",
        "[[pool]]\n[[pool]]\nid = 1",
        "pool = 3",
        "pool = [1]",
    ] {
        let _ = parse_pools("p.toml", text);
        let _ = NodeConfig::parse("n.toml", text, Path::new("."));
    }
}

#[test]
fn deploy_configs_load() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/regions");
    for id in 1..=3u64 {
        let config = NodeConfig::load(&deploy.join(format!("allocator-{id}.toml"))).unwrap();
        assert_eq!(config.node_id, id);
        assert_eq!(config.peers.len(), 3);
        // api-minute, api-rate, and edge-rate (the ratelimit sample's).
        assert_eq!(config.pools.len(), 3);
        assert_eq!(config.prober.targets.len(), 3);
        assert!(config.prober.targets.iter().all(|t| t.https));
        assert!(config.tls.is_some());
    }
}

#[test]
fn a_plaintext_probe_beside_tls_needs_insecure_prober_http() {
    let tls = "[tls]\ntrust_domain = \"t\"\nca_file = \"c\"\ncert_file = \"n\"\nkey_file = \"k\"\n";
    let secure = format!("{}\n{tls}", GOOD.replace("plaintext = true\n", ""));
    let error = NodeConfig::parse("n2.toml", &secure, Path::new(".")).unwrap_err();
    let text = error.to_string();
    assert!(
        text.starts_with("n2.toml:14: prober.region.health: http:// with [tls]"),
        "{text}"
    );
    assert!(text.contains("insecure_prober_http = true"), "{text}");
    let chosen = format!("insecure_prober_http = true\n{secure}");
    let config = NodeConfig::parse("n2.toml", &chosen, Path::new(".")).unwrap();
    assert!(config.tls.is_some() && !config.prober.targets[0].https);
    let stray = format!("insecure_prober_http = true\n{GOOD}");
    let text = NodeConfig::parse("n2.toml", &stray, Path::new("."))
        .unwrap_err()
        .to_string();
    assert!(
        text.starts_with("n2.toml:1: insecure_prober_http: true without [tls]"),
        "{text}"
    );
}

#[test]
fn oversized_files_are_refused_unread() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.toml");
    let comment = format!("# {}\n", "x".repeat(1 << 20));
    std::fs::write(&path, comment.repeat(5)).unwrap();
    let error = NodeConfig::load(&path).unwrap_err().to_string();
    assert!(
        error.ends_with("big.toml: above the cap of 4194304 bytes"),
        "{error}"
    );
}
