//! The `[auth]` section of the firewall's TOML: which issuers, audiences, scopes
//! and keys a tool token is checked against.
//!
//! Invariants:
//! - the file format is exactly these structs (`deny_unknown_fields`), every
//!   default lives in a named `default_*` function;
//! - [`AuthConfig::validate`] is the only place that judges values, and every
//!   error names the offending key (`auth.keys[2].alg: ...`);
//! - secrets (HS256 keys) are held in [`SecretString`], whose `Debug` never
//!   prints the value, so logging a config can not leak them.

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};

use http::{HeaderName, Uri};
use serde::Deserialize;

/// The algorithms a key can be pinned to. Anything else (notably `none`, and
/// the HS384/HS512/RS384/... variants nobody here issues) is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Alg {
    /// RSASSA-PKCS1-v1_5 with SHA-256.
    RS256,
    /// RSASSA-PSS with SHA-256.
    PS256,
    /// ECDSA on P-256 with SHA-256.
    ES256,
    /// ECDSA on P-384 with SHA-384.
    ES384,
    /// Ed25519.
    EdDSA,
    /// HMAC with SHA-256; shared secret, for development only.
    HS256,
}

impl Alg {
    /// Every supported algorithm, in a fixed order (also the index order of
    /// per-algorithm tables).
    pub const ALL: [Alg; 6] = [
        Alg::RS256,
        Alg::PS256,
        Alg::ES256,
        Alg::ES384,
        Alg::EdDSA,
        Alg::HS256,
    ];

    /// Parses the JOSE name (`"ES256"`); case-sensitive as RFC 7518 requires.
    pub fn from_name(name: &str) -> Option<Alg> {
        Some(match name {
            "RS256" => Alg::RS256,
            "PS256" => Alg::PS256,
            "ES256" => Alg::ES256,
            "ES384" => Alg::ES384,
            "EdDSA" => Alg::EdDSA,
            "HS256" => Alg::HS256,
            _ => return None,
        })
    }

    /// The JOSE name.
    pub fn name(self) -> &'static str {
        match self {
            Alg::RS256 => "RS256",
            Alg::PS256 => "PS256",
            Alg::ES256 => "ES256",
            Alg::ES384 => "ES384",
            Alg::EdDSA => "EdDSA",
            Alg::HS256 => "HS256",
        }
    }

    /// Position in [`Alg::ALL`].
    pub(crate) fn index(self) -> usize {
        self as usize
    }

    /// The `jsonwebtoken` algorithm doing the actual crypto.
    pub(crate) fn jwt(self) -> jsonwebtoken::Algorithm {
        match self {
            Alg::RS256 => jsonwebtoken::Algorithm::RS256,
            Alg::PS256 => jsonwebtoken::Algorithm::PS256,
            Alg::ES256 => jsonwebtoken::Algorithm::ES256,
            Alg::ES384 => jsonwebtoken::Algorithm::ES384,
            Alg::EdDSA => jsonwebtoken::Algorithm::EdDSA,
            Alg::HS256 => jsonwebtoken::Algorithm::HS256,
        }
    }
}

impl fmt::Display for Alg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A secret read from the config file. `Debug` prints `[redacted]`.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct SecretString(String);

impl SecretString {
    /// Wraps a secret.
    pub fn new(secret: impl Into<String>) -> SecretString {
        SecretString(secret.into())
    }

    /// The secret itself; callers must not log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// `[auth]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// Header that may carry the token besides `Authorization: Bearer`.
    #[serde(default = "default_header")]
    pub header: String,
    /// The `aud` value of tokens for MCP calls.
    pub mcp_audience: String,
    /// The `aud` value of tokens for the admin API (approvals).
    pub admin_audience: String,
    /// Scope an MCP-audience token must carry.
    #[serde(default = "default_required_scope")]
    pub required_scope: String,
    /// Scope an admin-audience token must carry.
    #[serde(default = "default_admin_scope")]
    pub admin_scope: String,
    /// Trusted `iss` values (exact match).
    pub issuers: Vec<String>,
    /// The only issuer whose tokens may use mode `service_account`; none means
    /// no token may.
    #[serde(default)]
    pub service_account_issuer: Option<String>,
    /// Clock skew tolerated on `exp`, `nbf` and `iat`, in seconds.
    #[serde(default = "default_leeway_s")]
    pub leeway_s: u64,
    /// Longest accepted `exp - iat`, in seconds.
    #[serde(default = "default_max_lifetime_s")]
    pub max_lifetime_s: u64,
    /// Most verified tokens kept in the cache; 0 disables it.
    #[serde(default = "default_cache_entries")]
    pub cache_entries: usize,
    /// Keys given directly (`[[auth.keys]]`).
    #[serde(default)]
    pub keys: Vec<KeyConfig>,
    /// JWKS sources (`[[auth.jwks]]`).
    #[serde(default)]
    pub jwks: Vec<JwksSourceConfig>,
}

/// Default [`AuthConfig::header`]: `X-Tool-Token`.
pub(crate) fn default_header() -> String {
    "X-Tool-Token".to_owned()
}

/// Default [`AuthConfig::required_scope`]: `mcp:tools`.
pub(crate) fn default_required_scope() -> String {
    "mcp:tools".to_owned()
}

/// Default [`AuthConfig::admin_scope`]: `approvals`.
pub(crate) fn default_admin_scope() -> String {
    "approvals".to_owned()
}

/// Default [`AuthConfig::leeway_s`]: 30 s, enough for ordinary NTP drift.
pub(crate) fn default_leeway_s() -> u64 {
    30
}

/// Default [`AuthConfig::max_lifetime_s`]: 15 minutes; tool tokens are
/// short-lived so a leaked one expires quickly.
pub(crate) fn default_max_lifetime_s() -> u64 {
    900
}

/// Default [`AuthConfig::cache_entries`]: 65 536 tokens (a few tens of MiB at
/// most), far more than the runs alive at once on one firewall.
pub(crate) fn default_cache_entries() -> usize {
    65_536
}

/// One `[[auth.keys]]` entry: a verification key pinned to one algorithm.
/// Exactly one of `pem_file`, `secret_env`, `secret_file`, `secret`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// Key id matched against the token header's `kid`.
    #[serde(default)]
    pub kid: Option<String>,
    /// The one algorithm this key verifies (`RS256`, `PS256`, `ES256`,
    /// `ES384`, `EdDSA`, `HS256`). Kept as text so `validate` can name a bad
    /// value precisely.
    pub alg: String,
    /// Public key PEM (SPKI `PUBLIC KEY`, or `RSA PUBLIC KEY`) for the
    /// asymmetric algorithms.
    #[serde(default)]
    pub pem_file: Option<PathBuf>,
    /// Environment variable holding the HS256 secret.
    #[serde(default)]
    pub secret_env: Option<String>,
    /// File holding the HS256 secret (a trailing newline is ignored).
    #[serde(default)]
    pub secret_file: Option<PathBuf>,
    /// The HS256 secret inline; development only.
    #[serde(default)]
    pub secret: Option<SecretString>,
}

/// One `[[auth.jwks]]` entry: exactly one of `inline`, `file`, `url`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwksSourceConfig {
    /// A JWKS document inline.
    #[serde(default)]
    pub inline: Option<String>,
    /// A JWKS document on disk, read once at start.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// A JWKS URL, fetched in the background. `https://`, or `http://` to a
    /// loopback address (a local identity provider).
    #[serde(default)]
    pub url: Option<String>,
    /// Seconds between scheduled fetches of `url`.
    #[serde(default = "default_refresh_s")]
    pub refresh_s: u64,
    /// Least seconds between fetches triggered by an unknown `kid`.
    #[serde(default = "default_min_refresh_interval_s")]
    pub min_refresh_interval_s: u64,
    /// CA certificates (PEM) trusted for `url` instead of the Mozilla roots.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// The algorithm an RSA key without `alg` is pinned to (`RS256` or
    /// `PS256`): RFC 7517 makes `alg` optional, but a key must verify exactly
    /// one algorithm here.
    #[serde(default = "default_rsa_alg")]
    pub rsa_alg: String,
}

/// Default [`JwksSourceConfig::refresh_s`]: 5 minutes.
pub(crate) fn default_refresh_s() -> u64 {
    300
}

/// Default [`JwksSourceConfig::min_refresh_interval_s`]: 10 s, so a flood of
/// tokens with made-up `kid`s costs the key server one request per 10 s.
pub(crate) fn default_min_refresh_interval_s() -> u64 {
    10
}

/// Default [`JwksSourceConfig::rsa_alg`]: `RS256`, the common IdP default.
pub(crate) fn default_rsa_alg() -> String {
    "RS256".to_owned()
}

/// Longest accepted `leeway_s`: more than 5 minutes of skew is a broken clock.
pub(crate) const MAX_LEEWAY_S: u64 = 300;

/// Longest accepted `max_lifetime_s`: a day. Tool tokens are per run; longer
/// lifetimes defeat the point of minting them per run.
pub(crate) const MAX_MAX_LIFETIME_S: u64 = 86_400;

/// A value in `[auth]` that is not acceptable. Every variant names its key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// A required text value is empty.
    #[error("{key}: must not be empty")]
    Empty {
        /// Dotted key.
        key: String,
    },
    /// `header` is not an HTTP header name, or is `Authorization`.
    #[error("{key}: {value:?} is not usable as the token header")]
    BadHeader {
        /// Dotted key.
        key: String,
        /// The configured value.
        value: String,
    },
    /// `mcp_audience` and `admin_audience` are equal.
    #[error("auth.admin_audience: must differ from auth.mcp_audience ({value:?})")]
    SameAudiences {
        /// The shared value.
        value: String,
    },
    /// A scope contains whitespace (scopes are space-separated in tokens).
    #[error("{key}: {value:?} contains whitespace")]
    ScopeWhitespace {
        /// Dotted key.
        key: String,
        /// The configured value.
        value: String,
    },
    /// No issuer configured.
    #[error("auth.issuers: at least one issuer is required")]
    NoIssuers,
    /// The same issuer twice.
    #[error("{key}: {value:?} is listed twice")]
    Duplicate {
        /// Dotted key.
        key: String,
        /// The repeated value.
        value: String,
    },
    /// `service_account_issuer` is not one of `issuers`.
    #[error("auth.service_account_issuer: {value:?} is not in auth.issuers")]
    ServiceAccountIssuerNotTrusted {
        /// The configured value.
        value: String,
    },
    /// A number outside its range.
    #[error("{key}: {value} is outside {min}..={max}")]
    OutOfRange {
        /// Dotted key.
        key: String,
        /// The configured value.
        value: u64,
        /// Smallest accepted.
        min: u64,
        /// Largest accepted.
        max: u64,
    },
    /// Neither keys nor JWKS sources.
    #[error("auth: no keys and no jwks sources configured; no token could ever verify")]
    NoKeys,
    /// `alg = "none"`.
    #[error("{key}: \"none\" is never accepted")]
    AlgNone {
        /// Dotted key.
        key: String,
    },
    /// An algorithm outside [`Alg::ALL`] (or not allowed here).
    #[error("{key}: {value:?} is not supported (expected one of {expected})")]
    UnsupportedAlg {
        /// Dotted key.
        key: String,
        /// The configured value.
        value: String,
        /// The accepted names, comma-separated.
        expected: &'static str,
    },
    /// Zero or several of a set of mutually exclusive keys.
    #[error("{key}: exactly one of {options} is required, found {found}")]
    ExactlyOne {
        /// Dotted key of the table.
        key: String,
        /// The alternatives.
        options: &'static str,
        /// How many were given.
        found: usize,
    },
    /// Key material that does not fit the algorithm (a PEM for HS256, a
    /// secret for an asymmetric algorithm).
    #[error("{key}: {alg} needs {needs}")]
    MaterialMismatch {
        /// Dotted key.
        key: String,
        /// The pinned algorithm.
        alg: Alg,
        /// What it needs instead.
        needs: &'static str,
    },
    /// A JWKS URL that does not parse or is not `https://` (or loopback
    /// `http://`).
    #[error("{key}: {value:?} must be an https:// URL (http:// only to a loopback address)")]
    BadUrl {
        /// Dotted key.
        key: String,
        /// The configured value.
        value: String,
    },
    /// An option that only applies to `url` sources given for another kind.
    #[error("{key}: only applies to a jwks source with url")]
    OnlyForUrl {
        /// Dotted key.
        key: String,
    },
}

const KEY_ALGS: &str = "RS256, PS256, ES256, ES384, EdDSA, HS256";
const RSA_ALGS: &str = "RS256, PS256";

impl AuthConfig {
    /// Checks every value; the first problem found is returned, naming its key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_header()?;
        non_empty("auth.mcp_audience", &self.mcp_audience)?;
        non_empty("auth.admin_audience", &self.admin_audience)?;
        if self.mcp_audience == self.admin_audience {
            return Err(ConfigError::SameAudiences {
                value: self.mcp_audience.clone(),
            });
        }
        scope("auth.required_scope", &self.required_scope)?;
        scope("auth.admin_scope", &self.admin_scope)?;
        self.validate_issuers()?;
        in_range("auth.leeway_s", self.leeway_s, 0, MAX_LEEWAY_S)?;
        in_range(
            "auth.max_lifetime_s",
            self.max_lifetime_s,
            1,
            MAX_MAX_LIFETIME_S,
        )?;
        if self.keys.is_empty() && self.jwks.is_empty() {
            return Err(ConfigError::NoKeys);
        }
        let mut kids = HashSet::new();
        for (i, key) in self.keys.iter().enumerate() {
            key.validate(i)?;
            if let Some(kid) = &key.kid {
                if !kids.insert(kid.as_str()) {
                    return Err(ConfigError::Duplicate {
                        key: format!("auth.keys[{i}].kid"),
                        value: kid.clone(),
                    });
                }
            }
        }
        for (i, source) in self.jwks.iter().enumerate() {
            source.validate(i)?;
        }
        Ok(())
    }

    /// The token header as an [`HeaderName`] (lower-cased).
    pub fn header_name(&self) -> Result<HeaderName, ConfigError> {
        let bad = || ConfigError::BadHeader {
            key: "auth.header".into(),
            value: self.header.clone(),
        };
        let name = HeaderName::from_bytes(self.header.as_bytes()).map_err(|_| bad())?;
        // Authorization is always read; naming it again would make the
        // "two different tokens" rule meaningless.
        if name == http::header::AUTHORIZATION {
            return Err(bad());
        }
        Ok(name)
    }

    /// Makes relative file paths (`pem_file`, `secret_file`, jwks `file`,
    /// `ca_file`) relative to `base`, the config file's directory.
    pub fn resolve_paths(&mut self, base: &Path) {
        let fix = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        for key in &mut self.keys {
            key.pem_file.as_mut().map(fix);
            key.secret_file.as_mut().map(fix);
        }
        for source in &mut self.jwks {
            source.file.as_mut().map(fix);
            source.ca_file.as_mut().map(fix);
        }
    }

    fn validate_header(&self) -> Result<(), ConfigError> {
        self.header_name().map(drop)
    }

    fn validate_issuers(&self) -> Result<(), ConfigError> {
        if self.issuers.is_empty() {
            return Err(ConfigError::NoIssuers);
        }
        let mut seen = HashSet::new();
        for (i, iss) in self.issuers.iter().enumerate() {
            let key = format!("auth.issuers[{i}]");
            non_empty(&key, iss)?;
            if !seen.insert(iss.as_str()) {
                return Err(ConfigError::Duplicate {
                    key,
                    value: iss.clone(),
                });
            }
        }
        if let Some(sa) = &self.service_account_issuer {
            if !self.issuers.contains(sa) {
                return Err(ConfigError::ServiceAccountIssuerNotTrusted { value: sa.clone() });
            }
        }
        Ok(())
    }
}

impl KeyConfig {
    /// The pinned algorithm, checked.
    pub fn parsed_alg(&self, index: usize) -> Result<Alg, ConfigError> {
        parse_alg(
            &format!("auth.keys[{index}].alg"),
            &self.alg,
            KEY_ALGS,
            &Alg::ALL,
        )
    }

    fn validate(&self, i: usize) -> Result<(), ConfigError> {
        let alg = self.parsed_alg(i)?;
        if let Some(kid) = &self.kid {
            non_empty(&format!("auth.keys[{i}].kid"), kid)?;
        }
        if let Some(env) = &self.secret_env {
            non_empty(&format!("auth.keys[{i}].secret_env"), env)?;
        }
        let found = [
            self.pem_file.is_some(),
            self.secret_env.is_some(),
            self.secret_file.is_some(),
            self.secret.is_some(),
        ]
        .iter()
        .filter(|given| **given)
        .count();
        if found != 1 {
            return Err(ConfigError::ExactlyOne {
                key: format!("auth.keys[{i}]"),
                options: "pem_file, secret_env, secret_file, secret",
                found,
            });
        }
        match (alg, self.pem_file.is_some()) {
            (Alg::HS256, true) => Err(ConfigError::MaterialMismatch {
                key: format!("auth.keys[{i}].pem_file"),
                alg,
                needs: "a shared secret (secret_env, secret_file or secret)",
            }),
            (Alg::HS256, false) | (_, true) => Ok(()),
            (_, false) => Err(ConfigError::MaterialMismatch {
                key: format!("auth.keys[{i}]"),
                alg,
                needs: "a public key (pem_file); secrets are only for HS256",
            }),
        }
    }
}

impl JwksSourceConfig {
    /// The algorithm RSA keys without `alg` are pinned to, checked.
    pub fn parsed_rsa_alg(&self, index: usize) -> Result<Alg, ConfigError> {
        parse_alg(
            &format!("auth.jwks[{index}].rsa_alg"),
            &self.rsa_alg,
            RSA_ALGS,
            &[Alg::RS256, Alg::PS256],
        )
    }

    /// The URL, checked: `https://`, or `http://` to a loopback host.
    pub fn parsed_url(&self, index: usize) -> Result<Option<Uri>, ConfigError> {
        let Some(url) = &self.url else {
            return Ok(None);
        };
        let bad = || ConfigError::BadUrl {
            key: format!("auth.jwks[{index}].url"),
            value: url.clone(),
        };
        let uri: Uri = url.parse().map_err(|_| bad())?;
        let host = uri.host().ok_or_else(bad)?;
        match uri.scheme_str() {
            Some("https") => Ok(Some(uri)),
            Some("http") if is_loopback(host) => Ok(Some(uri)),
            _ => Err(bad()),
        }
    }

    fn validate(&self, i: usize) -> Result<(), ConfigError> {
        let found = [
            self.inline.is_some(),
            self.file.is_some(),
            self.url.is_some(),
        ]
        .iter()
        .filter(|given| **given)
        .count();
        if found != 1 {
            return Err(ConfigError::ExactlyOne {
                key: format!("auth.jwks[{i}]"),
                options: "inline, file, url",
                found,
            });
        }
        self.parsed_rsa_alg(i)?;
        if self.url.is_some() {
            self.parsed_url(i)?;
            in_range(
                &format!("auth.jwks[{i}].refresh_s"),
                self.refresh_s,
                1,
                86_400,
            )?;
            in_range(
                &format!("auth.jwks[{i}].min_refresh_interval_s"),
                self.min_refresh_interval_s,
                1,
                3_600,
            )?;
        } else if self.ca_file.is_some() {
            return Err(ConfigError::OnlyForUrl {
                key: format!("auth.jwks[{i}].ca_file"),
            });
        }
        Ok(())
    }
}

fn parse_alg(
    key: &str,
    value: &str,
    expected: &'static str,
    allowed: &[Alg],
) -> Result<Alg, ConfigError> {
    if value.eq_ignore_ascii_case("none") {
        return Err(ConfigError::AlgNone {
            key: key.to_owned(),
        });
    }
    match Alg::from_name(value) {
        Some(alg) if allowed.contains(&alg) => Ok(alg),
        _ => Err(ConfigError::UnsupportedAlg {
            key: key.to_owned(),
            value: value.to_owned(),
            expected,
        }),
    }
}

fn non_empty(key: &str, value: &str) -> Result<(), ConfigError> {
    if value.trim().is_empty() {
        return Err(ConfigError::Empty {
            key: key.to_owned(),
        });
    }
    Ok(())
}

fn scope(key: &str, value: &str) -> Result<(), ConfigError> {
    non_empty(key, value)?;
    if value.chars().any(char::is_whitespace) {
        return Err(ConfigError::ScopeWhitespace {
            key: key.to_owned(),
            value: value.to_owned(),
        });
    }
    Ok(())
}

fn in_range(key: &str, value: u64, min: u64, max: u64) -> Result<(), ConfigError> {
    if value < min || value > max {
        return Err(ConfigError::OutOfRange {
            key: key.to_owned(),
            value,
            min,
            max,
        });
    }
    Ok(())
}

/// Whether `host` (a URL's, brackets allowed) names this machine: `localhost`
/// or a loopback address. Where plain http may carry a credential.
pub(crate) fn is_loopback(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || bare
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
