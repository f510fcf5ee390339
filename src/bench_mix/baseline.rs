//! The two RLS servers the mix's goals compare the agent against, minimal
//! on purpose (no leasing, no cache, no coalescing, no metrics):
//!
//! - [`RedisRls`]: one `token_bucket` EVALSHA (the agent's own cold-key
//!   script, so the Lua cost per decision is the same) per rule the
//!   request's descriptor names — tenant, (tenant, route), client IP — the
//!   three sent in one pipelined round trip, as envoyproxy/ratelimit sends
//!   one counter per descriptor entry in one pipeline. Each bucket is
//!   charged on its own (not all-or-nothing).
//! - [`MemoryRls`]: the same three token buckets in an in-process map,
//!   sharded under mutexes: the agent CPU of a tonic RLS server whose
//!   decision costs almost nothing.
//!
//! Both read the mix's descriptor (`tenant`, `route_group`,
//! `remote_address`, `class`) and answer `OK` when all three admit.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use leasehold_region_agent::store::script::ScriptKind;
use tonic::{Request, Response, Status};

use super::workload::{Limit, CLIENT_LIMIT, FLAGGED_LIMIT, ROUTE_LIMIT, TENANT_LIMIT};

/// The three buckets a mix descriptor names: (key, limit).
fn buckets(request: &RateLimitRequest) -> Result<[(String, Limit); 3], Status> {
    let descriptor = request
        .descriptors
        .first()
        .ok_or_else(|| Status::invalid_argument("no descriptor"))?;
    let entry = |name: &str| {
        descriptor
            .entries
            .iter()
            .find(|e| e.key == name)
            .map(|e| e.value.as_str())
            .ok_or_else(|| Status::invalid_argument(format!("no {name} entry")))
    };
    let (tenant, route, ip) = (
        entry("tenant")?,
        entry("route_group")?,
        entry("remote_address")?,
    );
    let client = if entry("class")? == "flagged" {
        FLAGGED_LIMIT
    } else {
        CLIENT_LIMIT
    };
    Ok([
        (format!("base:{tenant}"), TENANT_LIMIT),
        (format!("base:{tenant}:{route}"), ROUTE_LIMIT),
        (format!("base:{tenant}:ip:{ip}"), client),
    ])
}

fn answer(admitted: bool) -> RateLimitResponse {
    let code = (if admitted { Code::Ok } else { Code::OverLimit }) as i32;
    RateLimitResponse {
        overall_code: code,
        statuses: vec![DescriptorStatus {
            code,
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// One token_bucket EVALSHA per bucket, pipelined.
pub(crate) struct RedisRls {
    conn: redis::aio::MultiplexedConnection,
    sha: String,
}

impl RedisRls {
    pub(crate) async fn connect(url: &str) -> anyhow::Result<Self> {
        let client = redis::Client::open(url)?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let sha = ScriptKind::TokenBucket
            .script()
            .prepare_invoke()
            .load_async(&mut conn)
            .await?;
        Ok(RedisRls { conn, sha })
    }
}

#[tonic::async_trait]
impl RateLimitService for RedisRls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let buckets = buckets(request.get_ref())?;
        let mut pipe = redis::pipe();
        for (key, limit) in &buckets {
            // capacity, refill (millitokens), period_ms, cost, slack_ms
            pipe.cmd("EVALSHA")
                .arg(&self.sha)
                .arg(1)
                .arg(key)
                .arg(limit.capacity * 1_000)
                .arg(limit.per_s * 1_000)
                .arg(1_000)
                .arg(1_000)
                .arg(0);
        }
        let mut conn = self.conn.clone();
        let replies: Vec<Vec<i64>> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| Status::unavailable(e.to_string()))?;
        let admitted = replies.len() == 3 && replies.iter().all(|r| r.first() == Some(&1));
        Ok(Response::new(answer(admitted)))
    }
}

/// Buckets per shard at most: a new bucket past it is decided full and not
/// kept (memory stays bounded; the mix touches far fewer).
const SHARD_KEYS_MAX: usize = 200_000;
const SHARDS: usize = 16;

/// A bucket's tokens and when they were counted (ms since start).
struct Bucket {
    tokens: f64,
    at_ms: f64,
}

/// The three token buckets in memory.
pub(crate) struct MemoryRls {
    shards: Vec<Mutex<HashMap<String, Bucket>>>,
    hasher: RandomState,
    started: Instant,
}

impl MemoryRls {
    pub(crate) fn new() -> Self {
        MemoryRls {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            hasher: RandomState::new(),
            started: Instant::now(),
        }
    }

    fn take(&self, key: String, limit: Limit, now_ms: f64) -> bool {
        let shard = &self.shards[self.hasher.hash_one(&key) as usize % SHARDS];
        // A poisoned shard only means a panic elsewhere mid-update: the
        // bucket's numbers are still numbers.
        let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
        let full = shard.len() >= SHARD_KEYS_MAX;
        let capacity = limit.capacity as f64;
        if !shard.contains_key(&key) {
            if full {
                return capacity >= 1.0;
            }
            shard.insert(
                key.clone(),
                Bucket {
                    tokens: capacity,
                    at_ms: now_ms,
                },
            );
        }
        let Some(bucket) = shard.get_mut(&key) else {
            return false;
        };
        let refilled = (now_ms - bucket.at_ms).max(0.0) * limit.per_s as f64 / 1_000.0;
        bucket.tokens = (bucket.tokens + refilled).min(capacity);
        bucket.at_ms = now_ms;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[tonic::async_trait]
impl RateLimitService for MemoryRls {
    async fn should_rate_limit(
        &self,
        request: Request<RateLimitRequest>,
    ) -> Result<Response<RateLimitResponse>, Status> {
        let now_ms = self.started.elapsed().as_secs_f64() * 1_000.0;
        let mut admitted = true;
        for (key, limit) in buckets(request.get_ref())? {
            admitted &= self.take(key, limit, now_ms);
        }
        Ok(Response::new(answer(admitted)))
    }
}

/// Serves `service` on a fresh loopback port (on the current runtime) until
/// the returned task is aborted.
pub(crate) async fn serve<S: RateLimitService>(
    service: S,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
    let task = tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .add_service(RateLimitServiceServer::new(service))
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = served {
            eprintln!("baseline RLS server stopped: {e}");
        }
    });
    Ok((addr, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_bucket_admits_its_capacity_then_its_refill() {
        let rls = MemoryRls::new();
        let admitted = (0..10)
            .filter(|_| rls.take("k".into(), FLAGGED_LIMIT, 0.0))
            .count();
        assert_eq!(admitted as u64, FLAGGED_LIMIT.capacity);
        // One second later: one more token (1 a second).
        assert!(rls.take("k".into(), FLAGGED_LIMIT, 1_000.0));
        assert!(!rls.take("k".into(), FLAGGED_LIMIT, 1_000.0));
    }
}
