//! `ClusterStore`: the scripts on a Redis Cluster (ARCHITECTURE §3.3, §10).
//!
//! Each primary is a [`RedisStore`] of its own — its own multiplexed
//! connection, scripts loaded on connect and reloaded on NOSCRIPT (a
//! promoted replica starts without them), deadline, in-flight cap and
//! circuit breaker — so a failing primary degrades only the calls whose keys
//! it owns: every other call of the same batch (other descriptors of the
//! same Check or RLS request included) is answered normally. A batch is
//! split by slot owner ([`crate::store::slots`]) and the per-primary groups
//! are sent **in parallel**, one pipeline each.
//!
//! Redirects: a cluster refusal means the script did not run
//! ([`Redirect`]), so sending it again is safe and never doubles a decision.
//! MOVED patches the slot map at once and resends to the new owner (and a
//! full `CLUSTER SLOTS` refresh follows in the background); ASK resends to
//! the importing node after `ASKING`; TRYAGAIN (a multi-key call split by a
//! migration) resends after a pause of 1 ms per round; CLUSTERDOWN,
//! READONLY and MASTERDOWN refresh the map first. A node that cannot be
//! reached (refused, timed out, breaker open) schedules a refresh too, so a
//! promoted replica is found without a restart. A call that only timed out
//! is never resent (it may have run: `Ambiguous`, §3.3).
//!
//! Limits and what happens at them:
//! - `max_redirect_rounds` (3) resends per call within its deadline; a call
//!   still redirected then is `NotSent::Cluster` and its rule's fail mode
//!   decides (never a policy error).
//! - refreshes: one at a time, at most one per `refresh_min_interval`
//!   (100 ms), each bounded by `refresh_deadline` over all the nodes it
//!   asks; callers that need the map while one runs wait for it within their
//!   own deadline.
//! - a map names at most [`slots::MAX_PRIMARIES`] primaries; node stores
//!   are kept for the map's primaries and the seeds only.
//! - per primary: the [`RedisStore`] limits (`max_in_flight`, breaker,
//!   deadline) of `[store]`.
//!
//! Listing records (`lease list`, [`crate::store::scan`]) asks every
//! primary of the map in parallel, one SCAN cursor each.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use futures_util::future::join_all;
use redis::IntoConnectionInfo;
use tokio::time::Instant;

use crate::store::redis::{RedisStore, RedisStoreConfig, RedisStoreError};
use crate::store::scan::{self, Keep, KeptBudget, ScanError, ScanOutcome, ScanRequest};
use crate::store::script::ScriptCall;
use crate::store::slots::{self, NodeAddress, Redirect, SlotMap};
use crate::store::{
    BoxFuture, BucketStore, CallResult, NotSent, PackStore, ShardBreaker, StoreError, Topology,
};

/// Failed refreshes repeat while the cluster is down: one line per cause
/// per interval.
static REFRESH_LOGS: std::sync::LazyLock<leasehold_logging::SharedLimiter> =
    std::sync::LazyLock::new(leasehold_logging::default_limiter);

/// Most seed URLs (`redis_cluster`).
pub const MAX_SEEDS: usize = 64;

/// ClusterStore tuning; every field bounds something.
#[derive(Debug, Clone)]
pub struct ClusterStoreConfig {
    /// `redis://` or `rediss://` URLs of some cluster nodes (one scheme).
    pub seeds: Vec<String>,
    /// Each primary's store: deadline, connect timeout, in-flight cap,
    /// breaker and credentials; its `url` is replaced per node.
    pub node: RedisStoreConfig,
    /// Least time between two `CLUSTER SLOTS` refreshes.
    pub refresh_min_interval: Duration,
    /// Longest one refresh takes over every node it asks.
    pub refresh_deadline: Duration,
    /// Most resends of one call after redirects.
    pub max_redirect_rounds: u32,
}

impl ClusterStoreConfig {
    pub fn new(seeds: Vec<String>) -> Self {
        ClusterStoreConfig {
            seeds,
            node: RedisStoreConfig::new(""),
            refresh_min_interval: Duration::from_millis(100),
            refresh_deadline: Duration::from_millis(1_000),
            max_redirect_rounds: 3,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClusterStoreError {
    #[error("redis_cluster needs 1 to {MAX_SEEDS} URLs, got {0}")]
    SeedCount(usize),
    #[error("redis_cluster: {0}")]
    Seed(String),
    #[error("redis_cluster mixes redis:// and rediss:// URLs")]
    MixedSchemes,
    #[error(transparent)]
    Store(#[from] RedisStoreError),
}

/// Counters the agent's registry attaches ([`BucketStore::attach_metrics`]).
#[derive(Clone)]
struct ClusterMetrics {
    redirects: prometheus::IntCounterVec,
    refreshes: prometheus::IntCounterVec,
}

/// The Redis Cluster [`BucketStore`].
pub struct ClusterStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: ClusterStoreConfig,
    /// `redis` or `rediss`, for the nodes' URLs.
    scheme: &'static str,
    seeds: Vec<NodeAddress>,
    map: RwLock<Arc<SlotMap>>,
    nodes: Mutex<BTreeMap<NodeAddress, Arc<RedisStore>>>,
    /// When the last refresh ended; held while one runs (single flight).
    last_refresh: tokio::sync::Mutex<Option<Instant>>,
    refresh_scheduled: AtomicBool,
    metrics: std::sync::OnceLock<ClusterMetrics>,
}

/// A pack on its way: where it goes next and why.
struct Pending {
    pack: usize,
    /// An ASK target: send there once, after ASKING.
    ask: Option<NodeAddress>,
}

impl ClusterStore {
    /// Validates the seeds and reads the credential and TLS files once;
    /// connects lazily, so an agent starts (and degrades) while the cluster
    /// is down.
    pub fn new(config: ClusterStoreConfig) -> Result<Self, ClusterStoreError> {
        if config.seeds.is_empty() || config.seeds.len() > MAX_SEEDS {
            return Err(ClusterStoreError::SeedCount(config.seeds.len()));
        }
        let mut scheme = None;
        let mut seeds = Vec::with_capacity(config.seeds.len());
        for url in &config.seeds {
            let (this_scheme, address) = seed_address(url)?;
            if scheme.is_some_and(|s| s != this_scheme) {
                return Err(ClusterStoreError::MixedSchemes);
            }
            scheme = Some(this_scheme);
            seeds.push(address);
        }
        let scheme = scheme.unwrap_or("redis");
        // The credentials and TLS files are read (and refused) here, once.
        RedisStore::new(RedisStoreConfig {
            url: config.seeds[0].clone(),
            ..config.node.clone()
        })?;
        Ok(ClusterStore {
            inner: Arc::new(Inner {
                config,
                scheme,
                seeds,
                map: RwLock::new(Arc::new(SlotMap::default())),
                nodes: Mutex::new(BTreeMap::new()),
                last_refresh: tokio::sync::Mutex::new(None),
                refresh_scheduled: AtomicBool::new(false),
                metrics: std::sync::OnceLock::new(),
            }),
        })
    }

    /// The slot map in force (after at least one refresh).
    pub fn slot_map(&self) -> Arc<SlotMap> {
        self.inner.map()
    }

    /// Reads `CLUSTER SLOTS` now (even within the minimum interval); true
    /// when the map covers at least one slot afterwards.
    pub async fn refresh(&self) -> bool {
        let deadline = Instant::now() + self.inner.config.refresh_deadline;
        self.inner.refresh(deadline, true).await;
        self.inner.map().uncovered_slots() < u32::from(slots::SLOT_COUNT)
    }

    /// The primary's store serving `slot`, if the map names one (tests and
    /// the bench read its breaker).
    pub fn store_for_slot(&self, slot: u16) -> Option<Arc<RedisStore>> {
        let owner = self.inner.map().owner(slot).cloned()?;
        self.inner.node(&owner).ok()
    }
}

impl Inner {
    fn map(&self) -> Arc<SlotMap> {
        // A poisoned lock still holds a whole map (it is replaced whole).
        self.map
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    fn count_redirect(&self, redirect: &Redirect) {
        if let Some(m) = self.metrics.get() {
            m.redirects.with_label_values(&[redirect.kind()]).inc();
        }
    }

    fn count_refresh(&self, outcome: &str) {
        if let Some(m) = self.metrics.get() {
            m.refreshes.with_label_values(&[outcome]).inc();
        }
    }

    /// The map's primaries, each with its shard name `slots-<first>` (the
    /// first slot it serves: never an address in a metric label), in slot
    /// order.
    fn shards(&self) -> Vec<(NodeAddress, String)> {
        let map = self.map();
        let mut firsts: BTreeMap<NodeAddress, u16> = BTreeMap::new();
        for slot_start in map.range_starts() {
            if let Some(owner) = map.owner(slot_start) {
                firsts.entry(owner.clone()).or_insert(slot_start);
            }
        }
        let mut shards: Vec<(u16, NodeAddress)> = firsts
            .into_iter()
            .map(|(node, first)| (first, node))
            .collect();
        shards.sort();
        shards
            .into_iter()
            .map(|(first, node)| (node, format!("slots-{first}")))
            .collect()
    }

    /// The store of one node, created on first use.
    fn node(&self, address: &NodeAddress) -> Result<Arc<RedisStore>, StoreError> {
        let mut nodes = self
            .nodes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(store) = nodes.get(address) {
            return Ok(store.clone());
        }
        let url = format!("{}://{}/", self.scheme, address.host_port());
        let store = RedisStore::new(RedisStoreConfig {
            url,
            ..self.config.node.clone()
        })
        .map_err(|e| NotSent::Unreachable(e.to_string()))?;
        let store = Arc::new(store);
        nodes.insert(address.clone(), store.clone());
        Ok(store)
    }

    /// Asks the map's primaries, then the seeds, for `CLUSTER SLOTS`; the
    /// first usable answer replaces the map. `force`: even within the
    /// minimum interval (an explicit refresh).
    async fn refresh(&self, deadline: Instant, force: bool) {
        let Ok(mut last) = tokio::time::timeout_at(deadline, self.last_refresh.lock()).await else {
            return;
        };
        if let Some(at) = *last {
            if !force && at.elapsed() < self.config.refresh_min_interval {
                return;
            }
        }
        let mut candidates = self.map().primaries();
        for seed in &self.seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        let mut outcome = "failed";
        let mut last_error = String::from("no node answered");
        for candidate in candidates {
            if Instant::now() >= deadline {
                break;
            }
            let store = match self.node(&candidate) {
                Ok(store) => store,
                Err(e) => {
                    last_error = e.to_string();
                    continue;
                }
            };
            let per_node =
                (Instant::now() + store.call_deadline() + self.config.node.connect_timeout)
                    .min(deadline);
            let reply = store
                .query(&redis::cmd("CLUSTER").arg("SLOTS").clone(), per_node)
                .await;
            let parsed = reply.map_err(|e| e.to_string()).and_then(|value| {
                SlotMap::from_cluster_slots(&value, &candidate).map_err(|e| e.to_string())
            });
            match parsed {
                Ok(map) if map.uncovered_slots() < u32::from(slots::SLOT_COUNT) => {
                    self.install(map);
                    outcome = "ok";
                    break;
                }
                Ok(_) => last_error = "CLUSTER SLOTS names no slot".into(),
                Err(e) => last_error = e,
            }
        }
        if outcome != "ok" {
            leasehold_logging::warn_limited!(
                &*REFRESH_LOGS,
                "cluster_refresh",
                error = %leasehold_logging::quote_with(&last_error, 200),
                "cannot read the Redis Cluster's slot map; the map in force stays"
            );
        }
        self.count_refresh(outcome);
        *last = Some(Instant::now());
    }

    /// Replaces the map and drops node stores no longer named by it or the
    /// seeds (bounded by the map's primaries).
    fn install(&self, map: SlotMap) {
        let keep = map.primaries();
        *self
            .map
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(map);
        self.nodes
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .retain(|address, _| keep.contains(address) || self.seeds.contains(address));
    }

    /// A MOVED reply's news, in force for the next call at once.
    fn moved(&self, slot: u16, to: NodeAddress) {
        let mut guard = self
            .map
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut map = SlotMap::clone(&guard);
        map.moved(slot, to);
        *guard = Arc::new(map);
    }

    /// A refresh in the background, at most one scheduled at a time.
    fn refresh_soon(self: &Arc<Self>) {
        if self.refresh_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        let inner = self.clone();
        tokio::spawn(async move {
            let deadline = Instant::now() + inner.config.refresh_deadline;
            inner.refresh(deadline, false).await;
            inner.refresh_scheduled.store(false, Ordering::Release);
        });
    }

    /// Sends every pending pack to its node, the nodes in parallel.
    async fn send_round(
        &self,
        packs: &[&[ScriptCall]],
        pending: &[Pending],
        deadline: Instant,
    ) -> Vec<(usize, Vec<CallResult>)> {
        let map = self.map();
        let mut groups: BTreeMap<(NodeAddress, bool), Vec<usize>> = BTreeMap::new();
        let mut answered = Vec::new();
        for p in pending {
            let calls = packs[p.pack];
            let target = match &p.ask {
                Some(to) => Some(to.clone()),
                None => match slots::slot_of_call(&calls[0]) {
                    Some(slot) => map.owner(slot).cloned(),
                    // A call without keys: any primary.
                    None => map.primaries().into_iter().next(),
                },
            };
            match target {
                Some(node) => groups
                    .entry((node, p.ask.is_some()))
                    .or_default()
                    .push(p.pack),
                None => {
                    let slot = slots::slot_of_call(&calls[0]).unwrap_or(0);
                    let error = StoreError::from(NotSent::Unreachable(format!(
                        "slot {slot} has no primary in the cluster map"
                    )));
                    answered.push((p.pack, calls.iter().map(|_| Err(error.clone())).collect()));
                }
            }
        }
        let sends = groups
            .into_iter()
            .map(|((node, asking), indices)| async move {
                let group: Vec<&[ScriptCall]> = indices.iter().map(|&i| packs[i]).collect();
                let results = match self.node(&node) {
                    Ok(store) => store.run_packs_asking(&group, deadline, asking).await,
                    Err(e) => group
                        .iter()
                        .map(|pack| pack.iter().map(|_| Err(e.clone())).collect())
                        .collect(),
                };
                indices.into_iter().zip(results).collect::<Vec<_>>()
            });
        for group in join_all(sends).await {
            answered.extend(group);
        }
        answered
    }

    async fn run_packs(
        self: &Arc<Self>,
        packs: &[&[ScriptCall]],
        deadline: Instant,
    ) -> Vec<Vec<CallResult>> {
        let mut answers: Vec<Option<Vec<CallResult>>> = packs
            .iter()
            .map(|pack| pack.is_empty().then(Vec::new))
            .collect();
        if self.map().is_empty() {
            self.refresh(deadline, false).await;
        }
        let mut pending: Vec<Pending> = (0..packs.len())
            .filter(|&i| !packs[i].is_empty())
            .map(|pack| Pending { pack, ask: None })
            .collect();
        let mut round = 0;
        while !pending.is_empty() {
            let results = self.send_round(packs, &pending, deadline).await;
            pending.clear();
            let mut refresh_first = false;
            let mut pause = false;
            for (pack, results) in results {
                let redirect = match results.first() {
                    Some(Err(StoreError::NotSent(NotSent::Cluster(r)))) => Some(r.clone()),
                    Some(Err(StoreError::NotSent(_) | StoreError::Ambiguous(_))) => {
                        // The node may be gone: look for its replacement.
                        self.refresh_soon();
                        None
                    }
                    _ => None,
                };
                let retry = redirect.filter(|_| round < self.config.max_redirect_rounds);
                let Some(redirect) = retry else {
                    answers[pack] = Some(results);
                    continue;
                };
                if redirect != Redirect::CrossSlot {
                    self.count_redirect(&redirect);
                }
                // Not run: the call may go again. Its answer stands only if
                // no resend happens (deadline) — kept until replaced.
                answers[pack] = Some(results);
                match redirect {
                    Redirect::Moved { slot, to } => {
                        self.moved(slot, to);
                        self.refresh_soon();
                        pending.push(Pending { pack, ask: None });
                    }
                    Redirect::Ask { to, .. } => pending.push(Pending {
                        pack,
                        ask: Some(to),
                    }),
                    Redirect::TryAgain => {
                        pause = true;
                        pending.push(Pending { pack, ask: None });
                    }
                    Redirect::ClusterDown | Redirect::ReadOnly | Redirect::MasterDown => {
                        refresh_first = true;
                        pending.push(Pending { pack, ask: None });
                    }
                    // The keys themselves are wrong: another try cannot help.
                    Redirect::CrossSlot => {}
                }
            }
            if pending.is_empty() || Instant::now() >= deadline {
                break;
            }
            round += 1;
            if refresh_first {
                self.refresh(deadline, false).await;
            }
            if pause {
                let at = (Instant::now() + Duration::from_millis(u64::from(round))).min(deadline);
                tokio::time::sleep_until(at).await;
            }
        }
        answers
            .into_iter()
            .zip(packs)
            .map(|(answer, pack)| {
                answer.unwrap_or_else(|| {
                    // Every pack was answered or sent at least once; a gap
                    // would be a bug, never an allow.
                    pack.iter()
                        .map(|_| Err(StoreError::Ambiguous("no reply for the call".into())))
                        .collect()
                })
            })
            .collect()
    }
}

/// A seed URL's scheme and address.
fn seed_address(url: &str) -> Result<(&'static str, NodeAddress), ClusterStoreError> {
    let info = url
        .into_connection_info()
        .map_err(|e| ClusterStoreError::Seed(format!("not a usable Redis URL ({:?})", e.kind())))?;
    match info.addr() {
        redis::ConnectionAddr::Tcp(host, port) => Ok((
            "redis",
            NodeAddress {
                host: host.clone(),
                port: *port,
            },
        )),
        redis::ConnectionAddr::TcpTls { host, port, .. } => Ok((
            "rediss",
            NodeAddress {
                host: host.clone(),
                port: *port,
            },
        )),
        _ => Err(ClusterStoreError::Seed(
            "a cluster node is a redis:// or rediss:// address".into(),
        )),
    }
}

impl PackStore for ClusterStore {
    fn run_packs<'a>(
        &'a self,
        packs: &'a [Vec<ScriptCall>],
        deadline: Instant,
    ) -> BoxFuture<'a, Vec<Vec<CallResult>>> {
        Box::pin(async move {
            let refs: Vec<&[ScriptCall]> = packs.iter().map(Vec::as_slice).collect();
            self.inner.run_packs(&refs, deadline).await
        })
    }

    fn call_deadline(&self) -> Duration {
        self.inner.config.node.call_deadline
    }

    fn topology(&self) -> Topology {
        Topology::Cluster
    }
}

impl BucketStore for ClusterStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    /// "open" only when every primary's breaker is open (the store is
    /// down); "half_open" when some are not closed; else "closed".
    fn breaker_state(&self) -> &'static str {
        let shards = self.shard_breakers();
        if shards.iter().all(|s| s.state == "closed") {
            "closed"
        } else if shards.iter().all(|s| s.state == "open") {
            "open"
        } else {
            "half_open"
        }
    }

    fn shard_breakers(&self) -> Vec<ShardBreaker> {
        self.inner
            .shards()
            .into_iter()
            .filter_map(|(node, shard)| {
                let store = self.inner.node(&node).ok()?;
                Some(ShardBreaker {
                    shard,
                    state: store.breaker_state(),
                })
            })
            .collect()
    }

    /// Every primary of the slot map at once ([`RedisStore::scan_node`]), under
    /// one shared budget of kept records and one deadline; a primary that
    /// fails is named by its shard (`slots-<first>`), the others answer.
    fn scan_strings<'a>(
        &'a self,
        request: &'a ScanRequest<'a>,
        keep: Keep<'a>,
    ) -> BoxFuture<'a, Result<ScanOutcome, ScanError>> {
        Box::pin(async move {
            scan::check_pattern(request.pattern)?;
            if self.inner.map().is_empty() {
                self.inner.refresh(request.deadline, false).await;
            }
            let shards = self.inner.shards();
            if shards.is_empty() {
                return Err(StoreError::from(NotSent::Unreachable(
                    "the cluster map names no primary".into(),
                ))
                .into());
            }
            let budget = KeptBudget::new(request.max_kept);
            let scans = shards.into_iter().map(|(node, shard)| {
                let budget = &budget;
                async move {
                    let scanned = match self.inner.node(&node) {
                        Ok(store) => store.scan_node(request, keep, budget).await,
                        Err(e) => Err(e),
                    };
                    (shard, scanned)
                }
            });
            scan::merge(join_all(scans).await, request.max_kept)
        })
    }

    fn attach_metrics(&self, metrics: &crate::metrics::AgentMetrics) {
        let _ = self.inner.metrics.set(ClusterMetrics {
            redirects: metrics.store_cluster_redirects.clone(),
            refreshes: metrics.store_cluster_refreshes.clone(),
        });
    }

    fn run_batch<'a>(&'a self, calls: &'a [ScriptCall]) -> BoxFuture<'a, Vec<CallResult>> {
        Box::pin(async move {
            let deadline = Instant::now() + self.inner.config.node.call_deadline;
            let refs: Vec<&[ScriptCall]> = calls.iter().map(std::slice::from_ref).collect();
            self.inner
                .run_packs(&refs, deadline)
                .await
                .into_iter()
                .map(|mut replies| match replies.pop() {
                    Some(reply) if replies.is_empty() => reply,
                    _ => Err(StoreError::Ambiguous("reply count mismatch".into())),
                })
                .collect()
        })
    }
}
