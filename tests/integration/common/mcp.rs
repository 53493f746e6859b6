//! An MCP client from the official Rust SDK (rmcp) for the tests: speaks any
//! protocol era, answers sampling and elicitation, records progress and
//! list-changed notifications.

#![allow(deprecated, dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mcp_demo_upstream::{self as demo, DemoUpstream, UpstreamOptions};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ClientConfig,
    CreateMessageRequestParams, CreateMessageResult, ElicitRequestParams, ElicitResult,
    ElicitationAction, ElicitationCapability, Implementation, JsonObject,
    ProgressNotificationParam, ProtocolVersion, SamplingCapability, SamplingMessage, Tool,
    ToolAnnotations,
};
use rmcp::service::{NotificationContext, RequestContext, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{
    ClientHandler, ClientLifecycleMode, ClientServiceExt, ErrorData, RoleClient, ServiceExt,
};
use serde_json::Value;

pub const WAIT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Era {
    V2025_03_26,
    V2025_06_18,
    V2025_11_25,
    V2026_07_28,
}

impl Era {
    pub fn version(self) -> ProtocolVersion {
        match self {
            Era::V2025_03_26 => ProtocolVersion::V_2025_03_26,
            Era::V2025_06_18 => ProtocolVersion::V_2025_06_18,
            Era::V2025_11_25 => ProtocolVersion::V_2025_11_25,
            Era::V2026_07_28 => ProtocolVersion::V_2026_07_28,
        }
    }
}

/// The era/transport combinations every protocol test runs in.
pub const SETUPS: [(Era, bool); 5] = [
    (Era::V2025_11_25, false),
    (Era::V2025_06_18, false),
    (Era::V2025_03_26, false),
    (Era::V2026_07_28, true),
    (Era::V2026_07_28, false),
];

pub struct ClientState {
    pub era: Era,
    pub sampling: bool,
    pub elicitation: bool,
    pub elicit_action: ElicitationAction,
    pub sampling_reply: &'static str,
    pub progress: Mutex<Vec<(Instant, f64)>>,
    pub samplings: AtomicUsize,
    pub elicitations: AtomicUsize,
    pub list_changes: AtomicUsize,
    pub list_changed: tokio::sync::Notify,
}

#[derive(Clone)]
pub struct TestClient(pub Arc<ClientState>);

impl TestClient {
    pub fn new(era: Era) -> TestClient {
        TestClient(Arc::new(ClientState {
            era,
            sampling: true,
            elicitation: true,
            elicit_action: ElicitationAction::Accept,
            sampling_reply: "rejected",
            progress: Mutex::new(Vec::new()),
            samplings: AtomicUsize::new(0),
            elicitations: AtomicUsize::new(0),
            list_changes: AtomicUsize::new(0),
            list_changed: tokio::sync::Notify::new(),
        }))
    }

    pub fn with(era: Era, configure: impl FnOnce(&mut ClientState)) -> TestClient {
        let mut client = TestClient::new(era);
        let state = Arc::get_mut(&mut client.0).expect("fresh client");
        configure(state);
        client
    }
}

impl ClientHandler for TestClient {
    async fn create_message(
        &self,
        _params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.0.samplings.fetch_add(1, Ordering::SeqCst);
        Ok(CreateMessageResult::new(
            SamplingMessage::assistant_text(self.0.sampling_reply),
            "test-model".into(),
        ))
    }

    async fn create_elicitation(
        &self,
        _request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.0.elicitations.fetch_add(1, Ordering::SeqCst);
        Ok(ElicitResult::new(self.0.elicit_action.clone()))
    }

    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let mut progress = self.0.progress.lock().expect("progress log");
        progress.push((Instant::now(), params.progress));
    }

    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        self.0.list_changes.fetch_add(1, Ordering::SeqCst);
        self.0.list_changed.notify_one();
    }

    fn get_info(&self) -> ClientConfig {
        let mut capabilities = ClientCapabilities::default();
        if self.0.sampling {
            capabilities.sampling = Some(SamplingCapability::default());
        }
        if self.0.elicitation {
            capabilities.elicitation = Some(ElicitationCapability::default());
        }
        ClientConfig::new(
            capabilities,
            Implementation::new("demo-test-client", "1.0.0"),
        )
        .with_protocol_version(self.0.era.version())
    }
}

pub type Client = RunningService<RoleClient, TestClient>;

pub fn install_crypto() {
    // reqwest is built without a default TLS provider; it needs one even for
    // plain HTTP. Another test may have installed it already.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

pub async fn upstream(opts: UpstreamOptions) -> DemoUpstream {
    install_crypto();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    demo::spawn(listener, opts).await.expect("spawn upstream")
}

pub fn options(json_response: bool) -> UpstreamOptions {
    UpstreamOptions {
        json_response,
        progress_delay: Duration::from_millis(40),
        ..UpstreamOptions::default()
    }
}

pub async fn connect_with(
    client: TestClient,
    config: StreamableHttpClientTransportConfig,
) -> Client {
    let transport = StreamableHttpClientTransport::from_config(config);
    let era = client.0.era;
    let running = if era == Era::V2026_07_28 {
        client
            .serve_with_lifecycle(
                transport,
                ClientLifecycleMode::Discover {
                    preferred_versions: vec![ProtocolVersion::V_2026_07_28],
                },
            )
            .await
    } else {
        client.serve(transport).await
    };
    let running = running.expect("client connects");
    let negotiated = running
        .peer_info()
        .expect("server info")
        .protocol_version
        .clone();
    assert_eq!(negotiated, era.version());
    running
}

/// Connects to `url` speaking 2026-07-28 with `token` as the bearer.
pub async fn connect_bearer(url: &str, token: &str) -> Client {
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    cfg.auth_header = Some(token.to_owned());
    connect_with(TestClient::new(Era::V2026_07_28), cfg).await
}

pub async fn connect(url: &str, client: TestClient) -> Client {
    connect_with(
        client,
        StreamableHttpClientTransportConfig::with_uri(url.to_owned()),
    )
    .await
}

pub fn args(value: Value) -> JsonObject {
    match value {
        Value::Object(map) => map,
        other => panic!("arguments must be an object, got {other}"),
    }
}

pub async fn call(client: &Client, tool: &str, arguments: Value) -> CallToolResult {
    let params = CallToolRequestParams::new(tool.to_owned()).with_arguments(args(arguments));
    tokio::time::timeout(WAIT, client.call_tool(params))
        .await
        .expect("call does not hang")
        .expect("call succeeds")
}

pub fn text(result: &CallToolResult) -> &str {
    &result.content[0].as_text().expect("text content").text
}

pub fn structured(result: &CallToolResult) -> &Value {
    result
        .structured_content
        .as_ref()
        .expect("structured content")
}

pub const READ_ONLY: [&str; 8] = [
    "get_incident",
    "list_incidents",
    "get_service_health",
    "list_recent_deployments",
    "get_deployment",
    "get_deployment_diff",
    "export_metrics_csv",
    "preview_remediation",
];
pub const WRITE: [&str; 3] = ["post_incident_note", "record_finding", "audit_finding"];
pub const DESTRUCTIVE: [&str; 2] = ["rollback_deployment", "restart_service"];

pub fn annotations<'a>(tools: &'a [Tool], name: &str) -> Option<&'a ToolAnnotations> {
    tools
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("{name} is listed"))
        .annotations
        .as_ref()
}
