//! `leasehold usage show TENANT`: a tenant's metered usage per Region and
//! meter in one calendar period (issue 30), from each `--agent`'s
//! ReadUsage (read as `sre` under mTLS, each agent pinned to its Region),
//! or with `--allocator` from the allocator's roll-up of every Region.
//! Reading charges nothing.

use clap::Subcommand;
use leasehold_proto::agent::v1 as agent_pb;

use std::collections::BTreeMap;

use leasehold_proto::allocator::v1 as alloc_pb;

use crate::agent_cli::{ask_agents, AgentAnswer, AgentsArgs};
use crate::allocator_cli::{now_ms, operator_settings};
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
        /// Read every Region's totals from the allocator's roll-up (these
        /// nodes, any of them) instead of the agents.
        #[arg(long, value_delimiter = ',')]
        allocator: Vec<String>,
        /// With --allocator: accept a node's applied state without a
        /// linearizable read (works without a leader).
        #[arg(long, requires = "allocator")]
        stale: bool,
    },
}

/// The allocator's roll-up of `tenant`, one answer per Region in the
/// agents' shape (so it prints the same way). A Region's figure is as late
/// as its last report, plus a sender's flush and a report interval.
async fn from_allocator(
    agents: &AgentsArgs,
    allocator: &[String],
    request: &agent_pb::ReadUsageRequest,
    stale: bool,
) -> anyhow::Result<Vec<AgentAnswer<agent_pb::ReadUsageResponse>>> {
    let client = agents.tls.client(allocator, operator_settings(), "sre")?;
    let reply = client
        .usage_totals(alloc_pb::UsageTotalsRequest {
            keys: Vec::new(),
            tenant: request.tenant.clone(),
            meter: request.meter.clone(),
            period: request.period.clone(),
            allow_stale: stale,
        })
        .await
        .map_err(|e| agents.tls.explain(anyhow::anyhow!("usage show: {e}")))?;
    let flush_ms = leasehold_client::config::USAGE_FLUSH_MS as i64;
    let read_at_ms = reply.applied_time_ms as i64;
    let mut regions: BTreeMap<String, agent_pb::ReadUsageResponse> = BTreeMap::new();
    for region in &reply.reported {
        regions.insert(
            region.region.clone(),
            agent_pb::ReadUsageResponse {
                tenant: request.tenant.clone(),
                region: region.region.clone(),
                read_at_ms,
                // Its senders' flush, then its agents' report interval.
                agent_lag_ms: (read_at_ms - region.reported_at_ms as i64).max(0) + 2 * flush_ms,
                ..Default::default()
            },
        );
    }
    for key in &reply.usage {
        for total in &key.regions {
            let Some(answer) = regions.get_mut(&total.region) else {
                continue;
            };
            answer.meters.push(agent_pb::MeterUsage {
                meter: key.meter.clone(),
                period: key.period.clone(),
                period_start_ms: 0,
                period_end_ms: key.period_end_ms as i64,
                time_zone: String::new(),
                requests: total.requests,
                cost: total.cost,
                // The allocator does not hold the policy.
                quota_limit: None,
            });
        }
    }
    if reply.truncated {
        eprintln!(
            "usage show: more than 1,000 (meter, period) rows: narrow with --meter or --period"
        );
    }
    let origin = if reply.stale {
        "allocator (STALE)"
    } else {
        "allocator"
    };
    Ok(regions
        .into_values()
        .filter(|answer| !answer.meters.is_empty())
        .map(|answer| AgentAnswer {
            address: origin.to_string(),
            answer: Ok(answer),
        })
        .collect())
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
        allocator,
        stale,
    } = command;
    let request = agent_pb::ReadUsageRequest {
        tenant,
        meter: meter.unwrap_or_default(),
        period: period.unwrap_or_default(),
    };
    let format = match (json, csv, raw) {
        (true, _, _) => UsageFormat::Json,
        (_, true, _) => UsageFormat::Csv,
        (_, _, true) => UsageFormat::Raw,
        _ => UsageFormat::Human,
    };
    if !allocator.is_empty() {
        let answers = from_allocator(&agents, &allocator, &request, stale).await?;
        print!("{}", render::usage_show(&answers, format, now_ms()));
        return Ok(());
    }
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
    print!("{}", render::usage_show(&answers, format, now_ms()));
    if answers.iter().all(|a| a.answer.is_err()) {
        return Err(agents
            .tls
            .explain(anyhow::anyhow!("usage show: no agent answered")));
    }
    Ok(())
}
