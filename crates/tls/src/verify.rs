//! Peer verification with SPIFFE identities, on both sides of a handshake.
//!
//! - [`SpiffeClientVerifier`] (server side): rustls's webpki client
//!   verifier (chain to the CA, validity, clientAuth usage), then the
//!   certificate must name an identity of the trust domain. Refusing inside
//!   the handshake sends the client a TLS alert, so a client without a
//!   valid identity sees its first read fail instead of a silent close.
//! - [`SpiffeServerVerifier`] (client side): the chain verified with webpki
//!   against the CA (validity, serverAuth usage), then the SPIFFE URI SAN
//!   checked against an [`ExpectedPeer`] *instead of* a DNS name: by SPIFFE
//!   convention a server certificate may carry only its URI SAN.
//!
//! Neither does revocation: certificates are short-lived files, rotated.

use std::fmt;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::verify_server_cert_signed_by_trust_anchor;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, OtherError};
use rustls::{RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::identity::{identity_of, Identity, IdentityError};

/// Which server a client accepts, beyond "its chain verifies to the CA".
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExpectedPeer {
    /// Any identity of the trust domain.
    AnyOfTrustDomain,
    /// Any allocator node (`/node/<id>`): what a client of the allocator
    /// expects when it does not know which node answers at an address; a
    /// Region's or a gateway's certificate cannot pose as the allocator.
    AnyNode,
    /// Any Region's agent (`/region/<r>`): the prober's health probes.
    AnyRegion,
    /// Exactly this identity (e.g. `/node/2` for node 2's raft port).
    Identity(Identity),
}

/// An identity error as a rustls certificate error (the handshake then
/// fails with a `bad_certificate` alert carrying our reason locally).
fn refused(error: IdentityError) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(error))))
}

/// The reason of a failed handshake, readable: rustls shows our identity
/// errors in their `Debug` form (`Other(OtherError(NoUriSan))`), so those
/// are unwrapped to their own message.
pub(crate) fn handshake_reason(error: &std::io::Error) -> String {
    let rustls_error = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    if let Some(rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(inner)))) =
        rustls_error
    {
        return format!("invalid peer certificate: {inner}");
    }
    error.to_string()
}

/// Server side: webpki client verification, then a SPIFFE identity of the
/// trust domain.
#[derive(Debug)]
pub(crate) struct SpiffeClientVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    trust_domain: Arc<str>,
}

impl SpiffeClientVerifier {
    pub(crate) fn new(inner: Arc<dyn ClientCertVerifier>, trust_domain: Arc<str>) -> Self {
        SpiffeClientVerifier {
            inner,
            trust_domain,
        }
    }
}

impl ClientCertVerifier for SpiffeClientVerifier {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        true
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        identity_of(end_entity, &self.trust_domain).map_err(refused)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// Client side: the chain against the CA, then the SPIFFE identity against
/// what the caller expects. The server name given to rustls is ignored.
pub(crate) struct SpiffeServerVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
    trust_domain: Arc<str>,
    expected: ExpectedPeer,
}

impl SpiffeServerVerifier {
    pub(crate) fn new(
        roots: Arc<RootCertStore>,
        provider: Arc<CryptoProvider>,
        trust_domain: Arc<str>,
        expected: ExpectedPeer,
    ) -> Self {
        SpiffeServerVerifier {
            roots,
            provider,
            trust_domain,
            expected,
        }
    }
}

impl fmt::Debug for SpiffeServerVerifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpiffeServerVerifier")
            .field("trust_domain", &self.trust_domain)
            .field("expected", &self.expected)
            .finish_non_exhaustive()
    }
}

impl ServerCertVerifier for SpiffeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let found = identity_of(end_entity, &self.trust_domain).map_err(refused)?;
        match &self.expected {
            ExpectedPeer::AnyOfTrustDomain => Ok(ServerCertVerified::assertion()),
            ExpectedPeer::AnyNode if matches!(found, crate::identity::Identity::Node(_)) => {
                Ok(ServerCertVerified::assertion())
            }
            ExpectedPeer::AnyNode => Err(refused(IdentityError::Unexpected {
                expected: "/node/<id>".to_string(),
                found: found.to_string(),
            })),
            ExpectedPeer::AnyRegion if matches!(found, crate::identity::Identity::Region(_)) => {
                Ok(ServerCertVerified::assertion())
            }
            ExpectedPeer::AnyRegion => Err(refused(IdentityError::Unexpected {
                expected: "/region/<r>".to_string(),
                found: found.to_string(),
            })),
            ExpectedPeer::Identity(expected) if *expected == found => {
                Ok(ServerCertVerified::assertion())
            }
            ExpectedPeer::Identity(expected) => Err(refused(IdentityError::Unexpected {
                expected: expected.to_string(),
                found: found.to_string(),
            })),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}
