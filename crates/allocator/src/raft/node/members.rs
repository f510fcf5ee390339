//! Membership requests carried out on the leader ([`Node::add_node`],
//! [`Node::remove_node`]); what is allowed is decided by
//! [`crate::raft::membership`] first, so a refused request appends nothing.
//!
//! One request at a time per node (another one is refused with
//! [`MembershipInvalid::Busy`]); each runs in its own task, so a caller
//! that gives up (a client deadline) never leaves a half-done change: the
//! task finishes, rollback included.
//!
//! Steps, with `W` the node's `write_timeout_ms` (2 s by default):
//! 1. A committed joint configuration left by an earlier change (its leader
//!    lost before the second step) is finished first (one entry, ≤ `W`).
//! 2. Plan ([`membership::membership_plan`]): ids, addresses, duplicates,
//!    bounds, no change in progress.
//! 3. Probe, in parallel, each at most [`PROBE_TIMEOUT`]: the joiner must
//!    answer `NodeStatus` as the requested id (and, when new, with an empty
//!    log); a change of the voters needs a majority of the old and of the
//!    new voters answering ([`membership::check_quorum`]). Nothing has been
//!    proposed when any of this refuses.
//! 4. AddNode: the learner entry (≤ `W`); as a voter, wait until the
//!    learner's matched log index reaches the leader's last log index
//!    (≤ [`CATCH_UP_FACTOR`] × `W`), then promote it (joint and uniform
//!    entries, ≤ 2 × `W`). A learner that does not catch up is removed
//!    again (≤ `W`): the voters are unchanged.
//! 5. RemoveNode: a learner's removal (≤ `W`) or a voter's (joint and
//!    uniform, ≤ 2 × `W`).
//!
//! Worst cases: AddNode [`add_node_bound`] (1 s + 7 × `W`, 15 s by
//! default), RemoveNode [`remove_node_bound`] (1 s + 3 × `W`, 7 s); a
//! joiner at a dead address is refused by the probe, within
//! [`PROBE_TIMEOUT`] (at once when the port refuses connections).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::error::{ChangeMembershipError, ClientWriteError, RaftError};
use openraft::raft::ClientWriteResponse;
use openraft::{BasicNode, ChangeMembers, RaftMetrics, ServerState};
use tokio::task::JoinSet;

use super::{client_write_error, MembershipChange, Node, ProposeError, CORE_CALL_TIMEOUT};
use crate::raft::membership::{self, MembershipInvalid, MembershipRequest, MembershipView, Plan};
use crate::raft::network;
use crate::raft::types::{LogId, NodeId, TypeConfig};
use leasehold_proto::allocator::v1 as pb;

/// Bound on one probe of a node (connect and `NodeStatus`).
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// A new voter's catch-up may take this many write timeouts.
pub const CATCH_UP_FACTOR: u32 = 2;

/// The longest an AddNode takes on a node whose write timeout is
/// `write_timeout`: probe, finishing a joint, learner entry, catch-up,
/// promotion, rollback.
pub fn add_node_bound(write_timeout: Duration) -> Duration {
    PROBE_TIMEOUT + write_timeout * (1 + 1 + CATCH_UP_FACTOR + 2 + 1)
}

/// The longest a RemoveNode takes: probe, finishing a joint, removal.
pub fn remove_node_bound(write_timeout: Duration) -> Duration {
    PROBE_TIMEOUT + write_timeout * 3
}

type Response = ClientWriteResponse<TypeConfig>;

/// A node's matched log index in the leader's replication metrics.
fn matched(metrics: &RaftMetrics<NodeId, BasicNode>, node_id: NodeId) -> Option<u64> {
    metrics
        .replication
        .as_ref()?
        .get(&node_id)?
        .as_ref()
        .map(|log_id| log_id.index)
}

fn membership_write_error(
    error: RaftError<NodeId, ClientWriteError<NodeId, BasicNode>>,
) -> ProposeError {
    match error {
        RaftError::APIError(ClientWriteError::ChangeMembershipError(
            ChangeMembershipError::InProgress(in_progress),
        )) => ProposeError::MembershipInvalid(MembershipInvalid::ChangeInProgress {
            log_index: in_progress
                .membership_log_id
                .map_or(0, |log_id| log_id.index),
            state: "an uncommitted configuration".into(),
        }),
        other => client_write_error(other),
    }
}

impl Node {
    /// Adds a node: as a learner, then, if `voter`, as a voter once it has
    /// caught up (see the module docs). On the leader.
    pub async fn add_node(
        &self,
        node_id: NodeId,
        address: String,
        voter: bool,
    ) -> Result<MembershipChange, ProposeError> {
        self.membership_request(MembershipRequest::Add {
            node_id,
            address,
            voter,
        })
        .await
    }

    /// Removes a member (voter or learner). On the leader.
    pub async fn remove_node(&self, node_id: NodeId) -> Result<MembershipChange, ProposeError> {
        self.membership_request(MembershipRequest::Remove { node_id })
            .await
    }

    async fn membership_request(
        &self,
        request: MembershipRequest,
    ) -> Result<MembershipChange, ProposeError> {
        membership::validate_request(&request).map_err(ProposeError::MembershipInvalid)?;
        if !self.is_leader() {
            return Err(ProposeError::NotLeader(self.leader()));
        }
        let guard = Arc::clone(&self.inner.membership_lock)
            .try_lock_owned()
            .map_err(|_| ProposeError::MembershipInvalid(MembershipInvalid::Busy))?;
        let node = self.clone();
        let task = tokio::spawn(async move {
            let _guard = guard;
            let outcome = node.carry_out(&request).await;
            match &outcome {
                Ok(change) => tracing::info!(
                    target: "audit", ?request, voters = ?change.voters,
                    log_index = change.log_index, "membership changed"
                ),
                Err(error) => tracing::info!(
                    target: "audit", ?request, %error, "membership request refused or failed"
                ),
            }
            outcome
        });
        task.await
            .map_err(|error| ProposeError::Fatal(format!("membership task: {error}")))?
    }

    /// The group as this node sees it now.
    async fn membership_view(&self) -> Result<MembershipView, ProposeError> {
        let leader = self.inner.id;
        let view = self.inner.raft.with_raft_state(move |state| {
            let effective = state.membership_state.effective();
            let membership = effective.membership();
            MembershipView {
                leader,
                configs: membership.get_joint_config().clone(),
                nodes: membership
                    .nodes()
                    .map(|(id, node)| (*id, node.addr.clone()))
                    .collect(),
                log_index: effective.log_id().as_ref().map(|log_id| log_id.index),
                committed: state.membership_state.committed().log_id() == effective.log_id(),
            }
        });
        tokio::time::timeout(CORE_CALL_TIMEOUT, view)
            .await
            .map_err(|_| ProposeError::Unconfirmed("the raft core did not answer".into()))?
            .map_err(|fatal| ProposeError::Fatal(fatal.to_string()))
    }

    async fn carry_out(
        &self,
        request: &MembershipRequest,
    ) -> Result<MembershipChange, ProposeError> {
        let write_timeout = self.inner.settings.write_timeout();
        let mut view = self.membership_view().await?;
        if view.is_joint() && view.committed {
            tracing::warn!(configs = ?view.configs,
                "finishing a committed joint configuration an earlier change left");
            let goal = view.configs.last().cloned().unwrap_or_default();
            self.change(
                ChangeMembers::ReplaceAllVoters(goal),
                write_timeout,
                "finishing the joint configuration",
            )
            .await?;
            view = self.membership_view().await?;
        }
        let plan =
            membership::membership_plan(&view, request).map_err(ProposeError::MembershipInvalid)?;
        self.probe_for(&view, &plan).await?;
        match plan {
            Plan::AddLearner {
                node_id,
                address,
                promote,
                ..
            } => {
                let added = tokio::time::timeout(
                    write_timeout,
                    self.inner
                        .raft
                        .add_learner(node_id, BasicNode::new(address), false),
                )
                .await
                .map_err(|_| {
                    ProposeError::Unconfirmed(format!(
                        "the learner entry for node {node_id} was not committed within {} ms; \
                         the outcome is unknown",
                        write_timeout.as_millis()
                    ))
                })?
                .map_err(membership_write_error)?;
                if !promote {
                    return Ok(self.membership_change(added.log_id, added.membership));
                }
                self.catch_up_then_promote(node_id, added.log_id.index, true)
                    .await
            }
            Plan::Promote { node_id, .. } => self.catch_up_then_promote(node_id, 0, false).await,
            Plan::RemoveLearner { node_id } => {
                let removed = self
                    .change(
                        ChangeMembers::RemoveNodes(BTreeSet::from([node_id])),
                        write_timeout,
                        "removing the learner",
                    )
                    .await?;
                Ok(self.membership_change(removed.log_id, removed.membership))
            }
            Plan::RemoveVoter { node_id, .. } => {
                let removed = self
                    .change(
                        ChangeMembers::RemoveVoters(BTreeSet::from([node_id])),
                        write_timeout * 2,
                        "removing the voter",
                    )
                    .await?;
                Ok(self.membership_change(removed.log_id, removed.membership))
            }
        }
    }

    /// Step 3 of the module docs: the joiner answers as itself; a voter
    /// change has majorities of answering nodes.
    async fn probe_for(&self, view: &MembershipView, plan: &Plan) -> Result<(), ProposeError> {
        let joiner = match plan {
            Plan::AddLearner {
                node_id, address, ..
            } => Some((*node_id, address.clone(), true)),
            Plan::Promote {
                node_id, address, ..
            } => Some((*node_id, address.clone(), false)),
            Plan::RemoveLearner { .. } | Plan::RemoveVoter { .. } => None,
        };
        let mut targets: BTreeMap<NodeId, String> = BTreeMap::new();
        if let Some(new_voters) = plan.new_voters() {
            for id in view.voters().union(new_voters) {
                if let Some(address) = view.nodes.get(id) {
                    if *id != self.inner.id {
                        targets.insert(*id, address.clone());
                    }
                }
            }
        }
        if let Some((node_id, address, _)) = &joiner {
            targets.insert(*node_id, address.clone());
        }
        let answers = self.probe(targets).await;
        if let Some((node_id, address, must_be_pristine)) = joiner {
            let refusal = match answers.get(&node_id) {
                None => Some(MembershipInvalid::JoinerUnreachable {
                    node_id,
                    address: address.clone(),
                    reason: "the probe did not finish".into(),
                }),
                Some(Err(reason)) => Some(MembershipInvalid::JoinerUnreachable {
                    node_id,
                    address: address.clone(),
                    reason: reason.clone(),
                }),
                Some(Ok(status)) if status.node_id != node_id => {
                    Some(MembershipInvalid::JoinerIsAnother {
                        node_id,
                        address: address.clone(),
                        answered_as: status.node_id,
                    })
                }
                Some(Ok(status)) if must_be_pristine && status.initialized => {
                    Some(MembershipInvalid::JoinerHasLog {
                        node_id,
                        address: address.clone(),
                    })
                }
                Some(Ok(_)) => None,
            };
            if let Some(refusal) = refusal {
                return Err(ProposeError::MembershipInvalid(refusal));
            }
        }
        if let Some(new_voters) = plan.new_voters() {
            let mut up: BTreeSet<NodeId> = answers
                .iter()
                .filter(|(id, answer)| answer.as_ref().is_ok_and(|s| s.node_id == **id))
                .map(|(id, _)| *id)
                .collect();
            up.insert(self.inner.id);
            membership::check_quorum(&view.voters(), new_voters, &up)
                .map_err(ProposeError::MembershipInvalid)?;
        }
        Ok(())
    }

    /// Asks each target who it is, in parallel, each within
    /// [`PROBE_TIMEOUT`].
    async fn probe(
        &self,
        targets: BTreeMap<NodeId, String>,
    ) -> BTreeMap<NodeId, Result<pb::NodeStatusReply, String>> {
        let mut probes = JoinSet::new();
        for (id, address) in targets {
            let connector = Arc::clone(&self.inner.connector);
            probes.spawn(async move {
                // Over mTLS the node at `address` must hold `/node/<id>`.
                let status =
                    network::node_status_of(connector.as_ref(), id, &address, PROBE_TIMEOUT).await;
                (id, status)
            });
        }
        let mut answers = BTreeMap::new();
        while let Some(joined) = probes.join_next().await {
            if let Ok((id, status)) = joined {
                answers.insert(id, status);
            }
        }
        answers
    }

    /// Waits (≤ [`CATCH_UP_FACTOR`] × W) for the learner to match the
    /// leader's log as of now (and at least `since`), then makes it a voter
    /// (≤ 2 × W). A learner that does not catch up is removed again when
    /// `added_now` (this request added it), else left a learner.
    async fn catch_up_then_promote(
        &self,
        node_id: NodeId,
        since: u64,
        added_now: bool,
    ) -> Result<MembershipChange, ProposeError> {
        let write_timeout = self.inner.settings.write_timeout();
        let catch_up = write_timeout * CATCH_UP_FACTOR;
        let target = self
            .inner
            .raft
            .metrics()
            .borrow()
            .last_log_index
            .unwrap_or(0)
            .max(since);
        let _ = self
            .inner
            .raft
            .wait(Some(catch_up))
            .metrics(
                move |metrics| {
                    metrics.state != ServerState::Leader
                        || matched(metrics, node_id).is_some_and(|index| index >= target)
                },
                "learner caught up",
            )
            .await;
        let metrics = self.inner.raft.metrics().borrow().clone();
        if metrics.state != ServerState::Leader {
            return Err(ProposeError::NotLeader(self.leader()));
        }
        let matched_index = matched(&metrics, node_id);
        if matched_index.is_none_or(|index| index < target) {
            let rollback = if added_now {
                self.remove_learner_again(node_id).await
            } else {
                format!("node {node_id} stays a learner")
            };
            return Err(ProposeError::MembershipInvalid(
                MembershipInvalid::LearnerBehind {
                    node_id,
                    waited_ms: u64::try_from(catch_up.as_millis()).unwrap_or(u64::MAX),
                    matched: matched_index,
                    target,
                    rollback,
                },
            ));
        }
        let promoted = self
            .change(
                ChangeMembers::AddVoterIds(BTreeSet::from([node_id])),
                write_timeout * 2,
                "promoting the learner",
            )
            .await;
        match promoted {
            Ok(response) => Ok(self.membership_change(response.log_id, response.membership)),
            Err(ProposeError::Unconfirmed(_)) => Err(ProposeError::Unconfirmed(format!(
                "the promotion of node {node_id} to voter was not committed within {} ms; the \
                 group may be left in a joint configuration that needs node {node_id}: if node \
                 {node_id} is lost for good, stop the nodes and run `leasehold allocator --config \
                 <file> --drop-stuck-membership`",
                (write_timeout * 2).as_millis()
            ))),
            Err(error) => {
                if added_now {
                    let rollback = self.remove_learner_again(node_id).await;
                    tracing::warn!(node_id, %error, %rollback, "promotion refused");
                }
                Err(error)
            }
        }
    }

    /// Removes a learner this request added (≤ W); says what happened.
    async fn remove_learner_again(&self, node_id: NodeId) -> String {
        let removed = self
            .change(
                ChangeMembers::RemoveNodes(BTreeSet::from([node_id])),
                self.inner.settings.write_timeout(),
                "removing the learner again",
            )
            .await;
        match removed {
            Ok(_) => format!("node {node_id} was removed again"),
            Err(error) => format!(
                "removing the learner again failed ({error}): remove it with RemoveNode {node_id}"
            ),
        }
    }

    /// One `change_membership` (retain = false), bounded by `timeout`.
    async fn change(
        &self,
        changes: ChangeMembers<NodeId, BasicNode>,
        timeout: Duration,
        what: &str,
    ) -> Result<Response, ProposeError> {
        match tokio::time::timeout(timeout, self.inner.raft.change_membership(changes, false)).await
        {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) => Err(membership_write_error(error)),
            Err(_) => Err(ProposeError::Unconfirmed(format!(
                "{what}: not committed within {} ms; the outcome is unknown",
                timeout.as_millis()
            ))),
        }
    }

    fn membership_change(
        &self,
        log_id: LogId,
        membership: Option<openraft::Membership<NodeId, BasicNode>>,
    ) -> MembershipChange {
        let (voters, nodes) = match membership {
            Some(m) => (
                m.voter_ids().collect(),
                m.nodes().map(|(id, n)| (*id, n.addr.clone())).collect(),
            ),
            None => (Vec::new(), BTreeMap::new()),
        };
        MembershipChange {
            epoch: log_id.leader_id.term,
            log_index: log_id.index,
            voters,
            nodes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::MEMBERSHIP_CALL_TIMEOUT;
    use crate::node_config::RaftSettings;

    #[test]
    fn membership_attempts_outlast_the_slowest_add_node_at_the_default_write_timeout() {
        let default_write = RaftSettings::default().write_timeout();
        assert!(MEMBERSHIP_CALL_TIMEOUT >= add_node_bound(default_write));
    }
}
