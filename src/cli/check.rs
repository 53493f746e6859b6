//! `mcp-firewall check` and `migrate`: the config and policies validated, a
//! per-role summary, the sandboxes, pins and virtual servers, and whether the
//! shared stores answer.

use crate::config::Config;
use crate::policy::{self, Access};
use anyhow::Context;
use std::fmt::Write as _;

/// The second half of `mcp-firewall check`: whether the shared stores the
/// config names can be reached (Redis for budgets, PostgreSQL for
/// approvals). Returns the report and whether all of them answered.
pub async fn check_stores(cfg: &Config) -> (String, bool) {
    let mut out = String::new();
    let mut ok = true;
    match cfg.state.backend {
        crate::state::Backend::Memory => {
            let _ = writeln!(
                out,
                "  budgets: in this process (state.backend = \"memory\")"
            );
        }
        crate::state::Backend::Redis => {
            let url = cfg.state.redis_url.as_deref().unwrap_or("");
            let shown = redact_url(url);
            let reached = match crate::state::Redis::connect(&cfg.state) {
                Ok(r) => r.ping().await,
                Err(e) => Err(e.to_string()),
            };
            match reached {
                Ok(()) => {
                    let _ = writeln!(out, "  budgets: redis {shown}: reachable");
                }
                Err(e) => {
                    ok = false;
                    let _ = writeln!(out, "  budgets: redis {shown}: UNREACHABLE: {e}");
                }
            }
        }
    }
    match &cfg.approvals {
        None => {
            let _ = writeln!(out, "  approvals: not configured");
        }
        Some(a) if a.store == crate::approval::StoreKind::File => {
            let _ = writeln!(
                out,
                "  approvals: journal in {} (this replica only)",
                a.store_dir.display()
            );
        }
        Some(a) => {
            let shown = redact_url(a.postgres_url.as_deref().unwrap_or(""));
            match crate::approval::probe(a).await {
                Ok(version) => {
                    let _ = writeln!(
                        out,
                        "  approvals: postgres {shown}: reachable (schema version {version})"
                    );
                }
                Err(e) => {
                    ok = false;
                    let _ = writeln!(out, "  approvals: postgres {shown}: UNREACHABLE: {e:#}");
                }
            }
        }
    }
    (out, ok)
}

/// The pins part of `mcp-firewall check`: the pin files load; per upstream
/// its mode and pin count; with `live`, every upstream with pinning on is
/// listed and compared: pins naming tools it no longer lists, and (in
/// `enforce`) tools it lists without a pin or unlike their pin. Returns the
/// report and whether `live` found nothing wrong.
pub async fn check_pins(cfg: &Config, live: bool) -> (String, bool) {
    use crate::canonical;
    use crate::pins::{Mode, Pins, Verdict, PINS_DIR};
    let mut out = String::new();
    let pins = match Pins::load(&cfg.policy_dir.join(PINS_DIR)) {
        Ok(p) => p,
        Err(e) => {
            let _ = writeln!(out, "  pins: INVALID: {e}");
            return (out, false);
        }
    };
    let mut ok = true;
    for u in &cfg.upstreams {
        let pinned = pins.tools(&u.name);
        let mode = match u.pinning {
            Mode::Off => "off",
            Mode::Record => "record",
            Mode::Enforce => "enforce",
        };
        let _ = writeln!(
            out,
            "  pins {}: {mode}, {} pinned tools",
            u.name,
            pinned.len()
        );
        if !live || u.pinning == Mode::Off {
            continue;
        }
        let tools = match super::pins::live_tools(cfg, &u.name).await {
            Ok(t) => t,
            Err(e) => {
                ok = false;
                let _ = writeln!(out, "    cannot list it: {e:#}");
                continue;
            }
        };
        for name in &pinned {
            if !tools.iter().any(|(n, _)| n == name) {
                ok = false;
                let _ = writeln!(out, "    pinned but not listed: {name}");
            }
        }
        for (name, def) in &tools {
            let problem = match pins.verdict(&u.name, name, &canonical::sha256(def)) {
                Verdict::Pinned => continue,
                Verdict::Unpinned if u.pinning == Mode::Enforce => "listed without a pin (hidden)",
                Verdict::Mismatch if u.pinning == Mode::Enforce => "listed unlike its pin (hidden)",
                Verdict::Unpinned => "listed without a pin (proposed for review)",
                Verdict::Mismatch => "listed unlike its pin (proposed for review)",
                Verdict::Shadows(_) => "imitates a pinned name (refused)",
            };
            ok = false;
            let _ = writeln!(out, "    {name}: {problem}");
        }
    }
    (out, ok)
}

/// The sandbox layers each stdio upstream gets on this machine; `false`
/// when a required layer is unavailable.
pub fn check_sandboxes(cfg: &Config) -> (String, bool) {
    let mut out = String::new();
    let mut ok = true;
    for u in &cfg.upstreams {
        let Some(launch) = &u.stdio else { continue };
        match crate::stdio::probe(launch) {
            Ok(report) => {
                let applied: Vec<String> = report
                    .applied
                    .iter()
                    .map(|l| crate::stdio::layer_name(*l))
                    .collect();
                let _ = writeln!(out, "sandbox {}: {}", u.name, applied.join(", "));
                for (l, why) in &report.missing {
                    let _ = writeln!(out, "  without {}: {why}", crate::stdio::layer_name(*l));
                }
            }
            Err(why) => {
                ok = false;
                let _ = writeln!(out, "sandbox {}: error: {why}", u.name);
            }
        }
    }
    (out, ok)
}

/// The virtual servers part of `mcp-firewall check`: each one's members
/// listed live (within its `list_timeout_ms`) and the names resolved over
/// their full lists: what each exposed name reaches, what is left out and
/// why, which members could not be listed.
pub async fn check_virtual_servers(cfg: &Config) -> String {
    use crate::upstream::members::Space;
    let mut out = String::new();
    for vs in &cfg.virtual_servers {
        let _ = writeln!(
            out,
            "virtual server {} (/mcp/{}): collisions = {}, members: {}",
            vs.name,
            vs.name,
            vs.collisions.as_str(),
            vs.members.join(", ")
        );
        let resolved = match live_names(cfg, vs).await {
            Ok(r) => r,
            Err(e) => {
                let _ = writeln!(out, "  {e:#}");
                continue;
            }
        };
        for (i, m) in vs.members.iter().enumerate() {
            if !resolved.listed.get(i).copied().unwrap_or(false) {
                let _ = writeln!(
                    out,
                    "  member {m}: NOT LISTED (down, or slower than list_timeout_ms): its names are left out"
                );
            }
        }
        for space in Space::ALL {
            for (exposed, route) in resolved.names(space).exposed() {
                let member = vs.members.get(route.member).map_or("", String::as_str);
                if exposed == route.name {
                    let _ = writeln!(out, "  {} {exposed} -> {member}", space.as_str());
                } else {
                    let _ = writeln!(
                        out,
                        "  {} {exposed} -> {member} {}",
                        space.as_str(),
                        route.name
                    );
                }
            }
        }
        for (space, d) in resolved.dropped() {
            let member = vs.members.get(d.member).map_or("", String::as_str);
            let _ = writeln!(
                out,
                "  left out: {} {} of {member}: {}",
                space.as_str(),
                d.name,
                d.why
            );
        }
    }
    out
}

/// A virtual server's names as its members list them now (the operator's
/// command: no audit pipeline runs here), each member within
/// `list_timeout_ms`.
pub(super) async fn live_names(
    cfg: &Config,
    vs: &std::sync::Arc<crate::virtual_names::VirtualServer>,
) -> anyhow::Result<std::sync::Arc<crate::upstream::members::Resolved>> {
    let mut clients = Vec::new();
    for m in &vs.members {
        let client = super::pins::upstream_client(cfg, m).with_context(|| format!("member {m}"))?;
        clients.push(std::sync::Arc::new(client));
    }
    let metrics =
        crate::telemetry::Metrics::register(&mut prometheus_client::registry::Registry::default());
    let index = crate::upstream::members::Index::new(vs.clone(), metrics);
    let auditor = crate::audit::Auditor::disabled();
    Ok(index
        .refresh(&clients, &auditor, None, true, vs.list_timeout)
        .await)
}

/// Where a virtual server's tool name goes (written to `out`): the member
/// and its own name, or `None` when the name reaches nothing.
pub(super) async fn virtual_route(
    cfg: &Config,
    vs: &std::sync::Arc<crate::virtual_names::VirtualServer>,
    tool: &str,
    out: &mut String,
) -> anyhow::Result<Option<(String, String)>> {
    use crate::upstream::members::Space;
    let resolved = live_names(cfg, vs).await?;
    let names = resolved.names(Space::Tools);
    if let Some(r) = names.route(tool) {
        let member = vs.members.get(r.member).cloned().unwrap_or_default();
        let _ = writeln!(
            out,
            "virtual server {}: tool {tool:?} reaches member {member} as {:?} (collisions = {})",
            vs.name,
            r.name,
            vs.collisions.as_str()
        );
        return Ok(Some((member, r.name.clone())));
    }
    let left_out = names
        .dropped()
        .iter()
        .find(|d| vs.spelling(d.member, &d.name) == tool);
    let _ = match left_out {
        Some(d) => writeln!(
            out,
            "decision: virtual server {}: tool {tool:?} is left out ({}); refused for every caller",
            vs.name, d.why
        ),
        None => writeln!(
            out,
            "decision: virtual server {}: no member lists a tool {tool:?} (Unknown tool)",
            vs.name
        ),
    };
    Ok(None)
}

/// `mcp-firewall migrate`: creates or upgrades the approvals schema.
pub async fn migrate(cfg: &Config) -> anyhow::Result<String> {
    let a = cfg
        .approvals
        .as_ref()
        .filter(|a| a.store == crate::approval::StoreKind::Postgres)
        .ok_or_else(|| anyhow::anyhow!("the config has no [approvals] store = \"postgres\""))?;
    let version = crate::approval::migrate(a).await?;
    Ok(format!("approvals schema at version {version}"))
}

/// A URL without its password.
pub(super) fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// `mcp-firewall check`: validates the config and the policy directory and
/// prints, per role, which named tools it may call at which gate.
pub fn check(cfg: &Config) -> anyhow::Result<String> {
    let policy = policy::load_dir(&cfg.policy_dir)
        .with_context(|| format!("policy directory {}", cfg.policy_dir.display()))?;
    let mut out = String::new();
    let _ = writeln!(out, "{}: ok", cfg.source.display());
    let _ = writeln!(
        out,
        "  listen {} ({}), admin {}",
        cfg.server.listen,
        if cfg.server.tls.is_some() {
            "TLS"
        } else {
            "plaintext"
        },
        cfg.admin_listen
    );
    let _ = writeln!(
        out,
        "  audit {}",
        match &cfg.audit {
            Some(a) if a.enabled =>
                format!("to {} (spool {})", a.clickhouse.url, a.spool.dir.display()),
            _ => "disabled".to_owned(),
        }
    );
    if let Some(a) = cfg.audit.as_ref().filter(|a| a.enabled) {
        let _ = writeln!(out, "  {}", audit_chain_line(a)?);
    }
    let _ = writeln!(out, "  policies: {}", policy.files().len());
    if let Some(dir) = &cfg.shadow_dir {
        // A broken shadow set is reported, never fatal (serve runs without it).
        let _ = match policy::load_dir(dir) {
            Ok(p) => writeln!(
                out,
                "  shadow policy {}: {} files, sha256 {}",
                dir.display(),
                p.files().len(),
                p.content_hash().get(..16).unwrap_or("")
            ),
            Err(e) => writeln!(
                out,
                "  shadow policy {}: DOES NOT COMPILE (serve decides without it): {e}",
                dir.display()
            ),
        };
    }
    for u in &cfg.upstreams {
        let Some(launch) = &u.stdio else {
            let _ = writeln!(
                out,
                "  upstream {} -> {} projects {:?} categories {:?}",
                u.name, u.url, u.projects, u.categories
            );
            continue;
        };
        let _ = writeln!(
            out,
            "  upstream {} -> stdio: {} ({:?}, max_instances {}, idle_timeout_s {}) projects {:?} categories {:?}",
            u.name,
            launch.command.join(" "),
            launch.instances,
            launch.max_instances,
            launch.idle_timeout.as_secs(),
            u.projects,
            u.categories
        );
    }
    for agent in policy.agents() {
        let _ = writeln!(out, "\nrole {} (projects {:?})", agent.name, agent.projects);
        let authority = policy::Authority {
            agent: agent.name.clone(),
            projects: agent.projects.clone(),
        };
        for u in &cfg.upstreams {
            if !policy.reaches(&authority, u.facts()) {
                continue;
            }
            let mut lines = Vec::new();
            for tool in policy.named_tools(u.facts()) {
                if let Access::Visible { risk, gate, .. } =
                    policy.access(&authority, u.facts(), &tool, None)
                {
                    lines.push(format!("{tool} ({risk}, {gate})"));
                }
            }
            let _ = writeln!(
                out,
                "  {}: {}",
                u.name,
                if lines.is_empty() {
                    "no named tool".to_owned()
                } else {
                    lines.join(", ")
                }
            );
        }
    }
    Ok(out)
}

/// `check`'s line on the audit hash chain: the writer, the checkpoint key
/// (loaded: a key that does not load fails `check`) and how often it signs.
fn audit_chain_line(a: &crate::audit::AuditConfig) -> anyhow::Result<String> {
    if !a.chain {
        return Ok(
            "audit chain: off (audit.chain = false): nothing about the rows is provable".to_owned(),
        );
    }
    let writer = a
        .writer_id
        .clone()
        .unwrap_or_else(|| format!("kept in {}/writer_id", a.spool.dir.display()));
    let (rows, seconds) = a.checkpoint_every.limits();
    let signing = match &a.signing_key_file {
        Some(path) => format!(
            "checkpoints signed by {} every {rows} rows or {seconds} s",
            crate::audit::load_signer(path)?.public_key_text()
        ),
        None => "NO checkpoint key (audit.signing_key_file): a cut tail is not provable".to_owned(),
    };
    Ok(format!("audit chain: writer {writer}, {signing}"))
}
