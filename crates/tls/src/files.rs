//! Certificate, key and CA files: reading PEM with errors that name the file
//! and the reason, and the change stamps that `reload` compares.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use x509_parser::prelude::{ASN1Time, FromDer, X509Certificate};

use crate::error::TlsError;
use crate::identity::{identity_of, Identity};

/// Largest PEM file read, in bytes: a chain of a few certificates is a few
/// KiB, and a misnamed multi-GB file must not be read into memory.
pub const MAX_PEM_FILE_BYTES: u64 = 1024 * 1024;

/// The three files of one component's TLS identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The CA certificate(s) peers are verified against (PEM).
    pub ca: PathBuf,
    /// This component's certificate chain, leaf first (PEM).
    pub cert: PathBuf,
    /// This component's private key (PEM: PKCS#8, SEC1 or PKCS#1).
    pub key: PathBuf,
}

impl TlsFiles {
    /// `<dir>/ca.pem`, `<dir>/<stem>.pem`, `<dir>/<stem>.key`: the layout
    /// `certs::init` writes.
    pub fn in_dir(dir: &Path, stem: &str) -> Self {
        TlsFiles {
            ca: dir.join("ca.pem"),
            cert: dir.join(format!("{stem}.pem")),
            key: dir.join(format!("{stem}.key")),
        }
    }

    pub(crate) fn all(&self) -> [&Path; 3] {
        [&self.ca, &self.cert, &self.key]
    }
}

pub(crate) fn load_error(file: &Path, reason: impl Into<String>) -> TlsError {
    TlsError::Load {
        file: file.to_path_buf(),
        reason: reason.into(),
    }
}

/// The bytes of `file`, at most [`MAX_PEM_FILE_BYTES`].
fn read_bounded(file: &Path) -> Result<Vec<u8>, TlsError> {
    let handle = fs::File::open(file).map_err(|error| load_error(file, error.to_string()))?;
    let mut bytes = Vec::new();
    handle
        .take(MAX_PEM_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|error| load_error(file, error.to_string()))?;
    if bytes.len() as u64 > MAX_PEM_FILE_BYTES {
        return Err(load_error(
            file,
            format!("larger than {MAX_PEM_FILE_BYTES} bytes"),
        ));
    }
    Ok(bytes)
}

/// Every certificate in a PEM file, in order; none is an error.
pub fn load_certs(file: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read_bounded(file)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| load_error(file, format!("invalid PEM: {error}")))?;
    if certs.is_empty() {
        return Err(load_error(file, "no CERTIFICATE section"));
    }
    Ok(certs)
}

/// The first private key of a PEM file.
pub fn load_key(file: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read_bounded(file)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|error| match error {
        rustls_pki_types::pem::Error::NoItemsFound => load_error(file, "no PRIVATE KEY section"),
        other => load_error(file, format!("invalid PEM: {other}")),
    })
}

/// A root store of every certificate of a CA file.
pub fn load_roots(file: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in load_certs(file)? {
        roots
            .add(cert)
            .map_err(|error| load_error(file, format!("not a usable CA certificate: {error}")))?;
    }
    Ok(roots)
}

/// This component's own leaf, checked at load so that a wrong file is an
/// error naming it (and not a refusal by every peer later): it must name an
/// identity of `trust_domain` and must not have expired.
pub fn check_own_cert(
    file: &Path,
    leaf: &CertificateDer<'_>,
    trust_domain: &str,
) -> Result<Identity, TlsError> {
    let identity = identity_of(leaf, trust_domain)
        .map_err(|error| load_error(file, format!("no usable identity: {error}")))?;
    let (_, cert) = X509Certificate::from_der(leaf)
        .map_err(|error| load_error(file, format!("does not parse: {error}")))?;
    let not_after = cert.validity().not_after;
    if not_after.timestamp() < ASN1Time::now().timestamp() {
        return Err(load_error(file, format!("expired at {not_after}")));
    }
    Ok(identity)
}

/// What `reload` compares to notice a changed file: modification time,
/// length and (on unix) inode, so an atomic rename or a symlink swap (how
/// Kubernetes updates a mounted secret) is seen even within one mtime tick.
/// `None` when the file cannot be read: a missing file is a change too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Stamp(Option<(SystemTime, u64, u64)>);

pub(crate) fn stamp(file: &Path) -> Stamp {
    let Ok(metadata) = fs::metadata(file) else {
        return Stamp(None);
    };
    #[cfg(unix)]
    let inode = std::os::unix::fs::MetadataExt::ino(&metadata);
    #[cfg(not(unix))]
    let inode = 0;
    Stamp(
        metadata
            .modified()
            .ok()
            .map(|modified| (modified, metadata.len(), inode)),
    )
}

/// The identity `settings`' certificate file names (its first certificate),
/// checked as [`check_own_cert`] does: what a component compares with what
/// it is configured to be (an agent's `/region/<its region>`).
pub fn own_identity(files: &TlsFiles, trust_domain: &str) -> Result<Identity, TlsError> {
    let certs = load_certs(&files.cert)?;
    let leaf = certs
        .first()
        .ok_or_else(|| load_error(&files.cert, "no certificate"))?;
    check_own_cert(&files.cert, leaf, trust_domain)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_file_is_named_with_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("absent.pem");
        let error = load_certs(&file).unwrap_err().to_string();
        assert!(error.contains("absent.pem"), "{error}");
        assert!(error.contains("No such file"), "{error}");
    }

    #[test]
    fn a_file_without_pem_sections_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("garbage.pem");
        fs::write(&file, "not a certificate").unwrap();
        let error = load_certs(&file).unwrap_err().to_string();
        assert!(
            error.contains("garbage.pem") && error.contains("no CERTIFICATE"),
            "{error}"
        );
        let error = load_key(&file).unwrap_err().to_string();
        assert!(
            error.contains("garbage.pem") && error.contains("no PRIVATE KEY"),
            "{error}"
        );
    }

    #[test]
    fn an_oversized_file_is_refused_without_reading_it_all() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("huge.pem");
        fs::write(&file, vec![b'a'; MAX_PEM_FILE_BYTES as usize + 1]).unwrap();
        let error = load_certs(&file).unwrap_err().to_string();
        assert!(error.contains("larger than"), "{error}");
    }

    #[test]
    fn a_rewritten_file_changes_its_stamp() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.pem");
        assert_eq!(stamp(&file), Stamp(None));
        fs::write(&file, "one").unwrap();
        let first = stamp(&file);
        let other = dir.path().join("b.pem");
        fs::write(&other, "two").unwrap();
        fs::rename(&other, &file).unwrap();
        assert_ne!(stamp(&file), first);
    }
}
