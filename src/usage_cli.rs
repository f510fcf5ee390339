//! `leasehold usage show TENANT`: a tenant's metered usage per Region and
//! meter in one calendar period (issue 30), from each `--agent`'s
//! ReadUsage (read as `sre` under mTLS, each agent pinned to its Region).
//! Reading charges nothing.

use clap::Subcommand;
use leasehold_proto::agent::v1 as agent_pb;

use crate::agent_cli::{ask_agents, AgentsArgs};
use crate::allocator_cli::now_ms;
use crate::render::{self, UsageFormat};

#[derive(Subcommand)]
pub enum UsageCommand {
    /// Used requests and cost per Region and meter, the period's start and
    /// reset in the meter's zone, the Regions' total, and how late each
    /// figure may be. Name one agent per Region (agents of one Region read
    /// the same store).
    Show {
        /// The tenant ([a-z0-9-]{1,32}).
        tenant: String,
        #[command(flatten)]
        agents: AgentsArgs,
        /// Only this meter (default: every meter of the policy). Named
        /// `--meter`: `--key` is the mTLS private key in every command.
        #[arg(long)]
        meter: Option<String>,
        /// The period: 2026-11 (month), 2026-W48 (ISO week), 2026-11-30
        /// (day); default: the period now.
        #[arg(long)]
        period: Option<String>,
        /// Print JSON.
        #[arg(long, conflicts_with = "csv")]
        json: bool,
        /// Print CSV (one row per Region and meter).
        #[arg(long)]
        csv: bool,
        /// Print raw integers and epoch milliseconds.
        #[arg(long)]
        raw: bool,
    },
}

pub async fn usage(command: UsageCommand) -> anyhow::Result<()> {
    let UsageCommand::Show {
        tenant,
        agents,
        meter,
        period,
        json,
        csv,
        raw,
    } = command;
    let request = agent_pb::ReadUsageRequest {
        tenant,
        meter: meter.unwrap_or_default(),
        period: period.unwrap_or_default(),
    };
    let answers = ask_agents(&agents, move |mut client| {
        let request = request.clone();
        async move {
            client
                .read_usage(request)
                .await
                .map(tonic::Response::into_inner)
        }
    })
    .await?;
    let format = match (json, csv, raw) {
        (true, _, _) => UsageFormat::Json,
        (_, true, _) => UsageFormat::Csv,
        (_, _, true) => UsageFormat::Raw,
        _ => UsageFormat::Human,
    };
    print!("{}", render::usage_show(&answers, format, now_ms()));
    if answers.iter().all(|a| a.answer.is_err()) {
        return Err(agents
            .tls
            .explain(anyhow::anyhow!("usage show: no agent answered")));
    }
    Ok(())
}
