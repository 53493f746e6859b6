//! TLS material for a run: a throwaway CA and a server certificate for
//! `127.0.0.1`/`localhost` (rcgen), written as PEM files for the firewall and
//! nginx, plus the rustls configs of the load generator (client) and of the
//! canned upstream (server).
//!
//! Invariants: everything uses rustls with ring (no aws-lc, no OpenSSL in
//! this process); the client trusts only the run's CA; ALPN is set per
//! protocol so an `h2` run really speaks HTTP/2.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Why TLS material could not be made.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// rcgen failed.
    #[error("generating certificates: {0}")]
    Generate(#[from] rcgen::Error),
    /// rustls refused the material.
    #[error("building the rustls config: {0}")]
    Rustls(#[from] rustls::Error),
    /// Reading a PEM file failed.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: rustls_pki_types::pem::Error,
    },
    /// Writing the PEM files failed.
    #[error("writing {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
}

/// A run's CA and server certificate.
pub struct Material {
    /// The server certificate chain (leaf, CA), PEM file.
    pub cert_file: PathBuf,
    /// The server key, PEM file.
    pub key_file: PathBuf,
    chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
    ca_der: CertificateDer<'static>,
}

// === impl Material ===

impl Material {
    /// Generates a CA and a server certificate into `dir`.
    pub fn generate(dir: &Path) -> Result<Material, TlsError> {
        let ca_key = KeyPair::generate()?;
        let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "mcp-bench CA");
        let ca_cert = ca_params.self_signed(&ca_key)?;
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate()?;
        let params = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])?;
        let cert = params.signed_by(&key, &issuer)?;
        let cert_file = dir.join("server.crt");
        let key_file = dir.join("server.key");
        write(&cert_file, &format!("{}{}", cert.pem(), ca_cert.pem()))?;
        write(&key_file, &key.serialize_pem())?;
        Ok(Material {
            cert_file,
            key_file,
            chain: vec![cert.der().clone(), ca_cert.der().clone()],
            key_der: key.serialize_der(),
            ca_der: ca_cert.der().clone(),
        })
    }

    /// A client config trusting only the run's CA, offering `alpn`.
    pub fn client(&self, alpn: &[&[u8]]) -> Result<Arc<ClientConfig>, TlsError> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca_der.clone())?;
        let mut cfg =
            ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots)
                .with_no_client_auth();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(cfg))
    }

    /// A server config for the canned upstream (ALPN `h2`, `http/1.1`).
    pub fn server(&self) -> Result<Arc<ServerConfig>, TlsError> {
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()));
        let mut cfg =
            ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_no_client_auth()
                .with_single_cert(self.chain.clone(), key)?;
        cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Arc::new(cfg))
    }
}

fn write(path: &Path, text: &str) -> Result<(), TlsError> {
    std::fs::write(path, text).map_err(|source| TlsError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Loads a server config from PEM files (the `upstream` command's
/// `--tls-cert`/`--tls-key`).
pub fn server_from_files(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    use rustls_pki_types::pem::PemObject;
    let read_err = |path: &Path| {
        let path = path.to_owned();
        move |source: rustls_pki_types::pem::Error| TlsError::Read { path, source }
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(read_err(cert))?
        .collect::<Result<_, _>>()
        .map_err(read_err(cert))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(read_err(key))?;
    let mut cfg =
        ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(chain, key)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}
