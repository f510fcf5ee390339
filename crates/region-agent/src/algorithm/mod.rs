//! The rate-limiting algorithms as pure Rust: one module per script in
//! `lua/`, each the exact twin of its Lua (same validation, same integer
//! math, same reads and writes on a [`Keyspace`]). `eval` runs a
//! [`ScriptCall`] at a given store time; the reply ends with that `now_ms`.

pub mod bucket;
pub mod bucket_charge;
pub mod bucket_pack;
pub mod chunk_counter;
pub mod chunk_index;
pub mod concurrency;
pub mod fixed_window;
pub mod gcra;
pub mod give_back;
pub mod lease_block;
pub mod lease_record;
pub mod look;
pub mod multi_decision;
pub mod multi_rule;
pub mod pool_demand;
pub mod rls_window;
pub mod share_gate;
pub mod share_record;
pub mod sliding_counter;
pub mod sliding_log;
pub mod syncer_lease;
pub mod token_bucket;
pub mod usage_owed;
pub mod usage_read;
pub mod usage_record;
pub mod usage_sender;

use crate::store::keyspace::Keyspace;
use crate::store::script::{ScriptCall, ScriptError, ScriptKind};

/// Runs `call` on `space` at store time `now_ms`, exactly as its Lua would.
pub fn eval(space: &mut Keyspace, call: &ScriptCall, now_ms: i64) -> Result<Vec<i64>, ScriptError> {
    let (keys, argv) = (&call.keys[..], &call.args[..]);
    match call.kind {
        ScriptKind::TokenBucket => token_bucket::eval(space, keys, argv, now_ms),
        ScriptKind::MultiRule => multi_rule::eval(space, keys, argv, now_ms),
        ScriptKind::LeaseBlock => lease_block::eval(space, keys, argv, now_ms),
        ScriptKind::GiveBack => give_back::eval(space, keys, argv, now_ms),
        ScriptKind::Concurrency => concurrency::eval(space, keys, argv, now_ms),
        ScriptKind::FixedWindow => fixed_window::eval(space, keys, argv, now_ms),
        ScriptKind::SlidingLog => sliding_log::eval(space, keys, argv, now_ms),
        ScriptKind::SlidingCounter => sliding_counter::eval(space, keys, argv, now_ms),
        ScriptKind::Gcra => gcra::eval(space, keys, argv, now_ms),
        ScriptKind::ChunkCredit => chunk_counter::eval_credit(space, keys, argv, now_ms),
        ScriptKind::ChunkSpend => chunk_counter::eval_spend(space, keys, argv, now_ms),
        ScriptKind::RlsWindow => rls_window::eval(space, keys, argv, now_ms),
        ScriptKind::ShareGate => share_gate::eval(space, keys, argv, now_ms),
        ScriptKind::ShareWrite => share_record::eval_write(space, keys, argv, now_ms),
        ScriptKind::ShareRead => share_record::eval_read(space, keys, argv, now_ms),
        ScriptKind::PoolDemand => pool_demand::eval(space, keys, argv, now_ms),
        ScriptKind::ChunkIndex => chunk_index::eval(space, keys, argv, now_ms),
        ScriptKind::SyncerLease => syncer_lease::eval(space, keys, argv, now_ms),
        // Its reply is one reply per sub-call, not one integer array: see
        // `multi_decision::eval`. Refused whole, like a malformed envelope.
        ScriptKind::MultiDecision => Err(ScriptError::InvalidArgument("calls".into())),
        ScriptKind::Look => look::eval(space, keys, argv, now_ms),
        ScriptKind::BucketPack => bucket_pack::eval(space, keys, argv, now_ms),
        ScriptKind::UsageRecord => usage_record::eval(space, keys, argv, now_ms),
        ScriptKind::UsageRead => usage_read::eval(space, keys, argv, now_ms),
        ScriptKind::UsageSender => usage_sender::eval(space, keys, argv, now_ms),
        ScriptKind::BucketCharge => bucket_charge::eval(space, keys, argv, now_ms),
        ScriptKind::UsageOwed => usage_owed::eval(space, keys, argv, now_ms),
    }
}

/// The answer of the single-key admission scripts (`token_bucket`, `gcra`,
/// `fixed_window`, `sliding_counter`); their reply is
/// `{allowed, remaining, retry_after_ms, now_ms}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verdict {
    pub allowed: bool,
    /// In the algorithm's unit: millitokens for `token_bucket` and `gcra`,
    /// units of the limit for the window algorithms.
    pub remaining: u64,
    /// 0 when allowed; -1 = can never succeed (cost above capacity or
    /// limit); otherwise the algorithm's retry hint in ms.
    pub retry_after_ms: i64,
}

impl Verdict {
    /// A cost above the capacity (or limit): refused, nothing read or written.
    pub const NEVER: Verdict = Verdict {
        allowed: false,
        remaining: 0,
        retry_after_ms: -1,
    };

    /// The script's reply: the verdict, then the store time it used.
    pub fn reply(&self, now_ms: i64) -> Vec<i64> {
        vec![
            i64::from(self.allowed),
            self.remaining as i64,
            self.retry_after_ms,
            now_ms,
        ]
    }
}
