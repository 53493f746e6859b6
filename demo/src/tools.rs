//! The sample upstream's MCP surface: the fourteen estate tools as an rmcp
//! [`ServerHandler`], plus the hooks the firewall's tests observe (execution
//! counters, progress, server-to-client requests, `tools/list_changed`).
//!
//! Invariants:
//! - One `Shared` per spawned upstream. rmcp builds a handler per session
//!   (legacy) or per request (stateless, and for every 2026-07-28 `tools/call`
//!   it validates headers against); [`DemoTools`] is one `Arc`, so that is a
//!   reference-count bump.
//! - The tool catalog is an immutable snapshot behind an [`ArcSwap`]: calls
//!   and listings never take a lock; a catalog change builds a new snapshot,
//!   swaps it in, then notifies clients.
//! - Every `tools/call` that names a registered tool increments that tool's
//!   counter and the total before the tool runs, whatever the outcome (tool
//!   error, bad arguments, an MRTR round that only asks for input). The
//!   counter therefore proves that a request reached the upstream.
//! - The era decides how the server asks the client for input: before
//!   2026-07-28 it sends `sampling/createMessage` / `elicitation/create`
//!   requests on the session; from 2026-07-28 on it returns an
//!   `InputRequiredResult` (MRTR) and finishes on the retry. It never asks for
//!   a capability the client did not declare.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use arc_swap::ArcSwap;
use dashmap::DashMap;
use rmcp::handler::server::router::tool::{ToolRoute, ToolRouter};
use rmcp::handler::server::tool::{
    InputResponses as ToolInputResponses, RequestState, ToolCallContext,
};
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{
    CacheScope, CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities,
    ClientResult, ContentBlock, ElicitRequest, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationSchema, Implementation, InputRequest, InputRequests,
    InputRequiredResult, ListToolsResult, PaginatedRequestParams, ProgressNotificationParam,
    ProtocolVersion, ResultType, SamplingContent, ServerCapabilities, ServerConfig, ServerRequest,
    SubscriptionFilter, Tool,
};
// Sampling is deprecated by SEP-2577 but is still part of every revision the
// firewall must proxy, so the demo keeps exercising it.
#[allow(deprecated)]
use rmcp::model::{
    CreateMessageRequest, CreateMessageRequestParams, CreateMessageResult, SamplingMessage,
};
use rmcp::service::{
    NotificationContext, PeerRequestOptions, RequestContext, ServiceError, SubscriptionContext,
    SubscriptionSendError,
};
use rmcp::{tool, tool_router, ErrorData, Peer, RoleServer, ServerHandler};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::estate::{
    AuditSource, Estate, EstateError, FindingBrief, FindingSeverity, IncidentStatus, Namespace,
    RemediationAction, Service, ToolOutput, Verdict,
};

/// How long the server waits for the client to answer a sampling or
/// elicitation request before giving up on it.
const SERVER_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Author recorded when `post_incident_note` gets none.
const DEFAULT_AUTHOR: &str = "agent";

/// Key of the elicitation in `post_incident_note`'s MRTR round.
pub const CONFIRM_INPUT_KEY: &str = "confirm_note";

/// Key of the sampling request in `audit_finding`'s MRTR round.
pub const VERDICT_INPUT_KEY: &str = "audit_verdict";

/// The names of the fourteen tools the upstream starts with.
pub const TOOL_NAMES: [&str; 14] = [
    "get_incident",
    "list_incidents",
    "get_service_health",
    "list_recent_deployments",
    "get_deployment",
    "get_deployment_diff",
    "export_metrics_csv",
    "preview_remediation",
    "post_incident_note",
    "record_finding",
    "audit_finding",
    "rollback_deployment",
    "restart_service",
    "rollback_deployment_unsafe",
];

/// Why a change to the tool catalog was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolCatalogError {
    /// A tool with this name is already registered.
    #[error("a tool named `{name}` already exists")]
    ToolExists {
        /// The clashing name.
        name: String,
    },
    /// No tool with this name is registered.
    #[error("no tool named `{name}` is registered")]
    UnknownTool {
        /// The missing name.
        name: String,
    },
}

/// How long-ish tools report progress when the client sends a progress token.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProgressPlan {
    pub(crate) steps: u32,
    pub(crate) delay: Duration,
}

/// What a handler needs to know about how the upstream is served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Behaviour {
    pub(crate) progress: ProgressPlan,
    /// Whether legacy revisions get sessions. Without them rmcp serves each
    /// legacy request on its own and reports empty client capabilities, so
    /// the handler must treat them as unknown.
    pub(crate) legacy_sessions: bool,
}

/// One immutable catalog snapshot: the router plus its sorted listing, so
/// `tools/list` copies a ready vector instead of collecting and sorting.
struct Catalog {
    router: ToolRouter<DemoTools>,
    tools: Vec<Tool>,
}

impl Catalog {
    fn new(router: ToolRouter<DemoTools>) -> Catalog {
        let tools = router.list_all();
        Catalog { router, tools }
    }
}

/// State shared by every handler instance of one upstream and by the test
/// handle ([`super::DemoUpstream`]).
pub(crate) struct Shared {
    pub(crate) estate: Estate,
    catalog: ArcSwap<Catalog>,
    /// Serializes catalog changes so two concurrent edits cannot lose one.
    catalog_edit: tokio::sync::Mutex<()>,
    counters: DashMap<String, AtomicU64>,
    total: AtomicU64,
    /// Peers of legacy sessions, for `notifications/tools/list_changed`.
    sessions: Mutex<Vec<Peer<RoleServer>>>,
    /// Bumped on every catalog change; each 2026-07-28 `subscriptions/listen`
    /// stream watches it.
    tools_changed: tokio::sync::watch::Sender<u64>,
    /// Tools per `tools/list` page (0: one page).
    pub(crate) page_size: AtomicU64,
    behaviour: Behaviour,
}

/// A copy of the route of registered tool `name`.
fn route_of(
    router: &ToolRouter<DemoTools>,
    name: &str,
) -> Result<ToolRoute<DemoTools>, ToolCatalogError> {
    router
        .map
        .get(name)
        .cloned()
        .ok_or_else(|| ToolCatalogError::UnknownTool {
            name: name.to_owned(),
        })
}

impl Shared {
    pub(crate) fn new(behaviour: Behaviour) -> Shared {
        let counters = DashMap::with_capacity(TOOL_NAMES.len() * 2);
        for name in TOOL_NAMES {
            counters.insert(name.to_owned(), AtomicU64::new(0));
        }
        Shared {
            estate: Estate::new(),
            catalog: ArcSwap::from_pointee(Catalog::new(DemoTools::tool_router())),
            catalog_edit: tokio::sync::Mutex::new(()),
            counters,
            total: AtomicU64::new(0),
            sessions: Mutex::new(Vec::new()),
            tools_changed: tokio::sync::watch::Sender::new(0),
            page_size: AtomicU64::new(0),
            behaviour,
        }
    }

    fn count(&self, tool: &str) {
        self.total.fetch_add(1, Ordering::Relaxed);
        // Fast path without allocating: every listed tool has an entry.
        if let Some(counter) = self.counters.get(tool) {
            counter.fetch_add(1, Ordering::Relaxed);
            return;
        }
        self.counters
            .entry(tool.to_owned())
            .or_default()
            .fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn calls(&self, tool: &str) -> u64 {
        self.counters
            .get(tool)
            .map_or(0, |c| c.load(Ordering::Relaxed))
    }

    pub(crate) fn total_calls(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    fn register_session(&self, peer: Peer<RoleServer>) {
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions.retain(|p| !p.is_transport_closed());
        sessions.push(peer);
    }

    pub(crate) fn session_count(&self) -> usize {
        let sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        sessions.iter().filter(|p| !p.is_transport_closed()).count()
    }

    pub(crate) fn subscription_count(&self) -> usize {
        self.tools_changed.receiver_count()
    }

    pub(crate) fn tool_names(&self) -> Vec<String> {
        self.catalog
            .load()
            .tools
            .iter()
            .map(|t| t.name.to_string())
            .collect()
    }

    /// Applies `edit` to a copy of the router, publishes the result and
    /// notifies every connected client that the tool list changed.
    async fn edit_catalog(
        &self,
        edit: impl FnOnce(&mut ToolRouter<DemoTools>) -> Result<(), ToolCatalogError>,
    ) -> Result<(), ToolCatalogError> {
        {
            let _serialized = self.catalog_edit.lock().await;
            let mut router = self.catalog.load().router.clone();
            edit(&mut router)?;
            self.catalog.store(Arc::new(Catalog::new(router)));
        }
        self.tools_changed
            .send_modify(|generation| *generation += 1);
        let peers: Vec<Peer<RoleServer>> = self
            .sessions
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        for peer in peers {
            if let Err(error) = peer.notify_tool_list_changed().await {
                tracing::debug!(%error, "demo upstream could not notify a session of a tool list change");
            }
        }
        Ok(())
    }

    pub(crate) async fn add_tool(&self, tool: Tool) -> Result<(), ToolCatalogError> {
        self.edit_catalog(|router| {
            if router.has_route(&tool.name) {
                return Err(ToolCatalogError::ToolExists {
                    name: tool.name.to_string(),
                });
            }
            router.add_route(echo_route(tool));
            Ok(())
        })
        .await
    }

    pub(crate) async fn rename_tool(&self, from: &str, to: &str) -> Result<(), ToolCatalogError> {
        self.edit_catalog(|router| {
            let mut route = route_of(router, from)?;
            if router.has_route(to) {
                return Err(ToolCatalogError::ToolExists {
                    name: to.to_owned(),
                });
            }
            router.remove_route(from);
            route.attr.name = Cow::Owned(to.to_owned());
            router.add_route(route);
            Ok(())
        })
        .await
    }

    pub(crate) async fn edit_tool(
        &self,
        name: &str,
        edit: impl FnOnce(&mut Tool),
    ) -> Result<(), ToolCatalogError> {
        self.edit_catalog(|router| {
            let mut route = route_of(router, name)?;
            edit(&mut route.attr);
            router.remove_route(name);
            router.add_route(route);
            Ok(())
        })
        .await
    }

    pub(crate) async fn remove_tool(&self, name: &str) -> Result<(), ToolCatalogError> {
        self.edit_catalog(|router| {
            if !router.has_route(name) {
                return Err(ToolCatalogError::UnknownTool {
                    name: name.to_owned(),
                });
            }
            router.remove_route(name);
            Ok(())
        })
        .await
    }
}

/// A tool added at runtime answers with its own name and the arguments it got,
/// so a test can tell that a call reached it.
fn echo_route(tool: Tool) -> ToolRoute<DemoTools> {
    ToolRoute::new_dyn(tool, |context: ToolCallContext<'_, DemoTools>| {
        let name = context.name.to_string();
        let arguments = context.arguments.clone().unwrap_or_default();
        Box::pin(async move {
            let mut result =
                CallToolResult::success(vec![ContentBlock::text(format!("{name} was called"))]);
            result.structured_content = Some(json!({"tool": name, "arguments": arguments}));
            Ok(result.into())
        })
    })
}

/// The rmcp handler of the sample upstream. Cloning is one `Arc` bump.
#[derive(Clone)]
pub struct DemoTools {
    shared: Arc<Shared>,
}

// ---------------------------------------------------------------------------
// Tool arguments. Doc comments become the JSON Schema descriptions.
// ---------------------------------------------------------------------------

/// Arguments naming one incident.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct IncidentArgs {
    /// Incident id, e.g. `INC-1001`.
    #[schemars(regex(pattern = r"^INC-[0-9]+$"))]
    pub incident_id: String,
}

/// Filters for `list_incidents`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListIncidentsArgs {
    /// Only incidents in this state.
    #[serde(default)]
    pub status: Option<IncidentStatus>,
    /// Only incidents of this service.
    #[serde(default)]
    pub service: Option<Service>,
}

/// Arguments naming one service instance.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthArgs {
    /// The service.
    pub service: Service,
    /// The namespace; defaults to `prod`.
    #[serde(default)]
    pub namespace: Option<Namespace>,
}

/// Filters for `list_recent_deployments`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListDeploymentsArgs {
    /// Only deployments of this service.
    #[serde(default)]
    pub service: Option<Service>,
    /// Only deployments to this namespace.
    #[serde(default)]
    pub namespace: Option<Namespace>,
    /// How many deployments to return, newest first; defaults to 10.
    #[serde(default)]
    #[schemars(range(min = 1, max = 50))]
    pub limit: Option<u32>,
}

/// Arguments naming one deployment.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeploymentArgs {
    /// Deployment id, e.g. `dep-1042`.
    #[schemars(regex(pattern = r"^dep-[0-9]+$"))]
    pub deployment_id: String,
}

/// Arguments of `export_metrics_csv`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricsArgs {
    /// The service.
    pub service: Service,
    /// The namespace; defaults to `prod`.
    #[serde(default)]
    pub namespace: Option<Namespace>,
    /// Number of one-minute samples from 2026-03-11T00:00:00Z; defaults to
    /// 60. Each row is about 50 bytes.
    #[serde(default)]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub points: Option<u64>,
}

/// Arguments of `preview_remediation`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewArgs {
    /// The remediation to preview.
    pub action: RemediationAction,
    /// For `rollback`: the deployment to roll back.
    #[serde(default)]
    #[schemars(regex(pattern = r"^dep-[0-9]+$"))]
    pub deployment_id: Option<String>,
    /// For `restart`: the service to restart.
    #[serde(default)]
    pub service: Option<Service>,
    /// For `restart`: the namespace; defaults to `prod`.
    #[serde(default)]
    pub namespace: Option<Namespace>,
}

/// Arguments of `post_incident_note`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PostNoteArgs {
    /// Incident id, e.g. `INC-1001`.
    #[schemars(regex(pattern = r"^INC-[0-9]+$"))]
    pub incident_id: String,
    /// The note text.
    #[schemars(length(min = 1, max = 2000))]
    pub note: String,
    /// Who writes the note; defaults to `agent`.
    #[serde(default)]
    #[schemars(length(min = 1, max = 500))]
    pub author: Option<String>,
    /// Ask the user to confirm before posting (needs the client's elicitation
    /// capability). The note is posted only if the user accepts.
    #[serde(default)]
    pub confirm: bool,
}

/// Arguments of `record_finding`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RecordFindingArgs {
    /// Incident id, e.g. `INC-1001`.
    #[schemars(regex(pattern = r"^INC-[0-9]+$"))]
    pub incident_id: String,
    /// One-line statement of the finding.
    #[schemars(length(min = 1, max = 500))]
    pub summary: String,
    /// How much the finding matters.
    pub severity: FindingSeverity,
    /// Supporting facts (log lines, metric readings, diff hunks).
    #[serde(default)]
    #[schemars(length(max = 10))]
    pub evidence: Vec<String>,
}

/// Arguments naming one finding.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FindingArgs {
    /// Finding id as returned by `record_finding`, e.g. `F-1`.
    #[schemars(regex(pattern = r"^F-[0-9]+$"))]
    pub finding_id: String,
}

/// Arguments of the rollback tools.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackArgs {
    /// The live deployment to roll back, e.g. `dep-1042`.
    #[schemars(regex(pattern = r"^dep-[0-9]+$"))]
    pub deployment_id: String,
    /// Why, for the audit trail.
    #[schemars(length(min = 1, max = 500))]
    pub reason: String,
}

/// Arguments of `restart_service`.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RestartArgs {
    /// The service.
    pub service: Service,
    /// The namespace.
    pub namespace: Namespace,
    /// Why, for the audit trail.
    #[schemars(length(min = 1, max = 500))]
    pub reason: String,
}

// ---------------------------------------------------------------------------
// Result helpers.
// ---------------------------------------------------------------------------

fn success(output: ToolOutput) -> CallToolResult {
    let mut result = CallToolResult::success(vec![ContentBlock::text(output.text)]);
    result.structured_content = output.structured;
    result
}

fn tool_error(message: impl Into<String>) -> CallToolResult {
    CallToolResult::error(vec![ContentBlock::text(message)])
}

fn answer(result: Result<ToolOutput, EstateError>) -> CallToolResult {
    match result {
        Ok(output) => success(output),
        Err(error) => tool_error(error.to_string()),
    }
}

/// True when the request runs under 2026-07-28 or later, where server-to-client
/// requests are replaced by `InputRequiredResult`.
fn is_modern(context: &RequestContext<RoleServer>) -> bool {
    context
        .protocol_version()
        .is_some_and(|version| version >= ProtocolVersion::V_2026_07_28)
}

/// A `requestState` bound to the arguments of the call it continues: the
/// retry must carry the same arguments, or the server asks again. The state
/// grants nothing by itself (the decision comes from the client's answer), so
/// a digest suffices where an authorizing state would need an HMAC.
fn bound_state(kind: &str, parts: &[&str]) -> String {
    let mut hasher = Sha256::new();
    for part in parts {
        hasher.update((part.len() as u64).to_be_bytes());
        hasher.update(part.as_bytes());
    }
    let digest = hasher.finalize();
    let mut state = String::with_capacity(kind.len() + 40);
    state.push_str("demo/v1/");
    state.push_str(kind);
    state.push('/');
    for byte in digest.iter().take(12) {
        use std::fmt::Write as _;
        let _ = write!(state, "{byte:02x}");
    }
    state
}

fn confirm_request(incident_id: &str, note: &str) -> ElicitRequestParams {
    ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: format!("Post this note to {incident_id}?\n\n{note}"),
        requested_schema: ElicitationSchema::new(BTreeMap::new()),
    }
}

#[allow(deprecated)]
fn audit_request(brief: &FindingBrief) -> CreateMessageRequestParams {
    let mut prompt = format!(
        "Finding {} on {} [{}]: {}\n",
        brief.finding_id,
        brief.incident_id,
        brief.severity.as_str(),
        brief.summary
    );
    if brief.evidence.is_empty() {
        prompt.push_str("Evidence: none given.\n");
    } else {
        prompt.push_str("Evidence:\n");
        for item in &brief.evidence {
            prompt.push_str("- ");
            prompt.push_str(item);
            prompt.push('\n');
        }
    }
    CreateMessageRequestParams::new(vec![SamplingMessage::user_text(prompt)], 16).with_system_prompt(
        "You audit incident findings. Answer with exactly one word: confirmed, needs_more_evidence or rejected.",
    )
}

#[allow(deprecated)]
fn reply_text(result: &CreateMessageResult) -> String {
    match &result.message.content {
        SamplingContent::Single(block) => block.as_text().map(|t| t.text.clone()),
        SamplingContent::Multiple(blocks) => blocks
            .iter()
            .find_map(|b| b.as_text().map(|t| t.text.clone())),
    }
    .unwrap_or_default()
}

fn not_posted(incident_id: &str, action: ElicitationAction) -> CallToolResult {
    let action = match action {
        ElicitationAction::Accept => "accept",
        ElicitationAction::Decline => "decline",
        ElicitationAction::Cancel => "cancel",
        _ => "an unknown action",
    };
    success(ToolOutput {
        text: format!("Note not posted to {incident_id}: the user chose {action}.\n"),
        structured: Some(json!({"incident_id": incident_id, "posted": false, "action": action})),
    })
}

// ---------------------------------------------------------------------------
// The tools.
// ---------------------------------------------------------------------------

#[tool_router]
impl DemoTools {
    #[tool(
        name = "get_incident",
        description = "Get one incident: status, severity, suspected deployment, notes and findings.",
        annotations(title = "Get incident", read_only_hint = true, open_world_hint = false)
    )]
    async fn get_incident(&self, Parameters(args): Parameters<IncidentArgs>) -> CallToolResult {
        answer(self.shared.estate.get_incident(&args.incident_id))
    }

    #[tool(
        name = "list_incidents",
        description = "List incidents, optionally filtered by status and service.",
        annotations(
            title = "List incidents",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_incidents(
        &self,
        Parameters(args): Parameters<ListIncidentsArgs>,
    ) -> CallToolResult {
        success(self.shared.estate.list_incidents(args.status, args.service))
    }

    #[tool(
        name = "get_service_health",
        description = "Current health of a service: version, replicas, latency, error rate, open incidents.",
        annotations(
            title = "Get service health",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn get_service_health(&self, Parameters(args): Parameters<HealthArgs>) -> CallToolResult {
        success(
            self.shared
                .estate
                .service_health(args.service, args.namespace.unwrap_or(Namespace::Prod)),
        )
    }

    #[tool(
        name = "list_recent_deployments",
        description = "List deployments, newest first, optionally filtered by service and namespace.",
        annotations(
            title = "List recent deployments",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn list_recent_deployments(
        &self,
        Parameters(args): Parameters<ListDeploymentsArgs>,
    ) -> CallToolResult {
        answer(self.shared.estate.list_recent_deployments(
            args.service,
            args.namespace,
            args.limit.unwrap_or(10),
        ))
    }

    #[tool(
        name = "get_deployment",
        description = "Get one deployment: version, author, time, commit, status and predecessor.",
        annotations(
            title = "Get deployment",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn get_deployment(&self, Parameters(args): Parameters<DeploymentArgs>) -> CallToolResult {
        answer(self.shared.estate.get_deployment(&args.deployment_id))
    }

    #[tool(
        name = "get_deployment_diff",
        description = "Get the unified diff a deployment shipped, with per-file line counts.",
        annotations(
            title = "Get deployment diff",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn get_deployment_diff(
        &self,
        Parameters(args): Parameters<DeploymentArgs>,
    ) -> CallToolResult {
        answer(self.shared.estate.deployment_diff(&args.deployment_id))
    }

    #[tool(
        name = "export_metrics_csv",
        description = "Export raw one-minute metric samples of a service as CSV text (no analysis). Reports progress when the request carries a progress token.",
        annotations(
            title = "Export metrics (CSV)",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn export_metrics_csv(
        &self,
        Parameters(args): Parameters<MetricsArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        let namespace = args.namespace.unwrap_or(Namespace::Prod);
        let points = args.points.unwrap_or(60);
        let csv = match self
            .shared
            .estate
            .metrics_csv(args.service, namespace, points)
        {
            Ok(csv) => csv,
            Err(error) => return tool_error(error.to_string()),
        };
        if self
            .report_progress(&context, "exporting samples")
            .await
            .is_err()
        {
            return tool_error("export cancelled by the client");
        }
        CallToolResult::success(vec![ContentBlock::text(csv)])
    }

    #[tool(
        name = "preview_remediation",
        description = "Describe what a rollback or restart would do, without changing anything.",
        annotations(
            title = "Preview remediation",
            read_only_hint = true,
            open_world_hint = false
        )
    )]
    async fn preview_remediation(
        &self,
        Parameters(args): Parameters<PreviewArgs>,
    ) -> CallToolResult {
        match args.action {
            RemediationAction::Rollback => match args.deployment_id {
                Some(id) => answer(self.shared.estate.preview_rollback(&id)),
                None => tool_error(
                    EstateError::MissingTarget {
                        action: RemediationAction::Rollback,
                        field: "deployment_id",
                    }
                    .to_string(),
                ),
            },
            RemediationAction::Restart => match args.service {
                Some(service) => success(
                    self.shared
                        .estate
                        .preview_restart(service, args.namespace.unwrap_or(Namespace::Prod)),
                ),
                None => tool_error(
                    EstateError::MissingTarget {
                        action: RemediationAction::Restart,
                        field: "service",
                    }
                    .to_string(),
                ),
            },
        }
    }

    #[tool(
        name = "post_incident_note",
        description = "Append a note to an incident's timeline. With confirm=true the user is asked first and the note is posted only if they accept.",
        annotations(
            title = "Post incident note",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn post_incident_note(
        &self,
        Parameters(args): Parameters<PostNoteArgs>,
        context: RequestContext<RoleServer>,
        RequestState(request_state): RequestState,
        ToolInputResponses(input_responses): ToolInputResponses,
    ) -> Result<CallToolResponse, ErrorData> {
        let estate = &self.shared.estate;
        let author = args.author.as_deref().unwrap_or(DEFAULT_AUTHOR);
        if let Err(error) = estate.check_note(&args.incident_id, author, &args.note) {
            return Ok(tool_error(error.to_string()).into());
        }
        if !args.confirm {
            return Ok(answer(estate.post_note(&args.incident_id, author, &args.note)).into());
        }
        match self.client_capabilities(&context) {
            Some(caps) if caps.elicitation.is_some() => {}
            Some(_) => {
                return Ok(tool_error(
                    "confirm=true needs the client's elicitation capability, which it did not declare; nothing was posted",
                )
                .into())
            }
            None => {
                return Ok(tool_error(format!(
                    "confirm=true needs the client's elicitation capability, but {UNKNOWN_CAPABILITIES}; nothing was posted"
                ))
                .into())
            }
        }
        let action = if is_modern(&context) {
            let expected = bound_state(
                "post_incident_note",
                &[&args.incident_id, author, &args.note],
            );
            let answer = input_responses
                .as_ref()
                .and_then(|responses| responses.get(CONFIRM_INPUT_KEY));
            match (request_state.as_deref(), answer) {
                (Some(state), Some(answer)) if state == expected => {
                    serde_json::from_value::<ElicitResult>(answer.clone())
                        .map_or(ElicitationAction::Cancel, |result| result.action)
                }
                // First round, or a retry whose state does not match these
                // arguments: ask (again).
                _ => {
                    let mut requests = InputRequests::new();
                    requests.insert(
                        CONFIRM_INPUT_KEY.to_owned(),
                        InputRequest::Elicitation(ElicitRequest::new(confirm_request(
                            &args.incident_id,
                            &args.note,
                        ))),
                    );
                    return Ok(InputRequiredResult::new(Some(requests), Some(expected)).into());
                }
            }
        } else {
            let request = ServerRequest::ElicitRequest(ElicitRequest::new(confirm_request(
                &args.incident_id,
                &args.note,
            )));
            match send_to_client(&context.peer, request).await {
                Ok(ClientResult::ElicitResult(result)) => result.action,
                Ok(_) => {
                    return Ok(tool_error(
                        "the client answered the confirmation request with an unexpected result; nothing was posted",
                    )
                    .into())
                }
                Err(error) => {
                    return Ok(tool_error(format!(
                        "could not ask the user for confirmation ({error}); nothing was posted"
                    ))
                    .into())
                }
            }
        };
        Ok(match action {
            ElicitationAction::Accept => {
                answer(estate.post_note(&args.incident_id, author, &args.note))
            }
            other => not_posted(&args.incident_id, other),
        }
        .into())
    }

    #[tool(
        name = "record_finding",
        description = "Record a finding (a claim about cause or impact) against an incident. Returns its id.",
        annotations(
            title = "Record finding",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn record_finding(
        &self,
        Parameters(args): Parameters<RecordFindingArgs>,
    ) -> CallToolResult {
        answer(self.shared.estate.record_finding(
            &args.incident_id,
            &args.summary,
            args.severity,
            &args.evidence,
        ))
    }

    #[tool(
        name = "audit_finding",
        description = "Audit a finding and store the verdict. Asks the client's model (sampling) when the client can sample, otherwise applies a fixed rule.",
        annotations(
            title = "Audit finding",
            read_only_hint = false,
            destructive_hint = false,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    #[allow(deprecated)]
    async fn audit_finding(
        &self,
        Parameters(args): Parameters<FindingArgs>,
        context: RequestContext<RoleServer>,
        RequestState(request_state): RequestState,
        ToolInputResponses(input_responses): ToolInputResponses,
    ) -> Result<CallToolResponse, ErrorData> {
        let estate = &self.shared.estate;
        let brief = match estate.finding_brief(&args.finding_id) {
            Ok(brief) => brief,
            Err(error) => return Ok(tool_error(error.to_string()).into()),
        };
        let rule = |why| (Estate::rule_verdict(&brief), AuditSource::Rule { why });
        let (verdict, source) = match self.client_capabilities(&context) {
            None => rule(UNKNOWN_CAPABILITIES),
            Some(caps) if caps.sampling.is_none() => rule("the client did not declare sampling"),
            Some(_) => {
                match sampled_verdict(&brief, &context, request_state, input_responses).await {
                    Step::Done(outcome) => outcome,
                    Step::AskClient(input_required) => return Ok(input_required.into()),
                }
            }
        };
        Ok(answer(estate.record_audit(&brief.finding_id, verdict, source)).into())
    }

    #[tool(
        name = "rollback_deployment",
        description = "Roll a live deployment back to the previous version of its service. Reports progress when the request carries a progress token.",
        annotations(
            title = "Roll back deployment",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn rollback_deployment(
        &self,
        Parameters(args): Parameters<RollbackArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        self.rollback(args, &context).await
    }

    #[tool(
        name = "restart_service",
        description = "Restart every replica of a service in a namespace, one at a time.",
        annotations(
            title = "Restart service",
            read_only_hint = false,
            destructive_hint = true,
            idempotent_hint = false,
            open_world_hint = false
        )
    )]
    async fn restart_service(&self, Parameters(args): Parameters<RestartArgs>) -> CallToolResult {
        answer(
            self.shared
                .estate
                .restart(args.service, args.namespace, &args.reason),
        )
    }

    /// Deliberately unannotated twin of `rollback_deployment`: a firewall must
    /// treat a tool without annotations as destructive.
    #[tool(
        name = "rollback_deployment_unsafe",
        description = "Roll a live deployment back to the previous version of its service. Reports progress when the request carries a progress token."
    )]
    async fn rollback_deployment_unsafe(
        &self,
        Parameters(args): Parameters<RollbackArgs>,
        context: RequestContext<RoleServer>,
    ) -> CallToolResult {
        self.rollback(args, &context).await
    }
}

/// The request was cancelled while the tool was reporting progress.
struct Cancelled;

impl DemoTools {
    pub(crate) fn new(shared: Arc<Shared>) -> DemoTools {
        DemoTools { shared }
    }

    /// The client's capabilities, or `None` when this request cannot know
    /// them (see [`Behaviour::legacy_sessions`]).
    fn client_capabilities(
        &self,
        context: &RequestContext<RoleServer>,
    ) -> Option<ClientCapabilities> {
        if !self.shared.behaviour.legacy_sessions && !is_modern(context) {
            return None;
        }
        context.client_capabilities()
    }

    async fn rollback(
        &self,
        args: RollbackArgs,
        context: &RequestContext<RoleServer>,
    ) -> CallToolResult {
        let estate = &self.shared.estate;
        // Refuse bad input before making the client wait through progress.
        if let Err(error) = estate.check_rollback(&args.deployment_id, &args.reason) {
            return tool_error(error.to_string());
        }
        if self.report_progress(context, "rolling back").await.is_err() {
            return tool_error("rollback cancelled by the client; nothing was changed");
        }
        answer(estate.rollback(&args.deployment_id, &args.reason))
    }

    /// Sends the configured number of progress notifications, each followed by
    /// the configured delay, so every notification precedes the result by at
    /// least one delay. Does nothing without a progress token.
    async fn report_progress(
        &self,
        context: &RequestContext<RoleServer>,
        what: &str,
    ) -> Result<(), Cancelled> {
        let Some(token) = context.meta.get_progress_token() else {
            return Ok(());
        };
        let ProgressPlan { steps, delay } = self.shared.behaviour.progress;
        let mut deliver = true;
        for step in 1..=steps {
            if deliver {
                let notification = ProgressNotificationParam::new(token.clone(), f64::from(step))
                    .with_total(f64::from(steps))
                    .with_message(format!("{what}: step {step} of {steps}"));
                // A client that went away stops getting progress, but a legacy
                // disconnect is not a cancellation, so the work goes on.
                deliver = context.peer.notify_progress(notification).await.is_ok();
            }
            tokio::select! {
                () = context.ct.cancelled() => return Err(Cancelled),
                () = tokio::time::sleep(delay) => {}
            }
        }
        Ok(())
    }
}

/// The next step of a tool that may need input from the client.
enum Step<T> {
    /// The tool has what it needs.
    Done(T),
    /// 2026-07-28: return this and finish on the client's retry.
    AskClient(InputRequiredResult),
}

/// Why a tool cannot rely on client capabilities: a legacy request served
/// without a session carries none, and no handshake state exists for it.
const UNKNOWN_CAPABILITIES: &str =
    "the client's capabilities are unknown for this request (a legacy request without a session)";

/// Asks the client's model for a verdict on `brief`: through MRTR from
/// 2026-07-28 on, through a `sampling/createMessage` request before. Falls back
/// to the rule, saying why, when the answer cannot be had.
#[allow(deprecated)]
async fn sampled_verdict(
    brief: &FindingBrief,
    context: &RequestContext<RoleServer>,
    request_state: Option<String>,
    input_responses: Option<rmcp::model::InputResponses>,
) -> Step<(Verdict, AuditSource)> {
    let rule = |why| Step::Done((Estate::rule_verdict(brief), AuditSource::Rule { why }));
    let sampled = |result: CreateMessageResult| {
        Step::Done((
            Verdict::from_reply(&reply_text(&result)),
            AuditSource::Sampling {
                model: result.model,
            },
        ))
    };
    if is_modern(context) {
        let expected = bound_state("audit_finding", &[&brief.finding_id]);
        let reply = input_responses
            .as_ref()
            .and_then(|responses| responses.get(VERDICT_INPUT_KEY));
        return match (request_state.as_deref(), reply) {
            (Some(state), Some(reply)) if state == expected => {
                match serde_json::from_value::<CreateMessageResult>(reply.clone()) {
                    Ok(result) => sampled(result),
                    Err(_) => rule("the client's sampling reply was malformed"),
                }
            }
            // First round, or a retry whose state does not match: ask (again).
            _ => {
                let mut requests = InputRequests::new();
                requests.insert(
                    VERDICT_INPUT_KEY.to_owned(),
                    InputRequest::CreateMessage(CreateMessageRequest::new(audit_request(brief))),
                );
                Step::AskClient(InputRequiredResult::new(Some(requests), Some(expected)))
            }
        };
    }
    let request =
        ServerRequest::CreateMessageRequest(CreateMessageRequest::new(audit_request(brief)));
    match send_to_client(&context.peer, request).await {
        Ok(ClientResult::CreateMessageResult(result)) => sampled(*result),
        // The client declared sampling but could not deliver; the audit still
        // completes, and says which way it was decided.
        Ok(_) => rule("the client answered sampling with an unexpected result"),
        Err(_) => rule("the sampling request failed"),
    }
}

/// Sends a server-to-client request on the session and waits, bounded, for
/// the answer.
async fn send_to_client(
    peer: &Peer<RoleServer>,
    request: ServerRequest,
) -> Result<ClientResult, ServiceError> {
    peer.send_request_with_option(
        request,
        PeerRequestOptions::with_timeout(SERVER_REQUEST_TIMEOUT),
    )
    .await?
    .await_response()
    .await
}

impl ServerHandler for DemoTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(
            ServerCapabilities::builder()
                .enable_tools()
                .enable_tool_list_changed()
                .build(),
        )
        .with_server_info(Implementation::new(
            "mcp-firewall-demo-estate",
            env!("CARGO_PKG_VERSION"),
        ))
        .with_instructions(
            "Incident-response tools for a small demo estate (checkout, payments, search, auth). Read tools are safe; post_incident_note, record_finding and audit_finding write; rollback_deployment, rollback_deployment_unsafe and restart_service change production.",
        )
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let modern = is_modern(&context);
        let all = self.shared.catalog.load().tools.clone();
        let page = self.shared.page_size.load(Ordering::Relaxed) as usize;
        let start: usize = request
            .and_then(|r| r.cursor)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let (tools, next_cursor) = if page == 0 {
            (all, None)
        } else {
            let end = (start + page).min(all.len());
            let tools = all.get(start.min(end)..end).unwrap_or_default().to_vec();
            (tools, (end < all.len()).then(|| end.to_string()))
        };
        Ok(ListToolsResult {
            result_type: Some(ResultType::COMPLETE),
            meta: None,
            next_cursor,
            // The list can change at runtime, so it is never fresh for long;
            // it does not depend on who asks, so caches may share it.
            ttl_ms: modern.then_some(0),
            cache_scope: modern.then_some(CacheScope::Public),
            tools,
        })
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.shared.catalog.load().router.get(name).cloned()
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let catalog = self.shared.catalog.load_full();
        if catalog.router.has_route(&request.name) {
            self.shared.count(&request.name);
        }
        catalog
            .router
            .call(ToolCallContext::new(self, request, context))
            .await
    }

    async fn on_initialized(&self, context: NotificationContext<RoleServer>) {
        self.shared.register_session(context.peer);
    }

    fn accepted_subscription_filter(
        &self,
        requested: &SubscriptionFilter,
    ) -> Option<SubscriptionFilter> {
        Some(requested.supported_by(&self.get_info().capabilities))
    }

    async fn listen(&self, context: SubscriptionContext) -> Result<(), ErrorData> {
        let mut changes = self.shared.tools_changed.subscribe();
        loop {
            tokio::select! {
                () = context.cancelled() => return Ok(()),
                changed = changes.changed() => {
                    if changed.is_err() {
                        return Ok(());
                    }
                    match context.sink().notify_tool_list_changed().await {
                        // The listener did not ask for tool changes.
                        Ok(()) | Err(SubscriptionSendError::NotificationNotAccepted(_)) => {}
                        Err(_) => return Ok(()),
                    }
                }
            }
        }
    }
}
