//! Share sync for one rate pool in one Region (§4.3, §4.4), pure.
//!
//! Every `interval_ms` (on a per-Region phase) [`ShareSync::poll`] yields a
//! `Rebalance` carrying the demand of the interval (requests received,
//! allowed or refused) and the share the bucket enforces. A reply is applied
//! only if its epoch is not below the highest seen, its incarnation is ours
//! and its `share_version` is above the one applied; the new share sets the
//! bucket's rate and capacity (`burst_seconds × share`; tokens are clamped by
//! the store, never reset). Applying a **lower** share yields one `AckShare`
//! to send at once. `Fenced` drops the pool to 0 until re-registration.
//!
//! Under the `lease` policy a share is a lease: when no reply acknowledged a
//! request sent within `share_ttl_ms` (measured from the send time of the
//! last acknowledged request, on the agent's monotonic clock), the effective
//! rate is the pool's fallback allowance until a reply arrives. Before the
//! first acknowledged request after (re)registration the lease clock is not
//! running: the share is 0 then, and it stays 0.

/// What the agent does when it cannot renew its share (§4.4, agent side).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AgentReclaim {
    /// `freeze`: keep enforcing the last applied share.
    Freeze,
    /// `two_signal`: keep enforcing the last applied share.
    TwoSignal,
    /// `lease`: fall to the fallback allowance after `share_ttl_ms`.
    Lease { share_ttl_ms: u64 },
}

/// One rate pool's sync settings in one Region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareSyncConfig {
    /// How often Rebalance is sent; at least 1.
    pub interval_ms: u64,
    /// This Region's phase; due times are `phase_ms + k × interval_ms`.
    pub phase_ms: u64,
    /// The bucket's capacity is `burst_seconds × share`.
    pub burst_seconds: u64,
    pub reclaim: AgentReclaim,
    /// The rate under `lease` when the share cannot be renewed (per pool;
    /// default the pool's floor, 0 for strict pools).
    pub fallback_allowance_millitokens_per_s: u64,
}

/// Mirror of the allocator's `ShareReply` fields used here, with the epoch
/// of the reply that carried it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShareReplyIn {
    pub epoch: u64,
    pub incarnation: u64,
    pub share_millitokens_per_s: u64,
    pub share_version: u64,
}

/// Payload of a `Rebalance` (the caller adds pool and region).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RebalanceRequest {
    pub incarnation: u64,
    pub demand_requests: u64,
    pub applied_share_millitokens_per_s: u64,
    pub applied_share_version: u64,
}

/// Payload of an `AckShare` (the caller adds pool and region).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckShareRequest {
    pub incarnation: u64,
    pub applied_share_millitokens_per_s: u64,
    pub applied_share_version: u64,
}

/// What the regional bucket must enforce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BucketRate {
    pub refill_millitokens_per_s: u64,
    pub capacity_millitokens: u64,
}

impl BucketRate {
    fn of(rate_millitokens_per_s: u64, burst_seconds: u64) -> Self {
        BucketRate {
            refill_millitokens_per_s: rate_millitokens_per_s,
            capacity_millitokens: rate_millitokens_per_s.saturating_mul(burst_seconds),
        }
    }
}

/// A reply that was taken: the bucket to apply and an `AckShare` to send at
/// once when the share went down.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    pub bucket: BucketRate,
    pub ack: Option<AckShareRequest>,
}

/// Why a reply was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropReason {
    /// Epoch below the highest seen (a deposed leader).
    StaleEpoch,
    /// Fenced: waiting for re-registration.
    Fenced,
    /// Carries another incarnation than ours.
    WrongIncarnation,
}

/// What [`ShareSync::on_share_reply`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShareOutcome {
    /// The reply renewed the share (its version may be old: then the bucket
    /// is the one already applied and `ack` is `None`).
    Applied(Applied),
    Dropped(DropReason),
}

/// Where the pool stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Enforcing the applied share.
    Normal,
    /// `lease` expired: enforcing the fallback allowance.
    Fallback,
    /// Fenced: share 0 until re-registered.
    Fenced,
}

/// Share sync state of one rate pool in one Region.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareSync {
    config: ShareSyncConfig,
    incarnation: u64,
    highest_epoch: u64,
    applied_share: u64,
    applied_share_version: u64,
    demand: u64,
    next_due_ms: u64,
    /// Send time of the latest request a reply acknowledged.
    last_acked_sent_ms: Option<u64>,
    fenced: bool,
}

impl ShareSync {
    /// A pool just registered at `incarnation`, share 0; the first Rebalance
    /// is due at the first phase slot at or after `now_ms`.
    /// `config.interval_ms` of 0 is treated as 1.
    pub fn new(mut config: ShareSyncConfig, incarnation: u64, now_ms: u64) -> Self {
        config.interval_ms = config.interval_ms.max(1);
        config.phase_ms %= config.interval_ms;
        let mut sync = ShareSync {
            config,
            incarnation,
            highest_epoch: 0,
            applied_share: 0,
            applied_share_version: 0,
            demand: 0,
            next_due_ms: 0,
            last_acked_sent_ms: None,
            fenced: false,
        };
        sync.next_due_ms = sync.slot_at_or_after(now_ms);
        sync
    }

    /// The first due time `phase + k × interval` that is ≥ `t`.
    fn slot_at_or_after(&self, t: u64) -> u64 {
        let (interval, phase) = (self.config.interval_ms, self.config.phase_ms);
        if t <= phase {
            return phase;
        }
        let since = t - phase;
        let k = since.div_ceil(interval);
        phase.saturating_add(k.saturating_mul(interval))
    }

    pub fn interval_ms(&self) -> u64 {
        self.config.interval_ms
    }
    pub fn fallback_allowance_millitokens_per_s(&self) -> u64 {
        self.config.fallback_allowance_millitokens_per_s
    }
    pub fn incarnation(&self) -> u64 {
        self.incarnation
    }
    pub fn highest_epoch(&self) -> u64 {
        self.highest_epoch
    }
    pub fn applied_share_millitokens_per_s(&self) -> u64 {
        self.applied_share
    }
    pub fn applied_share_version(&self) -> u64 {
        self.applied_share_version
    }
    pub fn demand_requests(&self) -> u64 {
        self.demand
    }
    pub fn next_due_ms(&self) -> u64 {
        self.next_due_ms
    }
    pub fn last_acked_sent_ms(&self) -> Option<u64> {
        self.last_acked_sent_ms
    }

    /// One request received for the pool, allowed or refused.
    pub fn record_request(&mut self) {
        self.record_requests(1);
    }

    /// `count` requests received for the pool, allowed or refused.
    pub fn record_requests(&mut self, count: u64) {
        self.demand = self.demand.saturating_add(count);
    }

    /// A Rebalance when one is due (never while fenced); resets the demand.
    pub fn poll(&mut self, now_ms: u64) -> Option<RebalanceRequest> {
        if self.fenced || now_ms < self.next_due_ms {
            return None;
        }
        self.next_due_ms = self.slot_at_or_after(now_ms.saturating_add(1));
        let request = RebalanceRequest {
            incarnation: self.incarnation,
            demand_requests: self.demand,
            applied_share_millitokens_per_s: self.applied_share,
            applied_share_version: self.applied_share_version,
        };
        self.demand = 0;
        Some(request)
    }

    /// A reply to a Rebalance or AckShare sent at `sent_at_ms` (clamped to
    /// `now_ms`).
    pub fn on_share_reply(
        &mut self,
        reply: ShareReplyIn,
        sent_at_ms: u64,
        now_ms: u64,
    ) -> ShareOutcome {
        // The simulation's `NoEpochCheck` mutation takes a lower epoch.
        if reply.epoch < self.highest_epoch
            && !crate::sim_mutation::active(crate::sim_mutation::Mutation::NoEpochCheck)
        {
            return ShareOutcome::Dropped(DropReason::StaleEpoch);
        }
        if self.fenced {
            return ShareOutcome::Dropped(DropReason::Fenced);
        }
        // The simulation's `NoIncarnationFencing` mutation applies a reply
        // of another incarnation as one of ours.
        if reply.incarnation != self.incarnation
            && !crate::sim_mutation::active(crate::sim_mutation::Mutation::NoIncarnationFencing)
        {
            return ShareOutcome::Dropped(DropReason::WrongIncarnation);
        }
        self.highest_epoch = self.highest_epoch.max(reply.epoch);
        let sent_at_ms = sent_at_ms.min(now_ms);
        self.last_acked_sent_ms = Some(
            self.last_acked_sent_ms
                .map_or(sent_at_ms, |t| t.max(sent_at_ms)),
        );
        let mut ack = None;
        if reply.share_version > self.applied_share_version {
            let lowered = reply.share_millitokens_per_s < self.applied_share;
            self.applied_share = reply.share_millitokens_per_s;
            self.applied_share_version = reply.share_version;
            if lowered {
                ack = Some(AckShareRequest {
                    incarnation: self.incarnation,
                    applied_share_millitokens_per_s: self.applied_share,
                    applied_share_version: self.applied_share_version,
                });
            }
        }
        ShareOutcome::Applied(Applied {
            bucket: BucketRate::of(self.applied_share, self.config.burst_seconds),
            ack,
        })
    }

    /// `Fenced{current_incarnation}`: the pool drops to 0 at once and must
    /// re-register. Returns `None` for a stale fence (its incarnation is not
    /// above ours: we already re-registered past it).
    pub fn on_fenced(&mut self, current_incarnation: u64) -> Option<BucketRate> {
        if current_incarnation <= self.incarnation && !self.fenced {
            return None;
        }
        self.fenced = true;
        self.applied_share = 0;
        self.last_acked_sent_ms = None;
        Some(BucketRate::of(0, self.config.burst_seconds))
    }

    /// Registered again at `incarnation`: Normal at share 0 (the share rises
    /// only through replies). The applied version is kept: the allocator's
    /// versions only grow, so older replies stay refused.
    pub fn on_registered(&mut self, incarnation: u64) -> BucketRate {
        self.fenced = false;
        self.incarnation = incarnation;
        self.applied_share = 0;
        self.demand = 0;
        self.last_acked_sent_ms = None;
        BucketRate::of(0, self.config.burst_seconds)
    }

    /// Whether re-registration is needed.
    pub fn needs_register(&self) -> bool {
        self.fenced
    }

    pub fn mode(&self, now_ms: u64) -> Mode {
        if self.fenced {
            return Mode::Fenced;
        }
        match (self.config.reclaim, self.last_acked_sent_ms) {
            (AgentReclaim::Lease { share_ttl_ms }, Some(sent))
                if now_ms >= sent.saturating_add(share_ttl_ms) =>
            {
                Mode::Fallback
            }
            _ => Mode::Normal,
        }
    }

    /// What the bucket must enforce at `now_ms`.
    pub fn effective_rate(&self, now_ms: u64) -> BucketRate {
        let rate = match self.mode(now_ms) {
            Mode::Normal => self.applied_share,
            Mode::Fallback => self.config.fallback_allowance_millitokens_per_s,
            Mode::Fenced => 0,
        };
        BucketRate::of(rate, self.config.burst_seconds)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn config(reclaim: AgentReclaim) -> ShareSyncConfig {
        ShareSyncConfig {
            interval_ms: 5_000,
            phase_ms: 1_700,
            burst_seconds: 2,
            reclaim,
            fallback_allowance_millitokens_per_s: 500_000,
        }
    }

    fn reply(epoch: u64, share: u64, version: u64) -> ShareReplyIn {
        ShareReplyIn {
            epoch,
            incarnation: 1,
            share_millitokens_per_s: share,
            share_version: version,
        }
    }

    fn applied(outcome: ShareOutcome) -> Applied {
        match outcome {
            ShareOutcome::Applied(a) => a,
            other => panic!("expected applied, got {other:?}"),
        }
    }

    #[test]
    fn rebalance_is_due_on_the_regions_phase_and_resets_demand() {
        let mut s = ShareSync::new(config(AgentReclaim::Freeze), 1, 0);
        assert_eq!(s.next_due_ms(), 1_700);
        s.record_request();
        s.record_request();
        assert_eq!(s.poll(1_699), None);
        let r = s.poll(1_700).unwrap();
        assert_eq!(r.demand_requests, 2);
        assert_eq!(r.incarnation, 1);
        assert_eq!(s.demand_requests(), 0);
        assert_eq!(s.poll(1_700), None);
        assert_eq!(s.next_due_ms(), 6_700);
        // A late poll keeps the phase.
        assert!(s.poll(20_000).is_some());
        assert_eq!(s.next_due_ms(), 21_700);
    }

    #[test]
    fn applied_share_sets_rate_and_burst_capacity_and_is_reported() {
        let mut s = ShareSync::new(config(AgentReclaim::Freeze), 1, 0);
        let a = applied(s.on_share_reply(reply(3, 4_000_000, 1), 0, 10));
        assert_eq!(
            a.bucket,
            BucketRate {
                refill_millitokens_per_s: 4_000_000,
                capacity_millitokens: 8_000_000
            }
        );
        assert_eq!(a.ack, None);
        let r = s.poll(1_700).unwrap();
        assert_eq!(r.applied_share_millitokens_per_s, 4_000_000);
        assert_eq!(r.applied_share_version, 1);
    }

    #[test]
    fn lower_epoch_replies_are_ignored() {
        let mut s = ShareSync::new(config(AgentReclaim::Freeze), 1, 0);
        applied(s.on_share_reply(reply(5, 1_000, 1), 0, 0));
        assert_eq!(
            s.on_share_reply(reply(4, 9_000, 2), 0, 0),
            ShareOutcome::Dropped(DropReason::StaleEpoch)
        );
        assert_eq!(s.applied_share_millitokens_per_s(), 1_000);
        assert_eq!(s.highest_epoch(), 5);
    }

    #[test]
    fn older_share_version_does_not_move_the_share() {
        let mut s = ShareSync::new(config(AgentReclaim::Freeze), 1, 0);
        applied(s.on_share_reply(reply(1, 1_000, 4), 0, 0));
        let a = applied(s.on_share_reply(reply(1, 9_000, 3), 0, 0));
        assert_eq!(a.bucket.refill_millitokens_per_s, 1_000);
        assert_eq!(s.applied_share_version(), 4);
    }

    #[test]
    fn a_lowered_share_yields_exactly_one_ack_share() {
        let mut s = ShareSync::new(config(AgentReclaim::Freeze), 1, 0);
        applied(s.on_share_reply(reply(1, 5_000, 1), 0, 0));
        let lower = reply(1, 3_000, 2);
        let a = applied(s.on_share_reply(lower, 0, 0));
        assert_eq!(
            a.ack,
            Some(AckShareRequest {
                incarnation: 1,
                applied_share_millitokens_per_s: 3_000,
                applied_share_version: 2
            })
        );
        // The same reply again (duplicate delivery) yields no second ack.
        assert_eq!(applied(s.on_share_reply(lower, 0, 0)).ack, None);
        // A raise yields none.
        assert_eq!(
            applied(s.on_share_reply(reply(1, 4_000, 3), 0, 0)).ack,
            None
        );
    }

    #[test]
    fn fenced_drops_to_zero_immediately_and_needs_register() {
        let mut s = ShareSync::new(config(AgentReclaim::Freeze), 1, 0);
        applied(s.on_share_reply(reply(1, 5_000, 1), 0, 0));
        let bucket = s.on_fenced(2).unwrap();
        assert_eq!(bucket.refill_millitokens_per_s, 0);
        assert_eq!(s.effective_rate(0).refill_millitokens_per_s, 0);
        assert_eq!(s.mode(0), Mode::Fenced);
        assert!(s.needs_register());
        assert_eq!(s.poll(1_700), None);
        assert_eq!(
            s.on_share_reply(reply(1, 5_000, 2), 0, 0),
            ShareOutcome::Dropped(DropReason::Fenced)
        );
        s.on_registered(2);
        assert_eq!(s.mode(0), Mode::Normal);
        assert_eq!(s.effective_rate(0).refill_millitokens_per_s, 0);
        // A late reply of the old incarnation cannot raise it.
        assert_eq!(
            s.on_share_reply(reply(1, 5_000, 3), 0, 0),
            ShareOutcome::Dropped(DropReason::WrongIncarnation)
        );
        // A stale fence (old incarnation) is ignored.
        assert_eq!(s.on_fenced(2), None);
    }

    #[test]
    fn lease_falls_to_allowance_after_share_ttl_from_send_time_and_back_on_reply() {
        let mut s = ShareSync::new(
            config(AgentReclaim::Lease {
                share_ttl_ms: 15_000,
            }),
            1,
            0,
        );
        // Sent at 1,000, acknowledged at 4,000: the lease runs from 1,000.
        applied(s.on_share_reply(reply(1, 2_000_000, 1), 1_000, 4_000));
        assert_eq!(s.mode(15_999), Mode::Normal);
        assert_eq!(s.effective_rate(15_999).refill_millitokens_per_s, 2_000_000);
        assert_eq!(s.mode(16_000), Mode::Fallback);
        assert_eq!(
            s.effective_rate(16_000),
            BucketRate {
                refill_millitokens_per_s: 500_000,
                capacity_millitokens: 1_000_000
            }
        );
        applied(s.on_share_reply(reply(1, 2_000_000, 1), 30_000, 30_500));
        assert_eq!(s.mode(30_500), Mode::Normal);
        assert_eq!(s.effective_rate(30_500).refill_millitokens_per_s, 2_000_000);
    }

    #[test]
    fn freeze_and_two_signal_keep_the_last_applied_share() {
        for reclaim in [AgentReclaim::Freeze, AgentReclaim::TwoSignal] {
            let mut s = ShareSync::new(config(reclaim), 1, 0);
            applied(s.on_share_reply(reply(1, 2_000, 1), 0, 0));
            assert_eq!(s.effective_rate(u64::MAX).refill_millitokens_per_s, 2_000);
            assert_eq!(s.mode(u64::MAX), Mode::Normal);
        }
    }

    #[derive(Clone, Debug)]
    enum Event {
        Reply {
            epoch: u64,
            share: u64,
            version: u64,
        },
        Request,
        Poll,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            (0u64..6, 0u64..10_000, 0u64..12).prop_map(|(epoch, share, version)| Event::Reply {
                epoch,
                share,
                version
            }),
            Just(Event::Request),
            Just(Event::Poll),
        ]
    }

    proptest! {
        /// Acks come only from lowering applications, one each; the epoch
        /// never goes back; the version never goes back; a lower-epoch reply
        /// never changes the share.
        #[test]
        fn replies_in_any_order_keep_epochs_versions_and_acks_consistent(
            events in proptest::collection::vec(event(), 0..60)
        ) {
            let mut s = ShareSync::new(config(AgentReclaim::Lease { share_ttl_ms: 100 }), 1, 0);
            let mut now = 0u64;
            for e in events {
                now += 500;
                let (epoch0, share0, version0) =
                    (s.highest_epoch(), s.applied_share_millitokens_per_s(), s.applied_share_version());
                match e {
                    Event::Request => s.record_request(),
                    Event::Poll => { s.poll(now); }
                    Event::Reply { epoch, share, version } => {
                        let out = s.on_share_reply(reply(epoch, share, version), now - 10, now);
                        if epoch < epoch0 {
                            prop_assert_eq!(out, ShareOutcome::Dropped(DropReason::StaleEpoch));
                            prop_assert_eq!(s.applied_share_millitokens_per_s(), share0);
                        }
                        if let ShareOutcome::Applied(a) = out {
                            let lowered = version > version0 && share < share0;
                            prop_assert_eq!(a.ack.is_some(), lowered);
                            prop_assert_eq!(a.bucket.refill_millitokens_per_s, s.applied_share_millitokens_per_s());
                            prop_assert_eq!(s.mode(now), Mode::Normal);
                        }
                    }
                }
                prop_assert!(s.highest_epoch() >= epoch0);
                prop_assert!(s.applied_share_version() >= version0);
            }
        }
    }
}
