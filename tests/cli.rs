//! End-to-end checks of the `leasehold` binary as a newcomer runs it.

use std::process::Command;

fn leasehold() -> Command {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
}

#[test]
fn help_lists_every_component_command() {
    let out = leasehold().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in [
        "dev",
        "allocator",
        "agent",
        "pool",
        "region",
        "lease",
        "node",
        "sim",
        "bench",
    ] {
        assert!(text.contains(cmd), "--help lacks {cmd}: {text}");
    }
}

#[test]
fn lease_list_and_agent_status_name_each_silent_agent_and_fail_when_none_answers() {
    for command in [["lease", "list"], ["agent", "status"]] {
        // Nothing listens on port 1 or 2.
        let out = leasehold()
            .args(command)
            .args(["--agent", "127.0.0.1:1,127.0.0.1:2"])
            .env_remove("LEASEHOLD_TLS_DIR")
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stdout = String::from_utf8_lossy(&out.stdout);
        for agent in ["127.0.0.1:1", "127.0.0.1:2"] {
            assert!(
                stdout.contains(&format!("agent {agent}: no answer")),
                "{command:?}: {stdout}"
            );
        }
        assert!(String::from_utf8_lossy(&out.stderr).contains("no agent answered"));
        let out = leasehold()
            .args(command)
            .args(["--agent", "nowhere"])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("--agent"));
    }
    // The limit is bounded before anything is asked.
    for limit in ["0", "10001"] {
        let out = leasehold()
            .args(["lease", "list", "--limit", limit])
            .output()
            .unwrap();
        assert!(!out.status.success());
        assert!(String::from_utf8_lossy(&out.stderr).contains("--limit"));
    }
    // `agent` still runs an agent from --config, and asks for one alone.
    let out = leasehold().arg("agent").output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--config"));
}

#[test]
fn bench_store_prices_every_path_per_redis_cpu_second() {
    let out = leasehold()
        .args(["bench", "store", "--seconds", "1", "--concurrency", "4"])
        .args(["--baseline-requests", "2000", "--multi", "8"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("per Redis CPU-s"), "{text}");
    for row in [
        "EVALSHA token_bucket -P 1",
        "EVALSHA token_bucket -P 16",
        "EVALSHA multi_decision x8 -P 1",
        "Lua floor: MGET + SET PX only, x8",
        "HINCRBY -P 16 (ceiling)",
        "RedisStore, 4 tasks, one call each",
        "RedisStore, 4 tasks, batches of 16",
        "RedisStore, 4 tasks, coalesced, one call each",
    ] {
        let line = text
            .lines()
            .find(|l| l.contains(row))
            .unwrap_or_else(|| panic!("no row {row}: {text}"));
        // Every row made decisions, and none failed.
        assert!(!line.contains("errors"), "{line}");
        let rate: f64 = line
            .split_whitespace()
            .rev()
            .nth(2)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no decisions/s in {line}"));
        assert!(rate > 0.0, "{line}");
    }
}

#[test]
fn bench_store_cluster_and_capacity_price_one_node_and_three_primaries_in_one_run() {
    let out = leasehold()
        .args(["bench", "store", "--cluster", "--capacity"])
        .args(["--seconds", "1", "--concurrency", "4", "--keys", "300"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for row in [
        "RedisStore, one node",
        "ClusterStore, 3 primaries",
        "ratio cluster / one node",
        "What limits the scaling here",
        "token_bucket     bucket hash",
        "sliding_log      sorted set, 10 entries",
        "leasing off (1 decision / request)",
        "leasing on (B = 10: 10 requests)",
        "leasing off: primaries = ceil(1000000 /",
        "memory, 1 replica(s) per primary: 5000000 ×",
    ] {
        assert!(text.contains(row), "no {row}: {text}");
    }
    // Every call on the allow path was answered (no store error).
    assert!(!text.contains("errors)"), "{text}");
    // Three primaries, each owning part of the keys.
    let shares = text
        .lines()
        .filter(|l| l.trim_start().starts_with("127.0.0.1:"))
        .count();
    assert_eq!(shares, 3, "{text}");
}

#[test]
fn bench_envoy_prints_rls_to_check_ratios_and_every_answer_is_ok() {
    let out = leasehold()
        .args(["bench", "envoy", "--seconds", "1", "--concurrency", "2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for label in [
        "ratio TOML RLS / native Check",
        "ratio YAML RLS / native Check",
    ] {
        assert!(text.contains(label), "{text}");
    }
    // Every call on the allow path was answered OK (no store error, no refusal).
    for line in text.lines().filter(|l| l.contains("decisions/s")) {
        assert!(line.ends_with("(0 errors)"), "{line}");
    }
}

#[test]
fn bench_agent_tls_prints_the_mtls_to_plaintext_ratio_of_one_run() {
    let out = leasehold()
        .args([
            "bench",
            "agent",
            "--tls",
            "--seconds",
            "1",
            "--callers",
            "2",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("ratio mTLS / plaintext: throughput"),
        "{text}"
    );
    // Every Check over mTLS was answered as a gateway's (none refused).
    let mtls_line = text
        .lines()
        .find(|l| l.contains("+ mTLS"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(mtls_line.contains("(0 errors)"), "{text}");
}

#[test]
fn agent_with_a_bad_config_names_the_file_and_line_and_exits() {
    let dir = std::env::temp_dir().join(format!("leasehold-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("agent-bad.toml");
    std::fs::write(
        &path,
        "plaintext = true\nregion = \"eu\"\nlisten = \"127.0.0.1:0\"\nhttp_listen = \"not an address\"\npepper_file = \"p\"\npolicy_file = \"x.toml\"\n",
    )
    .unwrap();
    let out = leasehold()
        .args(["agent", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("agent-bad.toml:4:"), "{stderr}");
    // A bad policy bundle names its file, line, rule and field.
    std::fs::write(dir.join("p"), "a-pepper-of-at-least-16-bytes").unwrap();
    std::fs::write(
        &path,
        "plaintext = true\nregion = \"eu\"\nlisten = \"127.0.0.1:0\"\nhttp_listen = \"127.0.0.1:0\"\npepper_file = \"p\"\npolicy_file = \"x.toml\"\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("x.toml"),
        "version = 1\n[[domain]]\nname = \"api\"\n[[domain.rule]]\nid = \"p-read\"\nscope = \"user\"\nalgorithm = \"token_bucket\"\ncapacity = 0\nrefill = 1\nperiod_ms = 1000\nfail_mode = \"open\"\n",
    )
    .unwrap();
    let out = leasehold()
        .args(["agent", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("x.toml:8: rule p-read: field capacity"),
        "{stderr}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn region_remove_refuses_bad_input_naming_the_flag_before_connecting() {
    // Nothing listens on port 1: an answer proves the check came first.
    let nowhere = ["--allocator", "127.0.0.1:1"];
    let out = leasehold()
        .args(["region", "remove", "--pool", "rate"])
        .args(nowhere)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--region"), "{stderr}");
    for (pool, region, flag) in [("", "eu", "--pool"), ("rate", "e u", "--region")] {
        let out = leasehold()
            .args(["region", "remove", "--pool", pool, "--region", region])
            .args(nowhere)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!("{flag}: invalid id")),
            "{pool:?} {region:?}: {stderr}"
        );
    }
    // Valid ids, no allocator: the error says which call failed.
    let out = leasehold()
        .args(["region", "remove", "--pool", "rate", "--region", "eu"])
        .args(nowhere)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("region remove --pool rate --region eu"),
        "{stderr}"
    );
}

mod common_allocator;

/// Runs the CLI against `allocators` (plaintext: the test cluster's nodes
/// are `plaintext = true`): (success, stdout, stderr).
fn cli(allocators: &str, args: &[&str]) -> (bool, String, String) {
    let out = leasehold()
        .args(args)
        .args(["--allocator", allocators])
        .env_remove("LEASEHOLD_TLS_DIR")
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json_of(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_commands_change_pools_and_say_what_they_did() {
    let _one = common_allocator::serial().await;
    let (cluster, _leader) = common_allocator::cluster().await;
    let nodes = cluster.addresses().join(",");
    let at = nodes.as_str();

    // Bad input is refused before any call, naming the flag.
    for (args, flag) in [
        (
            &["pool", "create", "p", "--kind", "rate", "--limit", "ten"][..],
            "--limit",
        ),
        (
            &["pool", "create", "p", "--kind", "rate", "--limit", "0"][..],
            "--limit",
        ),
        (
            &["pool", "create", "p", "--kind", "window", "--capacity", "5"][..],
            "--window-ms",
        ),
        (
            &["pool", "create", "p", "--kind", "cube", "--limit", "5"][..],
            "--kind",
        ),
        (
            &["pool", "create", "P Q", "--kind", "rate", "--limit", "5"][..],
            "POOL",
        ),
    ] {
        let (ok, _, stderr) = cli(at, args);
        assert!(!ok && stderr.contains(flag), "{args:?}: {stderr}");
    }

    // Create, then show in each format.
    let (ok, stdout, stderr) = cli(
        at,
        &[
            "pool", "create", "api-rate", "--kind", "rate", "--limit", "10000",
        ],
    );
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with(
            "created pool api-rate: rate, L = 10,000 tokens/s, burst 20,000 tokens (2 s), floor 5%"
        ),
        "{stdout}"
    );
    let (ok, stdout, stderr) = cli(at, &["pool", "show", "api-rate", "--json"]);
    assert!(ok, "{stderr}");
    let shown = json_of(&stdout);
    assert_eq!(
        shown["data"]["config"]["limit_millitokens_per_s"],
        10_000_000
    );
    assert_eq!(
        shown["data"]["config"]["fallback_allowance_millitokens_per_s"],
        500_000
    );
    let (_, human, _) = cli(at, &["pool", "show", "api-rate"]);
    assert!(human.contains("L 10,000 tokens/s"), "{human}");
    let (_, raw, _) = cli(at, &["pool", "show", "api-rate", "--raw"]);
    assert!(raw.contains("L 10000000 mt/s"), "{raw}");

    // A second create is refused by the allocator, its field shown.
    let (ok, _, stderr) = cli(
        at,
        &[
            "pool", "create", "api-rate", "--kind", "rate", "--limit", "5",
        ],
    );
    assert!(!ok);
    assert!(
        stderr.contains("POOL_EXISTS") && stderr.contains("field pool"),
        "{stderr}"
    );

    // Update: only the flags given change, and the change is printed.
    let (ok, stdout, stderr) = cli(at, &["pool", "update", "api-rate", "--limit", "20000"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with(
            "updated pool api-rate: L 10,000 → 20,000 tokens/s, burst 20,000 → 40,000"
        ),
        "{stdout}"
    );
    let shown = json_of(&cli(at, &["pool", "show", "api-rate", "--json"]).1);
    assert_eq!(
        shown["data"]["config"]["limit_millitokens_per_s"],
        20_000_000
    );
    assert_eq!(shown["data"]["config"]["floor_basis_points"], 500);
    // A fallback at the floor (the default) followed the floor.
    assert!(stdout.contains("fallback 500 → 1,000 tokens/s"), "{stdout}");
    assert_eq!(
        shown["data"]["config"]["fallback_allowance_millitokens_per_s"],
        1_000_000
    );
    // A strict pool's fallback (0) is kept when the floor moves.
    let (ok, stdout, stderr) = cli(at, &["pool", "update", "api-rate", "--fallback", "0"]);
    assert!(
        ok && stdout.contains("fallback 1,000 → 0 tokens/s"),
        "{stdout}{stderr}"
    );
    let (ok, stdout, stderr) = cli(at, &["pool", "update", "api-rate", "--floor-bp", "1000"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with("updated pool api-rate: floor 5% → 10% (epoch"),
        "{stdout}"
    );
    // A window pool's flag on a rate pool, and a kind change, are refused.
    for (args, flag) in [
        (
            &["pool", "update", "api-rate", "--capacity", "5"][..],
            "--capacity",
        ),
        (
            &["pool", "update", "api-rate", "--kind", "window"][..],
            "--kind",
        ),
        (&["pool", "update", "api-rate"][..], "no setting given"),
    ] {
        let (ok, _, stderr) = cli(at, args);
        assert!(!ok && stderr.contains(flag), "{args:?}: {stderr}");
    }

    // Freeze and unfreeze a member.
    let client = cluster.client();
    client.register("api-rate", "eu").await.expect("register");
    let (ok, stdout, stderr) = cli(at, &["pool", "freeze", "api-rate", "--region", "eu"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with("froze region eu in pool api-rate"),
        "{stdout}"
    );
    let shown = json_of(&cli(at, &["pool", "show", "api-rate", "--json"]).1);
    assert_eq!(shown["data"]["members"][0]["admin_frozen"], true);
    let (ok, stdout, _) = cli(at, &["pool", "unfreeze", "api-rate", "--region", "eu"]);
    assert!(ok && stdout.starts_with("unfroze region eu"), "{stdout}");
    let shown = json_of(&cli(at, &["pool", "show", "api-rate", "--json"]).1);
    assert_eq!(shown["data"]["members"][0]["admin_frozen"], false);
    // A Region not in the pool: the allocator's refusal names the field.
    let (ok, _, stderr) = cli(at, &["pool", "freeze", "api-rate", "--region", "zz"]);
    assert!(!ok && stderr.contains("field region"), "{stderr}");

    // Reclaim by hand.
    let (ok, stdout, stderr) = cli(at, &["pool", "reclaim", "api-rate", "--region", "eu"]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with("reclaimed region eu in pool api-rate"),
        "{stdout}"
    );
    let shown = json_of(&cli(at, &["pool", "show", "api-rate", "--json"]).1);
    assert_eq!(shown["data"]["members"][0]["status"], "reclaimed");

    // A pool from the pools file.
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/regions/allocator-pools.toml"
    );
    let (ok, stdout, stderr) = cli(at, &["pool", "create", "api-minute", "--file", file]);
    assert!(ok, "{stderr}");
    assert!(
        stdout.starts_with("created pool api-minute: window, 1,000 tokens per 1 min window"),
        "{stdout}"
    );
    let listed = json_of(&cli(at, &["pool", "list", "--json"]).1);
    let names: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["pool"].as_str())
        .collect();
    assert_eq!(names, ["api-minute", "api-rate"]);
    let regions = json_of(&cli(at, &["region", "list", "--json"]).1);
    assert_eq!(regions["data"][0]["region"], "eu");
    let (ok, _, stderr) = cli(at, &["region", "list", "--watch", "3601"]);
    assert!(!ok && stderr.contains("--watch"), "{stderr}");

    // A node at a dead address is refused; the voters stay as they were.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let address = dead.local_addr().unwrap().to_string();
    drop(dead);
    let (ok, _, stderr) = cli(at, &["node", "add", "--id", "4", "--address", &address]);
    assert!(!ok, "{stderr}");
    assert!(
        stderr.contains("refused") && stderr.contains("node add --id 4"),
        "{stderr}"
    );
    let listed = json_of(&cli(at, &["pool", "list", "--json"]).1);
    assert_eq!(
        listed["raft"]["voters"].as_array().map(Vec::len),
        Some(3),
        "{listed}"
    );
    let (ok, _, stderr) = cli(at, &["node", "add", "--id", "4", "--address", "nohost"]);
    assert!(!ok && stderr.contains("--address"), "{stderr}");
}
