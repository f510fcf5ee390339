//! Tests of `scenario.rs`, kept beside it so the code reads on its own.

use super::*;

const GOOD: &str = r#"
name = "demand-shift"
duration_ms = 30000

[[region]]
name = "eu"
gateways = 2

[[region]]
name = "us"

[[pool]]
kind = "rate"
id = "api"
limit_per_s = 1000
reclaim = { policy = "lease", share_ttl_ms = 3000 }

[[pool]]
kind = "window"
id = "quota"
capacity_per_window = 500
window_ms = 10000
lease_ttl_ms = 2000

[[demand]]
region = "eu"
pool = "api"
steps = [[0, 100], [10, 400]]
ramps = [[20, 25, 400, 100]]

[[fault]]
at_ms = 5000
kind = "partition_region"
region = "us"

[[fault]]
at_ms = 6000
kind = "crash_leader"
"#;

#[test]
fn a_scenario_reads_with_defaults() {
    let s = Scenario::parse("s.toml", GOOD).unwrap();
    assert_eq!(s.sample_ms, 100);
    assert_eq!(s.allocator_nodes, 3);
    assert_eq!(s.regions[1].gateways, 1);
    let PoolSpec::Rate(rate) = &s.pools[0] else {
        panic!()
    };
    assert_eq!(rate.burst_tokens(), 2_000);
    assert_eq!(rate.fallback_allowance_per_s(), 50);
    assert_eq!(
        s.faults[0].kind,
        FaultKind::PartitionRegion {
            region: "us".into()
        }
    );
    assert_eq!(s.faults[1].kind, FaultKind::CrashLeader);
}

#[test]
fn demand_follows_steps_and_ramps() {
    let s = Scenario::parse("s.toml", GOOD).unwrap();
    let d = &s.demands[0];
    assert_eq!(d.rate_at(0), 100);
    assert_eq!(d.rate_at(9_999), 100);
    assert_eq!(d.rate_at(10_000), 400);
    assert_eq!(d.rate_at(22_500), 250);
    assert_eq!(d.rate_at(26_000), 100);
}

#[test]
fn errors_name_file_line_or_field() {
    let e = Scenario::parse(
        "s.toml",
        &GOOD.replace("duration_ms = 30000", "duration_ms = \"x\""),
    )
    .unwrap_err()
    .to_string();
    assert!(e.starts_with("s.toml:3:"), "{e}");
    let e = Scenario::parse("s.toml", &format!("bogus = 1\n{GOOD}"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("bogus"), "{e}");
    let e = Scenario::parse(
        "s.toml",
        &GOOD.replace("region = \"us\"\n", "region = \"mars\"\n"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("fault[0].region"), "{e}");
    let e = Scenario::parse(
        "s.toml",
        &GOOD.replace("limit_per_s = 1000", "limit_per_s = 0"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("pool[0].limit_per_s"), "{e}");
}

#[test]
fn host_set_partitions_agent_restarts_and_store_loss_read_and_validate() {
    let text = format!(
            "{GOOD}\n[[fault]]\nat_ms = 7000\nkind = \"partition\"\na = [\"n1\"]\nb = [\"n2\", \"n3\"]\n\
             \n[[fault]]\nat_ms = 7000\nkind = \"partition_oneway\"\nfrom = [\"n1\"]\nto = [\"agent-eu\"]\n\
             \n[[fault]]\nat_ms = 8000\nkind = \"restart_agent\"\nregion = \"us\"\n\
             \n[[fault]]\nat_ms = 9000\nkind = \"store_loss\"\nregion = \"eu\"\n"
        );
    let s = Scenario::parse("s.toml", &text).unwrap();
    assert_eq!(
        s.faults[2].kind,
        FaultKind::Partition {
            a: vec!["n1".into()],
            b: vec!["n2".into(), "n3".into()]
        }
    );
    assert_eq!(
        s.faults[4].kind,
        FaultKind::RestartAgent {
            region: "us".into(),
            agent: 1,
            keep_store: true
        }
    );
    // An unknown host, and a mutation without an expected bound, are refused.
    let e = Scenario::parse("s.toml", &text.replace("\"n3\"", "\"n9\""))
        .unwrap_err()
        .to_string();
    assert!(e.contains("fault[2]"), "{e}");
    let e = Scenario::parse(
        "s.toml",
        &format!("mutation = \"no_window_clamp\"\nexpect_violation = true\n{GOOD}"),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("expect_bound"), "{e}");
}

#[test]
fn several_agents_per_region_name_their_hosts_and_faults() {
    let two = GOOD.replace(
        "name = \"eu\"\ngateways = 2",
        "name = \"eu\"\ngateways = 2\nagents = 2",
    );
    let text = format!(
        "{two}\n[[fault]]\nat_ms = 7000\nkind = \"crash_syncer\"\nregion = \"eu\"\n\
             \n[[fault]]\nat_ms = 8000\nkind = \"crash_agent\"\nregion = \"eu\"\nagent = 2\n\
             \n[[fault]]\nat_ms = 9000\nkind = \"restart_crashed_agents\"\nregion = \"eu\"\n\
             \n[[fault]]\nat_ms = 9000\nkind = \"partition\"\na = [\"agent-eu-2\"]\nb = [\"n1\"]\n"
    );
    let s = Scenario::parse("s.toml", &text).unwrap();
    assert_eq!(s.regions[0].agents, 2);
    assert_eq!(s.regions[1].agents, 1);
    assert_eq!(s.regions[0].agent_hosts(), ["agent-eu", "agent-eu-2"]);
    assert_eq!(s.regions[0].agent_of_gateway(1), 1);
    assert_eq!(s.regions[0].agent_of_gateway(2), 0);
    assert!(s.is_host("agent-eu-2") && !s.is_host("agent-us-2"));
    assert_eq!(
        s.faults[3].kind,
        FaultKind::CrashAgent {
            region: "eu".into(),
            agent: 2
        }
    );
    let refused = |text: &str| Scenario::parse("s.toml", text).unwrap_err().to_string();
    let e = refused(&two.replace("agents = 2", "agents = 5"));
    assert!(e.contains("region[0].agents"), "{e}");
    let e = refused(&text.replace("agent = 2", "agent = 3"));
    assert!(e.contains("fault[3].agent"), "{e}");
    // A Region of one agent has no syncer; one of several shares its
    // store, so a restart cannot lose it.
    let e = refused(&format!(
        "{GOOD}\n[[fault]]\nat_ms = 7000\nkind = \"crash_syncer\"\nregion = \"us\"\n"
    ));
    assert!(e.contains("fault[2].region"), "{e}");
    let e = refused(&format!(
            "{two}\n[[fault]]\nat_ms = 7000\nkind = \"restart_agent\"\nregion = \"eu\"\nkeep_store = false\n"
        ));
    assert!(e.contains("fault[2].keep_store"), "{e}");
    // Two Regions whose hosts would have one name.
    let e = refused(&two.replace("name = \"us\"", "name = \"eu-2\""));
    assert!(
        e.contains("region[1].name") && e.contains("agent-eu-2"),
        "{e}"
    );
}
