//! Replication of the pool state machine with openraft 0.9 (`storage-v2`,
//! `single-term-leader`). The pure [`crate::Machine`] is the state; this
//! module feeds it committed entries and stores the log.
//!
//! - [`types`]: the raft type configuration (what an entry carries).
//! - [`storage`]: a node's one sled Db, its serialized flushes and errors;
//!   [`disk`]: [`open_node_storage`] (the log and the state machine on it).
//! - [`log_store`]: the raft log, durable ([`SledLogStore`]) or in memory
//!   ([`MemLogStore`]).
//! - [`state_machine`]: [`StateMachineStore`], applying committed entries to
//!   the machine, and its snapshots.
//! - [`runtime`]: openraft's Tokio runtime with a per-node seedable RNG.
//! - [`network`]: the raft RPCs over tonic, through the node's connector.
//! - [`senders`]: who may send this node raft messages (the certificate's
//!   node, as itself, a member).
//! - [`membership`]: what an AddNode or RemoveNode may do (pure rules).
//! - [`node`]: a node's handle (proposals, reads, membership requests
//!   carried out on the leader); starting one is [`crate::running`].
//! - [`recover`]: offline rollback of a stuck membership entry on a stopped
//!   node's sled files (`leasehold allocator --drop-stuck-membership`).

pub mod disk;
pub mod handover;
pub mod log_store;
pub mod membership;
pub mod network;
pub mod node;
pub mod recover;
pub mod runtime;
pub mod senders;
pub mod state_machine;
pub mod storage;
pub mod types;

pub use disk::open_node_storage;
pub use log_store::{MemLogStore, SledLogStore};
pub use state_machine::{AppliedState, StateMachineStore};
pub use storage::{NodeDb, StoreError};
pub use types::{NodeId, Proposal, ProposalResponse, Raft, TypeConfig, MAX_COMMANDS_PER_ENTRY};
