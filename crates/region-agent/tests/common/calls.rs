//! Calls of every script kind on the keys of one hash tag, and a proptest
//! strategy over them: shared by the multi_decision differential test (one
//! tag, one node) and the cluster's (many tags over several primaries).

use leasehold_region_agent::algorithm::multi_rule::request_digest;
use leasehold_region_agent::store::script::{ScriptCall, ScriptKind};
use leasehold_region_agent::store::slots::hash_tag;
use proptest::prelude::*;

/// (capacity, refill, period_ms): slow enough that a case mostly drains.
pub const RATE: (u64, u64, u64) = (10_000, 1_000, 1_000);
pub const LONG_TTL_MS: u64 = 600_000;

/// Bucket hash `i` of `tag` ({tokens, ts}: token_bucket, multi_rule,
/// lease_block and give_back share them).
pub fn bucket_key(tag: &str, i: usize) -> String {
    format!("lh:v1:{{{tag}}}:{}:p", ["a", "b", "c"][i % 3])
}

/// Share record `i` of `tag` (share_write, share_read, share_gate).
pub fn share_record(tag: &str, i: u8) -> String {
    format!("lh:v1:{{{tag}}}:_share:pool-{i}")
}

fn key(tag: &str, what: &str) -> String {
    format!("lh:v1:{{{tag}}}:{what}:p")
}

pub fn token_bucket(key: &str, cost: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::TokenBucket)
        .key(key)
        .arg(RATE.0)
        .arg(RATE.1)
        .arg(RATE.2)
        .arg(cost)
        .arg(1_000)
}

/// A multi_rule call charging `costs` on `buckets` (one tag), with a
/// decision record `decision` (None: no record).
pub fn multi_rule(buckets: &[&str], costs: &[u64], decision: Option<u8>) -> ScriptCall {
    let tag = hash_tag(buckets[0]);
    let record = format!("lh:v1:{{{tag}}}:decision:d{}", decision.unwrap_or(0));
    let digest = request_digest(buckets.iter().copied().zip(costs.iter().copied()));
    let ttl = if decision.is_some() { LONG_TTL_MS } else { 0 };
    let mut call = ScriptCall::new(ScriptKind::MultiRule)
        .key(record)
        .arg(1_000)
        .arg(ttl)
        .arg(digest)
        .arg(0);
    for (key, cost) in buckets.iter().zip(costs) {
        call = call.key(*key).arg(RATE.0).arg(RATE.1).arg(RATE.2).arg(cost);
    }
    call
}

fn lease_record(bucket: &str, lease: u8) -> String {
    format!("lh:v1:{{{}}}:_lease:b:lease-{lease}", hash_tag(bucket))
}

/// Holders a lease or give-back comes from: a gateway and (issue 29) an
/// agent leasing for itself, so a lease id taken by one is tried by the other.
pub const HOLDERS: [&str; 2] = ["gateway/eu", "agent/eu-1"];

pub fn lease_block(key: &str, lease: u8, block: u64, holder: u8) -> ScriptCall {
    ScriptCall::new(ScriptKind::LeaseBlock)
        .key(key)
        .key(lease_record(key, lease))
        .arg(RATE.0)
        .arg(RATE.1)
        .arg(RATE.2)
        .arg(block)
        .arg(4)
        .arg(1_000)
        .arg(LONG_TTL_MS)
        .arg(HOLDERS[holder as usize % HOLDERS.len()])
        .arg("api")
        .arg("p-hot")
}

pub fn give_back(key: &str, lease: u8, tokens: u64, holder: u8) -> ScriptCall {
    ScriptCall::new(ScriptKind::GiveBack)
        .key(key)
        .key(lease_record(key, lease))
        .arg(RATE.0)
        .arg(RATE.1)
        .arg(RATE.2)
        .arg(tokens)
        .arg(1_000)
        .arg(HOLDERS[holder as usize % HOLDERS.len()])
}

/// One call of some kind, on keys of a tag chosen later ([`to_call`]).
#[derive(Debug, Clone)]
pub enum Sub {
    Bucket {
        key: usize,
        cost: u64,
    },
    Rules {
        keys: Vec<usize>,
        costs: Vec<u64>,
        decision: Option<u8>,
    },
    Lease {
        key: usize,
        lease: u8,
        block: u64,
        /// Index into [`HOLDERS`].
        holder: u8,
    },
    GiveBack {
        key: usize,
        lease: u8,
        tokens: u64,
        holder: u8,
    },
    Window {
        cost: u64,
    },
    Gcra {
        cost: u64,
    },
    Slot {
        acquire: bool,
        lease: u8,
    },
    Log {
        member: u8,
    },
    Counter {
        cost: u64,
    },
    Credit {
        chunk: u8,
        granted: u64,
    },
    Spend {
        chunks: Vec<u8>,
        cost: u64,
    },
    Rls {
        hits: u64,
    },
    Invalid {
        key: usize,
    },
    /// A token_bucket, multi_rule or lease_block call under share record
    /// `record` (share_gate).
    Gated {
        inner: Box<Sub>,
        record: u8,
    },
    ShareWrite {
        record: u8,
        token: u64,
        ttl_ms: u64,
        capacity: u64,
    },
    ShareRead {
        record: u8,
    },
    Demand {
        requests: u64,
        spent: u64,
        take: bool,
    },
    /// op 1 add (token, n, granted, expires_at_ms), 2 read, 3 clear (token).
    Index {
        op: u8,
        token: u64,
        n: u64,
        expires_at_ms: u64,
    },
    SyncerLease {
        release: bool,
        agent: u8,
        ttl_ms: u64,
    },
}

/// The state several agents of a Region share: share records and the
/// gate that reads them, pool demand, the chunk index, the syncer lease.
pub fn shared_state() -> impl Strategy<Value = Sub> {
    let ttl = || prop::sample::select(vec![1u64, 40, LONG_TTL_MS]);
    let gateable = prop_oneof![
        (0..3usize, prop::sample::select(vec![1_000u64, 3_000]))
            .prop_map(|(key, cost)| Sub::Bucket { key, cost }),
        (
            prop::sample::subsequence(vec![0usize, 1, 2], 1..=3),
            prop::collection::vec(prop::sample::select(vec![1_000u64, 4_000]), 3),
            prop::option::of(0u8..3)
        )
            .prop_map(|(keys, costs, decision)| Sub::Rules {
                keys,
                costs,
                decision
            }),
        (
            0..3usize,
            0u8..3,
            prop::sample::select(vec![1_000u64, 4_000]),
            0u8..2
        )
            .prop_map(|(key, lease, block, holder)| Sub::Lease {
                key,
                lease,
                block,
                holder
            }),
    ];
    prop_oneof![
        4 => (gateable, 0u8..2).prop_map(|(inner, record)| Sub::Gated { inner: Box::new(inner), record }),
        2 => (0u8..2, 1u64..4, ttl(), prop::sample::select(vec![0u64, 3_000, 20_000]))
            .prop_map(|(record, token, ttl_ms, capacity)| Sub::ShareWrite { record, token, ttl_ms, capacity }),
        1 => (0u8..2).prop_map(|record| Sub::ShareRead { record }),
        1 => (0u64..5, 0u64..3_000, any::<bool>())
            .prop_map(|(requests, spent, take)| Sub::Demand { requests, spent, take }),
        2 => (1u8..=3, 1u64..4, 0u64..4, prop::sample::select(vec![1u64, FAR_FUTURE_MS]))
            .prop_map(|(op, token, n, expires_at_ms)| Sub::Index { op, token, n, expires_at_ms }),
        2 => (any::<bool>(), 0u8..2, ttl())
            .prop_map(|(release, agent, ttl_ms)| Sub::SyncerLease { release, agent, ttl_ms }),
    ]
}

/// An instant no test reaches (2096).
pub const FAR_FUTURE_MS: u64 = 4_000_000_000_000;

/// The kinds the multi_decision test has always mixed.
pub fn sub() -> impl Strategy<Value = Sub> {
    let cost = || prop::sample::select(vec![1u64, 500, 1_000, 3_000, 12_000]);
    prop_oneof![
        3 => (0..3usize, cost()).prop_map(|(key, cost)| Sub::Bucket { key, cost }),
        4 => (prop::sample::subsequence(vec![0usize, 1, 2], 1..=3),
              prop::collection::vec(cost(), 3),
              prop::option::of(0u8..4))
            .prop_map(|(keys, costs, decision)| Sub::Rules { keys, costs, decision }),
        2 => (0..3usize, 0u8..3, prop::sample::select(vec![1_000u64, 4_000]), 0u8..2)
            .prop_map(|(key, lease, block, holder)| Sub::Lease { key, lease, block, holder }),
        1 => (0..3usize, 0u8..3, 0u64..5_000, 0u8..2)
            .prop_map(|(key, lease, tokens, holder)| Sub::GiveBack { key, lease, tokens, holder }),
        1 => (1u64..4).prop_map(|cost| Sub::Window { cost }),
        1 => cost().prop_map(|cost| Sub::Gcra { cost }),
        1 => (any::<bool>(), 0u8..4).prop_map(|(acquire, lease)| Sub::Slot { acquire, lease }),
        1 => (0..3usize).prop_map(|key| Sub::Invalid { key }),
    ]
}

/// Every script kind but multi_decision (which carries the others).
pub fn any_kind() -> impl Strategy<Value = Sub> {
    prop_oneof![
        8 => sub(),
        1 => (0u8..6).prop_map(|member| Sub::Log { member }),
        1 => (1u64..4).prop_map(|cost| Sub::Counter { cost }),
        1 => (0u8..3, prop::sample::select(vec![0u64, 700, 2_000]))
            .prop_map(|(chunk, granted)| Sub::Credit { chunk, granted }),
        1 => (prop::sample::subsequence(vec![0u8, 1, 2], 1..=3), 1u64..1_500)
            .prop_map(|(chunks, cost)| Sub::Spend { chunks, cost }),
        1 => (0u64..4).prop_map(|hits| Sub::Rls { hits }),
        3 => shared_state(),
    ]
}

/// The call `sub` describes, on the keys of `tag`.
pub fn to_call(sub: &Sub, tag: &str) -> ScriptCall {
    let bucket = |i: usize| bucket_key(tag, i);
    let chunk = |n: u8| key(tag, &format!("chunk:eu.1:{n}"));
    match sub {
        Sub::Bucket { key, cost } => token_bucket(&bucket(*key), *cost),
        Sub::Rules {
            keys,
            costs,
            decision,
        } => {
            let keys: Vec<String> = keys.iter().map(|&k| bucket(k)).collect();
            let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
            multi_rule(&keys, &costs[..keys.len()], *decision)
        }
        Sub::Lease {
            key,
            lease,
            block,
            holder,
        } => lease_block(&bucket(*key), *lease, *block, *holder),
        Sub::GiveBack {
            key,
            lease,
            tokens,
            holder,
        } => give_back(&bucket(*key), *lease, *tokens, *holder),
        Sub::Window { cost } => ScriptCall::new(ScriptKind::FixedWindow)
            .key(key(tag, "window"))
            .arg(5)
            .arg(60_000)
            .arg(cost)
            .arg(0),
        Sub::Gcra { cost } => ScriptCall::new(ScriptKind::Gcra)
            .key(key(tag, "gcra"))
            .arg(RATE.0)
            .arg(RATE.1)
            .arg(RATE.2)
            .arg(cost)
            .arg(1_000),
        Sub::Slot {
            acquire: true,
            lease,
        } => ScriptCall::new(ScriptKind::Concurrency)
            .key(key(tag, "slots"))
            .arg("acquire")
            .arg(format!("s{lease}"))
            .arg(2)
            .arg(LONG_TTL_MS),
        Sub::Slot {
            acquire: false,
            lease,
        } => ScriptCall::new(ScriptKind::Concurrency)
            .key(key(tag, "slots"))
            .arg("release")
            .arg(format!("s{lease}")),
        Sub::Log { member } => ScriptCall::new(ScriptKind::SlidingLog)
            .key(key(tag, "log"))
            .arg(3)
            .arg(60_000)
            .arg(format!("m{member}")),
        Sub::Counter { cost } => ScriptCall::new(ScriptKind::SlidingCounter)
            .key(key(tag, "counter"))
            .arg(5)
            .arg(60_000)
            .arg(cost),
        Sub::Credit { chunk: n, granted } => ScriptCall::new(ScriptKind::ChunkCredit)
            .key(chunk(*n))
            .arg(granted)
            .arg(LONG_TTL_MS),
        Sub::Spend { chunks, cost } => chunks
            .iter()
            .fold(ScriptCall::new(ScriptKind::ChunkSpend), |c, &n| {
                c.key(chunk(n))
            })
            .arg(cost),
        Sub::Rls { hits } => ScriptCall::new(ScriptKind::RlsWindow)
            .key(key(tag, "rls"))
            .arg(60)
            .arg(hits)
            .arg(0)
            .arg(0)
            .arg(0),
        Sub::Invalid { key } => ScriptCall::new(ScriptKind::TokenBucket)
            .key(bucket(*key))
            .arg(RATE.0)
            .arg(0)
            .arg(RATE.2)
            .arg(1)
            .arg(0),
        Sub::Gated { inner, record } => {
            let call = to_call(inner, tag);
            // Every rule of the call is gated by the same record: the
            // capacity of token_bucket and lease_block is ARGV[1]; a
            // multi_rule's are at 4 + 4 × i.
            let positions: Vec<usize> = match call.kind {
                ScriptKind::MultiRule => (0..call.keys.len() - 1).map(|i| 4 + 4 * i).collect(),
                _ => vec![0],
            };
            let record = share_record(tag, *record);
            let gates: Vec<(String, usize)> =
                positions.into_iter().map(|p| (record.clone(), p)).collect();
            leasehold_region_agent::algorithm::share_gate::gated(call, &gates)
        }
        Sub::ShareWrite {
            record,
            token,
            ttl_ms,
            capacity,
        } => ScriptCall::new(ScriptKind::ShareWrite)
            .key(share_record(tag, *record))
            .arg(token)
            .arg(ttl_ms)
            .arg(capacity)
            .arg(capacity / 4)
            .arg(1)
            .arg(2)
            .arg(3)
            .arg(0)
            .arg(5_000)
            .arg(0),
        Sub::ShareRead { record } => {
            ScriptCall::new(ScriptKind::ShareRead).key(share_record(tag, *record))
        }
        Sub::Demand {
            requests,
            spent,
            take,
        } => ScriptCall::new(ScriptKind::PoolDemand)
            .key(key(tag, "_demand"))
            .arg(requests)
            .arg(spent)
            .arg(u8::from(*take))
            .arg(LONG_TTL_MS),
        Sub::Index {
            op,
            token,
            n,
            expires_at_ms,
        } => {
            let call = ScriptCall::new(ScriptKind::ChunkIndex)
                .key(key(tag, "_chunks"))
                .arg(op);
            match op {
                1 => call.arg(token).arg(7).arg(n).arg(500).arg(expires_at_ms),
                3 => call.arg(token),
                _ => call,
            }
        }
        Sub::SyncerLease {
            release,
            agent,
            ttl_ms,
        } => ScriptCall::new(ScriptKind::SyncerLease)
            .key(key(tag, "_syncer"))
            .key(key(tag, "_syncer_token"))
            .arg(if *release { 2 } else { 1 })
            .arg(format!("agent-{agent}"))
            .arg(ttl_ms),
    }
}
