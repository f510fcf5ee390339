//! `leasehold bench agent`: Check decisions/s and p50/p99 through a real
//! agent over loopback gRPC, beside the same `multi_rule` EVALSHA sent raw
//! through redis-rs to the same redis-server in the same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use leasehold_proto::agent::v1 as pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_region_agent::memory::SystemClock;
use leasehold_region_agent::policy;
use leasehold_region_agent::redis_store::{RedisStore, RedisStoreConfig};
use leasehold_region_agent::script::ScriptKind;
use leasehold_region_agent::server::{self, AgentSpec};
use leasehold_region_agent::testing::RedisServer;
use leasehold_tls::TlsSettings;
use tonic::transport::Channel;

/// One user rule that never runs dry: every decision takes the allow path.
const POLICY: &str = r#"
version = 1
[[domain]]
name = "bench"
[[domain.rule]]
id = "b-user"
scope = "user"
algorithm = "token_bucket"
capacity = 1000000000
refill = 1000000000
period_ms = 1
fail_mode = "open"
"#;

/// POLICY with decision records and a shadow rule (`--shadow`): the shadow
/// tenant bucket rides in the same multi_rule call as the user rule.
fn shadow_policy() -> String {
    let user = "period_ms = 1\nfail_mode = \"open\"\n";
    assert!(POLICY.contains(user));
    POLICY.replacen(
        user,
        "period_ms = 1\nidempotent_ttl_ms = 60000\nfail_mode = \"open\"\n",
        1,
    ) + r#"[[domain.rule]]
id = "b-shadow"
scope = "tenant"
algorithm = "token_bucket"
capacity = 1000000000
refill = 1000000000
period_ms = 1
shadow = true
fail_mode = "open"
"#
}

/// Most latency samples kept per measurement (bounded memory).
const MAX_SAMPLES: usize = 2_000_000;

pub(crate) struct Run {
    pub(crate) rate: f64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) errors: u64,
}

/// The bench agent on `store`: Region `bench`, one user rule (with
/// `shadow`: recorded, plus a shadow rule), plaintext.
pub(crate) fn bench_spec(store: Arc<RedisStore>, shadow: bool) -> anyhow::Result<AgentSpec> {
    let text = if shadow {
        shadow_policy()
    } else {
        POLICY.to_string()
    };
    let any = "127.0.0.1:0".parse()?;
    Ok(AgentSpec {
        region: "bench".into(),
        listen: any,
        http_listen: any,
        store,
        pepper: b"bench-pepper-0123456789abcdef".to_vec(),
        policy: policy::parse("bench-policy", &text, None).map_err(|e| anyhow::anyhow!("{e}"))?,
        policy_file: None,
        policy_poll: Duration::from_secs(60),
        fallback_max_keys: 1_000,
        clock: Arc::new(SystemClock),
        global: None,
        connector: None,
        listeners: Default::default(),
        limits: Default::default(),
        ratelimit: None,
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
                        id: format!("u{}", i % 10_000),
                    }),
                    ..Default::default()
                }),
                cost: 1,
                policy_version_seen: 0,
            };
            matches!(client.check(request).await, Ok(r) if r.get_ref().allowed)
        }
    })
    .await
}

/// The same agent setup behind mTLS (`grpc_mtls`, certificates from
/// `certs init` in a temporary directory), called as `/gateway/bench`.
async fn checks_over_mtls(
    store: Arc<RedisStore>,
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

pub async fn run(concurrency: usize, seconds: u64, tls: bool, shadow: bool) -> anyhow::Result<()> {
    let redis = RedisServer::start().context("starting a private redis-server")?;
    let store = Arc::new(RedisStore::new(RedisStoreConfig {
        call_deadline: Duration::from_secs(1),
        ..RedisStoreConfig::new(redis.url())
    })?);
    let agent = server::start(bench_spec(store.clone(), shadow)?).await?;
    let client = AgentClient::connect(format!("http://{}", agent.grpc_addr)).await?;
    let duration = Duration::from_secs(seconds);

    let baseline = raw_evalsha(&redis.url(), concurrency, duration).await?;
    let through_agent = checks(client, concurrency, duration).await;
    agent.stop().await;
    let rules = if shadow {
        "one recorded user rule + one shadow rule"
    } else {
        "one user rule"
    };
    println!(
        "leasehold bench agent ({rules}, allow path, {concurrency} callers, same redis-server)"
    );
    print_run("baseline raw multi_rule EVALSHA via redis-rs", &baseline);
    print_run("agent Check over loopback gRPC            ", &through_agent);
    println!(
        "  ratio agent / raw EVALSHA: throughput {:.2}, p50 {:.2}x, p99 {:.2}x",
        through_agent.rate / baseline.rate,
        through_agent.p50_us as f64 / baseline.p50_us.max(1) as f64,
        through_agent.p99_us as f64 / baseline.p99_us.max(1) as f64,
    );
    if tls {
        let over_mtls = checks_over_mtls(store, concurrency, duration).await?;
        print_run("agent Check over loopback gRPC + mTLS     ", &over_mtls);
        println!(
            "  ratio mTLS / plaintext: throughput {:.2}, p50 {:.2}x, p99 {:.2}x",
            over_mtls.rate / through_agent.rate,
            over_mtls.p50_us as f64 / through_agent.p50_us.max(1) as f64,
            over_mtls.p99_us as f64 / through_agent.p99_us.max(1) as f64,
        );
    }
    Ok(())
}

pub(crate) fn print_run(label: &str, run: &Run) {
    println!(
        "  {label}: {:>9.0} decisions/s  p50 {:>6} us  p99 {:>6} us  ({} errors)",
        run.rate, run.p50_us, run.p99_us, run.errors
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
                .key(format!("lh:v1:{{bench}}:b-user:raw{}", i % 10_000))
                .arg(1000)
                .arg(0)
                // No record (decision_ttl_ms 0): the digest is only checked for shape.
                .arg("00000000000000000000000000000000")
                // No shadow rule.
                .arg(0)
                .arg(1_000_000_000_000u64)
                .arg(1_000_000_000_000u64)
                .arg(1)
                .arg(1_000)
                .invoke_async(&mut conn)
                .await;
            matches!(reply, Ok(v) if v.first() == Some(&1))
        }
    })
    .await)
}

pub(crate) async fn measure<F, Fut>(concurrency: usize, duration: Duration, call: F) -> Run
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let call = Arc::new(call);
    let until = Instant::now() + duration;
    let started = Instant::now();
    let per_task = MAX_SAMPLES / concurrency.max(1);
    let mut tasks = Vec::new();
    for task in 0..concurrency {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let (mut samples, mut ok, mut errors, mut i) = (Vec::new(), 0u64, 0u64, 0u64);
            while Instant::now() < until {
                let t0 = Instant::now();
                let good = call(task, i).await;
                if samples.len() < per_task {
                    samples.push(t0.elapsed().as_micros() as u64);
                }
                if good {
                    ok += 1
                } else {
                    errors += 1
                }
                i += 1;
            }
            (samples, ok, errors)
        }));
    }
    let (mut all, mut ok, mut errors) = (Vec::new(), 0, 0);
    for task in tasks {
        if let Ok((samples, o, e)) = task.await {
            all.extend(samples);
            ok += o;
            errors += e;
        }
    }
    all.sort_unstable();
    let pick = |q: f64| {
        all.get(((all.len() as f64 * q) as usize).min(all.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    Run {
        rate: ok as f64 / started.elapsed().as_secs_f64(),
        p50_us: pick(0.50),
        p99_us: pick(0.99),
        errors,
    }
}
