//! An admin removes a Region from a pool (issue 11, item 4), against three
//! real `leasehold allocator` processes: fake Regions fill a rate pool's 16
//! places and draw room by cold-start grants; `leasehold region remove`
//! takes one out (its room released), a real Region then registers; with
//! every fake removed the real Regions take the whole of L by their own
//! rebalance steps, the committed and the enforced sums never above L; a
//! removed Region's late call is refused before it is proposed. A live
//! Region still enforcing its share is removed by a named handoff: pending
//! (shown by the CLI, idempotent, its registration refused) while it keeps
//! enforcing, the others never rising into its share, until it acks share 0;
//! the enforced sums, its old share included, never above L. No timed
//! assertions: each step waits for its answer.

mod common_allocator;

use std::collections::BTreeMap;

use common_allocator::*;
use leasehold_allocator::client::AllocatorClient;
use leasehold_allocator::config::{PoolConfig, RatePoolConfig};
use leasehold_allocator::region::MAX_REGIONS_PER_POOL;
use leasehold_allocator::units;
use leasehold_proto::allocator::v1 as pb;
use tonic::Code;

const POOL: &str = "rate";
/// L = 10,000 tokens per second, in millitokens per second.
const L: u64 = 10_000_000;

/// What one real Region's agent enforces (the newest reply it applied).
#[derive(Clone, Debug)]
struct Agent {
    region: String,
    incarnation: u64,
    share: u64,
    version: u64,
}

impl Agent {
    fn registered(region: &str, reply: &pb::RegisterReply) -> Self {
        let share = reply.share.expect("a rate pool answers a share");
        Agent {
            region: region.into(),
            incarnation: reply.incarnation,
            share: share.share_millitokens_per_s,
            version: share.share_version,
        }
    }

    /// Applies a newer reply; true when it lowered the share (then ack).
    fn apply(&mut self, share: &pb::Share) -> bool {
        if share.incarnation != self.incarnation || share.share_version <= self.version {
            return false;
        }
        let lowered = share.share_millitokens_per_s < self.share;
        self.share = share.share_millitokens_per_s;
        self.version = share.share_version;
        lowered
    }

    fn rebalance(&self, demand: u64) -> pb::RebalanceRequest {
        pb::RebalanceRequest {
            pool: POOL.into(),
            region: self.region.clone(),
            incarnation: self.incarnation,
            demand_requests: demand,
            applied_share_millitokens_per_s: self.share,
            applied_share_version: self.version,
        }
    }
}

/// The rate pool as the leader has it now (linearizable).
async fn rate_state(client: &AllocatorClient) -> pb::RatePoolState {
    let reply = client
        .inspect(pb::InspectRequest {
            pool: POOL.into(),
            ..Default::default()
        })
        .await
        .expect("inspect");
    match reply
        .state
        .and_then(|s| s.pools.into_iter().next())
        .and_then(|p| p.kind)
    {
        Some(pb::pool_state::Kind::Rate(rate)) => rate,
        other => panic!("not a rate pool: {other:?}"),
    }
}

fn room(account: &pb::ShareAccount) -> u64 {
    account.share_millitokens_per_s
        + account.pending_release_millitokens_per_s
        + account.pooled_millitokens_per_s
        + account.granted_not_taken_millitokens_per_s
}

/// Σ = L (accounts plus unassigned) and Σ committed shares ≤ L, from the
/// outside; returns each member's room.
fn check_sums(rate: &pb::RatePoolState) -> BTreeMap<String, u64> {
    let mut rooms = BTreeMap::new();
    let mut total = rate.unassigned_millitokens_per_s;
    let mut shares = 0;
    for member in &rate.members {
        let account = member.account.expect("account");
        let region = member.member.as_ref().expect("member").region.clone();
        total += room(&account);
        shares += account.share_millitokens_per_s;
        rooms.insert(region, room(&account));
    }
    assert_eq!(
        total, rate.limit_in_force_millitokens_per_s,
        "Σ ≠ L: {rate:?}"
    );
    assert!(shares <= L, "Σ committed shares {shares} > L");
    rooms
}

/// One Rebalance per agent (replies applied at once, lowers acked at once);
/// the enforced sum — with `held`, what a removed Region not in `agents`
/// still enforces — is checked after every applied reply.
async fn round(client: &AllocatorClient, agents: &mut [Agent], held: u64) {
    for index in 0..agents.len() {
        let reply = client
            .rebalance(agents[index].rebalance(100))
            .await
            .expect("rebalance");
        let share = reply.share.expect("share");
        if agents[index].apply(&share) {
            let agent = &agents[index];
            client
                .ack_share(pb::AckShareRequest {
                    pool: POOL.into(),
                    region: agent.region.clone(),
                    incarnation: agent.incarnation,
                    applied_share_millitokens_per_s: agent.share,
                    applied_share_version: agent.version,
                })
                .await
                .expect("ack");
        }
        let enforced: u64 = agents.iter().map(|a| a.share).sum::<u64>() + held;
        assert!(
            enforced <= L,
            "enforced {enforced} > L: {agents:?} + {held}"
        );
    }
}

/// `leasehold <args> --allocator <every node>`: (success, stdout, stderr).
fn cli(allocators: &str, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .args(["--allocator", allocators])
        .output()
        .expect("run leasehold");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_fake_regions_frees_their_places_and_room_for_real_ones() {
    let _one = serial().await;
    let (cluster, _) = cluster().await;
    let client = cluster.client();
    let allocators = cluster.addresses().join(",");
    client
        .create_pool(POOL, &PoolConfig::Rate(RatePoolConfig::with_defaults(L)))
        .await
        .expect("create pool");
    let mut agents = Vec::new();
    for region in ["eu", "us"] {
        let reply = client.register(POOL, region).await.expect("register");
        agents.push(Agent::registered(region, &reply));
    }
    let fakes: Vec<String> = (0..MAX_REGIONS_PER_POOL - agents.len())
        .map(|index| format!("fake-{index}"))
        .collect();
    for fake in &fakes {
        client.register(POOL, fake).await.expect("register a fake");
    }
    round(&client, &mut agents, 0).await;

    // The pool is full: a real Region is refused.
    let full = client.register(POOL, "ap").await.expect_err("pool is full");
    assert_eq!(full.code(), Some(Code::ResourceExhausted), "{full}");
    // The fakes never report, so they hold no room (unassigned room is
    // taken only by a member's own rebalance), but their places keep the
    // real Regions' targets at 1/16 of L each: most of L stays unassigned.
    let rate = rate_state(&client).await;
    let rooms = check_sums(&rate);
    let fake_room = rooms["fake-0"];
    assert_eq!(fake_room, 0, "{rooms:?}");
    assert!(rate.unassigned_millitokens_per_s > L / 2, "{rooms:?}");

    // The admin removes one with the CLI; it says what it did and shows
    // the pool as it is now.
    let (ok, text, err) = cli(
        &allocators,
        &["region", "remove", "--pool", POOL, "--region", "fake-0"],
    );
    assert!(ok, "{err}");
    assert!(
        text.contains("removed region fake-0 from pool rate"),
        "{text}"
    );
    assert!(
        text.contains(&format!("released {} tokens/s", units::tokens(fake_room))),
        "{text}"
    );
    assert!(text.contains("15 members left"), "{text}");
    assert!(text.contains("forgot it"), "{text}");
    assert!(text.contains("pool rate (rate)"), "{text}");
    assert!(text.contains("removed: fake-0 (incarnation 2)"), "{text}");
    assert!(!text.lines().any(|l| l.starts_with("fake-0 ")), "{text}");
    assert!(text.lines().any(|l| l.starts_with("fake-1 ")), "{text}");
    let rate = rate_state(&client).await;
    assert_eq!(rate.members.len(), MAX_REGIONS_PER_POOL - 1);
    check_sums(&rate);

    // Its place is free: a real Region registers, at share 0.
    let reply = client.register(POOL, "ap").await.expect("ap registers");
    assert_eq!(reply.share.expect("share").share_millitokens_per_s, 0);
    agents.push(Agent::registered("ap", &reply));

    // The removed fake's late call is refused before it is proposed.
    let late = client
        .rebalance(pb::RebalanceRequest {
            pool: POOL.into(),
            region: "fake-0".into(),
            incarnation: 1,
            ..Default::default()
        })
        .await
        .expect_err("a removed Region is refused");
    let detail = late.detail().cloned().expect("typed detail");
    assert_eq!(detail.code, pb::ErrorCode::RegionNotInPool as i32, "{late}");
    assert_eq!(detail.epoch, 0, "refused after an append: {late}");

    // Every other fake goes (each held nothing); the room their places
    // kept ends with the real Regions, taken at once from the unassigned
    // room by their own rebalance (Σ = L and the sums ≤ L at each step).
    let mut released = 0;
    for fake in &fakes[1..] {
        let report = client.remove_region(POOL, fake).await.expect("remove");
        released += report.released_millitokens_per_s;
        check_sums(&rate_state(&client).await);
    }
    assert_eq!(released, 0);
    for _ in 0..20 {
        round(&client, &mut agents, 0).await;
        check_sums(&rate_state(&client).await);
    }
    let rate = rate_state(&client).await;
    let rooms = check_sums(&rate);
    assert_eq!(rooms.len(), 3, "{rooms:?}");
    let enforced: u64 = agents.iter().map(|a| a.share).sum();
    assert_eq!(enforced, L, "{agents:?}");
    assert_eq!(rate.unassigned_millitokens_per_s, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_remove_refuses_bad_input_naming_the_field() {
    let _one = serial().await;
    let (cluster, _) = cluster().await;
    let client = cluster.client();
    let allocators = cluster.addresses().join(",");
    window_pool_with(&client, "w", 1_000, &["eu"]).await;

    let (ok, _, err) = cli(
        &allocators,
        &["region", "remove", "--pool", "", "--region", "eu"],
    );
    assert!(!ok);
    assert!(err.contains("--pool: invalid id"), "{err}");
    let (ok, _, err) = cli(
        &allocators,
        &["region", "remove", "--pool", "w", "--region", "not an id"],
    );
    assert!(!ok);
    assert!(err.contains("--region: invalid id"), "{err}");
    let (ok, _, err) = cli(
        &allocators,
        &["region", "remove", "--pool", "nope", "--region", "eu"],
    );
    assert!(!ok);
    assert!(err.contains("pool") && err.contains("unknown"), "{err}");

    // A window pool: removed at once, nothing to release; a second removal
    // is refused naming the Region.
    let (ok, text, err) = cli(
        &allocators,
        &[
            "region", "remove", "--pool", "w", "--region", "eu", "--json",
        ],
    );
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(json["released_millitokens_per_s"], 0);
    assert_eq!(json["retired_incarnation"], 1);
    assert_eq!(json["members_left"], 0);
    assert_eq!(json["region_forgotten"], true);
    let (ok, _, err) = cli(
        &allocators,
        &["region", "remove", "--pool", "w", "--region", "eu"],
    );
    assert!(!ok);
    assert!(err.contains("not a member of pool w"), "{err}");
    // Registering again: barred until an admin readmits it (issue 27,
    // finding 3), then a fresh member above the retired incarnation.
    let barred = client.register("w", "eu").await.expect_err("re-registered");
    assert_eq!(barred.code(), Some(Code::PermissionDenied), "{barred}");
    let (ok, text, err) = cli(
        &allocators,
        &["region", "readmit", "--pool", "w", "--region", "eu"],
    );
    assert!(ok && text.contains("readmitted"), "{err}");
    let again = client.register("w", "eu").await.expect("register again");
    assert_eq!(again.incarnation, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_live_region_still_enforcing_waits_for_its_ack_and_keeps_the_sum_within_l() {
    let _one = serial().await;
    let (cluster, _) = cluster().await;
    let client = cluster.client();
    let allocators = cluster.addresses().join(",");
    client
        .create_pool(POOL, &PoolConfig::Rate(RatePoolConfig::with_defaults(L)))
        .await
        .expect("create pool");
    let mut agents = Vec::new();
    for region in ["eu", "us", "ap"] {
        let reply = client.register(POOL, region).await.expect("register");
        agents.push(Agent::registered(region, &reply));
    }
    for _ in 0..20 {
        round(&client, &mut agents, 0).await;
    }
    let mut ap = agents.pop().expect("ap");
    assert!(ap.share > 0, "{ap:?}");

    // The CLI says the removal is pending and what it waits for; the pool
    // shows ap as removing.
    let (ok, text, err) = cli(
        &allocators,
        &["region", "remove", "--pool", POOL, "--region", "ap"],
    );
    assert!(ok, "{err}");
    assert!(text.contains("removing region ap from pool rate"), "{text}");
    assert!(text.contains("waiting for ap to ack share 0"), "{text}");
    assert!(
        text.contains(&format!(
            "{} tokens/s it may still enforce",
            units::tokens(ap.share)
        )),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.starts_with("ap ") && l.contains("removing")),
        "{text}"
    );
    // Again, as JSON: the same pending removal, nothing released.
    let (ok, text, err) = cli(
        &allocators,
        &[
            "region", "remove", "--pool", POOL, "--region", "ap", "--json",
        ],
    );
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(&text).expect("json");
    assert_eq!(json["status"], "pending", "{json}");
    assert_eq!(json["released_millitokens_per_s"], 0, "{json}");
    assert_eq!(
        json["pending"]["held_millitokens_per_s"], ap.share,
        "{json}"
    );
    // It may not register back while pending.
    let refused = client.register(POOL, "ap").await.expect_err("pending");
    assert_eq!(refused.code(), Some(Code::FailedPrecondition), "{refused}");
    let detail = refused.detail().cloned().expect("typed detail");
    assert_eq!(
        detail.code,
        pb::ErrorCode::RegionBeingRemoved as i32,
        "{refused}"
    );

    // ap keeps enforcing its old share, silent; the others rebalance many
    // times and never rise into it.
    for _ in 0..10 {
        round(&client, &mut agents, ap.share).await;
        check_sums(&rate_state(&client).await);
    }
    // ap's agent rebalances: share 0, applied and acked; the removal is
    // done, a third call is refused naming the pool.
    let reply = client
        .rebalance(ap.rebalance(100))
        .await
        .expect("rebalance");
    let share = reply.share.expect("share");
    assert_eq!(share.share_millitokens_per_s, 0);
    assert!(ap.apply(&share));
    client
        .ack_share(pb::AckShareRequest {
            pool: POOL.into(),
            region: "ap".into(),
            incarnation: ap.incarnation,
            applied_share_millitokens_per_s: ap.share,
            applied_share_version: ap.version,
        })
        .await
        .expect("ack");
    let rate = rate_state(&client).await;
    assert!(
        !rate
            .members
            .iter()
            .any(|m| m.member.as_ref().is_some_and(|m| m.region == "ap")),
        "{rate:?}"
    );
    let (ok, _, err) = cli(
        &allocators,
        &["region", "remove", "--pool", POOL, "--region", "ap"],
    );
    assert!(!ok);
    assert!(err.contains("not a member of pool rate"), "{err}");

    // Now, and only now, the others take ap's room by their own steps.
    for _ in 0..20 {
        round(&client, &mut agents, ap.share).await;
        check_sums(&rate_state(&client).await);
    }
    let enforced: u64 = agents.iter().map(|a| a.share).sum();
    assert_eq!(enforced, L, "{agents:?}");
}
