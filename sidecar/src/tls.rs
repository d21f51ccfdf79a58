//! HTTPS for the sidecar itself (rustls, ring): with `server.tls_cert_path` and
//! `server.tls_key_path` set, the public listener speaks only TLS. Certificates are read at
//! startup; replacing them takes a restart.

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Makes ring the process's rustls provider. Every TLS config here is built with it, but
/// crates that build their own (the redis client's rediss://) ask for the process default, and
/// with two providers compiled in (pgwire-replication brings aws-lc-rs) rustls cannot pick one
/// itself. Idempotent; called at startup and by `AppState::new`.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The rustls server config from PEM files: a certificate chain and its private key.
pub(crate) fn server_config(
    cert_path: &str,
    key_path: &str,
) -> Result<rustls::ServerConfig, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_path)
        .map_err(|e| format!("server.tls_cert_path {cert_path}: {e}"))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("server.tls_cert_path {cert_path}: {e}"))?;
    if certs.is_empty() {
        return Err(format!(
            "server.tls_cert_path {cert_path}: no certificate in it"
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key_path)
        .map_err(|e| format!("server.tls_key_path {key_path}: {e}"))?;
    install_crypto_provider();
    let mut config = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("server.tls_cert_path / tls_key_path: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}
