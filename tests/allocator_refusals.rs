//! Nothing appended for a refusal, end to end: three real `leasehold
//! allocator` processes on loopback. Every command the state machine would
//! refuse — a lease id reused by another Region, an unknown pool, a
//! fenced or frozen member, a pool of the other kind, a stale incarnation,
//! an unknown Region, an immutable field — is refused by the leader before
//! it is proposed (the refusal's epoch is 0), and the leader's last log
//! index does not move; nor does a replay of a recorded grant, which is
//! answered from the state. A valid command then moves the index by one.
//! No timed assertions: every wait is a bounded wait for a condition.

use std::time::Duration;

use leasehold_allocator::client::{AllocatorClient, ClientError};
use leasehold_allocator::config::{PoolConfig, RatePoolConfig, WindowPoolConfig};
use leasehold_allocator::local_cluster::{ClusterSettings, LocalCluster};
use leasehold_proto::allocator::v1 as pb;
use tonic::Code;

/// Bound on waiting for a leader (an election takes 0.6–1.2 s here).
const LEADER_WAIT: Duration = Duration::from_secs(30);
/// A window no test outlives: 2^40 ms (about 35 years).
const HUGE_WINDOW_MS: u64 = 1 << 40;

/// Three nodes (they initialize once all are up), with a confirmed leader.
async fn cluster() -> LocalCluster {
    let mut cluster = LocalCluster::new(
        std::path::Path::new(env!("CARGO_BIN_EXE_leasehold")),
        &ClusterSettings::default(),
    )
    .expect("cluster dir");
    cluster.start_all().expect("start nodes");
    if let Err(error) = cluster.wait_for_leader(&[], LEADER_WAIT).await {
        panic!("no leader: {error}\n--- node 1 log ---\n{}", cluster.log(1));
    }
    cluster
}

fn window_pool(capacity_millitokens: u64) -> PoolConfig {
    PoolConfig::Window(WindowPoolConfig {
        capacity_millitokens_per_window: capacity_millitokens,
        window_ms: HUGE_WINDOW_MS,
        lease_ttl_ms: 60_000,
        regions: None,
    })
}

/// The leader's view as a linearizable Inspect sees it: (term, last log
/// index), and the state.
async fn leader_log(client: &AllocatorClient) -> ((u64, u64), pb::InspectReply) {
    let reply = client
        .inspect(pb::InspectRequest {
            include_grants: true,
            ..Default::default()
        })
        .await
        .expect("inspect");
    assert!(!reply.stale);
    let raft = reply.raft.clone().expect("raft status");
    assert_eq!(raft.role, "leader", "{raft:?}");
    ((raft.current_term, raft.last_log_index), reply)
}

/// Entries appended between two views, beyond the one blank entry a leader
/// appends per term it wins (an election under load is no part of this).
fn appended_by_commands(before: (u64, u64), after: (u64, u64)) -> u64 {
    let elected = after.0.saturating_sub(before.0);
    after.1.saturating_sub(before.1).saturating_sub(elected)
}

/// Refused before proposing: `code`, the typed error, epoch 0.
fn refused_early<T: std::fmt::Debug>(
    result: Result<T, ClientError>,
    code: Code,
    error_code: pb::ErrorCode,
    field: &str,
) -> pb::ErrorDetail {
    let error = result.expect_err("must be refused");
    assert_eq!(error.code(), Some(code), "{error}");
    assert_eq!(error.field(), field, "{error}");
    let detail = error.detail().cloned().expect("typed detail");
    assert_eq!(detail.code, error_code as i32, "{error}");
    assert_eq!(
        detail.epoch, 0,
        "refused by apply (an entry was appended), not before proposing: {error}"
    );
    detail
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_commands_and_grant_replays_leave_the_log_index_unchanged() {
    let cluster = cluster().await;
    let client = cluster.client();
    // Setup (these append): a window pool with eu and us, a window pool
    // whose member eu is reclaimed (fenced until it registers again), and
    // a rate pool with eu frozen by hand.
    client
        .create_pool("w", &window_pool(1_000))
        .await
        .expect("create w");
    for region in ["eu", "us"] {
        client.register("w", region).await.expect("register w");
    }
    client
        .create_pool("fenced", &window_pool(1_000))
        .await
        .expect("create fenced");
    client.register("fenced", "eu").await.expect("register");
    let reclaimed = client.reclaim("fenced", "eu").await.expect("reclaim");
    assert_eq!(reclaimed.report.expect("report").incarnation, 2);
    client
        .create_pool(
            "r",
            &PoolConfig::Rate(RatePoolConfig::with_defaults(10_000)),
        )
        .await
        .expect("create r");
    client.register("r", "eu").await.expect("register r");
    client.freeze("r", "eu", true).await.expect("freeze");
    let first = client
        .grant("w", "eu", 1, "l-1", 100)
        .await
        .expect("grant l-1");
    let granted = first.grant.clone().expect("grant");
    assert_eq!(granted.granted_millitokens, 100);

    let (before, before_state) = leader_log(&client).await;

    // (Another Region's use of l-1 is its own grant now — lease ids are
    // kept per Region — so LEASE_ID_TAKEN is only an earlier incarnation's
    // id: crates/allocator/tests/remove.rs and window.rs.)
    // An unknown pool.
    refused_early(
        client.grant("nope", "eu", 1, "l-2", 5).await,
        Code::InvalidArgument,
        pb::ErrorCode::UnknownPool,
        "pool",
    );
    // A reclaimed member: fenced, at its old incarnation and at the new
    // one until it registers again.
    for incarnation in [1, 2] {
        let fenced = refused_early(
            client.grant("fenced", "eu", incarnation, "l-3", 5).await,
            Code::FailedPrecondition,
            pb::ErrorCode::Fenced,
            "incarnation",
        );
        assert_eq!(fenced.current_incarnation, 2);
    }
    // A frozen member's pool is a rate pool: no chunk grants from it.
    refused_early(
        client.grant("r", "eu", 1, "l-4", 5).await,
        Code::InvalidArgument,
        pb::ErrorCode::WrongPoolKind,
        "pool",
    );
    // The other commands' refusals.
    refused_early(
        client.register("nope", "eu").await,
        Code::InvalidArgument,
        pb::ErrorCode::UnknownPool,
        "pool",
    );
    refused_early(
        client
            .rebalance(pb::RebalanceRequest {
                pool: "r".into(),
                region: "eu".into(),
                incarnation: 9,
                demand_requests: 1,
                applied_share_millitokens_per_s: 0,
                applied_share_version: 0,
            })
            .await,
        Code::FailedPrecondition,
        pb::ErrorCode::Fenced,
        "incarnation",
    );
    refused_early(
        client
            .ack_share(pb::AckShareRequest {
                pool: "w".into(),
                region: "eu".into(),
                incarnation: 1,
                applied_share_millitokens_per_s: 0,
                applied_share_version: 0,
            })
            .await,
        Code::InvalidArgument,
        pb::ErrorCode::WrongPoolKind,
        "pool",
    );
    refused_early(
        client.health_report("mars", false).await,
        Code::InvalidArgument,
        pb::ErrorCode::UnknownRegion,
        "region",
    );
    refused_early(
        client.freeze("w", "eu", true).await,
        Code::InvalidArgument,
        pb::ErrorCode::WrongPoolKind,
        "pool",
    );
    refused_early(
        client.reclaim("w", "mars").await,
        Code::InvalidArgument,
        pb::ErrorCode::UnknownRegion,
        "region",
    );
    refused_early(
        client.create_pool("w", &window_pool(5)).await,
        Code::AlreadyExists,
        pb::ErrorCode::PoolExists,
        "pool",
    );
    let mut other_window = WindowPoolConfig {
        capacity_millitokens_per_window: 5,
        window_ms: 1_000,
        lease_ttl_ms: 1_000,
        regions: None,
    };
    refused_early(
        client
            .update_pool("w", &PoolConfig::Window(other_window.clone()))
            .await,
        Code::InvalidArgument,
        pb::ErrorCode::ImmutableField,
        "config.window_ms",
    );
    other_window.window_ms = HUGE_WINDOW_MS;
    // A replay of the recorded grant: its stored answer, at the current
    // epoch, answered from the state — no entry either.
    for want in [100, 7] {
        let replay = client
            .grant("w", "eu", 1, "l-1", want)
            .await
            .expect("replay");
        assert_eq!(
            replay.grant, first.grant,
            "a replay answers the stored grant"
        );
        assert!(replay.epoch >= first.epoch);
    }

    let (after, after_state) = leader_log(&client).await;
    assert_eq!(
        appended_by_commands(before, after),
        0,
        "a refusal or a replay appended a log entry: (term, index) {before:?} → {after:?}"
    );
    assert_eq!(after_state.state, before_state.state, "state changed");

    // The index does move for a valid command: one entry.
    let fresh = client
        .grant("w", "us", 1, "l-5", 10)
        .await
        .expect("valid grant");
    assert_eq!(fresh.grant.expect("grant").granted_millitokens, 10);
    let (moved, _) = leader_log(&client).await;
    assert_eq!(
        appended_by_commands(after, moved),
        1,
        "a valid grant: (term, index) {after:?} → {moved:?}"
    );
    // And so does the update refused above, once valid.
    client
        .update_pool("w", &PoolConfig::Window(other_window))
        .await
        .expect("valid update");
    let (updated, _) = leader_log(&client).await;
    assert_eq!(appended_by_commands(moved, updated), 1);
}
