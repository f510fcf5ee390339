//! The client's channel per node address: opened on first use through the
//! connector, dropped (by generation) when a call on it times out or finds
//! the connection broken, so the next call dials again. At most
//! `MAX_ADDRESSES` addresses.

use std::collections::HashMap;

use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::target::NodeTarget;
use crate::transport::Connector;
use crate::wire;

/// One address's channel and the generation it was opened in: a failed
/// attempt drops the channel only if it is still the one it used (another
/// attempt may already have replaced it).
pub(super) struct Cached {
    pub(super) channel: Channel,
    pub(super) generation: u64,
}

/// The channel cache: at most [`MAX_ADDRESSES`] entries.
#[derive(Default)]
pub(super) struct Channels {
    pub(super) by_address: HashMap<String, Cached>,
    /// Generations handed out so far.
    pub(super) opened: u64,
}

impl Channels {
    pub(super) fn insert(&mut self, address: &str, channel: Channel) -> u64 {
        self.opened += 1;
        let generation = self.opened;
        self.by_address.insert(
            address.to_string(),
            Cached {
                channel,
                generation,
            },
        );
        generation
    }
}

/// A channel to `target`: pinned to its node id when it names one.
pub(super) fn open_channel(
    connector: &dyn Connector,
    target: &NodeTarget,
) -> Result<Channel, String> {
    match target.node_id {
        Some(id) => connector.node_channel(&target.address, id),
        None => connector.channel(&target.address),
    }
    .map_err(|e| e.message)
}

/// A transport failure (tonic's "transport error"/"error trying to
/// connect", a keepalive that went unanswered, a reset stream or
/// connection: UNAVAILABLE, UNKNOWN or CANCELLED), as opposed to a node
/// answering itself (its refusals carry an [`pb::ErrorDetail`]).
pub(super) fn is_broken_connection(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    ) && wire::error_detail(status).is_none()
}
