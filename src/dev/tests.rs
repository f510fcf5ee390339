//! Tests of `dev.rs`, kept beside it so the code reads on its own.

use super::*;

fn args(extra: &[&str]) -> DevArgs {
    #[derive(clap::Parser)]
    struct Wrapper {
        #[command(flatten)]
        dev: DevArgs,
    }
    let mut argv = vec!["dev"];
    argv.extend_from_slice(extra);
    <Wrapper as clap::Parser>::try_parse_from(argv).unwrap().dev
}

#[test]
fn grouped_inserts_thousands_separators() {
    assert_eq!(grouped(0), "0");
    assert_eq!(grouped(999), "999");
    assert_eq!(grouped(1_000), "1,000");
    assert_eq!(grouped(10_000_000), "10,000,000");
}

#[test]
fn port_offset_shifts_every_port() {
    let layout = Layout::new(&args(&["--port-offset", "1000"]));
    let ports: Vec<u16> = layout.every_address().map(|a| a.port()).collect();
    assert_eq!(
        ports,
        [8301, 8302, 8303, 8101, 8191, 8102, 8192, 8103, 8193]
    );
}

#[test]
fn redis_flag_names_a_known_region_once() {
    assert!(parse_redis("eu=redis://127.0.0.1:6381/").is_ok());
    assert!(parse_redis("mars=redis://127.0.0.1:6381/")
        .unwrap_err()
        .contains("unknown Region"));
    assert!(parse_redis("eu").unwrap_err().contains("REGION=URL"));
    assert!(parse_redis("eu=http://x")
        .unwrap_err()
        .contains("not a Redis URL"));
    let twice = args(&["--redis", "eu=redis://a:1/", "--redis", "eu=redis://b:2/"]);
    assert!(twice.validate().unwrap_err().contains("twice"));
    let layout = Layout::new(&args(&["--redis", "us=redis://a:1/"]));
    assert_eq!(layout.agents[1].redis_url.as_deref(), Some("redis://a:1/"));
    assert_eq!(layout.agents[0].redis_url, None);
}

#[test]
fn generated_configs_parse_with_the_embedded_pools() {
    let (pools, limit) = embedded_pools().unwrap();
    assert_eq!(limit, 10_000_000);
    let layout = Layout::new(&args(&["--port-offset", "5"]));
    let dir = Path::new("/nonexistent");
    let node = node_config(&layout, 2, dir, &pools).unwrap();
    assert_eq!(node.listen.port(), 7307);
    assert_eq!(node.peers.len(), 3);
    assert_eq!(node.prober.targets.len(), 3);
    assert_eq!(node.data_dir, dir.join("allocator-2"));
    assert_eq!(node.pools.len(), pools.len());
    let agent = agent_config(&layout, &layout.agents[2], dir).unwrap();
    assert_eq!(agent.region, "ap");
    assert_eq!(agent.http_listen.port(), 7198);
    let global = agent.global.unwrap();
    let want = [
        "node/1@127.0.0.1:7306",
        "node/2@127.0.0.1:7307",
        "node/3@127.0.0.1:7308",
    ];
    assert_eq!(global.allocators, want);
    // api-rate, edge-rate (the ratelimit sample's pool), api-minute.
    assert_eq!(global.pools.len(), 3);
    let ratelimit = agent.ratelimit.expect("the ratelimit sample is served");
    assert_eq!(ratelimit.config_dir, dir.join("ratelimit"));
    assert!(pools.iter().any(|p| p.pool == "edge-rate"));
}

#[test]
fn demo_load_divides_tokens_by_cost() {
    let load = DemoLoad {
        scale: 0.5,
        cost_tokens: 10,
    };
    assert_eq!(load.checks_per_s(7_200), 360.0);
    assert!(load.describe().contains("eu 3,600 tokens/s (360 Checks/s)"));
}
