//! Bounds before work on a real `leasehold allocator` process behind mTLS
//! (issue 27, findings 5 and 10; docs/security.md, "Bounds before work"):
//!
//! - a gateway's near-64 MiB requests to the API and the raft service are
//!   refused PERMISSION_DENIED before their bodies are decoded: the node's
//!   peak RSS (VmHWM of its /proc status) grows by less than 64 MiB for
//!   four 60 MiB requests at once (the old behaviour decoded each);
//! - an authorized API request above 1 MiB is refused OUT_OF_RANGE naming
//!   the limit;
//! - a Region writing in a loop is refused RESOURCE_EXHAUSTED past its
//!   bucket, another Region is not;
//! - a connection older than `max_connection_age_ms` is closed by the node
//!   (a graceful shutdown, then the grace, `request_timeout_ms`).

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use leasehold_proto::allocator::v1 as pb;
use leasehold_proto::allocator::v1::allocator_client::AllocatorClient;
use leasehold_proto::allocator::v1::raft_client::RaftClient;
use leasehold_tls::{channel, ExpectedPeer, Identity, TlsConnector, TlsFiles};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;
use tonic::Code;

const TD: &str = "leasehold.local";
/// Patient bound on a start or an awaited event: only a hang fails.
const DEADLINE: Duration = Duration::from_secs(90);

struct NodeProcess {
    child: Child,
    dir: tempfile::TempDir,
    address: String,
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl NodeProcess {
    /// A one-node cluster with `[tls]` and `tables` (TOML tables) in its
    /// config; waits until the admin's Inspect is answered.
    async fn start(tables: &str) -> NodeProcess {
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        leasehold_tls::certs::init(&certs, TD, &["eu".into(), "us".into()], 1).unwrap();
        let port = free_port();
        let config = dir.path().join("node.toml");
        std::fs::write(
            &config,
            format!(
                "node_id = 1\nlisten = \"127.0.0.1:{port}\"\ndata_dir = \"data\"\ntick_interval_ms = 0\n\
                 [peers]\n1 = \"127.0.0.1:{port}\"\n\
                 [tls]\ntrust_domain = \"{TD}\"\nca_file = \"certs/ca.pem\"\n\
                 cert_file = \"certs/node-1.pem\"\nkey_file = \"certs/node-1.key\"\n{tables}"
            ),
        )
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
            .args(["allocator", "--init", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let node = NodeProcess {
            child,
            dir,
            address: format!("127.0.0.1:{port}"),
        };
        let started = Instant::now();
        loop {
            if let Ok(mut admin) = node.api("admin").await {
                let asked = admin
                    .inspect(pb::InspectRequest::default())
                    .await
                    .map(|r| r.into_inner().raft.is_some_and(|r| r.leader_id != 0));
                if let Ok(true) = asked {
                    return node;
                }
            }
            assert!(started.elapsed() < DEADLINE, "the node never served");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn files(&self, stem: &str) -> TlsFiles {
        TlsFiles::in_dir(&self.dir.path().join("certs"), stem)
    }

    fn connector(&self, stem: &str) -> TlsConnector {
        TlsConnector::new(self.files(stem), TD).unwrap()
    }

    async fn channel(&self, stem: &str) -> Result<Channel, leasehold_tls::TlsError> {
        channel(
            &format!("https://{}", self.address),
            self.connector(stem),
            ExpectedPeer::Identity(Identity::Node(1)),
        )
        .await
    }

    /// The API as `stem`, sending messages of any size.
    async fn api(&self, stem: &str) -> Result<AllocatorClient<Channel>, leasehold_tls::TlsError> {
        Ok(AllocatorClient::new(self.channel(stem).await?)
            .max_encoding_message_size(usize::MAX)
            .max_decoding_message_size(64 << 20))
    }

    /// Peak resident set of the node process, KiB.
    fn peak_rss_kib(&self) -> u64 {
        status_kib(self.child.id(), "VmHWM:")
    }
}

fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(PathBuf::from(format!("/proc/{pid}/status"))).unwrap();
    let line = status
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"));
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

async fn create_pool(node: &NodeProcess) {
    let mut admin = node.api("admin").await.unwrap();
    let config =
        leasehold_allocator::wire::pool_config_to_wire(&leasehold_allocator::PoolConfig::Rate(
            leasehold_allocator::RatePoolConfig::with_defaults(10_000_000),
        ));
    admin
        .create_pool(pb::CreatePoolRequest {
            pool: "api".into(),
            config: Some(config),
        })
        .await
        .expect("admin creates a pool");
}

/// Each request this big: below the old 64 MiB limit, so the old node
/// decoded it whole before the gate refused it.
const BIG: usize = 60 << 20;
/// The node's peak RSS may grow by less than this for all four.
const RSS_GROWTH_BOUND_KIB: u64 = 64 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_64_mib_requests_from_a_gateway_are_refused_before_decoding() {
    let node = NodeProcess::start("").await;
    let before = node.peak_rss_kib();
    let gateway = node.channel("gateway-eu").await.unwrap();
    let mut calls = Vec::new();
    for i in 0..4 {
        let channel = gateway.clone();
        calls.push(tokio::spawn(async move {
            let payload = "x".repeat(BIG);
            let started = Instant::now();
            let answer = async {
                if i % 2 == 0 {
                    let mut api =
                        AllocatorClient::new(channel).max_encoding_message_size(usize::MAX);
                    api.inspect(pb::InspectRequest {
                        pool: payload,
                        ..Default::default()
                    })
                    .await
                    .map(|_| ())
                } else {
                    let mut raft = RaftClient::new(channel).max_encoding_message_size(usize::MAX);
                    raft.install_snapshot(pb::RaftPayload {
                        json: payload.into_bytes(),
                    })
                    .await
                    .map(|_| ())
                }
            }
            .await;
            println!("call {i} answered after {:?}", started.elapsed());
            answer
        }));
    }
    for call in calls {
        let refused = tokio::time::timeout(DEADLINE, call)
            .await
            .expect("call hung")
            .unwrap()
            .expect_err("a gateway's call was served");
        assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
        assert!(refused.message().contains("gateway/eu"), "{refused:?}");
    }
    let after = node.peak_rss_kib();
    println!("VmRSS now {} KiB", status_kib(node.child.id(), "VmRSS:"));
    let growth = after.saturating_sub(before);
    println!(
        "node peak RSS {before} KiB -> {after} KiB (+{growth} KiB) for 4 x {} MiB refused",
        BIG >> 20
    );
    assert!(
        growth < RSS_GROWTH_BOUND_KIB,
        "peak RSS grew {growth} KiB (bound {RSS_GROWTH_BOUND_KIB} KiB)"
    );
    // The node still serves.
    let mut admin = node.api("admin").await.unwrap();
    admin
        .inspect(pb::InspectRequest::default())
        .await
        .expect("admin inspects");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_authorized_request_above_1_mib_is_refused_naming_the_limit() {
    let node = NodeProcess::start("").await;
    create_pool(&node).await;
    let mut eu = node.api("region-eu").await.unwrap();
    let refused = eu
        .register(pb::RegisterRequest {
            pool: "x".repeat((1 << 20) + 1),
            region: "eu".into(),
        })
        .await
        .expect_err("a 1 MiB request was decoded");
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
    assert!(refused.message().contains("1048576"), "{refused:?}");
    eu.register(pb::RegisterRequest {
        pool: "api".into(),
        region: "eu".into(),
    })
    .await
    .expect("a small Register is served");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_region_writing_in_a_loop_is_limited_and_another_is_not() {
    let node = NodeProcess::start("[write_limit]\nrate_per_s = 1\nburst = 5\n").await;
    create_pool(&node).await;
    let mut eu = node.api("region-eu").await.unwrap();
    let register = |region: &str| pb::RegisterRequest {
        pool: "api".into(),
        region: region.into(),
    };
    let mut served = 0;
    let refused = loop {
        match eu.register(register("eu")).await {
            Ok(_) => served += 1,
            Err(status) => break status,
        }
        assert!(served < 100, "100 writes in a row were served");
    };
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("write limit of 1 proposals/s (burst 5)"),
        "{refused:?}"
    );
    assert!(served >= 5, "refused after {served}");
    let mut us = node.api("region-us").await.unwrap();
    us.register(register("us"))
        .await
        .expect("another Region is not limited");
}

/// Reads HTTP/2 frames until the server closes, acknowledging its PINGs
/// (hyper's graceful shutdown waits for one); true if one was a GOAWAY.
async fn read_until_closed<S>(stream: &mut S) -> bool
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut goaway = false;
    let mut header = [0u8; 9];
    loop {
        if stream.read_exact(&mut header).await.is_err() {
            return goaway;
        }
        let length = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; length];
        if stream.read_exact(&mut payload).await.is_err() {
            return goaway;
        }
        match (header[3], header[4] & 0x1) {
            (0x7, _) => goaway = true,
            // A PING without ACK: answer it with the same payload.
            (0x6, 0) => {
                let mut ack = vec![0, 0, 8, 0x6, 0x1, 0, 0, 0, 0];
                ack.extend_from_slice(&payload);
                if stream.write_all(&ack).await.is_err() || stream.flush().await.is_err() {
                    return goaway;
                }
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_older_than_its_maximum_age_is_closed() {
    // Grace (request_timeout_ms) 1 s too: an idle raw client is cut by it.
    let node =
        NodeProcess::start("[limits]\nmax_connection_age_ms = 1000\nrequest_timeout_ms = 1000\n")
            .await;
    let tcp = tokio::net::TcpStream::connect(&node.address).await.unwrap();
    let mut tls = node
        .connector("region-eu")
        .connect_expecting(tcp, ExpectedPeer::Identity(Identity::Node(1)))
        .await
        .unwrap();
    // The client preface and an empty SETTINGS frame, then nothing: an
    // idle connection the server would otherwise keep.
    tls.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    tls.write_all(&[0, 0, 0, 0x4, 0, 0, 0, 0, 0]).await.unwrap();
    tls.flush().await.unwrap();
    // With the default age (10 minutes) this would time out.
    let goaway = tokio::time::timeout(DEADLINE, read_until_closed(&mut tls))
        .await
        .expect("the connection outlived its maximum age");
    println!("connection closed by the node (GOAWAY seen: {goaway})");
}
