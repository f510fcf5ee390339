//! `leasehold lease list` end to end (issue 28 item 5): a block a gateway
//! leases is listed from the lease records in the Region's store — with
//! its holder (the gateway's verified identity), rule, tokens and expiry —
//! and is gone once given back; `--json` parses; a gateway may not list.
//! Real agent, real `leasehold` binary; a real redis-server, and the
//! in-memory store `leasehold dev` uses.

mod common;

use std::process::{Command, Output};
use std::sync::Arc;

use common::{target, PATIENT_DEADLINE};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::server::{self, AgentSpec, ListenerSecurity, RunningAgent};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::BucketStore;
use leasehold_region_agent::testing::RedisServer;
use leasehold_tls::{ExpectedPeer, Identity, TlsConnector, TlsSettings};
use serde_json::Value;
use tonic::transport::Channel;

const TRUST_DOMAIN: &str = "leasehold.local";

/// A global leased rule that does not refill during a test (block 10).
const POLICY: &str = r#"
version = 1

[[domain]]
name = "api"

[[domain.rule]]
id = "p-global"
scope = "global"
algorithm = "token_bucket"
match = { route_group = "read" }
capacity = 1000
refill = 1
period_ms = 1000000
fail_mode = "closed"
leased = { gateways = 2 }
"#;

/// The record's and the block's lives (`leasehold_region_agent::lease`).
const BLOCK_LIFE_MS: i64 = 10_000;
const RECORD_LIFE_MS: i64 = 30_000;

struct Secured {
    certs: tempfile::TempDir,
    agent: RunningAgent,
}

impl Secured {
    async fn start(store: Arc<dyn BucketStore>) -> Secured {
        let certs = tempfile::tempdir().unwrap();
        leasehold_tls::certs::init(certs.path(), TRUST_DOMAIN, &["eu".into()], 1).unwrap();
        let own = || Some(TlsSettings::in_dir(certs.path(), "region-eu", TRUST_DOMAIN));
        let agent = server::start(AgentSpec {
            listeners: ListenerSecurity {
                grpc_tls: own(),
                http_tls: own(),
                rls_listen: None,
            },
            ..common::spec_on(store, POLICY)
        })
        .await
        .expect("agent starts with mTLS");
        Secured { certs, agent }
    }

    async fn client(&self, stem: &str) -> AgentClient<Channel> {
        let tls = TlsSettings::in_dir(self.certs.path(), stem, TRUST_DOMAIN);
        let connector = TlsConnector::new(tls.files(), TRUST_DOMAIN).unwrap();
        let channel = leasehold_tls::channel(
            &self.agent.grpc_addr.to_string(),
            connector,
            ExpectedPeer::Identity(Identity::Region("eu".into())),
        )
        .await
        .expect("mTLS channel to the agent");
        AgentClient::new(channel)
    }

    /// `leasehold lease list` against this agent as `identity` (None: sre).
    fn lease_list(&self, identity: Option<&str>, extra: &[&str]) -> Output {
        let mut command = Command::new(env!("CARGO_BIN_EXE_leasehold"));
        command
            .args(["lease", "list", "--agent"])
            .arg(format!("region/eu@{}", self.agent.grpc_addr))
            .arg("--tls-dir")
            .arg(self.certs.path())
            .args(extra)
            .env("RUST_BACKTRACE", "0");
        if let Some(identity) = identity {
            command.args(["--identity", identity]);
        }
        command.output().unwrap()
    }
}

fn lease(id: &str) -> pb::LeaseBlockRequest {
    pb::LeaseBlockRequest {
        lease_id: id.into(),
        target: Some(target("atlas", "alice", "read")),
        rule_id: "p-global".into(),
    }
}

fn give_back(id: &str, unused: u64) -> pb::ReturnBlockRequest {
    pb::ReturnBlockRequest {
        lease_id: id.into(),
        target: Some(target("atlas", "alice", "read")),
        rule_id: "p-global".into(),
        unused_tokens: unused,
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The JSON of a successful `lease list --json`.
fn listing(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "{}{}",
        stdout(out),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout(out)).expect("--json parses")
}

/// The lease `id` in the first agent's listing, if listed.
fn listed<'a>(json: &'a Value, id: &str) -> Option<&'a Value> {
    json["agents"][0]["leases"]
        .as_array()
        .expect("a lease array")
        .iter()
        .find(|lease| lease["lease_id"] == id)
}

/// Lease, list, give back, list again: the whole life of one block as an
/// operator sees it.
async fn a_gateways_lease_is_listed_then_gone_once_returned(store: Arc<dyn BucketStore>) {
    let s = Secured::start(store).await;
    let mut gateway = s.client("gateway-eu").await;
    let granted = gateway.lease_block(lease("l-list-1")).await.unwrap();
    assert_eq!(granted.into_inner().granted_tokens, 10);

    let json = listing(&s.lease_list(None, &["--json"]));
    let agent = &json["agents"][0];
    assert_eq!(agent["region"], "eu");
    assert_eq!(agent["truncated"], false);
    let lease = listed(&json, "l-list-1").expect("the lease is listed");
    // Its holder is the gateway's verified identity; no principal shows.
    assert_eq!(lease["holder"], "gateway/eu");
    assert_eq!(
        (&lease["domain"], &lease["rule_id"]),
        (&"api".into(), &"p-global".into())
    );
    assert_eq!(lease["tag"], "g-api");
    assert_eq!(lease["granted_tokens"], 10);
    assert_eq!(lease["returned"], false);
    // Expiry on the store's clock: the block's 10 s, the record's 30 s.
    let now = agent["now_ms"].as_i64().unwrap();
    let granted_at = lease["granted_at_ms"].as_i64().unwrap();
    let spend_until = lease["spend_until_ms"].as_i64().unwrap();
    assert!(
        granted_at <= now && now - granted_at < RECORD_LIFE_MS,
        "{lease}"
    );
    assert_eq!(spend_until, granted_at + BLOCK_LIFE_MS);
    assert_eq!(
        lease["expires_at_ms"].as_i64().unwrap(),
        granted_at + RECORD_LIFE_MS
    );
    assert!(
        lease["spend_until"].as_str().unwrap().ends_with('Z'),
        "{lease}"
    );
    assert_eq!(agent["total"]["tokens"], 10);
    assert_eq!(agent["totals"][0]["holder"], "gateway/eu");
    assert!(!stdout(&s.lease_list(None, &["--json"])).contains("alice"));

    // The table: the lease's row, its totals row, the RFC 3339 expiry.
    let text = stdout(&s.lease_list(None, &[]));
    let row = text
        .lines()
        .find(|l| l.starts_with("l-list-1"))
        .unwrap_or_else(|| panic!("no row for the lease: {text}"));
    for column in ["api", "p-global", "gateway/eu", "g-api", " 10 "] {
        assert!(row.contains(column), "{column:?} missing: {row}");
    }
    assert!(row.contains("Z (in ") || row.contains("Z (now)"), "{row}");
    assert!(text.starts_with("region eu ("), "{text}");
    assert!(text.contains("1 lease outstanding, 10 tokens"), "{text}");

    // Given back: no longer outstanding, so no longer listed...
    let back = gateway
        .return_block(give_back("l-list-1", 4))
        .await
        .unwrap();
    assert_eq!(back.into_inner().added_tokens, 4);
    let json = listing(&s.lease_list(None, &["--json"]));
    assert!(listed(&json, "l-list-1").is_none(), "{json:#}");
    assert_eq!(json["agents"][0]["total"]["leases"], 0);
    // ...but its record still answers a retried give-back, and shows so.
    let json = listing(&s.lease_list(None, &["--json", "--include-returned"]));
    let lease = listed(&json, "l-list-1").expect("listed as returned");
    assert_eq!(
        (&lease["returned"], &lease["returned_tokens"]),
        (&true.into(), &4.into())
    );
    assert_eq!(json["agents"][0]["total"]["leases"], 0, "never counted");

    // A gateway may not list: refused before its request is read.
    let status = gateway
        .list_leases(pb::ListLeasesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status}");
    assert!(
        status.message().contains("/gateway/eu") && status.message().contains("ListLeases"),
        "{status}"
    );
    let out = s.lease_list(Some("gateway-eu"), &[]);
    assert!(!out.status.success());
    assert!(
        stdout(&out).contains("no answer: PermissionDenied"),
        "{}",
        stdout(&out)
    );
    // sre and admin may.
    for stem in ["sre", "admin"] {
        let mut operator = s.client(stem).await;
        let reply = operator
            .list_leases(pb::ListLeasesRequest::default())
            .await
            .unwrap_or_else(|e| panic!("{stem}: {e}"));
        assert_eq!(reply.into_inner().region, "eu");
    }
    s.agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_gateways_lease_is_listed_then_gone_once_returned() {
    let redis = RedisServer::start().expect("redis-server");
    let store = RedisStore::new(RedisStoreConfig {
        call_deadline: PATIENT_DEADLINE,
        connect_timeout: PATIENT_DEADLINE,
        ..RedisStoreConfig::new(redis.url())
    })
    .unwrap();
    a_gateways_lease_is_listed_then_gone_once_returned(Arc::new(store)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_memory_a_gateways_lease_is_listed_then_gone_once_returned() {
    a_gateways_lease_is_listed_then_gone_once_returned(Arc::new(MemoryStore::default())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_plaintext_listener_the_holder_is_anonymous_and_filters_apply() {
    let mut t = common::start(POLICY).await;
    for id in ["l-a", "l-b"] {
        let granted = t.client.lease_block(lease(id)).await.unwrap();
        assert_eq!(granted.into_inner().granted_tokens, 10);
    }
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args([
                "lease",
                "list",
                "--agent",
                &t.agent.grpc_addr.to_string(),
                "--json",
            ])
            .args(extra)
            .env_remove("LEASEHOLD_TLS_DIR")
            .output()
            .unwrap()
    };
    let json = listing(&run(&[]));
    for id in ["l-a", "l-b"] {
        assert_eq!(listed(&json, id).expect(id)["holder"], "anonymous");
    }
    assert_eq!(json["agents"][0]["store"], "redis");
    assert_eq!(
        json["total"],
        serde_json::json!({"leases": 2, "tokens": 20})
    );
    // Filters and the limit are the agent's.
    let none = listing(&run(&["--holder", "gateway/eu"]));
    assert_eq!(none["agents"][0]["leases"].as_array().unwrap().len(), 0);
    let one = listing(&run(&["--limit", "1"]));
    assert_eq!(one["agents"][0]["leases"].as_array().unwrap().len(), 1);
    assert_eq!(one["agents"][0]["truncated"], true);
    assert_eq!(one["agents"][0]["truncated_reasons"][0], "max_records");
    // A bad filter is refused naming it.
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(["lease", "list", "--agent", &t.agent.grpc_addr.to_string()])
        .args(["--holder", "Gateway EU"])
        .env_remove("LEASEHOLD_TLS_DIR")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        stdout(&out).contains("invalid field holder"),
        "{}",
        stdout(&out)
    );
    // A record past its expiry on the store's clock is not listed (aged by
    // hand: waiting 30 s would make the test slow, not stronger).
    let aged_key = t
        .keys_matching("lh:v1:{g-api}:_lease:*:l-a")
        .pop()
        .expect("the record of l-a");
    let mut conn = t.redis_conn();
    let text: String = redis::cmd("GET").arg(&aged_key).query(&mut conn).unwrap();
    let (s, us): (i64, i64) = redis::cmd("TIME").query(&mut conn).unwrap();
    let fields: Vec<&str> = text.split(',').collect();
    let aged = format!(
        "{},{},{}",
        fields[0],
        s * 1_000 + us / 1_000 - 1,
        fields[2..].join(",")
    );
    redis::cmd("SET")
        .arg(&aged_key)
        .arg(&aged)
        .arg("KEEPTTL")
        .exec(&mut conn)
        .unwrap();
    let json = listing(&run(&[]));
    assert!(listed(&json, "l-a").is_none(), "{json:#}");
    assert!(listed(&json, "l-b").is_some(), "{json:#}");
    t.agent.stop().await;
}
