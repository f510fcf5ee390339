//! Validation of what gateways send: every field checked before anything is
//! read or written; a bad field is `InvalidField` naming it (gRPC
//! INVALID_ARGUMENT). Raw principal ids are hashed here and dropped.

use std::collections::BTreeMap;

use leasehold_proto::agent::v1 as pb;

use crate::key::{KeyBuilder, PrincipalHash, Tenant};

/// Longest route group, method, descriptor key or value.
pub const MAX_FIELD_LEN: usize = 64;
/// Most extra descriptors on one request.
pub const MAX_DESCRIPTORS: usize = 16;
/// Largest request cost in whole tokens (×1,000 millitokens ≤ 2^40).
pub const MAX_COST_TOKENS: u64 = (1 << 40) / 1_000;

/// A field the caller got wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct InvalidField {
    pub field: String,
    pub reason: String,
}

impl InvalidField {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        InvalidField {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

impl From<InvalidField> for tonic::Status {
    fn from(e: InvalidField) -> Self {
        tonic::Status::invalid_argument(format!("invalid field {}: {}", e.field, e.reason))
    }
}

/// A validated target. Holds the principal's keyed hash, never the raw id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestTarget {
    pub domain: String,
    pub tenant: Tenant,
    pub principal: Option<PrincipalHash>,
    pub route_group: String,
    pub method: String,
    pub descriptors: BTreeMap<String, String>,
}

fn plain(field: &str, value: &str, required: bool) -> Result<String, InvalidField> {
    if value.is_empty() {
        if required {
            return Err(InvalidField::new(field, "required"));
        }
        return Ok(String::new());
    }
    if value.len() > MAX_FIELD_LEN {
        return Err(InvalidField::new(
            field,
            format!("longer than {MAX_FIELD_LEN} bytes"),
        ));
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(InvalidField::new(
            field,
            "must be printable ASCII without spaces",
        ));
    }
    Ok(value.to_string())
}

impl RequestTarget {
    pub fn from_proto(target: Option<pb::Target>, keys: &KeyBuilder) -> Result<Self, InvalidField> {
        let target = target.ok_or_else(|| InvalidField::new("target", "required"))?;
        let domain_ok = (1..=30).contains(&target.domain.len())
            && target
                .domain
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !domain_ok {
            return Err(InvalidField::new(
                "target.domain",
                "must match [a-z0-9-]{1,30}",
            ));
        }
        let tenant = Tenant::parse(&target.tenant)
            .map_err(|e| InvalidField::new("target.tenant", e.to_string()))?;
        let principal = match target.principal {
            None => None,
            Some(p) if p.id.is_empty() && p.r#type.is_empty() => None,
            Some(p) => {
                let kind_ok = (1..=16).contains(&p.r#type.len())
                    && p.r#type
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b == b'_');
                if !kind_ok {
                    return Err(InvalidField::new(
                        "target.principal.type",
                        "must match [a-z_]{1,16}",
                    ));
                }
                // Type is part of the hashed identity: user "1" is not ip "1".
                let hashed = keys
                    .principal(&format!("{}:{}", p.r#type, p.id))
                    .map_err(|_| InvalidField::new("target.principal.id", "must be 1-256 bytes"))?;
                if p.id.is_empty() {
                    return Err(InvalidField::new("target.principal.id", "required"));
                }
                Some(hashed)
            }
        };
        if target.descriptors.len() > MAX_DESCRIPTORS {
            return Err(InvalidField::new(
                "target.descriptors",
                format!("more than {MAX_DESCRIPTORS}"),
            ));
        }
        let mut descriptors = BTreeMap::new();
        for (i, d) in target.descriptors.iter().enumerate() {
            let key = plain(&format!("target.descriptors[{i}].key"), &d.key, true)?;
            let value = plain(&format!("target.descriptors[{i}].value"), &d.value, true)?;
            if descriptors.insert(key, value).is_some() {
                return Err(InvalidField::new(
                    format!("target.descriptors[{i}].key"),
                    "duplicate key",
                ));
            }
        }
        Ok(RequestTarget {
            domain: target.domain,
            tenant,
            principal,
            route_group: plain("target.route_group", &target.route_group, false)?,
            method: plain("target.method", &target.method, false)?,
            descriptors,
        })
    }
}

/// Checks a request, lease or decision id.
pub fn id(field: &str, value: &str) -> Result<String, InvalidField> {
    crate::key::check_id(value)
        .map(str::to_string)
        .map_err(|e| InvalidField::new(field, e.to_string()))
}

/// Checks a request cost in whole tokens.
pub fn cost(value: u64) -> Result<u64, InvalidField> {
    if value == 0 || value > MAX_COST_TOKENS {
        return Err(InvalidField::new(
            "cost",
            format!("must be in [1, {MAX_COST_TOKENS}]"),
        ));
    }
    Ok(value)
}
