//! TLS to the server (`tls.mode`): the rustls client configuration on the ring provider for
//! `require` (encrypted, the certificate not checked, as libpq's `sslmode=require`) and
//! `verify-full` (the chain checked against `ca_file`, or the bundled Mozilla roots without
//! one, and the URL's host checked against the certificate's names).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::config::{TlsConfig, TlsMode};
use crate::error::PgError;

/// The connector for `tls`, or `None` for `disable`.
///
/// # Errors
/// [`PgError::Config`] naming `tls.ca_file` when it cannot be read or holds no certificate.
pub(crate) fn connector(tls: &TlsConfig) -> Result<Option<MakeRustlsConnect>, PgError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| PgError::Tls {
            message: format!("cannot set up TLS: {e}"),
        })?;
    let config = match tls.mode {
        TlsMode::Disable => return Ok(None),
        TlsMode::Require => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(EncryptOnly {
                algorithms: provider.signature_verification_algorithms,
            }))
            .with_no_client_auth(),
        TlsMode::VerifyFull => {
            let roots = match &tls.ca_file {
                Some(path) => roots_from_file(std::path::Path::new(path))?,
                None => RootCertStore {
                    roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
                },
            };
            builder.with_root_certificates(roots).with_no_client_auth()
        }
    };
    Ok(Some(MakeRustlsConnect::new(config)))
}

fn roots_from_file(path: &std::path::Path) -> Result<RootCertStore, PgError> {
    let bad = |message: String| PgError::Config {
        key: "postgres.tls.ca_file".into(),
        message,
    };
    let bytes =
        std::fs::read(path).map_err(|e| bad(format!("cannot read {}: {e}", path.display())))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        let cert = cert.map_err(|e| bad(format!("{} is not PEM: {e}", path.display())))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("{} holds a bad certificate: {e}", path.display())))?;
    }
    if roots.is_empty() {
        return Err(bad(format!("{} holds no PEM certificate", path.display())));
    }
    Ok(roots)
}

/// `require`: any certificate is accepted (no chain, no name), but the handshake signatures
/// are still checked, so the session keys belong to whoever holds the presented key.
#[derive(Debug)]
struct EncryptOnly {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for EncryptOnly {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Whether `e` (or what caused it) is a TLS failure, and then its text with every cause
/// (the handshake's reason: an unknown issuer, a name the certificate does not hold, a server
/// without TLS), with a hint for the certificate cases.
pub(crate) fn tls_failure(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut parts: Vec<String> = Vec::new();
    let mut rustls_error = None;
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(r) = err.downcast_ref::<rustls::Error>() {
            rustls_error = Some(r.clone());
        }
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        cur = err.source();
    }
    let text = parts.join(": ");
    let hint = match rustls_error {
        Some(rustls::Error::InvalidCertificate(_)) => {
            " (tls.mode verify-full: check that tls.ca_file holds the CA that signed the \
             server's certificate and that the URL's host is a name in that certificate)"
        }
        Some(_) => "",
        None if text.contains("TLS") => "",
        None => return None,
    };
    Some(format!("{text}{hint}"))
}
