//! `ListLeases` (`leasehold lease list`): the Region's outstanding block
//! leases, read from the lease records `lease_block.lua` writes — so every
//! agent of a Region answers alike, and a lease survives an agent restart
//! in the listing as it does in the store.
//!
//! A record is listed while it is live on the store's clock (now ≤ its
//! `expires_at_ms`, Redis's rule) and not given back (unless asked for);
//! keys are found with SCAN MATCH on the record prefix
//! ([`LEASE_RECORD_MATCH`], [`crate::store::scan`]). Bounds, each reported
//! as a `truncated` reason: [`MAX_LISTED_LEASES`] leases,
//! [`SCAN_CALLS_PER_SHARD`] SCAN calls of [`KEYS_PER_SCAN_CALL`] per
//! shard, [`LIST_DEADLINE`] in all, and the reply within the listener's
//! message size.
//!
//! Nothing listed is a principal: a record key names the bucket by 16 hex
//! of SHA-256 of its key (itself holding only an HMAC'd principal), the
//! record holds block, instants, holder, domain and rule.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use leasehold_proto::agent::v1 as pb;
use prost::Message;

use crate::algorithm::lease_record::{Label, LeaseRecord};
use crate::decide::{Decider, MILLI};
use crate::key::{check_id, Tenant};
use crate::request::InvalidField;
use crate::store::scan::{Keep, ScanError, ScanRequest, ScannedRecord};

/// The SCAN pattern of every lease record (`KeyBuilder::lease`).
pub const LEASE_RECORD_MATCH: &str = "lh:v1:{*}:_lease:*";
/// Most leases one reply lists (and the default).
pub const MAX_LISTED_LEASES: u32 = 10_000;
/// SCAN calls per shard at most: with [`KEYS_PER_SCAN_CALL`], a million
/// keys walked per shard.
pub const SCAN_CALLS_PER_SHARD: usize = 1_000;
/// SCAN's COUNT: each call holds Redis for about a millisecond.
pub const KEYS_PER_SCAN_CALL: usize = 1_000;
/// The whole listing's deadline, far below the listener's request timeout.
pub const LIST_DEADLINE: Duration = Duration::from_secs(2);
/// Room kept in the reply for its other fields (shard errors are capped).
const REPLY_HEADROOM_BYTES: usize = 8_192;
/// Shard error lines in a reply at most (a cluster has up to 256 primaries).
const MAX_SHARD_ERRORS: usize = 16;

/// Why ListLeases answered no listing.
#[derive(Debug, thiserror::Error)]
pub enum ListLeasesError {
    #[error(transparent)]
    Invalid(#[from] InvalidField),
    /// The store cannot list (a store without SCAN): UNIMPLEMENTED.
    #[error("{0}")]
    Unsupported(ScanError),
    /// No shard could be read: UNAVAILABLE.
    #[error("lease records could not be read: {0}")]
    Store(ScanError),
}

impl From<ListLeasesError> for tonic::Status {
    fn from(error: ListLeasesError) -> Self {
        match error {
            ListLeasesError::Invalid(invalid) => invalid.into(),
            ListLeasesError::Unsupported(e) => tonic::Status::unimplemented(e.to_string()),
            ListLeasesError::Store(e) => tonic::Status::unavailable(e.to_string()),
        }
    }
}

/// A lease record key's parts: `lh:v1:{<tag>}:_lease:<bucket>:<lease_id>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordKey {
    pub tag: String,
    pub bucket: String,
    pub lease_id: String,
}

/// Splits a record key as `KeyBuilder::lease` builds it; None for any
/// other key the pattern happened to match.
pub fn parse_record_key(key: &str) -> Option<RecordKey> {
    let rest = key.strip_prefix("lh:v1:{")?;
    let (tag, rest) = rest.split_once("}:_lease:")?;
    let (bucket, lease_id) = rest.split_once(':')?;
    let hex = bucket.len() == 16
        && bucket
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !hex || Tenant::parse(tag).is_err() || check_id(lease_id).is_err() {
        return None;
    }
    Some(RecordKey {
        tag: tag.to_string(),
        bucket: bucket.to_string(),
        lease_id: lease_id.to_string(),
    })
}

/// What a ListLeases request asks for, validated.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseFilter {
    pub domain: Option<String>,
    pub rule_id: Option<String>,
    pub holder: Option<String>,
    pub include_returned: bool,
    pub max_leases: usize,
}

impl LeaseFilter {
    /// INVALID_ARGUMENT naming the field for a label outside its charset
    /// or a `max_leases` above the cap.
    pub fn from_request(req: &pb::ListLeasesRequest) -> Result<LeaseFilter, InvalidField> {
        let label = |field: &str, text: &str, label: Label| match text {
            "" => Ok(None),
            text if label.accepts(text) => Ok(Some(text.to_string())),
            _ => Err(InvalidField::new(
                field,
                format!("not a {} (see ListLeasesRequest)", label.name()),
            )),
        };
        if req.max_leases > MAX_LISTED_LEASES {
            return Err(InvalidField::new(
                "max_leases",
                format!("at most {MAX_LISTED_LEASES}"),
            ));
        }
        Ok(LeaseFilter {
            domain: label("domain", &req.domain, Label::Domain)?,
            rule_id: label("rule_id", &req.rule_id, Label::Rule)?,
            holder: label("holder", &req.holder, Label::Holder)?,
            include_returned: req.include_returned,
            max_leases: match req.max_leases {
                0 => MAX_LISTED_LEASES,
                n => n,
            } as usize,
        })
    }

    /// The listed lease of `found`, when it is an outstanding lease record
    /// this filter takes; `unreadable` counts matched keys that are not
    /// lease records.
    pub fn accept(&self, found: &ScannedRecord, unreadable: &AtomicU64) -> Option<pb::ListedLease> {
        let parsed = parse_record_key(&found.key).zip(LeaseRecord::parse(&found.value));
        let Some((key, record)) = parsed else {
            unreadable.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        if !record.live_at(found.now_ms)
            || (record.returned_millitokens.is_some() && !self.include_returned)
        {
            return None;
        }
        let owner = record.owner.as_ref();
        let field = |pick: fn(&crate::algorithm::lease_record::LeaseOwner) -> &str| {
            owner.map(pick).unwrap_or_default()
        };
        let wanted = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        if !wanted(&self.domain, field(|o| o.domain.as_str()))
            || !wanted(&self.rule_id, field(|o| o.rule_id.as_str()))
            || !wanted(&self.holder, field(|o| o.holder.as_str()))
        {
            return None;
        }
        let granted_at_ms = owner.map_or(0, |o| o.granted_at_ms);
        Some(pb::ListedLease {
            lease_id: key.lease_id,
            tag: key.tag,
            bucket: key.bucket,
            domain: field(|o| o.domain.as_str()).to_string(),
            rule_id: field(|o| o.rule_id.as_str()).to_string(),
            holder: field(|o| o.holder.as_str()).to_string(),
            granted_tokens: record.granted_millitokens / MILLI,
            returned: record.returned_millitokens.is_some(),
            returned_tokens: record.returned_millitokens.unwrap_or(0) / MILLI,
            granted_at_ms,
            spend_until_ms: owner.map_or(0, |_| granted_at_ms + super::BLOCK_EXPIRES_IN_MS),
            expires_at_ms: record.expires_at_ms,
        })
    }
}

/// Orders leases by domain, rule, holder, expiry, id (older records, which
/// name no rule, first).
pub fn sort_leases(leases: &mut [pb::ListedLease]) {
    leases.sort_by(|a, b| {
        (
            &a.domain,
            &a.rule_id,
            &a.holder,
            a.expires_at_ms,
            &a.lease_id,
        )
            .cmp(&(
                &b.domain,
                &b.rule_id,
                &b.holder,
                b.expires_at_ms,
                &b.lease_id,
            ))
    });
}

/// Keeps as many leases as fit in `reply_bytes_max` with the rest of
/// `response`; true when some had to go.
pub fn fit_reply(
    response: &mut pb::ListLeasesResponse,
    leases: Vec<pb::ListedLease>,
    reply_bytes_max: usize,
) -> bool {
    let budget = reply_bytes_max.saturating_sub(REPLY_HEADROOM_BYTES);
    let mut used = response.encoded_len();
    let total = leases.len();
    for lease in leases {
        // The field's tag (1 byte) and length prefix (at most 3 bytes here).
        let size = lease.encoded_len() + 4;
        if used + size > budget {
            break;
        }
        used += size;
        response.leases.push(lease);
    }
    response.leases.len() < total
}

impl Decider {
    /// ListLeases: see the module docs. `reply_bytes_max` is the
    /// listener's largest message.
    pub async fn list_leases(
        &self,
        req: pb::ListLeasesRequest,
        reply_bytes_max: usize,
    ) -> Result<pb::ListLeasesResponse, ListLeasesError> {
        let filter = LeaseFilter::from_request(&req)?;
        let unreadable = AtomicU64::new(0);
        let keep = |found: &ScannedRecord| filter.accept(found, &unreadable).is_some();
        let keep: Keep<'_> = &keep;
        let request = ScanRequest {
            pattern: LEASE_RECORD_MATCH,
            max_kept: filter.max_leases,
            max_calls_per_shard: SCAN_CALLS_PER_SHARD,
            keys_per_call: KEYS_PER_SCAN_CALL,
            deadline: tokio::time::Instant::now() + LIST_DEADLINE,
        };
        let outcome = match self.store.scan_strings(&request, keep).await {
            Ok(outcome) => outcome,
            Err(e @ ScanError::Unsupported { .. }) => return Err(ListLeasesError::Unsupported(e)),
            Err(e) => return Err(ListLeasesError::Store(e)),
        };
        let now_ms = outcome
            .kept
            .iter()
            .map(|r| r.now_ms)
            .max()
            .unwrap_or_else(|| self.clock.now_ms());
        // Parsed again (the kept records only): the scan keeps what it read.
        let ignored = AtomicU64::new(0);
        let mut leases: Vec<pb::ListedLease> = outcome
            .kept
            .iter()
            .filter_map(|found| filter.accept(found, &ignored))
            .collect();
        sort_leases(&mut leases);
        let mut reasons: Vec<String> = outcome.stopped.iter().map(|s| s.name().into()).collect();
        let mut shard_errors = outcome.shard_errors;
        if shard_errors.len() > MAX_SHARD_ERRORS {
            let more = shard_errors.len() - MAX_SHARD_ERRORS;
            shard_errors.truncate(MAX_SHARD_ERRORS);
            shard_errors.push(format!("and {more} more shards"));
        }
        let mut response = pb::ListLeasesResponse {
            region: self.region.clone(),
            now_ms,
            matched_records: outcome.matched_keys,
            unreadable_records: outcome.unreadable_keys + unreadable.load(Ordering::Relaxed),
            shards: outcome.shards,
            shard_errors: shard_errors
                .iter()
                .map(|e| leasehold_logging::cap_message(e, 256))
                .collect(),
            store: self.store.name().to_string(),
            ..Default::default()
        };
        if fit_reply(&mut response, leases, reply_bytes_max) {
            reasons.push("reply_size".into());
        }
        response.truncated = !reasons.is_empty();
        response.truncated_reasons = reasons;
        Ok(response)
    }
}

#[cfg(test)]
#[path = "list_tests.rs"]
mod tests;
