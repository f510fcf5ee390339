//! A Region served by several agents (ARCHITECTURE §4, `[global]
//! agent_id`): the pure part. What the agents must agree on lives in the
//! Region's Redis and is read by the scripts atomically with each decision:
//!
//! - **Rate pools**: the syncer writes the Region's enforced bucket
//!   (capacity and refill, the share after the `lease` clamp) into a share
//!   record under every hash tag the pool is spent under, and a summary
//!   under `{g-<pool>}` that the other agents read for their own view.
//!   Every call charging a rate-pool bucket runs under `share_gate`, which
//!   lowers the call's rate to the record's: a lowered share is in force for
//!   every agent the moment it is written, and the syncer acknowledges it to
//!   the allocator only after every record took it. A record lives
//!   [`record_ttl_ms`] unless rewritten, so a Region whose agents all died
//!   does not come back enforcing a share the allocator has since
//!   reclaimed.
//! - **Window pools**: the syncer indexes every chunk it credits
//!   (`chunk_index`); every agent spends from the indexed chunks.
//! - **Demand**: every agent adds its requests (and chunk spends) to a
//!   per-pool counter the syncer takes at each Rebalance (`pool_demand`).
//! - **The syncer**: one agent at a time, by a Redis lease with a fencing
//!   token (`syncer_lease`); every record the syncer writes carries the
//!   token and a lower one cannot overwrite it.
//!
//! This module builds those calls and reads their replies; the I/O is in
//! [`crate::global::sync`] and [`crate::global::region_state`].

use crate::global::room::{HeldChunk, RateView};
use crate::global::share_sync::{BucketRate, Mode};
use crate::key::{KeyBuilder, PoolRecord};
use crate::store::script::{ScriptCall, ScriptError, ScriptKind, ScriptReply};

/// How long untaken demand counts survive in Redis (a Region whose syncer
/// is gone for longer reports fresh demand when one returns).
pub const DEMAND_TTL_MS: u64 = 60_000;

/// The record values a syncer writes (`share_write` ARGV 3..10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShareRecord {
    pub bucket: BucketRate,
    pub share_version: u64,
    pub epoch: u64,
    pub incarnation: u64,
    pub mode: Mode,
    pub interval_ms: u64,
    pub fallback_allowance_millitokens_per_s: u64,
}

impl ShareRecord {
    pub fn of_view(view: &RateView) -> Self {
        ShareRecord {
            bucket: view.bucket,
            share_version: view.share_version,
            epoch: view.epoch,
            incarnation: view.incarnation,
            mode: view.mode,
            interval_ms: view.interval_ms,
            fallback_allowance_millitokens_per_s: view.fallback_allowance_millitokens_per_s,
        }
    }

    /// The view an agent that is not the syncer enforces from a record.
    pub fn view(&self) -> RateView {
        RateView {
            bucket: self.bucket,
            mode: self.mode,
            incarnation: self.incarnation,
            share_version: self.share_version,
            epoch: self.epoch,
            interval_ms: self.interval_ms,
            fallback_allowance_millitokens_per_s: self.fallback_allowance_millitokens_per_s,
        }
    }

    /// `share_write` of this record into `key` under `token`.
    pub fn write_call(&self, key: &str, token: u64, ttl_ms: u64) -> ScriptCall {
        let cap = |v: u64| v.min(crate::args::MAX_ARG);
        ScriptCall::new(ScriptKind::ShareWrite)
            .key(key)
            .arg(token)
            .arg(ttl_ms.max(1))
            .arg(cap(self.bucket.capacity_millitokens))
            .arg(cap(self.bucket.refill_millitokens_per_s))
            .arg(cap(self.share_version))
            .arg(cap(self.epoch))
            .arg(cap(self.incarnation))
            .arg(mode_code(self.mode))
            .arg(cap(self.interval_ms))
            .arg(cap(self.fallback_allowance_millitokens_per_s))
    }
}

fn mode_code(mode: Mode) -> u8 {
    match mode {
        Mode::Normal => 0,
        Mode::Fallback => 1,
        Mode::Fenced => 2,
    }
}

fn malformed(kind: ScriptKind, detail: &str) -> ScriptError {
    ScriptError::MalformedReply {
        script: kind.name(),
        detail: detail.to_string(),
    }
}

fn shaped(kind: ScriptKind, reply: &ScriptReply, len: usize) -> Result<&[i64], ScriptError> {
    if reply.values.len() != len || reply.values.iter().any(|v| *v < 0) {
        return Err(malformed(kind, "unexpected shape"));
    }
    Ok(&reply.values)
}

/// `share_write`'s answer: the record took the values, or a live record of
/// a higher token (a newer syncer's) refused them.
pub fn written(reply: &ScriptReply) -> Result<bool, ScriptError> {
    let v = shaped(ScriptKind::ShareWrite, reply, 3)?;
    match v[0] {
        0 | 1 => Ok(v[0] == 1),
        _ => Err(malformed(ScriptKind::ShareWrite, "written")),
    }
}

pub fn read_call(key: &str) -> ScriptCall {
    ScriptCall::new(ScriptKind::ShareRead).key(key)
}

/// `share_read`'s answer: the record, or `None` when there is none live.
pub fn read(reply: &ScriptReply) -> Result<Option<ShareRecord>, ScriptError> {
    let kind = ScriptKind::ShareRead;
    let v = shaped(kind, reply, 12)?;
    if v[0] == 0 {
        return Ok(None);
    }
    let mode = match v[6] {
        0 => Mode::Normal,
        1 => Mode::Fallback,
        2 => Mode::Fenced,
        _ => return Err(malformed(kind, "mode")),
    };
    let u = |i: usize| v[i] as u64;
    Ok(Some(ShareRecord {
        bucket: BucketRate {
            capacity_millitokens: u(1),
            refill_millitokens_per_s: u(2),
        },
        share_version: u(3),
        epoch: u(4),
        incarnation: u(5),
        mode,
        interval_ms: u(7),
        fallback_allowance_millitokens_per_s: u(8),
    }))
}

/// `pool_demand`: add what this agent saw; `take` also resets the totals
/// (the syncer, at each Rebalance or chunk check).
pub fn demand_call(
    keys: &KeyBuilder,
    pool: &str,
    requests: u64,
    spent_millitokens: u64,
    take: bool,
) -> ScriptCall {
    let cap = |v: u64| v.min(crate::args::MAX_ARG);
    ScriptCall::new(ScriptKind::PoolDemand)
        .key(keys.pool_record(pool, PoolRecord::Demand))
        .arg(cap(requests))
        .arg(cap(spent_millitokens))
        .arg(u8::from(take))
        .arg(DEMAND_TTL_MS)
}

/// `pool_demand`'s totals: (requests, spent millitokens).
pub fn demand(reply: &ScriptReply) -> Result<(u64, u64), ScriptError> {
    let v = shaped(ScriptKind::PoolDemand, reply, 3)?;
    Ok((v[0] as u64, v[1] as u64))
}

/// Lease-id run numbers are below this (10 digits: a Region of ≤ 32
/// bytes, the dot and 10 digits fill the prefix cap, and the chunk index
/// keeps the number under its scripts' 2^40 cap).
pub const LEASE_ID_RUNS: u64 = 10_000_000_000;

/// The lease-id prefix of one window-pool sync: `<region>.<run>`, `run`
/// drawn at random for every sync run (every boot, every syncer term) by
/// [`run_from`]. Random, not the boot's time, so nobody can predict a
/// Region's next ids (issue 27; the allocator keeps lease ids per Region
/// anyway, so a guess could not take one), and two agents of a Region, or
/// one agent's next term, never reuse a previous run's ids (a collision
/// needs the same of 10^10 draws while the earlier run's records live,
/// i.e. within two windows).
pub fn lease_id_prefix(region: &str, run: u64) -> String {
    format!("{region}.{}", run % LEASE_ID_RUNS)
}

/// A fresh run number for [`lease_id_prefix`] from `generator` (the
/// OS-seeded one; a seeded one in the simulation).
pub fn run_from(generator: &mut impl rand::RngCore) -> u64 {
    generator.next_u64() % LEASE_ID_RUNS
}

/// The numbers that name a chunk in the index: the lease id is
/// `<region>.<prefix_id>:<n>` ([`crate::global::chunk::LeaseIds`]).
pub fn lease_id_numbers(region: &str, lease_id: &str) -> Option<(u64, u64)> {
    let rest = lease_id.strip_prefix(region)?.strip_prefix('.')?;
    let (prefix, n) = rest.split_once(':')?;
    let number = |s: &str| {
        (!s.is_empty() && s.len() <= 16 && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    Some((number(prefix)?, number(n)?))
}

/// `chunk_index` add: a chunk credited, expiring at `expires_at_store_ms`
/// on the store's clock.
pub fn index_add_call(
    keys: &KeyBuilder,
    pool: &str,
    token: u64,
    (prefix_id, n): (u64, u64),
    granted_millitokens: u64,
    expires_at_store_ms: u64,
) -> ScriptCall {
    ScriptCall::new(ScriptKind::ChunkIndex)
        .key(keys.pool_record(pool, PoolRecord::Chunks))
        .arg(1)
        .arg(token)
        .arg(prefix_id)
        .arg(n)
        .arg(granted_millitokens)
        .arg(expires_at_store_ms)
}

pub fn index_read_call(keys: &KeyBuilder, pool: &str) -> ScriptCall {
    ScriptCall::new(ScriptKind::ChunkIndex)
        .key(keys.pool_record(pool, PoolRecord::Chunks))
        .arg(2)
}

pub fn index_clear_call(keys: &KeyBuilder, pool: &str, token: u64) -> ScriptCall {
    ScriptCall::new(ScriptKind::ChunkIndex)
        .key(keys.pool_record(pool, PoolRecord::Chunks))
        .arg(3)
        .arg(token)
}

/// `chunk_index` add or clear: whether it was written.
pub fn index_written(reply: &ScriptReply) -> Result<bool, ScriptError> {
    let v = shaped(ScriptKind::ChunkIndex, reply, 3)?;
    match v[0] {
        0 | 1 => Ok(v[0] == 1),
        _ => Err(malformed(ScriptKind::ChunkIndex, "written")),
    }
}

/// `chunk_index` read: the live chunks, earliest expiry first, as the
/// decider spends them. Expiries are on the store's clock; `local_ms` maps
/// one to the decider's (`now_local − now_store` added), which is the
/// clock chunk expiry is compared on in the room.
pub fn index_chunks(
    reply: &ScriptReply,
    keys: &KeyBuilder,
    region: &str,
    pool: &str,
    now_local_ms: u64,
) -> Result<Vec<HeldChunk>, ScriptError> {
    let kind = ScriptKind::ChunkIndex;
    let v = &reply.values;
    let count = usize::try_from(*v.first().ok_or_else(|| malformed(kind, "empty"))?)
        .map_err(|_| malformed(kind, "count"))?;
    if count > crate::algorithm::chunk_index::MAX_CHUNKS || v.len() != 2 + 4 * count {
        return Err(malformed(kind, "unexpected shape"));
    }
    if v.iter().any(|x| *x < 0) {
        return Err(malformed(kind, "negative"));
    }
    let now_store = v[v.len() - 1] as u64;
    v[1..1 + 4 * count]
        .chunks_exact(4)
        .map(|c| {
            let lease_id = format!("{region}.{}:{}", c[0], c[1]);
            let key = keys
                .chunk_counter(pool, &lease_id)
                .map_err(|_| malformed(kind, "lease id"))?;
            let left_ms = (c[3] as u64).saturating_sub(now_store);
            Ok(HeldChunk {
                lease_id,
                key,
                granted_millitokens: c[2] as u64,
                expires_at_ms: now_local_ms.saturating_add(left_ms),
            })
        })
        .collect()
}

/// `syncer_lease` acquire or renew (`release`: give it up).
pub fn lease_call(keys: &KeyBuilder, agent_id: &str, ttl_ms: u64, release: bool) -> ScriptCall {
    let [lease, token] = keys.syncer_lease();
    ScriptCall::new(ScriptKind::SyncerLease)
        .key(lease)
        .key(token)
        .arg(if release { 2 } else { 1 })
        .arg(agent_id)
        .arg(ttl_ms)
}

/// `syncer_lease`'s answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseReply {
    /// This agent holds the lease (acquire) or held it (release).
    pub held: bool,
    /// The holder's fencing token (0: none yet).
    pub token: u64,
    /// How long the holder's lease still runs.
    pub ttl_left_ms: u64,
}

pub fn lease(reply: &ScriptReply) -> Result<LeaseReply, ScriptError> {
    let kind = ScriptKind::SyncerLease;
    let v = shaped(kind, reply, 4)?;
    if v[0] > 1 {
        return Err(malformed(kind, "held"));
    }
    Ok(LeaseReply {
        held: v[0] == 1,
        token: v[1] as u64,
        ttl_left_ms: v[2] as u64,
    })
}

/// How long a share record lives unless the syncer rewrites it: long enough
/// to bridge a takeover (twice the bound), never longer than half the time
/// after which the allocator may reclaim a silent Region's room
/// (`reclaim_wait_ms`, `None` when the pool never reclaims), so records of
/// a Region whose agents all died are gone before its room goes to others.
/// At least four ticks, so a live syncer always renews in time.
pub fn record_ttl_ms(takeover_bound_ms: u64, reclaim_wait_ms: Option<u64>, tick_ms: u64) -> u64 {
    let bridge = takeover_bound_ms.saturating_mul(2);
    let ttl = match reclaim_wait_ms {
        Some(wait) => bridge.min(wait / 2),
        None => bridge,
    };
    ttl.max(tick_ms.saturating_mul(4))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reply(values: &[i64]) -> ScriptReply {
        ScriptReply {
            values: values.to_vec(),
        }
    }

    #[test]
    fn lease_ids_give_their_numbers_back() {
        assert_eq!(lease_id_numbers("eu", "eu.1234:7"), Some((1234, 7)));
        assert_eq!(lease_id_numbers("eu", "us.1234:7"), None);
        assert_eq!(lease_id_numbers("eu", "eu.x:7"), None);
        assert_eq!(lease_id_numbers("eu", "eu.12:"), None);
    }

    #[test]
    fn each_run_has_its_own_unpredictable_lease_id_prefix() {
        use rand::SeedableRng;
        let mut generator = rand::rngs::StdRng::from_entropy();
        let runs: std::collections::BTreeSet<u64> =
            (0..64).map(|_| run_from(&mut generator)).collect();
        // 64 draws of 10^10: a repeat has probability ~2e-7.
        assert_eq!(runs.len(), 64);
        assert!(runs.iter().all(|&run| run < LEASE_ID_RUNS));
        let run = *runs.iter().next().unwrap();
        assert_eq!(
            lease_id_numbers("eu", &format!("{}:7", lease_id_prefix("eu", run))),
            Some((run, 7))
        );
        let region = "r".repeat(32);
        let longest = lease_id_prefix(&region, u64::MAX);
        assert!(
            longest.len() <= crate::global::chunk::MAX_PREFIX_BYTES,
            "{longest}"
        );
        let (run, _) = lease_id_numbers(&region, &format!("{longest}:0")).unwrap();
        // The chunk index keeps the number under the scripts' 2^40 cap.
        assert!(run < 1 << 40);
    }

    #[test]
    fn index_chunks_map_store_expiry_to_the_local_clock() {
        let keys = KeyBuilder::new(b"0123456789abcdef-test-pepper").unwrap();
        let r = reply(&[1, 7, 3, 500, 10_400, 10_000]);
        let chunks = index_chunks(&r, &keys, "eu", "w", 50_000).unwrap();
        assert_eq!(chunks.len(), 1);
        assert_eq!(chunks[0].lease_id, "eu.7:3");
        assert_eq!(chunks[0].expires_at_ms, 50_400);
        assert_eq!(chunks[0].key, keys.chunk_counter("w", "eu.7:3").unwrap());
        assert!(index_chunks(&reply(&[2, 7, 3, 500, 1, 0]), &keys, "eu", "w", 0).is_err());
    }

    #[test]
    fn a_record_reads_back_as_the_view_it_was_written_from() {
        let view = RateView {
            bucket: BucketRate {
                refill_millitokens_per_s: 4_000,
                capacity_millitokens: 8_000,
            },
            mode: Mode::Fallback,
            incarnation: 3,
            share_version: 9,
            epoch: 2,
            interval_ms: 5_000,
            fallback_allowance_millitokens_per_s: 100,
        };
        let call = ShareRecord::of_view(&view).write_call("k", 1, 1_000);
        // share_read's reply carries the same numbers in the same order.
        let mut values = vec![1];
        values.extend(call.args[2..].iter().map(|a| a.parse::<i64>().unwrap()));
        values.extend([1, 99, 0]);
        assert_eq!(read(&reply(&values)).unwrap().map(|r| r.view()), Some(view));
        assert_eq!(read(&reply(&[0; 12])).unwrap(), None);
    }

    proptest! {
        /// The record bridges a takeover where it can, and never outlives
        /// half the reclaim wait unless four ticks are longer.
        #[test]
        fn record_ttl_stays_within_half_the_reclaim_wait(
            bound in 1u64..100_000, wait in proptest::option::of(1u64..1_000_000), tick in 10u64..10_000,
        ) {
            let ttl = record_ttl_ms(bound, wait, tick);
            prop_assert!(ttl >= tick * 4);
            match wait {
                Some(wait) => prop_assert!(ttl <= (wait / 2).max(tick * 4)),
                None => prop_assert_eq!(ttl, (bound * 2).max(tick * 4)),
            }
            if wait.is_none_or(|w| w / 2 >= bound * 2) {
                prop_assert!(ttl >= bound * 2);
            }
        }
    }
}
