//! `leasehold lease list`: blocks leased per rule and Region, from each
//! agent's Status, read as `sre` under mTLS with each agent pinned to the
//! Region its `--agent region/<r>@host:port` names ([`crate::pinning`]).

use crate::render::{self, View};
use clap::Subcommand;
use leasehold_tls::{ExpectedPeer, Identity, TlsSettings};

use crate::allocator_cli::{now_ms, TlsArgs};
use crate::pinning::parse_agent;

/// The agents of deploy/regions/agent-{eu,us,ap}.toml, each pinned.
pub const DEFAULT_AGENTS: &str =
    "region/eu@127.0.0.1:7101,region/us@127.0.0.1:7102,region/ap@127.0.0.1:7103";

#[derive(Subcommand)]
pub enum LeaseCommand {
    /// Blocks leased per leased rule and Region, from each agent's Status
    /// (read as `sre` under mTLS).
    List {
        /// Region agents' gRPC addresses, `region/<r>@host:port` (with
        /// mTLS the agent must present `/region/<r>`) or `host:port`
        /// (plaintext only).
        #[arg(long, value_delimiter = ',', default_value = DEFAULT_AGENTS)]
        agent: Vec<String>,
        #[command(flatten)]
        tls: TlsArgs,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Print raw integers (no thousands separators).
        #[arg(long)]
        raw: bool,
    },
}

/// Bound on one agent's Status call.
const AGENT_CALL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
/// Most agents one `lease list` asks.
const MAX_AGENTS: usize = 64;

pub async fn lease(command: LeaseCommand) -> anyhow::Result<()> {
    let LeaseCommand::List {
        agent,
        tls,
        json,
        raw,
    } = command;
    if agent.is_empty() || agent.len() > MAX_AGENTS {
        anyhow::bail!("--agent: 1 to {MAX_AGENTS} addresses");
    }
    let settings = tls.settings("sre");
    let mut agents = Vec::with_capacity(agent.len());
    for text in &agent {
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
    // Every agent at once (each call bounded), answers in --agent order.
    let asks: Vec<_> = agents
        .iter()
        .map(|(region, address)| {
            let (address, settings) = (address.clone(), settings.clone());
            let region = region.clone();
            tokio::spawn(async move { agent_status(&address, region, settings.as_ref()).await })
        })
        .collect();
    let mut answers = Vec::with_capacity(asks.len());
    for ((_, address), ask) in agents.iter().zip(asks) {
        let status = match ask.await {
            Ok(result) => result.map_err(|e| format!("{e:#}")),
            Err(error) => Err(format!("the call failed: {error}")),
        };
        answers.push(render::AgentAnswer {
            address: address.clone(),
            status,
        });
    }
    let view = View::from_flags(json, raw, now_ms());
    print!("{}", render::lease_list(&answers, &view));
    if answers.iter().all(|a| a.status.is_err()) {
        return Err(tls.explain(anyhow::anyhow!("lease list: no agent answered")));
    }
    Ok(())
}

/// One agent's Status, as `sre` over mTLS when configured (the agent
/// verified as exactly `/region/<region>`), plaintext otherwise.
async fn agent_status(
    address: &str,
    region: Option<String>,
    tls: Option<&TlsSettings>,
) -> anyhow::Result<leasehold_proto::agent::v1::StatusResponse> {
    use leasehold_proto::agent::v1 as agent_pb;
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
    let mut client = agent_pb::agent_client::AgentClient::new(channel);
    let reply = tokio::time::timeout(
        AGENT_CALL_TIMEOUT,
        client.status(agent_pb::StatusRequest {}),
    )
    .await
    .map_err(|_| anyhow::anyhow!("no answer within {} s", AGENT_CALL_TIMEOUT.as_secs()))?
    .map_err(|status| anyhow::anyhow!("{:?}: {}", status.code(), status.message()))?;
    Ok(reply.into_inner())
}
