//! The sample upstream MCP server: a small, deterministic SRE incident-response
//! estate served over streamable HTTP with rmcp. It is not part of the
//! firewall (which depends on no MCP server framework): `mcp-firewall demo`
//! starts its binary, `mcp-demo-upstream`, as a child process and puts the
//! firewall in front of it; the integration tests proxy to it in process (it
//! counts tool executions and records request headers); the bench hammers it.
//!
//! - [`estate`] owns the world (services, deployments, incidents, diffs,
//!   metrics) and its mutable state; it knows nothing of MCP. Its fixed data
//!   lives in the private `catalog` module.
//! - [`tools`] owns the MCP surface: fourteen tools with honest annotations,
//!   progress, sampling and elicitation in both eras, `list_changed`.
//! - [`server`] owns HTTP: [`spawn`] serves both eras on one URL and returns a
//!   [`DemoUpstream`] handle for tests.
//!
//! Invariants: the same call on the same state returns the same bytes (no
//! clock, no randomness); every spawned upstream has its own state and
//! counters; nothing here hand-writes JSON-RPC, rmcp does all of it.
//!
//! # The tools
//!
//! | tool | annotations |
//! |---|---|
//! | `get_incident`, `list_incidents`, `get_service_health`, `list_recent_deployments`, `get_deployment`, `get_deployment_diff`, `export_metrics_csv`, `preview_remediation` | `readOnlyHint: true` |
//! | `post_incident_note`, `record_finding`, `audit_finding` | `readOnlyHint: false, destructiveHint: false` |
//! | `rollback_deployment`, `restart_service` | `readOnlyHint: false, destructiveHint: true` |
//! | `rollback_deployment_unsafe` | none at all (same behaviour as `rollback_deployment`) |
//!
//! All annotated tools also say `openWorldHint: false` and carry a `title`.
//! Unknown ids give a tool error (`isError: true`); an unknown tool name is a
//! JSON-RPC error (-32602). Good ids to start from: `INC-1001` (open sev1 on
//! checkout, caused by `dep-1042`), `INC-1002` (search latency, fixed by
//! restarting `search`/`prod`), `dep-1042` (live on checkout/prod, can be
//! rolled back to `dep-1038`).
//!
//! # Behaviours for tests
//!
//! - Counters: [`DemoUpstream::calls`] / [`DemoUpstream::total_calls`] count
//!   every `tools/call` that reached a registered tool, counted before it runs.
//!   A 2026-07-28 MRTR exchange (input required, then retry) counts twice.
//! - Headers: [`DemoUpstream::requests`] returns every request's headers in
//!   arrival order, including requests rmcp rejected.
//! - Progress: `export_metrics_csv`, `rollback_deployment` and
//!   `rollback_deployment_unsafe` send [`UpstreamOptions::progress_steps`]
//!   `notifications/progress`, each followed by
//!   [`UpstreamOptions::progress_delay`], when the request has
//!   `params._meta.progressToken`. rmcp's client always sends one.
//! - Sampling: `audit_finding` asks the client's model when the client declared
//!   `sampling`, otherwise applies a rule (evidence present: `confirmed`,
//!   none: `needs_more_evidence`). The result's `structuredContent.source` says
//!   which (`sampling` or `rule`).
//! - Elicitation: `post_incident_note` with `"confirm": true` asks the user and
//!   posts only on `accept`; without the elicitation capability it is a tool
//!   error and nothing is posted.
//! - In 2026-07-28 both flows use MRTR, which rmcp 3.11 supports: the first
//!   call returns `resultType: "input_required"` with `inputRequests` (keys
//!   [`tools::CONFIRM_INPUT_KEY`] / [`tools::VERDICT_INPUT_KEY`]) and a
//!   `requestState` bound to the arguments; the retry carrying
//!   `inputResponses` and the echoed `requestState` completes. rmcp's client
//!   `call_tool` runs these rounds itself through its `ClientHandler`.
//! - list_changed: [`DemoUpstream::add_tool`], [`DemoUpstream::rename_tool`]
//!   and [`DemoUpstream::remove_tool`] change the catalog and send
//!   `notifications/tools/list_changed` to every legacy session (see
//!   [`DemoUpstream::session_count`]) and to every 2026-07-28
//!   `subscriptions/listen` stream that asked for tool changes (see
//!   [`DemoUpstream::subscription_count`]).
//!
//! # Making rmcp's client speak a given protocol version
//!
//! With the dev-dependency features `client` and
//! `transport-streamable-http-client-reqwest` (install
//! `rustls::crypto::ring::default_provider()` first: reqwest is built without
//! a default TLS provider and refuses to build a client otherwise):
//!
//! ```rust,ignore
//! use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, ServiceExt};
//! use rmcp::model::{ClientCapabilities, ClientConfig, Implementation, ProtocolVersion};
//! use rmcp::transport::StreamableHttpClientTransport;
//!
//! // A legacy revision (2025-11-25, 2025-06-18, 2025-03-26): the version the
//! // handler's `get_info()` returns goes into `initialize`; `serve` runs the
//! // initialize handshake and the session follows the negotiated version.
//! impl ClientHandler for MyClient {
//!     fn get_info(&self) -> ClientConfig {
//!         ClientConfig::new(
//!             ClientCapabilities::builder().enable_sampling().enable_elicitation().build(),
//!             Implementation::new("test-client", "1.0.0"),
//!         )
//!         .with_protocol_version(ProtocolVersion::V_2025_06_18)
//!     }
//! }
//! let client = MyClient.serve(StreamableHttpClientTransport::from_uri(url)).await?;
//!
//! // 2026-07-28: no handshake; `Discover` sends `server/discover` and then
//! // puts protocol version, client info and capabilities in every request's
//! // `_meta` (and the `MCP-Protocol-Version`/`Mcp-Method`/`Mcp-Name` headers).
//! let client = MyClient
//!     .serve_with_lifecycle(
//!         StreamableHttpClientTransport::from_uri(url),
//!         ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
//!     )
//!     .await?;
//! ```
//!
//! `ClientLifecycleMode::Auto { preferred_versions, legacy_version }` probes
//! with `server/discover` and falls back to `initialize`. Note that
//! `ClientConfig::default()` carries `ProtocolVersion::LATEST` (2026-07-28),
//! so a legacy test must set the version explicitly. In 2026-07-28 list
//! changes arrive only on `client.listen(SubscriptionFilter::builder()
//! .tools_list_changed().build())`, not on `ClientHandler::on_tool_list_changed`.

#![forbid(unsafe_code)]

mod catalog;
pub mod estate;
pub mod model;
pub mod server;
pub mod tools;

pub use server::{spawn, DemoUpstream, RecordedRequest, UpstreamOptions};
pub use tools::ToolCatalogError;
