//! The coalescer's decisions, pure: what to queue, what to refuse, when to
//! flush and how to pack. Time is an argument (microseconds on any
//! monotonic origin); the I/O shell is `crate::store::coalesce`.
//!
//! Flush policy (ARCHITECTURE §3.3 "coalesce concurrent requests per shard
//! into one script call within a tiny window"):
//! - nothing in flight: flush at once, so a lone request never waits;
//! - fewer than `max_in_flight` batches in flight: gather, and flush once
//!   `max_batch` calls are queued or the oldest has waited `max_wait_us`;
//! - `max_in_flight` batches in flight: hold until one completes.
//!
//! Limits: at most `max_queue` calls wait; a request that would pass it is
//! refused at once (the caller answers `NotSent::QueueFull`), never queued.
//! A request whose deadline passes while queued is dropped, never sent.
//! A pack holds at most `max_batch` calls, all of one Redis Cluster slot
//! unless the store is known to be standalone ([`Grouping`]).
//!
//! Packing by slot, not by hash tag: Redis Cluster refuses a script call
//! only when its keys span slots (CROSSSLOT), so calls of different tags
//! (tenants) whose tags hash to one slot share a pack. Same tag implies
//! same slot, so this is as safe as packing by tag and never packs less.
//! Packs per node are not possible: one node owns many slots, but a script
//! call naming keys of two of them is refused. A call whose own keys span
//! slots (a caller's bug: policies keep one request's keys under one tag)
//! goes in a pack of its own, so only it is refused.

use std::collections::VecDeque;

use crate::store::script::{ScriptCall, ScriptKind, MULTI_DECISION_MAX_CALLS};

/// The gatherer's bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GatherLimits {
    /// Most calls in one pack (one multi_decision call), in
    /// [1, [`MULTI_DECISION_MAX_CALLS`]].
    pub max_batch: usize,
    /// Longest a queued call waits for company while a batch is in flight.
    pub max_wait_us: u64,
    /// Most calls queued at once; beyond it requests are refused.
    pub max_queue: usize,
    /// Most batches (pipelines) in flight at once; at least 1.
    pub max_in_flight: usize,
}

/// How calls may share a pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grouping {
    /// A Redis Cluster (or not yet known): a pack's keys share one slot
    /// ([`call_slot`]), whatever their hash tags.
    BySlot,
    /// One keyspace: any calls may share a pack.
    Standalone,
}

/// The request would pass `max_queue` queued calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueFull {
    pub max_queue: usize,
}

struct Pending<T> {
    ticket: T,
    calls: Vec<ScriptCall>,
    enqueued_us: u64,
    deadline_us: u64,
}

/// One batch to send: packs in pipeline order, and where each request's
/// replies are.
#[derive(Debug)]
pub struct Flush<T> {
    /// Each at most `max_batch` calls; one pipeline carries them all.
    pub packs: Vec<Vec<ScriptCall>>,
    /// Per request: (pack, index in pack) of each of its calls, in its order.
    pub routes: Vec<(T, Vec<(usize, usize)>)>,
    /// The latest deadline among the batch's requests (none of them is
    /// overdue; they were queued within `max_wait_us` of each other unless
    /// every send slot was busy).
    pub deadline_us: u64,
}

/// What the shell must do after [`Gatherer::step`].
#[derive(Debug)]
pub struct Step<T> {
    /// Requests whose deadline passed while queued: answer them not sent.
    pub expired: Vec<T>,
    /// A batch to send now (it counts as in flight until `batch_done`).
    pub flush: Option<Flush<T>>,
    /// When to step again if nothing else happens first.
    pub wake_at_us: Option<u64>,
}

/// Queued requests and the batches in flight.
pub struct Gatherer<T> {
    limits: GatherLimits,
    queue: VecDeque<Pending<T>>,
    queued_calls: usize,
    in_flight: usize,
}

impl<T> Gatherer<T> {
    /// `max_batch` is clamped to [1, 64], `max_in_flight` and `max_queue`
    /// to at least 1.
    pub fn new(limits: GatherLimits) -> Self {
        let limits = GatherLimits {
            max_batch: limits.max_batch.clamp(1, MULTI_DECISION_MAX_CALLS),
            max_queue: limits.max_queue.max(1),
            max_in_flight: limits.max_in_flight.max(1),
            ..limits
        };
        Gatherer {
            limits,
            queue: VecDeque::new(),
            queued_calls: 0,
            in_flight: 0,
        }
    }

    pub fn limits(&self) -> GatherLimits {
        self.limits
    }

    pub fn queued_calls(&self) -> usize {
        self.queued_calls
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Queues a request (its calls in order) or refuses it whole when the
    /// queue would pass `max_queue` calls; a refused ticket comes back.
    pub fn submit(
        &mut self,
        ticket: T,
        calls: Vec<ScriptCall>,
        now_us: u64,
        deadline_us: u64,
    ) -> Result<(), (T, QueueFull)> {
        if self.queued_calls + calls.len() > self.limits.max_queue {
            let full = QueueFull {
                max_queue: self.limits.max_queue,
            };
            return Err((ticket, full));
        }
        self.queued_calls += calls.len();
        self.queue.push_back(Pending {
            ticket,
            calls,
            enqueued_us: now_us,
            deadline_us,
        });
        Ok(())
    }

    /// A batch from [`Step::flush`] has completed (answered or failed).
    pub fn batch_done(&mut self) {
        debug_assert!(self.in_flight > 0, "batch_done without a batch in flight");
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Expires overdue requests and decides whether to flush now.
    pub fn step(&mut self, now_us: u64, grouping: Grouping) -> Step<T> {
        let expired = self.expire(now_us);
        let mut step = Step {
            expired,
            flush: None,
            wake_at_us: None,
        };
        let Some(oldest) = self.queue.front() else {
            return step;
        };
        let flush_at_us = oldest.enqueued_us.saturating_add(self.limits.max_wait_us);
        let can_send = self.in_flight < self.limits.max_in_flight;
        let due = self.in_flight == 0
            || self.queued_calls >= self.limits.max_batch
            || now_us >= flush_at_us;
        if can_send && due {
            step.flush = Some(self.take_all(grouping));
            return step;
        }
        let earliest_deadline_us = self.queue.iter().map(|p| p.deadline_us).min();
        step.wake_at_us = match can_send {
            true => earliest_deadline_us.map(|d| d.min(flush_at_us)),
            // Full: a completing batch steps again; until then only
            // deadlines can change anything.
            false => earliest_deadline_us,
        };
        step
    }

    fn expire(&mut self, now_us: u64) -> Vec<T> {
        if self.queue.iter().all(|p| p.deadline_us > now_us) {
            return Vec::new();
        }
        let mut expired = Vec::new();
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for pending in self.queue.drain(..) {
            if pending.deadline_us > now_us {
                kept.push_back(pending);
            } else {
                self.queued_calls -= pending.calls.len();
                expired.push(pending.ticket);
            }
        }
        self.queue = kept;
        expired
    }

    fn take_all(&mut self, grouping: Grouping) -> Flush<T> {
        let pending: Vec<Pending<T>> = self.queue.drain(..).collect();
        self.queued_calls = 0;
        self.in_flight += 1;
        let deadline_us = pending.iter().map(|p| p.deadline_us).max().unwrap_or(0);
        let mut packer = Packer::new(self.limits.max_batch, grouping);
        let routes = pending
            .into_iter()
            .map(|p| {
                let route = p.calls.into_iter().map(|call| packer.add(call)).collect();
                (p.ticket, route)
            })
            .collect();
        Flush {
            packs: packer.packs,
            routes,
            deadline_us,
        }
    }
}

/// Which calls may share a pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Group {
    /// Standalone: every call.
    Any,
    /// Calls whose keys are all in this slot.
    Slot(u16),
}

/// Fills packs: each group's open pack takes calls until `max_batch`.
struct Packer {
    max_batch: usize,
    grouping: Grouping,
    packs: Vec<Vec<ScriptCall>>,
    /// Group → index of its open (not yet full) pack; at most one entry per
    /// slot (16,384) plus one.
    open: std::collections::HashMap<Group, usize>,
}

impl Packer {
    fn new(max_batch: usize, grouping: Grouping) -> Self {
        Packer {
            max_batch,
            grouping,
            packs: Vec::new(),
            open: std::collections::HashMap::new(),
        }
    }

    /// Places `call`; returns (pack, index in pack).
    fn add(&mut self, call: ScriptCall) -> (usize, usize) {
        let group = match self.grouping {
            Grouping::Standalone => Some(Group::Any),
            Grouping::BySlot => call_slot(&call).map(Group::Slot),
        };
        // A multi_decision or bucket_pack call cannot be packed again, and
        // a look's read-only bodies are not in multi_decision's source: alone.
        let group = group.filter(|_| {
            !matches!(
                call.kind,
                ScriptKind::MultiDecision | ScriptKind::Look | ScriptKind::BucketPack
            )
        });
        let Some(group) = group else {
            self.packs.push(vec![call]);
            return (self.packs.len() - 1, 0);
        };
        let pack = match self.open.get(&group) {
            Some(&index) if self.packs[index].len() < self.max_batch => index,
            _ => {
                self.packs.push(Vec::new());
                self.open.insert(group, self.packs.len() - 1);
                self.packs.len() - 1
            }
        };
        self.packs[pack].push(call);
        (pack, self.packs[pack].len() - 1)
    }
}

use crate::store::slots::slot_of_key;

/// The one slot of all the call's keys; None when they span slots or there
/// are no keys (such a call goes in a pack of its own on a cluster).
pub fn call_slot(call: &ScriptCall) -> Option<u16> {
    let mut slots = call.keys.iter().map(|key| slot_of_key(key));
    let first = slots.next()?;
    slots.all(|slot| slot == first).then_some(first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const LIMITS: GatherLimits = GatherLimits {
        max_batch: 4,
        max_wait_us: 200,
        max_queue: 10,
        max_in_flight: 2,
    };

    fn call(tag: &str, n: usize) -> ScriptCall {
        ScriptCall::new(ScriptKind::TokenBucket)
            .key(format!("lh:v1:{{{tag}}}:r:p"))
            .arg(n)
    }

    #[test]
    fn a_lone_request_is_sent_at_once() {
        let mut g = Gatherer::new(LIMITS);
        g.submit(1, vec![call("a", 1)], 0, 1_000).unwrap();
        let step = g.step(0, Grouping::BySlot);
        let flush = step.flush.expect("idle store: flush at once");
        assert_eq!(flush.packs, vec![vec![call("a", 1)]]);
        assert_eq!(flush.routes, vec![(1, vec![(0, 0)])]);
        assert_eq!(g.in_flight(), 1);
    }

    #[test]
    fn while_a_batch_is_in_flight_requests_gather_until_the_wait_or_the_batch_size() {
        let mut g = Gatherer::new(LIMITS);
        g.submit(0, vec![call("a", 0)], 0, 10_000).unwrap();
        assert!(g.step(0, Grouping::BySlot).flush.is_some());
        g.submit(1, vec![call("a", 1)], 10, 10_000).unwrap();
        let step = g.step(10, Grouping::BySlot);
        assert!(step.flush.is_none());
        assert_eq!(step.wake_at_us, Some(210));
        g.submit(2, vec![call("b", 2)], 50, 10_000).unwrap();
        assert!(g.step(209, Grouping::BySlot).flush.is_none());
        let flush = g.step(210, Grouping::BySlot).flush.expect("waited enough");
        assert_eq!(flush.packs, vec![vec![call("a", 1)], vec![call("b", 2)]]);
        // Two in flight (the cap): even a full batch waits for a completion.
        for t in 3..8 {
            g.submit(t, vec![call("a", t as usize)], 300, 10_000)
                .unwrap();
        }
        assert!(g.step(300, Grouping::BySlot).flush.is_none());
        g.batch_done();
        let flush = g.step(301, Grouping::BySlot).flush.expect("room again");
        assert_eq!(flush.packs.len(), 2, "5 calls of one tag: packs of 4 and 1");
        assert_eq!(flush.packs[0].len(), 4);
    }

    #[test]
    fn a_full_queue_refuses_at_once_and_an_overdue_request_is_never_sent() {
        let mut g = Gatherer::new(LIMITS);
        g.submit(0, vec![call("a", 0)], 0, 10_000).unwrap();
        assert!(g.step(0, Grouping::BySlot).flush.is_some());
        g.submit(1, vec![call("a", 1); 6], 0, 100).unwrap();
        g.submit(2, vec![call("a", 2); 4], 0, 10_000).unwrap();
        let refused = g.submit(3, vec![call("a", 3)], 0, 10_000);
        assert_eq!(refused, Err((3, QueueFull { max_queue: 10 })));
        let step = g.step(100, Grouping::BySlot);
        assert_eq!(step.expired, vec![1]);
        let flush = step.flush.expect("4 queued: a full batch");
        assert_eq!(flush.routes.len(), 1);
        assert_eq!(flush.routes[0].0, 2);
    }

    /// A tag other than `tag` whose slot is `tag`'s (found by search: about
    /// one name in 16,384 matches).
    fn slot_mate(tag: &str) -> String {
        let slot = slot_of_key(tag);
        (0u32..)
            .map(|i| format!("m{i}"))
            .find(|other| slot_of_key(other) == slot && other != tag)
            .expect("CRC16 reaches every slot")
    }

    #[test]
    fn two_tags_of_one_slot_share_a_pack() {
        let mate = slot_mate("a");
        assert_eq!(slot_of_key(&mate), slot_of_key("a"));
        let mut g = Gatherer::new(LIMITS);
        g.submit(0, vec![call("a", 0), call(&mate, 1)], 0, 10_000)
            .unwrap();
        // A call whose two keys are of two tags of the slot packs too.
        let two_tags = call("a", 2).key(format!("lh:v1:{{{mate}}}:r:p"));
        g.submit(1, vec![two_tags.clone()], 0, 10_000).unwrap();
        let flush = g.step(0, Grouping::BySlot).flush.unwrap();
        assert_eq!(
            flush.packs,
            vec![vec![call("a", 0), call(&mate, 1), two_tags]]
        );
        assert_eq!(
            flush.routes,
            vec![(0, vec![(0, 0), (0, 1)]), (1, vec![(0, 2)])]
        );
    }

    #[test]
    fn by_slot_never_packs_calls_of_two_slots() {
        assert_ne!(slot_of_key("a"), slot_of_key("b"));
        let mut g = Gatherer::new(LIMITS);
        // Keys of slots a and b in one call: alone, even beside calls of a.
        let split = call("a", 1).key("lh:v1:{b}:r:p");
        let calls = vec![call("a", 0), call("b", 0), split.clone(), call("a", 2)];
        g.submit(0, calls, 0, 10_000).unwrap();
        let flush = g.step(0, Grouping::BySlot).flush.unwrap();
        assert_eq!(
            flush.packs,
            vec![
                vec![call("a", 0), call("a", 2)],
                vec![call("b", 0)],
                vec![split],
            ]
        );
        assert_eq!(
            flush.routes,
            vec![(0, vec![(0, 0), (1, 0), (2, 0), (0, 1)])]
        );
    }

    #[test]
    fn on_a_standalone_store_tags_share_packs() {
        let mut g = Gatherer::new(LIMITS);
        g.submit(0, vec![call("a", 0), call("b", 1)], 0, 10_000)
            .unwrap();
        let flush = g.step(0, Grouping::Standalone).flush.unwrap();
        assert_eq!(flush.packs, vec![vec![call("a", 0), call("b", 1)]]);
        assert_eq!(flush.routes, vec![(0, vec![(0, 0), (0, 1)])]);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Submit { tags: Vec<u8>, ttl_us: u64 },
        Advance { us: u64 },
        Complete,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (prop::collection::vec(0u8..5, 0..5), 1u64..2_000)
                .prop_map(|(tags, ttl_us)| Op::Submit { tags, ttl_us }),
            2 => (0u64..300).prop_map(|us| Op::Advance { us }),
            2 => Just(Op::Complete),
        ]
    }

    /// Tag 3 is a call whose two keys are in different slots; tag 4 is
    /// another tag of tag 0's slot.
    fn tagged(tag: u8, id: usize) -> ScriptCall {
        match tag {
            3 => call("x", id).key("lh:v1:{y}:r:p"),
            4 => call(&slot_mate("t0"), id),
            t => call(&format!("t{t}"), id),
        }
    }

    /// Tags of a few slots, two of them shared by two tags each.
    fn slot_pool() -> Vec<String> {
        let mut pool: Vec<String> = (0..4).map(|i| format!("p{i}")).collect();
        pool.push(slot_mate("p0"));
        pool.push(slot_mate("p1"));
        pool
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Under BySlot every pack's calls hash to one slot, a call whose
        /// keys span slots is alone, and the calls of one slot share packs:
        /// no more packs per slot than `max_batch` forces.
        #[test]
        fn by_slot_packs_hold_one_slot_each_and_as_few_as_the_batch_allows(
            requests in prop::collection::vec(
                prop::collection::vec(prop::collection::vec(0usize..6, 1..3), 1..4),
                1..12,
            ),
            max_batch in 1usize..6,
        ) {
            let pool = slot_pool();
            let mut g = Gatherer::new(GatherLimits { max_batch, max_queue: 1_000, ..LIMITS });
            let mut all = Vec::new();
            for (id, request) in requests.iter().enumerate() {
                let calls: Vec<ScriptCall> = request
                    .iter()
                    .map(|tags| {
                        tags.iter().fold(ScriptCall::new(ScriptKind::TokenBucket).arg(id), |c, &t| {
                            c.key(format!("lh:v1:{{{}}}:r:p", pool[t]))
                        })
                    })
                    .collect();
                all.extend(calls.iter().cloned());
                g.submit(id, calls, 0, 10_000).unwrap();
            }
            let flush = g.step(0, Grouping::BySlot).flush.expect("idle: flush at once");
            let mut packs_per_slot: HashMap<u16, usize> = HashMap::new();
            for pack in &flush.packs {
                prop_assert!(!pack.is_empty() && pack.len() <= max_batch);
                match call_slot(&pack[0]) {
                    Some(slot) => {
                        prop_assert!(pack.iter().all(|c| call_slot(c) == Some(slot)));
                        *packs_per_slot.entry(slot).or_default() += 1;
                    }
                    None => prop_assert_eq!(pack.len(), 1, "a split call shares no pack"),
                }
            }
            let mut calls_per_slot: HashMap<u16, usize> = HashMap::new();
            for slot in all.iter().filter_map(call_slot) {
                *calls_per_slot.entry(slot).or_default() += 1;
            }
            for (slot, calls) in &calls_per_slot {
                prop_assert_eq!(packs_per_slot.get(slot).copied(), Some(calls.div_ceil(max_batch)));
            }
            let total: usize = flush.packs.iter().map(Vec::len).sum();
            prop_assert_eq!(total, all.len());
        }

        /// Every request is answered exactly once (refused, expired or
        /// routed), each routed call finds exactly its own call in its
        /// order, no pack passes max_batch, packs never mix tags on a
        /// cluster, and the queue and in-flight bounds hold.
        #[test]
        fn every_call_is_answered_once_in_its_callers_order(
            ops in prop::collection::vec(op(), 1..60),
            standalone in any::<bool>(),
            max_batch in 1usize..6,
        ) {
            let limits = GatherLimits { max_batch, ..LIMITS };
            let grouping = if standalone { Grouping::Standalone } else { Grouping::BySlot };
            let mut g = Gatherer::new(limits);
            let mut now = 0u64;
            let mut next_id = 0usize;
            // id → (deadline, calls)
            let mut submitted: HashMap<usize, (u64, Vec<ScriptCall>)> = HashMap::new();
            let mut answered: HashMap<usize, &'static str> = HashMap::new();
            let mut in_flight = 0usize;
            let check = |g: &mut Gatherer<usize>, now: u64, in_flight: &mut usize,
                             answered: &mut HashMap<usize, &'static str>,
                             submitted: &HashMap<usize, (u64, Vec<ScriptCall>)>| -> Result<(), TestCaseError> {
                let step = g.step(now, grouping);
                for t in step.expired {
                    prop_assert!(answered.insert(t, "expired").is_none());
                }
                if let Some(flush) = step.flush {
                    *in_flight += 1;
                    prop_assert!(*in_flight <= limits.max_in_flight);
                    for pack in &flush.packs {
                        prop_assert!(!pack.is_empty() && pack.len() <= max_batch);
                        if !standalone && pack.len() > 1 {
                            let slot = call_slot(&pack[0]);
                            prop_assert!(slot.is_some());
                            prop_assert!(pack.iter().all(|c| call_slot(c) == slot));
                        }
                    }
                    let mut used = std::collections::HashSet::new();
                    for (t, route) in &flush.routes {
                        prop_assert!(answered.insert(*t, "sent").is_none());
                        let (deadline, calls) = &submitted[t];
                        prop_assert!(*deadline > now, "an overdue request was sent");
                        prop_assert_eq!(route.len(), calls.len());
                        for (&(p, i), c) in route.iter().zip(calls) {
                            prop_assert_eq!(&flush.packs[p][i], c);
                            prop_assert!(used.insert((p, i)), "a reply slot routed twice");
                        }
                    }
                    let total: usize = flush.packs.iter().map(Vec::len).sum();
                    prop_assert_eq!(used.len(), total, "every packed call belongs to a request");
                }
                prop_assert!(g.queued_calls() <= limits.max_queue);
                Ok(())
            };
            for op in ops {
                match op {
                    Op::Submit { tags, ttl_us } => {
                        let id = next_id;
                        next_id += 1;
                        let calls: Vec<ScriptCall> = tags.iter().map(|&t| tagged(t, id)).collect();
                        submitted.insert(id, (now + ttl_us, calls.clone()));
                        let was_idle = g.in_flight() == 0;
                        match g.submit(id, calls, now, now + ttl_us) {
                            Err((t, _)) => { answered.insert(t, "refused"); }
                            Ok(()) if was_idle => {
                                // Idle: the request goes out at once.
                                check(&mut g, now, &mut in_flight, &mut answered, &submitted)?;
                                prop_assert_eq!(answered.get(&id), Some(&"sent"));
                                continue;
                            }
                            Ok(()) => {}
                        }
                    }
                    Op::Advance { us } => now += us,
                    Op::Complete => {
                        if in_flight > 0 {
                            in_flight -= 1;
                            g.batch_done();
                        }
                    }
                }
                check(&mut g, now, &mut in_flight, &mut answered, &submitted)?;
            }
            // Drain: complete everything; every request ends answered.
            for _ in 0..100 {
                while in_flight > 0 {
                    in_flight -= 1;
                    g.batch_done();
                }
                now += 1_000;
                check(&mut g, now, &mut in_flight, &mut answered, &submitted)?;
            }
            prop_assert_eq!(g.queued_calls(), 0);
            prop_assert_eq!(answered.len(), next_id);
        }
    }
}
