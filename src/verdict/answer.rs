//! The answer-side decision step, the mirror of [`crate::proxy::request::decide`]: what
//! happens to each upstream-to-client message, decided on the message the
//! strict reader accepted (`jsonrpc::parse_upstream`: duplicate and
//! case-variant members refused, escapes decoded) against the run's policy
//! snapshot. Nothing here does I/O or changes state: the relay
//! ([`crate::proxy::outbound`]) carries the verdict out (rewrites the bytes, settles
//! budgets, completes rows, answers a refused request upstream).
//!
//! | upstream message | verdict |
//! |---|---|
//! | a response to no request this exchange sent | [`Verdict::Unsolicited`]: dropped |
//! | an error response | relayed |
//! | the answer to `tools/list`, `prompts/list`, `resources/list`, `resources/templates/list` | [`Verdict::Filter`]: the run's view, item by item ([`tool_visible`], [`item_visible`]) |
//! | an input-required result asking the client something the policy refuses | [`Verdict::RefuseInputRequests`]: an error in its place |
//! | an input-required result of a call that runs under an approval | [`Verdict::SealState`]: the approval sealed into `requestState` |
//! | a `tools/call` result that created a task | [`Verdict::TaskCreated`]: the task's id sealed, the call's budget waits for its outcome |
//! | the answer to `tasks/*` of the run's own task | [`Verdict::Task`] (or [`Verdict::RefuseInputRequests`] for input the policy refuses) |
//! | a server-to-client request the policy refuses, or any on 2026-07-28 | [`Verdict::RefuseServerRequest`]: the client never sees it |
//! | `notifications/tools/list_changed` | [`Verdict::ListChanged`]: relayed, the catalog re-listed |
//! | `notifications/progress` | [`Verdict::Progress`]: relayed, a held call's progress kept increasing |
//! | a task status notification, a server request of a task (`related-task`), `notifications/subscriptions/acknowledged` | [`Verdict::SealTasks`]: relayed with the run's own task ids sealed; a status of another run's task is [`Verdict::ForeignTask`] (dropped), a request of one refused, foreign ids left out of an acknowledgement |
//! | an answer too large to hold ([`streamed`]), asking for refused input, or input-required under an approval | cut off, not completed |
//! | anything else | relayed |
//!
//! Whatever the verdict, what is to leave then passes the gate
//! ([`crate::proxy::outbound::gate`]): screened whole, the run labelled by its
//! source, withheld or redacted.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::config::Upstream;
use crate::mcp::jsonrpc::{Kind, Message};
use crate::mcp::methods::{Class, ListKind, TaskMethod};
use crate::mcp::scan::Facts;
use crate::policy::{Access, Authority, Gate, Labels, Policy, Risk};
use crate::screen::content::{self, Actions, Report};
use crate::session::Principal;

use crate::tasks::{self, Tasks};
use crate::upstream::failure::UpstreamFailure;

/// What an answer is decided against: one policy snapshot, the run's
/// authority, the upstream, the era.
#[derive(Clone, Copy)]
pub(crate) struct Scope<'a> {
    /// The policy snapshot the request was decided with.
    pub policy: &'a Policy,
    /// The run's authority.
    pub authority: &'a Authority,
    /// The upstream that answers.
    pub upstream: &'a Upstream,
    /// A 2026-07-28 (stateless) exchange.
    pub stateless: bool,
    /// The tasks this replica saw created, and whose they are.
    pub tasks: &'a Tasks,
    /// Who the run is.
    pub principal: Principal<'a>,
}

impl Scope<'_> {
    /// Whether the upstream's task `id` is the run's own.
    fn owns_task(&self, id: &str) -> bool {
        self.tasks
            .tool_of(&self.upstream.name, id, &tasks::owner(&self.principal))
            .is_some()
    }
}

/// The request a response answers, as the exchange sent it.
#[derive(Clone, Copy)]
pub(crate) struct Answering<'a> {
    /// What its answer needs.
    pub class: &'a Class,
    /// The tool, for a `tools/call`.
    pub tool: Option<&'a str>,
    /// It runs under a person's approval.
    pub approved: bool,
}

/// What happens to one upstream message.
#[derive(Debug, PartialEq)]
pub(crate) enum Verdict {
    /// Relayed as it is.
    Relay,
    /// A response to no request this exchange sent: dropped.
    Unsolicited,
    /// A list answer: relayed as the run's view of it.
    Filter(ListKind),
    /// An input-required result (or task) asking the client for what the
    /// policy refuses (these methods): an error answer in its place.
    RefuseInputRequests(Vec<RefusedInput>),
    /// An input-required result of an approved call: relayed with the
    /// approval (and the upstream's own state, if any) sealed into
    /// `requestState`.
    SealState(Option<String>),
    /// A `tools/call` result that created a task.
    TaskCreated(NewTask),
    /// The answer to a `tasks/*` request of the run's own task.
    Task(TaskMethod),
    /// A server-to-client request the policy refuses (why).
    RefuseServerRequest(String),
    /// The upstream's tools changed.
    ListChanged,
    /// Progress of a request.
    Progress,
    /// Relayed with the run's own task ids (at these places) sealed.
    SealTasks(TaskIds),
    /// A notification about a task that is not the run's: dropped.
    ForeignTask,
}

/// Content for the client's model, screened.
#[derive(Debug, PartialEq)]
pub(crate) struct Content {
    /// What screening found.
    pub report: Report,
    /// The actions it was screened with.
    pub actions: Actions,
    /// The message with what is to be redacted redacted (its text), when
    /// the report's action is `redact`.
    pub redacted: Option<String>,
    /// The labels it gives the run.
    pub labels: Labels,
}

/// Where the task ids of a message are.
#[derive(Debug, PartialEq)]
pub(crate) enum TaskIds {
    /// `params.taskId` (a task status notification).
    Status,
    /// `params._meta["io.modelcontextprotocol/related-task"].taskId` (a
    /// request the upstream sends for a task).
    Related,
    /// `params.notifications.taskIds` of
    /// `notifications/subscriptions/acknowledged`: these (the run's own) are
    /// kept, sealed.
    Acknowledged(Vec<String>),
}

/// One refused input request of an input-required answer.
#[derive(Debug, PartialEq)]
pub(crate) struct RefusedInput {
    /// Its method.
    pub method: String,
    /// Why the policy refuses it.
    pub why: String,
}

/// A task a `tools/call` created, as the upstream named it.
#[derive(Debug, PartialEq)]
pub(crate) struct NewTask {
    /// The upstream's own task id.
    pub upstream_id: String,
    /// How long the upstream keeps it, when it says.
    pub ttl_ms: Option<u64>,
}

/// Decides one upstream message; `raw` is its text, `answering` the request
/// a response answers (`None`: the exchange sent none with its id).
///
/// # Errors
/// An answer the decision cannot read (an input-required result or task
/// whose members are not what MCP defines) is an upstream failure.
pub(crate) fn decide(
    s: Scope<'_>,
    m: &Message,
    raw: &str,
    answering: Option<Answering<'_>>,
) -> Result<Verdict, UpstreamFailure> {
    match m.kind {
        Kind::Response => {
            let Some(answering) = answering else {
                return Ok(Verdict::Unsolicited);
            };
            if m.is_error {
                // Screened by the gate like every message.
                return Ok(Verdict::Relay);
            }
            let result = result_text(m, raw);
            match *answering.class {
                Class::List(kind) => Ok(Verdict::Filter(kind)),
                Class::ToolCall => answer_result(s, result, answering.approved, true),
                Class::Prompt | Class::Resource => {
                    answer_result(s, result, answering.approved, false)
                }
                Class::Task(method) => task_answer(s, method, result),
                _ => Ok(Verdict::Relay),
            }
        }
        Kind::Request => {
            let params = m.params.as_deref().map(RawValue::get);
            if let Err(why) = server_request(s, m.method.as_deref().unwrap_or(""), params) {
                return Ok(Verdict::RefuseServerRequest(why));
            }
            // What the upstream asks the client's model or user is screened
            // by the gate.
            match related_task(params) {
                None => Ok(Verdict::Relay),
                Some(id) if s.owns_task(&id) => Ok(Verdict::SealTasks(TaskIds::Related)),
                Some(id) => Ok(Verdict::RefuseServerRequest(format!(
                    "it names task {id:?}, which is not this run's"
                ))),
            }
        }
        Kind::Notification => {
            let params = m.params.as_deref().map(RawValue::get);
            Ok(match m.method.as_deref() {
                Some("notifications/tools/list_changed") => Verdict::ListChanged,
                Some("notifications/progress") => Verdict::Progress,
                Some("notifications/tasks/status" | "notifications/tasks") => {
                    match status_task(params) {
                        Some(id) if s.owns_task(&id) => Verdict::SealTasks(TaskIds::Status),
                        _ => Verdict::ForeignTask,
                    }
                }
                Some("notifications/subscriptions/acknowledged") => match acknowledged(params) {
                    Some(ids) => Verdict::SealTasks(TaskIds::Acknowledged(
                        ids.into_iter().filter(|id| s.owns_task(id)).collect(),
                    )),
                    None => Verdict::Relay,
                },
                _ => Verdict::Relay,
            })
        }
    }
}

/// What screening finds in a listed definition (a tool's, by its name, or
/// a prompt's or resource's: its description, schema, annotations):
/// reported; with `block` for a kind found, the item is hidden from the
/// run.
pub(crate) fn listed_screen(s: Scope<'_>, tool: Option<&str>, definition: &Value) -> Report {
    let screening = s.policy.screening();
    let actions = screening.actions(&s.upstream.name, tool);
    content::screen_value(screening.scanner(), actions, definition)
}

/// The policy's word on a request the upstream sends the client, by the
/// method and params the strict reader decoded: `Err` names why not.
///
/// # Errors
/// Why the request is refused.
pub(crate) fn server_request(
    s: Scope<'_>,
    method: &str,
    params: Option<&str>,
) -> Result<(), String> {
    if s.stateless {
        return Err("2026-07-28 servers ask through input-required results only".to_owned());
    }
    s.policy.server_request(&s.upstream.name, method, params)
}

/// Whether (and with which risk and gate) the run sees a listed tool; the
/// relay has compared it with its pin (`pinned`) and checked its
/// `x-mcp-header` annotations (`valid_headers`).
pub(crate) fn tool_visible(
    s: Scope<'_>,
    name: &str,
    hints: Option<crate::policy::Hints>,
    pinned: bool,
    valid_headers: bool,
) -> Option<(Risk, Gate)> {
    // MCP clients must drop tools with invalid x-mcp-header annotations;
    // the firewall drops them first. A definition not (yet) reviewed never
    // reaches the model.
    if !pinned || !valid_headers {
        return None;
    }
    match s
        .policy
        .access(s.authority, s.upstream.facts(), name, hints)
    {
        Access::Visible { risk, gate, .. } => Some((risk, gate)),
        Access::Hidden(_) => None,
    }
}

/// Whether the run sees a listed prompt, resource or resource template
/// (`name` is its name, URI or URI template); `pinned` as for tools.
pub(crate) fn item_visible(s: Scope<'_>, kind: ListKind, name: &str, pinned: bool) -> bool {
    let allowed = match kind {
        ListKind::Prompts => s
            .policy
            .prompt_allowed(s.authority, s.upstream.facts(), name),
        ListKind::Tools => false,
        ListKind::Resources | ListKind::ResourceTemplates => {
            s.policy
                .resource_allowed(s.authority, s.upstream.facts(), name)
        }
    };
    allowed && pinned
}

/// An answer too large to hold, decided on what the streaming scan saw of
/// it ([`crate::mcp::scan`]) before its last bytes leave: `Err` names why
/// it is cut off instead of completed.
///
/// # Errors
/// Why the answer must not be completed.
pub(crate) fn streamed(
    s: Scope<'_>,
    f: &Facts,
    answering: Option<Answering<'_>>,
) -> Result<(), String> {
    let input_required = f.result_type.as_deref() == Some("input_required");
    // Too large to read the requests' params: an elicitation (whose URL mode
    // needs its target checked) is refused outright.
    let refused: Vec<&String> = f
        .input_methods
        .iter()
        .filter(|m| {
            *m == "elicitation/create"
                || s.policy.server_request(&s.upstream.name, m, None).is_err()
        })
        .collect();
    if input_required && !refused.is_empty() {
        return Err(format!(
            "the upstream asked the client for {refused:?}, which the policy refuses"
        ));
    }
    let Some(answering) = answering else {
        return Err("the answer answers a request this exchange did not send".to_owned());
    };
    if answering.approved && input_required {
        return Err("an input-required answer too large to bind to its approval".to_owned());
    }
    Ok(())
}

/// The members of an input-required result (or a 2026-07-28 task) the
/// decision reads, decoded.
#[derive(Deserialize)]
struct Required<'a> {
    #[serde(borrow, rename = "resultType")]
    result_type: Option<Cow<'a, str>>,
    #[serde(borrow, rename = "inputRequests")]
    input_requests: Option<BTreeMap<String, InputRequest<'a>>>,
    #[serde(rename = "requestState")]
    request_state: Option<String>,
    /// A 2025-11-25 created task (`result.task`), read only for whether it
    /// is there.
    task: Option<serde::de::IgnoredAny>,
}

impl<'a> Required<'a> {
    /// The members of `result`, read once.
    fn read(result: &'a str) -> Result<Required<'a>, UpstreamFailure> {
        serde_json::from_str::<Required>(result)
            .map_err(|e| UpstreamFailure::Invalid(format!("unreadable input-required result: {e}")))
    }
}

/// A result that may be input-required ([`required_verdict`]), a created
/// task (a `tools/call` result, `tasks`: [`created_task`]) or a result to
/// relay, told apart in one read of its members.
fn answer_result(
    s: Scope<'_>,
    result: Option<&str>,
    approved: bool,
    tasks: bool,
) -> Result<Verdict, UpstreamFailure> {
    let Some(result) = result else {
        return Ok(Verdict::Relay);
    };
    let parsed = Required::read(result)?;
    let task = tasks && (parsed.task.is_some() || parsed.result_type.as_deref() == Some("task"));
    if parsed.result_type.as_deref() == Some("input_required") {
        match required_verdict(s, parsed, approved) {
            Verdict::Relay => {}
            other => return Ok(other),
        }
    }
    Ok(if task {
        created_task(result).map_or(Verdict::Relay, Verdict::TaskCreated)
    } else {
        Verdict::Relay
    })
}

#[derive(Deserialize)]
struct InputRequest<'a> {
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    params: Option<&'a RawValue>,
}

/// What a 2026-07-28 input-required result gets: refused when it asks for what the
/// policy refuses; for an approved call, its state is sealed.
fn required_verdict(s: Scope<'_>, parsed: Required<'_>, approved: bool) -> Verdict {
    let refused = refused_inputs(s, parsed.input_requests.as_ref());
    if !refused.is_empty() {
        return Verdict::RefuseInputRequests(refused);
    }
    if approved {
        Verdict::SealState(parsed.request_state)
    } else {
        Verdict::Relay
    }
}

/// The input requests the policy refuses.
fn refused_inputs(
    s: Scope<'_>,
    requests: Option<&BTreeMap<String, InputRequest<'_>>>,
) -> Vec<RefusedInput> {
    requests
        .into_iter()
        .flatten()
        .filter_map(|(_, r)| {
            s.policy
                .server_request(&s.upstream.name, &r.method, r.params.map(RawValue::get))
                .err()
                .map(|why| RefusedInput {
                    method: r.method.clone().into_owned(),
                    why,
                })
        })
        .collect()
}

/// The answer to `tasks/*`: a task's input requests are policed like an
/// input-required result's.
fn task_answer(
    s: Scope<'_>,
    method: TaskMethod,
    result: Option<&str>,
) -> Result<Verdict, UpstreamFailure> {
    if matches!(
        method,
        TaskMethod::Get | TaskMethod::Cancel | TaskMethod::Update
    ) {
        if let Some(result) = result {
            let parsed = serde_json::from_str::<Required>(result)
                .map_err(|e| UpstreamFailure::Invalid(format!("unreadable task: {e}")))?;
            let refused = refused_inputs(s, parsed.input_requests.as_ref());
            if !refused.is_empty() {
                return Ok(Verdict::RefuseInputRequests(refused));
            }
        }
    }
    Ok(Verdict::Task(method))
}

/// `params.taskId` of a task status notification, decoded.
fn status_task(params: Option<&str>) -> Option<String> {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(borrow, rename = "taskId")]
        task_id: Cow<'a, str>,
    }
    Some(
        serde_json::from_str::<Params>(params?)
            .ok()?
            .task_id
            .into_owned(),
    )
}

/// `params._meta["io.modelcontextprotocol/related-task"].taskId`, decoded.
fn related_task(params: Option<&str>) -> Option<String> {
    #[derive(Deserialize)]
    struct Params<'a> {
        #[serde(borrow, rename = "_meta")]
        meta: Option<Meta<'a>>,
    }
    #[derive(Deserialize)]
    struct Meta<'a> {
        #[serde(borrow, rename = "io.modelcontextprotocol/related-task")]
        related: Option<Related<'a>>,
    }
    #[derive(Deserialize)]
    struct Related<'a> {
        #[serde(borrow, rename = "taskId")]
        task_id: Cow<'a, str>,
    }
    let p = serde_json::from_str::<Params>(params?).ok()?;
    Some(p.meta?.related?.task_id.into_owned())
}

/// `params.notifications.taskIds` of an acknowledgement, decoded.
fn acknowledged(params: Option<&str>) -> Option<Vec<String>> {
    #[derive(Deserialize)]
    struct Params {
        notifications: Option<Notifications>,
    }
    #[derive(Deserialize)]
    struct Notifications {
        #[serde(rename = "taskIds")]
        task_ids: Option<Vec<String>>,
    }
    serde_json::from_str::<Params>(params?)
        .ok()?
        .notifications?
        .task_ids
}

/// The task a `tools/call` result created, if it is one (2025-11-25:
/// `result.task`; 2026-07-28: `resultType: "task"`).
fn created_task(result: &str) -> Option<NewTask> {
    // Only a result whose members say task ([`answer_result`]) is read whole.
    let v = serde_json::from_str::<Value>(result).ok()?;
    let (upstream_id, ttl_ms) = crate::tasks::created(&v)?;
    Some(NewTask {
        upstream_id,
        ttl_ms,
    })
}

/// The raw `result` of a response.
pub(crate) fn result_text<'r>(m: &Message, raw: &'r str) -> Option<&'r str> {
    let r = m.result.as_ref()?;
    raw.get(r.start.checked_sub(m.span.start)?..r.end.checked_sub(m.span.start)?)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::mcp::jsonrpc;

    const POLICY: &str = r#"
[server_requests]
sampling = false
elicitation = false
roots = false
[server_requests.upstreams.up]
sampling = true
"#;

    fn upstream() -> std::sync::Arc<Upstream> {
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
name = "up"
url = "http://x/mcp"
projects = ["sre"]
"#;
        let cfg = crate::config::load_str(
            text,
            std::path::Path::new("t.toml"),
            std::path::Path::new("."),
            &|_| None,
        )
        .unwrap();
        cfg.upstreams[0].clone()
    }

    const PRINCIPAL: Principal<'static> = Principal {
        issuer: "https://idp.test",
        tenant: "acme",
        subject: "user:olga",
        upstream: "up",
        run: "run-1",
    };

    /// A registry where task `mine` is the run's own and `theirs` another
    /// run's of the same subject.
    fn own_task() -> Tasks {
        let tasks = Tasks::default();
        let budgets = crate::budget::Budgets::new(crate::budget::LimitsConfig::default());
        let ttl = std::time::Duration::from_secs(60);
        let theirs = Principal {
            run: "run-2",
            ..PRINCIPAL
        };
        for (id, who) in [("mine", PRINCIPAL), ("theirs", theirs)] {
            tasks.created(
                &budgets,
                ("up".into(), id.into()),
                tasks::owner(&who),
                "t".into(),
                None,
                ttl,
            );
        }
        tasks
    }

    #[test]
    fn task_ids_in_notifications_and_requests_are_the_run_own_or_go() {
        let status = |id: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","method":"notifications/tasks","params":{{"taskId":"{id}","status":"working"}}}}"#
            )
        };
        let c = Class::Pass;
        assert_eq!(
            verdict(true, &status("mine"), &c, false),
            Verdict::SealTasks(TaskIds::Status)
        );
        assert_eq!(
            verdict(true, &status("theirs"), &c, false),
            Verdict::ForeignTask
        );
        assert_eq!(
            verdict(true, &status(r"m\u0069ne"), &c, false),
            Verdict::SealTasks(TaskIds::Status)
        );
        let ack = r#"{"jsonrpc":"2.0","method":"notifications/subscriptions/acknowledged","params":{"notifications":{"taskIds":["mine","theirs","nobody"]}}}"#;
        assert_eq!(
            verdict(true, ack, &c, false),
            Verdict::SealTasks(TaskIds::Acknowledged(vec!["mine".into()]))
        );
        let related = |id: &str| {
            format!(
                r#"{{"jsonrpc":"2.0","id":3,"method":"sampling/createMessage","params":{{"_meta":{{"io.modelcontextprotocol/related-task":{{"taskId":"{id}"}}}}}}}}"#
            )
        };
        assert_eq!(
            verdict(false, &related("mine"), &c, false),
            Verdict::SealTasks(TaskIds::Related)
        );
        assert!(matches!(
            verdict(false, &related("theirs"), &c, false),
            Verdict::RefuseServerRequest(why) if why.contains("not this run's")
        ));
    }

    fn authority() -> Authority {
        Authority {
            agent: "a".into(),
            projects: vec!["sre".into()],
        }
    }

    fn verdict(stateless: bool, text: &str, class: &Class, approved: bool) -> Verdict {
        decided(
            stateless,
            text,
            Some(Answering {
                class,
                tool: None,
                approved,
            }),
        )
    }

    /// The decision on `text`'s first message, answering as `answering`.
    fn decided(stateless: bool, text: &str, answering: Option<Answering<'_>>) -> Verdict {
        let policy =
            crate::policy::compile::compile(&[(PathBuf::from("p.toml"), POLICY.into())]).unwrap();
        let authority = authority();
        let up = upstream();
        let tasks = own_task();
        let s = Scope {
            policy: &policy,
            authority: &authority,
            upstream: &up,
            stateless,
            tasks: &tasks,
            principal: PRINCIPAL,
        };
        let env = jsonrpc::parse_upstream(text.as_bytes()).unwrap();
        let m = &env.messages[0];
        let raw = &text[m.span.clone()];
        decide(s, m, raw, answering).unwrap()
    }

    #[test]
    fn an_escaped_result_type_is_the_same_decision_as_the_plain_one() {
        for spelling in [
            "input_required",
            "input\\u005frequired",
            "\\u0069nput_required",
        ] {
            let text = format!(
                r#"{{"jsonrpc":"2.0","id":1,"result":{{"resultType":"{spelling}","inputRequests":{{"a":{{"method":"roots/list"}}}}}}}}"#
            );
            match verdict(true, &text, &Class::ToolCall, false) {
                Verdict::RefuseInputRequests(r) => {
                    assert_eq!(r.len(), 1, "{spelling}");
                    assert_eq!(r[0].method, "roots/list");
                    assert!(r[0].why.contains("[server_requests]"), "{}", r[0].why);
                }
                other => panic!("{spelling}: {other:?}"),
            }
        }
    }

    #[test]
    fn an_escaped_method_in_an_input_request_is_decoded() {
        let text = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"a":{"method":"roots\/list"},"b":{"method":"sampling\u002fcreateMessage"}}}}"#;
        match verdict(true, text, &Class::Prompt, false) {
            Verdict::RefuseInputRequests(r) => {
                let methods: Vec<&str> = r.iter().map(|r| r.method.as_str()).collect();
                assert_eq!(methods, ["roots/list"]);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_allowed_input_request_of_an_approved_call_seals_its_state() {
        let text = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"input_required","inputRequests":{"a":{"method":"sampling/createMessage","params":{}}},"requestState":"upstream-state"}}"#;
        assert_eq!(
            verdict(true, text, &Class::ToolCall, true),
            Verdict::SealState(Some("upstream-state".into()))
        );
        assert_eq!(verdict(true, text, &Class::ToolCall, false), Verdict::Relay);
    }

    #[test]
    fn a_result_that_is_neither_input_required_nor_a_task_is_relayed() {
        let text = r#"{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"resultType input_required"}]}}"#;
        assert_eq!(verdict(true, text, &Class::ToolCall, true), Verdict::Relay);
    }

    #[test]
    fn a_task_is_recognized_in_both_eras() {
        let old = r#"{"jsonrpc":"2.0","id":1,"result":{"task":{"taskId":"t-1","status":"working","ttl":5000}}}"#;
        assert_eq!(
            verdict(false, old, &Class::ToolCall, false),
            Verdict::TaskCreated(NewTask {
                upstream_id: "t-1".into(),
                ttl_ms: Some(5000)
            })
        );
        let new = r#"{"jsonrpc":"2.0","id":1,"result":{"resultType":"t\u0061sk","taskId":"t-2","status":"working"}}"#;
        assert_eq!(
            verdict(true, new, &Class::ToolCall, false),
            Verdict::TaskCreated(NewTask {
                upstream_id: "t-2".into(),
                ttl_ms: None
            })
        );
    }

    #[test]
    fn a_task_asking_for_refused_input_is_refused() {
        let text = r#"{"jsonrpc":"2.0","id":1,"result":{"taskId":"t","status":"input_required","inputRequests":{"x":{"method":"elicitation/create","params":{"mode":"form"}}}}}"#;
        match verdict(true, text, &Class::Task(TaskMethod::Get), false) {
            Verdict::RefuseInputRequests(r) => assert_eq!(r[0].method, "elicitation/create"),
            other => panic!("{other:?}"),
        }
        let ok = r#"{"jsonrpc":"2.0","id":1,"result":{"taskId":"t","status":"working"}}"#;
        assert_eq!(
            verdict(true, ok, &Class::Task(TaskMethod::Get), false),
            Verdict::Task(TaskMethod::Get)
        );
    }

    #[test]
    fn server_requests_follow_the_policy_and_the_era() {
        let sampling = r#"{"jsonrpc":"2.0","id":7,"method":"sampling/createMessage","params":{}}"#;
        let roots = r#"{"jsonrpc":"2.0","id":8,"method":"roots/list"}"#;
        let c = Class::Pass;
        assert_eq!(verdict(false, sampling, &c, false), Verdict::Relay);
        assert!(matches!(
            verdict(false, roots, &c, false),
            Verdict::RefuseServerRequest(why) if why.contains("roots/list")
        ));
        assert!(matches!(
            verdict(true, sampling, &c, false),
            Verdict::RefuseServerRequest(why) if why.contains("input-required")
        ));
    }

    #[test]
    fn an_error_answer_is_relayed_and_an_unknown_id_dropped() {
        let text = r#"{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"no"}}"#;
        assert_eq!(
            verdict(true, text, &Class::List(ListKind::Tools), false),
            Verdict::Relay
        );
        assert_eq!(decided(false, text, None), Verdict::Unsolicited);
    }
}
