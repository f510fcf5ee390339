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

pub fn lease_block(key: &str, lease: u8, block: u64) -> ScriptCall {
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
}

pub fn give_back(key: &str, lease: u8, tokens: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::GiveBack)
        .key(key)
        .key(lease_record(key, lease))
        .arg(RATE.0)
        .arg(RATE.1)
        .arg(RATE.2)
        .arg(tokens)
        .arg(1_000)
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
    },
    GiveBack {
        key: usize,
        lease: u8,
        tokens: u64,
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
}

/// The kinds the multi_decision test has always mixed.
pub fn sub() -> impl Strategy<Value = Sub> {
    let cost = || prop::sample::select(vec![1u64, 500, 1_000, 3_000, 12_000]);
    prop_oneof![
        3 => (0..3usize, cost()).prop_map(|(key, cost)| Sub::Bucket { key, cost }),
        4 => (prop::sample::subsequence(vec![0usize, 1, 2], 1..=3),
              prop::collection::vec(cost(), 3),
              prop::option::of(0u8..4))
            .prop_map(|(keys, costs, decision)| Sub::Rules { keys, costs, decision }),
        2 => (0..3usize, 0u8..3, prop::sample::select(vec![1_000u64, 4_000]))
            .prop_map(|(key, lease, block)| Sub::Lease { key, lease, block }),
        1 => (0..3usize, 0u8..3, 0u64..5_000)
            .prop_map(|(key, lease, tokens)| Sub::GiveBack { key, lease, tokens }),
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
        Sub::Lease { key, lease, block } => lease_block(&bucket(*key), *lease, *block),
        Sub::GiveBack { key, lease, tokens } => give_back(&bucket(*key), *lease, *tokens),
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
    }
}
