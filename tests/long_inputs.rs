//! A 64 KiB bad value is refused INVALID_ARGUMENT with a short message, by
//! a real allocator node and a real agent, through the generated clients
//! (issue 13, item 5). Before the cap, such a refusal repeated the value
//! into the status trailer and a stock gRPC client saw RESOURCE_EXHAUSTED
//! ("metadata size exceeds hard limit") instead.
//!
//! Each refusal must: carry INVALID_ARGUMENT, stay under 1 KiB (message and
//! typed detail), and say `(65536 bytes)` — a short prefix or the length,
//! never the value.

mod common;
mod common_allocator;

use common_allocator::{cluster_with, raw_client, serial};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
    rate_limit_descriptor::Entry, RateLimitDescriptor,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use leasehold_allocator::local_cluster::ClusterSettings;
use leasehold_allocator::wire::error_detail;
use leasehold_proto::allocator::v1 as apb;
use tonic::Code;

/// The size of every bad value here.
const HUGE_BYTES: usize = 64 * 1024;
/// What every refusal must say about it.
const LENGTH_NOTE: &str = "(65536 bytes)";
/// Every refusal's message is shorter than this.
const SHORT_BYTES: usize = 1024;

/// A 64 KiB value in a field's own charset: only its length is wrong.
fn huge(byte: char) -> String {
    byte.to_string().repeat(HUGE_BYTES)
}

fn assert_short_refusal(what: &str, status: &tonic::Status) {
    assert_eq!(
        status.code(),
        Code::InvalidArgument,
        "{what}: {}",
        status.message()
    );
    let message = status.message();
    assert!(
        message.len() < SHORT_BYTES,
        "{what}: a {}-byte message",
        message.len()
    );
    assert!(
        message.contains(LENGTH_NOTE),
        "{what}: {message:?} does not say {LENGTH_NOTE}"
    );
}

/// An allocator refusal also carries its typed detail: short as well.
fn assert_short_allocator_refusal(what: &str, status: &tonic::Status) {
    assert_short_refusal(what, status);
    let detail = error_detail(status).unwrap_or_else(|| panic!("{what}: no typed detail"));
    assert!(
        detail.message.len() < SHORT_BYTES,
        "{what}: a {}-byte detail",
        detail.message.len()
    );
    assert!(detail.field.len() < SHORT_BYTES, "{what}: field");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_64_kib_bad_value_is_refused_invalid_argument_with_a_short_message_by_the_allocator() {
    let _serial = serial().await;
    let (cluster, leader) = cluster_with(ClusterSettings {
        nodes: 1,
        ..ClusterSettings::default()
    })
    .await;
    let mut client = raw_client(&leader.leader_address).await;

    let refused = client
        .add_node(apb::AddNodeRequest {
            node_id: 7,
            address: huge('a'),
            voter: false,
        })
        .await
        .expect_err("a 64 KiB address without a port is refused");
    assert_short_allocator_refusal("AddNode.address", &refused);

    let refused = client
        .inspect(apb::InspectRequest {
            pool: huge('p'),
            include_grants: false,
            allow_stale: false,
        })
        .await
        .expect_err("a 64 KiB pool is unknown");
    assert_short_allocator_refusal("Inspect.pool", &refused);

    let grant = |pool: String, lease_id: String| apb::GrantRequest {
        pool,
        region: "eu".into(),
        incarnation: 1,
        lease_id,
        want_millitokens: 1_000,
    };
    let refused = client
        .grant(grant(huge('p'), "lease-1".into()))
        .await
        .expect_err("a 64 KiB pool id is refused");
    assert_short_allocator_refusal("Grant.pool", &refused);

    let refused = client
        .grant(grant("api-minute".into(), huge('L')))
        .await
        .expect_err("a 64 KiB lease id is refused");
    assert_short_allocator_refusal("Grant.lease_id", &refused);
    drop(cluster);
}

const POLICY: &str = r#"
version = 1
[[domain]]
name = "api"
[[domain.rule]]
id = "p-tenant"
scope = "tenant"
algorithm = "token_bucket"
capacity = 1000
refill = 100
period_ms = 1000
fail_mode = "open"
"#;

#[tokio::test]
async fn a_64_kib_bad_value_is_refused_invalid_argument_with_a_short_message_by_the_agent() {
    let t = common::start(POLICY).await;
    let mut client = t.client.clone();

    let mut long_route = common::target("atlas", "u-1", "read");
    long_route.route_group = huge('r');
    let refused = client
        .check(common::check("c-1", long_route, 1))
        .await
        .expect_err("a 64 KiB route group is refused");
    assert_short_refusal("Check.target.route_group", &refused);

    let refused = client
        .check(common::check(
            &huge('i'),
            common::target("atlas", "u-1", "read"),
            1,
        ))
        .await
        .expect_err("a 64 KiB request id is refused");
    assert_short_refusal("Check.request_id", &refused);

    // A principal id is never quoted, not even a prefix: only its length.
    let secret = format!("alice@example.com{}", huge('x'));
    let mut long_principal = common::target("atlas", &secret, "read");
    long_principal.route_group = "read".into();
    let refused = client
        .check(common::check("c-2", long_principal, 1))
        .await
        .expect_err("a 64 KiB principal id is refused");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().len() < SHORT_BYTES);
    assert!(
        !refused.message().contains("alice"),
        "{}",
        refused.message()
    );

    // The same through Envoy's protocol (same port, same validation).
    let mut envoy = RateLimitServiceClient::connect(format!("http://{}", t.agent.grpc_addr))
        .await
        .expect("connect");
    let entries = [("tenant", "atlas".to_string()), ("route_group", huge('r'))];
    let refused = envoy
        .should_rate_limit(RateLimitRequest {
            domain: "api".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: entries
                    .into_iter()
                    .map(|(key, value)| Entry {
                        key: key.into(),
                        value,
                    })
                    .collect(),
                ..Default::default()
            }],
            hits_addend: 1,
        })
        .await
        .expect_err("a 64 KiB route group is refused");
    assert_short_refusal("ShouldRateLimit route_group", &refused);
    t.agent.stop().await;
}
