//! `mcp-firewall explain`: one decision and the rules behind it, from a token
//! or from claims written as JSON.

use super::*;
use crate::auth::{self, Audience, Mode, Verifier};
use crate::config::Config;
use crate::policy::{self, Call, Identity, Policy};
use anyhow::{bail, Context};
use serde_json::Value;
use std::fmt::Write as _;
use std::path::Path;

/// What `explain` decides about.
pub struct ExplainArgs<'a> {
    /// A tool token (verified against the config) ...
    pub token: Option<&'a str>,
    /// ... or a claims JSON file (not verified: for what-if questions).
    pub claims: Option<&'a Path>,
    /// Upstream name.
    pub upstream: &'a str,
    /// Tool name.
    pub tool: &'a str,
    /// Arguments JSON.
    pub arguments: Option<&'a str>,
    /// The run's labels, what-if (`private,untrusted`); without it they
    /// are read from the shared store when there is one.
    pub labels: Option<&'a str>,
}

/// `mcp-firewall explain`: the decision for one call and the rules that
/// produced it.
pub async fn explain(cfg: &Config, args: ExplainArgs<'_>) -> anyhow::Result<String> {
    let policy: Policy = policy::load_dir(&cfg.policy_dir)?;
    let claims: auth::Claims = match (args.token, args.claims) {
        (Some(t), None) => {
            let verifier = Verifier::new(&cfg.auth).await?;
            (*verifier
                .verify(t, Audience::Mcp)
                .await
                .map_err(|e| anyhow::anyhow!("the token would be refused: {e}"))?)
            .clone()
        }
        (None, Some(path)) => claims_from_file(path)?,
        _ => bail!("give exactly one of --token or --claims"),
    };
    let mut out = String::new();
    // A virtual server's name: the member it reaches, as that member's
    // own tool (names resolved over the members' live lists).
    let (upstream, tool) = match cfg.virtual_servers.iter().find(|v| v.name == args.upstream) {
        Some(vs) => match virtual_route(cfg, vs, args.tool, &mut out).await? {
            Some(r) => r,
            None => return Ok(out),
        },
        None => (args.upstream.to_owned(), args.tool.to_owned()),
    };
    let args = ExplainArgs {
        upstream: &upstream,
        tool: &tool,
        ..args
    };
    let up = cfg
        .upstreams
        .iter()
        .find(|u| u.name == args.upstream)
        .with_context(|| format!("no upstream named {:?} in the config", args.upstream))?;
    let arguments: Value = match args.arguments {
        Some(a) => serde_json::from_str(a).context("--arguments is not JSON")?,
        None => Value::Object(Default::default()),
    };
    let service_issuer = cfg.auth.service_account_issuer.as_deref() == Some(&*claims.iss);
    let identity: Identity<'_> = crate::verdict::identity(&claims, service_issuer);
    let authority = match policy.authority(&identity) {
        Ok(a) => a,
        Err(e) => {
            let _ = writeln!(
                out,
                "decision: no authority ({e}); every upstream answers 404"
            );
            return Ok(out);
        }
    };
    if !policy.reaches(&authority, up.facts()) {
        let _ = writeln!(
            out,
            "decision: upstream {:?} is outside the run's effective projects {:?} (404)",
            up.name, authority.projects
        );
        return Ok(out);
    }
    let mut trace = Vec::new();
    let decision = policy.decide(
        &Call {
            identity: &identity,
            authority: &authority,
            upstream: up.facts(),
            tool: args.tool,
            arguments: &arguments,
            hints: None,
        },
        Some(&mut trace),
    );
    let _ = writeln!(out, "decision: {decision:?}");
    for t in trace {
        let _ = writeln!(out, "  - {t}");
    }
    explain_labels(cfg, &policy, up, &claims, &decision, args, &mut out).await?;
    let _ = writeln!(out, "{}", credential_line(up, &claims));
    let _ = writeln!(
        out,
        "  (arguments are also checked against the tool's inputSchema, and budgets apply, at call time)"
    );
    Ok(out)
}

/// Which credential the call would reach its upstream with.
pub(super) fn credential_line(up: &crate::config::Upstream, claims: &auth::Claims) -> String {
    match &up.auth {
        crate::config::UpstreamAuth::Static if up.inject.is_empty() => {
            "credential: static (no [upstream.headers]: the upstream gets no credential)".to_owned()
        }
        crate::config::UpstreamAuth::Static => format!(
            "credential: static: [upstream.headers] {} (credential_id {})",
            up.inject
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            crate::credential::static_id(&up.inject)
        ),
        crate::config::UpstreamAuth::Exchange(x) => format!(
            "credential: exchange (RFC 8693): this run's token exchanged at {} by client {:?} for audience {:?}{}{}, kept for run {:?} of {:?} until shortly before it expires; nothing is sent if the exchange fails (-31007)",
            x.token_endpoint,
            x.client_id,
            x.audience.as_deref().unwrap_or(""),
            x.resource.as_deref().map(|r| format!(", resource {r:?}")).unwrap_or_default(),
            x.scope.as_deref().map(|s| format!(", scope {s:?}")).unwrap_or_default(),
            claims.run_id,
            &*claims.sub,
        ),
        crate::config::UpstreamAuth::User(u) => format!(
            "credential: user: {:?}'s own token for {:?} (tenant {:?}), from their consent at {}; none kept: the call is answered with a consent link (-32042, or -31007 with the link) and nothing is sent",
            &*claims.sub,
            up.name,
            &*claims.tenant_id,
            match &u.server {
                crate::config::AuthorizationServer::Endpoints(e) => e.authorization.to_string(),
                crate::config::AuthorizationServer::Issuer(i) => format!("the authorization server {i}"),
                crate::config::AuthorizationServer::Discovered => "the authorization server the upstream names (RFC 9728)".to_owned(),
            },
        ),
    }
}

/// The run's labels and the `[taint]` gate they put on the call.
pub(super) async fn explain_labels(
    cfg: &Config,
    policy: &Policy,
    up: &crate::config::Upstream,
    claims: &auth::Claims,
    decision: &policy::Decision,
    args: ExplainArgs<'_>,
    out: &mut String,
) -> anyhow::Result<()> {
    use crate::policy::{Decision, Labels};
    let traits = policy.traits(up.facts(), args.tool);
    let _ = writeln!(
        out,
        "tool: gives the run {:?}, egress {}",
        traits.labels.names(),
        traits.egress
    );
    let held = match args.labels {
        Some(list) => {
            let mut labels = Labels::NONE;
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                labels = labels.union(Labels::named(name).with_context(|| {
                    format!("--labels: unknown label {name:?} (private, untrusted)")
                })?);
            }
            crate::budget::labels::Held {
                labels,
                ..Default::default()
            }
        }
        None if cfg.state.backend == crate::state::Backend::Redis => {
            let redis = crate::state::Redis::connect(&cfg.state)?;
            let budgets = crate::budget::Budgets::shared(
                cfg.limits.clone(),
                crate::budget::shared::RedisBudgets::new(redis, &cfg.limits),
                Default::default(),
            );
            budgets
                .labels()
                .held(&claims.tenant_id, &claims.run_id)
                .await
                .map_err(|e| anyhow::anyhow!("the run's labels could not be read: {e}"))?
        }
        None => {
            let _ = writeln!(
                out,
                "run labels: kept in the serving process ([state] backend = \"memory\"); give --labels private,untrusted to ask what if"
            );
            return Ok(());
        }
    };
    let _ = writeln!(out, "run labels: {}", held.describe());
    let risk = match decision {
        Decision::Allow { risk } | Decision::Approve { risk } | Decision::Deny { risk, .. } => {
            *risk
        }
        Decision::Unknown(_) => return Ok(()),
    };
    let taint = policy.taint();
    match taint.gate(risk, traits.egress, held.labels) {
        None => {
            let _ = writeln!(out, "taint gate: none applies");
        }
        Some((gate, rule)) => {
            let _ = writeln!(out, "taint gate: {} = {gate} applies", rule.as_str());
        }
    }
    Ok(())
}

/// The `sub`s of an `act` chain in claims JSON, the current actor first.
pub(super) fn actors(claims: &Value) -> Vec<String> {
    std::iter::successors(claims.get("act"), |a| a.get("act"))
        .take(8)
        .filter_map(|a| a.get("sub").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

pub(super) fn claims_from_file(path: &Path) -> anyhow::Result<auth::Claims> {
    let v: Value = serde_json::from_slice(&std::fs::read(path)?)?;
    Ok(claims_from_value(&v))
}

/// Claims as a token would carry them, from their JSON (`test`, `audit
/// replay`, `explain --claims`): not verified, for what-if questions.
pub(crate) fn claims_from_value(v: &Value) -> auth::Claims {
    let s = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let list = |k: &str| -> Option<Vec<String>> {
        v.get(k)?.as_array().map(|a| {
            a.iter()
                .filter_map(|x| x.as_str().map(str::to_owned))
                .collect()
        })
    };
    auth::Claims {
        sub: s("sub").into(),
        tenant_id: s("tenant_id").into(),
        agent: s("agent").into(),
        run_id: s("run_id"),
        mode: Mode::from_name(&s("mode")).unwrap_or(Mode::Caller),
        projects: list("projects").unwrap_or_default().into(),
        project_ceiling: list("project_ceiling").map(Into::into),
        scopes: s("scope").split_whitespace().map(str::to_owned).collect(),
        jti: s("jti"),
        iss: s("iss").into(),
        exp: 0,
        iat: 0,
        nbf: None,
        run_exp: None,
        audience: Audience::Mcp,
        kid: None,
        delegation: actors(v).into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_credential_a_call_would_use_is_named() {
        let text = r#"
[server]
listen = "127.0.0.1:0"
plaintext = true
[auth]
mcp_audience = "mcp-firewall"
admin_audience = "mcp-firewall-admin"
issuers = ["https://idp.test"]
[[auth.keys]]
alg = "HS256"
secret = "test-secret-that-is-long-enough-for-hs256!"
[[upstream]]
name = "tickets"
url = "http://127.0.0.1:9000/mcp"
auth = "token_exchange"
[upstream.token_exchange]
token_endpoint = "http://127.0.0.1:9001/token"
client_id = "mcp-firewall"
client_secret = { value = "s3cret" }
audience = "tickets"
scope = "tickets:read"
[[upstream]]
name = "vendor"
url = "http://127.0.0.1:9002/mcp"
[upstream.headers]
"X-Api-Key" = { value = "vendor-key" }
"#;
        let cfg = crate::config::load_str(
            text,
            std::path::Path::new("t.toml"),
            std::path::Path::new("/"),
            &|_| None,
        )
        .unwrap();
        let claims = auth::Claims {
            sub: "alice".into(),
            tenant_id: "acme".into(),
            agent: "assistant".into(),
            run_id: "run-7".into(),
            mode: auth::Mode::Caller,
            projects: vec!["sre".to_owned()].into(),
            project_ceiling: None,
            scopes: Vec::new().into(),
            jti: "j".into(),
            iss: "https://idp.test".into(),
            exp: u64::MAX,
            iat: 0,
            nbf: None,
            run_exp: None,
            audience: auth::Audience::Mcp,
            kid: None,
            delegation: Vec::new().into(),
        };
        let exchange = credential_line(&cfg.upstreams[0], &claims);
        assert!(
            exchange.starts_with("credential: exchange (RFC 8693)")
                && exchange.contains("http://127.0.0.1:9001/token")
                && exchange.contains("\"tickets\"")
                && exchange.contains("\"run-7\"")
                && !exchange.contains("s3cret"),
            "{exchange}"
        );
        let fixed = credential_line(&cfg.upstreams[1], &claims);
        assert!(
            fixed.starts_with("credential: static: [upstream.headers] x-api-key (credential_id ")
                && !fixed.contains("vendor-key"),
            "{fixed}"
        );
    }
}
