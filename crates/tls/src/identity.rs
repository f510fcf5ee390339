//! Who a certificate speaks for: the SPIFFE-style URI SAN
//! `spiffe://<trust-domain>/<kind>/<name>` (ARCHITECTURE §8).
//!
//! | path | identity |
//! |---|---|
//! | `/region/<name>` | [`Identity::Region`] |
//! | `/node/<id>` | [`Identity::Node`] (id ≥ 1, decimal, no leading zero) |
//! | `/prober` | [`Identity::Prober`] |
//! | `/admin` | [`Identity::Admin`] |
//! | `/sre` | [`Identity::Sre`] |
//! | `/gateway/<region>` | [`Identity::Gateway`] |
//!
//! Parsing is strict and canonical: every identity has exactly one URI
//! ([`Identity::uri`]), so two spellings of one name can never be two
//! identities to the authorization table (no case folding, no percent
//! escapes, no trailing slash, query or fragment).

use std::fmt;

use leasehold_logging::quote;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Longest accepted URI, in bytes (the SPIFFE ID limit); a longer one is
/// refused without being parsed.
pub const MAX_SPIFFE_URI_BYTES: usize = 2048;

/// Longest Region name, in bytes: the allocator's `MAX_ID_BYTES`, so every
/// Region the allocator accepts can hold a certificate.
pub const MAX_REGION_NAME_BYTES: usize = 64;

/// Longest trust domain, in bytes (a DNS name's limit).
pub const MAX_TRUST_DOMAIN_BYTES: usize = 253;

const SCHEME: &str = "spiffe://";

/// A caller's identity, as the authorization table knows it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Identity {
    /// A Region's agent, for that Region only.
    Region(String),
    /// An allocator node (raft RPCs).
    Node(u64),
    /// The external health prober.
    Prober,
    /// An operator allowed every admin RPC.
    Admin,
    /// A read-only operator.
    Sre,
    /// A gateway of one Region, calling that Region's agent.
    Gateway(String),
}

impl Identity {
    /// The full SPIFFE URI of this identity in `trust_domain`.
    pub fn uri(&self, trust_domain: &str) -> String {
        format!("{SCHEME}{trust_domain}{self}")
    }

    /// A file-name stem for this identity's certificate and key
    /// (`region-eu`, `node-3`, `prober`, …), as `certs::init` writes them.
    pub fn file_stem(&self) -> String {
        match self {
            Identity::Region(name) => format!("region-{name}"),
            Identity::Node(id) => format!("node-{id}"),
            Identity::Prober => "prober".to_string(),
            Identity::Admin => "admin".to_string(),
            Identity::Sre => "sre".to_string(),
            Identity::Gateway(region) => format!("gateway-{region}"),
        }
    }
}

/// The SPIFFE path (`/region/eu`, `/node/3`, `/prober`, …).
impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Identity::Region(name) => write!(f, "/region/{name}"),
            Identity::Node(id) => write!(f, "/node/{id}"),
            Identity::Prober => f.write_str("/prober"),
            Identity::Admin => f.write_str("/admin"),
            Identity::Sre => f.write_str("/sre"),
            Identity::Gateway(region) => write!(f, "/gateway/{region}"),
        }
    }
}

/// Why a URI or a certificate names no identity. Inputs are quoted with
/// [`quote`], never echoed whole.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdentityError {
    #[error("URI is {length_bytes} bytes, the cap is {MAX_SPIFFE_URI_BYTES}")]
    TooLong { length_bytes: usize },
    #[error("{uri:?} is not a spiffe:// URI")]
    NotSpiffe { uri: String },
    #[error("trust domain {found:?} is not {expected:?}")]
    WrongTrustDomain { expected: String, found: String },
    #[error("trust domain {trust_domain:?} is invalid: {reason}")]
    InvalidTrustDomain {
        trust_domain: String,
        reason: &'static str,
    },
    #[error("path {path:?} names no Leasehold identity (expected /region/<r>, /node/<id>, /prober, /admin, /sre or /gateway/<r>)")]
    UnknownPath { path: String },
    #[error("Region name {name:?} is invalid: {reason}")]
    InvalidRegion { name: String, reason: &'static str },
    #[error("node id {id:?} is invalid: {reason}")]
    InvalidNodeId { id: String, reason: &'static str },
    #[error("certificate does not parse: {reason}")]
    Certificate { reason: String },
    #[error("certificate has no URI SAN (a SPIFFE identity is required)")]
    NoUriSan,
    #[error("certificate has {count} URI SANs, a SPIFFE identity is exactly one")]
    ManyUriSans { count: usize },
    /// A verified peer that is someone else than the caller expected.
    #[error("peer is {found}, expected {expected}")]
    Unexpected { expected: String, found: String },
}

/// Checks a trust domain: 1 to [`MAX_TRUST_DOMAIN_BYTES`] bytes of
/// `[a-z0-9.-_]` (the SPIFFE trust-domain charset).
pub fn validate_trust_domain(trust_domain: &str) -> Result<(), IdentityError> {
    let invalid = |reason| IdentityError::InvalidTrustDomain {
        trust_domain: quote(trust_domain),
        reason,
    };
    if trust_domain.is_empty() {
        return Err(invalid("empty"));
    }
    if trust_domain.len() > MAX_TRUST_DOMAIN_BYTES {
        return Err(invalid("longer than 253 bytes"));
    }
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b".-_".contains(&b);
    if !trust_domain.bytes().all(allowed) {
        return Err(invalid("a byte outside [a-z0-9.-_]"));
    }
    Ok(())
}

/// Checks a Region name by the allocator's `RegionId` rules: 1 to
/// [`MAX_REGION_NAME_BYTES`] bytes of `[a-z0-9-]`.
pub fn validate_region(name: &str) -> Result<(), IdentityError> {
    let invalid = |reason| IdentityError::InvalidRegion {
        name: quote(name),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("empty"));
    }
    if name.len() > MAX_REGION_NAME_BYTES {
        return Err(invalid("longer than 64 bytes"));
    }
    let allowed = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-';
    if !name.bytes().all(allowed) {
        return Err(invalid("a byte outside [a-z0-9-]"));
    }
    Ok(())
}

fn parse_node_id(text: &str) -> Result<u64, IdentityError> {
    let invalid = |reason| IdentityError::InvalidNodeId {
        id: quote(text),
        reason,
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid("not a decimal number"));
    }
    // Canonical form only: `/node/03` and `/node/3` must not be two names.
    if text.len() > 1 && text.starts_with('0') {
        return Err(invalid("leading zero"));
    }
    let id: u64 = text.parse().map_err(|_| invalid("above u64::MAX"))?;
    if id == 0 {
        return Err(invalid("node ids start at 1"));
    }
    Ok(id)
}

/// The identity named by `uri`, which must be `spiffe://<trust_domain>/…`
/// with one of the paths of the table in the module doc.
pub fn parse_spiffe(uri: &str, trust_domain: &str) -> Result<Identity, IdentityError> {
    if uri.len() > MAX_SPIFFE_URI_BYTES {
        return Err(IdentityError::TooLong {
            length_bytes: uri.len(),
        });
    }
    let rest = uri
        .strip_prefix(SCHEME)
        .ok_or_else(|| IdentityError::NotSpiffe { uri: quote(uri) })?;
    let (found_domain, path) = match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => (rest, ""),
    };
    if found_domain != trust_domain {
        return Err(IdentityError::WrongTrustDomain {
            expected: quote(trust_domain),
            found: quote(found_domain),
        });
    }
    let unknown = || IdentityError::UnknownPath { path: quote(path) };
    let segments: Vec<&str> = path.split('/').skip(1).collect();
    match segments.as_slice() {
        ["prober"] => Ok(Identity::Prober),
        ["admin"] => Ok(Identity::Admin),
        ["sre"] => Ok(Identity::Sre),
        ["region", name] => validate_region(name).map(|()| Identity::Region(name.to_string())),
        ["gateway", name] => validate_region(name).map(|()| Identity::Gateway(name.to_string())),
        ["node", id] => parse_node_id(id).map(Identity::Node),
        _ => Err(unknown()),
    }
}

/// A DER certificate's `notAfter`, None when it cannot be read.
pub fn not_after_of(cert_der: &[u8]) -> Option<std::time::SystemTime> {
    let (_, cert) = X509Certificate::from_der(cert_der).ok()?;
    let seconds = u64::try_from(cert.validity().not_after.timestamp()).ok()?;
    std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs(seconds))
}

/// The identity an operator writes: the SPIFFE path without the scheme
/// and trust domain (`region/us`, `gateway/eu`, `node/3`, `sre`; a leading
/// `/` is accepted), parsed by the same strict rules as [`parse_spiffe`].
pub fn parse_identity_path(text: &str) -> Result<Identity, IdentityError> {
    const DOMAIN: &str = "operator.invalid";
    let path = text.strip_prefix('/').unwrap_or(text);
    parse_spiffe(&format!("{SCHEME}{DOMAIN}/{path}"), DOMAIN)
}

impl Identity {
    /// The path an operator writes ([`parse_identity_path`]'s input):
    /// `region/us`, `node/3`, `sre`.
    pub fn path(&self) -> String {
        let shown = self.to_string();
        shown.trim_start_matches('/').to_string()
    }
}

/// The identity of a DER certificate: exactly one URI SAN, a SPIFFE URI of
/// `trust_domain` naming a Leasehold identity. Zero or several URI SANs
/// are refused (SPIFFE's X.509-SVID rule), whatever else the certificate
/// says. Chain and validity are the TLS verifier's job, not this one's.
pub fn identity_of(cert_der: &[u8], trust_domain: &str) -> Result<Identity, IdentityError> {
    let (_, cert) =
        X509Certificate::from_der(cert_der).map_err(|error| IdentityError::Certificate {
            reason: error.to_string(),
        })?;
    let san = cert
        .subject_alternative_name()
        .map_err(|error| IdentityError::Certificate {
            reason: format!("subjectAltName: {error}"),
        })?;
    let uris: Vec<&str> = san
        .map(|extension| {
            extension
                .value
                .general_names
                .iter()
                .filter_map(|name| match name {
                    GeneralName::URI(uri) => Some(*uri),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    match uris.as_slice() {
        [] => Err(IdentityError::NoUriSan),
        [uri] => parse_spiffe(uri, trust_domain),
        many => Err(IdentityError::ManyUriSans { count: many.len() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TD: &str = "leasehold.local";

    #[test]
    fn parse_spiffe_accepts_each_kind_and_refuses_everything_else() {
        let good = [
            (
                "spiffe://leasehold.local/region/eu",
                Identity::Region("eu".into()),
            ),
            (
                "spiffe://leasehold.local/region/eu-west-1",
                Identity::Region("eu-west-1".into()),
            ),
            ("spiffe://leasehold.local/node/1", Identity::Node(1)),
            (
                "spiffe://leasehold.local/node/18446744073709551615",
                Identity::Node(u64::MAX),
            ),
            ("spiffe://leasehold.local/prober", Identity::Prober),
            ("spiffe://leasehold.local/admin", Identity::Admin),
            ("spiffe://leasehold.local/sre", Identity::Sre),
            (
                "spiffe://leasehold.local/gateway/us",
                Identity::Gateway("us".into()),
            ),
        ];
        for (uri, identity) in good {
            assert_eq!(parse_spiffe(uri, TD), Ok(identity), "{uri}");
        }
        let long_region = format!("spiffe://leasehold.local/region/{}", "a".repeat(65));
        let huge = format!("spiffe://leasehold.local/region/{}", "a".repeat(4096));
        let bad: [&str; 26] = [
            "",
            "https://leasehold.local/admin",
            "SPIFFE://leasehold.local/admin",
            "spiffe://other.local/admin",
            "spiffe://leasehold.local.evil/admin",
            "spiffe://leasehold.local",
            "spiffe://leasehold.local/",
            "spiffe://leasehold.local/admin/",
            "spiffe://leasehold.local//admin",
            "spiffe://leasehold.local/Admin",
            "spiffe://leasehold.local/admin?x=1",
            "spiffe://leasehold.local/admin#f",
            "spiffe://leasehold.local/region",
            "spiffe://leasehold.local/region/",
            "spiffe://leasehold.local/region/EU",
            "spiffe://leasehold.local/region/eu_west",
            "spiffe://leasehold.local/region/e%75",
            "spiffe://leasehold.local/region/eu/extra",
            &long_region,
            &huge,
            "spiffe://leasehold.local/node/0",
            "spiffe://leasehold.local/node/03",
            "spiffe://leasehold.local/node/-1",
            "spiffe://leasehold.local/node/+1",
            "spiffe://leasehold.local/node/18446744073709551616",
            "spiffe://leasehold.local/gateway/",
        ];
        for uri in bad {
            assert!(parse_spiffe(uri, TD).is_err(), "{uri} was accepted");
        }
    }

    #[test]
    fn a_long_uri_is_refused_by_length_without_quoting_it() {
        let uri = format!("spiffe://{TD}/region/{}", "a".repeat(5000));
        let error = parse_spiffe(&uri, TD).unwrap_err();
        assert_eq!(
            error,
            IdentityError::TooLong {
                length_bytes: uri.len()
            }
        );
        let message = error.to_string();
        assert!(message.len() < 100, "{message}");
    }

    #[test]
    fn operator_paths_parse_strictly_and_round_trip() {
        for identity in [
            Identity::Region("us".into()),
            Identity::Gateway("eu".into()),
            Identity::Node(3),
            Identity::Sre,
            Identity::Admin,
            Identity::Prober,
        ] {
            assert_eq!(parse_identity_path(&identity.path()), Ok(identity.clone()));
            assert_eq!(parse_identity_path(&identity.to_string()), Ok(identity));
        }
        assert_eq!(Identity::Region("us".into()).path(), "region/us");
        for bad in [
            "",
            "region",
            "region/US",
            "node/0",
            "admin/",
            "bogus/x",
            "//sre",
        ] {
            assert!(parse_identity_path(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn trust_domains_are_checked() {
        assert!(validate_trust_domain("leasehold.local").is_ok());
        assert!(validate_trust_domain("a_b-c.9").is_ok());
        for bad in ["", "Leasehold.local", "a/b", "a:1", &"a".repeat(254)] {
            assert!(validate_trust_domain(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn display_is_the_spiffe_path_and_stems_name_the_files() {
        assert_eq!(Identity::Region("eu".into()).to_string(), "/region/eu");
        assert_eq!(Identity::Node(7).uri(TD), "spiffe://leasehold.local/node/7");
        assert_eq!(Identity::Gateway("us".into()).file_stem(), "gateway-us");
        assert_eq!(Identity::Sre.file_stem(), "sre");
    }

    fn any_identity() -> impl Strategy<Value = Identity> {
        let region = "[a-z0-9-]{1,64}";
        prop_oneof![
            region.prop_map(Identity::Region),
            (1u64..=u64::MAX).prop_map(Identity::Node),
            Just(Identity::Prober),
            Just(Identity::Admin),
            Just(Identity::Sre),
            region.prop_map(Identity::Gateway),
        ]
    }

    proptest! {
        #[test]
        fn parse_spiffe_round_trips_every_identity(
            identity in any_identity(),
            trust_domain in "[a-z0-9._-]{1,40}",
        ) {
            let uri = identity.uri(&trust_domain);
            prop_assert_eq!(parse_spiffe(&uri, &trust_domain), Ok(identity));
        }

        #[test]
        fn parse_spiffe_never_panics_on_any_input(uri in ".{0,200}") {
            let _ = parse_spiffe(&uri, TD);
        }
    }
}
