//! `[credentials]` checked into [`CredentialsConfig`]: the key users'
//! upstream tokens are encrypted under (read here, once, from a file only
//! the firewall's user may read), the store they are kept in, and the
//! admin listener's external URL the consent links and the redirect URI
//! are built on. Every error names the key.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::validate::{ConfigError, Validator};
use super::{CredentialStoreKind, RawCredentials};

/// Bytes of the AES-256-GCM key.
pub const KEY_BYTES: usize = 32;

/// Default seconds a consent link stays valid.
const DEFAULT_LINK_TTL_S: u64 = 600;

/// A checked `[credentials]`.
pub struct CredentialsConfig {
    /// The key file (for messages).
    pub key_file: PathBuf,
    /// The key.
    pub key: [u8; KEY_BYTES],
    /// Where tokens are kept.
    pub store: CredentialStore,
    /// The admin listener's external base URL, without a trailing slash.
    pub public_url: String,
    /// How long a consent link stays valid.
    pub link_ttl: Duration,
}

impl std::fmt::Debug for CredentialsConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialsConfig")
            .field("key_file", &self.key_file)
            .field("key", &"<redacted>")
            .field("store", &self.store)
            .field("public_url", &self.public_url)
            .field("link_ttl", &self.link_ttl)
            .finish()
    }
}

/// Where users' tokens are kept.
#[derive(Debug, Clone)]
pub enum CredentialStore {
    /// One file per token in this directory (one replica).
    Local(PathBuf),
    /// The `[approvals]` PostgreSQL database (every replica).
    Postgres(Box<crate::approval::ApprovalsConfig>),
}

impl Validator<'_> {
    /// `[credentials]`, given the approvals (whose database the
    /// `postgres` store shares) and the admin address (the default
    /// public URL).
    pub(super) fn credentials(
        &self,
        raw: RawCredentials,
        approvals: Option<&crate::approval::ApprovalsConfig>,
        admin: SocketAddr,
    ) -> Result<CredentialsConfig, ConfigError> {
        let key_file = self.path(&raw.key_file);
        let key = read_key(&key_file).map_err(|why| self.invalid("credentials.key_file", why))?;
        let store = match raw.store {
            CredentialStoreKind::Local => {
                CredentialStore::Local(self.path(&raw.dir.unwrap_or_else(|| "credentials".into())))
            }
            CredentialStoreKind::Postgres => {
                if raw.dir.is_some() {
                    return Err(self.invalid("credentials.dir", "only with store = \"local\""));
                }
                match approvals {
                    Some(a) if a.store == crate::approval::StoreKind::Postgres => {
                        CredentialStore::Postgres(Box::new(a.clone()))
                    }
                    _ => return Err(self.invalid(
                        "credentials.store",
                        "\"postgres\" keeps tokens in the approvals database: set [approvals] store = \"postgres\" and its postgres_url",
                    )),
                }
            }
        };
        let public_url = match raw
            .public_url
            .or_else(|| approvals.and_then(|a| a.public_url.clone()))
        {
            Some(u) => {
                let uri: http::Uri = u.parse().map_err(|e| {
                    self.invalid("credentials.public_url", format!("{u:?} is not a URL: {e}"))
                })?;
                if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
                    return Err(self.invalid(
                        "credentials.public_url",
                        format!("{u:?} must be an http(s) URL with a host"),
                    ));
                }
                if uri.query().is_some() {
                    return Err(self.invalid("credentials.public_url", "takes no query"));
                }
                u.trim_end_matches('/').to_owned()
            }
            None => format!("http://{admin}"),
        };
        let ttl = raw.link_ttl_s.unwrap_or(DEFAULT_LINK_TTL_S);
        if !(30..=86_400).contains(&ttl) {
            return Err(self.invalid("credentials.link_ttl_s", "must be 30-86400"));
        }
        Ok(CredentialsConfig {
            key_file,
            key,
            store,
            public_url,
            link_ttl: Duration::from_secs(ttl),
        })
    }
}

/// The key in `path`: 32 raw bytes, 64 hex digits or base64 of 32 bytes
/// (a trailing newline allowed); the file readable by its owner only.
///
/// # Errors
/// Why the file is not a usable key.
pub fn read_key(path: &std::path::Path) -> Result<[u8; KEY_BYTES], String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(format!(
                "{shown} is readable by others (mode {:o}): chmod 600 it",
                mode & 0o777
            ));
        }
    }
    #[cfg(not(unix))]
    let _ = meta;
    let bytes = std::fs::read(path).map_err(|e| format!("{shown}: cannot read: {e}"))?;
    if let Ok(k) = <[u8; KEY_BYTES]>::try_from(bytes.as_slice()) {
        return Ok(k);
    }
    let text = std::str::from_utf8(&bytes)
        .map(|t| t.trim_end_matches(['\r', '\n']))
        .unwrap_or("");
    let decoded = if text.len() == 2 * KEY_BYTES {
        hex::decode(text).ok()
    } else {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.decode(text).ok()
    };
    decoded
        .and_then(|d| <[u8; KEY_BYTES]>::try_from(d.as_slice()).ok())
        .ok_or_else(|| {
            format!("{shown} is not a 32-byte key (raw, 64 hex digits or base64); make one with `head -c 32 /dev/urandom > {shown}`")
        })
}
