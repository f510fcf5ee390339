//! `leasehold agent`: run a Region agent (`--config`), or read agents as an
//! operator — `agent status` (policy, store breakers, fallback counters,
//! global pools, blocks leased since start) — and the calls `lease list`
//! shares: each `--agent region/<r>@host:port` asked at once, as `sre`
//! under mTLS with the agent pinned to the Region it names
//! ([`crate::pinning`]), every call bounded.

use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use leasehold_proto::agent::v1 as agent_pb;
use leasehold_proto::agent::v1::agent_client::AgentClient;
use leasehold_tls::{ExpectedPeer, Identity, TlsSettings};
use tonic::transport::Channel;

use crate::allocator_cli::{now_ms, TlsArgs};
use crate::pinning::parse_agent;
use crate::render::{self, View};

/// The agents of deploy/regions/agent-{eu,us,ap}.toml, each pinned.
pub const DEFAULT_AGENTS: &str =
    "region/eu@127.0.0.1:7101,region/us@127.0.0.1:7102,region/ap@127.0.0.1:7103";

/// Bound on one agent's call (connect included).
pub const AGENT_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// Most agents one command asks.
pub const MAX_AGENTS: usize = 64;

#[derive(Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct AgentArgs {
    /// Run an agent with this config file (see deploy/regions/agent-eu.toml).
    #[arg(long, required = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Option<AgentCommand>,
}

#[derive(Subcommand)]
pub enum AgentCommand {
    /// Each agent's Status: policy in force, store breakers, fallback and
    /// shadow counters, global pools, and blocks leased per rule since the
    /// agent started (read as `sre` under mTLS).
    Status {
        #[command(flatten)]
        agents: AgentsArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Print raw integers (no thousands separators).
        #[arg(long)]
        raw: bool,
    },
}

/// Which agents to ask, and how.
#[derive(Args)]
pub struct AgentsArgs {
    /// Region agents' gRPC addresses, `region/<r>@host:port` (with mTLS
    /// the agent must present `/region/<r>`) or `host:port` (plaintext
    /// only).
    #[arg(long, value_delimiter = ',', default_value = DEFAULT_AGENTS)]
    pub agent: Vec<String>,
    #[command(flatten)]
    pub tls: TlsArgs,
}

/// One agent's answer, or why there is none (shown, never fatal alone).
pub struct AgentAnswer<T> {
    pub address: String,
    pub answer: Result<T, String>,
}

/// Asks every agent at once with `call` (each bounded by
/// [`AGENT_CALL_TIMEOUT`]); answers in `--agent` order. Bad `--agent`
/// values are refused before any call.
pub async fn ask_agents<T, F, Fut>(
    args: &AgentsArgs,
    call: F,
) -> anyhow::Result<Vec<AgentAnswer<T>>>
where
    T: Send + 'static,
    F: Fn(AgentClient<Channel>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<T, tonic::Status>> + Send + 'static,
{
    if args.agent.is_empty() || args.agent.len() > MAX_AGENTS {
        anyhow::bail!("--agent: 1 to {MAX_AGENTS} addresses");
    }
    let settings = args.tls.settings("sre");
    let mut agents = Vec::with_capacity(args.agent.len());
    for text in &args.agent {
        let (region, address) = parse_agent(text)?;
        if settings.is_some() && region.is_none() {
            anyhow::bail!(
                "--agent: \"{}\" names no Region: with mTLS write region/<r>@host:port (only \
                 that Region's agent certificate is then accepted there)",
                leasehold_logging::quote(text)
            );
        }
        agents.push((region, address));
    }
    let asks: Vec<_> = agents
        .iter()
        .map(|(region, address)| {
            let (address, region) = (address.clone(), region.clone());
            let (settings, call) = (settings.clone(), call.clone());
            tokio::spawn(async move {
                let client = agent_client(&address, region, settings.as_ref())?;
                tokio::time::timeout(AGENT_CALL_TIMEOUT, call(client))
                    .await
                    .map_err(|_| {
                        anyhow::anyhow!("no answer within {} s", AGENT_CALL_TIMEOUT.as_secs())
                    })?
                    .map_err(|status| anyhow::anyhow!("{:?}: {}", status.code(), status.message()))
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(asks.len());
    for ((_, address), ask) in agents.iter().zip(asks) {
        let answer = match ask.await {
            Ok(result) => result.map_err(|e| format!("{e:#}")),
            Err(error) => Err(format!("the call failed: {error}")),
        };
        answers.push(AgentAnswer {
            address: address.clone(),
            answer,
        });
    }
    Ok(answers)
}

/// A client of one agent, as `sre` over mTLS when configured (the agent
/// verified as exactly `/region/<region>`), plaintext otherwise. Lazy: the
/// call's own timeout bounds the connect.
fn agent_client(
    address: &str,
    region: Option<String>,
    tls: Option<&TlsSettings>,
) -> anyhow::Result<AgentClient<Channel>> {
    let channel = match (tls, region) {
        (Some(tls), Some(region)) => {
            let connector = leasehold_tls::TlsConnector::new(tls.files(), &tls.trust_domain)
                .map_err(|e| anyhow::anyhow!("--tls-dir/--cert: {e}"))?;
            leasehold_tls::lazy_channel(
                address,
                connector,
                ExpectedPeer::Identity(Identity::Region(region)),
                AGENT_CALL_TIMEOUT,
            )?
        }
        (Some(_), None) => anyhow::bail!("--agent {address}: no Region named"),
        (None, _) => tonic::transport::Endpoint::from_shared(format!("http://{address}"))?
            .connect_timeout(AGENT_CALL_TIMEOUT)
            .connect_lazy(),
    };
    Ok(AgentClient::new(channel))
}

/// `leasehold agent status`.
pub async fn status(agents: AgentsArgs, json: bool, raw: bool) -> anyhow::Result<()> {
    let answers = ask_agents(&agents, |mut client| async move {
        client
            .status(agent_pb::StatusRequest {})
            .await
            .map(tonic::Response::into_inner)
    })
    .await?;
    let view = View::from_flags(json, raw, now_ms());
    print!("{}", render::agent_status(&answers, &view));
    if answers.iter().all(|a| a.answer.is_err()) {
        return Err(agents
            .tls
            .explain(anyhow::anyhow!("agent status: no agent answered")));
    }
    Ok(())
}
