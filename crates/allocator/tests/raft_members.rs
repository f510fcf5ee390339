//! Raft RPCs are bound to the membership (issue 27, finding 1): three real
//! nodes on sled with `[tls]`, certificates from
//! `leasehold_tls::certs::init` (nine node identities: 4 to 9 are the
//! spares an operator may hold for later nodes), raw raft calls made with
//! a spare's, a removed node's or another member's certificate. Each is
//! refused PERMISSION_DENIED before openraft sees it: the leader, the term
//! and the state are unchanged; members' own calls (replication, a
//! graceful handover, adding and removing a node) still work.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use leasehold_allocator::client::{AllocatorClient, ClientSettings};
use leasehold_allocator::node_config::NodeConfig;
use leasehold_allocator::raft::{NodeId, TypeConfig};
use leasehold_allocator::running::{start, InitMode, RunningNode};
use leasehold_allocator::transport::{Connector, TlsNodeConnector};
use leasehold_allocator::{PoolConfig, RatePoolConfig};
use leasehold_proto::allocator::v1 as pb;
use leasehold_proto::allocator::v1::raft_client::RaftClient;
use leasehold_tls::TlsSettings;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};
use openraft::{CommittedLeaderId, LogId, Membership, SnapshotMeta, StoredMembership, Vote};
use tonic::transport::Channel;
use tonic::Code;

const TRUST_DOMAIN: &str = "leasehold.local";
/// Node certificates `certs init` writes: 1 to 3 run, 4 to 9 are spares.
const NODE_CERTIFICATES: u64 = 9;
/// Bound on waiting for a leader, a term, a replication.
const DEADLINE: Duration = Duration::from_secs(30);
/// Longer than a leader's lease (the longest election timeout, 1.2 s by
/// default) after it was elected: before the fix a forged vote sent for
/// this long was granted (the reproduction, commit 0d3428d).
const PAST_THE_LEASE: Duration = Duration::from_millis(2_500);

struct Cluster {
    dir: tempfile::TempDir,
    nodes: Vec<RunningNode>,
    /// `[peers]` lines of the three original nodes.
    peers: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn node_config(dir: &std::path::Path, id: NodeId, port: u16, peers: &str) -> NodeConfig {
    let text = format!(
        "node_id = {id}\nlisten = \"127.0.0.1:{port}\"\ndata_dir = \"data-{id}\"\n\
         tick_interval_ms = 0\n[peers]\n{peers}\
         [tls]\ntrust_domain = \"{TRUST_DOMAIN}\"\nca_file = \"certs/ca.pem\"\n\
         cert_file = \"certs/node-{id}.pem\"\nkey_file = \"certs/node-{id}.key\"\n"
    );
    NodeConfig::parse("allocator.toml", &text, dir).expect("config")
}

async fn tls_cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    leasehold_tls::certs::init(&certs, TRUST_DOMAIN, &["eu".into()], NODE_CERTIFICATES)
        .expect("certs init");
    let ports: Vec<u16> = (0..3).map(|_| free_port()).collect();
    let peers: String = ports
        .iter()
        .enumerate()
        .map(|(i, port)| format!("{} = \"127.0.0.1:{port}\"\n", i + 1))
        .collect();
    let mut nodes = Vec::new();
    for (i, port) in ports.iter().enumerate() {
        let id = i as NodeId + 1;
        let init = if id == 1 {
            InitMode::Explicit
        } else {
            InitMode::Auto
        };
        let config = node_config(dir.path(), id, *port, &peers);
        nodes.push(start(config, init).await.expect("node starts"));
    }
    Cluster { dir, nodes, peers }
}

impl Cluster {
    fn connector(&self, stem: &str) -> Arc<dyn Connector> {
        let settings = TlsSettings::in_dir(&self.dir.path().join("certs"), stem, TRUST_DOMAIN);
        Arc::new(TlsNodeConnector::new(&settings).expect("certificate loads"))
    }

    /// A raw raft client presenting `stem`'s certificate to node `id`.
    fn raft_as(&self, stem: &str, id: NodeId) -> RaftClient<Channel> {
        let channel = self
            .connector(stem)
            .channel(&self.node(id).address.to_string())
            .expect("channel");
        RaftClient::new(channel)
    }

    fn node(&self, id: NodeId) -> &RunningNode {
        self.nodes
            .iter()
            .find(|n| n.node.id() == id)
            .expect("a running node")
    }

    fn ids(&self) -> Vec<NodeId> {
        self.nodes.iter().map(|n| n.node.id()).collect()
    }

    fn admin(&self) -> AllocatorClient {
        let addresses: Vec<String> = self.nodes.iter().map(|n| n.address.to_string()).collect();
        let settings = ClientSettings {
            call_timeout: Duration::from_secs(10),
            leader_wait: Duration::from_secs(60),
            max_attempts: 200,
            retry_pause: Duration::from_millis(100),
            hedge_after: None,
        };
        AllocatorClient::with_connector(&addresses, settings, self.connector("admin"))
            .expect("client")
    }

    /// Waits until every node follows one leader in one term.
    async fn settled(&self) -> (NodeId, u64) {
        self.settled_after(None).await
    }

    /// [`Cluster::settled`] on a leader other than `old` (a stopped one
    /// the others still follow until they elect).
    async fn settled_after(&self, old: Option<NodeId>) -> (NodeId, u64) {
        let first = self.nodes[0]
            .node
            .raft()
            .wait(Some(DEADLINE))
            .metrics(
                |m| m.current_leader.is_some() && m.current_leader != old,
                "a leader",
            )
            .await
            .expect("a leader within the deadline");
        let (leader, term) = (first.current_leader.unwrap(), first.current_term);
        for node in &self.nodes {
            node.node
                .raft()
                .wait(Some(DEADLINE))
                .metrics(
                    |m| m.current_leader == Some(leader) && m.current_term == term,
                    "the same leader",
                )
                .await
                .expect("every node follows the leader");
        }
        (leader, term)
    }

    /// Every node still follows `leader` in `term`.
    fn unchanged(&self, leader: NodeId, term: u64) {
        for node in &self.nodes {
            let metrics = node.node.raft().metrics().borrow().clone();
            assert_eq!(
                (metrics.current_leader, metrics.current_term),
                (Some(leader), term),
                "node {} moved",
                node.node.id()
            );
        }
    }

    /// Waits until every node has applied pool `pool`.
    async fn applied(&self, pool: &str) {
        let deadline = tokio::time::Instant::now() + DEADLINE;
        for node in &self.nodes {
            while !node
                .node
                .state_machine()
                .read(|state| state.machine.pool(pool).is_some())
            {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "node {} did not apply pool {pool}",
                    node.node.id()
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }

    async fn stop(self) {
        for node in self.nodes {
            node.stop().await;
        }
    }
}

fn payload<T: serde::Serialize>(rpc: &T) -> pb::RaftPayload {
    pb::RaftPayload {
        json: serde_json::to_vec(rpc).unwrap(),
    }
}

/// A log id far ahead of any real one.
fn forged_log_id(term: u64, node: NodeId) -> LogId<NodeId> {
    LogId::new(CommittedLeaderId::new(term, node), 1_000_000)
}

/// A vote for `candidate` in `term`, claiming a log far longer than any.
fn forged_vote(term: u64, candidate: NodeId) -> VoteRequest<NodeId> {
    VoteRequest::new(
        Vote::new(term, candidate),
        Some(forged_log_id(term - 1, candidate)),
    )
}

/// Heartbeat of a leader `leader` elected in `term`.
fn forged_append(term: u64, leader: NodeId) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: Vote::new_committed(term, leader),
        prev_log_id: None,
        entries: Vec::new(),
        leader_commit: None,
    }
}

/// A whole snapshot from `leader` in `term` whose membership is `leader`
/// alone: installed, it would replace the allocator's state.
fn forged_snapshot(term: u64, leader: NodeId) -> InstallSnapshotRequest<TypeConfig> {
    let last = forged_log_id(term, leader);
    let membership = Membership::new(vec![BTreeSet::from([leader])], ());
    InstallSnapshotRequest {
        vote: Vote::new_committed(term, leader),
        meta: SnapshotMeta {
            last_log_id: Some(last),
            last_membership: StoredMembership::new(Some(last), membership),
            snapshot_id: "forged".into(),
        },
        offset: 0,
        data: b"{}".to_vec(),
        done: true,
    }
}

fn take_over(from_node: NodeId, term: u64) -> pb::TakeOverRequest {
    pb::TakeOverRequest {
        from_node,
        term,
        after_ms: 0,
    }
}

/// PERMISSION_DENIED naming the certificate's identity, the method and
/// `why`.
#[track_caller]
fn refused<T: std::fmt::Debug>(
    answer: Result<T, tonic::Status>,
    identity: &str,
    method: &str,
    why: &str,
) {
    let status = answer.expect_err("the call was let through");
    assert_eq!(status.code(), Code::PermissionDenied, "{status:?}");
    let message = status.message();
    assert!(message.contains(identity), "{message}");
    assert!(message.contains(method), "{message}");
    assert!(message.contains(why), "{message}");
}

const NOT_MEMBER: &str = "no voter or learner of this node's membership";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_node_certificate_outside_the_membership_is_refused_a_forged_vote() {
    let cluster = tls_cluster().await;
    let (leader, term) = cluster.settled().await;
    let forged = payload(&forged_vote(term + 50, 9));
    // Past the leader's lease, when the forged vote used to be granted.
    let until = tokio::time::Instant::now() + PAST_THE_LEASE;
    let mut sent = 0;
    while tokio::time::Instant::now() < until || sent < 3 {
        for id in cluster.ids() {
            let answer = cluster.raft_as("node-9", id).vote(forged.clone()).await;
            refused(answer, "/node/9", "Vote", NOT_MEMBER);
        }
        sent += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.unchanged(leader, term);
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_member_may_not_append_install_a_snapshot_or_ask_a_takeover() {
    let cluster = tls_cluster().await;
    cluster
        .admin()
        .create_pool(
            "api",
            &PoolConfig::Rate(RatePoolConfig::with_defaults(1_000_000)),
        )
        .await
        .expect("admin creates a pool");
    cluster.applied("api").await;
    let (leader, term) = cluster.settled().await;
    for id in cluster.ids() {
        let mut raft = cluster.raft_as("node-9", id);
        refused(
            raft.append_entries(payload(&forged_append(term + 50, 9)))
                .await,
            "/node/9",
            "AppendEntries",
            NOT_MEMBER,
        );
        refused(
            raft.install_snapshot(payload(&forged_snapshot(term + 50, 9)))
                .await,
            "/node/9",
            "InstallSnapshot",
            NOT_MEMBER,
        );
        refused(
            raft.take_over(take_over(9, term)).await,
            "/node/9",
            "TakeOver",
            NOT_MEMBER,
        );
    }
    cluster.unchanged(leader, term);
    // The state was not replaced: every node still has the pool.
    cluster.applied("api").await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_sending_as_another_node_is_refused() {
    let cluster = tls_cluster().await;
    let (leader, term) = cluster.settled().await;
    let follower = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let member = format!("node-{follower}");
    for id in cluster.ids() {
        // node/9 claiming to be node 2.
        let mut spare = cluster.raft_as("node-9", id);
        let as_two = "sent as node 2, not as the certificate's node 9";
        refused(
            spare.vote(payload(&forged_vote(term + 50, 2))).await,
            "/node/9",
            "Vote",
            as_two,
        );
        refused(
            spare
                .append_entries(payload(&forged_append(term + 50, 2)))
                .await,
            "/node/9",
            "AppendEntries",
            as_two,
        );
        refused(
            spare
                .install_snapshot(payload(&forged_snapshot(term + 50, 2)))
                .await,
            "/node/9",
            "InstallSnapshot",
            as_two,
        );
        refused(
            spare.take_over(take_over(2, term)).await,
            "/node/9",
            "TakeOver",
            as_two,
        );
        // A member posing as the leader.
        let mut posing = cluster.raft_as(&member, id);
        let as_leader = format!("sent as node {leader}, not as the certificate's node {follower}");
        refused(
            posing
                .append_entries(payload(&forged_append(term, leader)))
                .await,
            &format!("/node/{follower}"),
            "AppendEntries",
            &as_leader,
        );
        refused(
            posing.take_over(take_over(leader, term)).await,
            &format!("/node/{follower}"),
            "TakeOver",
            &as_leader,
        );
    }
    cluster.unchanged(leader, term);
    cluster.stop().await;
}

/// The dialling half: a channel to node X accepts only `/node/X`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_dialling_peer_x_accepts_only_node_x() {
    let cluster = tls_cluster().await;
    let (leader, _) = cluster.settled().await;
    let address = cluster.node(leader).address.to_string();
    let connector = cluster.connector("node-9");
    let status = RaftClient::new(connector.node_channel(&address, leader).unwrap())
        .node_status(pb::NodeStatusRequest {})
        .await
        .expect("the node answers as itself");
    assert_eq!(status.into_inner().node_id, leader);
    let other = leader % 3 + 1;
    let error = RaftClient::new(connector.node_channel(&address, other).unwrap())
        .node_status(pb::NodeStatusRequest {})
        .await
        .expect_err("another node's certificate was accepted");
    let shown = format!("{error:?}");
    assert!(
        shown.contains(&format!("/node/{other}")) && shown.contains(&format!("/node/{leader}")),
        "{shown}"
    );
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_replicate_and_hand_over_as_themselves() {
    let mut cluster = tls_cluster().await;
    cluster
        .admin()
        .create_pool(
            "api",
            &PoolConfig::Rate(RatePoolConfig::with_defaults(1_000_000)),
        )
        .await
        .expect("admin creates a pool");
    cluster.applied("api").await;
    let (leader, term) = cluster.settled().await;
    let index = cluster.ids().iter().position(|id| *id == leader).unwrap();
    let stopping = cluster.nodes.remove(index);
    let report = stopping.stop_gracefully().await;
    let successor = report
        .handed_over_to
        .unwrap_or_else(|| panic!("no handover: {report:?}"));
    let (new_leader, new_term) = cluster.settled_after(Some(leader)).await;
    assert_eq!(new_leader, successor, "the successor took over");
    assert!(new_term > term);
    cluster
        .admin()
        .create_pool(
            "after",
            &PoolConfig::Rate(RatePoolConfig::with_defaults(1_000_000)),
        )
        .await
        .expect("the new leader commits");
    cluster.applied("after").await;
    cluster.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_joiner_accepts_its_configured_peers_and_a_removed_node_is_refused() {
    let mut cluster = tls_cluster().await;
    let admin = cluster.admin();
    admin
        .create_pool(
            "api",
            &PoolConfig::Rate(RatePoolConfig::with_defaults(1_000_000)),
        )
        .await
        .expect("admin creates a pool");
    // Node 4, fresh: its [peers] lists the three and itself.
    let port = free_port();
    let peers = format!("{}4 = \"127.0.0.1:{port}\"\n", cluster.peers);
    let config = node_config(cluster.dir.path(), 4, port, &peers);
    cluster
        .nodes
        .push(start(config, InitMode::Auto).await.expect("node 4 starts"));
    let joiner = cluster.node(4).node.raft().clone();
    let fresh = joiner.metrics().borrow().clone();
    assert_eq!(fresh.current_term, 0, "{fresh:?}");
    refused(
        cluster
            .raft_as("node-9", 4)
            .append_entries(payload(&forged_append(50, 9)))
            .await,
        "/node/9",
        "AppendEntries",
        "not a configured peer of this node, which has no membership yet",
    );
    assert_eq!(joiner.metrics().borrow().current_term, 0);

    let address = cluster.node(4).address.to_string();
    admin
        .add_node(4, &address, true)
        .await
        .expect("the leader's entries reach the joiner");
    cluster.applied("api").await;

    let (leader, _) = cluster.settled().await;
    let removed = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    admin.remove_node(removed).await.expect("RemoveNode");
    let index = cluster.ids().iter().position(|id| *id == removed).unwrap();
    cluster.nodes.remove(index).stop().await;
    let (leader, term) = cluster.settled().await;
    // Its certificate is still valid; it is no member any more.
    let stem = format!("node-{removed}");
    for id in cluster.ids() {
        let mut raft = cluster.raft_as(&stem, id);
        let identity = format!("/node/{removed}");
        refused(
            raft.vote(payload(&forged_vote(term + 50, removed))).await,
            &identity,
            "Vote",
            NOT_MEMBER,
        );
        refused(
            raft.append_entries(payload(&forged_append(term + 50, removed)))
                .await,
            &identity,
            "AppendEntries",
            NOT_MEMBER,
        );
    }
    cluster.unchanged(leader, term);
    cluster.stop().await;
}
