//! Allocator nodes and clients on turmoil's simulated network (feature
//! `turmoil`): the [`Connector`] that dials turmoil TCP, the [`Listen`]
//! that serves turmoil TCP accepts, and turmoil's simulated wall clock.
//!
//! Use them inside a turmoil host or client (they need the simulation's
//! world and the host's Tokio runtime):
//!
//! **Election bands.** openraft 0.9 draws a node's election timeout once,
//! when the node starts, and checks it only on its tick (every 1.5 ×
//! heartbeat). Hosts of a simulation start at the same instant, so two
//! nodes whose timeouts round to the same number of ticks time out in
//! lockstep after every split vote, less than one message latency apart,
//! and split the vote forever. Give each node its own band
//! ([`election_band`]): their election periods then differ by at least one
//! tick, so a split vote is resolved in the next round.
//!
//! ```text
//! let parts = NodeParts {
//!     listen: sim_net::listen(config.listen).await?,
//!     connector: sim_net::connector(),
//!     clock: sim_net::clock(),
//!     storage: disk.storage().await?,
//!     rng_seed: Some(seed),
//!     ..
//! };
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Uri};

use crate::clock::WallClock;
use crate::machine::MAX_TIME_MS;
use crate::node_config::RaftSettings;
use crate::transport::{
    endpoint, BoxedStream, Conn, ConnectError, Connector, Listen, StreamFuture,
};

/// Opens turmoil TCP connections (channels connect lazily, with the same
/// connect timeout as over real TCP).
#[derive(Clone, Copy, Debug, Default)]
pub struct TurmoilConnector;

/// `host:port` of a channel's URI.
fn authority(uri: &Uri) -> io::Result<String> {
    let host = uri
        .host()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("{uri}: no host")))?;
    let port = uri.port_u16().unwrap_or(80);
    Ok(format!("{host}:{port}"))
}

impl Connector for TurmoilConnector {
    fn channel(&self, address: &str) -> Result<Channel, ConnectError> {
        let connect = tower::service_fn(|uri: Uri| async move {
            let stream = turmoil::net::TcpStream::connect(authority(&uri)?).await?;
            Ok::<_, io::Error>(TokioIo::new(stream))
        });
        Ok(endpoint(address)?.connect_with_connector_lazy(connect))
    }

    fn stream(&self, host_port: &str) -> StreamFuture {
        let host_port = host_port.to_string();
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(host_port).await?;
            Ok(Box::new(stream) as BoxedStream)
        })
    }
}

/// The turmoil connector, shared.
pub fn connector() -> Arc<dyn Connector> {
    Arc::new(TurmoilConnector)
}

/// Binds a turmoil TCP listener on `address` (e.g. `0.0.0.0:7301` on the
/// current host) and serves its accepts.
pub async fn listen(address: SocketAddr) -> io::Result<Listen> {
    let listener = turmoil::net::TcpListener::bind(address).await?;
    let local = listener.local_addr()?;
    let incoming = stream::unfold(listener, move |listener| async move {
        let accepted = listener
            .accept()
            .await
            .map(|(stream, remote)| Conn::new(Box::new(stream), Some(local), Some(remote)));
        Some((accepted, listener))
    });
    Ok(Listen::Incoming {
        local,
        incoming: Box::pin(incoming),
    })
}

/// turmoil's simulated wall clock: the simulation's epoch
/// (`Builder::epoch`) plus simulated time, the same on every host and
/// across restarts. Read outside a simulated host it says 0.
#[derive(Clone, Copy, Debug, Default)]
pub struct TurmoilClock {
    /// Added to the simulated time (clock skew of one host).
    pub skew_ms: i64,
}

impl WallClock for TurmoilClock {
    fn now_ms(&self) -> u64 {
        let now = turmoil::since_epoch().unwrap_or(Duration::ZERO);
        let now = i64::try_from(now.as_millis()).unwrap_or(i64::MAX);
        u64::try_from(now.saturating_add(self.skew_ms))
            .unwrap_or(0)
            .min(MAX_TIME_MS)
    }
}

/// turmoil's clock without skew, shared.
pub fn clock() -> Arc<dyn WallClock> {
    Arc::new(TurmoilClock::default())
}

/// `base` with the election timeout moved to node `index`'s own band (see
/// the module docs): `[min + 2·index·tick, min + 2·index·tick + tick)`,
/// where `tick` is openraft's election check period (1.5 × heartbeat) and
/// `min` is `base.election_min_ms`. Index 0 is the fastest to elect.
pub fn election_band(base: &RaftSettings, index: u64) -> RaftSettings {
    let tick = (base.heartbeat_ms * 3 / 2).max(1);
    let election_min_ms = base.election_min_ms + 2 * index * tick;
    RaftSettings {
        election_min_ms,
        election_max_ms: election_min_ms + tick,
        ..base.clone()
    }
}
