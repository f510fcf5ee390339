//! A connection opened with a certificate that then expires (issue 27,
//! finding 3): its next calls are refused PERMISSION_DENIED, before the
//! body is decoded (`preauth`) and by the gate, although the connection
//! itself is still open.

mod common;

use std::time::{Duration, Instant, SystemTime};

use common::{Pki, EXCHANGE_DEADLINE, TD};
use leasehold_proto::allocator::v1::raft_client::RaftClient;
use leasehold_proto::allocator::v1::raft_server::{Raft, RaftServer};
use leasehold_proto::allocator::v1::{
    NodeStatusReply, NodeStatusRequest, RaftPayload, TakeOverReply, TakeOverRequest,
};
use leasehold_tls::authz::{Call, Method};
use leasehold_tls::certs::{self, Validity};
use leasehold_tls::gate::Gate;
use leasehold_tls::preauth::{GuardedService, PreAuthLayer};
use leasehold_tls::{channel, ExpectedPeer, Identity, TlsConnector};
use tonic::{Request, Response, Status};

/// Answers AppendEntries once the gate lets the caller through.
struct Gated(Gate);

#[tonic::async_trait]
impl Raft for Gated {
    async fn append_entries(
        &self,
        request: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        self.0.check(&request, Call::new(Method::AppendEntries))?;
        Ok(Response::new(RaftPayload { json: Vec::new() }))
    }
    async fn vote(&self, _: Request<RaftPayload>) -> Result<Response<RaftPayload>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn install_snapshot(
        &self,
        _: Request<RaftPayload>,
    ) -> Result<Response<RaftPayload>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn node_status(
        &self,
        _: Request<NodeStatusRequest>,
    ) -> Result<Response<NodeStatusReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
    async fn take_over(
        &self,
        _: Request<TakeOverRequest>,
    ) -> Result<Response<TakeOverReply>, Status> {
        Err(Status::unimplemented("not in this test"))
    }
}

const GUARDED: &[GuardedService] = &[GuardedService {
    name: "leasehold.allocator.v1.Raft",
    methods: &[Method::AppendEntries],
}];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_on_a_connection_whose_certificate_expired_are_refused() {
    let pki = Pki::new();
    let acceptor = pki.acceptor(&Identity::Node(1));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(PreAuthLayer::new(GUARDED, true))
            .add_service(RaftServer::new(Gated(Gate::Enforced)))
            .serve_with_incoming(leasehold_tls::incoming(listener, acceptor)),
    );
    // A client certificate that expires in a few seconds.
    let now = SystemTime::now();
    let short = certs::issue(
        &pki.ca,
        &Identity::Node(2),
        TD,
        Validity {
            not_before: now - Duration::from_secs(60),
            not_after: now + Duration::from_secs(3),
        },
    )
    .unwrap();
    let files = pki.write("node-2-short", &short);
    let connector = TlsConnector::new(files, TD).unwrap();
    let grpc = tokio::time::timeout(
        EXCHANGE_DEADLINE,
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
    client
        .append_entries(RaftPayload { json: Vec::new() })
        .await
        .expect("served while the certificate is valid");
    let started = Instant::now();
    loop {
        match client
            .append_entries(RaftPayload { json: Vec::new() })
            .await
        {
            Ok(_) => {}
            Err(status) if status.code() == tonic::Code::PermissionDenied => {
                assert!(status.message().contains("expired"), "{status:?}");
                assert!(status.message().contains("/node/2"), "{status:?}");
                break;
            }
            Err(status) => panic!("unexpected refusal {status:?}"),
        }
        assert!(
            started.elapsed() < EXCHANGE_DEADLINE,
            "calls were still served well after the certificate expired"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // notAfter has whole seconds: the refusal comes within a second of it.
    assert!(SystemTime::now() > now + Duration::from_secs(1));
    server.abort();
}
