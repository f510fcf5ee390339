//! The raft storage: both log stores pass openraft's own storage suite; the
//! sled store keeps entries, vote, committed and purge point across a
//! reopen; the state machine applies proposals per the apply rule, its
//! snapshot installs into a fresh state machine byte for byte, and a node
//! reopened from its sled directory recovers the same machine.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use leasehold_allocator::config::{RatePoolConfig, WindowPoolConfig};
use leasehold_allocator::raft::types::{LogId, RaftEntry, Vote};
use leasehold_allocator::raft::{
    open_node_storage, recover, MemLogStore, NodeDb, Proposal, ProposalResponse, Raft,
    SledLogStore, StateMachineStore, TypeConfig,
};
use leasehold_allocator::{Command, CommandError, Outcome, PoolConfig, Rejection, Reply};
use openraft::error::{InstallSnapshotError, RPCError, RaftError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::storage::{RaftLogStorage, RaftLogStorageExt, RaftStateMachine};
use openraft::testing::{StoreBuilder, Suite};
use openraft::{
    AnyError, BasicNode, ChangeMembers, CommittedLeaderId, Entry, EntryPayload, Membership,
    RaftLogReader, RaftNetwork, RaftNetworkFactory, RaftSnapshotBuilder, StorageError,
    StorageHelper,
};
use tempfile::TempDir;

/// A fresh sled store in its own temp dir per build (the guard removes it).
struct SledBuilder;

impl StoreBuilder<TypeConfig, SledLogStore, StateMachineStore, TempDir> for SledBuilder {
    async fn build(&self) -> Result<(TempDir, SledLogStore, StateMachineStore), StorageError<u64>> {
        let dir = tempfile::tempdir().expect("temp dir");
        let (log_store, state_machine) = open_node_storage(dir.path()).expect("opens");
        Ok((dir, log_store, state_machine))
    }
}

struct MemBuilder;

impl StoreBuilder<TypeConfig, MemLogStore, StateMachineStore> for MemBuilder {
    async fn build(&self) -> Result<((), MemLogStore, StateMachineStore), StorageError<u64>> {
        Ok(((), MemLogStore::default(), StateMachineStore::in_memory()))
    }
}

#[test]
fn sled_store_passes_the_openraft_storage_suite() {
    Suite::test_all(SledBuilder).expect("suite");
}

#[test]
fn memory_store_passes_the_openraft_storage_suite() {
    Suite::test_all(MemBuilder).expect("suite");
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

fn normal(term: u64, index: u64, stamped_time_ms: u64, command: Command) -> RaftEntry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Normal(Proposal::single(stamped_time_ms, command)),
    }
}

fn blank(term: u64, index: u64) -> RaftEntry {
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Blank,
    }
}

fn membership(term: u64, index: u64) -> RaftEntry {
    let voters: BTreeSet<u64> = [1, 2, 3].into_iter().collect();
    Entry {
        log_id: log_id(term, index),
        payload: EntryPayload::Membership(Membership::new(vec![voters], None)),
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Runtime::new().expect("runtime")
}

fn grant(lease_id: &str, want_millitokens: u64) -> Command {
    Command::Grant {
        pool: "quota".into(),
        region: "eu".into(),
        incarnation: 1,
        lease_id: lease_id.into(),
        want_millitokens,
    }
}

/// A log as openraft writes it, indexes 0 to `last` (`entries[i]` has index
/// `i`): the initial membership at 0, the first leader's blank, pool
/// creations, registrations, then grants (every fifth one a retry of the
/// lease id before it, every seventh one refused for a want of 0), with a
/// new leader's blank at 40.
fn history(last: u64) -> Vec<RaftEntry> {
    let window = WindowPoolConfig {
        capacity_millitokens_per_window: 1_000_000,
        window_ms: 60_000,
        lease_ttl_ms: 10_000,
        regions: None,
    };
    let setup = [
        Command::CreatePool {
            pool: "quota".into(),
            config: PoolConfig::Window(window),
        },
        Command::CreatePool {
            pool: "rate".into(),
            config: PoolConfig::Rate(RatePoolConfig::with_defaults(10_000_000)),
        },
        Command::RegisterRegion {
            pool: "quota".into(),
            region: "eu".into(),
        },
        Command::RegisterRegion {
            pool: "rate".into(),
            region: "eu".into(),
        },
    ];
    let mut entries = vec![membership(0, 0), blank(1, 1)];
    let mut setup = setup.into_iter();
    for index in 2..=last {
        let term = if index < 40 { 1 } else { 2 };
        let time_ms = 1_000 * index;
        if index == 40 {
            entries.push(blank(term, index));
            continue;
        }
        let command = match setup.next() {
            Some(command) => command,
            None if index % 7 == 0 => grant(&format!("lease-{index}"), 0),
            None if index % 5 == 0 => grant(&format!("lease-{}", index - 1), 100),
            None => grant(&format!("lease-{index}"), 100 + index),
        };
        entries.push(normal(term, index, time_ms, command));
    }
    entries
}

async fn apply_all(
    state_machine: &mut StateMachineStore,
    entries: &[RaftEntry],
) -> Vec<ProposalResponse> {
    state_machine
        .apply(entries.to_vec())
        .await
        .expect("apply never fails on a rejection")
}

fn machine_bytes(state_machine: &StateMachineStore) -> Vec<u8> {
    state_machine.read(|state| state.machine.snapshot_bytes().expect("encodes"))
}

#[test]
fn sled_log_keeps_entries_vote_committed_and_purge_point_across_reopen() {
    let dir = tempfile::tempdir().expect("temp dir");
    let entries = history(30);
    let vote = Vote::new_committed(2, 1);
    runtime().block_on(async {
        let db = NodeDb::open(dir.path()).expect("opens");
        let mut store = SledLogStore::open(&db).expect("log store");
        store
            .blocking_append(entries.clone())
            .await
            .expect("append");
        store.save_vote(&vote).await.expect("vote");
        store
            .save_committed(Some(log_id(1, 25)))
            .await
            .expect("committed");
        store.purge(log_id(1, 5)).await.expect("purge");
        store.truncate(log_id(1, 28)).await.expect("truncate");
    });
    runtime().block_on(async {
        let db = NodeDb::open(dir.path()).expect("reopens");
        let mut store = SledLogStore::open(&db).expect("log store");
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 5)));
        assert_eq!(state.last_log_id, Some(log_id(1, 27)));
        assert_eq!(store.read_vote().await.expect("vote"), Some(vote));
        assert_eq!(
            store.read_committed().await.expect("committed"),
            Some(log_id(1, 25))
        );
        let read = store.try_get_log_entries(0..100).await.expect("entries");
        assert_eq!(read, entries[6..28].to_vec());
        let bounded = store.try_get_log_entries(10..=12).await.expect("entries");
        assert_eq!(bounded, entries[10..13].to_vec());
    });
}

#[test]
fn sled_log_purged_to_the_end_reports_the_purge_point_as_last() {
    let dir = tempfile::tempdir().expect("temp dir");
    runtime().block_on(async {
        let db = NodeDb::open(dir.path()).expect("opens");
        let mut store = SledLogStore::open(&db).expect("log store");
        store.blocking_append(history(10)).await.expect("append");
        store.purge(log_id(1, 10)).await.expect("purge");
    });
    runtime().block_on(async {
        let db = NodeDb::open(dir.path()).expect("reopens");
        let mut store = SledLogStore::open(&db).expect("log store");
        let state = store.get_log_state().await.expect("state");
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 10)));
        assert_eq!(state.last_log_id, Some(log_id(1, 10)));
        assert!(store
            .try_get_log_entries(..)
            .await
            .expect("entries")
            .is_empty());
    });
}

#[test]
fn apply_follows_the_apply_rule_and_a_rejection_is_an_ordinary_answer() {
    let entries = history(50);
    runtime().block_on(async {
        let mut state_machine = StateMachineStore::in_memory();
        let responses = apply_all(&mut state_machine, &entries).await;
        assert_eq!(responses.len(), entries.len());
        for (entry, response) in entries.iter().zip(&responses) {
            let EntryPayload::Normal(proposal) = &entry.payload else {
                assert!(
                    response.results.is_empty(),
                    "blank or membership at {}",
                    entry.log_id
                );
                continue;
            };
            let epoch = entry.log_id.leader_id.term;
            assert_eq!(response.results.len(), 1, "one answer per command");
            match (&proposal.commands[0], response.results.first()) {
                (
                    Command::Grant {
                        want_millitokens: 0,
                        ..
                    },
                    Some(Err(rejection)),
                ) => {
                    assert_eq!(rejection.epoch, epoch);
                    assert!(matches!(
                        rejection.error,
                        CommandError::InvalidValue { ref field, .. } if field == "want_millitokens"
                    ));
                }
                (_, Some(Ok(reply))) => {
                    assert_eq!(reply.epoch, epoch, "epoch is the entry's term");
                    assert!(reply.applied_time_ms >= proposal.stamped_time_ms);
                }
                (command, result) => panic!("{command:?} answered {result:?}"),
            }
        }
        // A retried lease id answers its original grant.
        let answer = |index: usize| match responses[index].results.first() {
            Some(Ok(reply)) => match &reply.outcome {
                Outcome::Granted(answer) => answer.clone(),
                other => panic!("not a grant: {other:?}"),
            },
            other => panic!("refused: {other:?}"),
        };
        // Index 24 granted lease-24; index 25 retried it.
        assert_eq!(answer(24), answer(25));

        let (last_applied, last_membership) = state_machine.applied_state().await.expect("state");
        assert_eq!(last_applied, Some(log_id(2, 50)));
        assert_eq!(last_membership.log_id(), &Some(log_id(0, 0)));
        assert_eq!(state_machine.read(|state| state.machine.epoch()), 2);
    });
}

#[test]
fn a_batched_entry_applies_its_commands_in_order_with_its_term_and_stamp() {
    let commands = vec![
        grant("batch-a", 100),
        grant("batch-a", 100),
        grant("batch-b", 0),
        grant("batch-c", 200),
    ];
    let stamp = 9_000;
    runtime().block_on(async {
        let mut batched = StateMachineStore::in_memory();
        apply_all(&mut batched, &history(6)).await;
        let entry = Entry {
            log_id: log_id(1, 7),
            payload: EntryPayload::Normal(Proposal {
                stamped_time_ms: stamp,
                commands: commands.clone(),
            }),
        };
        let responses = apply_all(&mut batched, &[entry]).await;
        assert_eq!(responses.len(), 1, "one response per entry");
        let results = &responses[0].results;
        assert_eq!(results.len(), commands.len(), "one answer per command");
        for (index, result) in results.iter().enumerate() {
            match result {
                Ok(reply) => {
                    assert_eq!(reply.epoch, 1, "epoch is the entry's term");
                    assert!(reply.applied_time_ms >= stamp);
                }
                Err(rejection) => {
                    assert_eq!(index, 2, "only the want of 0 is refused");
                    assert_eq!(rejection.epoch, 1);
                }
            }
        }
        assert_eq!(
            results[0], results[1],
            "the retry answers the original grant"
        );

        // The same commands as single-command entries of the same term and
        // stamp leave the same machine, byte for byte.
        let mut single = StateMachineStore::in_memory();
        apply_all(&mut single, &history(6)).await;
        let entries: Vec<RaftEntry> = commands
            .into_iter()
            .enumerate()
            .map(|(offset, command)| normal(1, 7 + offset as u64, stamp, command))
            .collect();
        let singles = apply_all(&mut single, &entries).await;
        let single_results: Vec<_> = singles.into_iter().flat_map(|r| r.results).collect();
        assert_eq!(&single_results, results);
        assert_eq!(machine_bytes(&single), machine_bytes(&batched));
    });
}

#[test]
fn snapshot_installs_into_a_fresh_state_machine_byte_for_byte() {
    let entries = history(60);
    runtime().block_on(async {
        let mut leader = StateMachineStore::in_memory();
        apply_all(&mut leader, &entries).await;
        let snapshot = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("builds");
        assert_eq!(snapshot.meta.last_log_id, Some(log_id(2, 60)));

        let dir = tempfile::tempdir().expect("temp dir");
        let (_log_store, mut follower) = open_node_storage(dir.path()).expect("opens");
        let mut receiving = follower.begin_receiving_snapshot().await.expect("begins");
        receiving
            .get_mut()
            .extend_from_slice(snapshot.snapshot.get_ref());
        follower
            .install_snapshot(&snapshot.meta, receiving)
            .await
            .expect("installs");

        assert_eq!(machine_bytes(&follower), machine_bytes(&leader));
        assert_eq!(
            follower.applied_state().await.expect("state"),
            leader.applied_state().await.expect("state")
        );
        let current = follower
            .get_current_snapshot()
            .await
            .expect("reads")
            .expect("a current snapshot");
        assert_eq!(current.meta, snapshot.meta);

        // Both continue identically from there.
        let more = [normal(3, 61, 70_000, grant("after", 7))];
        let from_leader = apply_all(&mut leader, &more).await;
        let from_follower = apply_all(&mut follower, &more).await;
        assert_eq!(from_leader, from_follower);
        assert_eq!(machine_bytes(&follower), machine_bytes(&leader));
    });
}

#[test]
fn snapshot_of_another_meta_is_refused() {
    runtime().block_on(async {
        let mut leader = StateMachineStore::in_memory();
        apply_all(&mut leader, &history(20)).await;
        let snapshot = leader
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("builds");
        let mut meta = snapshot.meta.clone();
        meta.last_log_id = Some(log_id(1, 19));
        let mut follower = StateMachineStore::in_memory();
        assert!(follower
            .install_snapshot(&meta, snapshot.snapshot)
            .await
            .is_err());
        assert_eq!(follower.last_applied(), None);
    });
}

/// Appends and applies `entries`, building a snapshot (and purging behind
/// it) after `snapshot_at` entries if asked, and saves the last entry as
/// committed; answers the machine bytes.
async fn drive<LS: RaftLogStorage<TypeConfig>>(
    log_store: &mut LS,
    state_machine: &mut StateMachineStore,
    entries: &[RaftEntry],
    snapshot_at: Option<usize>,
) -> Vec<u8> {
    log_store
        .save_vote(&Vote::new_committed(2, 1))
        .await
        .expect("vote");
    log_store
        .blocking_append(entries.to_vec())
        .await
        .expect("append");
    let split = snapshot_at.unwrap_or(0);
    apply_all(state_machine, &entries[..split]).await;
    if snapshot_at.is_some() {
        let snapshot = state_machine
            .get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .expect("builds");
        let last = snapshot.meta.last_log_id.expect("non-empty");
        log_store.purge(last).await.expect("purge");
    }
    apply_all(state_machine, &entries[split..]).await;
    let last = entries.last().expect("entries").log_id;
    log_store
        .save_committed(Some(last))
        .await
        .expect("committed");
    machine_bytes(state_machine)
}

/// [`drive`] on a node opened at `dir`.
fn run_node(dir: &Path, entries: &[RaftEntry], snapshot_at: Option<usize>) -> Vec<u8> {
    runtime().block_on(async {
        let (mut log_store, mut state_machine) = open_node_storage(dir).expect("opens");
        drive(&mut log_store, &mut state_machine, entries, snapshot_at).await
    })
}

/// Reopens the node at `dir` as openraft does at startup (re-applying the
/// committed log after the snapshot); answers the machine bytes and the last
/// applied log id.
fn reopen_node(dir: &Path) -> (Vec<u8>, Option<LogId>) {
    runtime().block_on(async {
        let (mut log_store, mut state_machine) = open_node_storage(dir).expect("reopens");
        let state = StorageHelper::new(&mut log_store, &mut state_machine)
            .get_initial_state()
            .await
            .expect("initial state");
        assert_eq!(state.vote_ref(), &Vote::new_committed(2, 1));
        (machine_bytes(&state_machine), state_machine.last_applied())
    })
}

#[test]
fn reopened_node_replays_its_whole_log_to_the_same_machine() {
    let dir = tempfile::tempdir().expect("temp dir");
    let entries = history(80);
    let before = run_node(dir.path(), &entries, None);
    let (after, last_applied) = reopen_node(dir.path());
    assert_eq!(last_applied, Some(log_id(2, 80)));
    assert_eq!(after, before);
}

#[test]
fn reopened_node_restores_its_snapshot_then_replays_the_rest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let entries = history(80);
    let before = run_node(dir.path(), &entries, Some(45));
    let (after, last_applied) = reopen_node(dir.path());
    assert_eq!(last_applied, Some(log_id(2, 80)));
    assert_eq!(after, before);
    // Reopening again (no new writes) changes nothing.
    assert_eq!(reopen_node(dir.path()).0, before);
}

#[test]
fn restarted_memory_node_restores_its_snapshot_then_replays_the_rest() {
    let entries = history(80);
    runtime().block_on(async {
        let mut log_store = MemLogStore::default();
        let mut state_machine = StateMachineStore::in_memory();
        let before = drive(&mut log_store, &mut state_machine, &entries, Some(45)).await;

        let mut restarted = state_machine.restarted().await.expect("restarts");
        assert_eq!(restarted.last_applied(), Some(log_id(2, 44)));
        let mut log_store = log_store.clone();
        StorageHelper::new(&mut log_store, &mut restarted)
            .get_initial_state()
            .await
            .expect("initial state");
        assert_eq!(restarted.last_applied(), Some(log_id(2, 80)));
        assert_eq!(machine_bytes(&restarted), before);
        // The restarted node is its own: the old one is untouched by it.
        assert_eq!(machine_bytes(&state_machine), before);
    });
}

/// A network for a cluster of one: no peer is ever called.
struct NoPeers;

struct NoPeer;

fn no_peer<E: std::error::Error>() -> RPCError<u64, BasicNode, E> {
    RPCError::Unreachable(Unreachable::new(&AnyError::error("a cluster of one")))
}

impl RaftNetworkFactory<TypeConfig> for NoPeers {
    type Network = NoPeer;

    async fn new_client(&mut self, _target: u64, _node: &BasicNode) -> NoPeer {
        NoPeer
    }
}

impl RaftNetwork<TypeConfig> for NoPeer {
    async fn append_entries(
        &mut self,
        _rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(no_peer())
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, InstallSnapshotError>>,
    > {
        Err(no_peer())
    }

    async fn vote(
        &mut self,
        _rpc: VoteRequest<u64>,
        _option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        Err(no_peer())
    }
}

/// Bound on every wait for the single node (election, commit, apply).
const WAIT: Duration = Duration::from_secs(10);

/// Starts node 1 on the sled directory, as leader of a cluster of one.
async fn start_single_node(dir: &Path, initialize: bool) -> (Raft, StateMachineStore) {
    let (log_store, state_machine) = open_node_storage(dir).expect("opens");
    let config = openraft::Config {
        cluster_name: "raft-store-test".into(),
        ..Default::default()
    };
    let config = Arc::new(config.validate().expect("config"));
    let raft = Raft::new(1, config, NoPeers, log_store, state_machine.clone())
        .await
        .expect("raft");
    if initialize {
        let members: BTreeMap<u64, BasicNode> = [(1, BasicNode::new("127.0.0.1:0"))].into();
        raft.initialize(members).await.expect("initialize");
    }
    raft.wait(Some(WAIT))
        .current_leader(1, "node 1 leads")
        .await
        .expect("leader");
    (raft, state_machine)
}

async fn write(raft: &Raft, stamped_time_ms: u64, command: Command) -> Result<Reply, Rejection> {
    let proposal = Proposal::single(stamped_time_ms, command);
    let written = tokio::time::timeout(WAIT, raft.client_write(proposal))
        .await
        .expect("commits in time")
        .expect("commits");
    let mut results = written.data.results;
    assert_eq!(results.len(), 1, "one answer per command");
    results.remove(0)
}

#[test]
fn single_node_raft_commits_through_the_stores_and_recovers_after_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let window = WindowPoolConfig {
        capacity_millitokens_per_window: 1_000,
        window_ms: 60_000,
        lease_ttl_ms: 10_000,
        regions: None,
    };
    let (before, first_epoch) = runtime().block_on(async {
        let (raft, state_machine) = start_single_node(dir.path(), true).await;
        let create = Command::CreatePool {
            pool: "quota".into(),
            config: PoolConfig::Window(window),
        };
        let created = write(&raft, 1_000, create).await.expect("created");
        let register = Command::RegisterRegion {
            pool: "quota".into(),
            region: "eu".into(),
        };
        write(&raft, 1_001, register).await.expect("registered");
        for lease in 0..20 {
            let granted = write(&raft, 2_000 + lease, grant(&format!("l{lease}"), 100)).await;
            assert_eq!(granted.map(|reply| reply.epoch), Ok(created.epoch));
        }
        raft.trigger().snapshot().await.expect("snapshot");
        for lease in 20..25 {
            write(&raft, 3_000 + lease, grant(&format!("l{lease}"), 100))
                .await
                .expect("answered");
        }
        let refused = write(&raft, 4_000, grant("l0", 0)).await;
        assert!(matches!(refused, Err(Rejection { epoch, .. }) if epoch == created.epoch));
        let before = machine_bytes(&state_machine);
        raft.shutdown().await.expect("shutdown");
        (before, created.epoch)
    });

    runtime().block_on(async {
        // No initialize: the node recovers its membership and log from sled.
        let (raft, state_machine) = start_single_node(dir.path(), false).await;
        let retried = write(&raft, 5_000, grant("l3", 100))
            .await
            .expect("answered");
        // openraft 0.9 restores a sole voter's committed leadership at
        // startup in the same term: the epoch never goes down.
        assert!(retried.epoch >= first_epoch);
        let Outcome::Granted(answer) = retried.outcome else {
            panic!("not a grant: {:?}", retried.outcome);
        };
        assert_eq!(answer.granted_millitokens, 100, "the original answer");
        // The replayed machine, then the retry (which changed only time and
        // the epoch), against the machine before the restart.
        let after = state_machine.read(|state| {
            let mut restored = leasehold_allocator::Machine::restore(&before).expect("restores");
            let retry = leasehold_allocator::StampedCommand {
                epoch: retried.epoch,
                stamped_time_ms: 5_000,
                command: grant("l3", 100),
            };
            restored.apply(&retry).expect("applies");
            (restored, state.machine.clone())
        });
        assert_eq!(after.0, after.1);
        raft.shutdown().await.expect("shutdown");
    });
}

/// The group's voters, learners and whether a change is in progress, as
/// node 1 sees it.
fn membership_of(raft: &Raft) -> (Vec<BTreeSet<u64>>, BTreeSet<u64>) {
    let membership = raft
        .metrics()
        .borrow()
        .membership_config
        .membership()
        .clone();
    let learners = membership.learner_ids().collect();
    (membership.get_joint_config().clone(), learners)
}

fn window_pool(pool: &str) -> Command {
    Command::CreatePool {
        pool: pool.into(),
        config: PoolConfig::Window(WindowPoolConfig {
            capacity_millitokens_per_window: 1_000,
            window_ms: 60_000,
            lease_ttl_ms: 10_000,
            regions: None,
        }),
    }
}

/// Issue 13 item 2 on real sled files: a cluster of one promotes a learner
/// at a dead address (what AddNode did before it probed and waited for
/// catch-up). The joint configuration {1} + {1, 42} can never commit; a
/// restart keeps it; `--drop-stuck-membership`'s rollback (dry run first)
/// removes it and what follows, and the restarted node leads again in a
/// higher term, commits, and removes the learner.
#[test]
fn a_stuck_joint_configuration_is_rolled_back_on_the_sled_files() {
    let dir = tempfile::tempdir().expect("temp dir");
    let (stuck_index, stuck_term) = runtime().block_on(async {
        let (raft, _state_machine) = start_single_node(dir.path(), true).await;
        write(&raft, 1_000, window_pool("before"))
            .await
            .expect("created");
        tokio::time::timeout(
            WAIT,
            raft.add_learner(42, BasicNode::new("127.0.0.1:1"), false),
        )
        .await
        .expect("learner entry in time")
        .expect("learner added");
        let promote = raft.change_membership(ChangeMembers::AddVoterIds([42].into()), false);
        // Never commits: node 42 does not exist. (Bounded: no fixed wait
        // is needed for an event that cannot happen.)
        assert!(
            tokio::time::timeout(Duration::from_millis(500), promote)
                .await
                .is_err(),
            "the joint configuration committed without node 42"
        );
        let (configs, _) = membership_of(&raft);
        assert_eq!(configs, vec![[1].into(), [1, 42].into()]);
        // A client write after it is appended, never committed.
        let proposal = Proposal::single(2_000, window_pool("never"));
        assert!(
            tokio::time::timeout(Duration::from_millis(500), raft.client_write(proposal))
                .await
                .is_err()
        );
        let metrics = raft.metrics().borrow().clone();
        let stuck = metrics
            .membership_config
            .log_id()
            .expect("membership log id");
        raft.shutdown().await.expect("shutdown");
        (stuck.index, stuck.leader_id.term)
    });

    // A restart does not help: node 1 resumes its term, in the joint
    // configuration, and commits nothing.
    runtime().block_on(async {
        let (raft, _state_machine) = start_single_node(dir.path(), false).await;
        let (configs, _) = membership_of(&raft);
        assert_eq!(configs, vec![[1].into(), [1, 42].into()]);
        let proposal = Proposal::single(3_000, window_pool("still-never"));
        assert!(
            tokio::time::timeout(Duration::from_millis(500), raft.client_write(proposal))
                .await
                .is_err()
        );
        raft.shutdown().await.expect("shutdown");
    });

    let facts = |dir: &Path| {
        runtime().block_on(async {
            let db = NodeDb::open(dir).expect("opens");
            let mut log = SledLogStore::open(&db).expect("log");
            let state = StateMachineStore::open_sled(&db).expect("state");
            recover::read_facts(&mut log, &state, 1)
                .await
                .expect("facts")
        })
    };
    let before = facts(dir.path());
    // The dry run plans and writes nothing.
    let dry = runtime()
        .block_on(recover::drop_stuck_membership(dir.path(), 1, false))
        .expect("a plan");
    assert!(!dry.written);
    assert_eq!(dry.plan.truncate_from.index, stuck_index);
    assert!(dry.plan.led_by_this_node);
    assert!(dry.plan.dropped_command_entries >= 1, "{}", dry.plan);
    let (_, restored) = &dry.plan.restored;
    assert_eq!(restored.voter_ids().collect::<Vec<_>>(), vec![1]);
    assert_eq!(restored.learner_ids().collect::<Vec<_>>(), vec![42]);
    assert_eq!(facts(dir.path()), before, "a dry run wrote");

    let written = runtime()
        .block_on(recover::drop_stuck_membership(dir.path(), 1, true))
        .expect("rolled back");
    assert!(written.written);
    assert_eq!(written.plan, dry.plan);
    let after = facts(dir.path());
    assert_eq!(
        after.entries.last().map(|entry| entry.log_id.index),
        Some(stuck_index - 1)
    );
    assert_eq!(after.vote, Some(written.plan.vote_after));
    assert!(written.plan.vote_after.leader_id.term > stuck_term);
    // Run again: nothing left to roll back.
    assert!(matches!(
        runtime().block_on(recover::drop_stuck_membership(dir.path(), 1, true)),
        Err(recover::RecoverError::Nothing(_))
    ));

    runtime().block_on(async {
        let (raft, state_machine) = start_single_node(dir.path(), false).await;
        let (configs, learners) = membership_of(&raft);
        assert_eq!(configs, vec![BTreeSet::from([1])]);
        assert_eq!(learners, BTreeSet::from([42]));
        let created = write(&raft, 4_000, window_pool("after"))
            .await
            .expect("commits again");
        assert!(
            created.epoch > stuck_term,
            "a higher term: {}",
            created.epoch
        );
        state_machine.read(|state| {
            assert!(state.machine.pool("before").is_some());
            assert!(state.machine.pool("after").is_some());
            assert!(state.machine.pool("never").is_none());
        });
        let removed = tokio::time::timeout(
            WAIT,
            raft.change_membership(ChangeMembers::RemoveNodes([42].into()), false),
        )
        .await
        .expect("in time")
        .expect("learner removed");
        let membership = removed.membership.expect("membership");
        assert_eq!(
            membership.nodes().map(|(id, _)| *id).collect::<Vec<_>>(),
            vec![1]
        );
        raft.shutdown().await.expect("shutdown");
    });
}
