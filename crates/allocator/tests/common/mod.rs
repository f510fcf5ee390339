//! Helpers shared by the allocator's integration tests: a harness that stamps
//! commands, command builders, and a model of what a Region enforces.
#![allow(dead_code)]

pub mod ops;

use leasehold_allocator::config::{RatePoolConfig, WindowPoolConfig};
use leasehold_allocator::id::RegionId;
use leasehold_allocator::pool::Pool;
use leasehold_allocator::share::{RatePool, ShareReply};
use leasehold_allocator::{
    Command, Machine, Outcome, PoolConfig, Rejection, Reply, StampedCommand,
};

/// L = 10,000 tokens per second, in millitokens per second.
pub const L: u64 = 10_000_000;

/// Applies commands at a given time with a fixed epoch.
pub struct Harness {
    pub machine: Machine,
    pub epoch: u64,
}

impl Default for Harness {
    fn default() -> Self {
        Harness {
            machine: Machine::new(),
            epoch: 1,
        }
    }
}

impl Harness {
    pub fn apply(&mut self, time_ms: u64, command: Command) -> Result<Reply, Rejection> {
        let entry = StampedCommand {
            epoch: self.epoch,
            stamped_time_ms: time_ms,
            command,
        };
        self.machine.apply(&entry)
    }

    /// Applies a command that must succeed.
    pub fn ok(&mut self, time_ms: u64, command: Command) -> Outcome {
        let shown = format!("{command:?}");
        match self.apply(time_ms, command) {
            Ok(reply) => reply.outcome,
            Err(rejection) => panic!("{shown} refused: {rejection}"),
        }
    }

    /// Applies a command that must be refused, and checks state is unchanged.
    pub fn refused(&mut self, time_ms: u64, command: Command) -> leasehold_allocator::CommandError {
        let before = self.snapshot();
        let shown = format!("{command:?}");
        let rejection = match self.apply(time_ms, command) {
            Ok(reply) => panic!("{shown} applied: {reply:?}"),
            Err(rejection) => rejection,
        };
        assert_eq!(rejection.epoch, self.epoch, "a rejection carries the epoch");
        assert_eq!(self.snapshot(), before, "{shown} changed state");
        rejection.error
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.machine.snapshot_bytes().expect("snapshot encodes")
    }

    pub fn rate(&self, pool: &str) -> &RatePool {
        match self.machine.pool(pool) {
            Some(Pool::Rate(rate)) => rate,
            other => panic!("{pool} is not a rate pool: {other:?}"),
        }
    }

    pub fn share_of(&self, pool: &str, region: &str) -> u64 {
        self.rate(pool).members[region]
            .account
            .share_millitokens_per_s
    }

    pub fn incarnation_of(&self, pool: &str, region: &str) -> u64 {
        let region = RegionId::parse(region).expect("valid region id");
        self.machine
            .pool(pool)
            .and_then(|p| p.member(&region))
            .map_or(0, |m| m.incarnation)
    }
}

pub fn rate_config(limit: u64) -> RatePoolConfig {
    RatePoolConfig::with_defaults(limit)
}

pub fn create_rate(pool: &str, config: RatePoolConfig) -> Command {
    Command::CreatePool {
        pool: pool.into(),
        config: PoolConfig::Rate(config),
    }
}

pub fn create_window(pool: &str, capacity: u64, window_ms: u64, lease_ttl_ms: u64) -> Command {
    Command::CreatePool {
        pool: pool.into(),
        config: PoolConfig::Window(WindowPoolConfig {
            capacity_millitokens_per_window: capacity,
            window_ms,
            lease_ttl_ms,
            regions: None,
        }),
    }
}

pub fn register(pool: &str, region: &str) -> Command {
    Command::RegisterRegion {
        pool: pool.into(),
        region: region.into(),
    }
}

pub fn grant(pool: &str, region: &str, incarnation: u64, lease_id: &str, want: u64) -> Command {
    Command::Grant {
        pool: pool.into(),
        region: region.into(),
        incarnation,
        lease_id: lease_id.into(),
        want_millitokens: want,
    }
}

pub fn rebalance(pool: &str, region: &RegionModel, demand: u64) -> Command {
    Command::Rebalance {
        pool: pool.into(),
        region: region.id.clone(),
        incarnation: region.incarnation,
        demand_requests: demand,
        applied_share_millitokens_per_s: region.bucket_share,
        applied_share_version: region.applied_version,
    }
}

pub fn ack(pool: &str, region: &RegionModel) -> Command {
    Command::AckShare {
        pool: pool.into(),
        region: region.id.clone(),
        incarnation: region.incarnation,
        applied_share_millitokens_per_s: region.bucket_share,
        applied_share_version: region.applied_version,
    }
}

pub fn share_reply(outcome: &Outcome) -> &ShareReply {
    match outcome {
        Outcome::Share(reply) => reply,
        Outcome::Registered {
            share: Some(reply), ..
        } => reply,
        other => panic!("not a share reply: {other:?}"),
    }
}

/// What one Region's agent enforces: the share of the newest reply it has
/// applied (by `share_version`, for its incarnation).
#[derive(Clone, Debug)]
pub struct RegionModel {
    pub id: String,
    pub incarnation: u64,
    /// The share its bucket refills at.
    pub bucket_share: u64,
    pub applied_version: u64,
}

impl RegionModel {
    /// A Region after `RegisterRegion`, enforcing what the reply says.
    pub fn registered(id: &str, outcome: &Outcome) -> Self {
        let reply = share_reply(outcome);
        RegionModel {
            id: id.to_string(),
            incarnation: reply.incarnation,
            bucket_share: reply.share_millitokens_per_s,
            applied_version: reply.share_version,
        }
    }

    /// Applies `reply` if it is newer than what the bucket has; returns true
    /// when that lowered the bucket (the agent then sends `AckShare`).
    pub fn apply(&mut self, reply: &ShareReply) -> bool {
        if reply.incarnation != self.incarnation || reply.share_version <= self.applied_version {
            return false;
        }
        let lowered = reply.share_millitokens_per_s < self.bucket_share;
        self.bucket_share = reply.share_millitokens_per_s;
        self.applied_version = reply.share_version;
        lowered
    }
}

/// Rounds millitokens per second to whole tokens per second.
pub fn tokens(millitokens: u64) -> u64 {
    (millitokens + 500) / 1_000
}

/// A discrete-event run of one rate pool: each Region rebalances every
/// interval on its own phase, applies each reply at once, and acks a lower
/// `ack_delay_ms` later (§4.3's worked-check model).
pub struct PhasedSim {
    pub harness: Harness,
    pub pool: String,
    pub regions: Vec<RegionModel>,
    pub interval_ms: u64,
    pub ack_delay_ms: u64,
    queue: std::collections::BTreeMap<(u64, u64), SimEvent>,
    sequence: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimEvent {
    Rebalance(usize),
    Ack(usize),
}

impl PhasedSim {
    /// Creates the pool and registers one Region per phase at `start_ms`;
    /// Region i first rebalances at `start_ms + phases_ms[i]`.
    pub fn new(
        config: RatePoolConfig,
        phases_ms: &[u64],
        start_ms: u64,
        ack_delay_ms: u64,
    ) -> Self {
        let pool = "rate".to_string();
        let interval_ms = config.interval_ms;
        let mut harness = Harness::default();
        harness.ok(start_ms, create_rate(&pool, config));
        let mut sim = PhasedSim {
            harness,
            pool,
            regions: Vec::new(),
            interval_ms,
            ack_delay_ms,
            queue: Default::default(),
            sequence: 0,
        };
        for (index, &phase) in phases_ms.iter().enumerate() {
            let id = format!("r{}", index + 1);
            let outcome = sim.harness.ok(start_ms, register(&sim.pool, &id));
            sim.regions.push(RegionModel::registered(&id, &outcome));
            sim.schedule(start_ms + phase, SimEvent::Rebalance(index));
        }
        sim
    }

    fn schedule(&mut self, time_ms: u64, event: SimEvent) {
        self.sequence += 1;
        self.queue.insert((time_ms, self.sequence), event);
    }

    /// Σ of what the Regions' buckets enforce.
    pub fn enforced_sum(&self) -> u64 {
        self.regions.iter().map(|r| r.bucket_share).sum()
    }

    pub fn committed_shares(&self) -> Vec<u64> {
        let rate = self.harness.rate(&self.pool);
        self.regions
            .iter()
            .map(|r| rate.members[r.id.as_str()].account.share_millitokens_per_s)
            .collect()
    }

    /// Runs every event before `end_ms`. `demand(i, t)` is what Region i
    /// reports at t; `observe(t, event, sim)` runs after each event.
    pub fn run_until(
        &mut self,
        end_ms: u64,
        demand: &mut dyn FnMut(usize, u64) -> u64,
        observe: &mut dyn FnMut(u64, SimEvent, &PhasedSim),
    ) {
        while let Some((&(time_ms, sequence), &event)) = self.queue.iter().next() {
            if time_ms >= end_ms {
                return;
            }
            self.queue.remove(&(time_ms, sequence));
            match event {
                SimEvent::Rebalance(index) => {
                    let command =
                        rebalance(&self.pool, &self.regions[index], demand(index, time_ms));
                    let outcome = self.harness.ok(time_ms, command);
                    if self.regions[index].apply(share_reply(&outcome)) {
                        self.schedule(time_ms + self.ack_delay_ms, SimEvent::Ack(index));
                    }
                    self.schedule(time_ms + self.interval_ms, SimEvent::Rebalance(index));
                }
                SimEvent::Ack(index) => {
                    let outcome = self
                        .harness
                        .ok(time_ms, ack(&self.pool, &self.regions[index]));
                    self.regions[index].apply(share_reply(&outcome));
                }
            }
            observe(time_ms, event, self);
        }
    }
}
