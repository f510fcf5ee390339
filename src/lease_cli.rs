//! `leasehold lease list`: the outstanding block leases of each Region, per
//! rule and holder, from the lease records in the Region's store (each
//! agent's ListLeases, read as `sre` under mTLS with each agent pinned to
//! the Region its `--agent region/<r>@host:port` names). The blocks each
//! agent leased since it started are counters of `leasehold agent status`.

use clap::Subcommand;
use leasehold_proto::agent::v1 as agent_pb;

use crate::agent_cli::{ask_agents, AgentsArgs};
use crate::allocator_cli::now_ms;
use crate::render::{self, View};

/// Most leases one agent lists (the agent's own cap).
pub const MAX_LEASES: u32 = 10_000;

#[derive(Subcommand)]
pub enum LeaseCommand {
    /// Outstanding block leases per rule and holder, with tokens, expiry
    /// and totals, from each agent's lease records (ListLeases, read as
    /// `sre` under mTLS). At most --limit leases per agent, a bounded
    /// scan of the store (2 s); the output says when it was cut short.
    List {
        #[command(flatten)]
        agents: AgentsArgs,
        /// Only leases of this rule id.
        #[arg(long)]
        rule: Option<String>,
        /// Only leases of this domain.
        #[arg(long)]
        domain: Option<String>,
        /// Only leases held by this identity: `gateway/<region>`,
        /// `anonymous` (taken on a plaintext listener) or `agent/<id>`.
        #[arg(long)]
        holder: Option<String>,
        /// Also list blocks already given back (their records live on for
        /// 30 s after the grant).
        #[arg(long)]
        include_returned: bool,
        /// Most leases listed per agent, 1 to 10000.
        #[arg(long, default_value_t = MAX_LEASES,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_LEASES)))]
        limit: u32,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Print raw integers and epoch milliseconds.
        #[arg(long)]
        raw: bool,
    },
}

pub async fn lease(command: LeaseCommand) -> anyhow::Result<()> {
    let LeaseCommand::List {
        agents,
        rule,
        domain,
        holder,
        include_returned,
        limit,
        json,
        raw,
    } = command;
    let request = agent_pb::ListLeasesRequest {
        domain: domain.unwrap_or_default(),
        rule_id: rule.unwrap_or_default(),
        holder: holder.unwrap_or_default(),
        include_returned,
        max_leases: limit,
    };
    let answers = ask_agents(&agents, move |mut client| {
        let request = request.clone();
        async move {
            client
                .list_leases(request)
                .await
                .map(tonic::Response::into_inner)
        }
    })
    .await?;
    let view = View::from_flags(json, raw, now_ms());
    print!("{}", render::lease_list(&answers, &view));
    if answers.iter().all(|a| a.answer.is_err()) {
        return Err(agents
            .tls
            .explain(anyhow::anyhow!("lease list: no agent answered")));
    }
    Ok(())
}
