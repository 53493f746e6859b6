//! `mcp-firewall token mint` and `token inspect`, for development.

use crate::auth::{self, Audience, MintClaims, Mode, Verifier};
use crate::config::Config;
use std::time::Duration;

/// Claims for `token mint`.
pub struct MintArgs {
    /// `mcp` or `admin`.
    pub audience: Audience,
    /// `sub`.
    pub sub: String,
    /// `tenant_id`.
    pub tenant: String,
    /// `agent`.
    pub agent: String,
    /// `run_id`.
    pub run: String,
    /// `mode`.
    pub mode: Mode,
    /// `projects`.
    pub projects: Vec<String>,
    /// `project_ceiling`.
    pub ceiling: Option<Vec<String>>,
    /// `scope` (empty: the audience's required scope).
    pub scopes: Vec<String>,
    /// Lifetime.
    pub lifetime: Duration,
}

/// `mcp-firewall token mint`: signs a development token with the config's
/// HS256 key.
pub fn mint(cfg: &Config, a: MintArgs) -> anyhow::Result<String> {
    Ok(auth::mint(
        &cfg.auth,
        &MintClaims {
            audience: a.audience,
            issuer: None,
            sub: a.sub,
            tenant_id: a.tenant,
            agent: a.agent,
            run_id: a.run,
            mode: a.mode,
            projects: a.projects,
            project_ceiling: a.ceiling,
            scopes: a.scopes,
            jti: None,
            run_exp: None,
        },
        a.lifetime,
    )?)
}

/// `mcp-firewall token inspect`: decodes a token and says exactly why it
/// would be refused for each audience.
pub async fn inspect(cfg: &Config, token: &str) -> anyhow::Result<String> {
    let verifier = Verifier::new(&cfg.auth).await?;
    Ok(auth::inspect(&verifier, token).await.to_string())
}
