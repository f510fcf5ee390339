//! What a running node does besides serving: initialize the cluster when
//! it may (explicitly, or once every configured peer is pristine), and the
//! leader's duties (missing pools of the pools file, due ticks).

use std::collections::BTreeMap;
use std::time::Duration;

use openraft::BasicNode;
use tokio::sync::watch;

use crate::command::Command;
use crate::node_config::NodeConfig;
use crate::raft::network::{self};
use crate::raft::node::{tick_due, Node, CORE_CALL_TIMEOUT};
use crate::raft::types::NodeId;
use crate::transport::Connector;

use super::*;

/// How often an uninitialized node without `--init` looks at its peers.
pub(super) const AUTO_INIT_PERIOD: Duration = Duration::from_millis(300);

/// Bound on one peer status query during auto-initialization.
pub(super) const PEER_STATUS_TIMEOUT: Duration = Duration::from_millis(500);

/// Initializes the cluster if this node's log is empty and `mode` allows.
pub(super) async fn initialize(
    node: Node,
    config: NodeConfig,
    mode: InitMode,
    mut stop: watch::Receiver<bool>,
) {
    let members: BTreeMap<NodeId, BasicNode> = config
        .peers
        .iter()
        .map(|(id, address)| (*id, BasicNode::new(address.clone())))
        .collect();
    let raft = node.raft().clone();
    let mut attempts: u64 = 0;
    loop {
        let initialized = tokio::time::timeout(CORE_CALL_TIMEOUT, raft.is_initialized()).await;
        match initialized {
            Ok(Ok(true)) => {
                if attempts == 0 {
                    tracing::info!(
                        node = config.node_id,
                        "log present: recovered from storage, not initializing"
                    );
                }
                return;
            }
            Ok(Err(fatal)) => {
                tracing::error!(%fatal, "raft stopped before initialization");
                return;
            }
            Ok(Ok(false)) | Err(_) => {}
        }
        let go = match mode {
            InitMode::Explicit => true,
            InitMode::Auto => peers_ready(&config, node.connector().as_ref(), attempts).await,
        };
        if go {
            match tokio::time::timeout(CORE_CALL_TIMEOUT, raft.initialize(members.clone())).await {
                Ok(Ok(())) => {
                    tracing::info!(node = config.node_id, peers = ?config.peer_list(), "cluster initialized");
                    return;
                }
                Ok(Err(error)) => tracing::info!(%error, "initialize refused"),
                Err(_) => tracing::warn!("initialize: no answer from the raft core"),
            }
        }
        attempts += 1;
        tokio::select! {
            _ = tokio::time::sleep(AUTO_INIT_PERIOD) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Auto-initialization's condition (see the module docs). Logs why not,
/// now and then.
pub(super) async fn peers_ready(
    config: &NodeConfig,
    connector: &dyn Connector,
    attempt: u64,
) -> bool {
    let lowest = config.peers.keys().next().copied();
    if lowest != Some(config.node_id) {
        return false;
    }
    let ours = config.peer_list();
    for (id, address) in &config.peers {
        if *id == config.node_id {
            continue;
        }
        let why_not =
            match network::node_status_of(connector, *id, address, PEER_STATUS_TIMEOUT).await {
                Err(error) => Some(format!("unreachable: {error}")),
                Ok(status) if status.node_id != *id => {
                    Some(format!("answers as node {}", status.node_id))
                }
                Ok(status) if status.initialized => Some("already initialized".to_string()),
                Ok(status) if status.configured_peers != ours => Some(format!(
                    "configured peers differ: {:?}",
                    status.configured_peers
                )),
                Ok(_) => None,
            };
        if let Some(reason) = why_not {
            if attempt.is_multiple_of(20) {
                tracing::info!(peer = id, %address, %reason,
                    "not initializing yet (start every peer, or pass --init)");
            }
            return false;
        }
    }
    true
}

/// On the leader: create missing pools of the pools file; propose a Tick
/// when one is due.
pub(super) async fn leader_duties(node: Node, config: NodeConfig, mut stop: watch::Receiver<bool>) {
    let period = Duration::from_millis(match config.tick_interval_ms {
        0 => 1_000,
        tick => tick,
    });
    let mut ticker = tokio::time::interval(period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.changed() => return,
        }
        if *stop.borrow() {
            return;
        }
        if !node.is_leader() {
            continue;
        }
        for seed in &config.pools {
            let missing = node
                .state_machine()
                .read(|state| state.machine.pool(&seed.pool).is_none());
            if !missing {
                continue;
            }
            let command = Command::CreatePool {
                pool: seed.pool.clone(),
                config: seed.config.clone(),
            };
            match node.propose(command).await {
                Ok(_) => tracing::info!(pool = %seed.pool, "pool created from the pools file"),
                Err(error) => {
                    tracing::warn!(pool = %seed.pool, %error, "pool from the pools file not created")
                }
            }
        }
        if config.tick_interval_ms > 0 {
            let now_ms = node.clock().now_ms();
            let due = node
                .state_machine()
                .read(|state| tick_due(&state.machine, now_ms));
            if due {
                if let Err(error) = node.propose(Command::Tick).await {
                    tracing::debug!(%error, "tick not committed");
                }
            }
        }
    }
}
