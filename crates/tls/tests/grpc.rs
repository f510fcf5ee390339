//! A tonic gRPC call end to end over `incoming` + `channel`: the handler
//! reads the caller's identity with `peer`.

mod common;

use common::Pki;
use leasehold_proto::allocator::v1::raft_client::RaftClient;
use leasehold_proto::allocator::v1::raft_server::{Raft, RaftServer};
use leasehold_proto::allocator::v1::{
    NodeStatusReply, NodeStatusRequest, RaftPayload, TakeOverReply, TakeOverRequest,
};
use leasehold_tls::{channel, peer, ExpectedPeer, Identity};
use tonic::{Request, Response, Status};

/// Answers every call with the caller's identity, as the handler saw it.
struct WhoAmI;

fn caller<T>(request: &Request<T>) -> Result<RaftPayload, Status> {
    let info = peer(request).ok_or_else(|| Status::unauthenticated("no peer info"))?;
    let remote = info
        .remote_addr
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    Ok(RaftPayload {
        json: format!("{} {remote}", info.identity).into_bytes(),
    })
}

#[tonic::async_trait]
impl Raft for WhoAmI {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        caller(&request).map(Response::new)
    }
    async fn vote(&self, request: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        caller(&request).map(Response::new)
    }
    async fn install_snapshot(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        caller(&request).map(Response::new)
    }
    async fn node_status(
        &self,
        _request: Request<NodeStatusRequest>,
    ) -> Result<Response<NodeStatusReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn take_over(
        &self,
        _request: Request<TakeOverRequest>,
    ) -> Result<Response<TakeOverReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

#[tokio::test]
async fn a_grpc_handler_sees_the_callers_identity() {
    let pki = Pki::new();
    let acceptor = pki.acceptor(&Identity::Node(1));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(RaftServer::new(WhoAmI))
            .serve_with_incoming(leasehold_tls::incoming(listener, acceptor)),
    );

    let connector = pki.connector(&Identity::Node(2));
    let grpc = tokio::time::timeout(
        common::EXCHANGE_DEADLINE,
        channel(
            &format!("https://{address}"),
            connector,
            ExpectedPeer::Identity(Identity::Node(1)),
        ),
    )
    .await
    .expect("channel hung")
    .expect("channel");
    let mut client = RaftClient::new(grpc);
    for _ in 0..3 {
        let reply = tokio::time::timeout(
            common::EXCHANGE_DEADLINE,
            client.append_entries(RaftPayload { json: Vec::new() }),
        )
        .await
        .expect("call hung")
        .expect("call");
        assert_eq!(reply.into_inner().json, b"/node/2 127.0.0.1");
    }

    // A channel expecting someone else never gets a connection.
    let wrong = channel(
        &address.to_string(),
        pki.connector(&Identity::Node(2)),
        ExpectedPeer::Identity(Identity::Node(3)),
    )
    .await;
    let error = wrong
        .expect_err("connected to node 1 as node 3")
        .to_string();
    assert!(
        error.contains("peer is /node/1, expected /node/3"),
        "{error}"
    );
    assert!(!server.is_finished());
    server.abort();
}
