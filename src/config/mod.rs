//! The firewall's configuration file: one TOML document, read once at start
//! (and on reload), validated into runtime types before anything serves.
//!
//! Two layers keep invalid states unrepresentable:
//! - `Raw*` types mirror the file format exactly (`#[serde(deny_unknown_fields)]`,
//!   defaults in named functions), so an unknown or misspelt key is an error that
//!   names the file, the line and the key;
//! - [`validate`] turns them into [`Config`], resolving paths against the config
//!   file's directory, reading secrets from env vars or files, and naming the key
//!   of every semantic error (`upstream[1].url: ...`).
//!
//! Secrets (injected upstream credentials) are held in [`Secret`], whose `Debug`
//! never prints the value.

mod credentials;
mod upstream_auth;
mod validate;
mod validate_upstream;
pub use crate::server::tls::TlsConfig;
pub use crate::telemetry::LogFormat;
pub use credentials::{read_key, CredentialStore, CredentialsConfig, KEY_BYTES};
pub use upstream_auth::{
    AuthorizationServer, ClientAuth, Endpoints, OauthUser, TokenExchange, UpstreamAuth,
};
pub use validate::{
    load, load_str, Config, ConfigError, ExtraMethod, HeaderValueSource, IdentityClaim, Secret,
    ServerConfig, Upstream,
};
mod raw;
pub use self::raw::*;
