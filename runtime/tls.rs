//! The TLS set-up every HTTP client colony builds shares (model calls, MCP servers, the script's
//! `http` module, OAuth): rustls with the platform's certificate store, as reqwest's default is,
//! except that the store is read on the first TLS handshake, not when a client is built.
//!
//! Why: reading the store (`/etc/ssl/certs/ca-certificates.crt`, then each of the few hundred
//! files beside it) takes about 5 ms, and reqwest's default does it again for every client it
//! builds. A program that only talks to `http://127.0.0.1` (Ollama, a local proxy, the tests)
//! never needed it, and one that talks TLS reads the store once per process. Verification itself
//! is the platform verifier's, unchanged: [`Lazy`] only defers making it.

use std::sync::{Arc, OnceLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

/// A client builder with colony's TLS set-up; the caller adds its own redirects, timeouts and
/// pool settings.
pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().tls_backend_preconfigured(config().clone())
}

/// One configuration per process (a clone shares its verifier, so the store is read once).
fn config() -> &'static rustls::ClientConfig {
    static CONFIG: OnceLock<rustls::ClientConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let verifier = lazy().clone();
        let mut config = rustls::ClientConfig::builder_with_provider(verifier.provider.clone())
            .with_safe_default_protocol_versions()
            .expect("rustls's default protocol versions")
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        // What reqwest offers when it builds the configuration itself (HTTP/2 enabled).
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        config
    })
}

/// The process's verifier, with the crypto provider reqwest would pick (one installed as the
/// process default, else aws-lc-rs).
fn lazy() -> &'static Arc<Lazy> {
    static LAZY: OnceLock<Arc<Lazy>> = OnceLock::new();
    LAZY.get_or_init(|| {
        let provider = CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::aws_lc_rs::default_provider()));
        Arc::new(Lazy::new(provider))
    })
}

/// The platform verifier, made on the first certificate it is asked to check. A store that
/// cannot be read fails that handshake with the reason, as reqwest's eager build would have
/// failed the client's.
#[derive(Debug)]
struct Lazy {
    provider: Arc<CryptoProvider>,
    verifier: OnceLock<Result<rustls_platform_verifier::Verifier, rustls::Error>>,
}

impl Lazy {
    fn new(provider: Arc<CryptoProvider>) -> Lazy {
        Lazy {
            provider,
            verifier: OnceLock::new(),
        }
    }

    fn verifier(&self) -> Result<&rustls_platform_verifier::Verifier, rustls::Error> {
        self.verifier
            .get_or_init(|| rustls_platform_verifier::Verifier::new(self.provider.clone()))
            .as_ref()
            .map_err(Clone::clone)
    }
}

impl ServerCertVerifier for Lazy {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.verifier()?.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.verifier()?.verify_tls13_signature(message, cert, dss)
    }

    /// Asked for the first message of a handshake, before any certificate: the provider's
    /// schemes, which are what the platform verifier answers on Linux too.
    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn building_clients_does_not_read_the_certificate_store() {
        let _a = client_builder().build().expect("a client");
        let _b = client_builder().build().expect("another");
        assert!(lazy().verifier.get().is_none(), "the store was read");
    }
}
