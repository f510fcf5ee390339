//! Keys for targets and blocks that never hold a raw id.
//!
//! Every map in this crate is keyed by a [`TargetKey`] or [`BlockKey`]: a
//! 64-bit keyed hash (SipHash with per-process random keys, from
//! `std::collections::hash_map::RandomState`) of the target's fields. A raw
//! principal id is hashed and dropped; it never becomes a map key, and log
//! lines print the key's hex, not the target.
//!
//! A [`BlockKey`] names the *bucket* a leased rule's blocks draw from, not
//! the target: the agent tells, per leased rule, an opaque bucket id shared by
//! every target that shares the bucket (one for a global rule, one per tenant
//! for a tenant rule), so a gateway holds one set of blocks per bucket however
//! many targets spend from it. An agent that sends no bucket id gets the
//! older per-target key. The bucket id is hashed like a target and never
//! logged.
//!
//! Collisions: two different targets share a key with probability about
//! n²/2^65 for n live keys (≈ 3·10⁻¹⁰ at 100,000). A collision can only make
//! one target borrow another's negative-cache entry (≤ 250 ms), block or
//! fallback bucket; the keys are unpredictable to callers, so it cannot be
//! aimed.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};

use leasehold_proto::agent::v1::Target;

/// The hashed identity of a [`Target`] (domain, tenant, principal type and id,
/// route group, method, descriptors in order).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct TargetKey(u64);

/// The hashed identity of one leased rule's blocks: per (bucket, rule), or
/// per (target, rule) when the agent names no bucket.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Debug)]
pub struct BlockKey(u64);

impl TargetKey {
    /// The raw 64-bit value (for sharding).
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for TargetKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:016x}", self.0)
    }
}

impl BlockKey {
    /// The raw 64-bit value (for sharding).
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl fmt::Display for BlockKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:016x}", self.0)
    }
}

/// Hashes targets with keys chosen at random when the hasher is made.
#[derive(Clone, Debug, Default)]
pub struct TargetHasher {
    keys: RandomState,
}

impl TargetHasher {
    pub fn new() -> Self {
        Self::default()
    }

    /// The key of `target`. Every string is length-prefixed and the optional
    /// principal is tagged, so no two different targets feed the hash the
    /// same bytes.
    pub fn target_key(&self, target: &Target) -> TargetKey {
        let mut hasher = self.keys.build_hasher();
        write_field(&mut hasher, &target.domain);
        write_field(&mut hasher, &target.tenant);
        match &target.principal {
            None => hasher.write_u8(0),
            Some(principal) => {
                hasher.write_u8(1);
                write_field(&mut hasher, &principal.r#type);
                write_field(&mut hasher, &principal.id);
            }
        }
        write_field(&mut hasher, &target.route_group);
        write_field(&mut hasher, &target.method);
        hasher.write_usize(target.descriptors.len());
        for descriptor in &target.descriptors {
            write_field(&mut hasher, &descriptor.key);
            write_field(&mut hasher, &descriptor.value);
        }
        TargetKey(hasher.finish())
    }

    /// The key of `rule_id`'s blocks drawn from `bucket` (the agent's opaque
    /// bucket id), for a request of the target whose key is `target_key`.
    /// Every target that shares the bucket gets the same key. An empty
    /// `bucket` (an agent older than bucket ids) falls back to one key per
    /// target. The two kinds are tagged, so they never feed the hash the same
    /// bytes.
    pub fn block_key(&self, target_key: TargetKey, rule_id: &str, bucket: &str) -> BlockKey {
        let mut hasher = self.keys.build_hasher();
        if bucket.is_empty() {
            hasher.write_u8(0);
            hasher.write_u64(target_key.0);
        } else {
            hasher.write_u8(1);
            write_field(&mut hasher, bucket);
        }
        write_field(&mut hasher, rule_id);
        BlockKey(hasher.finish())
    }
}

fn write_field(hasher: &mut impl Hasher, field: &str) {
    hasher.write_usize(field.len());
    hasher.write(field.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_proto::agent::v1::{Descriptor, Principal};

    fn target(principal_id: &str) -> Target {
        Target {
            domain: "api".into(),
            tenant: "atlas".into(),
            principal: Some(Principal {
                r#type: "user".into(),
                id: principal_id.into(),
            }),
            route_group: "read".into(),
            method: "GET".into(),
            descriptors: vec![Descriptor {
                key: "plan".into(),
                value: "gold".into(),
            }],
        }
    }

    #[test]
    fn equal_targets_share_a_key_and_different_principals_do_not() {
        let hasher = TargetHasher::new();
        assert_eq!(
            hasher.target_key(&target("U-17")),
            hasher.target_key(&target("U-17"))
        );
        assert_ne!(
            hasher.target_key(&target("U-17")),
            hasher.target_key(&target("U-18"))
        );
    }

    #[test]
    fn field_boundaries_are_unambiguous() {
        let hasher = TargetHasher::new();
        let mut first = target("U-1");
        first.domain = "ab".into();
        first.tenant = "c".into();
        let mut second = target("U-1");
        second.domain = "a".into();
        second.tenant = "bc".into();
        assert_ne!(hasher.target_key(&first), hasher.target_key(&second));
    }

    #[test]
    fn missing_principal_differs_from_empty_principal() {
        let hasher = TargetHasher::new();
        let mut absent = target("");
        absent.principal = None;
        let mut empty = target("");
        empty.principal = Some(Principal::default());
        assert_ne!(hasher.target_key(&absent), hasher.target_key(&empty));
    }

    #[test]
    fn displayed_key_never_contains_the_raw_id() {
        let hasher = TargetHasher::new();
        let shown = hasher.target_key(&target("U-17")).to_string();
        assert_eq!(shown.len(), 16);
        assert!(!shown.contains("U-17"));
    }

    #[test]
    fn block_keys_differ_per_rule() {
        let hasher = TargetHasher::new();
        let key = hasher.target_key(&target("U-17"));
        assert_ne!(
            hasher.block_key(key, "r1", ""),
            hasher.block_key(key, "r2", "")
        );
        assert_ne!(
            hasher.block_key(key, "r1", "b"),
            hasher.block_key(key, "r2", "b")
        );
    }

    #[test]
    fn targets_sharing_a_bucket_share_a_block_key() {
        let hasher = TargetHasher::new();
        let first = hasher.target_key(&target("U-17"));
        let second = hasher.target_key(&target("U-18"));
        assert_eq!(
            hasher.block_key(first, "r1", "global-1"),
            hasher.block_key(second, "r1", "global-1")
        );
        assert_ne!(
            hasher.block_key(first, "r1", "global-1"),
            hasher.block_key(first, "r1", "global-2")
        );
    }

    #[test]
    fn empty_bucket_falls_back_to_one_key_per_target() {
        let hasher = TargetHasher::new();
        let first = hasher.target_key(&target("U-17"));
        let second = hasher.target_key(&target("U-18"));
        assert_eq!(
            hasher.block_key(first, "r1", ""),
            hasher.block_key(first, "r1", "")
        );
        assert_ne!(
            hasher.block_key(first, "r1", ""),
            hasher.block_key(second, "r1", "")
        );
    }
}
