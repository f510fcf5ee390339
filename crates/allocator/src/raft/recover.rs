//! Offline recovery of a stopped node's sled files:
//! `leasehold allocator --config <file> --drop-stuck-membership [--yes]`.
//!
//! **The problem.** A membership change is joint consensus: the joint entry
//! commits only with a majority of the old voters *and* of the new ones. If
//! a new voter is lost for good before it acknowledged the entry (a dead
//! address, a wiped disk), the joint entry never commits, nothing after it
//! does either, a node restarted from its log keeps it (the effective
//! membership is the last one in the log, committed or not), and openraft
//! refuses any further membership change while one is in progress. No
//! online call can leave that state.
//!
//! **The rollback.** On a stopped node, [`drop_stuck_membership`] finds the
//! first membership entry after everything this node knows committed
//! (after its saved committed index and its applied snapshot) and removes
//! it and every entry after it (none of them can be committed: commitment
//! is a prefix of the log). The membership in effect becomes the last one
//! before it, which is committed. It also moves the node's vote to a new
//! term, voting for itself (what a candidate does; legal in any state): a
//! leader elected afterwards writes its entries in a higher term, so no
//! entry can reuse the log id (term, index) of a removed one that another
//! node may still hold.
//!
//! **What "uncommitted" rests on.** The committed index a node saves is a
//! lower bound (saved lazily). Entries after it are not known committed
//! *to this node*. For the leader that wrote the stuck entry this is the
//! proof the entry never committed: it would have committed it, saved the
//! index and at once appended the second (uniform) membership entry; the
//! report says whether this node led the entry's term. On a follower the
//! entry may have committed unseen: run the command only with the whole
//! group stopped, on every voter that holds the entry, when the new voter
//! it needs is lost for good.
//!
//! Without `--yes` nothing is written: the plan is printed. With it, the
//! vote is saved (flushed) before the entries are removed (flushed), so a
//! crash in between only leaves a harmless higher term. sled refuses to
//! open a directory a running node holds.

use std::collections::BTreeSet;
use std::fmt;
use std::path::Path;

use openraft::storage::RaftLogStorage;
use openraft::{BasicNode, EntryPayload, RaftLogReader};

use crate::raft::log_store::SledLogStore;
use crate::raft::state_machine::StateMachineStore;
use crate::raft::storage::{NodeDb, StoreError};
use crate::raft::types::{LogId, NodeId, Vote};

type Membership = openraft::Membership<NodeId, BasicNode>;

/// What one log entry is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EntryKind {
    Blank,
    /// A batch of this many client commands.
    Commands(usize),
    Membership(Membership),
}

/// One log entry, summarized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntrySummary {
    pub log_id: LogId,
    pub kind: EntryKind,
}

/// What a node's files say (read by [`read_facts`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFacts {
    pub node_id: NodeId,
    pub vote: Option<Vote>,
    /// The committed log id this node saved.
    pub committed: Option<LogId>,
    /// The last log id of the applied snapshot.
    pub applied: Option<LogId>,
    /// The membership of the applied snapshot and where it came from.
    pub snapshot_membership: (Option<LogId>, Membership),
    pub last_purged: Option<LogId>,
    /// Every entry in the log, in index order.
    pub entries: Vec<EntrySummary>,
}

impl LogFacts {
    /// The highest index this node knows committed.
    pub fn known_committed(&self) -> Option<u64> {
        [self.committed, self.applied, self.last_purged]
            .into_iter()
            .flatten()
            .map(|log_id| log_id.index)
            .max()
    }
}

/// The rollback [`rollback_plan`] proposes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RollbackPlan {
    pub node_id: NodeId,
    pub known_committed: Option<u64>,
    pub last_log: LogId,
    /// The stuck entry: removed with everything after it.
    pub truncate_from: LogId,
    pub stuck: Membership,
    pub dropped_memberships: usize,
    pub dropped_blanks: usize,
    /// Client command entries removed, and the commands they carry (never
    /// answered: an answer follows commitment).
    pub dropped_command_entries: usize,
    pub dropped_commands: usize,
    /// The membership in effect afterwards (committed) and its entry.
    pub restored: (Option<LogId>, Membership),
    pub vote_before: Option<Vote>,
    pub vote_after: Vote,
    /// This node led the stuck entry's term (see the module docs).
    pub led_by_this_node: bool,
}

/// Why there is no rollback.
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    #[error("data_dir {dir}: {source} (is the node still running? stop it first)")]
    Open { dir: String, source: StoreError },
    #[error("storage: {0}")]
    Store(#[from] StoreError),
    #[error("storage: {0}")]
    Storage(String),
    #[error("nothing to roll back: {0}")]
    Nothing(String),
    #[error("refused: {0}")]
    Refused(String),
}

fn storage(error: openraft::StorageError<NodeId>) -> RecoverError {
    RecoverError::Storage(error.to_string())
}

fn describe(membership: &Membership) -> String {
    let voters = membership.get_joint_config();
    let configs: Vec<String> = voters.iter().map(|config| format!("{config:?}")).collect();
    let all: BTreeSet<NodeId> = voters.iter().flatten().copied().collect();
    let learners: Vec<NodeId> = membership
        .nodes()
        .map(|(id, _)| *id)
        .filter(|id| !all.contains(id))
        .collect();
    let nodes: Vec<String> = membership
        .nodes()
        .map(|(id, node)| format!("{id}={}", node.addr))
        .collect();
    let shape = if configs.len() > 1 {
        format!("joint voters {}", configs.join(" + "))
    } else {
        format!("voters {}", configs.join(""))
    };
    format!(
        "{shape}, learners {learners:?}, nodes [{}]",
        nodes.join(", ")
    )
}

fn show(log_id: Option<&LogId>) -> String {
    log_id.map_or("none".to_string(), |id| {
        format!("index {} (term {})", id.index, id.leader_id.term)
    })
}

impl fmt::Display for RollbackPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "node {}:", self.node_id)?;
        writeln!(
            f,
            "  last log entry {}; known committed up to {}",
            show(Some(&self.last_log)),
            self.known_committed
                .map_or("nothing".to_string(), |index| format!("index {index}"))
        )?;
        writeln!(
            f,
            "  stuck membership entry at {}: {}",
            show(Some(&self.truncate_from)),
            describe(&self.stuck)
        )?;
        writeln!(
            f,
            "  removes entries {}..={}: {} membership, {} blank, {} of client commands ({} \
             commands; none committed, none answered)",
            self.truncate_from.index,
            self.last_log.index,
            self.dropped_memberships,
            self.dropped_blanks,
            self.dropped_command_entries,
            self.dropped_commands
        )?;
        writeln!(
            f,
            "  membership afterwards (committed, {}): {}",
            show(self.restored.0.as_ref()),
            describe(&self.restored.1)
        )?;
        writeln!(
            f,
            "  vote: term {} -> term {}, voted for itself (new entries get a higher term)",
            self.vote_before.map_or(0, |vote| vote.leader_id.term),
            self.vote_after.leader_id.term
        )?;
        if self.led_by_this_node {
            write!(
                f,
                "  this node led term {} and wrote the stuck entry: it would have recorded \
                 the entry's commit and appended the uniform configuration after it",
                self.truncate_from.leader_id.term
            )
        } else {
            write!(
                f,
                "  this node did not lead term {}: the entry is not committed as far as this \
                 node knows; roll back only with the group stopped, on every voter holding it",
                self.truncate_from.leader_id.term
            )
        }
    }
}

/// The rollback of `facts` (see the module docs), or why none.
pub fn rollback_plan(facts: &LogFacts) -> Result<RollbackPlan, RecoverError> {
    let known_committed = facts.known_committed();
    let Some(last) = facts.entries.last() else {
        return Err(RecoverError::Nothing("the log is empty".into()));
    };
    let uncommitted =
        |entry: &&EntrySummary| known_committed.is_none_or(|c| entry.log_id.index > c);
    let Some(stuck_at) = facts
        .entries
        .iter()
        .position(|entry| uncommitted(&entry) && matches!(entry.kind, EntryKind::Membership(_)))
    else {
        return Err(RecoverError::Nothing(format!(
            "no membership entry after the known committed index ({}); last log entry {}",
            known_committed.map_or("none".to_string(), |index| index.to_string()),
            show(Some(&last.log_id))
        )));
    };
    let stuck_entry = &facts.entries[stuck_at];
    let EntryKind::Membership(stuck) = &stuck_entry.kind else {
        return Err(RecoverError::Refused("not a membership entry".into()));
    };
    let restored = facts.entries[..stuck_at]
        .iter()
        .rev()
        .find_map(|entry| match &entry.kind {
            EntryKind::Membership(membership) => Some((Some(entry.log_id), membership.clone())),
            _ => None,
        })
        .or_else(|| {
            let (log_id, membership) = &facts.snapshot_membership;
            log_id.map(|_| (*log_id, membership.clone()))
        });
    let Some(restored) = restored else {
        return Err(RecoverError::Refused(format!(
            "no committed membership before the entry at {}: it is this node's first \
             configuration; rolling it back would un-initialize the node",
            show(Some(&stuck_entry.log_id))
        )));
    };
    if restored.1.voter_ids().next().is_none() {
        return Err(RecoverError::Refused(
            "the membership before the stuck entry has no voter".into(),
        ));
    }
    let (mut memberships, mut blanks, mut command_entries, mut commands) = (0, 0, 0, 0);
    for entry in &facts.entries[stuck_at..] {
        match entry.kind {
            EntryKind::Blank => blanks += 1,
            EntryKind::Commands(n) => {
                command_entries += 1;
                commands += n;
            }
            EntryKind::Membership(_) => memberships += 1,
        }
    }
    let highest_term = facts
        .entries
        .iter()
        .map(|entry| entry.log_id.leader_id.term)
        .chain(facts.vote.map(|vote| vote.leader_id.term))
        .max()
        .unwrap_or(0);
    let vote_after = Vote::new(highest_term.saturating_add(1), facts.node_id);
    let led_by_this_node = facts.vote.is_some_and(|vote| {
        vote.is_committed()
            && vote.leader_id.voted_for == Some(facts.node_id)
            && vote.leader_id.term == stuck_entry.log_id.leader_id.term
    });
    Ok(RollbackPlan {
        node_id: facts.node_id,
        known_committed,
        last_log: last.log_id,
        truncate_from: stuck_entry.log_id,
        stuck: stuck.clone(),
        dropped_memberships: memberships,
        dropped_blanks: blanks,
        dropped_command_entries: command_entries,
        dropped_commands: commands,
        restored,
        vote_before: facts.vote,
        vote_after,
        led_by_this_node,
    })
}

/// Reads what [`rollback_plan`] needs from a node's open stores.
pub async fn read_facts(
    log: &mut SledLogStore,
    state: &StateMachineStore,
    node_id: NodeId,
) -> Result<LogFacts, RecoverError> {
    let log_state = log.get_log_state().await.map_err(storage)?;
    let vote = log.read_vote().await.map_err(storage)?;
    let committed = log.read_committed().await.map_err(storage)?;
    let first = log_state.last_purged_log_id.map_or(0, |id| id.index + 1);
    let entries = log
        .try_get_log_entries(first..)
        .await
        .map_err(storage)?
        .into_iter()
        .map(|entry| EntrySummary {
            log_id: entry.log_id,
            kind: match entry.payload {
                EntryPayload::Blank => EntryKind::Blank,
                EntryPayload::Normal(proposal) => EntryKind::Commands(proposal.commands.len()),
                EntryPayload::Membership(membership) => EntryKind::Membership(membership),
            },
        })
        .collect();
    let (applied, snapshot_membership) = state.read(|applied| {
        (
            applied.last_applied,
            (
                *applied.last_membership.log_id(),
                applied.last_membership.membership().clone(),
            ),
        )
    });
    Ok(LogFacts {
        node_id,
        vote,
        committed,
        applied,
        snapshot_membership,
        last_purged: log_state.last_purged_log_id,
        entries,
    })
}

/// Carries `plan` out: saves the new vote, then removes the entries (both
/// flushed).
pub async fn apply_rollback(
    log: &mut SledLogStore,
    plan: &RollbackPlan,
) -> Result<(), RecoverError> {
    log.save_vote(&plan.vote_after).await.map_err(storage)?;
    log.truncate(plan.truncate_from).await.map_err(storage)?;
    Ok(())
}

/// What [`drop_stuck_membership`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rollback {
    pub plan: RollbackPlan,
    /// False: a dry run, nothing written.
    pub written: bool,
}

/// Opens the stopped node's sled Db in `data_dir`, plans the rollback and,
/// if `write`, carries it out (see the module docs).
pub async fn drop_stuck_membership(
    data_dir: &Path,
    node_id: NodeId,
    write: bool,
) -> Result<Rollback, RecoverError> {
    if !data_dir.exists() {
        return Err(RecoverError::Nothing(format!(
            "data_dir {} does not exist",
            data_dir.display()
        )));
    }
    let db = NodeDb::open(data_dir).map_err(|source| RecoverError::Open {
        dir: data_dir.display().to_string(),
        source,
    })?;
    let mut log = SledLogStore::open(&db)?;
    let state = StateMachineStore::open_sled(&db)?;
    let facts = read_facts(&mut log, &state, node_id).await?;
    let plan = rollback_plan(&facts)?;
    if write {
        apply_rollback(&mut log, &plan).await?;
    }
    Ok(Rollback {
        plan,
        written: write,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::CommittedLeaderId;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn log_id(term: u64, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, 1), index)
    }

    fn membership(configs: &[&[NodeId]], learners: &[NodeId]) -> Membership {
        let configs: Vec<BTreeSet<NodeId>> = configs
            .iter()
            .map(|config| config.iter().copied().collect())
            .collect();
        let nodes: BTreeMap<NodeId, BasicNode> = configs
            .iter()
            .flatten()
            .chain(learners)
            .map(|id| (*id, BasicNode::new(format!("127.0.0.1:{}", 7300 + id))))
            .collect();
        Membership::new(configs, nodes)
    }

    fn entry(term: u64, index: u64, kind: EntryKind) -> EntrySummary {
        EntrySummary {
            log_id: log_id(term, index),
            kind,
        }
    }

    /// A cluster of one (node 1) that added learner 42 (index 3, committed)
    /// and then tried to promote it (joint entry at 4, never committed).
    fn stuck_one_node() -> LogFacts {
        LogFacts {
            node_id: 1,
            vote: Some(Vote::new_committed(1, 1)),
            committed: Some(log_id(1, 3)),
            applied: None,
            snapshot_membership: (None, Membership::new(vec![], ())),
            last_purged: None,
            entries: vec![
                entry(0, 0, EntryKind::Membership(membership(&[&[1]], &[]))),
                entry(1, 1, EntryKind::Blank),
                entry(1, 2, EntryKind::Commands(3)),
                entry(1, 3, EntryKind::Membership(membership(&[&[1]], &[42]))),
                entry(
                    1,
                    4,
                    EntryKind::Membership(membership(&[&[1], &[1, 42]], &[])),
                ),
                entry(1, 5, EntryKind::Commands(2)),
                entry(1, 6, EntryKind::Commands(1)),
            ],
        }
    }

    #[test]
    fn the_stuck_joint_entry_and_what_follows_are_dropped() {
        let plan = rollback_plan(&stuck_one_node()).expect("a plan");
        assert_eq!(plan.truncate_from, log_id(1, 4));
        assert_eq!(plan.last_log, log_id(1, 6));
        assert_eq!(
            plan.restored,
            (Some(log_id(1, 3)), membership(&[&[1]], &[42]))
        );
        assert_eq!((plan.dropped_memberships, plan.dropped_blanks), (1, 0));
        assert_eq!(
            (plan.dropped_command_entries, plan.dropped_commands),
            (2, 3)
        );
        assert_eq!(plan.vote_after, Vote::new(2, 1));
        assert!(!plan.vote_after.is_committed());
        assert!(plan.led_by_this_node);
        let text = plan.to_string();
        assert!(text.contains("joint voters {1} + {1, 42}"), "{text}");
        assert!(text.contains("removes entries 4..=6"), "{text}");
    }

    #[test]
    fn a_committed_log_has_nothing_to_roll_back() {
        let mut facts = stuck_one_node();
        facts.committed = Some(log_id(1, 6));
        assert!(matches!(
            rollback_plan(&facts),
            Err(RecoverError::Nothing(_))
        ));
        // The snapshot counts as committed too.
        let mut facts = stuck_one_node();
        facts.applied = Some(log_id(1, 4));
        assert!(matches!(
            rollback_plan(&facts),
            Err(RecoverError::Nothing(_))
        ));
        let mut facts = stuck_one_node();
        facts.entries.clear();
        assert!(matches!(
            rollback_plan(&facts),
            Err(RecoverError::Nothing(_))
        ));
    }

    #[test]
    fn the_first_configuration_is_never_rolled_back() {
        let mut facts = stuck_one_node();
        facts.committed = None;
        assert!(matches!(
            rollback_plan(&facts),
            Err(RecoverError::Refused(_))
        ));
    }

    #[test]
    fn the_snapshot_membership_is_the_fallback() {
        let mut facts = stuck_one_node();
        facts.entries.drain(..4);
        facts.last_purged = Some(log_id(1, 3));
        facts.applied = Some(log_id(1, 3));
        facts.snapshot_membership = (Some(log_id(1, 3)), membership(&[&[1]], &[42]));
        let plan = rollback_plan(&facts).expect("a plan");
        assert_eq!(plan.restored, facts.snapshot_membership);
        assert_eq!(plan.truncate_from, log_id(1, 4));
    }

    #[test]
    fn a_follower_is_told_the_entry_may_have_committed_unseen() {
        let mut facts = stuck_one_node();
        facts.node_id = 2;
        facts.vote = Some(Vote::new_committed(1, 1));
        let plan = rollback_plan(&facts).expect("a plan");
        assert!(!plan.led_by_this_node);
        assert_eq!(plan.vote_after, Vote::new(2, 2));
        assert!(plan.to_string().contains("did not lead"));
    }

    fn arb_kind() -> impl Strategy<Value = EntryKind> {
        prop_oneof![
            Just(EntryKind::Blank),
            (1usize..4).prop_map(EntryKind::Commands),
            Just(EntryKind::Membership(membership(&[&[1]], &[2]))),
        ]
    }

    proptest! {
        /// Whatever the log: a plan never removes an entry this node knows
        /// committed, starts at a membership entry, goes back to a
        /// membership at or below the known committed index, and moves the
        /// vote above every term seen.
        #[test]
        fn a_plan_never_touches_a_known_committed_entry(
            kinds in prop::collection::vec(arb_kind(), 1..20),
            committed in 0usize..20,
            vote_term in 0u64..4,
        ) {
            let mut term = 1;
            let mut entries = vec![entry(0, 0, EntryKind::Membership(membership(&[&[1]], &[])))];
            for (i, kind) in kinds.into_iter().enumerate() {
                if i % 5 == 4 { term += 1; }
                entries.push(entry(term, i as u64 + 1, kind));
            }
            let committed = (committed as u64).min(entries.len() as u64 - 1);
            let facts = LogFacts {
                node_id: 1,
                vote: Some(Vote::new(vote_term, 1)),
                committed: Some(log_id(1, committed)),
                applied: None,
                snapshot_membership: (None, Membership::new(vec![], ())),
                last_purged: None,
                entries,
            };
            if let Ok(plan) = rollback_plan(&facts) {
                prop_assert!(plan.truncate_from.index > committed);
                let first = facts.entries.iter().find(|e| e.log_id == plan.truncate_from);
                prop_assert!(matches!(first.map(|e| &e.kind), Some(EntryKind::Membership(_))));
                prop_assert!(plan.restored.0.is_some_and(|id| id.index <= committed));
                let highest = facts.entries.iter().map(|e| e.log_id.leader_id.term).max().unwrap_or(0);
                prop_assert!(plan.vote_after.leader_id.term > highest.max(vote_term));
                // No membership entry between the known committed index and
                // the truncation point.
                for e in &facts.entries {
                    if e.log_id.index > committed && e.log_id.index < plan.truncate_from.index {
                        prop_assert!(!matches!(e.kind, EntryKind::Membership(_)));
                    }
                }
            }
        }
    }
}
