//! What the Regions actually enforce never sums above L (plus, under the
//! lease policy, the fallback allowances of Regions whose lease ran out).
//!
//! Model: each Region's agent applies a share only when a reply arrives, and
//! only a reply newer (by `share_version`) than the last it applied, of its
//! incarnation; replies are delivered at once, delayed (delivered later in
//! any order) or lost; after applying a lower share the agent acks at once
//! (the ack may be lost). Regions crash (enforce nothing), restart (register
//! again), get partitioned (their requests and acks are lost), and old
//! requests are applied again late (retries). The health
//! prober is right (a crashed Region is unhealthy, a live one healthy), an
//! admin reclaims only crashed Regions and removes any member, live and
//! still enforcing its share included (a removed one registers again, as a
//! fresh member, when it restarts or learns it was removed, refused while
//! its removal is pending; its delayed replies of before must not reach its
//! new bucket), and under `lease` an agent enforces
//! its fallback allowance once `share_ttl` (stretched by its clock drift,
//! ≤ max_drift) has passed since it sent the last request answered.

mod common;

use common::{ack, rebalance, register, share_reply, Harness, RegionModel, L};
use leasehold_allocator::config::{RatePoolConfig, ReclaimPolicy};
use leasehold_allocator::share::ShareReply;
use leasehold_allocator::{Command, CommandError, Outcome};
use proptest::prelude::*;

const POOL: &str = "rate";
const SHARE_TTL_MS: u64 = 15_000;
const MAX_DRIFT_MS: u64 = 1_000;

#[derive(Clone, Copy, Debug)]
enum Fate {
    Now,
    Delay,
    Lose,
}

#[derive(Clone, Debug)]
enum Op {
    Rebalance {
        region: usize,
        fate: Fate,
    },
    /// The Region's request rate changes (it reports it from now on).
    Demand {
        region: usize,
        demand: u64,
    },
    Deliver {
        pick: usize,
        ack_lost: bool,
    },
    Advance {
        ms: u64,
    },
    Crash {
        region: usize,
    },
    Restart {
        region: usize,
    },
    Partition {
        region: usize,
        cut: bool,
    },
    AdminReclaim {
        region: usize,
    },
    AdminRemove {
        region: usize,
    },
    /// An earlier Rebalance or AckShare applied again, late (a retried
    /// request); its reply reaches the agent.
    Replay {
        pick: usize,
    },
}

fn op(regions: usize) -> impl Strategy<Value = Op> {
    let fate = prop_oneof![4 => Just(Fate::Now), 3 => Just(Fate::Delay), 2 => Just(Fate::Lose)];
    prop_oneof![
        14 => (0..regions, fate).prop_map(|(region, fate)| Op::Rebalance { region, fate }),
        2 => (0..regions, prop_oneof![Just(0u64), 1u64..=10_000]).prop_map(|(region, demand)| Op::Demand { region, demand }),
        5 => (any::<usize>(), prop::bool::weighted(0.2)).prop_map(|(pick, ack_lost)| Op::Deliver { pick, ack_lost }),
        3 => (1u64..=6_000).prop_map(|ms| Op::Advance { ms }),
        1 => (0..regions).prop_map(|region| Op::Crash { region }),
        1 => (0..regions).prop_map(|region| Op::Restart { region }),
        1 => (0..regions, any::<bool>()).prop_map(|(region, cut)| Op::Partition { region, cut }),
        1 => (0..regions).prop_map(|region| Op::AdminReclaim { region }),
        1 => (0..regions).prop_map(|region| Op::AdminRemove { region }),
        3 => any::<usize>().prop_map(|pick| Op::Replay { pick }),
    ]
}

struct Agent {
    model: RegionModel,
    alive: bool,
    partitioned: bool,
    /// Fenced: drop everything until registered again.
    must_register: bool,
    lease_until_ms: u64,
    drift_ms: u64,
    demand: u64,
}

struct World {
    harness: Harness,
    agents: Vec<Agent>,
    in_flight: Vec<(usize, ShareReply, u64)>,
    /// Requests sent, for late replays: (agent, command, sent at).
    sent: Vec<(usize, Command, u64)>,
    now_ms: u64,
    lease: bool,
    fallback: u64,
}

impl World {
    fn renew(&mut self, index: usize, sent_at_ms: u64) {
        let agent = &mut self.agents[index];
        agent.lease_until_ms = agent
            .lease_until_ms
            .max(sent_at_ms + SHARE_TTL_MS + agent.drift_ms);
    }

    fn register(&mut self, index: usize) {
        let id = self.agents[index].model.id.clone();
        let mut attempt = self.harness.apply(self.now_ms, register(POOL, &id));
        if let Err(rejection) = &attempt {
            if matches!(rejection.error, CommandError::RegionRemovedByAdmin { .. }) {
                // An admin removed it: here the admin readmits it, and the
                // agent's retry joins as a fresh member.
                let readmit = Command::ReadmitRegion {
                    pool: POOL.into(),
                    region: id.clone(),
                };
                self.harness.ok(self.now_ms, readmit);
                attempt = self.harness.apply(self.now_ms, register(POOL, &id));
            }
        }
        let outcome = match attempt {
            Ok(reply) => reply.outcome,
            Err(rejection) => {
                // Its removal waits for the old share's release: it keeps
                // trying, enforcing nothing meanwhile.
                assert!(
                    matches!(rejection.error, CommandError::RegionBeingRemoved { .. }),
                    "{rejection}"
                );
                return;
            }
        };
        self.agents[index].model = RegionModel::registered(&id, &outcome);
        self.agents[index].must_register = false;
        self.renew(index, self.now_ms);
    }

    fn deliver(&mut self, index: usize, reply: &ShareReply, sent_at_ms: u64, ack_lost: bool) {
        let agent = &self.agents[index];
        if !agent.alive || agent.must_register || reply.incarnation != agent.model.incarnation {
            return;
        }
        self.renew(index, sent_at_ms);
        if !self.agents[index].model.apply(reply) {
            return;
        }
        if ack_lost || self.agents[index].partitioned {
            return;
        }
        let command = ack(POOL, &self.agents[index].model);
        self.sent.push((index, command.clone(), self.now_ms));
        self.answer(index, command, Fate::Now);
    }

    /// Sends a request and handles its answer: the reply's fate, or the
    /// agent dropping the pool when fenced.
    fn answer(&mut self, index: usize, command: Command, fate: Fate) {
        match self.harness.apply(self.now_ms, command) {
            Ok(reply) => {
                let reply = share_reply(&reply.outcome).clone();
                match fate {
                    Fate::Now => self.deliver(index, &reply, self.now_ms, false),
                    Fate::Delay => self.in_flight.push((index, reply, self.now_ms)),
                    Fate::Lose => {}
                }
            }
            Err(rejection) => {
                // RegionNotInPool (removed) is handled as a fence by the agent.
                assert!(
                    matches!(
                        rejection.error,
                        CommandError::Fenced { .. } | CommandError::RegionNotInPool { .. }
                    ),
                    "{rejection}"
                );
                let agent = &mut self.agents[index];
                agent.model.bucket_share = 0;
                agent.must_register = true;
            }
        }
    }

    fn rebalance(&mut self, index: usize, fate: Fate) {
        let agent = &self.agents[index];
        if !agent.alive || agent.partitioned {
            return;
        }
        if agent.must_register {
            return self.register(index);
        }
        let command = rebalance(POOL, &agent.model, agent.demand);
        self.sent.push((index, command.clone(), self.now_ms));
        self.answer(index, command, fate);
    }

    fn health(&mut self, index: usize, healthy: bool) {
        let region = self.agents[index].model.id.clone();
        if !self.harness.machine.regions().contains_key(region.as_str()) {
            // Removed and forgotten: the verdict is refused, nothing changes.
            let refused = self
                .harness
                .refused(self.now_ms, Command::HealthVerdict { region, healthy });
            assert!(
                matches!(refused, CommandError::UnknownRegion { .. }),
                "{refused}"
            );
            return;
        }
        self.harness
            .ok(self.now_ms, Command::HealthVerdict { region, healthy });
    }

    fn step(&mut self, op: &Op) {
        match *op {
            Op::Rebalance { region, fate } => self.rebalance(region, fate),
            Op::Demand { region, demand } => self.agents[region].demand = demand,
            Op::Deliver { pick, ack_lost } => {
                if !self.in_flight.is_empty() {
                    let (index, reply, sent_at_ms) =
                        self.in_flight.remove(pick % self.in_flight.len());
                    self.deliver(index, &reply, sent_at_ms, ack_lost);
                }
            }
            Op::Advance { ms } => {
                self.now_ms += ms;
                self.harness.ok(self.now_ms, Command::Tick);
            }
            Op::Crash { region } => {
                let agent = &mut self.agents[region];
                agent.alive = false;
                agent.model.bucket_share = 0;
                self.health(region, false);
            }
            Op::Restart { region } => {
                if !self.agents[region].alive {
                    self.agents[region].alive = true;
                    self.agents[region].partitioned = false;
                    // Registered first: a removed Region is unknown until then.
                    self.register(region);
                    self.health(region, true);
                }
            }
            Op::Replay { pick } => {
                if self.sent.is_empty() {
                    return;
                }
                // One of the last few requests: the retries that matter.
                let back = pick % self.sent.len().min(6);
                let (index, command, sent_at_ms) = self.sent[self.sent.len() - 1 - back].clone();
                // Fenced or otherwise refused replays change nothing.
                if let Ok(reply) = self.harness.apply(self.now_ms, command) {
                    let reply = share_reply(&reply.outcome).clone();
                    self.deliver(index, &reply, sent_at_ms, false);
                }
            }
            Op::Partition { region, cut } => self.agents[region].partitioned = cut,
            Op::AdminReclaim { region } => {
                let id = self.agents[region].model.id.clone();
                if !self.agents[region].alive && self.is_member(&id) {
                    self.harness.ok(
                        self.now_ms,
                        Command::AdminReclaim {
                            pool: POOL.into(),
                            region: id,
                        },
                    );
                }
            }
            Op::AdminRemove { region } => {
                // Live and enforcing, crashed, or already being removed.
                let id = self.agents[region].model.id.clone();
                if self.is_member(&id) {
                    let outcome = self.harness.ok(
                        self.now_ms,
                        Command::RemoveRegion {
                            pool: POOL.into(),
                            region: id,
                        },
                    );
                    let Outcome::Removed(report) = outcome else {
                        panic!("not a removal: {outcome:?}");
                    };
                    // Gone from the pool: it registers again (on restart, or
                    // after its next call is refused). Pending: its agent
                    // goes on, still enforcing, until it learns share 0.
                    if report.pending.is_none() {
                        self.agents[region].must_register = true;
                    }
                }
            }
        }
    }

    fn is_member(&self, region: &str) -> bool {
        self.harness.rate(POOL).members.contains_key(region)
    }

    /// (Σ enforced, Σ fallback allowances in force).
    fn enforced(&self) -> (u64, u64) {
        let mut enforced = 0;
        let mut fallback = 0;
        for agent in self.agents.iter().filter(|agent| agent.alive) {
            if self.lease && self.now_ms >= agent.lease_until_ms {
                enforced += self.fallback;
                fallback += self.fallback;
            } else {
                enforced += agent.model.bucket_share;
            }
        }
        (enforced, fallback)
    }
}

fn policy() -> impl Strategy<Value = ReclaimPolicy> {
    prop_oneof![
        Just(ReclaimPolicy::Freeze),
        Just(ReclaimPolicy::two_signal_default()),
        Just(ReclaimPolicy::Lease {
            share_ttl_ms: SHARE_TTL_MS,
            max_drift_ms: MAX_DRIFT_MS
        }),
    ]
}

fn scenario() -> impl Strategy<Value = (ReclaimPolicy, bool, Vec<u64>, Vec<Op>)> {
    (2usize..=4).prop_flat_map(|regions| {
        (
            policy(),
            any::<bool>(),
            proptest::collection::vec(0u64..=MAX_DRIFT_MS, regions),
            proptest::collection::vec(op(regions), 1..300),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn enforced_shares_never_sum_above_l(
        (reclaim, strict, drifts, ops) in scenario()
    ) {
        let mut config = RatePoolConfig::with_defaults(L);
        config.reclaim = reclaim.clone();
        if strict {
            config.fallback_allowance_millitokens_per_s = 0;
        }
        let fallback = config.fallback_allowance_millitokens_per_s;
        let mut harness = Harness::default();
        harness.ok(0, common::create_rate(POOL, config));
        let mut agents = Vec::new();
        for (index, &drift_ms) in drifts.iter().enumerate() {
            let id = format!("r{index}");
            let outcome = harness.ok(0, register(POOL, &id));
            let registered = matches!(outcome, Outcome::Registered { .. });
            prop_assert!(registered);
            agents.push(Agent {
                model: RegionModel::registered(&id, &outcome),
                alive: true,
                partitioned: false,
                must_register: false,
                lease_until_ms: SHARE_TTL_MS + drift_ms,
                drift_ms,
                demand: 1_000,
            });
        }
        let lease = matches!(reclaim, ReclaimPolicy::Lease { .. });
        let mut world = World { harness, agents, in_flight: Vec::new(), sent: Vec::new(), now_ms: 0, lease, fallback };
        for op in &ops {
            world.step(op);
            let (enforced, fallback_in_force) = world.enforced();
            prop_assert!(
                enforced <= L + fallback_in_force,
                "after {:?} at {} ms: enforced {} > L {} + fallback {}",
                op, world.now_ms, enforced, L, fallback_in_force
            );
            let committed = world.harness.rate(POOL).committed_shares();
            prop_assert!(committed <= u128::from(L));
        }
    }
}
