//! Reads the totals of the keys quotas follow ([`super::totals`]), every
//! `[metering] quota_refresh_ms`: from the allocator's roll-up of every
//! Region when the agent has `[global]` (one `UsageTotals` per 1,000
//! keys, a follower's state accepted), else from the Region's store (one
//! `usage_read` per key, 1,000 to a batch). A failed read keeps the last
//! totals; their age is part of each verdict's lateness.

use leasehold_allocator_client::client::{AllocatorClient, ClientError};
use leasehold_proto::allocator::v1 as pb;

use super::totals::{QuotaKey, QuotaTotals, ReadTotal};
use crate::key::{KeyBuilder, Tenant};
use crate::meter::definition::Meters;
use crate::meter::record::{read, read_call};
use crate::store::{BucketStore, StoreError};

/// Keys one read carries at most.
pub const MAX_KEYS_PER_READ: usize = 1_000;

/// Where the totals come from.
pub enum QuotaSource<'a> {
    /// Every Region's, rolled up (`[global]`).
    Allocator(&'a AllocatorClient),
    /// This Region's only.
    Store(&'a dyn BucketStore, &'a KeyBuilder),
}

#[derive(Debug, thiserror::Error)]
pub enum RefreshError {
    #[error("allocator: {0}")]
    Allocator(#[from] ClientError),
    #[error("store: {0}")]
    Store(#[from] StoreError),
}

/// One key to read: the key and the label of its meter's period now.
struct Due {
    key: QuotaKey,
    tenant: Tenant,
    period: crate::meter::period::Period,
}

/// Reads every followed key's total of the period holding `now_ms`;
/// returns how many were stored. Keys whose meter the policy no longer
/// declares are skipped.
pub async fn refresh(
    totals: &QuotaTotals,
    meters: &Meters,
    source: &QuotaSource<'_>,
    now_ms: i64,
) -> Result<usize, RefreshError> {
    let due: Vec<Due> = totals
        .followed(now_ms)
        .into_iter()
        .filter_map(|key| {
            let calendar = meters.get(&key.1)?.calendar().ok()?;
            let period = calendar.period_at(now_ms).ok()?;
            let tenant = Tenant::parse(&key.0).ok()?;
            Some(Due {
                key,
                tenant,
                period,
            })
        })
        .collect();
    let mut stored = 0;
    for chunk in due.chunks(MAX_KEYS_PER_READ) {
        let costs = match source {
            QuotaSource::Allocator(client) => from_allocator(client, chunk).await?,
            QuotaSource::Store(store, keys) => from_store(*store, keys, chunk).await?,
        };
        for (one, cost) in chunk.iter().zip(costs) {
            totals.store(
                one.key.clone(),
                ReadTotal {
                    period: one.period.label.clone(),
                    cost,
                    read_at_ms: now_ms,
                },
            );
            stored += 1;
        }
    }
    Ok(stored)
}

async fn from_allocator(client: &AllocatorClient, due: &[Due]) -> Result<Vec<u64>, ClientError> {
    let reply = client
        .usage_totals(pb::UsageTotalsRequest {
            keys: due
                .iter()
                .map(|one| pb::UsageKey {
                    tenant: one.key.0.clone(),
                    meter: one.key.1.clone(),
                    period: one.period.label.clone(),
                })
                .collect(),
            allow_stale: true,
            ..Default::default()
        })
        .await?;
    Ok(due
        .iter()
        .map(|one| {
            reply
                .usage
                .iter()
                .find(|u| {
                    u.tenant == one.key.0 && u.meter == one.key.1 && u.period == one.period.label
                })
                .map_or(0, |u| u.cost)
        })
        .collect())
}

async fn from_store(
    store: &dyn BucketStore,
    keys: &KeyBuilder,
    due: &[Due],
) -> Result<Vec<u64>, StoreError> {
    let calls: Vec<_> = due
        .iter()
        .map(|one| read_call(keys, &one.tenant, &one.key.1, &one.period))
        .collect();
    let mut costs = Vec::with_capacity(due.len());
    for reply in store.run_batch(&calls).await {
        let (total, _) = read(&reply?).map_err(StoreError::Script)?;
        costs.push(total.cost);
    }
    Ok(costs)
}
