//! Revocation and Region admission (issue 27, finding 3; docs/security.md
//! "Revocation and Region admission"): real allocator nodes on sled behind
//! mTLS, certificates from `leasehold_tls::certs::init`, the `leasehold`
//! binary for the operator's commands.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use leasehold_allocator::client::{AllocatorClient, ClientError, ClientSettings};
use leasehold_allocator::node_config::NodeConfig;
use leasehold_allocator::running::{start, InitMode, RunningNode};
use leasehold_allocator::transport::TlsNodeConnector;
use leasehold_allocator::{PoolConfig, RatePoolConfig};
use leasehold_proto::allocator::v1 as pb;
use leasehold_tls::TlsSettings;
use tonic::Code;

const TRUST_DOMAIN: &str = "leasehold.local";
/// L = 10,000 tokens per second.
const L: u64 = 10_000_000;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn certs_dir(dir: &Path) -> PathBuf {
    dir.join("certs")
}

fn client_of(certs: &Path, stem: &str, addresses: &[String]) -> AllocatorClient {
    let settings = ClientSettings {
        call_timeout: Duration::from_secs(10),
        leader_wait: Duration::from_secs(60),
        max_attempts: 200,
        retry_pause: Duration::from_millis(100),
        hedge_after: None,
    };
    let tls = TlsSettings::in_dir(certs, stem, TRUST_DOMAIN);
    AllocatorClient::with_connector(
        addresses,
        settings,
        Arc::new(TlsNodeConnector::new(&tls).expect("client certificate loads")),
    )
    .expect("client")
}

/// Node `id` of a cluster of `ports` in `dir` (sled in `data-<id>`), with
/// a snapshot every `snapshot_every` entries and no log kept behind it.
fn node_config(dir: &Path, id: usize, ports: &[u16], snapshot_every: u64) -> NodeConfig {
    let peers: String = ports
        .iter()
        .enumerate()
        .map(|(i, port)| format!("{} = \"127.0.0.1:{port}\"\n", i + 1))
        .collect();
    let port = ports[id - 1];
    let text = format!(
        "node_id = {id}\nlisten = \"127.0.0.1:{port}\"\ndata_dir = \"data-{id}\"\n\
         tick_interval_ms = 0\n[raft]\nsnapshot_every_entries = {snapshot_every}\n\
         logs_kept_after_snapshot = 0\n[peers]\n{peers}\
         [tls]\ntrust_domain = \"{TRUST_DOMAIN}\"\nca_file = \"certs/ca.pem\"\n\
         cert_file = \"certs/node-{id}.pem\"\nkey_file = \"certs/node-{id}.key\"\n"
    );
    NodeConfig::parse("allocator.toml", &text, dir).expect("config")
}

struct Cluster {
    dir: tempfile::TempDir,
    ports: Vec<u16>,
    nodes: Vec<RunningNode>,
}

impl Cluster {
    async fn start(count: usize, snapshot_every: u64) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        leasehold_tls::certs::init(
            &certs_dir(dir.path()),
            TRUST_DOMAIN,
            &["eu".into(), "us".into(), "ap".into()],
            count as u64,
        )
        .expect("certs init");
        let ports: Vec<u16> = (0..count).map(|_| free_port()).collect();
        let mut cluster = Cluster {
            dir,
            ports,
            nodes: Vec::new(),
        };
        cluster.start_nodes(snapshot_every, true).await;
        cluster
    }

    async fn start_nodes(&mut self, snapshot_every: u64, first_time: bool) {
        for id in 1..=self.ports.len() {
            let config = node_config(self.dir.path(), id, &self.ports, snapshot_every);
            let init = if id == 1 && first_time {
                InitMode::Explicit
            } else {
                InitMode::Auto
            };
            // A stopped node's sled files are released once its last task
            // drops them: retry the lock, bounded.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
            let node = loop {
                match start(config.clone(), init).await {
                    Ok(node) => break node,
                    Err(error) if error.to_string().contains("could not acquire lock") => {
                        assert!(tokio::time::Instant::now() < deadline, "{error}");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(error) => panic!("node starts: {error}"),
                }
            };
            self.nodes.push(node);
        }
    }

    async fn stop(&mut self) {
        for node in self.nodes.drain(..) {
            node.stop().await;
        }
    }

    fn addresses(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|port| format!("127.0.0.1:{port}"))
            .collect()
    }

    fn client(&self, stem: &str) -> AllocatorClient {
        client_of(&certs_dir(self.dir.path()), stem, &self.addresses())
    }

    fn certs(&self) -> String {
        certs_dir(self.dir.path()).to_str().unwrap().to_string()
    }

    /// The leader's last log index, read by the admin.
    async fn last_log_index(&self) -> u64 {
        let reply = self
            .client("admin")
            .inspect(pb::InspectRequest::default())
            .await
            .expect("admin inspects");
        reply.raft.expect("raft status").last_log_index
    }

    /// Waits (bounded) until every node's applied deny list is `expected`.
    async fn deny_lists_are(&self, expected: &[&str]) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let lists: Vec<Vec<String>> = self
                .nodes
                .iter()
                .map(|node| {
                    node.node
                        .state_machine()
                        .read(|state| state.machine.revoked().entries().keys().cloned().collect())
                })
                .collect();
            if lists.iter().all(|list| list == expected) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "deny lists {lists:?}, expected {expected:?} on every node"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn leasehold(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .output()
        .expect("run leasehold")
}

fn succeeded(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// PERMISSION_DENIED naming `identity` as revoked.
fn revoked(result: Result<impl std::fmt::Debug, ClientError>, identity: &str) {
    let error = result.expect_err("a revoked identity's call was allowed");
    assert_eq!(error.code(), Some(Code::PermissionDenied), "{error}");
    let text = error.to_string();
    assert!(text.contains(&format!("{identity} is revoked")), "{text}");
}

fn rebalance(
    region: &str,
    incarnation: u64,
    demand: u64,
    applied: u64,
    version: u64,
) -> pb::RebalanceRequest {
    pb::RebalanceRequest {
        pool: "api".into(),
        region: region.into(),
        incarnation,
        demand_requests: demand,
        applied_share_millitokens_per_s: applied,
        applied_share_version: version,
    }
}

async fn create_api(cluster: &Cluster, config: RatePoolConfig) {
    cluster
        .client("admin")
        .create_pool("api", &PoolConfig::Rate(config))
        .await
        .expect("admin creates the pool");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_region_is_refused_on_its_open_connection_until_restored() {
    let mut cluster = Cluster::start(1, 20_000).await;
    create_api(&cluster, RatePoolConfig::with_defaults(L)).await;
    // Pinned: under mTLS the CLI accepts only node 1 there.
    let address = format!("node/1@{}", cluster.addresses()[0]);
    let certs = cluster.certs();
    // One client, one connection: opened before the revocation.
    let eu = cluster.client("region-eu");
    let registered = eu.register("api", "eu").await.expect("eu registers");
    eu.rebalance(rebalance("eu", registered.incarnation, 5, 0, 0))
        .await
        .expect("eu rebalances");

    // The operator's command; sre may not revoke.
    let as_sre = leasehold(&[
        "identity",
        "revoke",
        "region/eu",
        "--allocator",
        &address,
        "--tls-dir",
        &certs,
        "--identity",
        "sre",
    ]);
    assert!(!as_sre.status.success());
    let stderr = String::from_utf8_lossy(&as_sre.stderr);
    assert!(
        stderr.contains("PermissionDenied") && stderr.contains("RevokeIdentity"),
        "{stderr}"
    );
    let bad = leasehold(&["identity", "revoke", "region/EU", "--allocator", &address]);
    assert!(!bad.status.success());
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("write it like region/us"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
    let out = succeeded(&leasehold(&[
        "identity",
        "revoke",
        "region/eu",
        "--reason",
        "key leaked",
        "--allocator",
        &address,
        "--tls-dir",
        &certs,
        "--json",
    ]));
    assert!(out.contains("\"changed\":true"), "{out}");

    let before = cluster.last_log_index().await;
    revoked(eu.register("api", "eu").await, "region/eu");
    revoked(
        eu.rebalance(rebalance("eu", registered.incarnation, 5, 0, 0))
            .await,
        "region/eu",
    );
    revoked(
        eu.grant("api", "eu", registered.incarnation, "l-1", 1_000)
            .await,
        "region/eu",
    );
    revoked(
        eu.inspect(pb::InspectRequest {
            pool: "api".into(),
            include_grants: false,
            allow_stale: true,
        })
        .await,
        "region/eu",
    );
    assert_eq!(
        cluster.last_log_index().await,
        before,
        "a refusal was proposed"
    );
    // Another Region is untouched.
    cluster
        .client("region-us")
        .register("api", "us")
        .await
        .expect("us registers");

    let listed = succeeded(&leasehold(&[
        "identity",
        "list",
        "--allocator",
        &address,
        "--tls-dir",
        &certs,
        "--json",
    ]));
    assert!(
        listed.contains("\"identity\":\"region/eu\"") && listed.contains("key leaked"),
        "{listed}"
    );

    succeeded(&leasehold(&[
        "identity",
        "restore",
        "region/eu",
        "--allocator",
        &address,
        "--tls-dir",
        &certs,
    ]));
    let again = eu
        .register("api", "eu")
        .await
        .expect("eu registers once restored");
    eu.rebalance(rebalance("eu", again.incarnation, 5, 0, 0))
        .await
        .expect("eu rebalances once restored");
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_list_is_the_same_on_every_node_and_survives_a_restart_from_snapshots() {
    // A snapshot every 3 entries, no log kept behind it: after the restart
    // the list can only come back from the snapshot files.
    let mut cluster = Cluster::start(3, 3).await;
    create_api(&cluster, RatePoolConfig::with_defaults(L)).await;
    let admin = cluster.client("admin");
    admin
        .revoke_identity("region/us", "test")
        .await
        .expect("revoked");
    admin
        .revoke_identity("gateway/eu", "")
        .await
        .expect("revoked");
    admin.revoke_identity("node/3", "").await.expect("revoked");
    admin.restore_identity("node/3").await.expect("restored");
    let expected = ["gateway/eu", "region/us"];
    cluster.deny_lists_are(&expected).await;
    let admin_revoked = admin
        .revoke_identity("admin", "")
        .await
        .expect_err("admin revoked");
    assert_eq!(
        admin_revoked.code(),
        Some(Code::InvalidArgument),
        "{admin_revoked}"
    );

    cluster.stop().await;
    cluster.start_nodes(3, false).await;
    cluster.deny_lists_are(&expected).await;
    let snapshots = cluster
        .nodes
        .iter()
        .map(|n| n.node.state_machine().read(|s| s.machine.revoked().len()))
        .collect::<Vec<_>>();
    assert_eq!(snapshots, vec![2, 2, 2]);
    // Served from each node's applied state: refused after the restart.
    revoked(
        cluster.client("region-us").register("api", "us").await,
        "region/us",
    );
    cluster.stop().await;
}

/// The old behaviour (finding 3): an admin removed a Region, its agent
/// acked share 0 and the member was tombstoned; it registered again with
/// the same certificate and took its share back. Now refused until an admin
/// readmits it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_an_admin_removed_cannot_register_again_until_readmitted() {
    let mut cluster = Cluster::start(1, 20_000).await;
    create_api(&cluster, RatePoolConfig::with_defaults(L)).await;
    // Pinned: under mTLS the CLI accepts only node 1 there.
    let address = format!("node/1@{}", cluster.addresses()[0]);
    let certs = cluster.certs();
    let eu = cluster.client("region-eu");
    let us = cluster.client("region-us");
    let e = eu.register("api", "eu").await.unwrap();
    us.register("api", "us").await.unwrap();
    let reply = eu
        .rebalance(rebalance("eu", e.incarnation, 100, 0, 0))
        .await
        .unwrap();
    let share = reply.share.unwrap();
    // The removal: pending until eu acks share 0.
    succeeded(&leasehold(&[
        "region",
        "remove",
        "--pool",
        "api",
        "--region",
        "eu",
        "--allocator",
        &address,
        "--tls-dir",
        &certs,
        "--json",
    ]));
    let zero = eu
        .rebalance(rebalance(
            "eu",
            e.incarnation,
            100,
            share.share_millitokens_per_s,
            share.share_version,
        ))
        .await
        .unwrap()
        .share
        .unwrap();
    assert_eq!(zero.share_millitokens_per_s, 0);
    eu.ack_share(pb::AckShareRequest {
        pool: "api".into(),
        region: "eu".into(),
        incarnation: e.incarnation,
        applied_share_millitokens_per_s: 0,
        applied_share_version: zero.share_version,
    })
    .await
    .unwrap();
    let before = cluster.last_log_index().await;
    let refused = eu.register("api", "eu").await.expect_err("re-registered");
    assert_eq!(refused.code(), Some(Code::PermissionDenied), "{refused}");
    assert_eq!(
        refused.detail().map(|d| d.code),
        Some(pb::ErrorCode::RegionNotAdmitted as i32)
    );
    assert!(refused.to_string().contains("readmit"), "{refused}");
    assert_eq!(
        cluster.last_log_index().await,
        before,
        "the refusal was proposed"
    );

    // sre may not readmit; the admin may.
    let as_sre = leasehold(&[
        "region",
        "readmit",
        "--pool",
        "api",
        "--region",
        "eu",
        "--allocator",
        &address,
        "--tls-dir",
        &certs,
        "--identity",
        "sre",
    ]);
    assert!(!as_sre.status.success());
    let out = succeeded(&leasehold(&[
        "region",
        "readmit",
        "--pool",
        "api",
        "--region",
        "eu",
        "--allocator",
        &address,
        "--tls-dir",
        &certs,
    ]));
    assert!(out.contains("readmitted"), "{out}");
    let back = eu
        .register("api", "eu")
        .await
        .expect("readmitted, it registers");
    assert_eq!(back.share.unwrap().share_millitokens_per_s, 0);
    assert!(back.incarnation > e.incarnation);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_outside_a_pools_allow_list_cannot_register_there() {
    let mut cluster = Cluster::start(1, 20_000).await;
    // Pinned: under mTLS the CLI accepts only node 1 there.
    let address = format!("node/1@{}", cluster.addresses()[0]);
    let certs = cluster.certs();
    succeeded(&leasehold(&[
        "pool",
        "create",
        "api",
        "--kind",
        "rate",
        "--limit",
        "10000",
        "--regions",
        "eu,us",
        "--allocator",
        &address,
        "--tls-dir",
        &certs,
    ]));
    let bad = leasehold(&[
        "pool",
        "update",
        "api",
        "--regions",
        "eu,EU",
        "--allocator",
        &address,
        "--tls-dir",
        &certs,
    ]);
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("--regions") || stderr.contains("regions"),
        "{stderr}"
    );

    let ap = cluster.client("region-ap");
    let before = cluster.last_log_index().await;
    let refused = ap.register("api", "ap").await.expect_err("ap registered");
    assert_eq!(refused.code(), Some(Code::PermissionDenied), "{refused}");
    assert_eq!(
        refused.detail().map(|d| d.code),
        Some(pb::ErrorCode::RegionNotAdmitted as i32)
    );
    let text = refused.to_string();
    // Nothing about the Regions the list does name.
    assert!(!text.contains("eu") && !text.contains("us"), "{text}");
    assert_eq!(
        cluster.last_log_index().await,
        before,
        "the refusal was proposed"
    );
    cluster
        .client("region-eu")
        .register("api", "eu")
        .await
        .expect("eu is on the list");

    succeeded(&leasehold(&[
        "pool",
        "update",
        "api",
        "--regions",
        "any",
        "--allocator",
        &address,
        "--tls-dir",
        &certs,
    ]));
    ap.register("api", "ap")
        .await
        .expect("no list: ap registers");
    cluster.stop().await;
}

/// The finding: a Region's reported demand was trusted up to 2^40, so one
/// Region took nearly all of L. Now a report counts at most
/// `max_demand_multiple` (default 2) × the requests L admits per interval.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_reporting_demand_2_to_the_40_gets_no_more_than_the_cap_allows() {
    let mut cluster = Cluster::start(1, 20_000).await;
    let config = RatePoolConfig::with_defaults(L);
    let cap = config.max_demand_requests();
    // L = 10,000 tokens/s over 5 s intervals: 50,000 requests, twice.
    assert_eq!(cap, 100_000);
    let floor = config.floor_millitokens_per_s();
    create_api(&cluster, config).await;
    let eu = cluster.client("region-eu");
    let us = cluster.client("region-us");
    let e = eu.register("api", "eu").await.unwrap();
    let u = us.register("api", "us").await.unwrap();
    // us reports the demand L admits; eu claims 2^40.
    let honest = 50_000;
    us.rebalance(rebalance("us", u.incarnation, honest, 0, 0))
        .await
        .unwrap();
    let reply = eu
        .rebalance(rebalance("eu", e.incarnation, 1 << 40, 0, 0))
        .await
        .unwrap()
        .share
        .unwrap();
    // target = floor + (L − 2 floor) × cap / (cap + honest).
    let spread = L - 2 * floor;
    let bound = floor + spread * cap / (cap + honest);
    assert_eq!(bound, 6_500_000);
    let uncapped = floor + (u128::from(spread) * (1u128 << 40) / ((1u128 << 40) + 50_000)) as u64;
    assert!(uncapped > 9_400_000, "{uncapped}");
    assert!(
        reply.target_millitokens_per_s <= bound && reply.target_millitokens_per_s + 1 >= bound,
        "target {} above the bound {bound}",
        reply.target_millitokens_per_s
    );
    assert!(reply.share_millitokens_per_s <= bound);
    let state = cluster
        .client("admin")
        .inspect(pb::InspectRequest {
            pool: "api".into(),
            include_grants: false,
            allow_stale: false,
        })
        .await
        .unwrap()
        .state
        .unwrap();
    let Some(pb::pool_state::Kind::Rate(rate)) = &state.pools[0].kind else {
        panic!("not a rate pool")
    };
    let recorded = rate
        .members
        .iter()
        .find(|m| m.member.as_ref().unwrap().region == "eu")
        .unwrap()
        .account
        .as_ref()
        .unwrap()
        .demand_requests;
    assert_eq!(recorded, cap, "the report was not clamped");
    cluster.stop().await;
}
