//! TLS termination with rustls, and certificates that change without a restart.
//!
//! The server config holds a [`ReloadingCert`] resolver instead of a fixed
//! certificate: every handshake reads the current `CertifiedKey` from an
//! `ArcSwap`, and a background task re-reads the PEM files when their
//! modification time or size changes. Open connections keep the certificate
//! they were established with; new handshakes get the new one. A file that
//! fails to parse (for example half-written during a rotation) is logged and
//! the previous certificate stays in service.
//!
//! Files are polled rather than watched with inotify: rotations by
//! orchestrators replace files through symlink swaps and renames that inotify
//! watches on the old inode miss, and one `stat` per interval costs nothing.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Validated `[server.tls]`.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    /// Certificate chain file.
    pub cert: PathBuf,
    /// Private key file.
    pub key: PathBuf,
    /// Change-check interval.
    pub reload_interval: Duration,
}

/// Why a certificate or key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The certificate file is unreadable or holds no certificate.
    #[error("{path}: cannot read certificates: {reason}")]
    Certs {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The key file is unreadable or holds no supported private key.
    #[error("{path}: cannot read private key: {reason}")]
    Key {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// The key does not match a signature scheme rustls supports.
    #[error("{path}: unsupported private key type: {reason}")]
    KeyType {
        /// The file.
        path: PathBuf,
        /// rustls' explanation.
        reason: String,
    },
}

/// A certificate resolver whose certificate can be swapped at any time.
#[derive(Debug)]
pub(crate) struct ReloadingCert {
    current: ArcSwap<CertifiedKey>,
}

// === impl ReloadingCert ===

impl ReloadingCert {
    /// Loads the files once; fails if they are not usable.
    pub(crate) fn load(cfg: &TlsConfig) -> Result<Arc<ReloadingCert>, TlsError> {
        let key = load_certified_key(&cfg.cert, &cfg.key)?;
        Ok(Arc::new(ReloadingCert {
            current: ArcSwap::from_pointee(key),
        }))
    }

    /// Replaces the certificate served to new handshakes.
    pub(crate) fn store(&self, key: CertifiedKey) {
        self.current.store(Arc::new(key));
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

/// Builds the rustls server config: TLS 1.2/1.3, ALPN `h2` then `http/1.1`.
pub(crate) fn server_config(resolver: Arc<ReloadingCert>) -> rustls::ServerConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder =
        rustls::ServerConfig::builder_with_provider(provider).with_safe_default_protocol_versions();
    // `with_safe_default_protocol_versions` only fails for an empty provider,
    // which the ring default never is; fall back to TLS 1.3 only if it does.
    let builder = match builder {
        Ok(b) => b,
        Err(_) => rustls::ServerConfig::builder_with_protocol_versions(&[&rustls::version::TLS13]),
    };
    let mut config = builder.with_no_client_auth().with_cert_resolver(resolver);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config
}

/// Reads a PEM chain and key into a rustls `CertifiedKey`.
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<CertifiedKey, TlsError> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| TlsError::Certs {
            path: cert.to_owned(),
            reason: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Certs {
            path: cert.to_owned(),
            reason: "no CERTIFICATE block found".to_owned(),
        });
    }
    let der = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.to_owned(),
        reason: e.to_string(),
    })?;
    let signing =
        rustls::crypto::ring::sign::any_supported_type(&der).map_err(|e| TlsError::KeyType {
            path: key.to_owned(),
            reason: e.to_string(),
        })?;
    Ok(CertifiedKey::new(certs, signing))
}

/// Re-reads the certificate files whenever they change, until the task is
/// dropped. Runs off the request path.
pub(crate) async fn watch(resolver: Arc<ReloadingCert>, cfg: TlsConfig) {
    let mut last = stamp(&cfg.cert, &cfg.key);
    let mut tick = tokio::time::interval(cfg.reload_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = stamp(&cfg.cert, &cfg.key);
        if now == last {
            continue;
        }
        match load_certified_key(&cfg.cert, &cfg.key) {
            Ok(key) => {
                resolver.store(key);
                last = now;
                tracing::info!(cert = %cfg.cert.display(), "TLS certificate reloaded");
            }
            // Keep `last` unchanged so a half-written file is retried next tick.
            Err(e) => {
                tracing::warn!(error = %e, "TLS certificate changed but cannot be loaded; keeping the previous one")
            }
        }
    }
}

type Stamp = Option<(SystemTime, u64)>;

fn stamp(cert: &Path, key: &Path) -> (Stamp, Stamp) {
    let one = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .and_then(|m| Some((m.modified().ok()?, m.len())))
    };
    (one(cert), one(key))
}
