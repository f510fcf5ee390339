//! Certificates for newcomers (rcgen): a CA and one certificate per
//! identity, so a fresh checkout runs with mTLS on from one command, and
//! [`issue`] / [`issue_with_uris`] for tests that need an expired
//! certificate, one of another CA or one without an identity.
//!
//! Every leaf carries its SPIFFE URI SAN plus `DNS:localhost` and
//! `IP:127.0.0.1` (so it can also serve loopback clients that verify by
//! name), both server and client usage (a node is both), an ECDSA P-256
//! key. Key files are written mode 0600; every file is written to a
//! temporary name then renamed, so a reloading reader never sees half a
//! file.

use std::fs;
use std::io::Write;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::string::Ia5String;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use time::OffsetDateTime;

use crate::identity::{validate_region, validate_trust_domain, Identity};

/// Default validity of generated certificates, in days: short, so a leaked
/// key stops working within a quarter without a revocation (rotate before;
/// docs/security.md, "Revocation and Region admission").
pub const DEFAULT_VALIDITY_DAYS: u64 = 90;
/// Longest validity [`init`] writes, in days: long-lived keys are what
/// rotation exists to avoid.
pub const MAX_VALIDITY_DAYS: u64 = 3 * 365;
/// Most Regions [`init`] issues for (the allocator's `MAX_REGIONS`).
pub const MAX_INIT_REGIONS: usize = 256;
/// Most allocator nodes [`init`] issues for.
pub const MAX_INIT_NODES: u64 = 64;
/// How far back `not_before` is set: a peer whose clock is a little behind
/// must not refuse a certificate made a second ago.
pub const CLOCK_SKEW_ALLOWANCE: Duration = Duration::from_secs(5 * 60);

const DAY: Duration = Duration::from_secs(24 * 60 * 60);

/// Why certificates could not be made or written.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    #[error("certificate generation: {reason}")]
    Generate { reason: String },
    #[error("{}: {reason}", file.display())]
    Io { file: PathBuf, reason: String },
    #[error("{} already exists: refusing to replace the CA (every certificate it signed would stop verifying); use force to replace it", file.display())]
    CaExists { file: PathBuf },
    #[error("invalid input: {reason}")]
    Invalid { reason: String },
}

fn generate_error(error: rcgen::Error) -> CertsError {
    CertsError::Generate {
        reason: error.to_string(),
    }
}

fn io_error(file: &Path, error: std::io::Error) -> CertsError {
    CertsError::Io {
        file: file.to_path_buf(),
        reason: error.to_string(),
    }
}

/// When a certificate is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Validity {
    pub not_before: SystemTime,
    pub not_after: SystemTime,
}

impl Validity {
    /// From [`CLOCK_SKEW_ALLOWANCE`] ago to `days` (at most
    /// [`MAX_VALIDITY_DAYS`], larger values are clamped) from now.
    pub fn days_from_now(days: u64) -> Self {
        let now = SystemTime::now();
        // Clamped, so the multiplication below cannot overflow.
        let days = u32::try_from(days.min(MAX_VALIDITY_DAYS)).unwrap_or(1);
        Validity {
            not_before: now - CLOCK_SKEW_ALLOWANCE,
            not_after: now + DAY * days,
        }
    }

    /// Ended yesterday (tests of expiry).
    pub fn expired() -> Self {
        let now = SystemTime::now();
        Validity {
            not_before: now - DAY * 2,
            not_after: now - DAY,
        }
    }

    fn apply(&self, params: &mut CertificateParams) {
        params.not_before = OffsetDateTime::from(self.not_before);
        params.not_after = OffsetDateTime::from(self.not_after);
    }
}

/// A CA able to sign leaves.
pub struct CertificateAuthority {
    issuer: Issuer<'static, KeyPair>,
    cert_pem: String,
}

impl CertificateAuthority {
    /// A new self-signed CA for `trust_domain` (may sign leaves only: path
    /// length 0).
    pub fn generate(trust_domain: &str, validity: Validity) -> Result<Self, CertsError> {
        let key = KeyPair::generate().map_err(generate_error)?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, format!("Leasehold CA ({trust_domain})"));
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity.apply(&mut params);
        let cert = params.self_signed(&key).map_err(generate_error)?;
        Ok(CertificateAuthority {
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        })
    }

    /// A CA from its PEM certificate and key files (`ca.pem`, `ca.key`).
    pub fn load(cert: &Path, key: &Path) -> Result<Self, CertsError> {
        let cert_pem = fs::read_to_string(cert).map_err(|error| io_error(cert, error))?;
        let key_pem = fs::read_to_string(key).map_err(|error| io_error(key, error))?;
        let key_pair = KeyPair::from_pem(&key_pem).map_err(|error| CertsError::Io {
            file: key.to_path_buf(),
            reason: error.to_string(),
        })?;
        let issuer =
            Issuer::from_ca_cert_pem(&cert_pem, key_pair).map_err(|error| CertsError::Io {
                file: cert.to_path_buf(),
                reason: error.to_string(),
            })?;
        Ok(CertificateAuthority { issuer, cert_pem })
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> String {
        self.issuer.key().serialize_pem()
    }
}

/// A leaf certificate and its key.
pub struct IssuedCert {
    pub cert_pem: String,
    pub key_pem: String,
    pub cert_der: Vec<u8>,
}

impl IssuedCert {
    /// Writes the certificate and (mode 0600) the key, each atomically.
    pub fn write(&self, cert: &Path, key: &Path) -> Result<(), CertsError> {
        write_atomically(key, self.key_pem.as_bytes(), true)?;
        write_atomically(cert, self.cert_pem.as_bytes(), false)
    }
}

/// A leaf for `identity` in `trust_domain`, signed by `ca`.
pub fn issue(
    ca: &CertificateAuthority,
    identity: &Identity,
    trust_domain: &str,
    validity: Validity,
) -> Result<IssuedCert, CertsError> {
    issue_with_uris(ca, &[&identity.uri(trust_domain)], validity)
}

/// A leaf with exactly these URI SANs (none, several, of another trust
/// domain: what the refusal tests need), plus the loopback SANs.
pub fn issue_with_uris(
    ca: &CertificateAuthority,
    uris: &[&str],
    validity: Validity,
) -> Result<IssuedCert, CertsError> {
    let key = KeyPair::generate().map_err(generate_error)?;
    let mut params = CertificateParams::default();
    let common_name = uris.first().copied().unwrap_or("leasehold");
    params
        .distinguished_name
        .push(DnType::CommonName, common_name);
    let ia5 = |text: &str| {
        Ia5String::try_from(text.to_string()).map_err(|error| CertsError::Invalid {
            reason: format!("{text:?}: {error}"),
        })
    };
    for uri in uris {
        params.subject_alt_names.push(SanType::URI(ia5(uri)?));
    }
    params
        .subject_alt_names
        .push(SanType::DnsName(ia5("localhost")?));
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    params.is_ca = IsCa::NoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    validity.apply(&mut params);
    let cert = params.signed_by(&key, &ca.issuer).map_err(generate_error)?;
    Ok(IssuedCert {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
        cert_der: cert.der().to_vec(),
    })
}

/// Settings of [`init_with`].
#[derive(Clone, Debug)]
pub struct InitOptions {
    /// Replace an existing CA (and so every certificate).
    pub force: bool,
    /// 1 to [`MAX_VALIDITY_DAYS`].
    pub validity_days: u64,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            force: false,
            validity_days: DEFAULT_VALIDITY_DAYS,
        }
    }
}

/// Every identity of a deployment: each Region and its gateway, nodes 1
/// to `nodes`, the prober, admin and sre.
pub fn identities(regions: &[String], nodes: u64) -> Vec<Identity> {
    let mut all: Vec<Identity> = regions.iter().cloned().map(Identity::Region).collect();
    all.extend((1..=nodes).map(Identity::Node));
    all.extend([Identity::Prober, Identity::Admin, Identity::Sre]);
    all.extend(regions.iter().cloned().map(Identity::Gateway));
    all
}

/// [`init_with`] with [`InitOptions::default`]: never replaces a CA.
pub fn init(
    dir: &Path,
    trust_domain: &str,
    regions: &[String],
    nodes: u64,
) -> Result<Vec<PathBuf>, CertsError> {
    init_with(dir, trust_domain, regions, nodes, &InitOptions::default())
}

fn check_init_input(
    trust_domain: &str,
    regions: &[String],
    nodes: u64,
    options: &InitOptions,
) -> Result<(), CertsError> {
    let invalid = |reason: String| CertsError::Invalid { reason };
    validate_trust_domain(trust_domain).map_err(|error| invalid(error.to_string()))?;
    if regions.len() > MAX_INIT_REGIONS {
        return Err(invalid(format!(
            "{} Regions, the cap is {MAX_INIT_REGIONS}",
            regions.len()
        )));
    }
    for (index, region) in regions.iter().enumerate() {
        validate_region(region).map_err(|error| invalid(error.to_string()))?;
        if regions[..index].contains(region) {
            return Err(invalid(format!("Region {region:?} is listed twice")));
        }
    }
    if nodes > MAX_INIT_NODES {
        return Err(invalid(format!(
            "{nodes} nodes, the cap is {MAX_INIT_NODES}"
        )));
    }
    if !(1..=MAX_VALIDITY_DAYS).contains(&options.validity_days) {
        return Err(invalid(format!(
            "validity of {} days is outside 1..={MAX_VALIDITY_DAYS}",
            options.validity_days
        )));
    }
    Ok(())
}

/// Writes `ca.pem`, `ca.key` and `<stem>.pem` + `<stem>.key` for every
/// identity of [`identities`] into `dir` (created if missing), and returns
/// the paths written, CA first. Refuses when `ca.pem` or `ca.key` exists,
/// unless `options.force`.
pub fn init_with(
    dir: &Path,
    trust_domain: &str,
    regions: &[String],
    nodes: u64,
    options: &InitOptions,
) -> Result<Vec<PathBuf>, CertsError> {
    check_init_input(trust_domain, regions, nodes, options)?;
    let ca_cert = dir.join("ca.pem");
    let ca_key = dir.join("ca.key");
    if !options.force {
        if let Some(existing) = [&ca_cert, &ca_key].into_iter().find(|file| file.exists()) {
            return Err(CertsError::CaExists {
                file: existing.clone(),
            });
        }
    }
    fs::create_dir_all(dir).map_err(|error| io_error(dir, error))?;
    let validity = Validity::days_from_now(options.validity_days);
    let ca = CertificateAuthority::generate(trust_domain, validity)?;
    write_atomically(&ca_key, ca.key_pem().as_bytes(), true)?;
    write_atomically(&ca_cert, ca.cert_pem().as_bytes(), false)?;
    let mut written = vec![ca_cert, ca_key];
    for identity in identities(regions, nodes) {
        let stem = identity.file_stem();
        let cert = dir.join(format!("{stem}.pem"));
        let key = dir.join(format!("{stem}.key"));
        issue(&ca, &identity, trust_domain, validity)?.write(&cert, &key)?;
        written.extend([cert, key]);
    }
    Ok(written)
}

/// Writes `bytes` to a temporary file beside `file` (mode 0600 when
/// `private`, from creation on: the key is never readable by others, not
/// even briefly) and renames it over `file`.
pub fn write_atomically(file: &Path, bytes: &[u8], private: bool) -> Result<(), CertsError> {
    let mut temporary = file.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let mut open = fs::OpenOptions::new();
    open.write(true).create(true).truncate(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        open.mode(if private { 0o600 } else { 0o644 });
    }
    let mut handle = open
        .open(&temporary)
        .map_err(|error| io_error(&temporary, error))?;
    #[cfg(unix)]
    {
        // An existing temporary keeps its old mode through `open`.
        use std::os::unix::fs::PermissionsExt;
        let mode = if private { 0o600 } else { 0o644 };
        handle
            .set_permissions(fs::Permissions::from_mode(mode))
            .map_err(|error| io_error(&temporary, error))?;
    }
    handle
        .write_all(bytes)
        .and_then(|()| handle.sync_all())
        .map_err(|error| io_error(&temporary, error))?;
    fs::rename(&temporary, file).map_err(|error| io_error(file, error))
}
