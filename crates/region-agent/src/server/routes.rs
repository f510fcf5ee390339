//! The agent's routers: the gRPC services (decisions, Envoy RLS, status,
//! policy reload) behind the listener limits and timing, and the HTTP
//! side (`/health`, `/metrics`, `/json`) with its identity checks.

use std::sync::Arc;

use axum::response::IntoResponse;
use axum::routing::get;
use leasehold_proto::agent::v1::agent_server::AgentServer;

use crate::config::{HttpLimits, ListenerLimits};
use crate::decide::Decider;
use crate::envoy::rlqs::service::{RateLimitQuotaServiceServer, RlqsHub, RlqsService};
use crate::envoy::service::{EnvoyRateLimitService, RateLimitServiceServer};
use crate::envoy::yaml_engine::RlsEngine;
use crate::metrics::{breaker_gauge, AGENT_RPC_METHODS};
use crate::service::AgentService;
use leasehold_tls::authz::Method;
use leasehold_tls::gate::Gate;
use leasehold_tls::rpc_timing::Timed;

use super::*;

/// The agent's gRPC services on one router: the native agent API and
/// Envoy's RLS, without listener limits (the simulation's network has no
/// strangers). Serve it on any listener (`serve_with_incoming…`).
pub fn grpc_router(decider: &Arc<Decider>) -> tonic::transport::server::Router {
    tonic::transport::Server::builder()
        .add_service(timed(
            decider,
            AgentServer::new(AgentService::new(decider.clone())),
        ))
        .add_service(timed(
            decider,
            RateLimitServiceServer::new(EnvoyRateLimitService::new(decider.clone())),
        ))
}

/// `service` with a span and latency per call ([`Timed`]): method and
/// code in `leasehold_rpc_duration_seconds`, the agent's Region on the span.
pub(super) fn timed<S>(decider: &Arc<Decider>, service: S) -> Timed<S> {
    Timed::new(
        service,
        AGENT_RPC_METHODS,
        Some(&decider.region),
        Arc::new(decider.metrics.clone()),
    )
}

/// The same services behind `limits` (`[limits]`): concurrency per
/// connection, request timeout, keepalive, streams, header list, message
/// sizes, connection age, and the identity check before decoding. What
/// [`start`] serves.
pub fn limited_grpc_router(
    decider: &Arc<Decider>,
    engine: &Arc<RlsEngine>,
    rlqs: &Arc<RlqsHub>,
    limits: &ListenerLimits,
    gate: Gate,
) -> tonic::transport::server::Router<PreAuthStack> {
    let bytes = limits.grpc_message_bytes();
    limits
        .grpc
        .server()
        .layer(crate::listener_bounds::preauth_layer(
            gate == Gate::Enforced,
        ))
        .add_service(timed(
            decider,
            AgentServer::new(
                AgentService::with_gate(decider.clone(), gate).with_reply_limit(bytes),
            )
            .max_decoding_message_size(bytes)
            .max_encoding_message_size(bytes),
        ))
        .add_service(timed(
            decider,
            RateLimitServiceServer::new(EnvoyRateLimitService::with_engine(
                decider.clone(),
                gate,
                engine.clone(),
            ))
            .max_decoding_message_size(bytes)
            .max_encoding_message_size(bytes),
        ))
        // A stream, not timed per call: it lives as long as its Envoy.
        .add_service(
            RateLimitQuotaServiceServer::new(RlqsService::new(rlqs.clone(), gate))
                .max_decoding_message_size(bytes)
                .max_encoding_message_size(bytes),
        )
}

/// Envoy's RLS and RLQS alone behind `limits`, open (the plaintext
/// loopback listener `rls_listen`).
pub(super) fn rls_only_router(
    decider: &Arc<Decider>,
    engine: &Arc<RlsEngine>,
    rlqs: &Arc<RlqsHub>,
    limits: &ListenerLimits,
) -> tonic::transport::server::Router {
    let bytes = limits.grpc_message_bytes();
    limits
        .grpc
        .server()
        .add_service(timed(
            decider,
            RateLimitServiceServer::new(EnvoyRateLimitService::with_engine(
                decider.clone(),
                Gate::Open,
                engine.clone(),
            ))
            .max_decoding_message_size(bytes)
            .max_encoding_message_size(bytes),
        ))
        .add_service(
            RateLimitQuotaServiceServer::new(RlqsService::new(rlqs.clone(), Gate::Open))
                .max_decoding_message_size(bytes)
                .max_encoding_message_size(bytes),
        )
}

/// The agent's HTTP endpoints: `/metrics` (Prometheus text) and `/health`
/// (JSON, global pools included), with the default body limit.
pub fn http_router(decider: &Arc<Decider>) -> axum::Router {
    http_router_limited(
        decider,
        &Arc::new(RlsEngine::default()),
        &HttpLimits::default(),
    )
}

/// [`http_router`] refusing a request body above `limits.max_body_bytes`
/// (413): by its declared length at once, and for any extractor a handler
/// may add later through axum's `DefaultBodyLimit`.
pub fn http_router_limited(
    decider: &Arc<Decider>,
    engine: &Arc<RlsEngine>,
    limits: &HttpLimits,
) -> axum::Router {
    let for_http = decider.clone();
    let for_health = decider.clone();
    // Authorized before it is reached (HTTPS: as ShouldRateLimit).
    let rls = Arc::new(EnvoyRateLimitService::with_engine(
        decider.clone(),
        Gate::Open,
        engine.clone(),
    ));
    let router = axum::Router::new()
        // upstream ratelimit's liveness probe: 200 `OK` while the agent
        // serves (it always can: from its store or by each rule's fail mode).
        .route("/healthcheck", get(|| async { "OK" }))
        // upstream's `/json`: a protojson RateLimitRequest (any method),
        // answered 200 (OK), 429 (OVER_LIMIT), 400 (a bad body, naming the
        // field), or 503 (store unavailable).
        .route("/json", axum::routing::any(move |body: axum::body::Bytes| {
            let rls = rls.clone();
            async move { json_answer(&rls, &body).await }
        }))
        .route(
            "/metrics",
            get(move || {
                let d = for_http.clone();
                async move {
                    // One series per shard (a cluster: per primary, named
                    // by its first slot); stale shards of an old map go.
                    d.metrics.breaker_state.reset();
                    for shard in d.store.shard_breakers() {
                        d.metrics
                            .breaker_state
                            .with_label_values(&[shard.shard.as_str()])
                            .set(breaker_gauge(shard.state));
                    }
                    d.metrics.local_fallback_keys.set(d.fallback.len() as i64);
                    // The installed version, even before its first decision.
                    d.metrics.set_policy_version(d.policy.current().version);
                    set_global_gauges(&d);
                    d.metrics.render()
                }
            }),
        )
        .route(
            "/health",
            get(move || {
                let d = for_health.clone();
                async move {
                    let h = d.health();
                    let pools: Vec<serde_json::Value> = d
                        .global_pool_status()
                        .into_iter()
                        .map(|p| {
                            serde_json::json!({
                                "pool": p.pool,
                                "kind": p.kind,
                                "mode": p.mode,
                                "incarnation": p.incarnation,
                                "enforced_rate_millitokens_per_s": p.enforced_rate_millitokens_per_s,
                                "available_millitokens": p.available_millitokens,
                            })
                        })
                        .collect();
                    axum::Json(serde_json::json!({
                        "serving": h.serving,
                        "region": h.region,
                        "store_reachable": h.store_reachable,
                        "policy_version": d.policy.current().version,
                        "allocator_reachable": d.global.allocator_reachable(),
                        // Several agents per Region: whether this one is the
                        // syncer (only it calls the allocator); null alone.
                        "syncer": d.global.syncer(),
                        "global_pools": pools,
                    }))
                }
            }),
        );
    leasehold_tls::http::limit_body(router, limits)
}

/// Answers one `/json` body (see [`http_router_limited`]).
pub(super) async fn json_answer(
    rls: &EnvoyRateLimitService,
    body: &[u8],
) -> axum::response::Response {
    use axum::http::StatusCode;
    let request = match crate::envoy::json::request(body) {
        Ok(request) => request,
        Err(error) => {
            return (StatusCode::BAD_REQUEST, format!("Bad Request: {error}\n")).into_response()
        }
    };
    match rls.answer(&request).await {
        Ok(response) => {
            let status = if response.overall_code
                == envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code::OverLimit as i32
            {
                StatusCode::TOO_MANY_REQUESTS
            } else {
                StatusCode::OK
            };
            (status, axum::Json(crate::envoy::json::response(&response))).into_response()
        }
        Err(status) if status.code() == tonic::Code::InvalidArgument => (
            StatusCode::BAD_REQUEST,
            format!("Bad Request: {}\n", status.message()),
        )
            .into_response(),
        Err(status) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", status.message()),
        )
            .into_response(),
    }
}

/// The gRPC health services Envoy and load balancers probe
/// (`grpc.health.v1.Health`): the server ("") and each service, by its
/// proto name and as upstream ratelimit names itself (`ratelimit`). An
/// agent always answers (from its store or by each rule's fail mode), so
/// they are SERVING while it runs. On an mTLS listener only a verified
/// certificate reaches them; they tell nothing but the status.
pub(super) async fn health_service(
) -> tonic_health::pb::health_server::HealthServer<impl tonic_health::pb::health_server::Health> {
    let (reporter, service) = tonic_health::server::health_reporter();
    for name in [
        "ratelimit",
        "envoy.service.ratelimit.v3.RateLimitService",
        "leasehold.agent.v1.Agent",
    ] {
        reporter
            .set_service_status(name, tonic_health::ServingStatus::Serving)
            .await;
    }
    service
}

/// The table's method of an HTTPS path on the agent's listener:
/// `/metrics` is [`Method::HttpMetrics`], `/json` a decision (as the gRPC
/// RLS: the Region's gateways), every other path [`Method::HttpHealth`].
pub(super) fn http_method(path: &str) -> Method {
    match path {
        "/metrics" => Method::HttpMetrics,
        "/json" => Method::ShouldRateLimit,
        _ => Method::HttpHealth,
    }
}
