//! What a run records, sample by sample: the checker's only input and the
//! report's source. Hashing the whole trace proves determinism (same seed,
//! same hash).

use std::collections::BTreeMap;

use serde::Serialize;
use sha2::{Digest, Sha256};

/// Where one Region stands in one pool at a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub enum RoomMode {
    /// Enforcing the share / chunks it holds.
    Normal,
    /// `lease` lapsed: enforcing the fallback allowance.
    Fallback,
    /// Fenced: nothing until registered again.
    Fenced,
    /// The agent is gone (lost or crashed).
    Down,
    /// Not yet learned from the allocator.
    #[default]
    Unknown,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

/// One Region, one pool, at one sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct RegionPool {
    /// Requests admitted since the previous sample.
    pub admitted: u64,
    /// Requests refused since the previous sample.
    pub refused: u64,
    /// Rate pools: what the Region's bucket enforces now (millitokens/s).
    pub enforced_millitokens_per_s: u64,
    /// Rate pools: the largest block a gateway of the Region may hold
    /// (tokens; 0 when the pool is not leased).
    pub block_tokens: u64,
    /// Rate pools, a Region with `agent_leasing`: the largest agent-side
    /// block cap B_cap (tokens, `AgentLeasingSettings::block_cap_millitokens`
    /// of the bucket in force) any of its running agents had at any
    /// simulation step since the previous sample; 0 otherwise. Left out of
    /// the trace's hash when 0 (the traces of scenarios without agent-side
    /// leasing hash as before it existed).
    #[serde(skip_serializing_if = "is_zero")]
    pub agent_block_tokens: u64,
    pub mode: RoomMode,
    /// The Region's bucket store is failing (a `store_loss` fault): its
    /// rules decide on their local fail mode.
    pub store_down: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct Sample {
    pub t_ms: u64,
    /// `[region][pool]`, in scenario order.
    pub rooms: Vec<Vec<RegionPool>>,
    /// Per pool: each Region's committed account (scenario Region order)
    /// read from a replica's applied state; `None` for window pools.
    pub committed: Vec<Option<Vec<Committed>>>,
    /// Per pool, per allocator node (1-based order): Σ committed shares on
    /// that node's applied state (millitokens/s); `None` when the node has
    /// no such rate pool (window pools, or not yet created there).
    pub committed_sums: Vec<Vec<Option<u64>>>,
    /// Per Region: its agents (several per Region: which one syncs).
    pub agents: Vec<RegionAgents>,
}

/// A Region's agents at one sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Default)]
pub struct RegionAgents {
    /// Agents running (not crashed or lost).
    pub live: u32,
    /// The running agents (0-based) whose own role says they hold the
    /// Region's syncer lease, with its fencing token; always empty for a
    /// Region of one agent (it holds its room in memory, no lease).
    pub syncers: Vec<(u32, u64)>,
    /// Agent-side leasing: tokens the running agents hold unspent in their
    /// own blocks now (every key; the simulation has one per pool). Left
    /// out of the trace's hash when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub agent_held_tokens: u64,
}

/// One Region's room in a rate pool as the allocator committed it
/// (millitokens per second).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct Committed {
    pub share: u64,
    pub pending_release: u64,
    pub pooled: u64,
    pub granted_not_taken: u64,
    /// The Region's target now (§4.3 step 3; 0 when it is not counted).
    pub target: u64,
    /// The Region's incarnation in the pool.
    pub incarnation: u64,
    /// False once the Region's room was reclaimed (fenced) until it
    /// registers again.
    pub live: bool,
}

/// A chunk grant a Region's agent took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, PartialOrd, Ord)]
pub struct GrantTaken {
    pub t_ms: u64,
    pub region: usize,
    pub pool: usize,
    pub lease_id: String,
    pub granted_millitokens: u64,
    pub epoch: u64,
}

/// An allocator reply a Region's agent applied (its epoch).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, PartialOrd, Ord)]
pub struct EpochApplied {
    pub t_ms: u64,
    pub region: usize,
    pub pool: usize,
    pub epoch: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Trace {
    pub samples: Vec<Sample>,
    /// Window pools: admitted per (pool, window start), counting a request
    /// that straddled a window boundary in both windows (conservative).
    pub window_admitted: BTreeMap<(usize, u64), u64>,
    pub grants: Vec<GrantTaken>,
    pub epochs: Vec<EpochApplied>,
    /// Fault timeline as applied: (t_ms, description).
    pub events: Vec<(u64, String)>,
    /// What the allocator nodes' apply observers found wrong, at the entry
    /// it happened (every node, every applied command).
    pub applied: Vec<AppliedCheck>,
    /// Commands the apply observers checked (all nodes together).
    pub applied_checked: u64,
}

/// A check of one applied command on one allocator node that failed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct AppliedCheck {
    pub t_ms: u64,
    /// 1-based allocator node.
    pub node: u64,
    /// Scenario pool index (`None`: the machine as a whole).
    pub pool: Option<usize>,
    /// The bound's short name: `committed` (Σ committed shares ≤ L, or
    /// another invariant of the state machine) or `grants` (a lease id
    /// answered with a second, different grant).
    pub bound: String,
    pub detail: String,
}

impl Trace {
    /// sha256 over the canonical JSON of the whole trace.
    pub fn hash(&self) -> String {
        // JSON maps need string keys: the window counts go as a list.
        let canonical = (
            &self.samples,
            self.window_admitted.iter().collect::<Vec<_>>(),
            &self.grants,
            &self.epochs,
            &self.events,
            &self.applied,
            self.applied_checked,
        );
        // Plain data (integers, strings, lists): serialization cannot fail.
        let json = serde_json::to_vec(&canonical).expect("a trace serializes");
        hex::encode(Sha256::digest(&json))
    }
}
