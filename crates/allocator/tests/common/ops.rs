//! Random command sequences: pool creation and updates (valid or not),
//! registrations, grants, rebalances and acks with honest, stale or random
//! reports, health verdicts, ticks, freezes, reclaims, admin removals (and
//! registrations again after them), time moving forward
//! and backward, epochs rising, and duplicates of earlier commands applied
//! late (reordering).

use leasehold_allocator::config::{RatePoolConfig, ReclaimPolicy, WindowPoolConfig};
use leasehold_allocator::pool::Pool;
use leasehold_allocator::{Command, Machine, PoolConfig, Rejection, Reply, StampedCommand};
use proptest::prelude::*;

pub const POOLS: [&str; 4] = ["rate-a", "win-b", "rate-c", "missing"];
pub const REGIONS: [&str; 5] = ["r0", "r1", "r2", "r3", "ghost"];

#[derive(Clone, Copy, Debug)]
pub enum Incarnation {
    Current,
    Stale,
    Ahead,
}

#[derive(Clone, Copy, Debug)]
pub enum Applied {
    /// The committed share and version, as if applied at once.
    Committed,
    /// A lower share than committed with the committed version.
    BelowCommitted,
    /// An older version with some share.
    Stale {
        versions_back: u64,
        share: u64,
    },
    Random {
        share: u64,
        version: u64,
    },
}

#[derive(Clone, Debug)]
pub enum Op {
    CreateRate {
        pool: usize,
        config: RatePoolConfig,
    },
    CreateWindow {
        pool: usize,
        config: WindowPoolConfig,
    },
    Update {
        pool: usize,
        config: PoolConfig,
    },
    Register {
        pool: usize,
        region: usize,
    },
    Grant {
        pool: usize,
        region: usize,
        incarnation: Incarnation,
        lease: u8,
        want: u64,
    },
    Rebalance {
        pool: usize,
        region: usize,
        incarnation: Incarnation,
        demand: u64,
        applied: Applied,
    },
    Ack {
        pool: usize,
        region: usize,
        incarnation: Incarnation,
        applied: Applied,
    },
    Health {
        region: usize,
        healthy: bool,
    },
    Tick,
    Freeze {
        pool: usize,
        region: usize,
        frozen: bool,
    },
    Reclaim {
        pool: usize,
        region: usize,
    },
    Remove {
        pool: usize,
        region: usize,
    },
    Advance {
        ms: u64,
    },
    Rewind {
        ms: u64,
    },
    EpochUp,
    EpochDown,
    Repeat {
        back: usize,
    },
}

fn policy() -> impl Strategy<Value = ReclaimPolicy> {
    prop_oneof![
        Just(ReclaimPolicy::Freeze),
        (1u64..=3).prop_map(|silent_intervals| ReclaimPolicy::TwoSignal { silent_intervals }),
        // Simulation only, but the machine's invariants must hold under it too.
        (1u64..=3).prop_map(|silent_intervals| ReclaimPolicy::SilenceOnly { silent_intervals }),
        (1u64..=20_000, 0u64..=2_000).prop_map(|(share_ttl_ms, max_drift_ms)| {
            ReclaimPolicy::Lease {
                share_ttl_ms,
                max_drift_ms,
            }
        }),
    ]
}

/// Mostly valid rate configs; some break one field.
pub fn rate_config() -> impl Strategy<Value = RatePoolConfig> {
    (
        prop_oneof![4 => Just(10_000_000u64), 4 => 1u64..=100_000, 1 => Just(0u64)],
        0u64..=2_000,
        prop_oneof![Just(1_000u64), 0u64..=10_000],
        prop_oneof![Just(5_000u64), 1u64..=10_000],
        policy(),
        any::<bool>(),
    )
        .prop_map(|(limit, floor, raise, interval_ms, reclaim, strict)| {
            let mut config = RatePoolConfig::with_defaults(limit);
            config.floor_basis_points = floor;
            config.max_raise_basis_points = raise;
            config.interval_ms = interval_ms;
            config.reclaim = reclaim;
            if strict {
                config.fallback_allowance_millitokens_per_s = 0;
            }
            config
        })
}

pub fn window_config() -> impl Strategy<Value = WindowPoolConfig> {
    (
        prop_oneof![8 => 1u64..=10_000, 1 => Just(0u64)],
        prop_oneof![Just(10_000u64), 1u64..=30_000],
        1u64..=20_000,
    )
        .prop_map(|(capacity, window_ms, lease_ttl_ms)| WindowPoolConfig {
            capacity_millitokens_per_window: capacity,
            window_ms,
            lease_ttl_ms,
            regions: None,
        })
}

fn incarnation() -> impl Strategy<Value = Incarnation> {
    prop_oneof![8 => Just(Incarnation::Current), 1 => Just(Incarnation::Stale), 1 => Just(Incarnation::Ahead)]
}

fn applied() -> impl Strategy<Value = Applied> {
    prop_oneof![
        6 => Just(Applied::Committed),
        1 => Just(Applied::BelowCommitted),
        2 => (1u64..=3, 0u64..=10_000_000).prop_map(|(versions_back, share)| Applied::Stale { versions_back, share }),
        1 => (0u64..=20_000_000, 0u64..=30).prop_map(|(share, version)| Applied::Random { share, version }),
    ]
}

pub fn op() -> impl Strategy<Value = Op> {
    let pool = 0usize..POOLS.len();
    let region = 0usize..REGIONS.len();
    prop_oneof![
        2 => (pool.clone(), rate_config()).prop_map(|(pool, config)| Op::CreateRate { pool, config }),
        1 => (pool.clone(), window_config()).prop_map(|(pool, config)| Op::CreateWindow { pool, config }),
        1 => (pool.clone(), prop_oneof![rate_config().prop_map(PoolConfig::Rate), window_config().prop_map(PoolConfig::Window)])
            .prop_map(|(pool, config)| Op::Update { pool, config }),
        4 => (pool.clone(), 0usize..4).prop_map(|(pool, region)| Op::Register { pool, region }),
        3 => (pool.clone(), region.clone(), incarnation(), 0u8..6, prop_oneof![8 => 1u64..=5_000, 1 => Just(0u64), 1 => Just((1u64 << 40) + 1)])
            .prop_map(|(pool, region, incarnation, lease, want)| Op::Grant { pool, region, incarnation, lease, want }),
        12 => (pool.clone(), region.clone(), incarnation(), prop_oneof![Just(0u64), 1u64..=10_000], applied())
            .prop_map(|(pool, region, incarnation, demand, applied)| Op::Rebalance { pool, region, incarnation, demand, applied }),
        5 => (pool.clone(), region.clone(), incarnation(), applied())
            .prop_map(|(pool, region, incarnation, applied)| Op::Ack { pool, region, incarnation, applied }),
        2 => (region.clone(), any::<bool>()).prop_map(|(region, healthy)| Op::Health { region, healthy }),
        2 => Just(Op::Tick),
        1 => (pool.clone(), region.clone(), any::<bool>()).prop_map(|(pool, region, frozen)| Op::Freeze { pool, region, frozen }),
        1 => (pool.clone(), region.clone()).prop_map(|(pool, region)| Op::Reclaim { pool, region }),
        1 => (pool.clone(), region.clone()).prop_map(|(pool, region)| Op::Remove { pool, region }),
        4 => (1u64..=8_000).prop_map(|ms| Op::Advance { ms }),
        1 => (1u64..=8_000).prop_map(|ms| Op::Rewind { ms }),
        1 => Just(Op::EpochUp),
        1 => Just(Op::EpochDown),
        3 => (0usize..20).prop_map(|back| Op::Repeat { back }),
    ]
}

/// Valid pools (`rate-a`, `win-b`, `rate-c`) with members, then random ops.
pub fn sequence(max_ops: usize) -> impl Strategy<Value = Vec<Op>> {
    let valid_rate = || rate_config().prop_filter("valid", |config| config.validate().is_ok());
    let valid_window = window_config().prop_filter("valid", |config| config.validate().is_ok());
    (
        valid_rate(),
        valid_window,
        valid_rate(),
        proptest::collection::vec(op(), 1..max_ops),
    )
        .prop_map(|(rate_a, window_b, rate_c, random)| {
            let mut ops = vec![
                Op::CreateRate {
                    pool: 0,
                    config: rate_a,
                },
                Op::CreateWindow {
                    pool: 1,
                    config: window_b,
                },
                Op::CreateRate {
                    pool: 2,
                    config: rate_c,
                },
            ];
            for region in 0..4 {
                ops.push(Op::Register { pool: 0, region });
                ops.push(Op::Register { pool: 1, region });
            }
            for region in 0..3 {
                ops.push(Op::Register { pool: 2, region });
            }
            ops.extend(random);
            ops
        })
}

/// Turns ops into stamped commands against a machine, keeping time, epoch
/// and the history of entries (for late duplicates).
pub struct Driver {
    pub machine: Machine,
    pub time_ms: u64,
    pub epoch: u64,
    pub history: Vec<StampedCommand>,
}

impl Default for Driver {
    fn default() -> Self {
        Driver {
            machine: Machine::new(),
            time_ms: 1_000_000,
            epoch: 3,
            history: Vec::new(),
        }
    }
}

impl Driver {
    fn member_state(&self, pool: &str, region: &str) -> (u64, u64, u64) {
        let Some(state) = self.machine.pool(pool) else {
            return (1, 0, 0);
        };
        match state {
            Pool::Rate(rate) => rate.members.get(region).map_or((1, 0, 0), |m| {
                (
                    m.member.incarnation,
                    m.account.share_millitokens_per_s,
                    m.account.share_version,
                )
            }),
            Pool::Window(window) => window
                .members
                .get(region)
                .map_or((1, 0, 0), |m| (m.incarnation, 0, 0)),
        }
    }

    fn report(
        &self,
        pool: &str,
        region: &str,
        incarnation: Incarnation,
        applied: Applied,
    ) -> (u64, u64, u64) {
        let (current, share, version) = self.member_state(pool, region);
        let incarnation = match incarnation {
            Incarnation::Current => current,
            Incarnation::Stale => current.saturating_sub(1),
            Incarnation::Ahead => current + 1,
        };
        let (applied_share, applied_version) = match applied {
            Applied::Committed => (share, version),
            Applied::BelowCommitted => (share / 2, version),
            Applied::Stale {
                versions_back,
                share,
            } => (share, version.saturating_sub(versions_back)),
            Applied::Random { share, version } => (share, version),
        };
        (incarnation, applied_share, applied_version)
    }

    /// The command an op stands for, or `None` for time/epoch ops.
    pub fn command(&mut self, op: &Op) -> Option<StampedCommand> {
        let command = match op.clone() {
            Op::CreateRate { pool, config } => Command::CreatePool {
                pool: POOLS[pool].into(),
                config: PoolConfig::Rate(config),
            },
            Op::CreateWindow { pool, config } => Command::CreatePool {
                pool: POOLS[pool].into(),
                config: PoolConfig::Window(config),
            },
            Op::Update { pool, config } => Command::UpdatePool {
                pool: POOLS[pool].into(),
                config,
            },
            Op::Register { pool, region } => Command::RegisterRegion {
                pool: POOLS[pool].into(),
                region: REGIONS[region].into(),
            },
            Op::Grant {
                pool,
                region,
                incarnation,
                lease,
                want,
            } => {
                let (incarnation, _, _) = self.report(
                    POOLS[pool],
                    REGIONS[region],
                    incarnation,
                    Applied::Committed,
                );
                Command::Grant {
                    pool: POOLS[pool].into(),
                    region: REGIONS[region].into(),
                    incarnation,
                    lease_id: format!("lease-{lease}"),
                    want_millitokens: want,
                }
            }
            Op::Rebalance {
                pool,
                region,
                incarnation,
                demand,
                applied,
            } => {
                let (incarnation, share, version) =
                    self.report(POOLS[pool], REGIONS[region], incarnation, applied);
                Command::Rebalance {
                    pool: POOLS[pool].into(),
                    region: REGIONS[region].into(),
                    incarnation,
                    demand_requests: demand,
                    applied_share_millitokens_per_s: share,
                    applied_share_version: version,
                }
            }
            Op::Ack {
                pool,
                region,
                incarnation,
                applied,
            } => {
                let (incarnation, share, version) =
                    self.report(POOLS[pool], REGIONS[region], incarnation, applied);
                Command::AckShare {
                    pool: POOLS[pool].into(),
                    region: REGIONS[region].into(),
                    incarnation,
                    applied_share_millitokens_per_s: share,
                    applied_share_version: version,
                }
            }
            Op::Health { region, healthy } => Command::HealthVerdict {
                region: REGIONS[region].into(),
                healthy,
            },
            Op::Tick => Command::Tick,
            Op::Freeze {
                pool,
                region,
                frozen,
            } => Command::AdminFreeze {
                pool: POOLS[pool].into(),
                region: REGIONS[region].into(),
                frozen,
            },
            Op::Reclaim { pool, region } => Command::AdminReclaim {
                pool: POOLS[pool].into(),
                region: REGIONS[region].into(),
            },
            Op::Remove { pool, region } => Command::RemoveRegion {
                pool: POOLS[pool].into(),
                region: REGIONS[region].into(),
            },
            Op::Advance { ms } => {
                self.time_ms += ms;
                return None;
            }
            Op::Rewind { ms } => {
                self.time_ms = self.time_ms.saturating_sub(ms);
                return None;
            }
            Op::EpochUp => {
                self.epoch += 1;
                return None;
            }
            Op::EpochDown => {
                // The next command carries a lower epoch than applied: refused.
                return Some(StampedCommand {
                    epoch: self.epoch.saturating_sub(1),
                    stamped_time_ms: self.time_ms,
                    command: Command::Tick,
                });
            }
            Op::Repeat { back } => {
                let entry = self.history.iter().rev().nth(back)?.clone();
                // A late duplicate: same command and stamp, committed now.
                return Some(StampedCommand {
                    epoch: self.epoch,
                    ..entry
                });
            }
        };
        Some(StampedCommand {
            epoch: self.epoch,
            stamped_time_ms: self.time_ms,
            command,
        })
    }

    /// Applies an op; `None` when it was only a time or epoch move.
    pub fn apply(&mut self, op: &Op) -> Option<(StampedCommand, Result<Reply, Rejection>)> {
        let entry = self.command(op)?;
        let result = self.machine.apply(&entry);
        self.history.push(entry.clone());
        Some((entry, result))
    }
}
