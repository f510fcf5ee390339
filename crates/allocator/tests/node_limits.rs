//! The allocator node's gRPC listener applies `[limits]` (issue 11): a
//! message above `limits.max_message_bytes` is refused before any handler
//! runs, on the Allocator API and on the raft RPCs alike, and the node keeps
//! serving.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use leasehold_allocator::node_config::{GrpcLimits, NodeConfig, ProberSettings, RaftSettings};
use leasehold_allocator::running::{start_with, InitMode, MemoryDisk, NodeParts};
use leasehold_proto::allocator::v1 as pb;
use pb::allocator_client::AllocatorClient;
use pb::raft_client::RaftClient;

const MAX_MESSAGE_BYTES: u64 = 16_384;

fn free_port() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_above_the_cap_are_refused_and_the_node_still_serves() {
    let listen = free_port();
    let config = NodeConfig {
        node_id: 1,
        listen,
        data_dir: PathBuf::from("unused"),
        peers: BTreeMap::from([(1, listen.to_string())]),
        pools: Vec::new(),
        tick_interval_ms: 0,
        raft: RaftSettings::default(),
        prober: ProberSettings::default(),
        limits: GrpcLimits {
            max_message_bytes: Some(MAX_MESSAGE_BYTES),
            ..Default::default()
        },
        write_limit: Default::default(),
        tls: None,
        metrics: None,
    };
    let disk = MemoryDisk::new();
    let mut parts = NodeParts::real(config, InitMode::Explicit);
    parts.storage = disk.storage().await.unwrap();
    let node = start_with(parts).await.expect("node starts");
    let address = format!("http://{}", node.address);
    let oversized = "x".repeat(4 * MAX_MESSAGE_BYTES as usize);

    let mut allocator = AllocatorClient::connect(address.clone()).await.unwrap();
    let refused = allocator
        .register(pb::RegisterRequest {
            pool: "p".into(),
            region: oversized.clone(),
        })
        .await
        .expect_err("refused");
    // tonic refuses an oversized message as OUT_OF_RANGE before decoding it.
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");
    assert!(refused.message().contains("too large"), "{refused:?}");

    let mut raft = RaftClient::connect(address).await.unwrap();
    let refused = raft
        .append_entries(pb::RaftPayload {
            json: oversized.into_bytes(),
        })
        .await
        .expect_err("refused");
    assert_eq!(refused.code(), tonic::Code::OutOfRange, "{refused:?}");

    // Still serving, on the same connections.
    let status = raft
        .node_status(pb::NodeStatusRequest {})
        .await
        .expect("node status answered")
        .into_inner();
    assert_eq!(status.node_id, 1);
    let small = allocator
        .register(pb::RegisterRequest {
            pool: "p".into(),
            region: "eu".into(),
        })
        .await;
    assert!(
        !matches!(&small, Err(s) if s.code() == tonic::Code::OutOfRange),
        "{small:?}"
    );
    node.stop().await;
}
