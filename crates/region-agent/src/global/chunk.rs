//! Chunk grants for one window pool in one Region (§4.2), pure.
//!
//! The holder keeps the chunks the allocator granted (lease id, granted
//! millitokens, `expires_at_ms`) and what was spent from each. When what is
//! left falls to the low-water mark, [`ChunkHolder::poll`] asks for the next
//! chunk under a **fresh** lease id from a deterministic source (prefix and
//! counter injected by the caller); after [`ChunkHolder::on_grant_failed`]
//! the retry carries the **same** id, so the allocator's replay answer is
//! returned instead of a second grant. An answer is taken only for the id in
//! flight and only if its epoch is not below the highest seen, so a replayed
//! or duplicated answer is never counted twice. A chunk contributes nothing
//! from `expires_at_ms` on (the allocator clamps it to the window end), so
//! tokens of one window are never spendable in the next.
//!
//! `expires_at_ms` is compared with the `now_ms` passed in; the caller maps
//! allocator time to its own clock (conservatively) before calling.

/// The allocator's cap on a lease id.
pub const MAX_LEASE_ID_BYTES: usize = leasehold_allocator_client::id::MAX_ID_BYTES;

/// Why a lease-id prefix is unusable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeaseIdError {
    #[error("lease id prefix: empty")]
    Empty,
    #[error("lease id prefix: {0} bytes, above {max}", max = MAX_PREFIX_BYTES)]
    TooLong(usize),
    #[error("lease id prefix: byte {0:#04x} outside [A-Za-z0-9._-]")]
    InvalidByte(u8),
}

/// Room for ":" and a u64 counter (20 digits) within the 64-byte cap.
pub const MAX_PREFIX_BYTES: usize = MAX_LEASE_ID_BYTES - 21;

/// Deterministic lease ids `"{prefix}:{counter}"`. The prefix must name the
/// Region and this run (for example the incarnation or a boot nonce) so ids
/// never repeat across restarts; the counter only grows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseIds {
    prefix: String,
    next: u64,
}

impl LeaseIds {
    pub fn new(prefix: &str, first: u64) -> Result<Self, LeaseIdError> {
        if prefix.is_empty() {
            return Err(LeaseIdError::Empty);
        }
        if prefix.len() > MAX_PREFIX_BYTES {
            return Err(LeaseIdError::TooLong(prefix.len()));
        }
        if let Some(byte) = prefix
            .bytes()
            .find(|b| !(b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-')))
        {
            return Err(LeaseIdError::InvalidByte(byte));
        }
        Ok(LeaseIds {
            prefix: prefix.to_string(),
            next: first,
        })
    }

    fn fresh(&mut self) -> String {
        let id = format!("{}:{}", self.prefix, self.next);
        self.next = self.next.saturating_add(1);
        id
    }
}

/// One window pool's chunk settings in one Region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkConfig {
    /// How much each Grant asks for; at least 1.
    pub want_millitokens: u64,
    /// Ask for the next chunk when what is left is at or below this.
    pub low_water_millitokens: u64,
}

/// Mirror of the allocator's `GrantAnswer` fields used here, with the
/// epoch of the reply that carried it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantReplyIn {
    pub epoch: u64,
    pub lease_id: String,
    pub granted_millitokens: u64,
    pub expires_at_ms: u64,
    pub window_end_ms: u64,
}

/// Payload of a `Grant` (the caller adds pool, region and incarnation).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantRequest {
    pub lease_id: String,
    pub want_millitokens: u64,
}

/// A granted chunk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Chunk {
    pub lease_id: String,
    pub granted_millitokens: u64,
    pub spent_millitokens: u64,
    pub expires_at_ms: u64,
}

impl Chunk {
    fn left(&self, now_ms: u64) -> u64 {
        if now_ms >= self.expires_at_ms {
            0
        } else {
            self.granted_millitokens - self.spent_millitokens
        }
    }
}

/// The Grant the holder waits on.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Pending {
    InFlight(GrantRequest),
    /// Failed or timed out: the next poll resends it with the same id.
    Failed(GrantRequest),
}

/// What [`ChunkHolder::on_grant`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrantOutcome {
    /// A new chunk (possibly of 0 millitokens: the window is spent).
    Taken { granted_millitokens: u64 },
    /// Epoch below the highest seen.
    StaleEpoch,
    /// Not the id in flight: a replay or duplicate of an answer already
    /// taken, or of a request abandoned.
    NotPending,
}

/// Chunk state of one window pool in one Region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkHolder {
    config: ChunkConfig,
    ids: LeaseIds,
    chunks: Vec<Chunk>,
    pending: Option<Pending>,
    highest_epoch: u64,
    /// After a 0 grant: no new request before the window ends.
    not_before_ms: u64,
}

impl ChunkHolder {
    /// `config.want_millitokens` of 0 is treated as 1.
    pub fn new(mut config: ChunkConfig, ids: LeaseIds) -> Self {
        config.want_millitokens = config.want_millitokens.max(1);
        ChunkHolder {
            config,
            ids,
            chunks: Vec::new(),
            pending: None,
            highest_epoch: 0,
            not_before_ms: 0,
        }
    }

    /// The unexpired chunks, soonest expiry first.
    pub fn chunks(&self) -> &[Chunk] {
        &self.chunks
    }

    pub fn highest_epoch(&self) -> u64 {
        self.highest_epoch
    }

    fn prune(&mut self, now_ms: u64) {
        self.chunks.retain(|c| now_ms < c.expires_at_ms);
    }

    /// Millitokens spendable at `now_ms`: Σ (granted − spent) of the chunks
    /// not yet expired.
    pub fn available_millitokens(&self, now_ms: u64) -> u64 {
        self.chunks
            .iter()
            .map(|c| c.left(now_ms))
            .fold(0, u64::saturating_add)
    }

    /// Spends `cost` from the chunks expiring soonest, all or nothing.
    pub fn spend(&mut self, cost: u64, now_ms: u64) -> bool {
        self.prune(now_ms);
        if self.available_millitokens(now_ms) < cost {
            return false;
        }
        let mut rest = cost;
        for chunk in &mut self.chunks {
            let take = rest.min(chunk.left(now_ms));
            chunk.spent_millitokens += take;
            rest -= take;
            if rest == 0 {
                break;
            }
        }
        true
    }

    /// The next Grant to send: the failed one again (same id), or a fresh
    /// one when what is left is at or below the low-water mark. Nothing
    /// while a Grant is in flight.
    pub fn poll(&mut self, now_ms: u64) -> Option<GrantRequest> {
        self.prune(now_ms);
        match self.pending.take() {
            Some(Pending::InFlight(request)) => {
                self.pending = Some(Pending::InFlight(request));
                None
            }
            Some(Pending::Failed(request)) => {
                self.pending = Some(Pending::InFlight(request.clone()));
                Some(request)
            }
            None => {
                if now_ms < self.not_before_ms
                    || self.available_millitokens(now_ms) > self.config.low_water_millitokens
                {
                    return None;
                }
                let request = GrantRequest {
                    lease_id: self.ids.fresh(),
                    want_millitokens: self.config.want_millitokens,
                };
                self.pending = Some(Pending::InFlight(request.clone()));
                Some(request)
            }
        }
    }

    /// The Grant `lease_id` failed or timed out: it is resent, same id.
    pub fn on_grant_failed(&mut self, lease_id: &str) {
        if let Some(Pending::InFlight(request)) = &self.pending {
            if request.lease_id == lease_id {
                let request = request.clone();
                self.pending = Some(Pending::Failed(request));
            }
        }
    }

    /// An answer to a Grant.
    pub fn on_grant(&mut self, reply: GrantReplyIn, now_ms: u64) -> GrantOutcome {
        // The simulation's `NoEpochCheck` mutation takes a lower epoch.
        if reply.epoch < self.highest_epoch
            && !crate::sim_mutation::active(crate::sim_mutation::Mutation::NoEpochCheck)
        {
            return GrantOutcome::StaleEpoch;
        }
        let pending_id = match &self.pending {
            Some(Pending::InFlight(r)) | Some(Pending::Failed(r)) => &r.lease_id,
            None => return GrantOutcome::NotPending,
        };
        if *pending_id != reply.lease_id {
            return GrantOutcome::NotPending;
        }
        self.highest_epoch = self.highest_epoch.max(reply.epoch);
        self.pending = None;
        if reply.granted_millitokens == 0 {
            self.not_before_ms = reply.window_end_ms;
        } else if now_ms < reply.expires_at_ms {
            let at = self
                .chunks
                .partition_point(|c| c.expires_at_ms <= reply.expires_at_ms);
            self.chunks.insert(
                at,
                Chunk {
                    lease_id: reply.lease_id,
                    granted_millitokens: reply.granted_millitokens,
                    spent_millitokens: 0,
                    expires_at_ms: reply.expires_at_ms,
                },
            );
        }
        self.prune(now_ms);
        GrantOutcome::Taken {
            granted_millitokens: reply.granted_millitokens,
        }
    }

    /// Fenced: every chunk and the Grant in flight are dropped at once (the
    /// abandoned id is never reused).
    pub fn on_fenced(&mut self) {
        self.chunks.clear();
        self.pending = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn holder() -> ChunkHolder {
        ChunkHolder::new(
            ChunkConfig {
                want_millitokens: 1_000,
                low_water_millitokens: 200,
            },
            LeaseIds::new("eu.7", 0).unwrap(),
        )
    }

    fn answer(epoch: u64, id: &str, granted: u64, expires: u64) -> GrantReplyIn {
        GrantReplyIn {
            epoch,
            lease_id: id.to_string(),
            granted_millitokens: granted,
            expires_at_ms: expires,
            window_end_ms: expires,
        }
    }

    #[test]
    fn lease_id_prefix_is_checked() {
        assert_eq!(LeaseIds::new("", 0), Err(LeaseIdError::Empty));
        assert_eq!(
            LeaseIds::new("a b", 0),
            Err(LeaseIdError::InvalidByte(b' '))
        );
        assert!(LeaseIds::new(&"a".repeat(MAX_PREFIX_BYTES + 1), 0).is_err());
        let mut ids = LeaseIds::new(&"a".repeat(MAX_PREFIX_BYTES), u64::MAX - 1).unwrap();
        assert!(ids.fresh().len() <= MAX_LEASE_ID_BYTES);
    }

    #[test]
    fn asks_below_low_water_and_spends_the_granted_chunk() {
        let mut h = holder();
        let r = h.poll(0).unwrap();
        assert_eq!(r.lease_id, "eu.7:0");
        assert_eq!(r.want_millitokens, 1_000);
        assert_eq!(h.poll(0), None, "nothing while in flight");
        assert_eq!(
            h.on_grant(answer(1, "eu.7:0", 1_000, 60_000), 10),
            GrantOutcome::Taken {
                granted_millitokens: 1_000
            }
        );
        assert_eq!(h.available_millitokens(10), 1_000);
        assert_eq!(h.poll(10), None, "above low water");
        assert!(h.spend(700, 20));
        assert!(!h.spend(301, 20));
        assert!(h.spend(300, 20));
        assert_eq!(h.poll(30).unwrap().lease_id, "eu.7:1");
    }

    #[test]
    fn retry_after_failure_reuses_the_lease_id() {
        let mut h = holder();
        let first = h.poll(0).unwrap();
        h.on_grant_failed(&first.lease_id);
        let retry = h.poll(100).unwrap();
        assert_eq!(retry, first);
        h.on_grant_failed("someone-else");
        assert_eq!(h.poll(100), None, "still in flight");
    }

    #[test]
    fn replayed_answers_are_not_counted_twice() {
        let mut h = holder();
        let r = h.poll(0).unwrap();
        let a = answer(1, &r.lease_id, 1_000, 60_000);
        assert!(matches!(
            h.on_grant(a.clone(), 0),
            GrantOutcome::Taken { .. }
        ));
        assert_eq!(h.on_grant(a, 0), GrantOutcome::NotPending);
        assert_eq!(h.available_millitokens(0), 1_000);
    }

    #[test]
    fn lower_epoch_grant_answers_are_ignored() {
        let mut h = holder();
        let r = h.poll(0).unwrap();
        h.on_grant(answer(5, &r.lease_id, 100, 60_000), 0);
        let r = h.poll(0).unwrap();
        assert_eq!(
            h.on_grant(answer(4, &r.lease_id, 500, 60_000), 0),
            GrantOutcome::StaleEpoch
        );
        assert_eq!(h.available_millitokens(0), 100);
    }

    #[test]
    fn nothing_is_spendable_after_expires_at() {
        let mut h = holder();
        let r = h.poll(0).unwrap();
        h.on_grant(answer(1, &r.lease_id, 1_000, 60_000), 0);
        assert_eq!(h.available_millitokens(59_999), 1_000);
        assert_eq!(h.available_millitokens(60_000), 0);
        assert!(!h.spend(1, 60_000));
        assert!(h.chunks().is_empty());
    }

    #[test]
    fn a_spent_window_waits_for_its_end() {
        let mut h = holder();
        let r = h.poll(0).unwrap();
        h.on_grant(answer(1, &r.lease_id, 0, 60_000), 0);
        assert_eq!(h.poll(59_999), None);
        assert_eq!(h.poll(60_000).unwrap().lease_id, "eu.7:1");
    }

    #[test]
    fn fenced_drops_every_chunk() {
        let mut h = holder();
        let r = h.poll(0).unwrap();
        h.on_grant(answer(1, &r.lease_id, 1_000, 60_000), 0);
        h.on_fenced();
        assert_eq!(h.available_millitokens(0), 0);
        assert_eq!(h.poll(0).unwrap().lease_id, "eu.7:1");
    }

    #[derive(Clone, Debug)]
    enum Step {
        Advance(u64),
        Poll,
        Fail,
        Answer {
            epoch: u64,
            granted: u64,
            ttl: u64,
            replay: bool,
        },
        Spend(u64),
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            (0u64..5_000).prop_map(Step::Advance),
            Just(Step::Poll),
            Just(Step::Fail),
            (0u64..4, 0u64..2_000, 1u64..10_000, any::<bool>()).prop_map(
                |(epoch, granted, ttl, replay)| Step::Answer {
                    epoch,
                    granted,
                    ttl,
                    replay
                }
            ),
            (0u64..800).prop_map(Step::Spend),
        ]
    }

    proptest! {
        /// Σ spendable ≤ Σ granted − Σ spent of unexpired chunks; no lease id
        /// names two different requests; a retry carries the same id;
        /// nothing is spendable at or after a chunk's expiry.
        #[test]
        fn chunks_never_overspend_or_reuse_ids(steps in proptest::collection::vec(step(), 0..80)) {
            let mut h = holder();
            let mut now = 0u64;
            let mut sent: BTreeMap<String, u64> = BTreeMap::new();
            let mut failed: Option<GrantRequest> = None;
            let mut last_sent: Option<GrantRequest> = None;
            let mut taken: Vec<(String, u64, u64)> = Vec::new(); // id, granted, expires
            let mut spent_total = 0u64;
            for s in steps {
                match s {
                    Step::Advance(d) => now += d,
                    Step::Poll => {
                        if let Some(r) = h.poll(now) {
                            match failed.take() {
                                // A retry carries the same id and want.
                                Some(f) => prop_assert_eq!(&r, &f),
                                // A fresh request never reuses an id.
                                None => prop_assert!(!sent.contains_key(&r.lease_id)),
                            }
                            sent.insert(r.lease_id.clone(), r.want_millitokens);
                            last_sent = Some(r);
                        }
                    }
                    Step::Fail => {
                        if let Some(r) = &last_sent {
                            if h.pending == Some(Pending::InFlight(r.clone())) {
                                h.on_grant_failed(&r.lease_id);
                                failed = Some(r.clone());
                            }
                        }
                    }
                    Step::Answer { epoch, granted, ttl, replay } => {
                        let id = if replay {
                            taken.last().map(|t| t.0.clone())
                        } else {
                            last_sent.as_ref().map(|r| r.lease_id.clone())
                        };
                        if let Some(id) = id {
                            let g = granted.min(sent.get(&id).copied().unwrap_or(0));
                            let out = h.on_grant(answer(epoch, &id, g, now + ttl), now);
                            if let GrantOutcome::Taken { .. } = out {
                                prop_assert!(!taken.iter().any(|t| t.0 == id), "answer counted twice");
                                taken.push((id, g, now + ttl));
                                failed = None;
                            }
                        }
                    }
                    Step::Spend(cost) => {
                        let before = h.available_millitokens(now);
                        let ok = h.spend(cost, now);
                        prop_assert_eq!(ok, cost <= before);
                        if ok { spent_total += cost; }
                    }
                }
                let live_granted: u64 = taken.iter().filter(|t| now < t.2).map(|t| t.1).sum();
                prop_assert!(h.available_millitokens(now) <= live_granted);
                let all_granted: u64 = taken.iter().map(|t| t.1).sum();
                prop_assert!(spent_total <= all_granted);
                prop_assert!(h.chunks().iter().all(|c| c.left(now) <= c.granted_millitokens));
                let expired_spendable = taken.iter().filter(|t| now >= t.2).any(|t| {
                    h.chunks().iter().any(|c| c.lease_id == t.0 && c.left(now) > 0)
                });
                prop_assert!(!expired_spendable);
            }
        }
    }
}
