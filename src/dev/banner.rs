//! The banner `leasehold dev` prints once everything answers: the
//! addresses, and the commands to try with the right certificates.

use std::fmt::Write as _;
use std::path::Path;

use super::*;

pub(super) fn print_banner(layout: &Layout, dir: &Path, args: &DevArgs) {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "leasehold dev: 3 allocator nodes + {} Region agents on loopback (data in {}, removed on exit)",
        layout.agents.len(),
        dir.display()
    );
    for (id, address) in &layout.nodes {
        let _ = writeln!(
            out,
            "  allocator {id}  {address}  leasehold.allocator.v1 + raft  HTTP {} (/metrics)",
            metrics_address(*address)
        );
    }
    for agent in &layout.agents {
        let store = match (&agent.redis_cluster, &agent.redis_url) {
            (Some(seeds), _) => format!(
                "Redis Cluster {} (+{} more nodes)",
                seeds.first().map_or("", String::as_str),
                seeds.len().saturating_sub(1)
            ),
            (None, Some(url)) => url.clone(),
            (None, None) => "in-memory".to_string(),
        };
        let name = match &agent.agent_id {
            Some(id) => id.clone(),
            None => agent.region.to_string(),
        };
        let _ = writeln!(
            out,
            "  agent {name:<5}   gRPC {} (leasehold.agent.v1 + Envoy RLS)  HTTP {} (/health, /metrics)  store {store}",
            agent.grpc, agent.http
        );
    }
    if args.cluster {
        let _ = writeln!(
            out,
            "  each Region: two agents on one Redis Cluster; one of them (the syncer, `leasehold_syncer` 1) talks to the allocator"
        );
    }
    let _ = writeln!(
        out,
        "  pools {RATE_POOL} (rate, two_signal), {WINDOW_POOL} (window) and edge-rate (rate) from deploy/regions/allocator-pools.toml;\n  \
         policy deploy/policies/dev.toml (domains api, pooled), copied to {} (raise `version` there to hot-reload);\n  \
         envoyproxy/ratelimit YAML deploy/ratelimit/edge.yaml (domain edge), copied to {}",
        dir.join("dev-policy.toml").display(),
        dir.join("ratelimit").display()
    );
    let mut target = if args.port_offset == 0 {
        String::new()
    } else {
        format!(" --allocator {}", layout.allocator_list().join(","))
    };
    match &layout.certs {
        Some(certs) => {
            let _ = writeln!(
                out,
                "  mTLS on every listener: certificates in {} (trust domain {DEV_TRUST_DOMAIN}; the CLI reads as sre, changes as admin)",
                certs.display()
            );
            let _ = write!(target, " --tls-dir {}", certs.display());
        }
        None => {
            let _ = writeln!(
                out,
                "  PLAINTEXT (--plaintext): no call to any listener is authenticated"
            );
        }
    }
    let eu = &layout.agents[0];
    // Under mTLS curl and grpcurl present the sre and gateway certificates.
    let (curl, gateway_curl, grpcurl, scheme) = match &layout.certs {
        Some(certs) => {
            let file = |name: &str| certs.join(name).display().to_string();
            (
                format!(
                    "curl -s --cacert {} --cert {} --key {}",
                    file("ca.pem"),
                    file("sre.pem"),
                    file("sre.key")
                ),
                format!(
                    "curl -s --cacert {} --cert {} --key {}",
                    file("ca.pem"),
                    file("gateway-eu.pem"),
                    file("gateway-eu.key")
                ),
                format!(
                    "grpcurl -cacert {} -cert {} -key {}",
                    file("ca.pem"),
                    file("gateway-eu.pem"),
                    file("gateway-eu.key")
                ),
                "https",
            )
        }
        None => (
            "curl -s".to_string(),
            "curl -s".to_string(),
            "grpcurl -plaintext".to_string(),
            "http",
        ),
    };
    // `lease list` and `agent status` ask the agents (as sre).
    let mut agents = if args.port_offset == 0 {
        String::new()
    } else {
        let list: Vec<String> = layout
            .agents
            .iter()
            .map(|a| format!("region/{}@{}", a.region, a.grpc))
            .collect();
        format!(" --agent {}", list.join(","))
    };
    if let Some(certs) = &layout.certs {
        let _ = write!(agents, " --tls-dir {}", certs.display());
    }
    let _ = write!(
        out,
        "\nTry (another terminal; `cargo run --release --` instead of `leasehold` from a checkout):\n  \
         leasehold pool show {RATE_POOL}{target}\n  \
         leasehold region list{target}\n  \
         leasehold grant list {WINDOW_POOL}{target}\n  \
         leasehold lease list{agents}\n  \
         leasehold agent status{agents}\n  \
         leasehold usage show demo{agents}   (after the Check below: counted within 5 s)\n  \
         {curl} {scheme}://{http}/health\n  \
         {curl} {scheme}://{http}/metrics | grep leasehold_global\n  \
         {grpcurl} -import-path crates/proto/proto -proto leasehold/agent/v1/agent.proto \\\n    \
         -d '{{\"request_id\":\"try-1\",\"target\":{{\"domain\":\"pooled\",\"tenant\":\"demo\",\"route_group\":\"rate\"}},\"cost\":1}}' \\\n    \
         {grpc} leasehold.agent.v1.Agent/Check\n  \
         {gateway_curl} {scheme}://{http}/json \\\n    \
         -d '{{\"domain\":\"edge\",\"descriptors\":[{{\"entries\":[{{\"key\":\"remote_address\",\"value\":\"10.0.0.1\"}}]}}]}}'\n  \
         (Envoy's RLS answers domain edge from deploy/ratelimit/edge.yaml, envoyproxy/ratelimit's format)\n\
         Ctrl-C stops everything.\n",
        http = eu.http,
        grpc = eu.grpc,
    );
    print!("{out}");
}
