//! `leasehold bench agent`: decisions/s, p50/p99/p999 and Redis CPU per
//! decision through a real agent over loopback gRPC — unary Check, and the
//! client library's `Limiter` (concurrent Checks as CheckBatch calls) —
//! beside the same `multi_rule` EVALSHA sent raw through redis-rs to the
//! same redis-server, at each caller count, in one run.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use leasehold_client::{AdmitRequest, FailMode, Limiter, LimiterConfig};
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::policy;
use leasehold_region_agent::server::{self, AgentSpec};
use leasehold_region_agent::store::coalesce::{CoalesceConfig, CoalescingStore};
use leasehold_region_agent::store::memory::SystemClock;
use leasehold_region_agent::store::redis::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::store::script::ScriptKind;
use leasehold_region_agent::store::BucketStore;
use leasehold_region_agent::testing::RedisServer;
use leasehold_tls::TlsSettings;
use tonic::transport::Channel;

pub(crate) use crate::bench_measure::{measure, Run};
use crate::bench_measure::{per_cpu_second, process_cpu_seconds, RedisCpu};

/// One user rule that never runs dry during a run (10^6 tokens, 1 token
/// per 1,000 s): every decision takes the allow-and-write path, and each
/// bucket's key lives for the whole run, as a busy bucket does.
const POLICY: &str = r#"
version = 1
[[domain]]
name = "bench"
[[domain.rule]]
id = "b-user"
scope = "user"
algorithm = "token_bucket"
capacity = 1000000
refill = 1
period_ms = 1000000
fail_mode = "open"
"#;

/// The same bucket in the script's units (millitokens, ms).
const RAW_BUCKET: [u64; 3] = [1_000_000_000, 1_000, 1_000_000];
/// Users the decisions spread over, uniformly.
const USERS: u64 = 10_000;

/// POLICY with decision records and a shadow rule (`--shadow`): the shadow
/// tenant bucket rides in the same multi_rule call as the user rule.
fn shadow_policy() -> String {
    let user = "period_ms = 1000000\nfail_mode = \"open\"\n";
    assert!(POLICY.contains(user));
    POLICY.replacen(
        user,
        "period_ms = 1000000\nidempotent_ttl_ms = 60000\nfail_mode = \"open\"\n",
        1,
    ) + r#"[[domain.rule]]
id = "b-shadow"
scope = "tenant"
algorithm = "token_bucket"
capacity = 1000000
refill = 1
period_ms = 1000000
shadow = true
fail_mode = "open"
"#
}

/// The bench agent on `store`: Region `bench`, one user rule (with
/// `shadow`: recorded, plus a shadow rule), plaintext.
pub(crate) fn bench_spec(store: Arc<dyn BucketStore>, shadow: bool) -> anyhow::Result<AgentSpec> {
    let text = if shadow {
        shadow_policy()
    } else {
        POLICY.to_string()
    };
    spec_with(
        store,
        &text,
        leasehold_region_agent::denial::DEFAULT_MAX_KEYS,
    )
}

/// A plaintext bench agent of Region `bench` on `store` with `policy` and
/// `[denials] max_keys = denials_max_keys`.
pub(crate) fn spec_with(
    store: Arc<dyn BucketStore>,
    policy: &str,
    denials_max_keys: usize,
) -> anyhow::Result<AgentSpec> {
    let any = "127.0.0.1:0".parse()?;
    Ok(AgentSpec {
        region: "bench".into(),
        listen: any,
        http_listen: any,
        store,
        pepper: b"bench-pepper-0123456789abcdef".to_vec(),
        policy: policy::parse("bench-policy", policy, None).map_err(|e| anyhow::anyhow!("{e}"))?,
        policy_file: None,
        policy_poll: Duration::from_secs(60),
        fallback_max_keys: 1_000,
        denials_max_keys,
        // Every decision reaches the store: what these benches compare.
        agent_leasing: leasehold_region_agent::lease::agent::AgentLeasingSettings::off(),
        metering: Default::default(),
        clock: Arc::new(SystemClock),
        global: None,
        connector: None,
        listeners: Default::default(),
        limits: Default::default(),
        ratelimit: None,
        forwarding: None,
        rlqs: Default::default(),
    })
}

/// The bench's store on the redis-server at `url` (a patient deadline), in
/// front of it the coalescer when `coalesce` (as `leasehold agent` runs).
pub(crate) fn redis_store(url: String, coalesce: bool) -> anyhow::Result<Arc<dyn BucketStore>> {
    let store = Arc::new(RedisStore::new(RedisStoreConfig {
        call_deadline: Duration::from_secs(1),
        ..RedisStoreConfig::new(url)
    })?);
    Ok(if coalesce {
        Arc::new(CoalescingStore::new(store, CoalesceConfig::default()))
    } else {
        store
    })
}

/// Checks through `client` from `concurrency` callers for `duration`.
pub(crate) async fn checks(
    client: AgentClient<Channel>,
    concurrency: usize,
    duration: Duration,
) -> Run {
    measure(concurrency, duration, move |task, i| {
        let mut client = client.clone();
        async move {
            let request = pb::CheckRequest {
                request_id: format!("b{task}-{i}"),
                target: Some(pb::Target {
                    domain: "bench".into(),
                    tenant: "bench".into(),
                    principal: Some(pb::Principal {
                        r#type: "user".into(),
                        id: format!("u{}", i % USERS),
                    }),
                    ..Default::default()
                }),
                cost: 1,
                policy_version_seen: 0,
            };
            u64::from(matches!(client.check(request).await, Ok(r) if r.get_ref().allowed))
        }
    })
    .await
}

/// The same agent setup behind mTLS (`grpc_mtls`, certificates from
/// `certs init` in a temporary directory), called as `/gateway/bench`.
async fn checks_over_mtls(
    store: Arc<dyn BucketStore>,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<Run> {
    const TRUST_DOMAIN: &str = "leasehold.local";
    let dir = tempfile::tempdir()?;
    leasehold_tls::certs::init(dir.path(), TRUST_DOMAIN, &["bench".into()], 1)?;
    let agent = server::start(AgentSpec {
        listeners: server::ListenerSecurity {
            grpc_tls: Some(TlsSettings::in_dir(
                dir.path(),
                "region-bench",
                TRUST_DOMAIN,
            )),
            ..Default::default()
        },
        ..bench_spec(store, false)?
    })
    .await?;
    let gateway = TlsSettings::in_dir(dir.path(), "gateway-bench", TRUST_DOMAIN);
    let channel = leasehold_tls::channel(
        &agent.grpc_addr.to_string(),
        leasehold_tls::TlsConnector::new(gateway.files(), TRUST_DOMAIN)?,
        leasehold_tls::ExpectedPeer::Identity(leasehold_tls::Identity::Region("bench".into())),
    )
    .await?;
    let run = checks(AgentClient::new(channel), concurrency, duration).await;
    agent.stop().await;
    Ok(run)
}

/// Admissions through the client library (no leased rule applies, so each
/// is a Check; concurrent ones travel as CheckBatch calls).
async fn limiter_checks(limiter: Limiter, concurrency: usize, duration: Duration) -> Run {
    measure(concurrency, duration, move |task, i| {
        let limiter = limiter.clone();
        async move {
            let target = pb::Target {
                domain: "bench".into(),
                tenant: "bench".into(),
                principal: Some(pb::Principal {
                    r#type: "user".into(),
                    id: format!("u{}", i % USERS),
                }),
                ..Default::default()
            };
            let request = AdmitRequest::new(target, 1).with_request_id(format!("l{task}-{i}"));
            let decision = limiter.admit(request).await;
            u64::from(decision.allowed && !decision.fallback)
        }
    })
    .await
}

/// What a measurement goes through (`--paths`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Path {
    /// multi_rule EVALSHA sent raw through redis-rs: the baseline.
    Raw,
    /// The agent's unary Check over loopback gRPC.
    Check,
    /// The client library's `Limiter` (concurrent Checks as CheckBatch).
    Limiter,
}

impl Path {
    fn label(self) -> &'static str {
        match self {
            Path::Raw => "raw multi_rule EVALSHA via redis-rs",
            Path::Check => "agent Check (unary gRPC)",
            Path::Limiter => "agent via Limiter (CheckBatch)",
        }
    }
}

/// One priced line of the table.
struct Line {
    label: &'static str,
    run: Run,
    cpu_s: f64,
    /// The bench process's own CPU (callers + agent) meanwhile.
    process_cpu_s: f64,
}

pub async fn run(
    callers: &[usize],
    seconds: u64,
    tls: bool,
    shadow: bool,
    coalesce: bool,
    paths: &[Path],
    client_batches_in_flight: usize,
) -> anyhow::Result<()> {
    if callers.is_empty() || callers.contains(&0) {
        anyhow::bail!("--callers needs caller counts of at least 1");
    }
    if paths.is_empty() {
        anyhow::bail!("--paths needs at least one of raw, check, limiter");
    }
    let redis = RedisServer::start().context("starting a private redis-server")?;
    let cpu = RedisCpu::new(&redis.url())?;
    let store = redis_store(redis.url(), coalesce)?;
    let agent = server::start(bench_spec(store.clone(), shadow)?).await?;
    let endpoint = format!("http://{}", agent.grpc_addr);
    let client = AgentClient::connect(endpoint.clone()).await?;
    let limiter = Limiter::connect_lazy(
        endpoint,
        LimiterConfig {
            deadline_ms: 1_000,
            fail_mode: FailMode::Closed,
            check_batches_in_flight: client_batches_in_flight,
            ..LimiterConfig::default()
        },
    )?;
    let duration = Duration::from_secs(seconds);
    let rules = if shadow {
        "one recorded user rule + one shadow rule"
    } else {
        "one user rule"
    };
    let store_path = if coalesce {
        "coalescing store"
    } else {
        "no coalescing"
    };
    println!(
        "leasehold bench agent ({rules}, allow path, {USERS} users, one agent ({store_path}), \
         one redis-server)"
    );
    for &concurrency in callers {
        let url = redis.url();
        println!("  {concurrency} callers:");
        let mut lines = Vec::new();
        for path in paths {
            let process_before = process_cpu_seconds().unwrap_or(0.0);
            let (run, cpu_s) = match path {
                Path::Raw => cpu.priced(raw_evalsha(&url, concurrency, duration)).await?,
                Path::Check => {
                    cpu.priced(async { Ok(checks(client.clone(), concurrency, duration).await) })
                        .await?
                }
                Path::Limiter => {
                    cpu.priced(async {
                        Ok(limiter_checks(limiter.clone(), concurrency, duration).await)
                    })
                    .await?
                }
            };
            let process_cpu_s = process_cpu_seconds().unwrap_or(0.0) - process_before;
            let line = Line {
                label: path.label(),
                run,
                cpu_s,
                process_cpu_s,
            };
            print_priced(&line);
            lines.push((*path, line));
        }
        let raw = lines.iter().find(|(path, _)| *path == Path::Raw);
        for (_, line) in lines.iter().filter(|(path, _)| *path != Path::Raw) {
            let Some((_, raw)) = raw else { break };
            println!(
                "    ratio {} / raw EVALSHA: throughput {:.2}, p50 {:.2}x, p99 {:.2}x",
                line.label,
                line.run.rate / raw.run.rate.max(f64::MIN_POSITIVE),
                line.run.p50_us as f64 / raw.run.p50_us.max(1) as f64,
                line.run.p99_us as f64 / raw.run.p99_us.max(1) as f64,
            );
        }
        let unary = lines.iter().find(|(path, _)| *path == Path::Check);
        if let (true, Some((_, unary))) = (tls, unary) {
            let over_mtls = checks_over_mtls(store.clone(), concurrency, duration).await?;
            print_run("agent Check over loopback gRPC + mTLS", &over_mtls);
            println!(
                "    ratio mTLS / plaintext: throughput {:.2}, p50 {:.2}x, p99 {:.2}x",
                over_mtls.rate / unary.run.rate.max(f64::MIN_POSITIVE),
                over_mtls.p50_us as f64 / unary.run.p50_us.max(1) as f64,
                over_mtls.p99_us as f64 / unary.run.p99_us.max(1) as f64,
            );
        }
    }
    agent.stop().await;
    Ok(())
}

fn print_priced(line: &Line) {
    let per_decision_us = if line.run.decisions > 0 {
        line.cpu_s * 1e6 / line.run.decisions as f64
    } else {
        0.0
    };
    let process_us = if line.run.decisions > 0 {
        line.process_cpu_s * 1e6 / line.run.decisions as f64
    } else {
        0.0
    };
    println!(
        "    {:<38}: {:>9.0} decisions/s  p50 {:>6} us  p99 {:>6} us  p999 {:>6} us  \
         Redis CPU {:>5.2} us/decision ({:.0}/CPU-s)  bench process CPU {:>5.1} us/decision  \
         ({} errors)",
        line.label,
        line.run.rate,
        line.run.p50_us,
        line.run.p99_us,
        line.run.p999_us,
        per_decision_us,
        per_cpu_second(line.run.decisions as f64, line.cpu_s),
        process_us,
        line.run.errors
    );
}

pub(crate) fn print_run(label: &str, run: &Run) {
    println!(
        "    {label:<38}: {:>9.0} decisions/s  p50 {:>6} us  p99 {:>6} us  p999 {:>6} us  ({} errors)",
        run.rate, run.p50_us, run.p99_us, run.p999_us, run.errors
    );
}

/// The same script and arguments the agent sends for one user rule.
async fn raw_evalsha(url: &str, concurrency: usize, duration: Duration) -> anyhow::Result<Run> {
    let client = redis::Client::open(url)?;
    let conn = client.get_multiplexed_async_connection().await?;
    let script = ScriptKind::MultiRule.script();
    let mut loader = conn.clone();
    script.prepare_invoke().load_async(&mut loader).await?;
    Ok(measure(concurrency, duration, move |task, i| {
        let mut conn = conn.clone();
        async move {
            let reply: redis::RedisResult<Vec<i64>> = script
                .key(format!("lh:v1:{{bench}}:_decision:raw{task}-{i}"))
                .key(format!("lh:v1:{{bench}}:b-user:raw{}", i % USERS))
                .arg(1000)
                .arg(0)
                // No record (decision_ttl_ms 0): the digest is only checked for shape.
                .arg("00000000000000000000000000000000")
                // No shadow rule.
                .arg(0)
                .arg(RAW_BUCKET[0])
                .arg(RAW_BUCKET[1])
                .arg(RAW_BUCKET[2])
                .arg(1_000)
                .invoke_async(&mut conn)
                .await;
            u64::from(matches!(reply, Ok(v) if v.first() == Some(&1)))
        }
    })
    .await)
}
