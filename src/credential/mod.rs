//! Upstream credentials: what the firewall presents to an upstream for a
//! run. `static` is the configured `[upstream.headers]`, the same for
//! every run. `token_exchange` (RFC 8693) is a token the identity
//! provider issues for this run and this upstream's audience in exchange
//! for the run's verified tool token ([`exchange`]): kept per (principal,
//! run, upstream) until shortly before it expires and never past the run's
//! own token ([`cache`]); the firewall's own calls (listing, refills) use a
//! client-credentials token of its own.
//!
//! Where it is decided: [`crate::proxy::request`]'s record stage asks
//! [`Credentials::for_run`] once per forwarded request, before the intent
//! rows are written, so every row says what the message reached its
//! upstream with (`upstream_auth`, `credential_id`); a credential that
//! cannot be had refuses the request there (`-31007`), and nothing is sent
//! (never a fallback to a static credential).

pub(crate) mod cache;
pub(crate) mod connect;
pub(crate) mod exchange;
pub(crate) mod store;
pub(crate) mod user;
pub(crate) mod vault;

use std::sync::Arc;

use http::HeaderValue;

pub(crate) use exchange::{CredentialError, Credentials, RunSubject};
pub(crate) use user::{Keeper, UserCredentials};

/// What a request reaches its upstream with: the `Authorization` value
/// the firewall sets (none for a static credential: the configured
/// headers are set by the client of the upstream), and what the audit
/// records of it.
#[derive(Clone, Debug)]
pub(crate) struct Credential {
    /// `Bearer …` (sensitive), when the firewall sets one.
    pub header: Option<HeaderValue>,
    /// `static` or `exchange` (`upstream_auth`).
    pub auth: &'static str,
    /// [`credential_id`] (`credential_id`; empty for an upstream with no
    /// configured headers).
    pub id: Arc<str>,
}

impl Credential {
    /// The configured headers' credential.
    pub(crate) fn configured(id: Arc<str>) -> Credential {
        Credential {
            header: None,
            auth: "static",
            id,
        }
    }

    /// Puts what the audit records of it on `row`.
    pub(crate) fn stamp(&self, row: &mut crate::audit::AuditRow) {
        row.upstream_auth = self.auth;
        row.credential_id.clear();
        row.credential_id.push_str(&self.id);
    }

    /// Adds its header to the headers a request sets upstream.
    pub(crate) fn add_to(&self, set: &mut Vec<(http::HeaderName, HeaderValue)>) {
        if let Some(h) = &self.header {
            set.retain(|(n, _)| n != http::header::AUTHORIZATION);
            set.push((http::header::AUTHORIZATION, h.clone()));
        }
    }
}

/// A stable, non-reversible id of a credential: the first 16 bytes of
/// SHA-256 over a domain and the credential, hex. The same credential
/// always has the same id; the id says nothing of the credential.
pub(crate) fn credential_id(kind: &str, credential: &[u8]) -> String {
    let mut h = crate::digest::Sha256::new();
    h.update(b"mcp-firewall credential id v1\0");
    h.update((kind.len() as u64).to_be_bytes());
    h.update(kind.as_bytes());
    h.update(credential);
    let d = h.finalize();
    hex::encode(&d[..16])
}

/// The id of a static credential: the configured headers' names and
/// values, in order.
pub(crate) fn static_id(inject: &[(http::HeaderName, crate::config::Secret)]) -> String {
    if inject.is_empty() {
        return String::new();
    }
    let mut all = Vec::new();
    for (name, secret) in inject {
        let v = secret.header_value().as_bytes();
        all.extend_from_slice(&(name.as_str().len() as u64).to_be_bytes());
        all.extend_from_slice(name.as_str().as_bytes());
        all.extend_from_slice(&(v.len() as u64).to_be_bytes());
        all.extend_from_slice(v);
    }
    credential_id("static", &all)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_stable_and_says_nothing_of_the_credential() {
        let a = credential_id("exchange", b"eyJ.secret.token");
        assert_eq!(a, credential_id("exchange", b"eyJ.secret.token"));
        assert_ne!(a, credential_id("exchange", b"eyJ.secret.tokem"));
        assert_ne!(a, credential_id("static", b"eyJ.secret.token"));
        assert_eq!(a.len(), 32);
        assert!(!a.contains("secret"));
    }
}
