//! TLS for the "realistic direct" baselines: hosted Redis and Postgres require TLS, so a
//! per-request isolate pays a TLS handshake on every fresh connection, and the edge reaches the
//! sidecar over HTTPS. One throwaway CA and a certificate for 127.0.0.1 (the testkit's), and the
//! clients that trust it.

use std::sync::Arc;

pub struct BenchTls {
    /// PEM paths: the CA clients trust, and the servers' certificate and key.
    pub ca: String,
    pub cert: String,
    pub key: String,
    _dir: tempfile::TempDir,
}

impl BenchTls {
    pub fn make() -> BenchTls {
        let dir = tempfile::tempdir().expect("tempdir for certificates");
        let c = ferry_testkit::certs::make(dir.path());
        BenchTls {
            ca: c.ca,
            cert: c.cert,
            key: c.key,
            _dir: dir,
        }
    }

    /// rustls trusting the CA alone.
    pub fn client_config(&self) -> Arc<rustls::ClientConfig> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::CertificateDer;
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(&self.ca).expect("read the CA") {
            roots.add(cert.expect("CA PEM")).expect("add the CA");
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        Arc::new(
            rustls::ClientConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_root_certificates(roots)
                .with_no_client_auth(),
        )
    }

    pub fn redis(&self) -> tokio_rustls::TlsConnector {
        tokio_rustls::TlsConnector::from(self.client_config())
    }

    pub fn postgres(&self) -> tokio_postgres_rustls::MakeRustlsConnect {
        tokio_postgres_rustls::MakeRustlsConnect::new((*self.client_config()).clone())
    }

    /// The CA as reqwest wants it (for the sidecar's HTTPS listener).
    pub fn reqwest_root(&self) -> reqwest::Certificate {
        let pem = std::fs::read(&self.ca).expect("read the CA");
        reqwest::Certificate::from_pem(&pem).expect("CA PEM")
    }
}
