//! `ClusterStore` on a real Redis Cluster (3 primaries + 3 replicas from
//! `testing::cluster`): every script decides there exactly as its twin, a
//! batch is split by slot and answered per primary, redirects are followed
//! without losing or doubling a decision, a killed primary degrades only
//! its own keys, and a node that was not asked to route answers a store
//! error, never a policy error.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::calls::{any_kind, to_call, token_bucket};
use leasehold_region_agent::metrics::AgentMetrics;
use leasehold_region_agent::store::cluster::{ClusterStore, ClusterStoreConfig};
use leasehold_region_agent::store::memory::MemoryStore;
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::script::{ScriptCall, ScriptKind};
use leasehold_region_agent::store::slots::{slot_of_key, Redirect};
use leasehold_region_agent::store::{BucketStore, NotSent, PackStore, StoreError};
use leasehold_region_agent::testing::cluster::RedisCluster;
use proptest::prelude::*;

/// Tags whose keys land on different primaries of a 3-primary cluster.
const TAGS: [&str; 6] = ["t0", "t1", "t2", "t3", "t4", "t5"];

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// A cluster store with deadlines long enough for a loaded 2-core machine:
/// these tests check outcomes, never speed.
fn store_for(cluster: &RedisCluster) -> ClusterStore {
    let mut config = ClusterStoreConfig::new(cluster.seeds());
    config.node = RedisStoreConfig {
        call_deadline: Duration::from_secs(2),
        connect_timeout: Duration::from_millis(500),
        ..RedisStoreConfig::new("")
    };
    ClusterStore::new(config).expect("cluster store")
}

fn values(
    result: &Result<leasehold_region_agent::store::script::ScriptReply, StoreError>,
) -> Result<Vec<i64>, String> {
    match result {
        Ok(reply) => Ok(reply.values.clone()),
        Err(StoreError::Script(e)) => Err(format!("script: {e}")),
        Err(other) => panic!("store error on a healthy cluster: {other}"),
    }
}

/// The twin's answer at Redis's `now_ms` (an error reply carries no time:
/// the last one stands in, as in `common::differential`).
fn twin_values(twin: &MemoryStore, call: &ScriptCall, now_ms: i64) -> Result<Vec<i64>, String> {
    twin.eval_at(call, now_ms)
        .map(|r| r.values)
        .map_err(|e| format!("script: {e}"))
}

struct Shared {
    cluster: RedisCluster,
    rt: tokio::runtime::Runtime,
    store: ClusterStore,
}

fn shared() -> &'static std::sync::Mutex<Shared> {
    static SHARED: std::sync::OnceLock<std::sync::Mutex<Shared>> = std::sync::OnceLock::new();
    SHARED.get_or_init(|| {
        let cluster = RedisCluster::start(3, 1).expect("start a Redis Cluster");
        let rt = runtime();
        let store = store_for(&cluster);
        assert!(rt.block_on(store.refresh()), "slot map read");
        std::sync::Mutex::new(Shared { cluster, rt, store })
    })
}

#[test]
fn keys_of_the_test_tags_spread_over_every_primary() {
    let shared = shared().lock().unwrap_or_else(|p| p.into_inner());
    let map = shared.store.slot_map();
    assert_eq!(map.primaries().len(), 3);
    assert_eq!(map.uncovered_slots(), 0);
    let owners: BTreeSet<_> = TAGS
        .iter()
        .map(|tag| map.owner(slot_of_key(&format!("{{{tag}}}"))).cloned())
        .collect();
    assert_eq!(
        owners.len(),
        3,
        "the tags reach all three primaries: {owners:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random batches of every kind over six tags (three primaries): each
    /// call, sent through the cluster store (split by slot, the primaries in
    /// parallel), answers exactly as its twin replayed at the `now_ms` Redis
    /// returned; packed per tag as multi_decision calls, likewise.
    #[test]
    fn every_script_decides_on_the_cluster_as_its_twin(
        batches in prop::collection::vec(
            prop::collection::vec((0..TAGS.len(), any_kind()), 1..16), 1..5),
        packed in any::<bool>(),
    ) {
        let shared = shared().lock().unwrap_or_else(|p| p.into_inner());
        let Shared { cluster, rt, store } = &*shared;
        for port in cluster.live_ports() {
            // Replicas refuse writes; FLUSHALL on the primaries is enough.
            let _ = leasehold_region_agent::testing::cluster::cli_at(port, &["FLUSHALL"]);
        }
        let twin = MemoryStore::default();
        let mut last_now: BTreeMap<usize, i64> = BTreeMap::new();
        for batch in &batches {
            let calls: Vec<(usize, ScriptCall)> =
                batch.iter().map(|(tag, sub)| (*tag, to_call(sub, TAGS[*tag]))).collect();
            let replies: Vec<_> = if packed {
                // One pack per tag, as the coalescer makes them.
                let mut packs: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
                for (i, (tag, _)) in calls.iter().enumerate() {
                    packs.entry(*tag).or_default().push(i);
                }
                let order: Vec<Vec<usize>> = packs.into_values().collect();
                let pack_calls: Vec<Vec<ScriptCall>> = order
                    .iter()
                    .map(|idx| idx.iter().map(|&i| calls[i].1.clone()).collect())
                    .collect();
                let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
                let answers = rt.block_on(store.run_packs(&pack_calls, deadline));
                let mut replies = vec![None; calls.len()];
                for (idx, answer) in order.iter().zip(answers) {
                    prop_assert_eq!(answer.len(), idx.len());
                    for (&i, reply) in idx.iter().zip(answer) {
                        replies[i] = Some(reply);
                    }
                }
                replies.into_iter().map(|r| r.expect("every call answered")).collect()
            } else {
                let plain: Vec<ScriptCall> = calls.iter().map(|(_, c)| c.clone()).collect();
                rt.block_on(store.run_batch(&plain))
            };
            prop_assert_eq!(replies.len(), calls.len());
            // Calls of one tag ran in order on one primary: replay each tag's
            // calls in order (tags never share keys).
            for ((tag, call), reply) in calls.iter().zip(&replies) {
                let from_redis = values(reply);
                let last = last_now.entry(*tag).or_insert(0);
                let now_ms = match &from_redis {
                    Ok(v) => *v.last().expect("reply ends with now_ms"),
                    Err(_) => *last,
                };
                // Packed sub-calls share one TIME per pack: same rule.
                *last = now_ms;
                prop_assert_eq!(&from_redis, &twin_values(&twin, call, now_ms), "on {:?}", call);
            }
        }
    }
}

#[test]
fn a_node_asked_for_a_slot_it_does_not_serve_answers_a_store_error_not_a_policy_error() {
    let shared = shared().lock().unwrap_or_else(|p| p.into_inner());
    let Shared { cluster, rt, store } = &*shared;
    let key = "lh:v1:{t0}:a:p";
    let owner = store
        .slot_map()
        .owner(slot_of_key(key))
        .cloned()
        .expect("owner");
    let other = cluster
        .nodes_view()
        .expect("view")
        .into_iter()
        .find(|n| n.primary && n.port != owner.port)
        .expect("another primary");
    // A plain RedisStore on the wrong primary: it does not route.
    let lone = RedisStore::new(RedisStoreConfig {
        call_deadline: Duration::from_secs(2),
        ..RedisStoreConfig::new(format!("redis://127.0.0.1:{}/", other.port))
    })
    .expect("store");
    let reply = rt.block_on(lone.run(&token_bucket(key, 1_000)));
    match reply {
        Err(StoreError::NotSent(NotSent::Cluster(Redirect::Moved { slot, to }))) => {
            assert_eq!(slot, slot_of_key(key));
            assert_eq!(to.port, owner.port);
        }
        other => panic!("MOVED must be a store error (not sent), got {other:?}"),
    }
    // Packed, the whole multi_decision is refused alike, each call a store error.
    let packs = vec![vec![
        token_bucket(key, 1),
        token_bucket("lh:v1:{t0}:b:p", 1),
    ]];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    for reply in rt.block_on(lone.run_packs(&packs, deadline)).concat() {
        assert!(
            matches!(
                reply,
                Err(StoreError::NotSent(NotSent::Cluster(
                    Redirect::Moved { .. }
                )))
            ),
            "{reply:?}"
        );
    }
    // The cluster store routes the same call to its owner.
    assert!(rt.block_on(store.run(&token_bucket(key, 1_000))).is_ok());
}

/// Redis Cluster checks a script's keys by slot, not by hash tag: one
/// multi_decision call over two tags of one slot runs, each call deciding
/// as its twin (what the coalescer's `Grouping::BySlot` packs rely on),
/// while one over two slots of the same primary is refused CROSSSLOT, each
/// call a store error (so packs per node are not possible).
/// `lease list` on a cluster: the lease records of tags on every primary
/// are found (one SCAN cursor per primary, in parallel), each read with
/// its holder and rule; the kept-record budget is shared by the shards.
#[test]
fn lease_records_on_every_primary_are_listed_within_one_budget() {
    use leasehold_region_agent::algorithm::lease_record::LeaseRecord;
    use leasehold_region_agent::lease::list::LEASE_RECORD_MATCH;
    use leasehold_region_agent::store::scan::{ScanRequest, ScanStop, ScannedRecord};

    let shared = shared().lock().unwrap_or_else(|p| p.into_inner());
    let Shared { cluster, rt, store } = &*shared;
    for port in cluster.live_ports() {
        let _ = leasehold_region_agent::testing::cluster::cli_at(port, &["FLUSHALL"]);
    }
    let calls: Vec<ScriptCall> = TAGS
        .iter()
        .flat_map(|tag| {
            (0..2u8).map(move |lease| {
                common::calls::lease_block(&common::calls::bucket_key(tag, 0), lease, 1_000, lease)
            })
        })
        .collect();
    for reply in rt.block_on(store.run_batch(&calls)) {
        assert_eq!(values(&reply).unwrap()[0], 1_000, "granted");
    }
    let request = |max_kept| ScanRequest {
        pattern: LEASE_RECORD_MATCH,
        max_kept,
        max_calls_per_shard: 100,
        keys_per_call: 3,
        deadline: tokio::time::Instant::now() + Duration::from_secs(10),
    };
    // A bucket named like a record is a hash: SCAN's TYPE string skips it.
    let keep_all = |_: &ScannedRecord| true;
    let all = rt
        .block_on(store.scan_strings(&request(100), &keep_all))
        .expect("listed");
    assert_eq!(all.shards, 3);
    assert!(
        all.stopped.is_empty() && all.shard_errors.is_empty(),
        "{all:?}"
    );
    assert_eq!(all.kept.len(), TAGS.len() * 2);
    let tags: BTreeSet<&str> = all
        .kept
        .iter()
        .map(|r| leasehold_region_agent::store::slots::hash_tag(&r.key))
        .collect();
    assert_eq!(tags.len(), TAGS.len(), "every tag, so every primary");
    for record in &all.kept {
        let parsed = LeaseRecord::parse(&record.value).expect("a current record");
        assert!(parsed.live_at(record.now_ms));
        let owner = parsed.owner.expect("names its holder");
        assert!(common::calls::HOLDERS.contains(&owner.holder.as_str()));
        assert_eq!(
            (owner.domain.as_str(), owner.rule_id.as_str()),
            ("api", "p-hot")
        );
    }
    let capped = rt
        .block_on(store.scan_strings(&request(5), &keep_all))
        .expect("listed");
    assert_eq!(capped.kept.len(), 5);
    assert_eq!(capped.stopped, vec![ScanStop::MaxKept]);
}

#[test]
fn a_pack_of_two_tags_of_one_slot_runs_and_one_of_two_slots_is_crossslot() {
    let shared = shared().lock().unwrap_or_else(|p| p.into_inner());
    let Shared { rt, store, .. } = &*shared;
    let map = store.slot_map();
    let slot = slot_of_key("sp-a");
    let names = || (0u32..200_000).map(|i| format!("sp-{i}"));
    let mate = names()
        .find(|t| t != "sp-a" && slot_of_key(t) == slot)
        .expect("a tag of the same slot");
    let neighbour = names()
        .find(|t| slot_of_key(t) != slot && map.owner(slot_of_key(t)) == map.owner(slot))
        .expect("a tag of another slot of the same primary");
    let key = |tag: &str| format!("lh:v1:{{{tag}}}:slotpack:p");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);

    let same_slot = vec![vec![
        token_bucket(&key("sp-a"), 1_000),
        token_bucket(&key(&mate), 2_000),
    ]];
    let answers = rt.block_on(store.run_packs(&same_slot, deadline)).concat();
    let twin = MemoryStore::default();
    assert_eq!(answers.len(), 2);
    for (call, answer) in same_slot[0].iter().zip(&answers) {
        let from_redis = values(answer).expect("decided");
        let now_ms = *from_redis.last().expect("reply ends with now_ms");
        assert_eq!(Ok(from_redis), twin_values(&twin, call, now_ms), "{call:?}");
    }

    let two_slots = vec![vec![
        token_bucket(&key("sp-a"), 1_000),
        token_bucket(&key(&neighbour), 1_000),
    ]];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    let answers = rt.block_on(store.run_packs(&two_slots, deadline)).concat();
    assert_eq!(answers.len(), 2);
    for answer in answers {
        assert!(
            matches!(
                answer,
                Err(StoreError::NotSent(NotSent::Cluster(Redirect::CrossSlot)))
            ),
            "{answer:?}"
        );
    }
}

#[test]
fn a_script_flushed_from_a_primary_is_loaded_again_without_a_restart() {
    let shared = shared().lock().unwrap_or_else(|p| p.into_inner());
    let Shared {
        cluster: _,
        rt,
        store,
    } = &*shared;
    let key = "lh:v1:{t1}:a:p";
    assert!(rt.block_on(store.run(&token_bucket(key, 1))).is_ok());
    let owner = store
        .slot_map()
        .owner(slot_of_key(key))
        .cloned()
        .expect("owner");
    leasehold_region_agent::testing::cluster::cli_at(owner.port, &["SCRIPT", "FLUSH"])
        .expect("script flush");
    // NOSCRIPT → load on that node → the call runs.
    let reply = rt
        .block_on(store.run(&token_bucket(key, 1)))
        .expect("reloaded");
    assert_eq!(reply.values[0], 1);
}

/// A user of the cluster that may not load scripts: the store cannot run
/// them there and says so as a store error (fail modes apply).
#[test]
fn a_node_that_refuses_to_load_the_scripts_is_a_store_error() {
    let shared = shared().lock().unwrap_or_else(|p| p.into_inner());
    let Shared {
        cluster,
        rt,
        store: _,
    } = &*shared;
    for port in cluster.live_ports() {
        leasehold_region_agent::testing::cluster::cli_at(
            port,
            &[
                "ACL", "SETUSER", "noscript", "on", ">pw", "~*", "&*", "+@all", "-script",
            ],
        )
        .expect("acl");
    }
    let dir = tempfile::tempdir().expect("dir");
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "pw\n").expect("password file");
    let mut config = ClusterStoreConfig::new(cluster.seeds());
    config.node = RedisStoreConfig {
        call_deadline: Duration::from_secs(2),
        auth: leasehold_region_agent::store::auth::RedisAuthSettings {
            username: Some("noscript".into()),
            password_file: Some(password_file),
            ..Default::default()
        },
        ..RedisStoreConfig::new("")
    };
    let limited = ClusterStore::new(config).expect("store");
    let reply = rt.block_on(limited.run(&token_bucket("lh:v1:{t2}:a:p", 1)));
    assert!(
        matches!(reply, Err(StoreError::NotSent(_))),
        "a store error, never a policy error: {reply:?}"
    );
}

/// Token buckets that refill nothing within a test (1 millitoken per 46
/// days; capacity × period ≤ 2^52) and cost 1 of their 1,000,000
/// millitokens a call: however fast the machine, the traffic never drains
/// one during the test, so every call takes the debit path.
fn frozen_bucket(key: &str) -> ScriptCall {
    ScriptCall::new(ScriptKind::TokenBucket)
        .key(key)
        .arg(1_000_000)
        .arg(1)
        .arg(4_000_000_000u64)
        .arg(1)
        .arg(600_000)
}

/// Tags whose slot is below `below` (served by the first range's primary).
fn tags_below(below: u16, count: usize) -> Vec<String> {
    (0..)
        .map(|i| format!("r{i}"))
        .filter(|tag| slot_of_key(tag) < below)
        .take(count)
        .collect()
}

#[test]
fn resharding_under_traffic_loses_and_doubles_no_decision() {
    let cluster = RedisCluster::start(3, 0).expect("cluster");
    let rt = runtime();
    let store = Arc::new(store_for(&cluster));
    let metrics = AgentMetrics::new().expect("metrics");
    store.attach_metrics(&metrics);
    assert!(rt.block_on(store.refresh()));
    let view = cluster.nodes_view().expect("view");
    let source = view
        .iter()
        .find(|n| n.primary && n.slots.iter().any(|&(s, _)| s == 0))
        .expect("slot 0's primary")
        .clone();
    let target = view
        .iter()
        .find(|n| n.primary && n.id != source.id)
        .expect("another primary")
        .clone();
    let moved_slots = 300u16;
    let tags = tags_below(moved_slots, 40);
    let keys: Vec<String> = tags.iter().map(|t| format!("lh:v1:{{{t}}}:a:p")).collect();
    let admitted: Arc<Vec<AtomicU64>> = Arc::new(keys.iter().map(|_| AtomicU64::new(0)).collect());
    let errors = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for worker in 0..4usize {
        let (store, keys, admitted, errors, stop) = (
            store.clone(),
            keys.clone(),
            admitted.clone(),
            errors.clone(),
            stop.clone(),
        );
        workers.push(rt.spawn(async move {
            // Bounded: at most 200,000 batches per worker.
            for i in worker..worker + 200_000 {
                if stop.load(Ordering::Acquire) {
                    break;
                }
                let batch: Vec<ScriptCall> = (0..4)
                    .map(|j| frozen_bucket(&keys[(i + j * 7) % keys.len()]))
                    .collect();
                let indices: Vec<usize> = (0..4).map(|j| (i + j * 7) % keys.len()).collect();
                for (index, reply) in indices.into_iter().zip(store.run_batch(&batch).await) {
                    match reply {
                        Ok(r) if r.values[0] == 1 => {
                            admitted[index].fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(r) => errors
                            .lock()
                            .unwrap()
                            .push(format!("refused: {:?}", r.values)),
                        Err(e) => errors.lock().unwrap().push(e.to_string()),
                    }
                }
            }
        }));
    }
    // Traffic first, then the reshard of the slots those keys live in.
    let started = Instant::now();
    while admitted
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum::<u64>()
        < 200
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "traffic never started"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    cluster
        .reshard(&source.id, &target.id, u32::from(moved_slots))
        .expect("reshard");
    // Traffic after the move: every key must be reached on its new owner.
    let after = admitted
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum::<u64>();
    let started = Instant::now();
    while admitted
        .iter()
        .map(|a| a.load(Ordering::Relaxed))
        .sum::<u64>()
        < after + 200
    {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "traffic stalled after the reshard"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    stop.store(true, Ordering::Release);
    for worker in workers {
        rt.block_on(worker).expect("worker");
    }
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors.is_empty(),
        "errors surfaced: {:?}",
        &errors[..errors.len().min(5)]
    );
    // Every key's debit equals what was admitted from it: none lost, none doubled.
    for (key, count) in keys.iter().zip(admitted.iter()) {
        let probe = ScriptCall::new(ScriptKind::TokenBucket)
            .key(key.clone())
            .arg(1_000_000)
            .arg(1)
            .arg(4_000_000_000u64)
            .arg(1_000_000)
            .arg(600_000);
        // A probe of cost = capacity is refused and reports the tokens left.
        let reply = rt.block_on(store.run(&probe)).expect("probe");
        let admitted = count.load(Ordering::Relaxed) as i64;
        assert_eq!(reply.values[1], 1_000_000 - admitted, "{key}");
        assert_eq!(reply.values[0], i64::from(admitted == 0), "{key}");
    }
    let slot_owner = store
        .slot_map()
        .owner(slot_of_key(&tags[0]))
        .cloned()
        .expect("owner");
    assert_eq!(slot_owner.port, target.port, "the map follows the reshard");
    let followed: u64 = ["moved", "ask", "tryagain"]
        .iter()
        .map(|k| {
            metrics
                .store_cluster_redirects
                .with_label_values(&[*k])
                .get()
        })
        .sum();
    assert!(
        followed > 0,
        "the reshard was seen as redirects and followed"
    );
}

#[test]
fn a_killed_primary_degrades_only_its_keys_until_its_replica_serves_them() {
    let mut cluster = RedisCluster::start(3, 1).expect("cluster");
    let rt = runtime();
    let mut config = ClusterStoreConfig::new(cluster.seeds());
    // Patient: a loaded machine never times out a healthy primary's call
    // (the killed one refuses connections at once).
    config.node = RedisStoreConfig {
        call_deadline: Duration::from_secs(5),
        connect_timeout: Duration::from_millis(500),
        ..RedisStoreConfig::new("")
    };
    let store = ClusterStore::new(config).expect("store");
    assert!(rt.block_on(store.refresh()));
    let map = store.slot_map();
    let keys: Vec<String> = TAGS.iter().map(|t| format!("lh:v1:{{{t}}}:a:p")).collect();
    let victim = map.owner(slot_of_key(&keys[0])).cloned().expect("owner");
    let on_victim: Vec<bool> = keys
        .iter()
        .map(|k| map.owner(slot_of_key(k)) == Some(&victim))
        .collect();
    assert!(on_victim.iter().any(|v| !v), "some keys live elsewhere");
    let batch: Vec<ScriptCall> = keys.iter().map(|k| token_bucket(k, 1)).collect();
    assert!(rt
        .block_on(store.run_batch(&batch))
        .iter()
        .all(Result::is_ok));

    cluster.kill(victim.port);
    let killed_at = Instant::now();
    // Until the failover: the victim's keys fail (store errors), the others
    // in the same batch are answered; its breaker opens after 5 failures.
    for _ in 0..6 {
        let replies = rt.block_on(store.run_batch(&batch));
        for ((key, reply), victims) in keys.iter().zip(&replies).zip(&on_victim) {
            match (victims, reply) {
                (false, Ok(_)) => {}
                (true, Err(StoreError::NotSent(_) | StoreError::Ambiguous(_))) => {}
                (true, Ok(_)) => {} // already failed over
                _ => panic!("{key}: {reply:?}"),
            }
        }
    }
    let victim_store = store.store_for_slot(slot_of_key(&keys[0])).expect("store");
    let failed_over = store.slot_map().owner(slot_of_key(&keys[0])) != Some(&victim);
    assert!(
        failed_over || victim_store.breaker_state() != "closed",
        "the dead primary's breaker opened"
    );
    assert!(
        store
            .shard_breakers()
            .iter()
            .filter(|s| s.state == "closed")
            .count()
            >= 2,
        "the other shards' breakers stay closed: {:?}",
        store.shard_breakers()
    );
    cluster.wait_for_failover(victim.port).expect("failover");
    // The promoted replica serves the keys: no restart, scripts loaded there.
    let started = Instant::now();
    loop {
        let replies = rt.block_on(store.run_batch(&batch));
        if replies.iter().all(Result::is_ok) {
            // docs/operating.md's failover figure (`--nocapture`).
            eprintln!(
                "killed primary's keys served again {:?} after the kill (cluster-node-timeout {} ms)",
                killed_at.elapsed(),
                leasehold_region_agent::testing::cluster::NODE_TIMEOUT_MS
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "still failing after the failover: {replies:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_ne!(store.slot_map().owner(slot_of_key(&keys[0])), Some(&victim));
    // The multi_decision path too (the coalescer's), on the new primary.
    let packs = vec![vec![token_bucket(&keys[0], 1), token_bucket(&keys[0], 1)]];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    assert!(rt
        .block_on(store.run_packs(&packs, deadline))
        .concat()
        .iter()
        .all(Result::is_ok));
}
