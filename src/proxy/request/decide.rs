//! The decision step: what happens to each client-to-server message, decided
//! on the parsed body against one policy snapshot. Nothing here does I/O:
//! a `tools/call` the policy lets through leaves as a [`Ruling::Admit`],
//! and the admission step ([`super::admit`]) asks the approval and budget
//! stores.
//!
//! | message | verdict |
//! |---|---|
//! | a method the revision does not define (and the upstream's config does not add) | `-32601`, never forwarded |
//! | `tools/call` of a tool hidden from the run, or not in the upstream's catalog | `-32602 Unknown tool` (identical either way) |
//! | `tools/call` with a number the firewall cannot hold exactly, or arguments failing the tool's input schema | a tool result with `isError` (SEP-1303) |
//! | `tools/call` whose condition fails | `-31001` denied, with the reason |
//! | `tools/call` behind an `approve` gate | held for a person, or `-31002` with the approval to follow |
//! | `tools/call` past a rate limit | `-31003`; past a step or cost cap: a *skipped* tool result |
//! | `prompts/get`, `resources/read|subscribe|unsubscribe`, `completion/complete` outside the run's rules | `-32602` unknown prompt / resource not found |
//! | `tasks/*`, `subscriptions/listen` naming a task that is not the run's own (forged, another principal's or run's, its tool no longer the run's) | `-32602` task not found, never forwarded |
//! | `notifications/cancelled` of a held call | the hold ends, its approval is withdrawn, nothing is forwarded |
//! | everything else on a reachable upstream | forwarded |

use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::approval::{args_sha256, CallKey};
use crate::budget::CallBudget;
use crate::mcp::headers;
use crate::mcp::jsonrpc::{self, Id, Kind, Message};
use crate::mcp::methods::{self, Class, Shape};
use crate::policy::{self, Decision, Gate, Hidden, Identity, Risk};

use super::super::decision::{
    Admission, Around, Forwarding, NotPermitted, Outcome, Ruling, RunContext, TaintCheck, Verdict,
};
use super::super::held_calls::HoldKey;
use crate::session::{Principal, STATE_PREFIX};
use crate::verdict::identity;

impl RunContext {
    /// The policy's view of the token.
    pub(crate) fn identity(&self) -> Identity<'_> {
        identity(&self.claims, self.service_issuer)
    }

    /// What this run's requests reach the upstream with
    /// ([`UpstreamClient::credential`](crate::upstream::client::UpstreamClient::credential)).
    ///
    /// # Errors
    /// No credential could be had.
    pub(crate) async fn credential(
        &self,
    ) -> Result<crate::credential::Credential, crate::credential::CredentialError> {
        if let crate::config::UpstreamAuth::User(_) = &self.upstream.config.auth {
            // The user's own token: the run's verified principal is all it
            // takes (its token is not sent anywhere).
            return self.upstream.user_credential(&self.claims).await;
        }
        let subject = self
            .subject_token
            .as_deref()
            .map(|token| crate::credential::RunSubject {
                token,
                claims: &self.claims,
            });
        if self.upstream.credentials.is_some() && subject.is_none() {
            // Never the firewall's own token for a run's request.
            return Err(crate::credential::CredentialError::NoRunToken);
        }
        self.upstream.credential(subject).await
    }

    /// Who the run's sessions, event ids and request states belong to.
    pub(crate) fn principal(&self) -> Principal<'_> {
        Principal {
            issuer: &self.claims.iss,
            tenant: &self.claims.tenant_id,
            subject: &self.claims.sub,
            upstream: &self.upstream.config.name,
            run: &self.claims.run_id,
        }
    }

    /// What a remembered view of a list depends on besides the upstream's
    /// bytes and the authority: the policy and the pins in force.
    pub(crate) fn view_generation(&self) -> u64 {
        self.policy.generation() ^ self.pins.generation().rotate_left(32)
    }

    /// What a `tools/call` of this run is judged with ([`crate::verdict::call`]).
    pub(crate) fn judge<'a>(
        &'a self,
        identity: &'a Identity<'a>,
    ) -> crate::verdict::call::Judge<'a> {
        crate::verdict::call::Judge {
            policy: &self.policy,
            identity,
            authority: &self.authority,
            upstream: &self.upstream.config,
            pins: &self.pins,
        }
    }

    /// What the shadow policy would decide about a `tools/call` the live
    /// one ruled `ruling` on, when the two differ: counted
    /// (`shadow_differences`) and returned for the audit row's
    /// `shadow_decision`. The live answer is not touched.
    pub(crate) fn shadow(&self, msg: &Message, ruling: &Ruling) -> Option<&'static str> {
        use crate::verdict::call::Kind;
        let shadow = self.shadow.as_deref()?;
        let call = msg.call.as_ref()?;
        let live = match ruling {
            Ruling::Admit(a) if a.gate.is_some() || a.granted.is_some() => Kind::Approve,
            Ruling::Admit(_) => Kind::Allow,
            Ruling::Final(Verdict::Answer(o)) => match o {
                Outcome::UnknownTool(_) | Outcome::PinRefused(_) => Kind::Hidden,
                Outcome::Denied { .. } => Kind::Deny,
                Outcome::InvalidArguments(_) => Kind::Invalid,
                // Not the policy's decision (headers, a request state).
                _ => return None,
            },
            Ruling::Final(_) => return None,
        };
        let identity = self.identity();
        let got = match (
            self.catalogs.get(&self.upstream.config.name, &call.name),
            shadow.authority(&identity),
        ) {
            (Some(entry), Ok(authority)) => {
                let arguments: Value = match &call.arguments {
                    Some(raw) => serde_json::from_str(raw.get()).unwrap_or(Value::Null),
                    None => Value::Object(Default::default()),
                };
                let judge = crate::verdict::call::Judge {
                    policy: shadow,
                    identity: &identity,
                    authority: &authority,
                    upstream: &self.upstream.config,
                    pins: &self.pins,
                };
                judge.kind(
                    &call.name,
                    &entry,
                    call.arguments.as_deref().map(RawValue::get),
                    &arguments,
                )
            }
            _ => Kind::Hidden,
        };
        if got == live {
            return None;
        }
        self.metrics
            .shadow_difference(&self.upstream.config.name, live.as_str(), got.as_str());
        Some(got.as_str())
    }

    /// Decides one message.
    pub(crate) fn decide(&self, msg: &Message, around: &Around<'_>) -> Ruling {
        let name = match (msg.kind, msg.method.as_deref()) {
            // Answers to server-to-client requests (session revisions only:
            // 2026-07-28 bodies with responses are refused before this).
            (Kind::Response, _) | (_, None) => return forward(None).into(),
            (_, Some(name)) => name,
        };
        let shape = match msg.kind {
            Kind::Request => Shape::Request,
            _ => Shape::Notification,
        };
        let class = match methods::lookup(name, self.version) {
            Some(m) if m.shape == shape => m.class,
            // A notification-only method sent with an id names no request.
            Some(_) => return Outcome::UnknownMethod.into(),
            None => return self.decide_extra(name, shape).into(),
        };
        let verdict = match class {
            Class::ToolCall => return self.decide_call(msg, around),
            Class::Prompt => {
                let name = msg.name.as_deref().unwrap_or("");
                match self.prompt_pinned(name) {
                    Err(r) => Verdict::Answer(Outcome::PromptPinRefused(name.to_owned(), r)),
                    Ok(pin) => pinned(
                        self.permit(self.prompt_allowed(name), || {
                            NotPermitted::Prompt(name.to_owned())
                        }),
                        pin,
                    ),
                }
            }
            Class::Resource => {
                let uri = msg.name.as_deref().unwrap_or("");
                match self.resource_access(uri) {
                    Ok(allowed) => self.permit(allowed, || NotPermitted::Resource(uri.to_owned())),
                    Err(why) => Verdict::Answer(Outcome::AmbiguousUri {
                        uri: uri.to_owned(),
                        why,
                    }),
                }
            }
            Class::Completion => match completion_ref(msg) {
                Some(CompletionRef::Prompt(name)) => match self.prompt_pinned(&name) {
                    Err(r) => Verdict::Answer(Outcome::PromptPinRefused(name, r)),
                    Ok(pin) => pinned(
                        self.permit(self.prompt_allowed(&name), || {
                            NotPermitted::Prompt(name.clone())
                        }),
                        pin,
                    ),
                },
                Some(CompletionRef::Resource(uri)) => match self.resource_access(&uri) {
                    Ok(allowed) => self.permit(allowed, || NotPermitted::Resource(uri.clone())),
                    Err(why) => Verdict::Answer(Outcome::AmbiguousUri { uri, why }),
                },
                // Without a readable reference the upstream answers it.
                None => forward(None),
            },
            Class::Cancel => self.decide_cancel(msg, around),
            Class::Task(method) => self.decide_task(msg, around, method),
            Class::Listen => self.decide_listen(msg, around),
            Class::List(_) | Class::Pass => forward(None),
        };
        verdict.into()
    }

    /// Whether the prompt, as last listed, is pinned (in the upstream's
    /// mode), and the pin it matched.
    fn prompt_pinned(&self, name: &str) -> Result<Option<[u8; 32]>, crate::pins::Refusal> {
        let up = &self.upstream.config;
        self.pins
            .check_listed(up.pinning, &up.name, crate::pins::Subject::Prompt, name)
    }

    fn prompt_allowed(&self, name: &str) -> bool {
        self.policy
            .prompt_allowed(&self.authority, self.upstream.config.facts(), name)
    }

    fn resource_access(&self, uri: &str) -> Result<bool, crate::policy::uri::UriError> {
        self.policy
            .resource_access(&self.authority, self.upstream.config.facts(), uri)
    }

    fn permit(&self, allowed: bool, what: impl FnOnce() -> NotPermitted) -> Verdict {
        if allowed {
            forward(None)
        } else {
            Verdict::Answer(Outcome::NotPermitted(what()))
        }
    }

    /// A method the upstream's config adds to MCP, decided by the gate of
    /// its configured risk; any other unknown method is refused.
    fn decide_extra(&self, name: &str, shape: Shape) -> Verdict {
        let up = &self.upstream.config;
        let Some(extra) = up
            .extra_methods
            .iter()
            .find(|m| m.name == name && m.shape == shape)
        else {
            return Verdict::Answer(Outcome::UnknownMethod);
        };
        let risk = extra.risk;
        match self.policy.method_gate(&self.authority, up.facts(), risk) {
            None => Verdict::Answer(Outcome::UnknownMethod),
            Some(Gate::Allow) => forward(Some(risk)),
            Some(Gate::Deny) => Verdict::Answer(Outcome::Denied {
                risk,
                reason: format!("{risk} methods are denied for this role"),
                rule: format!("upstream {}: extra_methods {name}", up.name),
            }),
            Some(Gate::Approve) => Verdict::Answer(Outcome::ApprovalUnavailable {
                risk,
                why: "approvals are given for tool calls only; this method's risk needs one"
                    .to_owned(),
            }),
        }
    }

    /// `notifications/cancelled` for a call this caller has held for
    /// approval ends the hold (which withdraws the approval); any other is
    /// the upstream's business.
    fn decide_cancel(&self, msg: &Message, around: &Around<'_>) -> Verdict {
        #[derive(Deserialize)]
        struct Params<'a> {
            #[serde(borrow, rename = "requestId")]
            request_id: Option<&'a RawValue>,
        }
        let id = msg
            .params
            .as_deref()
            .and_then(|p| serde_json::from_str::<Params>(p.get()).ok())
            .and_then(|p| p.request_id)
            .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok())
            .and_then(|v| match v {
                Value::Number(n) => n.as_i64().map(Id::Number),
                Value::String(s) => Some(Id::String(s)),
                _ => None,
            });
        let Some(id) = id else {
            return forward(None);
        };
        let key = HoldKey::new(&self.principal(), around.session, &id);
        match around.holds.cancel(&key) {
            Some(approval) => Verdict::Answer(Outcome::Cancelled {
                approval: Some(approval),
            }),
            None => forward(None),
        }
    }

    /// `tasks/*`: a task is reachable only by the principal and run that
    /// created it, through the sealed id the firewall handed out, and only
    /// while the run may still use the tool whose call created it; anything
    /// else is a task that does not exist. The upstream gets its own id.
    fn decide_task(
        &self,
        msg: &Message,
        around: &Around<'_>,
        method: crate::mcp::methods::TaskMethod,
    ) -> Verdict {
        #[derive(Deserialize)]
        struct Params<'a> {
            #[serde(borrow, rename = "taskId")]
            task_id: Option<std::borrow::Cow<'a, str>>,
        }
        if method == crate::mcp::methods::TaskMethod::List {
            // The answer keeps only the run's own tasks.
            return forward(None);
        }
        let sealed = msg
            .params
            .as_deref()
            .and_then(|p| serde_json::from_str::<Params>(p.get()).ok())
            .and_then(|p| p.task_id);
        let Some(task) = sealed.and_then(|s| self.own_task(&s)) else {
            return Verdict::Answer(Outcome::UnknownTask);
        };
        let text = around.body.get(msg.span.clone()).unwrap_or("");
        let id = Value::String(task.upstream_id.clone()).to_string();
        let Some(rewrite) = jsonrpc::with_param(text, "taskId", Some(&id)) else {
            return Verdict::Answer(Outcome::UnknownTask);
        };
        Verdict::Forward(Forwarding {
            rewrite: Some(rewrite),
            task: Some(task),
            ..Forwarding::default()
        })
    }

    /// The run's own task by the sealed id the firewall handed out, while
    /// the run may still use the tool whose call created it.
    fn own_task(&self, sealed: &str) -> Option<crate::tasks::TaskRef> {
        let task = crate::tasks::open(&self.sessions, &self.principal(), sealed)?;
        let hints = self
            .catalogs
            .get(&self.upstream.config.name, &task.tool)
            .and_then(|e| e.hints);
        match self.policy.access(
            &self.authority,
            self.upstream.config.facts(),
            &task.tool,
            hints,
        ) {
            policy::Access::Hidden(_) => None,
            policy::Access::Visible { .. } => Some(task),
        }
    }

    /// `subscriptions/listen` naming tasks (`notifications.taskIds`): each
    /// must be the run's own ([`Self::own_task`]), or the whole request is
    /// refused as naming a task that does not exist; the upstream gets its
    /// own ids.
    fn decide_listen(&self, msg: &Message, around: &Around<'_>) -> Verdict {
        #[derive(Deserialize)]
        struct Params<'a> {
            #[serde(borrow)]
            notifications: Option<&'a RawValue>,
        }
        let notifications = msg
            .params
            .as_deref()
            .and_then(|p| serde_json::from_str::<Params>(p.get()).ok())
            .and_then(|p| p.notifications);
        let Some(mut v) = notifications.and_then(|n| serde_json::from_str::<Value>(n.get()).ok())
        else {
            return forward(None);
        };
        let Some(ids) = v.get_mut("taskIds") else {
            return forward(None);
        };
        let Some(ids) = ids.as_array_mut() else {
            return Verdict::Answer(Outcome::UnknownTask);
        };
        for id in ids.iter_mut() {
            let Some(task) = id.as_str().and_then(|s| self.own_task(s)) else {
                return Verdict::Answer(Outcome::UnknownTask);
            };
            *id = Value::String(task.upstream_id);
        }
        let text = around.body.get(msg.span.clone()).unwrap_or("");
        let Some(rewrite) = jsonrpc::with_param(text, "notifications", Some(&v.to_string())) else {
            return Verdict::Answer(Outcome::UnknownTask);
        };
        Verdict::Forward(Forwarding {
            rewrite: Some(rewrite),
            ..Forwarding::default()
        })
    }

    fn decide_call(&self, msg: &Message, around: &Around<'_>) -> Ruling {
        let unknown = |hidden: Option<Hidden>| Outcome::UnknownTool(hidden).into();
        let Some(call) = &msg.call else {
            return unknown(None);
        };
        let tool = call.name.as_str();
        // A tool the upstream never listed does not exist, whatever the
        // policy would say about its name.
        let Some(entry) = self.catalogs.get(&self.upstream.config.name, tool) else {
            return unknown(None);
        };
        let arguments: Value = match &call.arguments {
            Some(raw) => serde_json::from_str(raw.get()).unwrap_or(Value::Null),
            None => Value::Object(Default::default()),
        };
        let identity = self.identity();
        let judge = self.judge(&identity);
        let (decision, pin) = match judge.decide(tool, &entry, &arguments) {
            Ok(d) => d,
            Err(o) => return o.into(),
        };
        // Only now, for a tool the run may see: a hidden tool answers
        // exactly like an invented one, whatever its schema annotates.
        if let Err(e) = headers::check(around.headers, msg, Some(entry.param_headers())) {
            return Outcome::HeaderMismatch(e).into();
        }
        let risk = match decision {
            Decision::Deny { risk, reason, rule } => {
                return Outcome::Denied { risk, reason, rule }.into()
            }
            Decision::Approve { risk } | Decision::Allow { risk } => risk,
            Decision::Unknown(h) => return unknown(Some(h)),
        };
        if let Err(o) = crate::verdict::call::check_arguments(
            call.arguments.as_deref().map(RawValue::get),
            &entry,
            &arguments,
        ) {
            return o.into();
        }
        // The arguments' hash keys an approval and a run's label check; a
        // read that needs neither never computes it (canonical JSON and
        // SHA-256 were a tenth of an allowed call's instructions).
        // A multi-round retry carrying a request state the firewall sealed:
        // it runs under the approval it was sealed for, and the upstream
        // gets its own state back.
        let mut granted = None;
        let mut rewrite = None;
        if let Some(state) = msg
            .request_state
            .as_deref()
            .filter(|s| s.starts_with(STATE_PREFIX))
        {
            match self.open_granted(state, tool, &args_sha256(&arguments)) {
                Ok((g, original)) => {
                    let original = original.map(|o| Value::String(o).to_string());
                    let text = around.body.get(msg.span.clone()).unwrap_or("");
                    rewrite = jsonrpc::with_param(text, "requestState", original.as_deref());
                    if rewrite.is_none() {
                        return Outcome::BadRequestState(
                            "requestState could not be restored for the upstream".to_owned(),
                        )
                        .into();
                    }
                    granted = Some(Arc::new(g));
                }
                Err(why) => return Outcome::BadRequestState(why).into(),
            }
        }
        let gated = matches!(decision, Decision::Approve { .. }) && granted.is_none();
        // The run's labels may gate it (read in admission: they live in
        // the budget store).
        let traits = self.policy.traits(self.upstream.config.facts(), tool);
        let taint = self
            .policy
            .taint()
            .applies(risk, traits.egress)
            .then(|| TaintCheck {
                egress: traits.egress,
                arguments: (!gated && granted.is_none())
                    .then(|| (arguments.clone(), args_sha256(&arguments))),
            });
        Ruling::Admit(Box::new(Admission {
            tool: tool.to_owned(),
            risk,
            gate: gated.then(|| {
                let hash = args_sha256(&arguments);
                (arguments, hash)
            }),
            granted,
            rewrite,
            taint,
            pin,
        }))
    }

    /// The budget a `tools/call` of `tool` asks for.
    pub(crate) fn call_budget<'a>(&'a self, tool: &'a str) -> CallBudget<'a> {
        let role = self.policy.agent(&self.authority.agent);
        CallBudget {
            tenant: &self.claims.tenant_id,
            run: &self.claims.run_id,
            upstream: &self.upstream.config.name,
            tool,
            run_exp: self.claims.run_exp,
            price: self.policy.price(self.upstream.config.facts(), tool),
            max_steps: role
                .and_then(|a| a.max_steps)
                .unwrap_or(self.budgets.config().default_max_steps),
            max_cost: role
                .and_then(|a| a.max_cost)
                .or(self.budgets.config().default_max_cost),
            run_per_s: role.and_then(|a| a.calls_per_s),
            upstream_per_s: self.upstream.config.max_calls_per_s,
        }
    }

    /// The call key of a gated call of this run.
    pub(crate) fn call_key(&self, tool: &str, args_sha256: [u8; 32]) -> CallKey {
        CallKey {
            tenant: self.claims.tenant_id.to_string(),
            run_id: self.claims.run_id.clone(),
            subject: self.claims.sub.to_string(),
            upstream: self.upstream.config.name.clone(),
            tool: tool.to_owned(),
            args_sha256,
        }
    }
}

fn forward(risk: Option<Risk>) -> Verdict {
    Verdict::Forward(Forwarding {
        risk,
        ..Forwarding::default()
    })
}

/// `verdict`, with the pin the message's subject matched when it is
/// forwarded.
fn pinned(verdict: Verdict, pin: Option<[u8; 32]>) -> Verdict {
    match verdict {
        Verdict::Forward(f) => Verdict::Forward(Forwarding { pin, ..f }),
        other => other,
    }
}

/// What `completion/complete` completes.
enum CompletionRef {
    Prompt(String),
    Resource(String),
}

fn completion_ref(msg: &Message) -> Option<CompletionRef> {
    #[derive(Deserialize)]
    struct Params {
        #[serde(rename = "ref")]
        reference: Ref,
    }
    #[derive(Deserialize)]
    struct Ref {
        #[serde(rename = "type")]
        kind: String,
        name: Option<String>,
        uri: Option<String>,
    }
    let p: Params = serde_json::from_str(msg.params.as_deref()?.get()).ok()?;
    match (p.reference.kind.as_str(), p.reference.name, p.reference.uri) {
        ("ref/prompt", Some(name), _) => Some(CompletionRef::Prompt(name)),
        ("ref/resource", _, Some(uri)) => Some(CompletionRef::Resource(uri)),
        _ => None,
    }
}
