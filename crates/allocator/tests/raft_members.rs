//! Raft RPCs are bound to the membership (issue 27, finding 1): three real
//! nodes on sled with `[tls]`, certificates from
//! `leasehold_tls::certs::init` (nine node identities: 4 to 9 are the
//! spares an operator may hold for later nodes), raw raft calls made with
//! a spare node's certificate.

use std::sync::Arc;
use std::time::Duration;

use leasehold_allocator::node_config::NodeConfig;
use leasehold_allocator::raft::node::{start, InitMode, RunningNode};
use leasehold_allocator::raft::NodeId;
use leasehold_allocator::transport::{Connector, TlsNodeConnector};
use leasehold_proto::allocator::v1 as pb;
use leasehold_proto::allocator::v1::raft_client::RaftClient;
use leasehold_tls::TlsSettings;
use openraft::error::RaftError;
use openraft::raft::{VoteRequest, VoteResponse};
use openraft::{CommittedLeaderId, LogId, ServerState, Vote};
use tonic::transport::Channel;

const TRUST_DOMAIN: &str = "leasehold.local";
/// Node certificates `certs init` writes: 1 to 3 run, 4 to 9 are spares.
const NODE_CERTIFICATES: u64 = 9;
/// Bound on waiting for a leader, a term, a replication.
const DEADLINE: Duration = Duration::from_secs(30);

struct Cluster {
    dir: tempfile::TempDir,
    nodes: Vec<RunningNode>,
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

    /// Waits until every node follows one leader in one term.
    async fn settled(&self) -> (NodeId, u64) {
        let first = self.nodes[0]
            .node
            .raft()
            .wait(Some(DEADLINE))
            .metrics(|m| m.current_leader.is_some(), "a leader")
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

    async fn stop(self) {
        for node in self.nodes {
            node.stop().await;
        }
    }
}

async fn tls_cluster() -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    leasehold_tls::certs::init(&certs, TRUST_DOMAIN, &["eu".into()], NODE_CERTIFICATES)
        .expect("certs init");
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
    Cluster { dir, nodes }
}

fn payload<T: serde::Serialize>(rpc: &T) -> pb::RaftPayload {
    pb::RaftPayload {
        json: serde_json::to_vec(rpc).unwrap(),
    }
}

/// A vote for `candidate` in `term`, claiming a log far longer than any.
fn forged_vote(term: u64, candidate: NodeId) -> VoteRequest<NodeId> {
    let last = LogId::new(CommittedLeaderId::new(term - 1, candidate), 1_000_000);
    VoteRequest::new(Vote::new(term, candidate), Some(last))
}

fn decode_vote(reply: tonic::Response<pb::RaftPayload>) -> VoteResponse<NodeId> {
    let answer: Result<VoteResponse<NodeId>, RaftError<NodeId>> =
        serde_json::from_slice(&reply.into_inner().json).unwrap();
    answer.expect("raft answers")
}

/// Before the fix (the reproduction of finding 1): node/9's certificate,
/// no member, is granted a forged vote once the leader's lease (the
/// longest election timeout since it was elected) has run out; the leader
/// steps down and takes the forged term.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_node_certificate_outside_the_membership_wins_a_forged_vote() {
    let cluster = tls_cluster().await;
    let (leader, term) = cluster.settled().await;
    let forged_term = term + 50;
    let mut raft = cluster.raft_as("node-9", leader);
    let deadline = tokio::time::Instant::now() + DEADLINE;
    // Refused while the lease holds: asked again until granted (bounded).
    loop {
        let reply = raft
            .vote(payload(&forged_vote(forged_term, 9)))
            .await
            .expect("the gate lets any node certificate through");
        if decode_vote(reply).vote_granted {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never granted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let after = cluster
        .node(leader)
        .node
        .raft()
        .wait(Some(DEADLINE))
        .metrics(|m| m.current_term >= forged_term, "the forged term")
        .await
        .expect("the leader took the forged term");
    assert_ne!(after.state, ServerState::Leader);
    cluster.stop().await;
}
