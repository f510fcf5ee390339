//! Redis key model (ARCHITECTURE §3.2).
//!
//! `lh:v1:{<tag>}:<rule>:<principal>`: the hash tag holds the tenant (or
//! pool) so one request's rules share a cluster slot; principals are
//! HMAC-SHA256(pepper, id) truncated to 16 hex characters, so raw API keys,
//! user ids and IPs never reach a key, a log line or a metric label. A key
//! names the rule, never the rule's version: a new policy version keeps the
//! bucket's state.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// Longest rule id and decision/lease id accepted in a key.
pub const MAX_ID_LEN: usize = 64;
/// Longest raw principal id hashed (anything longer is refused, not truncated).
pub const MAX_PRINCIPAL_LEN: usize = 256;
/// Shortest pepper accepted: 16 bytes.
pub const MIN_PEPPER_LEN: usize = 16;
/// Longest global pool id (the allocator's `PoolId` cap).
pub const MAX_POOL_LEN: usize = leasehold_allocator_client::id::MAX_ID_BYTES;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("tenant must match [a-z0-9-]{{1,32}}")]
    Tenant,
    #[error("rule id must match [a-z0-9_-]{{1,64}}")]
    Rule,
    #[error("id must be 1-64 characters of [A-Za-z0-9._:-]")]
    Id,
    #[error("principal id must be 1-256 bytes")]
    Principal,
    #[error("pepper must be at least {} bytes", MIN_PEPPER_LEN)]
    Pepper,
    #[error("pool id must match [a-z0-9-]{{1,64}}")]
    Pool,
}

/// A validated tenant (or pool) id: the hash tag.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tenant(String);

impl Tenant {
    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        let ok = (1..=32).contains(&raw.len())
            && raw
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        ok.then(|| Tenant(raw.to_string())).ok_or(KeyError::Tenant)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A validated rule id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleId(String);

impl RuleId {
    pub fn parse(raw: &str) -> Result<Self, KeyError> {
        let ok = (1..=MAX_ID_LEN).contains(&raw.len())
            && raw
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_');
        ok.then(|| RuleId(raw.to_string())).ok_or(KeyError::Rule)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Checks a decision or lease id (also used as a sorted-set member).
pub fn check_id(raw: &str) -> Result<&str, KeyError> {
    let ok = (1..=MAX_ID_LEN).contains(&raw.len())
        && raw
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    ok.then_some(raw).ok_or(KeyError::Id)
}

/// A principal's keyed hash: 16 hex characters. Its Debug/Display show only
/// the hash, never the raw id.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PrincipalHash(String);

impl PrincipalHash {
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// A hash as [`KeyBuilder::principal`] makes them (16 lowercase hex),
    /// received from another Region's agent.
    pub fn parse(text: &str) -> Option<PrincipalHash> {
        let ok = text.len() == 16
            && text
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        ok.then(|| PrincipalHash(text.to_string()))
    }
}

impl std::fmt::Display for PrincipalHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Builds keys; holds the pepper (a secret from config, never logged).
#[derive(Clone)]
pub struct KeyBuilder {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for KeyBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyBuilder { pepper: <redacted> }")
    }
}

impl KeyBuilder {
    pub fn new(pepper: &[u8]) -> Result<Self, KeyError> {
        if pepper.len() < MIN_PEPPER_LEN {
            return Err(KeyError::Pepper);
        }
        let mac = Hmac::<Sha256>::new_from_slice(pepper).map_err(|_| KeyError::Pepper)?;
        Ok(KeyBuilder { mac })
    }

    /// HMAC-SHA256(pepper, id), first 8 bytes as 16 lowercase hex characters.
    pub fn principal(&self, raw_id: &str) -> Result<PrincipalHash, KeyError> {
        if raw_id.is_empty() || raw_id.len() > MAX_PRINCIPAL_LEN {
            return Err(KeyError::Principal);
        }
        Ok(self.principal_unchecked(raw_id))
    }

    /// [`KeyBuilder::principal`] without its length bound: for an id whose
    /// caller bounds it (Envoy's descriptor values, at most 1 KiB).
    pub fn principal_unchecked(&self, raw_id: &str) -> PrincipalHash {
        let mut mac = self.mac.clone();
        mac.update(raw_id.as_bytes());
        let digest = mac.finalize().into_bytes();
        PrincipalHash(hex::encode(&digest[..8]))
    }

    /// A stand-in for a value no native field can hold (spaces, non-ASCII,
    /// over 64 bytes): `h-` and 16 hex of HMAC-SHA256(pepper, value), so
    /// equal values get equal stand-ins, the value is never kept in clear,
    /// and the stand-in is a valid tenant id (`[a-z0-9-]{1,32}`). No
    /// written rule names one (they can only be forged with the pepper).
    pub fn opaque(&self, value: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(b"opaque\0");
        mac.update(value.as_bytes());
        let digest = mac.finalize().into_bytes();
        format!("h-{}", hex::encode(&digest[..8]))
    }

    /// A descriptor value a request chose, as a metric label may show it
    /// (§3.2: the value may be an IP, a user id or an API key): `h-` and
    /// 16 hex of HMAC-SHA256(pepper, value), domain-separated from the
    /// other hashes. Equal values get equal labels, so per-value
    /// statistics still add up; only the pepper's holder can tell which.
    pub fn label(&self, value: &str) -> String {
        let mut mac = self.mac.clone();
        mac.update(b"label\0");
        mac.update(value.as_bytes());
        let digest = mac.finalize().into_bytes();
        format!("h-{}", hex::encode(&digest[..8]))
    }

    /// `lh:v1:{tenant}:<rule>:<principal>`
    pub fn bucket(&self, tenant: &Tenant, rule: &RuleId, principal: &PrincipalHash) -> String {
        format!("lh:v1:{{{}}}:{}:{}", tenant.0, rule.0, principal.0)
    }

    /// A bucket shared by the whole tag (tenant-, route- or pool-wide rule).
    pub fn shared_bucket(&self, tenant: &Tenant, rule: &RuleId) -> String {
        format!("lh:v1:{{{}}}:{}:_", tenant.0, rule.0)
    }

    /// The idempotency record of one decision, under the same hash tag.
    pub fn decision(&self, tenant: &Tenant, decision_id: &str) -> Result<String, KeyError> {
        Ok(format!(
            "lh:v1:{{{}}}:_decision:{}",
            tenant.0,
            check_id(decision_id)?
        ))
    }

    /// The record of a charge after the fact (issue 30): one per (request,
    /// rule), in the rule's bucket's slot, so a retry charges nothing.
    pub fn charge(
        &self,
        tag: &Tenant,
        rule: &RuleId,
        request_id: &str,
    ) -> Result<String, KeyError> {
        Ok(format!(
            "lh:v1:{{{}}}:_charge:{}:{}",
            tag.0,
            rule.as_str(),
            check_id(request_id)?
        ))
    }

    /// An envoyproxy/ratelimit counter (`crate::envoy::ratelimit`):
    /// `lh:v1:{rls-<h>}:<unit>`, where `<h>` is 16 hex of
    /// HMAC-SHA256(pepper, domain and every entry, length-prefixed). Each
    /// counter is its own hash tag (Redis Cluster spreads them), and no
    /// descriptor value (an IP, a user id) is written in clear.
    pub fn rls_counter(&self, domain: &str, entries: &[(&str, &str)], unit: &str) -> String {
        let mut mac = self.mac.clone();
        let mut field = |text: &str| {
            mac.update(&(text.len() as u64).to_be_bytes());
            mac.update(text.as_bytes());
        };
        field("rls");
        field(domain);
        for (key, value) in entries {
            field(key);
            field(value);
        }
        let digest = mac.finalize().into_bytes();
        format!("lh:v1:{{rls-{}}}:{unit}", hex::encode(&digest[..8]))
    }

    /// The record of one block lease granted from `bucket_key` (§3.5, §8),
    /// under the bucket's hash tag: `lh:v1:{tag}:_lease:<bucket>:<lease_id>`,
    /// where `<bucket>` is 16 hex of SHA-256(bucket key). Naming the bucket
    /// binds the lease to it: a lease id granted on one bucket is unknown on
    /// every other, so it cannot refill them.
    pub fn lease(
        &self,
        tenant: &Tenant,
        bucket_key: &str,
        lease_id: &str,
    ) -> Result<String, KeyError> {
        use sha2::Digest;
        let bucket = hex::encode(&Sha256::digest(bucket_key.as_bytes())[..8]);
        Ok(format!(
            "lh:v1:{{{}}}:_lease:{bucket}:{}",
            tenant.0,
            check_id(lease_id)?
        ))
    }

    /// The regional counter of one chunk grant of a window pool (§4.2):
    /// `lh:v1:{g-<pool>}:_chunk:<lease_id>`. Tagged by the pool, so every
    /// chunk of one pool shares a slot and one `chunk_spend` call can span
    /// them. The pool id is the allocator's (`[a-z0-9-]{1,64}`); the lease
    /// id (`[A-Za-z0-9._:-]{1,64}`, [`check_id`]) is the last segment and
    /// is kept as it is: its `:` cannot be mistaken for a separator, as
    /// the segments before it are fixed, and no `{`/`}` can move the tag.
    pub fn chunk_counter(&self, pool: &str, lease_id: &str) -> Result<String, KeyError> {
        if leasehold_allocator_client::id::PoolId::parse(pool).is_err() {
            return Err(KeyError::Pool);
        }
        Ok(format!("lh:v1:{{g-{pool}}}:_chunk:{}", check_id(lease_id)?))
    }

    /// The share record of rate pool `pool` that `share_gate` reads for
    /// the bucket `bucket_key` (several agents per Region): under the
    /// bucket's own hash tag, so gate and bucket share a slot.
    /// `pool` is a validated pool id (`[a-z0-9-]`).
    pub fn share_record(&self, bucket_key: &str, pool: &str) -> String {
        let tag = crate::store::slots::hash_tag(bucket_key);
        format!("lh:v1:{{{tag}}}:_share:{pool}")
    }

    /// A pool's Region-wide records, all under `{g-<pool>}`: its share as
    /// the syncer last wrote it (`share`), the requests and chunk spends
    /// the agents saw since the syncer last took them (`demand`), the
    /// chunks the Region holds (`chunks`).
    pub fn pool_record(&self, pool: &str, what: PoolRecord) -> String {
        let what = match what {
            PoolRecord::Share => "share",
            PoolRecord::Demand => "demand",
            PoolRecord::Chunks => "chunks",
        };
        format!("lh:v1:{{g-{pool}}}:_pool:{what}")
    }

    /// A meter's senders under the tenant's tag (issue 30):
    /// `lh:v1:{tenant}:_meter:<meter>:senders`, one field per sender
    /// incarnation holding its running totals. `meter` is a validated meter
    /// name (`[a-z0-9_-]{1,64}`).
    pub fn meter_senders(&self, tenant: &Tenant, meter: &str) -> String {
        format!("lh:v1:{{{}}}:_meter:{meter}:senders", tenant.0)
    }

    /// The Region's total of a meter in one calendar period:
    /// `lh:v1:{tenant}:_meter:<meter>:p:<label>` (`2026-12`, `2026-W49`,
    /// `2026-12-06`), in the senders' slot so one script writes both.
    pub fn meter_total(&self, tenant: &Tenant, meter: &str, period_label: &str) -> String {
        format!("lh:v1:{{{}}}:_meter:{meter}:p:{period_label}", tenant.0)
    }

    /// The Region's total of a meter in one period not yet known to be in
    /// the allocator's roll-up: `lh:v1:{tenant}:_meter:<meter>:owed:<label>`
    /// (a string `q,c`), in the total's slot.
    pub fn meter_owed(&self, tenant: &Tenant, meter: &str, period_label: &str) -> String {
        format!("lh:v1:{{{}}}:_meter:{meter}:owed:{period_label}", tenant.0)
    }

    /// The Region's usage senders and their liveness (issue 30), one hash
    /// for the Region like the syncer lease: `_region` is no tenant tag.
    pub fn usage_senders(&self) -> String {
        "lh:v1:{_region}:_meter:senders".to_string()
    }

    /// The Region's syncer lease and its token counter (one Redis per
    /// Region: no Region in the name). `_region` cannot be a tenant tag.
    pub fn syncer_lease(&self) -> [String; 2] {
        [
            "lh:v1:{_region}:syncer".to_string(),
            "lh:v1:{_region}:syncer_token".to_string(),
        ]
    }
}

/// One of a pool's Region-wide records ([`KeyBuilder::pool_record`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolRecord {
    Share,
    Demand,
    Chunks,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn builder() -> KeyBuilder {
        KeyBuilder::new(b"0123456789abcdef-test-pepper").unwrap()
    }

    #[test]
    fn a_share_record_shares_its_buckets_slot() {
        let b = builder();
        let bucket = b.shared_bucket(
            &Tenant::parse("g-edge").unwrap(),
            &RuleId::parse("api").unwrap(),
        );
        let record = b.share_record(&bucket, "api-rps");
        assert_eq!(record, "lh:v1:{g-edge}:_share:api-rps");
        assert_eq!(
            crate::store::slots::slot_of_key(&record),
            crate::store::slots::slot_of_key(&bucket)
        );
    }

    #[test]
    fn tenant_charset_is_enforced() {
        assert!(Tenant::parse("atlas-2").is_ok());
        for bad in ["", "Atlas", "a b", "a_b", "a{b", &"a".repeat(33)] {
            assert_eq!(Tenant::parse(bad), Err(KeyError::Tenant), "{bad:?}");
        }
    }

    #[test]
    fn principal_is_sixteen_hex_and_never_the_raw_id() {
        let p = builder().principal("user-17@example.com").unwrap();
        assert_eq!(p.as_str().len(), 16);
        assert!(p.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(!format!("{p:?}{p}").contains("user-17"));
    }

    #[test]
    fn principal_depends_on_the_pepper() {
        let other = KeyBuilder::new(b"another-pepper-0123456789").unwrap();
        assert_ne!(builder().principal("u1"), other.principal("u1"));
        assert_eq!(builder().principal("u1"), builder().principal("u1"));
    }

    #[test]
    fn keys_of_one_tenant_share_a_hash_tag() {
        let b = builder();
        let t = Tenant::parse("atlas").unwrap();
        let user = b.bucket(
            &t,
            &RuleId::parse("p-read").unwrap(),
            &b.principal("u").unwrap(),
        );
        let tenant = b.shared_bucket(&t, &RuleId::parse("p-tenant").unwrap());
        let decision = b.decision(&t, "d-1").unwrap();
        for key in [&user, &tenant, &decision] {
            assert!(key.starts_with("lh:v1:{atlas}:"), "{key}");
        }
    }

    #[test]
    fn chunk_counter_is_tagged_by_the_pool_and_keeps_the_lease_id() {
        let b = builder();
        assert_eq!(
            b.chunk_counter("checkout", "eu-west.7:42").unwrap(),
            "lh:v1:{g-checkout}:_chunk:eu-west.7:42"
        );
        let longest_pool = "p".repeat(MAX_POOL_LEN);
        let longest_id = format!("A._:-{}", "9".repeat(MAX_ID_LEN - 5));
        let key = b.chunk_counter(&longest_pool, &longest_id).unwrap();
        assert!(key.starts_with(&format!("lh:v1:{{g-{longest_pool}}}:_chunk:")));
        assert!(key.ends_with(&longest_id));
    }

    #[test]
    fn chunk_counter_refuses_bad_pools_and_lease_ids() {
        let b = builder();
        let too_long = "p".repeat(MAX_POOL_LEN + 1);
        for pool in ["", "Checkout", "a_b", "a}b", "a:b", too_long.as_str()] {
            assert_eq!(
                b.chunk_counter(pool, "l-1"),
                Err(KeyError::Pool),
                "{pool:?}"
            );
        }
        let too_long = "l".repeat(MAX_ID_LEN + 1);
        for lease in ["", "a b", "a{b}", "a/b", too_long.as_str()] {
            assert_eq!(
                b.chunk_counter("pool", lease),
                Err(KeyError::Id),
                "{lease:?}"
            );
        }
    }

    #[test]
    fn short_pepper_and_bad_ids_are_refused() {
        assert_eq!(KeyBuilder::new(b"short").err(), Some(KeyError::Pepper));
        let t = Tenant::parse("atlas").unwrap();
        assert_eq!(builder().decision(&t, "bad id"), Err(KeyError::Id));
        assert_eq!(builder().principal(""), Err(KeyError::Principal));
    }
}
