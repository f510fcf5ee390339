//! The allocator behind mTLS (ARCHITECTURE §8): a real node on sled with
//! `[tls]`, certificates from `leasehold_tls::certs::init`, clients with
//! each identity's certificate. Every row of the authorization table that
//! the allocator serves is exercised; a refusal is PERMISSION_DENIED naming
//! the identity and the method and appends nothing to the raft log.

use std::sync::Arc;
use std::time::Duration;

use leasehold_allocator::client::{AllocatorClient, ClientError, ClientSettings};
use leasehold_allocator::node_config::NodeConfig;
use leasehold_allocator::running::{start, InitMode, RunningNode};
use leasehold_allocator::transport::{Connector, TlsNodeConnector};
use leasehold_allocator::{PoolConfig, RatePoolConfig};
use leasehold_proto::allocator::v1 as pb;
use leasehold_proto::allocator::v1::raft_client::RaftClient;
use leasehold_tls::TlsSettings;
use tonic::Code;

const TRUST_DOMAIN: &str = "leasehold.local";

struct Secured {
    dir: tempfile::TempDir,
    node: RunningNode,
}

impl Secured {
    fn settings(&self, stem: &str) -> TlsSettings {
        TlsSettings::in_dir(&self.dir.path().join("certs"), stem, TRUST_DOMAIN)
    }

    fn connector(&self, stem: &str) -> Arc<dyn Connector> {
        Arc::new(TlsNodeConnector::new(&self.settings(stem)).expect("client certificate loads"))
    }

    fn client(&self, stem: &str) -> AllocatorClient {
        let settings = ClientSettings {
            call_timeout: Duration::from_secs(10),
            leader_wait: Duration::from_secs(30),
            max_attempts: 20,
            retry_pause: Duration::from_millis(100),
            hedge_after: None,
        };
        AllocatorClient::with_connector(
            &[self.node.address.to_string()],
            settings,
            self.connector(stem),
        )
        .expect("client")
    }

    /// The node's last log index, read by the admin.
    async fn last_log_index(&self) -> u64 {
        let reply = self
            .client("admin")
            .inspect(pb::InspectRequest::default())
            .await
            .expect("admin inspects");
        reply.raft.expect("raft status").last_log_index
    }
}

async fn secured_node() -> Secured {
    secured_node_with("").await
}

/// [`secured_node`] with `extra` top-level settings in its config.
async fn secured_node_with(extra: &str) -> Secured {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    leasehold_tls::certs::init(&certs, TRUST_DOMAIN, &["eu".into(), "us".into()], 1)
        .expect("certs init");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = format!(
        "node_id = 1\nlisten = \"127.0.0.1:{port}\"\ndata_dir = \"data\"\ntick_interval_ms = 0\n{extra}\
         [peers]\n1 = \"127.0.0.1:{port}\"\n\
         [tls]\ntrust_domain = \"{TRUST_DOMAIN}\"\nca_file = \"certs/ca.pem\"\n\
         cert_file = \"certs/node-1.pem\"\nkey_file = \"certs/node-1.key\"\n"
    );
    let config = NodeConfig::parse("allocator-1.toml", &text, dir.path()).expect("config");
    assert!(config.tls.is_some());
    let node = start(config, InitMode::Explicit)
        .await
        .expect("node starts");
    let secured = Secured { dir, node };
    // The admin creates the pool (waits for the leader).
    let pool = PoolConfig::Rate(RatePoolConfig::with_defaults(10_000_000));
    secured
        .client("admin")
        .create_pool("api", &pool)
        .await
        .expect("admin creates a pool");
    secured
}

fn denied(result: Result<impl std::fmt::Debug, ClientError>, identity: &str, method: &str) {
    let error = result.expect_err("the call was allowed");
    assert_eq!(error.code(), Some(Code::PermissionDenied), "{error}");
    let text = error.to_string();
    assert!(text.contains(identity), "{text}");
    assert!(text.contains(method), "{text}");
}

fn rebalance(region: &str, incarnation: u64) -> pb::RebalanceRequest {
    pb::RebalanceRequest {
        pool: "api".into(),
        region: region.into(),
        incarnation,
        demand_requests: 5,
        applied_share_millitokens_per_s: 0,
        applied_share_version: 0,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_acts_only_for_itself_and_a_refusal_appends_nothing() {
    let s = secured_node().await;
    let eu = s.client("region-eu");
    let registered = eu.register("api", "eu").await.expect("eu registers itself");
    eu.rebalance(rebalance("eu", registered.incarnation))
        .await
        .expect("eu rebalances itself");
    // A Region may learn one pool's config (the agent does at start).
    eu.inspect(pb::InspectRequest {
        pool: "api".into(),
        include_grants: false,
        allow_stale: true,
    })
    .await
    .expect("eu inspects its pool");

    let before = s.last_log_index().await;
    denied(eu.register("api", "us").await, "/region/eu", "Register");
    denied(
        eu.rebalance(rebalance("us", 1)).await,
        "/region/eu",
        "Rebalance",
    );
    denied(
        eu.grant("api", "us", 1, "lease-1", 1_000).await,
        "/region/eu",
        "Grant",
    );
    denied(
        eu.inspect(pb::InspectRequest::default()).await,
        "/region/eu",
        "Inspect",
    );
    assert_eq!(s.last_log_index().await, before, "a refusal appended");
    s.node.stop().await;
}

/// Issue 27, finding 7: a Region's Inspect showed every Region's health,
/// shares, demand, incarnation and the raft node addresses. Now: the
/// pool's config and its own membership only; sre still sees everything.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regions_inspect_shows_the_config_and_its_own_membership_only() {
    let s = secured_node().await;
    let (eu, us) = (s.client("region-eu"), s.client("region-us"));
    let eu_at = eu.register("api", "eu").await.expect("eu").incarnation;
    let us_at = us.register("api", "us").await.expect("us").incarnation;
    eu.rebalance(rebalance("eu", eu_at))
        .await
        .expect("eu reports");
    us.rebalance(rebalance("us", us_at))
        .await
        .expect("us reports");
    let narrow = pb::InspectRequest {
        pool: "api".into(),
        include_grants: false,
        allow_stale: false,
    };
    let seen = eu.inspect(narrow.clone()).await.expect("eu inspects");
    let text = format!("{seen:?}");
    assert!(!text.contains("\"us\""), "another Region shown: {text}");
    assert!(!text.contains("127.0.0.1"), "a node address shown: {text}");
    let state = seen.state.expect("state");
    let Some(pb::pool_state::Kind::Rate(rate)) = &state.pools[0].kind else {
        panic!("rate pool: {state:?}")
    };
    assert_eq!(
        rate.config
            .as_ref()
            .expect("config")
            .limit_millitokens_per_s,
        10_000_000
    );
    let own: Vec<&str> = rate
        .members
        .iter()
        .filter_map(|m| m.member.as_ref().map(|m| m.region.as_str()))
        .collect();
    assert_eq!(own, ["eu"]);
    assert!(state.regions.iter().all(|r| r.region == "eu"), "{state:?}");
    // The sre's view is whole.
    let whole = s.client("sre").inspect(narrow).await.expect("sre inspects");
    let whole = format!("{whole:?}");
    assert!(
        whole.contains("\"us\"") && whole.contains("127.0.0.1"),
        "{whole}"
    );
    s.node.stop().await;
}

/// Issue 27, finding 2: one Region used to fill the pool's one record set
/// for the window (and could claim another Region's lease ids): with
/// records per Region it fills only its own. Records are
/// kept per Region now: a Region at its cap refuses only itself, another
/// Region may use the same lease id, and no refusal names another Region.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_filling_its_grant_records_refuses_only_itself() {
    use leasehold_allocator::grant::MAX_GRANT_RECORDS_PER_REGION;
    use leasehold_allocator::WindowPoolConfig;
    // The write limit would refuse the burst first: this is the record cap.
    let s = secured_node_with("[write_limit]\nrate_per_s = 1000000\nburst = 1000000\n").await;
    // A 30-day window: the test never straddles two.
    let window = PoolConfig::Window(WindowPoolConfig {
        capacity_millitokens_per_window: 1 << 40,
        window_ms: 30 * 86_400_000,
        lease_ttl_ms: 60_000,
        regions: None,
    });
    s.client("admin")
        .create_pool("quota", &window)
        .await
        .expect("admin creates a window pool");
    let (eu, us) = (s.client("region-eu"), s.client("region-us"));
    let eu_at = eu.register("quota", "eu").await.expect("eu").incarnation;
    let us_at = us.register("quota", "us").await.expect("us").incarnation;
    // eu's first grant, then us fills its own records with tiny grants
    // (eu's lease id among them: 4,096 in all).
    eu.grant("quota", "eu", eu_at, "eu-0", 1_000)
        .await
        .expect("eu grant");
    let ids: Vec<String> = std::iter::once("eu-0".to_string())
        .chain((1..MAX_GRANT_RECORDS_PER_REGION).map(|n| format!("us-{n}")))
        .collect();
    for batch in ids.chunks(64) {
        let mut calls = tokio::task::JoinSet::new();
        for id in batch {
            let (us, id) = (us.clone(), id.clone());
            calls.spawn(async move { us.grant("quota", "us", us_at, &id, 1).await });
        }
        while let Some(reply) = calls.join_next().await {
            let reply = reply.expect("task").expect("us grant under its cap");
            assert_eq!(reply.grant.expect("grant").granted_millitokens, 1);
        }
    }
    let full = us
        .grant("quota", "us", us_at, "us-one-more", 1)
        .await
        .expect_err("us is at its cap");
    assert_eq!(full.code(), Some(Code::ResourceExhausted), "{full}");
    assert!(!full.to_string().contains("eu"), "{full}");
    // eu is unaffected: fresh ids, an id us used, and its replay.
    for id in ["eu-1", "us-7", "us-one-more"] {
        let grant = eu
            .grant("quota", "eu", eu_at, id, 1_000)
            .await
            .unwrap_or_else(|e| panic!("eu grant {id}: {e}"))
            .grant
            .expect("grant");
        assert_eq!(grant.granted_millitokens, 1_000, "{id}");
    }
    let replay = eu
        .grant("quota", "eu", eu_at, "eu-0", 5)
        .await
        .expect("eu replay")
        .grant
        .expect("grant");
    assert_eq!(
        replay.granted_millitokens, 1_000,
        "a replay answers the record"
    );
    s.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_prober_reports_health() {
    let s = secured_node().await;
    s.client("region-eu")
        .register("api", "eu")
        .await
        .expect("eu registers");
    let before = s.last_log_index().await;
    denied(
        s.client("region-eu").health_report("eu", false).await,
        "/region/eu",
        "HealthReport",
    );
    denied(
        s.client("admin").health_report("eu", false).await,
        "/admin",
        "HealthReport",
    );
    assert_eq!(s.last_log_index().await, before);
    let reply = s
        .client("prober")
        .health_report("eu", false)
        .await
        .expect("the prober reports");
    assert!(reply.committed);
    s.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_calls_need_the_admin_identity_and_sre_only_reads() {
    let s = secured_node().await;
    let pool = PoolConfig::Rate(RatePoolConfig::with_defaults(1_000_000));
    let before = s.last_log_index().await;
    for stem in ["region-eu", "sre", "prober", "gateway-eu", "node-1"] {
        let client = s.client(stem);
        let identity = match stem {
            "region-eu" => "/region/eu",
            "gateway-eu" => "/gateway/eu",
            "node-1" => "/node/1",
            other => other,
        };
        denied(
            client.create_pool("other", &pool).await,
            identity,
            "CreatePool",
        );
        denied(client.freeze("api", "eu", true).await, identity, "Freeze");
        denied(client.reclaim("api", "eu").await, identity, "Reclaim");
        denied(client.remove_node(7).await, identity, "RemoveNode");
    }
    assert_eq!(
        s.last_log_index().await,
        before,
        "a refused admin call appended"
    );
    s.client("sre")
        .inspect(pb::InspectRequest::default())
        .await
        .expect("sre reads everything");
    s.client("admin")
        .create_pool("other", &pool)
        .await
        .expect("admin creates");
    assert!(s.last_log_index().await > before);
    s.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_rpcs_accept_node_identities_only() {
    let s = secured_node().await;
    let address = s.node.address.to_string();
    for (stem, identity) in [
        ("region-eu", "/region/eu"),
        ("admin", "/admin"),
        ("sre", "/sre"),
    ] {
        let channel = s.connector(stem).channel(&address).unwrap();
        let mut raft = RaftClient::new(channel);
        // Authorized before the payload is read: even a forged higher term
        // never reaches openraft.
        let forged = pb::RaftPayload {
            json: br#"{"vote":{"leader_id":{"term":99,"node_id":9},"committed":false}}"#.to_vec(),
        };
        for status in [
            raft.vote(forged.clone()).await.unwrap_err(),
            raft.append_entries(forged.clone()).await.unwrap_err(),
            raft.install_snapshot(forged.clone()).await.unwrap_err(),
        ] {
            assert_eq!(status.code(), Code::PermissionDenied, "{stem}: {status}");
            assert!(status.message().contains(identity), "{status}");
        }
    }
    // A node identity passes the gate (the payload is then judged by raft).
    let channel = s.connector("node-1").channel(&address).unwrap();
    let status = RaftClient::new(channel)
        .node_status(pb::NodeStatusRequest {})
        .await
        .expect("a node asks who a node is");
    assert_eq!(status.into_inner().node_id, 1);
    s.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_client_gets_no_answer_from_a_tls_node() {
    let s = secured_node().await;
    let plain = AllocatorClient::connect(&[s.node.address.to_string()]).unwrap();
    let error = plain
        .inspect(pb::InspectRequest::default())
        .await
        .expect_err("plaintext answered");
    assert_ne!(error.code(), Some(Code::Ok), "{error}");
    s.node.stop().await;
}

/// `grpc.health.v1.Health` on the node (what orchestrators and load
/// balancers probe): SERVING once the node knows a leader, behind the same
/// mTLS handshake as every other call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_reports_grpc_health_serving_once_it_knows_a_leader() {
    let s = secured_node().await;
    // The admin's first answer means a leader is known.
    s.last_log_index().await;
    let channel = s
        .connector("sre")
        .channel(&s.node.address.to_string())
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    for service in ["", "leasehold.allocator.v1.Allocator"] {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let answer = health
                .check(tonic_health::pb::HealthCheckRequest {
                    service: service.into(),
                })
                .await;
            // NOT_FOUND until the node first reports the service.
            match answer {
                Ok(answer)
                    if answer.get_ref().status
                        == tonic_health::pb::health_check_response::ServingStatus::Serving
                            as i32 =>
                {
                    break
                }
                Ok(_) => {}
                Err(status) => assert_eq!(status.code(), Code::NotFound, "{status}"),
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{service:?} never SERVING"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    s.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_replicate_over_mtls() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    leasehold_tls::certs::init(&certs, TRUST_DOMAIN, &["eu".into()], 3).expect("certs init");
    let ports: Vec<u16> = (0..3)
        .map(|_| {
            std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port()
        })
        .collect();
    let peers: String = ports
        .iter()
        .enumerate()
        .map(|(i, port)| format!("{} = \"127.0.0.1:{port}\"\n", i + 1))
        .collect();
    let mut nodes = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let id = i + 1;
        let text = format!(
            "node_id = {id}\nlisten = \"127.0.0.1:{port}\"\ndata_dir = \"data-{id}\"\n\
             tick_interval_ms = 0\n[peers]\n{peers}\
             [tls]\ntrust_domain = \"{TRUST_DOMAIN}\"\nca_file = \"certs/ca.pem\"\n\
             cert_file = \"certs/node-{id}.pem\"\nkey_file = \"certs/node-{id}.key\"\n"
        );
        let config = NodeConfig::parse("allocator.toml", &text, dir.path()).expect("config");
        let init = if id == 1 {
            InitMode::Explicit
        } else {
            InitMode::Auto
        };
        nodes.push(start(config, init).await.expect("node starts"));
    }
    let admin = TlsSettings::in_dir(&certs, "admin", TRUST_DOMAIN);
    // Pinned: a follower's NOT_LEADER is followed to node/<leader id>.
    let addresses: Vec<String> = nodes
        .iter()
        .map(|n| format!("node/{}@{}", n.node.id(), n.address))
        .collect();
    let client = AllocatorClient::with_connector(
        &addresses,
        ClientSettings {
            call_timeout: Duration::from_secs(10),
            leader_wait: Duration::from_secs(60),
            max_attempts: 200,
            retry_pause: Duration::from_millis(100),
            hedge_after: None,
        },
        Arc::new(TlsNodeConnector::new(&admin).unwrap()),
    )
    .unwrap();
    let pool = PoolConfig::Rate(RatePoolConfig::with_defaults(1_000_000));
    let created = client.create_pool("api", &pool).await.expect("created");
    // Every node applies it: raft ran over mTLS between the nodes.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    for node in &nodes {
        loop {
            let applied = node
                .node
                .state_machine()
                .read(|state| state.machine.pool("api").is_some());
            if applied {
                break;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {} did not apply entry {}",
                node.node.id(),
                created.epoch
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    for node in nodes {
        node.stop().await;
    }
}

fn leasehold(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .output()
        .expect("run leasehold")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_reads_as_sre_and_changes_as_admin_with_its_tls_dir() {
    let s = secured_node().await;
    s.client("region-eu")
        .register("api", "eu")
        .await
        .expect("eu registers");
    let address = format!("node/1@{}", s.node.address);
    let certs = s.dir.path().join("certs");
    let certs = certs.to_str().unwrap();
    let list = leasehold(&[
        "pool",
        "list",
        "--allocator",
        &address,
        "--tls-dir",
        certs,
        "--json",
    ]);
    assert!(
        list.status.success(),
        "{}",
        String::from_utf8_lossy(&list.stderr)
    );
    assert!(String::from_utf8_lossy(&list.stdout).contains("\"api\""));
    // sre may not remove; admin (the default identity of a change) may.
    let as_sre = leasehold(&[
        "region",
        "remove",
        "--pool",
        "api",
        "--region",
        "eu",
        "--allocator",
        &address,
        "--tls-dir",
        certs,
        "--identity",
        "sre",
    ]);
    assert!(!as_sre.status.success());
    let stderr = String::from_utf8_lossy(&as_sre.stderr);
    assert!(
        stderr.contains("PermissionDenied") && stderr.contains("/sre"),
        "{stderr}"
    );
    let as_admin = leasehold(&[
        "region",
        "remove",
        "--pool",
        "api",
        "--region",
        "eu",
        "--allocator",
        &address,
        "--tls-dir",
        certs,
        "--json",
    ]);
    assert!(
        as_admin.status.success(),
        "{}",
        String::from_utf8_lossy(&as_admin.stderr)
    );
    // Without certificates: no answer from a TLS node.
    let bare = s.node.address.to_string();
    let plain = leasehold(&["pool", "list", "--allocator", &bare]);
    assert!(!plain.status.success());
    // With mTLS an address must name its node, and the node must be it.
    let unpinned = leasehold(&["pool", "list", "--allocator", &bare, "--tls-dir", certs]);
    let stderr = String::from_utf8_lossy(&unpinned.stderr);
    assert!(
        !unpinned.status.success() && stderr.contains("names no node id"),
        "{stderr}"
    );
    let other = format!("node/2@{}", s.node.address);
    let wrong = leasehold(&["pool", "list", "--allocator", &other, "--tls-dir", certs]);
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success(), "{stderr}");
    assert!(
        stderr.contains("peer is /node/1, expected /node/2"),
        "{stderr}"
    );
    assert!(!String::from_utf8_lossy(&wrong.stdout).contains("\"api\""));
    s.node.stop().await;
}

/// Issue 27 finding 8: a client configured for `node/2` at an address whose
/// server presents `/node/1` (real certificates) refuses the connection,
/// and nothing is answered; `node/1` there is answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_client_refuses_a_node_presenting_another_id() {
    let s = secured_node().await;
    let settings = ClientSettings {
        call_timeout: Duration::from_secs(2),
        leader_wait: Duration::from_secs(2),
        max_attempts: 3,
        retry_pause: Duration::from_millis(100),
        hedge_after: None,
    };
    let pinned = |id: u64| {
        AllocatorClient::with_connector(
            &[format!("node/{id}@{}", s.node.address)],
            settings.clone(),
            s.connector("sre"),
        )
        .expect("client")
    };
    let refused = pinned(2)
        .inspect(pb::InspectRequest::default())
        .await
        .expect_err("node/1's certificate is not node/2");
    assert!(matches!(refused, ClientError::NoLeader { .. }), "{refused}");
    assert!(
        refused
            .to_string()
            .contains("peer is /node/1, expected /node/2"),
        "{refused}"
    );
    let answered = pinned(1).inspect(pb::InspectRequest::default()).await;
    assert!(answered.is_ok(), "{answered:?}");
    // Mixing pinned and bare addresses is refused before any call.
    let mixed = AllocatorClient::with_connector(
        &[
            format!("node/1@{}", s.node.address),
            s.node.address.to_string(),
        ],
        settings,
        s.connector("sre"),
    );
    assert!(matches!(mixed, Err(ClientError::Address { .. })));
    s.node.stop().await;
}

#[test]
fn certs_init_writes_every_identity_and_refuses_to_replace_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("c");
    let certs = certs.to_str().unwrap();
    let first = leasehold(&[
        "certs",
        "init",
        "--dir",
        certs,
        "--regions",
        "eu,us",
        "--nodes",
        "2",
    ]);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    for stem in [
        "ca",
        "region-eu",
        "region-us",
        "gateway-eu",
        "node-1",
        "node-2",
        "prober",
        "admin",
        "sre",
    ] {
        assert!(
            dir.path().join("c").join(format!("{stem}.pem")).exists(),
            "{stem}"
        );
    }
    let again = leasehold(&["certs", "init", "--dir", certs]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("certs init --dir"));
    let forced = leasehold(&["certs", "init", "--dir", certs, "--force"]);
    assert!(
        forced.status.success(),
        "{}",
        String::from_utf8_lossy(&forced.stderr)
    );
}

/// `GET path` on the node's `metrics_listen` over HTTPS as `stem`
/// (the node verified as `/node/1`): the status code and the body.
async fn metrics_get(s: &Secured, stem: &str, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let settings = s.settings(stem);
    let options = leasehold_tls::ClientOptions {
        alpn: leasehold_tls::Alpn::Http1,
        ..Default::default()
    };
    let connector =
        leasehold_tls::TlsConnector::with_options(settings.files(), TRUST_DOMAIN, options)
            .expect("client certificate loads");
    let address = s.node.metrics_address.expect("metrics_listen bound");
    let tcp = tokio::net::TcpStream::connect(address)
        .await
        .expect("connects");
    let mut stream = connector
        .connect_expecting(
            tcp,
            leasehold_tls::ExpectedPeer::Identity(leasehold_tls::Identity::Node(1)),
        )
        .await
        .expect("handshake");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("writes");
    let mut answer = Vec::new();
    // A TLS close without close_notify still leaves the whole answer read.
    let _ = stream.read_to_end(&mut answer).await;
    let text = String::from_utf8_lossy(&answer).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
    (status, body)
}

/// The value of the sample `line_prefix` (a name with its labels) in a
/// Prometheus text body; 0 when absent.
fn sample(body: &str, line_prefix: &str) -> f64 {
    body.lines()
        .find_map(|line| line.strip_prefix(line_prefix))
        .and_then(|rest| rest.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_listen_serves_sre_and_admin_only_and_counts_a_grant() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let s = secured_node_with(&format!("metrics_listen = \"127.0.0.1:{port}\"\n")).await;
    let window = PoolConfig::Window(leasehold_allocator::config::WindowPoolConfig {
        capacity_millitokens_per_window: 1_000_000,
        window_ms: 3_600_000,
        lease_ttl_ms: 60_000,
        regions: None,
    });
    s.client("admin")
        .create_pool("win", &window)
        .await
        .expect("admin creates a window pool");
    let eu = s.client("region-eu");
    let registered = eu.register("win", "eu").await.expect("eu registers");

    let (status, before) = metrics_get(&s, "sre", "/metrics").await;
    assert_eq!(status, 200, "{before}");
    assert_eq!(sample(&before, "leasehold_allocator_raft_is_leader "), 1.0);
    assert!(sample(&before, "leasehold_allocator_raft_term ") >= 1.0);
    assert_eq!(
        sample(
            &before,
            "leasehold_allocator_pool_granted_in_window_millitokens{pool=\"win\"} "
        ),
        0.0
    );
    eu.grant("win", "eu", registered.incarnation, "lease-1", 5_000)
        .await
        .expect("eu is granted a chunk");
    let (status, after) = metrics_get(&s, "admin", "/metrics").await;
    assert_eq!(status, 200, "{after}");
    assert_eq!(
        sample(
            &after,
            "leasehold_allocator_pool_granted_in_window_millitokens{pool=\"win\"} "
        ),
        5_000.0,
        "{after}"
    );
    assert_eq!(
        sample(
            &after,
            "leasehold_allocator_grants_total{result=\"granted\"} "
        ),
        1.0
    );
    assert!(
        sample(
            &after,
            "leasehold_allocator_proposals_total{outcome=\"committed\"} "
        ) > sample(
            &before,
            "leasehold_allocator_proposals_total{outcome=\"committed\"} "
        )
    );
    assert!(
        sample(
            &after,
            "leasehold_allocator_rpc_duration_seconds_count{code=\"OK\",method=\"Grant\"} "
        ) >= 1.0,
        "{after}"
    );

    for (stem, identity) in [
        ("region-eu", "/region/eu"),
        ("node-1", "/node/1"),
        ("prober", "/prober"),
        ("gateway-eu", "/gateway/eu"),
    ] {
        let (status, body) = metrics_get(&s, stem, "/metrics").await;
        assert_eq!(status, 403, "{stem}: {body}");
        assert!(
            body.contains(identity) && body.contains("GET /metrics"),
            "{stem}: {body}"
        );
    }
    s.node.stop().await;
}
