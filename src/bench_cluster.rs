//! `leasehold bench store --cluster` and `--capacity`: the agent's store as
//! it ships (the `CoalescingStore`) on one private redis-server and on a
//! private 3-primary Redis Cluster (`ClusterStore`), in one run, priced in
//! Redis CPU summed over every server that served the run; and the figures
//! that size a deployment: bytes per key of every script (`MEMORY USAGE`),
//! decisions per Redis CPU-second with block leasing off and on, and the
//! primaries and memory of a worked target.
//!
//! The workload is `bench store`'s: concurrent callers of one script each,
//! over `--keys` buckets drawn uniformly, never run dry (the allow-and-write
//! path). Each bucket has its own hash tag, so the keys spread over the
//! cluster's slots. A benchmark, never a test: nothing here asserts a time.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use leasehold_region_agent::store::cluster::{ClusterStore, ClusterStoreConfig};
use leasehold_region_agent::store::coalesce::{CoalesceConfig, CoalescingStore};
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::script::{ScriptCall, ScriptKind};
use leasehold_region_agent::store::slots::{slot_of_key, NodeAddress, SLOT_COUNT};
use leasehold_region_agent::store::BucketStore;
use leasehold_region_agent::testing::cluster::RedisCluster;
use leasehold_region_agent::testing::RedisServer;

use crate::bench_measure::{measure, per_cpu_second, RedisCpus, Run, ServerCounters};
use crate::bench_store::{StoreBench, BUCKET_ARGS};

/// Primaries of the private cluster.
const PRIMARIES: usize = 3;

/// Tokens per block lease: one lease_block call serves this many requests.
const BLOCK_TOKENS: u64 = 10;

/// How long the bench's lease records live (`lease_ttl_ms`).
const LEASE_TTL_MS: u64 = 30_000;

/// The worked sizing target.
const TARGET_CHECKS_PER_S: f64 = 1_000_000.0;
const TARGET_KEYS: f64 = 5_000_000.0;
/// Each primary planned at this share of its core.
const HEADROOM: f64 = 0.5;

/// What the callers run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Workload {
    /// One token_bucket decision per call (leasing off).
    Bucket,
    /// One lease_block grant of [`BLOCK_TOKENS`] tokens per call.
    Lease,
}

/// One priced run on one store.
struct Priced {
    run: Run,
    /// Per server, in the order of the store's servers.
    servers: Vec<ServerCounters>,
    /// Decisions answered OK, by the primary owning the key.
    per_primary: Vec<u64>,
}

impl Priced {
    fn cpu_s(&self) -> f64 {
        self.servers.iter().map(|s| s.cpu_s).sum()
    }
    fn per_cpu_s(&self) -> f64 {
        per_cpu_second(self.run.decisions as f64, self.cpu_s())
    }
    fn cpu_us_per_decision(&self) -> f64 {
        if self.run.decisions == 0 {
            return 0.0;
        }
        self.cpu_s() * 1e6 / self.run.decisions as f64
    }
    fn per_evalsha(&self) -> f64 {
        let calls: u64 = self.servers.iter().map(|s| s.evalsha_calls).sum();
        if calls == 0 {
            return 0.0;
        }
        self.run.decisions as f64 / calls as f64
    }
}

/// A store and the servers whose CPU it spends.
struct Target {
    label: String,
    store: Arc<dyn BucketStore>,
    cpus: RedisCpus,
}

pub async fn run(args: &StoreBench) -> anyhow::Result<()> {
    let one = tokio::task::spawn_blocking(RedisServer::start)
        .await?
        .context("starting a private redis-server")?;
    let cluster = tokio::task::spawn_blocking(|| RedisCluster::start(PRIMARIES, 0))
        .await?
        .context("starting a private 3-primary Redis Cluster")?;
    let node = RedisStoreConfig {
        call_deadline: Duration::from_secs(1),
        ..RedisStoreConfig::new(one.url())
    };
    let one_store = Arc::new(RedisStore::new(node.clone())?);
    let cluster_store = Arc::new(ClusterStore::new(ClusterStoreConfig {
        node: RedisStoreConfig {
            url: String::new(),
            ..node
        },
        ..ClusterStoreConfig::new(cluster.seeds())
    })?);
    if !cluster_store.refresh().await {
        anyhow::bail!("the private cluster serves no slot");
    }
    let map = cluster_store.slot_map();
    let primaries = map.primaries();
    if primaries.len() != PRIMARIES {
        anyhow::bail!("the cluster map names {} primaries", primaries.len());
    }
    let tags = args.tags.unwrap_or(args.keys);
    if tags == 0 {
        anyhow::bail!("--tags must be at least 1");
    }
    let keys: Arc<Vec<Bucket>> = Arc::new(
        (0..args.keys)
            .map(|k| Bucket { k, tag: k % tags })
            .collect(),
    );
    let owner: Arc<Vec<usize>> = Arc::new(
        keys.iter()
            .map(|&b| owner_index(&primaries, map.owner(slot_of_key(&bucket_key(b)))))
            .collect(),
    );
    let one_target = Target {
        label: "RedisStore, one node".into(),
        store: Arc::new(CoalescingStore::new(
            one_store.clone(),
            CoalesceConfig::default(),
        )),
        cpus: RedisCpus::new(&[one.url()])?,
    };
    let primary_urls: Vec<String> = primaries
        .iter()
        .map(|p| format!("redis://{}/", p.host_port()))
        .collect();
    let cluster_target = Target {
        label: format!("ClusterStore, {PRIMARIES} primaries"),
        store: Arc::new(CoalescingStore::new(
            cluster_store.clone(),
            CoalesceConfig::default(),
        )),
        cpus: RedisCpus::new(&primary_urls)?,
    };
    // Warm up: connect every node, load the scripts, learn the topology.
    for &b in keys.iter().take(64) {
        for target in [&one_target, &cluster_target] {
            target
                .store
                .run(&bucket_call(b))
                .await
                .map_err(|e| anyhow::anyhow!("warm-up on {}: {e}", target.label))?;
        }
    }

    let one_bucket = priced(&one_target, args, &keys, &owner, Workload::Bucket).await?;
    let cluster_bucket = priced(&cluster_target, args, &keys, &owner, Workload::Bucket).await?;
    if args.cluster {
        print_cluster(
            args,
            [
                (&one_target.label, &one_bucket),
                (&cluster_target.label, &cluster_bucket),
            ],
            &primaries,
            &map_slots(&primaries, |slot| map.owner(slot)),
            &owner,
        );
    }
    if args.capacity {
        let one_lease = priced(&one_target, args, &keys, &owner, Workload::Lease).await?;
        let cluster_lease = priced(&cluster_target, args, &keys, &owner, Workload::Lease).await?;
        let memory = memory_per_key(&one_store, &one.url()).await?;
        if args.cluster {
            println!();
        }
        print_capacity(
            args,
            &memory,
            [&one_bucket, &one_lease],
            [&cluster_bucket, &cluster_lease],
        );
    }
    drop(cluster);
    Ok(())
}

/// Which of `primaries` is `address` (0 when the map names none: the
/// fixture covers every slot).
fn owner_index(primaries: &[NodeAddress], address: Option<&NodeAddress>) -> usize {
    address
        .and_then(|a| primaries.iter().position(|p| p == a))
        .unwrap_or(0)
}

/// Slots per primary, in `primaries` order.
fn map_slots<'a>(
    primaries: &[NodeAddress],
    owner: impl Fn(u16) -> Option<&'a NodeAddress>,
) -> Vec<u32> {
    let mut slots = vec![0u32; primaries.len()];
    for slot in 0..SLOT_COUNT {
        slots[owner_index(primaries, owner(slot))] += u32::from(owner(slot).is_some());
    }
    slots
}

/// Bucket `k` of the workload: key `k` in hash tag `k mod tags` (by
/// default each key its own tag), so buckets spread over the slots.
#[derive(Clone, Copy)]
struct Bucket {
    k: u64,
    tag: u64,
}

fn bucket_key(b: Bucket) -> String {
    format!("lh:v1:{{b{}}}:rb{}", b.tag, b.k)
}

fn bucket_call(b: Bucket) -> ScriptCall {
    let mut call = ScriptCall::new(ScriptKind::TokenBucket).key(bucket_key(b));
    for arg in BUCKET_ARGS {
        call = call.arg(arg);
    }
    call
}

/// A block of [`BLOCK_TOKENS`] from bucket `k` under a fresh lease id: the
/// bucket and its lease record share the bucket's tag.
fn lease_call(b: Bucket, lease_id: &str) -> ScriptCall {
    let Bucket { k, tag } = b;
    ScriptCall::new(ScriptKind::LeaseBlock)
        .key(format!("lh:v1:{{b{tag}}}:lb{k}"))
        .key(format!(
            "lh:v1:{{b{tag}}}:_lease:{:016x}:{lease_id}",
            k.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ))
        .arg(BUCKET_ARGS[0])
        .arg(BUCKET_ARGS[1])
        .arg(BUCKET_ARGS[2])
        .arg(BLOCK_TOKENS * 1_000)
        .arg(1)
        .arg(0)
        .arg(LEASE_TTL_MS)
        .arg("gateway/bench")
        .arg("bench")
        .arg("leased")
}

/// `--concurrency` callers of one call each for `--seconds`, priced on the
/// target's servers.
async fn priced(
    target: &Target,
    args: &StoreBench,
    keys: &Arc<Vec<Bucket>>,
    owner: &Arc<Vec<usize>>,
    workload: Workload,
) -> anyhow::Result<Priced> {
    let counts: Arc<Vec<AtomicU64>> = Arc::new((0..PRIMARIES).map(|_| AtomicU64::new(0)).collect());
    let (store, keys, owner, tally) = (
        target.store.clone(),
        keys.clone(),
        owner.clone(),
        counts.clone(),
    );
    let call = move |task: usize, i: u64| {
        let (store, keys, owner, tally) =
            (store.clone(), keys.clone(), owner.clone(), tally.clone());
        async move {
            let index = (task as u64).wrapping_mul(1_000_003).wrapping_add(i) % keys.len() as u64;
            let b = keys[index as usize];
            let call = match workload {
                Workload::Bucket => bucket_call(b),
                Workload::Lease => lease_call(b, &format!("{task}.{i}")),
            };
            match store.run(&call).await {
                Ok(_) => {
                    tally[owner[index as usize]].fetch_add(1, Ordering::Relaxed);
                    1
                }
                Err(_) => 0,
            }
        }
    };
    let concurrency = args.concurrency;
    let duration = Duration::from_secs(args.seconds);
    let (run, servers) = target
        .cpus
        .priced(async move { Ok(measure(concurrency, duration, call).await) })
        .await?;
    Ok(Priced {
        run,
        servers,
        per_primary: counts.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
    })
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 {
        a / b
    } else {
        0.0
    }
}

fn share(part: u64, whole: u64) -> f64 {
    ratio(part as f64 * 100.0, whole as f64)
}

fn print_cluster(
    args: &StoreBench,
    rows: [(&String, &Priced); 2],
    primaries: &[NodeAddress],
    slots: &[u32],
    owner: &[usize],
) {
    println!(
        "leasehold bench store --cluster (token bucket, allow path, {} keys of {} hash tags, \
         {} callers, coalesced as the agent ships it)",
        args.keys,
        args.tags.unwrap_or(args.keys).min(args.keys),
        args.concurrency
    );
    println!(
        "  {:<32} {:>12} {:>12} {:>16} {:>14} {:>8} {:>8}",
        "store",
        "decisions/s",
        "Redis CPU µs",
        "per Redis CPU-s",
        "per EVALSHA",
        "p50 µs",
        "p99 µs"
    );
    for (label, p) in rows {
        let errors = if p.run.errors > 0 {
            format!("  ({} errors)", p.run.errors)
        } else {
            String::new()
        };
        println!(
            "  {:<32} {:>12.0} {:>12.2} {:>16.0} {:>14.2} {:>8} {:>8}{errors}",
            label,
            p.run.rate,
            p.cpu_us_per_decision(),
            p.per_cpu_s(),
            p.per_evalsha(),
            p.run.p50_us,
            p.run.p99_us
        );
    }
    let (one, cluster) = (rows[0].1, rows[1].1);
    println!(
        "  {:<32} {:>11.2}x {:>11.2}x {:>15.2}x {:>13.2}x",
        "ratio cluster / one node",
        ratio(cluster.run.rate, one.run.rate),
        ratio(cluster.cpu_us_per_decision(), one.cpu_us_per_decision()),
        ratio(cluster.per_cpu_s(), one.per_cpu_s()),
        ratio(cluster.per_evalsha(), one.per_evalsha()),
    );
    println!("  (Redis CPU µs = per decision, summed over every server of the store; per EVALSHA = decisions per script call)");
    let mut keys_per = vec![0u64; primaries.len()];
    for &o in owner {
        keys_per[o] += 1;
    }
    let decided: u64 = cluster.per_primary.iter().sum();
    println!(
        "  per primary ({} keys used, {} decisions on the cluster):",
        owner.len(),
        decided
    );
    println!(
        "    {:<20} {:>8} {:>8} {:>11} {:>11} {:>16}",
        "primary", "slots", "keys", "decisions", "its CPU s", "per its CPU-s"
    );
    for (i, primary) in primaries.iter().enumerate() {
        let cpu = cluster.servers.get(i).map_or(0.0, |s| s.cpu_s);
        let decisions = cluster.per_primary.get(i).copied().unwrap_or(0);
        println!(
            "    {:<20} {:>7.1}% {:>7.1}% {:>10.1}% {:>11.2} {:>16.0}",
            primary.host_port(),
            share(u64::from(slots[i]), u64::from(SLOT_COUNT)),
            share(keys_per[i], owner.len() as u64),
            share(decisions, decided),
            cpu,
            per_cpu_second(decisions as f64, cpu)
        );
    }
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "  What limits the scaling here: {cores} cores shared by the callers, the agent's store \
         and {} redis-servers ({PRIMARIES} primaries and the idle one-node server), so the \
         primaries cannot each get a core and throughput scales less than CPU per decision \
         suggests. The per-Redis-CPU-second figures are the ones that transfer to a cluster \
         whose primaries each own a core.",
        PRIMARIES + 1
    );
}

/// One key a script wrote, measured after a realistic call.
struct KeyBytes {
    script: &'static str,
    role: &'static str,
    encoding: String,
    bytes: u64,
}

/// Runs one realistic call of every script on the one-node server (tag
/// `{acme}`, principal hashes and ids of production lengths) and reads
/// `MEMORY USAGE <key> SAMPLES 0` and `OBJECT ENCODING` of each key it
/// wrote.
async fn memory_per_key(store: &Arc<RedisStore>, url: &str) -> anyhow::Result<Vec<KeyBytes>> {
    let principal = "9f86d081884c7d65";
    let bucket = format!("lh:v1:{{acme}}:api-requests:{principal}");
    let rate = ["100000", "100000", "60000"]; // 100 tokens, refilled per minute
    let id = |n: u32| format!("7f9c2ba4-e88f-4a5b-9b2d-1c3e5f7a{n:04x}");
    let mut calls: Vec<ScriptCall> = Vec::new();
    let mut keys: Vec<(&'static str, &'static str, String)> = Vec::new();

    calls.push(
        ScriptCall::new(ScriptKind::TokenBucket)
            .key(&bucket)
            .args_of(&rate)
            .arg(1_000)
            .arg(0),
    );
    keys.push(("token_bucket", "bucket hash {tokens, ts}", bucket.clone()));

    let mr_bucket = format!("lh:v1:{{acme}}:per-user:{principal}");
    let record = format!("lh:v1:{{acme}}:_decision:{}", id(1));
    calls.push(
        ScriptCall::new(ScriptKind::MultiRule)
            .key(&record)
            .key(&mr_bucket)
            .arg(0)
            .arg(60_000)
            .arg("0123456789abcdef0123456789abcdef")
            .arg(0)
            .args_of(&rate)
            .arg(1_000),
    );
    keys.push(("multi_rule", "decision record (60 s)", record));

    let lb_bucket = format!("lh:v1:{{acme}}:leased:{principal}");
    let lease = format!("lh:v1:{{acme}}:_lease:{principal}:{}", id(2));
    calls.push(
        ScriptCall::new(ScriptKind::LeaseBlock)
            .key(&lb_bucket)
            .key(&lease)
            .args_of(&rate)
            .arg(BLOCK_TOKENS * 1_000)
            .arg(1)
            .arg(0)
            .arg(LEASE_TTL_MS)
            .arg("gateway/bench")
            .arg("bench")
            .arg("leased"),
    );
    keys.push(("lease_block", "bucket hash {tokens, ts}", lb_bucket));
    keys.push(("lease_block", "lease record", lease));

    let sem = format!("lh:v1:{{acme}}:in-flight:{principal}");
    calls.push(
        ScriptCall::new(ScriptKind::Concurrency)
            .key(&sem)
            .arg("acquire")
            .arg(id(3))
            .arg(100)
            .arg(30_000),
    );
    keys.push(("concurrency", "sorted set, 1 lease", sem));

    let fw = format!("lh:v1:{{acme}}:per-minute:{principal}");
    calls.push(
        ScriptCall::new(ScriptKind::FixedWindow)
            .key(&fw)
            .arg(100)
            .arg(60_000)
            .arg(1)
            .arg(0),
    );
    keys.push(("fixed_window", "hash {w, n}", fw));

    let sc = format!("lh:v1:{{acme}}:sliding:{principal}");
    calls.push(
        ScriptCall::new(ScriptKind::SlidingCounter)
            .key(&sc)
            .arg(100)
            .arg(60_000)
            .arg(1),
    );
    keys.push(("sliding_counter", "hash {w, cur, prev}", sc));

    let sl = format!("lh:v1:{{acme}}:exact:{principal}");
    for n in 0..10 {
        calls.push(
            ScriptCall::new(ScriptKind::SlidingLog)
                .key(&sl)
                .arg(100)
                .arg(60_000)
                .arg(id(100 + n)),
        );
    }
    keys.push(("sliding_log", "sorted set, 10 entries", sl));

    let gcra = format!("lh:v1:{{acme}}:gcra:{principal}");
    calls.push(
        ScriptCall::new(ScriptKind::Gcra)
            .key(&gcra)
            .args_of(&rate)
            .arg(1_000)
            .arg(0),
    );
    keys.push(("gcra", "hash {tat}", gcra));

    let chunk = "lh:v1:{g-checkout}:_chunk:eu-west.7:42".to_string();
    calls.push(
        ScriptCall::new(ScriptKind::ChunkCredit)
            .key(&chunk)
            .arg(1_000_000)
            .arg(60_000),
    );
    keys.push(("chunk counter", "string (chunk_credit)", chunk));

    let rls = "lh:v1:{rls-3f2a9c1e5b7d4f60}:minute".to_string();
    calls.push(
        ScriptCall::new(ScriptKind::RlsWindow)
            .key(&rls)
            .arg(60_000)
            .arg(1)
            .arg(0)
            .arg(0)
            .arg(100),
    );
    keys.push(("rls_window", "hash {w, n}", rls));

    for call in &calls {
        store
            .run(call)
            .await
            .map_err(|e| anyhow::anyhow!("{} on the one-node server: {e}", call.kind.name()))?;
    }
    let client = redis::Client::open(url)?;
    let mut conn = client.get_connection()?;
    let mut out = Vec::new();
    for (script, role, key) in keys {
        let bytes: Option<u64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(&key)
            .arg("SAMPLES")
            .arg(0)
            .query(&mut conn)?;
        let encoding: Option<String> = redis::cmd("OBJECT")
            .arg("ENCODING")
            .arg(&key)
            .query(&mut conn)?;
        out.push(KeyBytes {
            script,
            role,
            encoding: encoding.unwrap_or_else(|| "missing".into()),
            bytes: bytes.with_context(|| format!("{script} wrote no key {key}"))?,
        });
    }
    Ok(out)
}

/// `ScriptCall::arg` over a slice.
trait ArgsOf {
    fn args_of(self, args: &[&str]) -> Self;
}

impl ArgsOf for ScriptCall {
    fn args_of(mut self, args: &[&str]) -> Self {
        for arg in args {
            self = self.arg(arg);
        }
        self
    }
}

fn print_capacity(
    args: &StoreBench,
    memory: &[KeyBytes],
    one: [&Priced; 2],
    cluster: [&Priced; 2],
) {
    println!(
        "leasehold bench store --capacity ({} keys of {} hash tags, {} callers, coalesced; block \
         leasing: one lease_block of B = {BLOCK_TOKENS} tokens serves {BLOCK_TOKENS} requests)",
        args.keys,
        args.tags.unwrap_or(args.keys).min(args.keys),
        args.concurrency
    );
    println!("  bytes per key (MEMORY USAGE … SAMPLES 0, after a realistic call):");
    println!(
        "    {:<16} {:<26} {:<10} {:>7}",
        "script", "key", "encoding", "bytes"
    );
    for key in memory {
        println!(
            "    {:<16} {:<26} {:<10} {:>7}",
            key.script, key.role, key.encoding, key.bytes
        );
    }
    println!("  requests per Redis CPU-second (leasing on = {BLOCK_TOKENS} × lease_block decisions per CPU-second):");
    println!(
        "    {:<34} {:>14} {:>14} {:>14} {:>8}",
        "", "one node", "per primary", "decisions/s", "errors"
    );
    let rows = [
        ("leasing off (1 decision / request)", 0, 1.0),
        ("leasing on (B = 10: 10 requests)", 1, BLOCK_TOKENS as f64),
    ];
    let mut per_primary = [0.0; 2];
    for (label, i, requests) in rows {
        per_primary[i] = cluster[i].per_cpu_s() * requests;
        println!(
            "    {:<34} {:>14.0} {:>14.0} {:>14.0} {:>8}",
            label,
            one[i].per_cpu_s() * requests,
            per_primary[i],
            cluster[i].run.rate * requests,
            one[i].run.errors + cluster[i].run.errors
        );
    }
    println!(
        "    (per primary = the {PRIMARIES}-primary cluster's decisions over the sum of its \
         primaries' CPU-seconds: one primary at one full core; decisions/s = the cluster's, \
         in requests)"
    );
    let bucket_bytes = memory
        .iter()
        .find(|k| k.script == "token_bucket")
        .map_or(0, |k| k.bytes) as f64;
    let lease_bytes = memory
        .iter()
        .find(|k| k.role == "lease record")
        .map_or(0, |k| k.bytes) as f64;
    println!(
        "  sizing {:.0} checks/s over {:.0} active keys, each primary planned at {:.0}% of its \
         core:",
        TARGET_CHECKS_PER_S,
        TARGET_KEYS,
        HEADROOM * 100.0
    );
    for (label, per) in [
        ("leasing off", per_primary[0]),
        ("leasing on ", per_primary[1]),
    ] {
        let primaries = if per > 0.0 {
            (TARGET_CHECKS_PER_S / (per * HEADROOM)).ceil()
        } else {
            f64::NAN
        };
        println!(
            "    {label}: primaries = ceil({:.0} / ({:.0} × {HEADROOM})) = {primaries:.0}",
            TARGET_CHECKS_PER_S, per
        );
    }
    for replicas in [0u32, 1] {
        let bytes = TARGET_KEYS * bucket_bytes * f64::from(1 + replicas);
        println!(
            "    memory, {replicas} replica(s) per primary: {:.0} × {bucket_bytes:.0} B × {} = {:.2} GB \
             (token_bucket keys; Redis's own overhead and fragmentation not included)",
            TARGET_KEYS,
            1 + replicas,
            bytes / 1e9
        );
    }
    let live_leases = TARGET_CHECKS_PER_S / BLOCK_TOKENS as f64 * (LEASE_TTL_MS as f64 / 1_000.0);
    println!(
        "    leasing on also holds lease records: {:.0} leases/s × {} s lease_ttl = {live_leases:.0} \
         records × {lease_bytes:.0} B = {:.2} GB per copy",
        TARGET_CHECKS_PER_S / BLOCK_TOKENS as f64,
        LEASE_TTL_MS / 1_000,
        live_leases * lease_bytes / 1e9
    );
}
