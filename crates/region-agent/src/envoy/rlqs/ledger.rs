//! The RLQS subscriptions of one agent and the assignments they hold
//! (sans-I/O: every call takes the time; the service does the sending).
//!
//! A subscription is one (stream, bucket id) under a limit (a rule, and
//! for a per-bucket rule the bucket id). Each keeps the demand its Envoy
//! last reported and the assignment it was last sent, **reserved** until
//! that assignment's TTL lapses — whether the stream is still open or not,
//! since Envoy keeps enforcing an assignment until its TTL. The invariant
//! the bound rests on, asserted wherever an assignment is made: for every
//! limit, Σ of the live reserved rates ≤ the room the Region enforces now
//! (after a room that shrank, once the lowered assignments are sent).
//!
//! - A report updates demand, re-divides the limit ([`super::divide`]) and
//!   answers the reporting bucket. A raise only takes room no live
//!   reservation holds — so Σ never passes the room; when the reporter is
//!   short of its share, the others held above theirs by more than
//!   [`HYSTERESIS_PERCENT`] are pushed their lowered assignment at once.
//! - An assignment within [`HYSTERESIS_PERCENT`] of the new share (either
//!   way, if it fits) is re-sent unchanged (Envoy keeps its tokens and
//!   restarts the TTL); a changed one starts Envoy's bucket full, which
//!   the bound counts, so changes are kept few.
//! - [`Ledger::tick`] lapses expired reservations, abandons buckets that
//!   stopped reporting, and lowers assignments when the room shrank.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::assignment::{token_bucket, Assignment};
use super::divide::divide;
use crate::policy::rlqs::{Limit, RlqsDomain, RoomSource, RuleAction, Sharing};

pub type StreamId = u64;
pub type BucketId = BTreeMap<String, String>;

/// A changed share within this percentage of the live assignment keeps it.
pub const HYSTERESIS_PERCENT: u64 = 10;

/// One bucket's usage in one report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BucketUsage {
    pub bucket: BucketId,
    pub allowed: u64,
    pub denied: u64,
    /// Whole seconds, as Envoy truncates it (0 in a new bucket's first
    /// report).
    pub elapsed_s: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActionKind {
    Assign { assignment: Assignment, ttl_s: u64 },
    Abandon,
}

/// Something to send on a stream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    pub stream: StreamId,
    pub bucket: BucketId,
    pub kind: ActionKind,
}

/// What a report counted, per rule (for metrics, pool demand, metering).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counted {
    /// None: no rule matched.
    pub rule: Option<String>,
    pub pool: Option<String>,
    pub bucket: BucketId,
    pub allowed: u64,
    pub denied: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedgerConfig {
    /// A bucket unreported this long is abandoned.
    pub quiet_after_ms: u64,
    /// Most limit subscriptions one stream holds.
    pub max_buckets_per_stream: usize,
    /// Most limit subscriptions the agent holds.
    pub max_subscriptions: usize,
}

impl Default for LedgerConfig {
    fn default() -> Self {
        Self {
            // Three of Envoy's 5 s reports missed.
            quiet_after_ms: 15_000,
            max_buckets_per_stream: 1_000,
            max_subscriptions: 100_000,
        }
    }
}

#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum LedgerError {
    #[error("the stream reports {count} limited buckets, the cap is {max}")]
    TooManyBuckets { count: usize, max: usize },
    #[error("the agent holds {max} RLQS subscriptions, its cap")]
    AgentFull { max: usize },
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct LimitKey {
    domain: String,
    rule: String,
    /// The bucket id for a per-bucket rule, None across buckets.
    bucket: Option<BucketId>,
}

#[derive(Clone, Debug)]
struct Sub {
    demand_mtps: u64,
    last_report_ms: u64,
    /// Reporting on an open stream, not abandoned.
    active: bool,
    /// The live assignment and when it lapses.
    current: Option<(Assignment, u64)>,
}

impl Sub {
    fn reserved_mtps(&self, now_ms: u64) -> u64 {
        match self.current {
            Some((a, expires_ms)) if expires_ms > now_ms => a.rate_mtps(),
            _ => 0,
        }
    }
}

#[derive(Clone, Debug)]
struct Book {
    limit: Limit,
    ttl_s: u64,
    subs: BTreeMap<(StreamId, BucketId), Sub>,
}

impl Book {
    fn reserved_mtps(&self, now_ms: u64) -> u64 {
        self.subs
            .values()
            .map(|s| s.reserved_mtps(now_ms))
            .fold(0, u64::saturating_add)
    }

    /// Each active subscription's share of `room_mtps`, in key order.
    fn shares(&self, room_mtps: u64) -> Vec<((StreamId, BucketId), u64)> {
        let active: Vec<(&(StreamId, BucketId), &Sub)> =
            self.subs.iter().filter(|(_, s)| s.active).collect();
        let demands: Vec<u64> = active.iter().map(|(_, s)| s.demand_mtps).collect();
        let floor = self.limit.floor_tokens_per_s.saturating_mul(1_000);
        let shares = divide(room_mtps, &demands, floor);
        active
            .into_iter()
            .map(|(k, _)| k.clone())
            .zip(shares)
            .collect()
    }
}

/// The agent's subscriptions, by limit.
#[derive(Debug, Default)]
pub struct Ledger {
    config: LedgerConfig,
    books: BTreeMap<LimitKey, Book>,
    by_stream: HashMap<StreamId, BTreeSet<(LimitKey, BucketId)>>,
    subscriptions: usize,
}

/// The live rate of a room source, millitokens per second.
pub trait RoomRate {
    fn room_mtps(&self, source: &RoomSource) -> u64;

    /// The longest an assignment on `source` may live, whole seconds: a
    /// global pool's room may be reclaimed after the Region falls silent
    /// for its policy's wait, and no assignment outlives that.
    fn ttl_cap_s(&self, _source: &RoomSource) -> Option<u64> {
        None
    }
}

impl<F: Fn(&RoomSource) -> u64> RoomRate for F {
    fn room_mtps(&self, source: &RoomSource) -> u64 {
        self(source)
    }
}

impl Ledger {
    pub fn new(config: LedgerConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    pub fn subscriptions(&self) -> usize {
        self.subscriptions
    }

    /// Σ of the live reserved rates of a rule's limits in `domain` (for
    /// tests and status).
    pub fn reserved_mtps(&self, domain: &str, rule: &str, now_ms: u64) -> u64 {
        self.books
            .iter()
            .filter(|(k, _)| k.domain == domain && k.rule == rule)
            .map(|(_, b)| b.reserved_mtps(now_ms))
            .fold(0, u64::saturating_add)
    }

    /// One report of `stream` for `domain`: each action (on this stream
    /// and, for lowered shares, on others) goes through `deliver`, and an
    /// assignment takes effect only when it was delivered (an undelivered
    /// one leaves the old one reserved). Returns what it counted. A cap
    /// reached refuses the whole report and changes nothing.
    #[allow(clippy::too_many_arguments)]
    pub fn on_report(
        &mut self,
        stream: StreamId,
        domain_name: &str,
        domain: &RlqsDomain,
        usages: &[BucketUsage],
        now_ms: u64,
        rate: &dyn RoomRate,
        deliver: &mut dyn FnMut(&Action) -> bool,
    ) -> Result<Vec<Counted>, LedgerError> {
        // Which limit each usage falls under, and whether caps allow it.
        let mut planned = Vec::with_capacity(usages.len());
        let mut new_subs = 0usize;
        let held = self.by_stream.get(&stream);
        let mut seen = BTreeSet::new();
        for usage in usages {
            let rule = domain.rule_for(&usage.bucket);
            let key = rule.and_then(|rule| match &rule.action {
                RuleAction::Limit(limit) => Some((
                    LimitKey {
                        domain: domain_name.to_string(),
                        rule: rule.id.clone(),
                        bucket: (limit.sharing == Sharing::PerBucket).then(|| usage.bucket.clone()),
                    },
                    limit.clone(),
                )),
                _ => None,
            });
            if let Some((key, _)) = &key {
                let sub = (key.clone(), usage.bucket.clone());
                if !held.is_some_and(|h| h.contains(&sub)) && seen.insert(sub) {
                    new_subs += 1;
                }
            }
            planned.push((usage, rule, key));
        }
        let stream_buckets = held.map_or(0, BTreeSet::len) + new_subs;
        if stream_buckets > self.config.max_buckets_per_stream {
            return Err(LedgerError::TooManyBuckets {
                count: stream_buckets,
                max: self.config.max_buckets_per_stream,
            });
        }
        if new_subs > 0 && self.subscriptions + new_subs > self.config.max_subscriptions {
            return Err(LedgerError::AgentFull {
                max: self.config.max_subscriptions,
            });
        }

        let mut counted = Vec::new();
        let ttl_s = domain.ttl_seconds;
        for (usage, rule, key) in planned {
            counted.push(Counted {
                rule: rule.map(|r| r.id.clone()),
                pool: match rule.map(|r| &r.action) {
                    Some(RuleAction::Limit(Limit {
                        room: RoomSource::Pool(pool),
                        ..
                    })) => Some(pool.clone()),
                    _ => None,
                },
                bucket: usage.bucket.clone(),
                allowed: usage.allowed,
                denied: usage.denied,
            });
            let blanket = match rule.map(|r| &r.action) {
                None | Some(RuleAction::AllowAll) => Some(Assignment::AllowAll),
                Some(RuleAction::DenyAll) => Some(Assignment::DenyAll),
                Some(RuleAction::Limit(_)) => None,
            };
            if let Some(assignment) = blanket {
                deliver(&Action {
                    stream,
                    bucket: usage.bucket.clone(),
                    kind: ActionKind::Assign { assignment, ttl_s },
                });
                continue;
            }
            let Some((key, limit)) = key else { continue };
            let requests = usage.allowed.saturating_add(usage.denied);
            let demand_mtps = requests.saturating_mul(1_000) / usage.elapsed_s.max(1);
            let book = self.books.entry(key.clone()).or_insert_with(|| Book {
                limit: limit.clone(),
                ttl_s,
                subs: BTreeMap::new(),
            });
            debug_assert!(ttl_s >= 1, "a TTL under 1 s expires at once in Envoy");
            // The policy in force decides (a reload may have changed it).
            book.ttl_s = rate
                .ttl_cap_s(&limit.room)
                .map_or(ttl_s, |cap| ttl_s.min(cap.max(1)));
            book.limit = limit;
            let sub_key = (stream, usage.bucket.clone());
            let fresh = !book.subs.contains_key(&sub_key);
            let sub = book.subs.entry(sub_key).or_insert(Sub {
                demand_mtps: 0,
                last_report_ms: now_ms,
                active: true,
                current: None,
            });
            sub.demand_mtps = demand_mtps;
            sub.last_report_ms = now_ms;
            sub.active = true;
            if fresh {
                self.subscriptions += 1;
                self.by_stream
                    .entry(stream)
                    .or_default()
                    .insert((key.clone(), usage.bucket.clone()));
            }
            self.answer(&key, stream, &usage.bucket, now_ms, rate, deliver);
        }
        Ok(counted)
    }

    /// Re-divides `key`'s room: lowers every other active subscription held
    /// above its share (pushed at once), then answers `(stream, bucket)`.
    fn answer(
        &mut self,
        key: &LimitKey,
        stream: StreamId,
        bucket: &BucketId,
        now_ms: u64,
        rate: &dyn RoomRate,
        deliver: &mut dyn FnMut(&Action) -> bool,
    ) {
        let Some(book) = self.books.get_mut(key) else {
            return;
        };
        let room = rate.room_mtps(&book.limit.room);
        let shares = book.shares(room);
        let own = shares
            .iter()
            .find(|(k, _)| k.0 == stream && &k.1 == bucket)
            .map_or(0, |(_, s)| *s);
        let others_reserved = |book: &Book| {
            book.subs
                .iter()
                .filter(|(k, _)| !(k.0 == stream && &k.1 == bucket))
                .map(|(_, s)| s.reserved_mtps(now_ms))
                .fold(0, u64::saturating_add)
        };
        let mut others = others_reserved(book);
        // Short of its share: the others held clearly above theirs are
        // lowered now (each a changed assignment, so only past the
        // hysteresis: churn would refill Envoys' buckets for nothing).
        if own > room.saturating_sub(others) {
            let skip = Some((stream, bucket));
            lower_above_share(book, &shares, now_ms, skip, HYSTERESIS_PERCENT, deliver);
            others = others_reserved(book);
        }
        let available = room.saturating_sub(others);
        let want = own.min(available);
        let (burst, ttl_s) = (book.limit.burst_seconds, book.ttl_s);
        let Some(sub) = book.subs.get_mut(&(stream, bucket.clone())) else {
            return;
        };
        let live = sub.current.filter(|(_, e)| *e > now_ms).map(|(a, _)| a);
        let assignment = match live {
            Some(a) if a.rate_mtps() <= available && within_hysteresis(a.rate_mtps(), want) => a,
            _ => token_bucket(want, burst),
        };
        let action = Action {
            stream,
            bucket: bucket.clone(),
            kind: ActionKind::Assign { assignment, ttl_s },
        };
        if deliver(&action) {
            sub.current = Some((assignment, now_ms + ttl_s * 1_000));
        }
        debug_assert!(
            book.reserved_mtps(now_ms) <= room.max(others),
            "a raise took room another reservation holds"
        );
    }

    /// Lapses expired reservations, abandons quiet buckets, and lowers
    /// assignments where the room shrank below what is reserved.
    pub fn tick(
        &mut self,
        now_ms: u64,
        rate: &dyn RoomRate,
        deliver: &mut dyn FnMut(&Action) -> bool,
    ) {
        let quiet = self.config.quiet_after_ms;
        let mut removed = Vec::new();
        for (key, book) in self.books.iter_mut() {
            for ((stream, bucket), sub) in book.subs.iter_mut() {
                if sub.current.is_some_and(|(_, e)| e <= now_ms) {
                    sub.current = None;
                }
                if sub.active && now_ms.saturating_sub(sub.last_report_ms) >= quiet {
                    // Abandoned whether or not it arrives: its reservation
                    // stays until its TTL either way.
                    sub.active = false;
                    deliver(&Action {
                        stream: *stream,
                        bucket: bucket.clone(),
                        kind: ActionKind::Abandon,
                    });
                }
                if !sub.active && sub.current.is_none() {
                    removed.push((key.clone(), *stream, bucket.clone()));
                }
            }
            let room = rate.room_mtps(&book.limit.room);
            if book.reserved_mtps(now_ms) > room {
                let shares = book.shares(room);
                // The room shrank below what is held: every share counts.
                lower_above_share(book, &shares, now_ms, None, 0, deliver);
            }
        }
        for (key, stream, bucket) in removed {
            self.forget(&key, stream, &bucket);
        }
    }

    /// The stream ended: its subscriptions stop counting demand; their
    /// reservations stay until their TTL lapses (Envoy keeps enforcing).
    pub fn stream_closed(&mut self, stream: StreamId) {
        let Some(held) = self.by_stream.get(&stream) else {
            return;
        };
        for (key, bucket) in held.clone() {
            if let Some(sub) = self
                .books
                .get_mut(&key)
                .and_then(|b| b.subs.get_mut(&(stream, bucket)))
            {
                sub.active = false;
            }
        }
    }

    /// Abandons every open subscription (shutdown).
    pub fn abandon_all(&mut self, deliver: &mut dyn FnMut(&Action) -> bool) {
        for book in self.books.values_mut() {
            for ((stream, bucket), sub) in book.subs.iter_mut() {
                if sub.active {
                    sub.active = false;
                    deliver(&Action {
                        stream: *stream,
                        bucket: bucket.clone(),
                        kind: ActionKind::Abandon,
                    });
                }
            }
        }
    }

    fn forget(&mut self, key: &LimitKey, stream: StreamId, bucket: &BucketId) {
        if let Some(book) = self.books.get_mut(key) {
            if book.subs.remove(&(stream, bucket.clone())).is_some() {
                self.subscriptions -= 1;
            }
            if book.subs.is_empty() {
                self.books.remove(key);
            }
        }
        if let Some(held) = self.by_stream.get_mut(&stream) {
            held.remove(&(key.clone(), bucket.clone()));
            if held.is_empty() {
                self.by_stream.remove(&stream);
            }
        }
    }
}

/// Whether a live rate may stay for a new share: within the hysteresis
/// either way (the caller checks it fits the room).
fn within_hysteresis(live_mtps: u64, share_mtps: u64) -> bool {
    live_mtps.abs_diff(share_mtps) <= band(share_mtps, HYSTERESIS_PERCENT)
}

fn band(share_mtps: u64, percent: u64) -> u64 {
    (share_mtps as u128 * percent as u128 / 100) as u64
}

/// Lowers each active subscription (but `skip`) whose live assignment is
/// above its share by more than `slack_percent`, renewing its TTL, when
/// the push was delivered.
fn lower_above_share(
    book: &mut Book,
    shares: &[((StreamId, BucketId), u64)],
    now_ms: u64,
    skip: Option<(StreamId, &BucketId)>,
    slack_percent: u64,
    deliver: &mut dyn FnMut(&Action) -> bool,
) {
    let (burst, ttl_s) = (book.limit.burst_seconds, book.ttl_s);
    for ((stream, bucket), share) in shares {
        if skip.is_some_and(|(s, b)| s == *stream && b == bucket) {
            continue;
        }
        let Some(sub) = book.subs.get_mut(&(*stream, bucket.clone())) else {
            continue;
        };
        let Some((live, expires_ms)) = sub.current.filter(|(_, e)| *e > now_ms) else {
            continue;
        };
        if live.rate_mtps() <= share.saturating_add(band(*share, slack_percent)) {
            continue;
        }
        let lowered = token_bucket(*share, burst);
        let action = Action {
            stream: *stream,
            bucket: bucket.clone(),
            kind: ActionKind::Assign {
                assignment: lowered,
                ttl_s,
            },
        };
        if deliver(&action) {
            sub.current = Some((lowered, (now_ms + ttl_s * 1_000).max(expires_ms)));
        }
    }
}

#[cfg(test)]
#[path = "ledger_tests.rs"]
mod tests;
