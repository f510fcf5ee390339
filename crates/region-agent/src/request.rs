//! Validation of what gateways send: every field checked before anything is
//! read or written; a bad field is `InvalidField` naming it (gRPC
//! INVALID_ARGUMENT). Raw principal ids are hashed here and dropped.
//!
//! A refusal quotes at most a short prefix of the value at fault
//! ([`shown`]: 64 bytes, then `… (N bytes)`), and never any of a principal
//! id or a descriptor value (they may be user ids or addresses: only their
//! length is said). The status message is capped whole at
//! [`leasehold_logging::MAX_STATUS_MESSAGE_BYTES`].

use std::collections::BTreeMap;

use leasehold_logging::{cap_status_message, quote};
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
        tonic::Status::invalid_argument(cap_status_message(&format!(
            "invalid field {}: {}",
            e.field, e.reason
        )))
    }
}

/// A value as a refusal shows it: a [`quote`] in Debug form (control
/// characters escaped), e.g. `"abc… (65536 bytes)"`.
pub fn shown(value: &str) -> String {
    format!("{:?}", quote(value))
}

/// A value a refusal must not show (a principal id, a descriptor value):
/// its length only, e.g. `(65536 bytes, not shown)`.
pub fn unshown(value: &str) -> String {
    format!("({} bytes, not shown)", value.len())
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

/// How a refusal shows the value at fault.
#[derive(Clone, Copy)]
enum Echo {
    /// A short prefix ([`shown`]).
    Prefix,
    /// Its length only ([`unshown`]).
    LengthOnly,
}

/// A route group, method or descriptor key or value.
fn plain(field: &str, value: &str, required: bool, echo: Echo) -> Result<String, InvalidField> {
    if value.is_empty() {
        if required {
            return Err(InvalidField::new(field, "required"));
        }
        return Ok(String::new());
    }
    let show = || match echo {
        Echo::Prefix => shown(value),
        Echo::LengthOnly => unshown(value),
    };
    if value.len() > MAX_FIELD_LEN {
        return Err(InvalidField::new(
            field,
            format!("{} is longer than {MAX_FIELD_LEN} bytes", show()),
        ));
    }
    if !value.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(InvalidField::new(
            field,
            format!("{} must be printable ASCII without spaces", show()),
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
                format!("{} must match [a-z0-9-]{{1,30}}", shown(&target.domain)),
            ));
        }
        let tenant = Tenant::parse(&target.tenant).map_err(|e| {
            InvalidField::new("target.tenant", format!("{}: {e}", shown(&target.tenant)))
        })?;
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
                        format!("{} must match [a-z_]{{1,16}}", shown(&p.r#type)),
                    ));
                }
                // Type is part of the hashed identity: user "1" is not ip "1".
                let hashed = keys
                    .principal(&format!("{}:{}", p.r#type, p.id))
                    .map_err(|_| {
                        let length = unshown(&p.id);
                        InvalidField::new(
                            "target.principal.id",
                            format!("{length} must be 1-256 bytes"),
                        )
                    })?;
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
            let key = format!("target.descriptors[{i}].key");
            let key = plain(&key, &d.key, true, Echo::Prefix)?;
            // A descriptor value may be a user id or an address: not shown.
            let value = format!("target.descriptors[{i}].value");
            let value = plain(&value, &d.value, true, Echo::LengthOnly)?;
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
            route_group: plain(
                "target.route_group",
                &target.route_group,
                false,
                Echo::Prefix,
            )?,
            method: plain("target.method", &target.method, false, Echo::Prefix)?,
            descriptors,
        })
    }
}

/// Checks a request, lease or decision id.
pub fn id(field: &str, value: &str) -> Result<String, InvalidField> {
    crate::key::check_id(value)
        .map(str::to_string)
        .map_err(|e| InvalidField::new(field, format!("{}: {e}", shown(value))))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> KeyBuilder {
        KeyBuilder::new(b"request-test-pepper-0123").unwrap()
    }

    fn target(route_group: &str, principal_id: &str, descriptor_value: &str) -> pb::Target {
        pb::Target {
            domain: "api".into(),
            tenant: "atlas".into(),
            principal: Some(pb::Principal {
                r#type: "user".into(),
                id: principal_id.into(),
            }),
            route_group: route_group.into(),
            method: "GET".into(),
            descriptors: vec![pb::Descriptor {
                key: "plan".into(),
                value: descriptor_value.into(),
            }],
        }
    }

    fn refusal(target: pb::Target) -> InvalidField {
        RequestTarget::from_proto(Some(target), &keys()).unwrap_err()
    }

    #[test]
    fn a_long_value_is_quoted_by_a_short_prefix_and_its_length() {
        let error = refusal(target(&"r".repeat(65_536), "u-1", "gold"));
        assert_eq!(error.field, "target.route_group");
        let expected = format!(
            "\"{}… (65536 bytes)\" is longer than 64 bytes",
            "r".repeat(64)
        );
        assert_eq!(error.reason, expected);
        let status = tonic::Status::from(error);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().len() < 200, "{}", status.message());
    }

    #[test]
    fn principal_ids_and_descriptor_values_are_never_shown() {
        let id = format!("alice@example.com{}", "x".repeat(300));
        let error = refusal(target("read", &id, "gold"));
        assert_eq!(error.field, "target.principal.id");
        assert!(!error.reason.contains("alice"), "{}", error.reason);
        assert!(
            error.reason.contains("(317 bytes, not shown)"),
            "{}",
            error.reason
        );

        let error = refusal(target("read", "u-1", "203.0.113.77 "));
        assert_eq!(error.field, "target.descriptors[0].value");
        assert!(!error.reason.contains("203.0"), "{}", error.reason);
    }

    #[test]
    fn a_status_message_is_capped_whole() {
        let error = InvalidField::new("target", "m".repeat(10_000));
        let status = tonic::Status::from(error);
        assert!(status.message().len() <= leasehold_logging::MAX_STATUS_MESSAGE_BYTES);
    }
}
