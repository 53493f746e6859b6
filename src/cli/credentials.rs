//! `mcp-firewall credentials`: users' own upstream tokens (`auth =
//! "oauth_user"`), read from the store the config names with the key it
//! names. `list` shows whose tokens are kept, never their values;
//! `revoke` removes them (every replica sees it at once: the store is
//! shared, or this machine's directory) and revokes each at the
//! authorization server when it has a revocation endpoint.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Args, Subcommand};

use crate::config::Config;
use crate::credential::store::Filter;

/// `mcp-firewall credentials`.
#[derive(Debug, Args)]
pub struct CredentialsArgs {
    /// The TOML config file (its `[credentials]` and upstreams).
    #[arg(long, short, env = "MCP_FIREWALL_CONFIG")]
    pub config: PathBuf,
    /// What to do.
    #[command(subcommand)]
    pub command: CredentialsCommand,
}

/// What `mcp-firewall credentials` does.
#[derive(Debug, Subcommand)]
pub enum CredentialsCommand {
    /// List the kept tokens (owner, upstream, id, scope, expiry; never a
    /// value).
    List {
        /// Only this tenant's.
        #[arg(long)]
        tenant: Option<String>,
        /// Only this user's.
        #[arg(long)]
        subject: Option<String>,
        /// Only this upstream's.
        #[arg(long)]
        upstream: Option<String>,
        /// JSON lines instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Remove a user's token for an upstream (and revoke it at the
    /// authorization server).
    Revoke {
        /// The upstream.
        #[arg(long)]
        upstream: String,
        /// The tenant.
        #[arg(long)]
        tenant: String,
        /// The user.
        #[arg(long)]
        subject: String,
        /// Only the token of this issuer's user (default: every issuer's).
        #[arg(long)]
        issuer: Option<String>,
    },
}

/// Runs `args` against the config's store.
///
/// # Errors
/// No `[credentials]` section, no such upstream, or the store cannot be
/// asked.
pub async fn run(args: &CredentialsArgs) -> anyhow::Result<String> {
    let cfg = crate::config::load(&args.config)?;
    let Some(creds) = &cfg.credentials else {
        anyhow::bail!(
            "{}: no [credentials] section: no user tokens are kept",
            args.config.display()
        );
    };
    let keeper = Arc::new(
        crate::credential::Keeper::open(creds)
            .await
            .map_err(|e| anyhow::anyhow!("credentials.store: {e}"))?,
    );
    let mut out = String::new();
    match &args.command {
        CredentialsCommand::List {
            tenant,
            subject,
            upstream,
            json,
        } => {
            let filter = Filter {
                tenant: tenant.clone(),
                subject: subject.clone(),
                upstream: upstream.clone(),
                issuer: None,
            };
            let records = keeper.store.list(&filter).await?;
            if *json {
                for r in &records {
                    let _ = writeln!(
                        out,
                        "{}",
                        serde_json::json!({
                            "upstream": r.owner.upstream, "tenant": r.owner.tenant, "subject": r.owner.subject,
                            "issuer": r.owner.issuer, "credential_id": r.credential_id, "scope": r.scope,
                            "created_ms": r.created_ms, "updated_ms": r.updated_ms, "expires_ms": r.expires_ms,
                            "refreshable": r.refreshable,
                        })
                    );
                }
            } else {
                let _ = writeln!(
                    out,
                    "upstream\ttenant\tsubject\tcredential_id\tscope\texpires\trefreshable"
                );
                for r in &records {
                    let expires = if r.expires_ms == 0 {
                        "-".to_owned()
                    } else {
                        crate::clock::fmt_ms(r.expires_ms)
                    };
                    let _ = writeln!(
                        out,
                        "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                        r.owner.upstream,
                        r.owner.tenant,
                        r.owner.subject,
                        r.credential_id,
                        r.scope,
                        expires,
                        r.refreshable
                    );
                }
                let _ = writeln!(out, "{} kept", records.len());
            }
        }
        CredentialsCommand::Revoke {
            upstream,
            tenant,
            subject,
            issuer,
        } => {
            let users = users_of(&cfg, upstream, &keeper)?;
            let filter = Filter {
                tenant: Some(tenant.clone()),
                subject: Some(subject.clone()),
                upstream: Some(upstream.clone()),
                issuer: issuer.clone(),
            };
            let removed = users.revoke(&filter).await?;
            let _ = writeln!(
                out,
                "revoked {} token(s) of {subject:?} (tenant {tenant:?}) for {upstream:?}",
                removed.len()
            );
        }
    }
    Ok(out)
}

fn users_of(
    cfg: &Config,
    upstream: &str,
    keeper: &Arc<crate::credential::Keeper>,
) -> anyhow::Result<crate::credential::UserCredentials> {
    let up = cfg
        .upstreams
        .iter()
        .find(|u| u.name == upstream)
        .ok_or_else(|| anyhow::anyhow!("no upstream {upstream:?} in the config"))?;
    let metrics = crate::telemetry::Metrics::register(&mut Default::default());
    crate::credential::UserCredentials::for_upstream(up, keeper, metrics)
        .map_err(|e| anyhow::anyhow!("upstream {upstream:?}: {e}"))?
        .ok_or_else(|| {
            anyhow::anyhow!(
                "upstream {upstream:?} does not take users' own accounts (auth = \"oauth_user\")"
            )
        })
}
