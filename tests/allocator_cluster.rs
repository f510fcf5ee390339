//! The allocator cluster end to end: three real `leasehold allocator`
//! processes on loopback, each with its own sled directory, driven through
//! the leader-following client. Faults are real signals (SIGKILL, SIGSTOP /
//! SIGCONT). No timed assertions: every wait is a bounded wait for a
//! condition.

mod common_allocator;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common_allocator::*;
use leasehold_allocator::client::{AllocatorClient, ClientError, ClientSettings};
use leasehold_allocator::config::{PoolConfig, RatePoolConfig};
use leasehold_allocator::local_cluster::{ClusterSettings, LocalCluster, ProberTargets};
use leasehold_allocator::raft::network::OPENRAFT_REPLICATION_FILTER;
use leasehold_allocator::raft::node::add_node_bound;
use leasehold_proto::allocator::v1 as pb;

/// One planned Grant.
#[derive(Clone, Debug)]
struct Call {
    lease_id: String,
    pool: String,
    region: String,
    want: u64,
}

type Answer = (Call, Result<pb::GrantReply, String>);

/// Runs `plans` (one list of calls per task) concurrently through `client`;
/// `done` counts finished calls.
async fn run_plans(
    client: &AllocatorClient,
    plans: Vec<Vec<Call>>,
    done: Arc<AtomicUsize>,
) -> Vec<Vec<Answer>> {
    let mut tasks = Vec::new();
    for plan in plans {
        let client = client.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let mut answers = Vec::with_capacity(plan.len());
            for call in plan {
                let reply = client
                    .grant(&call.pool, &call.region, 1, &call.lease_id, call.want)
                    .await
                    .map_err(|e| e.to_string());
                done.fetch_add(1, Ordering::Relaxed);
                answers.push((call, reply));
            }
            answers
        }));
    }
    let mut all = Vec::new();
    for task in tasks {
        all.push(task.await.expect("grant task"));
    }
    all
}

fn shuffle<T>(items: &mut [T], rng: &mut Rng) {
    for i in (1..items.len()).rev() {
        let j = rng.between(0, i as u64) as usize;
        items.swap(i, j);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_grants_never_grant_a_lease_id_twice_and_retries_replay() {
    let _serial = serial().await;
    let (cluster, _) = cluster().await;
    let client = cluster.client();
    // A pool records at most 4,096 new lease ids per window: 10,000 grants
    // spread over four window pools. G is small enough that every pool
    // runs dry and later grants are clamped to 0.
    const CAPACITY: u64 = 400_000;
    let pools = ["w0", "w1", "w2", "w3"];
    for pool in pools {
        window_pool_with(&client, pool, CAPACITY, &["eu", "us"]).await;
    }
    let mut rng = Rng::new(0x5eed_0005);
    let mut seen = BTreeSet::new();
    let mut unique = Vec::new();
    while unique.len() < 10_000 {
        let lease_id = rng.lease_id();
        if !seen.insert(lease_id.clone()) {
            continue;
        }
        unique.push(Call {
            lease_id,
            pool: pools[rng.between(0, 3) as usize].to_string(),
            region: ["eu", "us"][rng.between(0, 1) as usize].to_string(),
            want: rng.between(1, 500),
        });
    }
    // A fifth of the lease ids are sent twice, the copy by another task, so
    // a retry may even overtake its original.
    const TASKS: usize = 48;
    let mut plans: Vec<Vec<Call>> = vec![Vec::new(); TASKS];
    for (i, call) in unique.iter().enumerate() {
        plans[i % TASKS].push(call.clone());
        if i % 5 == 0 {
            plans[(i + 1) % TASKS].push(call.clone());
        }
    }
    for plan in &mut plans {
        shuffle(plan, &mut rng);
    }
    let answers = run_plans(&client, plans, Arc::new(AtomicUsize::new(0))).await;

    let mut by_lease: BTreeMap<String, Vec<pb::GrantReply>> = BTreeMap::new();
    for (call, reply) in answers.into_iter().flatten() {
        let reply = reply.unwrap_or_else(|e| panic!("grant {} failed: {e}", call.lease_id));
        by_lease.entry(call.lease_id).or_default().push(reply);
    }
    assert_eq!(by_lease.len(), 10_000);
    assert_eq!(by_lease.values().map(Vec::len).sum::<usize>(), 12_000);
    for (lease_id, replies) in &by_lease {
        assert!(
            replies.iter().all(|r| r.grant == replies[0].grant),
            "retries of {lease_id} answered differently: {replies:?}"
        );
    }
    for pool in pools {
        let (_, window) = inspect_pool(&client, pool).await;
        let committed = records(&window);
        let sent: Vec<&Call> = unique.iter().filter(|c| c.pool == pool).collect();
        assert_eq!(
            committed.len(),
            sent.len(),
            "{pool}: one record per lease id"
        );
        let mut granted_by_replies = 0;
        for call in sent {
            let reply = by_lease[&call.lease_id][0].grant.clone().expect("grant");
            assert_eq!(
                committed[&call.lease_id],
                (call.region.clone(), reply.clone())
            );
            granted_by_replies += reply.granted_millitokens;
        }
        // Nothing granted twice: the pool's counter is the sum over lease ids.
        assert_eq!(
            window.granted_in_window_millitokens, granted_by_replies,
            "{pool}"
        );
        assert!(
            window.granted_in_window_millitokens <= CAPACITY,
            "{pool}: Σ granted {} > G {CAPACITY}",
            window.granted_in_window_millitokens
        );
        // The pool ran dry: later grants were clamped to 0.
        assert_eq!(window.granted_in_window_millitokens, CAPACITY, "{pool}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_leader_mid_stream_keeps_every_committed_grant_and_the_epoch_rises() {
    let _serial = serial().await;
    let (mut cluster, _) = cluster().await;
    let client = cluster.client();
    window_pool_with(&client, "k", 1 << 40, &["eu"]).await;
    // The leader as of now, not as the cluster came up: an election since
    // is no part of this test.
    let leader = cluster
        .wait_for_leader(&[], LEADER_WAIT)
        .await
        .expect("a leader");
    let mut rng = Rng::new(0x5eed_0009);
    const TASKS: usize = 16;
    const CALLS: usize = 2_000;
    let mut plans: Vec<Vec<Call>> = vec![Vec::new(); TASKS];
    for i in 0..CALLS {
        plans[i % TASKS].push(Call {
            lease_id: format!("k{i}-{}", rng.lease_id()),
            pool: "k".into(),
            region: "eu".into(),
            want: rng.between(1, 1_000),
        });
    }
    let done = Arc::new(AtomicUsize::new(0));
    let stream = {
        let client = client.clone();
        let done = done.clone();
        tokio::spawn(async move { run_plans(&client, plans, done).await })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while done.load(Ordering::Relaxed) < CALLS / 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let killed_at = done.load(Ordering::Relaxed);
    assert!(killed_at < CALLS, "the stream ended before the kill");
    cluster.kill(leader.node_id).expect("kill -9 the leader");
    let answers = stream.await.expect("stream");

    let new_leader = cluster
        .wait_for_leader(&[leader.node_id], LEADER_WAIT)
        .await
        .expect("a new leader");
    assert_ne!(new_leader.node_id, leader.node_id);
    assert!(new_leader.current_term > leader.current_term);

    let mut committed_replies = BTreeMap::new();
    let mut highest_epoch = 0;
    for task in &answers {
        // A client's epochs never go down.
        let epochs: Vec<u64> = task
            .iter()
            .map(|(call, r)| {
                r.as_ref()
                    .map(|r| r.epoch)
                    .unwrap_or_else(|e| panic!("{}: {e}", call.lease_id))
            })
            .collect();
        assert!(
            epochs.windows(2).all(|w| w[0] <= w[1]),
            "epochs went down: {epochs:?}"
        );
        for (call, reply) in task {
            let reply = reply.as_ref().expect("checked above");
            highest_epoch = highest_epoch.max(reply.epoch);
            committed_replies.insert(call.lease_id.clone(), reply.grant.clone().expect("grant"));
        }
    }
    assert!(
        highest_epoch > leader.current_term,
        "no reply from the new leader: highest epoch {highest_epoch}, old {}",
        leader.current_term
    );
    let (reply, window) = inspect_pool(&client, "k").await;
    assert!(reply.epoch > leader.current_term);
    let committed = records(&window);
    assert_eq!(committed.len(), CALLS, "one record per lease id, none lost");
    for (lease_id, grant) in &committed_replies {
        assert_eq!(
            &committed[lease_id].1, grant,
            "{lease_id} differs from its answer"
        );
    }
    // Lease ids answered before the kill: a retry on the new leader returns
    // the original answer, with the new epoch.
    let before_kill: Vec<&Vec<Answer>> = answers.iter().collect();
    let mut retried = 0;
    for task in before_kill {
        for (call, original) in task.iter().take(killed_at / TASKS / 2) {
            let original = original.as_ref().expect("ok");
            let again = client
                .grant(&call.pool, &call.region, 1, &call.lease_id, call.want)
                .await
                .expect("retry");
            assert_eq!(again.grant, original.grant, "{}", call.lease_id);
            assert!(again.epoch >= new_leader.current_term);
            retried += 1;
        }
    }
    assert!(retried >= 100, "only {retried} retries");
    let total: u64 = committed.values().map(|(_, g)| g.granted_millitokens).sum();
    assert_eq!(total, window.granted_in_window_millitokens);
}

/// Equal applied states, or a panic naming what differs (not the whole state).
fn assert_same_state(before: &pb::InspectReply, after: &pb::InspectReply) {
    if after.state == before.state {
        return;
    }
    let (b, a) = (
        before.state.clone().unwrap_or_default(),
        after.state.clone().unwrap_or_default(),
    );
    let mut differences = Vec::new();
    if (b.epoch, b.last_applied_time_ms) != (a.epoch, a.last_applied_time_ms) {
        differences.push(format!(
            "epoch/time {:?} -> {:?}",
            (b.epoch, b.last_applied_time_ms),
            (a.epoch, a.last_applied_time_ms)
        ));
    }
    for (pb_, pa) in b.pools.iter().zip(a.pools.iter()) {
        if pb_ != pa {
            let text = |p: &pb::PoolState| {
                let mut p = p.clone();
                if let Some(pb::pool_state::Kind::Window(w)) = &mut p.kind {
                    w.current_grants.clear();
                }
                format!("{p:?}")
            };
            differences.push(format!(
                "pool {}:\n  before {}\n  after  {}",
                pb_.pool,
                text(pb_),
                text(pa)
            ));
        }
    }
    if b.regions != a.regions {
        differences.push(format!("regions {:?} -> {:?}", b.regions, a.regions));
    }
    panic!(
        "the applied state changed across the restart (before: raft {:?}; after: raft {:?}):\n{}",
        before.raft,
        after.raft,
        differences.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_all_nodes_keeps_inspect_identical() {
    let _serial = serial().await;
    let (mut cluster, _) = cluster().await;
    let client = cluster.client();
    window_pool_with(&client, "rw", 1_000_000, &["eu", "us"]).await;
    for i in 0..200u64 {
        let region = if i % 2 == 0 { "eu" } else { "us" };
        client
            .grant("rw", region, 1, &format!("rw-{i}"), 1 + i * 37 % 900)
            .await
            .expect("grant");
    }
    let rate = PoolConfig::Rate(RatePoolConfig::with_defaults(10_000_000));
    client.create_pool("rr", &rate).await.expect("rate pool");
    let mut versions = BTreeMap::new();
    for region in ["eu", "us", "ap"] {
        client.register("rr", region).await.expect("register");
        versions.insert(region, 0u64);
    }
    for round in 0..3u64 {
        for (region, demand) in [("eu", 7_200), ("us", 3_600), ("ap", 1_200 * (round + 1))] {
            let reply = client
                .rebalance(pb::RebalanceRequest {
                    pool: "rr".into(),
                    region: region.into(),
                    incarnation: 1,
                    demand_requests: demand,
                    applied_share_millitokens_per_s: 0,
                    applied_share_version: versions[region],
                })
                .await
                .expect("rebalance");
            let share = reply.share.expect("share");
            versions.insert(region, share.share_version);
            client
                .ack_share(pb::AckShareRequest {
                    pool: "rr".into(),
                    region: region.into(),
                    incarnation: 1,
                    applied_share_millitokens_per_s: share.share_millitokens_per_s,
                    applied_share_version: share.share_version,
                })
                .await
                .expect("ack");
        }
    }
    client.freeze("rr", "ap", true).await.expect("freeze");
    assert!(
        client
            .health_report("us", false)
            .await
            .expect("report")
            .committed
    );
    assert!(
        !client
            .health_report("us", false)
            .await
            .expect("report")
            .committed
    );
    let reclaimed = client.reclaim("rr", "eu").await.expect("reclaim");
    assert_eq!(reclaimed.report.expect("report").incarnation, 2);

    let everything = pb::InspectRequest {
        include_grants: true,
        ..Default::default()
    };
    let before = client.inspect(everything.clone()).await.expect("inspect");
    assert!(!before.stale);
    for id in cluster.ids() {
        cluster.kill(id).expect("kill -9");
    }
    cluster.start_all().expect("restart without --init");
    let leader = cluster
        .wait_for_leader(&[], LEADER_WAIT)
        .await
        .expect("leader after restart");
    let after = cluster
        .client()
        .inspect(everything.clone())
        .await
        .expect("inspect");
    assert_same_state(&before, &after);
    // A 0.9 leader restarted from disk may resume its own term: the epoch
    // never goes down, and it rises when another node wins.
    assert!(leader.current_term >= before.raft.as_ref().expect("raft").current_term);
    assert!(after.epoch >= before.epoch);

    // Every replica converges on the same state (stale reads, node by node).
    for id in cluster.ids() {
        let node = AllocatorClient::connect(&[cluster.address(id)]).expect("client");
        let request = pb::InspectRequest {
            allow_stale: true,
            ..everything.clone()
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let view = node.inspect(request.clone()).await.expect("stale inspect");
            if view.state == before.state {
                break;
            }
            if Instant::now() > deadline {
                assert_same_state(&before, &view);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Sends `count` grants of 100 straight to `address` (no leader
/// following); each answer as the node gave it.
async fn grants_straight_to(
    address: &str,
    prefix: &str,
    count: usize,
) -> Vec<tokio::task::JoinHandle<Result<pb::GrantReply, tonic::Status>>> {
    let mut tasks = Vec::new();
    for i in 0..count {
        let mut raw = raw_client(address).await;
        let lease_id = format!("{prefix}-{i}");
        tasks.push(tokio::spawn(async move {
            let request = pb::GrantRequest {
                pool: "f".into(),
                region: "eu".into(),
                incarnation: 1,
                lease_id,
                want_millitokens: 100,
            };
            match tokio::time::timeout(Duration::from_secs(30), raw.grant(request)).await {
                Ok(answer) => answer.map(tonic::Response::into_inner),
                Err(_) => Err(tonic::Status::deadline_exceeded("no answer in 30 s")),
            }
        }));
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_old_leader_cannot_hand_out_room_it_did_not_commit() {
    let _serial = serial().await;
    let (mut cluster, _) = cluster().await;
    let client = cluster.client();
    const CAPACITY: u64 = 1_000;
    window_pool_with(&client, "f", CAPACITY, &["eu"]).await;
    // The leader and term as of now: an election since the cluster came up
    // (a node slow to start, a loaded machine) is no part of this test.
    let old = cluster
        .wait_for_leader(&[], LEADER_WAIT)
        .await
        .expect("a leader");
    for i in 0..5 {
        let reply = client
            .grant("f", "eu", 1, &format!("before-{i}"), 100)
            .await
            .expect("grant");
        assert_eq!(reply.grant.expect("grant").granted_millitokens, 100);
        assert_eq!(reply.epoch, old.current_term);
    }
    cluster.freeze(old.node_id).expect("SIGSTOP the leader");
    let new = cluster
        .wait_for_leader(&[old.node_id], LEADER_WAIT)
        .await
        .expect("the others elect");
    assert!(new.current_term > old.current_term);
    // The new leader hands out the rest of the window.
    let others = cluster.client_except(&[old.node_id]);
    let mut granted_by_new = 0;
    for i in 0..8 {
        let reply = others
            .grant("f", "eu", 1, &format!("after-{i}"), 100)
            .await
            .expect("grant");
        assert!(reply.epoch >= new.current_term);
        granted_by_new += reply.grant.expect("grant").granted_millitokens;
    }
    assert_eq!(granted_by_new, 500);

    // Wake the old leader: whatever it believes, it cannot hand out room.
    cluster.thaw(old.node_id).expect("SIGCONT the old leader");
    let old_address = cluster.address(old.node_id);
    for task in grants_straight_to(&old_address, "to-old", 8).await {
        match task.await.expect("task") {
            Ok(reply) => panic!("the old leader handed out {reply:?}"),
            // NOT_LEADER (it read the new term first), or unconfirmed.
            Err(status) => assert!(
                matches!(
                    status.code(),
                    tonic::Code::FailedPrecondition | tonic::Code::Unavailable
                ),
                "unexpected refusal from the old leader: {status:?}"
            ),
        }
    }
    // The old leader learns of the new term and becomes a follower.
    wait_until_follower(&old_address, new.current_term).await;

    // An isolated leader (both followers frozen) still believes it leads:
    // its proposals cannot commit, so it answers "unconfirmed" within its
    // write deadline, refuses linearizable reads and flags stale ones.
    let new_address = cluster.address(new.node_id);
    let followers: Vec<_> = cluster
        .ids()
        .into_iter()
        .filter(|id| *id != new.node_id)
        .collect();
    for id in &followers {
        cluster.freeze(*id).expect("SIGSTOP a follower");
    }
    for task in grants_straight_to(&new_address, "isolated", 4).await {
        let status = task
            .await
            .expect("task")
            .expect_err("an isolated leader cannot grant");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        let detail = leasehold_allocator::wire::error_detail(&status).expect("detail");
        assert_eq!(detail.code, pb::ErrorCode::CommitUnconfirmed as i32);
    }
    let mut raw = raw_client(&new_address).await;
    let linearizable = raw.inspect(pb::InspectRequest::default()).await;
    assert_eq!(
        linearizable
            .expect_err("no quorum, no linearizable read")
            .code(),
        tonic::Code::Unavailable
    );
    let stale = raw
        .inspect(pb::InspectRequest {
            pool: "f".into(),
            allow_stale: true,
            ..Default::default()
        })
        .await
        .expect("stale inspect")
        .into_inner();
    assert!(stale.stale);
    for id in &followers {
        cluster.thaw(*id).expect("SIGCONT a follower");
    }

    let (reply, window) = inspect_pool(&cluster.client(), "f").await;
    assert!(reply.epoch >= new.current_term);
    let committed = records(&window);
    assert_eq!(
        window.granted_in_window_millitokens, CAPACITY,
        "Σ granted = G, never above"
    );
    assert!(
        committed.keys().all(|id| !id.starts_with("to-old-")),
        "a request to the old leader was committed"
    );
    // Unconfirmed proposals may commit later: the window was spent, so they
    // got nothing.
    assert!(committed
        .iter()
        .filter(|(id, _)| id.starts_with("isolated-"))
        .all(|(_, (_, grant))| grant.granted_millitokens == 0));
    // A follower redirects. The thawed nodes may still hold an election, so
    // the follower is one confirmed as following the leader at its term, and
    // its answer counts only if that still holds after it answered.
    let deadline = Instant::now() + Duration::from_secs(60);
    for attempt in 1.. {
        let (follower, term) = confirmed_follower(&cluster, deadline).await;
        let follower_address = cluster.address(follower);
        let answer = grants_straight_to(&follower_address, &format!("late-{attempt}"), 1)
            .await
            .pop()
            .expect("one grant")
            .await
            .expect("task");
        let after = stale_raft(&follower_address).await;
        if after.role != "follower" || after.current_term != term {
            assert!(
                Instant::now() < deadline,
                "elections kept moving the cluster: {after:?}"
            );
            continue; // an election came between: the answer proves nothing
        }
        let status = answer.expect_err("a follower does not grant");
        assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        assert!(
            status.metadata().get("x-leasehold-leader").is_some(),
            "{status:?}"
        );
        break;
    }
}

/// The node's own raft status (stale Inspect of that node alone).
async fn stale_raft(address: &str) -> pb::RaftStatus {
    let mut raw = raw_client(address).await;
    let request = pb::InspectRequest {
        allow_stale: true,
        ..Default::default()
    };
    match tokio::time::timeout(Duration::from_secs(30), raw.inspect(request)).await {
        Ok(Ok(reply)) => reply.into_inner().raft.expect("raft"),
        Ok(Err(status)) => panic!("stale inspect of {address}: {status:?}"),
        Err(_) => panic!("stale inspect of {address}: no answer in 30 s"),
    }
}

/// Waits (until `deadline`) for a node that is a follower of the confirmed
/// leader at the leader's term; returns it and that term.
async fn confirmed_follower(cluster: &LocalCluster, deadline: Instant) -> (u64, u64) {
    loop {
        let leader = cluster
            .wait_for_leader(&[], LEADER_WAIT)
            .await
            .expect("a leader");
        for id in cluster.ids() {
            if id == leader.node_id {
                continue;
            }
            let raft = stale_raft(&cluster.address(id)).await;
            if raft.role == "follower"
                && raft.leader_id == leader.node_id
                && raft.current_term == leader.current_term
            {
                return (id, raft.current_term);
            }
        }
        assert!(
            Instant::now() < deadline,
            "no node settled as a follower of leader {} (term {})",
            leader.node_id,
            leader.current_term
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits (bounded) until the node at `address` is a follower at `term` or later.
async fn wait_until_follower(address: &str, term: u64) {
    let view = AllocatorClient::connect(&[address]).expect("client");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let reply = view
            .inspect(pb::InspectRequest {
                allow_stale: true,
                ..Default::default()
            })
            .await
            .expect("stale inspect");
        let raft = reply.raft.expect("raft");
        if raft.current_term >= term && raft.role != "leader" {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{address} never stepped down: {raft:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn expect_refused(
    result: Result<impl std::fmt::Debug, ClientError>,
    code: tonic::Code,
    field: &str,
) -> pb::ErrorDetail {
    let error = result.expect_err("must be refused");
    assert_eq!(error.code(), Some(code), "{error}");
    assert_eq!(error.field(), field, "{error}");
    assert!(
        error.to_string().contains(field),
        "message names the field: {error}"
    );
    let detail = error.detail().cloned().expect("typed detail");
    assert_eq!(detail.epoch, 0, "refused before proposing");
    detail
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_naming_the_field_and_appends_nothing() {
    let _serial = serial().await;
    let (cluster, _) = cluster().await;
    let client = cluster.client();
    window_pool_with(&client, "b", 1_000, &["eu"]).await;
    let index = |reply: &pb::InspectReply| {
        let raft = reply.raft.clone().expect("raft");
        (raft.node_id, raft.current_term, raft.last_log_index)
    };
    let before = client
        .inspect(pb::InspectRequest::default())
        .await
        .expect("inspect");
    use tonic::Code::{FailedPrecondition, InvalidArgument};

    let unknown = expect_refused(
        client.grant("nope", "eu", 1, "l-1", 5).await,
        InvalidArgument,
        "pool",
    );
    assert_eq!(unknown.code, pb::ErrorCode::UnknownPool as i32);
    expect_refused(
        client.grant("b", "eu", 1, "l-1", 0).await,
        InvalidArgument,
        "want_millitokens",
    );
    expect_refused(
        client.grant("b", "eu", 1, "l-1", (1 << 40) + 1).await,
        InvalidArgument,
        "want_millitokens",
    );
    expect_refused(
        client.grant("b", "eu", 1, "", 5).await,
        InvalidArgument,
        "lease_id",
    );
    expect_refused(
        client.grant("b", "eu", 1, &"x".repeat(65), 5).await,
        InvalidArgument,
        "lease_id",
    );
    expect_refused(
        client.grant("b", "eu", 1, "bad lease", 5).await,
        InvalidArgument,
        "lease_id",
    );
    expect_refused(
        client.grant("b", "mars", 1, "l-1", 5).await,
        InvalidArgument,
        "region",
    );
    let fenced = expect_refused(
        client.grant("b", "eu", 7, "l-1", 5).await,
        FailedPrecondition,
        "incarnation",
    );
    assert_eq!(fenced.code, pb::ErrorCode::Fenced as i32);
    assert_eq!(fenced.current_incarnation, 1);
    expect_refused(
        client.create_pool("bad", &window_pool(1_000, 0)).await,
        InvalidArgument,
        "config.window_ms",
    );
    let mut rate = RatePoolConfig::with_defaults(1_000);
    rate.burst_millitokens = 1;
    expect_refused(
        client.create_pool("bad", &PoolConfig::Rate(rate)).await,
        InvalidArgument,
        "config.burst_millitokens",
    );
    expect_refused(
        client
            .create_pool_raw(pb::CreatePoolRequest {
                pool: "bad".into(),
                config: None,
            })
            .await,
        InvalidArgument,
        "config.kind",
    );
    expect_refused(
        client
            .create_pool("Bad Id", &window_pool(1_000, 1_000))
            .await,
        InvalidArgument,
        "pool",
    );
    expect_refused(
        client.update_pool("b", &window_pool(1_000, 5)).await,
        InvalidArgument,
        "config.window_ms",
    );

    let after = client
        .inspect(pb::InspectRequest::default())
        .await
        .expect("inspect");
    // Only a new leader may have appended meanwhile (one blank entry per
    // term it won, under a load that delays heartbeats); a refusal never.
    let (elected, appended) = (
        index(&after).1.saturating_sub(index(&before).1),
        index(&after).2.saturating_sub(index(&before).2),
    );
    assert!(
        appended <= elected,
        "a refused request appended a log entry: {:?} → {:?}",
        index(&before),
        index(&after)
    );
    assert_eq!(after.state, before.state);
    // The index does move for a valid command.
    client
        .grant("b", "eu", 1, "l-1", 5)
        .await
        .expect("valid grant");
    let moved = client
        .inspect(pb::InspectRequest::default())
        .await
        .expect("inspect");
    let elected_since = index(&moved).1.saturating_sub(index(&after).1);
    let grew = index(&moved).2.saturating_sub(index(&after).2);
    assert!(
        (1..=1 + elected_since).contains(&grew),
        "a valid grant appended {grew} entries ({elected_since} elections)"
    );

    // The CLI against the same cluster: any node, the leader followed.
    let allocators = cluster.addresses().join(",");
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(args)
            .args(["--allocator", &allocators])
            .output()
            .expect("run leasehold");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, text, err) = cli(&["pool", "list"]);
    assert!(ok, "{err}");
    assert!(
        text.contains("POOL")
            && text
                .lines()
                .any(|l| l.starts_with("b ") && l.contains("window")),
        "{text}"
    );
    let (ok, text, err) = cli(&["grant", "list", "b", "--json"]);
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(json["data"][0]["lease_id"], "l-1");
    assert_eq!(json["data"][0]["granted_millitokens"], 5);
    let (ok, text, err) = cli(&["region", "list"]);
    assert!(ok, "{err}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("eu ") && l.contains("unknown") && l.contains('b')),
        "{text}"
    );
    let (ok, _, err) = cli(&["pool", "show", "nope"]);
    assert!(!ok);
    assert!(err.contains("pool"), "{err}");
}

/// A fake agent `/health` endpoint that always serves; aborting its task
/// makes probes fail to connect. The counter counts the probes answered.
async fn fake_health_endpoint() -> (String, tokio::task::JoinHandle<()>, Arc<AtomicUsize>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address").to_string();
    let answered = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&answered);
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let mut buffer = [0u8; 1024];
                let _ = socket.read(&mut buffer).await;
                let written = socket
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n{\"serving\":true,\"region\":\"eu\"}")
                    .await;
                if written.is_ok() {
                    counter.fetch_add(1, Ordering::SeqCst);
                }
            });
        }
    });
    (address, task, answered)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prober_commits_a_verdict_only_when_it_changes() {
    let _serial = serial().await;
    let (address, endpoint, probes_answered) = fake_health_endpoint().await;
    let settings = ClusterSettings {
        prober: Some(ProberTargets {
            interval_ms: 100,
            failures_to_unhealthy: 2,
            targets: vec![("eu".into(), format!("http://{address}/health"))],
        }),
        ..ClusterSettings::default()
    };
    let (cluster, _) = cluster_with(settings).await;
    let client = cluster.client();
    window_pool_with(&client, "p", 1_000, &["eu"]).await;
    let health = |reply: &pb::InspectReply| {
        reply
            .state
            .as_ref()
            .and_then(|s| s.regions.iter().find(|r| r.region == "eu"))
            .map(|r| r.health)
    };
    let wait_for = |want: pb::Health| {
        let client = client.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let reply = client
                    .inspect(pb::InspectRequest::default())
                    .await
                    .expect("inspect");
                if health(&reply) == Some(want as i32) {
                    return reply;
                }
                assert!(Instant::now() < deadline, "verdict never became {want:?}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let verdict_at = |reply: &pb::InspectReply| {
        reply
            .state
            .as_ref()
            .and_then(|s| s.regions.iter().find(|r| r.region == "eu"))
            .and_then(|r| r.verdict_at_ms)
    };
    let healthy = wait_for(pb::Health::Healthy).await;
    let first_verdict_at = verdict_at(&healthy).expect("the verdict's time");
    // Steady health commits nothing more: several probe rounds (counted as
    // the endpoint answers them) after the verdict is visible, no further
    // verdict was committed — a recommitted one would carry a later
    // allocator time.
    let rounds_from = probes_answered.load(Ordering::SeqCst);
    let deadline = Instant::now() + Duration::from_secs(30);
    while probes_answered.load(Ordering::SeqCst) < rounds_from + 5 {
        assert!(
            Instant::now() < deadline,
            "the prober stopped probing after the verdict"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let later = client
        .inspect(pb::InspectRequest::default())
        .await
        .expect("inspect");
    assert_eq!(health(&later), Some(pb::Health::Healthy as i32));
    assert_eq!(
        verdict_at(&later),
        Some(first_verdict_at),
        "a steady verdict was committed again"
    );
    // Nothing else was committed either, as long as no election (which
    // appends an entry of its own) came between: same leader, same term.
    let (raft_before, raft_after) = (
        healthy.raft.as_ref().expect("raft"),
        later.raft.as_ref().expect("raft"),
    );
    if (raft_after.node_id, raft_after.current_term)
        == (raft_before.node_id, raft_before.current_term)
    {
        assert_eq!(raft_after.last_log_index, raft_before.last_log_index);
    }
    endpoint.abort();
    let _ = endpoint.await;
    wait_for(pb::Health::Unhealthy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_disk_catches_up_from_a_snapshot() {
    let _serial = serial().await;
    let settings = ClusterSettings {
        snapshot_every_entries: 100,
        logs_kept_after_snapshot: 10,
        ..ClusterSettings::default()
    };
    let (mut cluster, leader) = cluster_with(settings).await;
    let client = cluster.client();
    window_pool_with(&client, "s", 1 << 40, &["eu"]).await;
    let lost = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader.node_id)
        .expect("a follower");
    cluster.kill(lost).expect("kill -9 a follower");
    cluster.wipe(lost).expect("lose its disk");
    // Far more entries than the leader keeps behind its snapshots.
    let mut tasks = Vec::new();
    for task in 0..8 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..50 {
                client
                    .grant("s", "eu", 1, &format!("s{task}-{i}"), 1)
                    .await
                    .expect("grant");
            }
        }));
    }
    for task in tasks {
        task.await.expect("grants");
    }
    let everything = pb::InspectRequest {
        include_grants: true,
        ..Default::default()
    };
    let reference = client.inspect(everything.clone()).await.expect("inspect");
    cluster
        .start(lost, false)
        .expect("restart on an empty disk, no --init");
    let view = AllocatorClient::connect(&[cluster.address(lost)]).expect("client");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let stale = view
            .inspect(pb::InspectRequest {
                allow_stale: true,
                ..everything.clone()
            })
            .await;
        if let Ok(reply) = &stale {
            if reply.state == reference.state {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "node {lost} never caught up: {:?}\n{}",
            stale.map(|r| r.raft),
            cluster.log(lost)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_allocator_prints_rates_latencies_and_ratios() {
    let _serial = serial().await;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "bench",
            "allocator",
            "--seconds",
            "1",
            "--baseline-seconds",
            "1",
        ])
        .args(["--concurrency", "16", "--connections", "2", "--pools", "2"])
        .output()
        .await
        .expect("run the bench");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("committed commands/s"), "{text}");
    assert!(text.contains("p99"), "{text}");
    assert!(
        text.contains("ratio vs raw sled flush per command:"),
        "{text}"
    );
    assert!(!text.contains("errors, first"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_as_a_voter_catches_up_and_a_removed_follower_leaves_the_group() {
    let _serial = serial().await;
    let (mut cluster, _) = cluster().await;
    let originals = cluster.ids();
    let client = cluster.client();
    window_pool_with(&client, "m", 1 << 40, &["eu"]).await;
    let mut answers: BTreeMap<String, pb::Grant> = BTreeMap::new();
    for i in 0..40u64 {
        let lease_id = format!("m-before-{i}");
        let reply = client
            .grant("m", "eu", 1, &lease_id, 1 + i)
            .await
            .expect("grant");
        answers.insert(lease_id, reply.grant.expect("grant"));
    }

    // A fourth process whose [peers] lists all four, started without
    // --init: it is not the lowest id, so it never initializes a cluster of
    // its own; it waits, empty, to be added.
    let joiner = cluster.add_joiner().expect("4th node's config");
    assert!(!originals.contains(&joiner));
    cluster.start(joiner, false).expect("start, no --init");
    let joiner_address = cluster.address(joiner);
    let joiner_view = AllocatorClient::connect(&[joiner_address.as_str()]).expect("client");
    let stale = |include_grants| pb::InspectRequest {
        include_grants,
        allow_stale: true,
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    let pristine = loop {
        match joiner_view.inspect(stale(false)).await {
            Ok(reply) => break reply,
            Err(error) => assert!(
                Instant::now() < deadline,
                "node {joiner} never served: {error}\n{}",
                cluster.log(joiner)
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let raft = pristine.raft.expect("raft");
    assert!(
        raft.voters.is_empty() && raft.last_log_index == 0,
        "the joiner initialized a cluster of its own: {raft:?}"
    );

    let added = client
        .add_node(joiner, &joiner_address, true)
        .await
        .expect("AddNode as a voter");
    let mut voters = originals.clone();
    voters.push(joiner);
    assert_eq!(added.voters, voters);
    assert!(added
        .nodes
        .iter()
        .any(|n| n.node_id == joiner && n.address == joiner_address));

    // The joiner converges on the leader's applied state (stale reads).
    let everything = pb::InspectRequest {
        include_grants: true,
        ..Default::default()
    };
    let reference = client.inspect(everything.clone()).await.expect("inspect");
    let reference_raft = reference.raft.clone().expect("raft");
    assert_eq!(reference_raft.voters, voters);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let view = joiner_view
            .inspect(stale(true))
            .await
            .expect("stale inspect");
        let raft = view.raft.clone().expect("raft");
        if raft.last_applied_index >= reference_raft.last_applied_index
            && view.state == reference.state
        {
            assert_eq!(raft.voters, voters);
            assert_eq!(raft.role, "follower");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {joiner} never caught up: {raft:?} vs leader {reference_raft:?}\n{}",
            cluster.log(joiner)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Remove one of the original followers.
    let leader = client
        .inspect(pb::InspectRequest::default())
        .await
        .expect("inspect")
        .raft
        .expect("raft")
        .node_id;
    let removed = originals
        .iter()
        .copied()
        .find(|id| *id != leader)
        .expect("a follower");
    let change = client.remove_node(removed).await.expect("RemoveNode");
    let remaining: Vec<u64> = voters.iter().copied().filter(|id| *id != removed).collect();
    assert_eq!(change.voters, remaining);
    assert!(change.nodes.iter().all(|n| n.node_id != removed));

    // The group of the other three (the joiner among them) commits.
    let after = cluster.client_except(&[removed]);
    for i in 0..40u64 {
        let lease_id = format!("m-after-{i}");
        let reply = after
            .grant("m", "eu", 1, &lease_id, 100 + i)
            .await
            .expect("grant after RemoveNode");
        let grant = reply.grant.expect("grant");
        assert_eq!(grant.granted_millitokens, 100 + i, "{lease_id}");
        answers.insert(lease_id, grant);
    }
    // Retries of the first grants replay their answers.
    for i in 0..40u64 {
        let lease_id = format!("m-before-{i}");
        let again = after
            .grant("m", "eu", 1, &lease_id, 1 + i)
            .await
            .expect("retry");
        assert_eq!(
            again.grant.as_ref(),
            Some(&answers[&lease_id]),
            "{lease_id}"
        );
    }

    let (reply, window) = inspect_pool(&after, "m").await;
    let raft = reply.raft.expect("raft");
    assert_eq!(raft.voters, remaining);
    assert!(
        raft.nodes.iter().all(|n| n.node_id != removed),
        "{removed} still in the membership: {raft:?}"
    );
    let committed = records(&window);
    assert_eq!(committed.len(), answers.len(), "one record per lease id");
    for (lease_id, grant) in &answers {
        assert_eq!(&committed[lease_id].1, grant, "{lease_id}");
    }
    // Nothing granted twice: the pool's counter is the sum over lease ids.
    let total: u64 = answers.values().map(|g| g.granted_millitokens).sum();
    assert_eq!(window.granted_in_window_millitokens, total);

    // The joiner, a voter now, also learns of the removal.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let raft = joiner_view
            .inspect(stale(false))
            .await
            .expect("stale inspect")
            .raft
            .expect("raft");
        if raft.voters == remaining && raft.nodes.iter().all(|n| n.node_id != removed) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {joiner} still sees {removed}: {raft:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---- membership (issue 13 items 2 and 3) ---------------------------------

/// A client whose attempts outlast the slowest AddNode (the nodes' bound).
fn membership_client(cluster: &LocalCluster, settings: &ClusterSettings) -> AllocatorClient {
    let bound = add_node_bound(Duration::from_millis(settings.write_timeout_ms));
    let client_settings = ClientSettings {
        call_timeout: bound + Duration::from_secs(5),
        leader_wait: bound + LEADER_WAIT,
        ..ClientSettings::default()
    };
    AllocatorClient::with_settings(&cluster.addresses(), client_settings).expect("client")
}

/// The leader's raft status (a linearizable Inspect).
async fn raft_status(client: &AllocatorClient) -> pb::RaftStatus {
    client
        .inspect(pb::InspectRequest::default())
        .await
        .expect("inspect")
        .raft
        .expect("raft")
}

/// A loopback address nothing listens on (bound, then released).
fn dead_address() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let address = listener.local_addr().expect("address");
    drop(listener);
    address.to_string()
}

fn node_ids(raft: &pb::RaftStatus) -> Vec<u64> {
    raft.nodes.iter().map(|n| n.node_id).collect()
}

/// Starts `id` (no --init) and waits until it serves a stale Inspect.
async fn start_pristine_joiner(cluster: &mut LocalCluster, id: u64) -> AllocatorClient {
    cluster.start(id, false).expect("start, no --init");
    let view = AllocatorClient::connect(&[cluster.address(id).as_str()]).expect("client");
    let deadline = Instant::now() + LEADER_WAIT;
    loop {
        let stale = view
            .inspect(pb::InspectRequest {
                allow_stale: true,
                ..Default::default()
            })
            .await;
        match stale {
            Ok(reply) => {
                let raft = reply.raft.expect("raft");
                assert!(raft.voters.is_empty(), "{id} initialized itself: {raft:?}");
                return view;
            }
            Err(error) => assert!(
                Instant::now() < deadline,
                "node {id} never served: {error}\n{}",
                cluster.log(id)
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Issue 13 item 2: on a cluster of one, AddNode of a voter (or a learner)
/// at a dead address is refused by the probe, within the documented bound,
/// and the cluster keeps serving. Item 3: ids out of range, a duplicate id,
/// an address in use (the leader's own), a non-member's or the last voter's
/// removal are refused — and nothing is appended to the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_one_refuses_a_dead_joiner_and_nonsense_and_keeps_serving() {
    let _serial = serial().await;
    let settings = ClusterSettings {
        nodes: 1,
        ..ClusterSettings::default()
    };
    let (cluster, leader) = cluster_with(settings.clone()).await;
    assert_eq!(leader.voters, vec![1]);
    let client = membership_client(&cluster, &settings);
    window_pool_with(&client, "one", 1 << 40, &["eu"]).await;
    let before = raft_status(&client).await;

    let bound = add_node_bound(Duration::from_millis(settings.write_timeout_ms));
    let dead = dead_address();
    for voter in [true, false] {
        let started = Instant::now();
        let refused = client.add_node(42, &dead, voter).await;
        let took = started.elapsed();
        let detail = expect_refused(refused, tonic::Code::FailedPrecondition, "address");
        assert_eq!(detail.code, pb::ErrorCode::Membership as i32);
        assert!(
            detail.message.contains("did not answer as node 42"),
            "{}",
            detail.message
        );
        assert!(took <= bound, "refused after {took:?}, bound {bound:?}");
    }
    // Right after: the cluster of one still commits.
    client
        .create_pool("after-dead-joiner", &window_pool(1_000, HUGE_WINDOW_MS))
        .await
        .expect("CreatePool right after the refusal");
    let granted = client
        .grant("one", "eu", 1, "right-after", 5)
        .await
        .expect("Grant right after the refusal");
    assert_eq!(granted.grant.expect("grant").granted_millitokens, 5);
    let before = {
        let now = raft_status(&client).await;
        assert!(now.last_log_index > before.last_log_index);
        now
    };

    let leader_address = cluster.address(1);
    let invalid = tonic::Code::InvalidArgument;
    let precondition = tonic::Code::FailedPrecondition;
    for node_id in [0, (1 << 32) + 1, u64::MAX] {
        expect_refused(
            client.add_node(node_id, &dead, true).await,
            invalid,
            "node_id",
        );
    }
    let detail = expect_refused(
        client.add_node(1, &dead, true).await,
        precondition,
        "node_id",
    );
    assert!(
        detail.message.contains("already a voter"),
        "{}",
        detail.message
    );
    let detail = expect_refused(
        client.add_node(7, &leader_address, true).await,
        precondition,
        "address",
    );
    assert!(
        detail.message.contains("in use by node 1"),
        "{}",
        detail.message
    );
    for address in ["", "no-port", "host:0", "0.0.0.0:7301", "a b:1"] {
        expect_refused(client.add_node(7, address, false).await, invalid, "address");
    }
    for node_id in [0, u64::MAX] {
        expect_refused(client.remove_node(node_id).await, invalid, "node_id");
    }
    let detail = expect_refused(client.remove_node(77).await, precondition, "node_id");
    assert!(
        detail.message.contains("not a member"),
        "{}",
        detail.message
    );
    let detail = expect_refused(client.remove_node(1).await, precondition, "node_id");
    assert!(detail.message.contains("last voter"), "{}", detail.message);

    let after = raft_status(&client).await;
    assert_eq!(
        after.last_log_index, before.last_log_index,
        "a refused membership request appended an entry"
    );
    assert_eq!(after.voters, vec![1]);
    assert_eq!(node_ids(&after), vec![1]);
    client
        .grant("one", "eu", 1, "at-the-end", 7)
        .await
        .expect("Grant at the end");
}

/// A live node: refused at its address under another id, added as a
/// learner, refused as a duplicate, promoted (caught up first), serving as
/// a voter; then removed, and the cluster of one commits without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_learner_is_promoted_after_catching_up_and_removed_again() {
    let _serial = serial().await;
    let settings = ClusterSettings {
        nodes: 1,
        ..ClusterSettings::default()
    };
    let (mut cluster, _) = cluster_with(settings.clone()).await;
    let client = membership_client(&cluster, &settings);
    window_pool_with(&client, "l", 1 << 40, &["eu"]).await;
    for i in 0..30u64 {
        client
            .grant("l", "eu", 1, &format!("l-before-{i}"), 1 + i)
            .await
            .expect("grant");
    }
    let joiner = cluster.add_joiner().expect("2nd node's config");
    let joiner_address = cluster.address(joiner);
    let joiner_view = start_pristine_joiner(&mut cluster, joiner).await;
    let precondition = tonic::Code::FailedPrecondition;

    let detail = expect_refused(
        client.add_node(joiner + 10, &joiner_address, true).await,
        precondition,
        "address",
    );
    assert!(
        detail
            .message
            .contains(&format!("answered as node {joiner}")),
        "{}",
        detail.message
    );

    let learner = client
        .add_node(joiner, &joiner_address, false)
        .await
        .expect("AddNode as a learner");
    assert_eq!(learner.voters, vec![1]);
    assert!(learner
        .nodes
        .iter()
        .any(|n| n.node_id == joiner && n.address == joiner_address));
    let detail = expect_refused(
        client.add_node(joiner, &joiner_address, false).await,
        precondition,
        "node_id",
    );
    assert!(
        detail.message.contains("already a learner"),
        "{}",
        detail.message
    );
    expect_refused(
        client.add_node(joiner, &dead_address(), true).await,
        precondition,
        "node_id",
    );

    let promoted = client
        .add_node(joiner, &joiner_address, true)
        .await
        .expect("promote the learner");
    assert_eq!(promoted.voters, vec![1, joiner]);
    let detail = expect_refused(
        client.add_node(joiner, &joiner_address, true).await,
        precondition,
        "node_id",
    );
    assert!(
        detail.message.contains("already a voter"),
        "{}",
        detail.message
    );

    // Both voters commit (a majority of two is both); the joiner has the
    // whole state.
    for i in 0..10u64 {
        client
            .grant("l", "eu", 1, &format!("l-two-{i}"), 100 + i)
            .await
            .expect("grant with two voters");
    }
    let everything = pb::InspectRequest {
        include_grants: true,
        ..Default::default()
    };
    let reference = client.inspect(everything.clone()).await.expect("inspect");
    let deadline = Instant::now() + LEADER_WAIT;
    loop {
        let view = joiner_view
            .inspect(pb::InspectRequest {
                allow_stale: true,
                ..everything.clone()
            })
            .await
            .expect("stale inspect");
        let raft = view.raft.clone().expect("raft");
        if view.state == reference.state && raft.voters == vec![1, joiner] {
            assert_eq!(raft.role, "follower");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node {joiner} never caught up: {raft:?}\n{}",
            cluster.log(joiner)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let removed = client.remove_node(joiner).await.expect("RemoveNode");
    assert_eq!(removed.voters, vec![1]);
    assert!(removed.nodes.iter().all(|n| n.node_id != joiner));
    cluster.kill(joiner).expect("kill the removed node");
    let alone = client
        .grant("l", "eu", 1, "l-alone", 9)
        .await
        .expect("grant without the removed node");
    assert_eq!(alone.grant.expect("grant").granted_millitokens, 9);
    let raft = raft_status(&client).await;
    assert_eq!(raft.voters, vec![1]);
    assert_eq!(node_ids(&raft), vec![1]);
}

/// Issue 13 item 3's log flood: a learner that dies is retried with backoff
/// and logged once per interval (with the count suppressed), not once per
/// attempt — with openraft's own per-attempt lines filtered as
/// [`OPENRAFT_REPLICATION_FILTER`] says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_learner_is_logged_once_per_interval_not_per_attempt() {
    let _serial = serial().await;
    let settings = ClusterSettings {
        nodes: 1,
        log_filter: format!("warn,{OPENRAFT_REPLICATION_FILTER}"),
        ..ClusterSettings::default()
    };
    let (mut cluster, _) = cluster_with(settings.clone()).await;
    let client = membership_client(&cluster, &settings);
    let joiner = cluster.add_joiner().expect("2nd node's config");
    let joiner_address = cluster.address(joiner);
    start_pristine_joiner(&mut cluster, joiner).await;
    client
        .add_node(joiner, &joiner_address, false)
        .await
        .expect("AddNode as a learner");
    let mark = cluster.log(1).len();
    cluster.kill(joiner).expect("kill the learner");
    let killed = Instant::now();
    // Wait for the second rate-limited line: it counts the attempts that
    // were not logged.
    let deadline = killed + Duration::from_secs(60);
    let ours = "raft peer not answering";
    let (tail, elapsed) = loop {
        let log = cluster.log(1);
        let tail = log[mark..].to_string();
        let elapsed = killed.elapsed();
        let lines: Vec<&str> = tail.lines().filter(|l| l.contains(ours)).collect();
        if lines.len() >= 2 {
            assert!(!lines[1].contains("suppressed=0"), "{}", lines[1]);
            break (tail, elapsed);
        }
        assert!(Instant::now() < deadline, "no second line:\n{tail}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let loud: Vec<&str> = tail
        .lines()
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
        .collect();
    assert!(
        loud.iter().all(|l| l.contains(ours)),
        "other WARN/ERROR lines: {loud:#?}"
    );
    // At most one line per 10 s interval (plus the first).
    let allowed = 2 + elapsed.as_secs() / 10;
    assert!(
        loud.len() as u64 <= allowed,
        "{} lines in {elapsed:?}: {loud:#?}",
        loud.len()
    );
    // The learner stays removable.
    let removed = client.remove_node(joiner).await.expect("RemoveNode");
    assert_eq!(removed.voters, vec![1]);
    assert!(removed.nodes.iter().all(|n| n.node_id != joiner));
}

/// Issue 13 item 2's brick, made on node 1's real sled files in process
/// (raw openraft calls: what AddNode did before it probed and waited),
/// then repaired by the real binary: `--drop-stuck-membership` prints its
/// plan and writes nothing, `--yes` writes it, and the restarted process
/// leads, serves and removes the dead learner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drop_stuck_membership_unbricks_a_cluster_of_one() {
    use leasehold_allocator::node_config::NodeConfig;
    use leasehold_allocator::running::{self as node, InitMode};

    let _serial = serial().await;
    let settings = ClusterSettings {
        nodes: 1,
        ..ClusterSettings::default()
    };
    let binary = std::path::Path::new(env!("CARGO_BIN_EXE_leasehold"));
    let mut cluster = LocalCluster::new(binary, &settings).expect("cluster dir");
    let config_path = cluster.dir().join("allocator-1.toml");
    let config = NodeConfig::load(&config_path).expect("node 1's config");
    let dead = dead_address();
    {
        let running = node::start(config, InitMode::Explicit)
            .await
            .expect("in-process node 1");
        let deadline = Instant::now() + LEADER_WAIT;
        while !running.node.is_leader() {
            assert!(Instant::now() < deadline, "node 1 never led");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        running
            .node
            .propose(leasehold_allocator::Command::CreatePool {
                pool: "before".into(),
                config: window_pool(1_000, HUGE_WINDOW_MS),
            })
            .await
            .expect("pool before");
        let raft = running.node.raft();
        let learner = serde_json::from_value(serde_json::json!({ "addr": dead })).expect("node");
        tokio::time::timeout(LEADER_WAIT, raft.add_learner(42, learner, false))
            .await
            .expect("learner entry in time")
            .expect("learner added");
        let promote = raft.change_membership(BTreeSet::from([1, 42]), false);
        assert!(
            tokio::time::timeout(Duration::from_millis(500), promote)
                .await
                .is_err(),
            "a joint configuration needing a dead node committed"
        );
        running.stop().await;
    }

    let run = |write: bool| {
        let mut command = std::process::Command::new(binary);
        command
            .arg("allocator")
            .arg("--config")
            .arg(&config_path)
            .arg("--drop-stuck-membership");
        if write {
            command.arg("--yes");
        }
        let out = command.output().expect("run leasehold");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let dry = run(false);
    assert!(dry.contains("joint voters {1} + {1, 42}"), "{dry}");
    assert!(dry.contains("this node led term"), "{dry}");
    assert!(dry.contains("dry run: nothing written"), "{dry}");
    assert_eq!(run(false), dry, "the dry run changed the files");
    let written = run(true);
    assert!(written.contains("written:"), "{written}");
    let again = run(true);
    assert!(again.contains("nothing to roll back"), "{again}");

    cluster.start(1, false).expect("start the real node 1");
    let leader = match cluster.wait_for_leader(&[], LEADER_WAIT).await {
        Ok(leader) => leader,
        Err(error) => panic!("no leader after the rollback: {error}\n{}", cluster.log(1)),
    };
    assert_eq!(leader.voters, vec![1]);
    assert_eq!(node_ids(&leader), vec![1, 42]);
    let client = membership_client(&cluster, &settings);
    client
        .create_pool("after", &window_pool(1_000, HUGE_WINDOW_MS))
        .await
        .expect("CreatePool after the rollback");
    let reply = client
        .inspect(pb::InspectRequest::default())
        .await
        .expect("inspect");
    let pools: Vec<String> = reply
        .state
        .expect("state")
        .pools
        .iter()
        .map(|p| p.pool.clone())
        .collect();
    assert!(pools.contains(&"before".to_string()), "{pools:?}");
    let removed = client.remove_node(42).await.expect("RemoveNode 42");
    assert_eq!(removed.voters, vec![1]);
    assert_eq!(
        removed.nodes.iter().map(|n| n.node_id).collect::<Vec<_>>(),
        vec![1]
    );
}
