//! `mcp-firewall test`: policy tests as code. Each `[[case]]` of a TOML
//! file names a principal (claims), an upstream and either a call with the
//! verdict it must get (`allow`, `approve`, `deny`; `hidden` and `invalid`
//! are stricter kinds of `deny`) or a list with the tools it must hide or
//! show. Verdicts are made by the code `serve` makes them with
//! ([`crate::verdict::call`] for calls, [`crate::verdict::answer`] for
//! lists); each tool's definition comes from the pins file when there is
//! one, else from the case's `tool = { annotations, inputSchema }`, else it
//! is an empty one. Output reads like `cargo test`; `--junit` writes JUnit
//! XML and `--coverage` names the rules, roles and gates no case exercised.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::Value;

use crate::auth;
use crate::catalog::ToolEntry;
use crate::config::{Config, Upstream};
use crate::pins::{PinStore, Subject};
use crate::policy::{self, Labels, Policy, RuleId};
use crate::verdict::call::{Judge, Kind, Verdict};

/// What `mcp-firewall test` runs.
pub struct TestArgs {
    /// The policy directory to test; default the config's.
    pub policy_dir: Option<PathBuf>,
    /// Test files or directories; default `<policy dir>/tests/*.toml`.
    pub paths: Vec<PathBuf>,
    /// Where to write JUnit XML.
    pub junit: Option<PathBuf>,
    /// List what no case exercised.
    pub coverage: bool,
}

/// A finished run.
pub struct TestReport {
    /// What to print.
    pub text: String,
    /// Cases run.
    pub total: usize,
    /// Cases failed.
    pub failed: usize,
}

/// One test file.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    #[serde(default)]
    case: Vec<toml::Spanned<RawCase>>,
}

/// One `[[case]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCase {
    name: String,
    claims: toml::Table,
    upstream: String,
    call: Option<RawCall>,
    expect: Option<String>,
    reason: Option<String>,
    /// A substring of the rule that decided (`30-conditions.toml:5`).
    rule: Option<String>,
    /// The run's labels (`private`, `untrusted`): the `[taint]` gate they
    /// put on the call applies.
    labels: Option<Vec<String>>,
    /// The called tool's definition when the pins have none.
    tool: Option<toml::Table>,
    /// Definitions of listed tools the pins have none for, by name.
    #[serde(default)]
    tools: toml::Table,
    #[serde(default)]
    list: bool,
    #[serde(default)]
    expect_hidden: Vec<String>,
    #[serde(default)]
    expect_listed: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCall {
    name: String,
    arguments: Option<toml::Table>,
}

/// One case's outcome.
struct Outcome {
    file: PathBuf,
    line: usize,
    name: String,
    millis: f64,
    /// Empty when it passed; else the diff.
    failure: Option<String>,
}

/// Runs the cases; `Err` only when the policy, a test file or the config
/// cannot be read (a failing case is in the report).
pub fn run(cfg: &Config, args: &TestArgs) -> anyhow::Result<TestReport> {
    let dir = args.policy_dir.as_deref().unwrap_or(&cfg.policy_dir);
    let policy =
        policy::load_dir(dir).with_context(|| format!("policy directory {}", dir.display()))?;
    let pins = PinStore::open(dir, &mut prometheus_client::registry::Registry::default())
        .with_context(|| format!("pins of {}", dir.display()))?;
    let files = test_files(dir, &args.paths)?;
    let mut outcomes = Vec::new();
    let mut exercised = BTreeSet::new();
    let bench = Bench {
        cfg,
        policy: &policy,
        pins: &pins,
        definitions: Definitions::new(pins.clone()),
        tasks: Default::default(),
    };
    for file in &files {
        let text = std::fs::read_to_string(file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        let parsed: CaseFile = toml::from_str(&text)
            .with_context(|| format!("{}: not a test file", file.display()))?;
        if parsed.case.is_empty() {
            bail!("{}: no [[case]]", file.display());
        }
        // Lines counted once through the file, case by case (in order).
        let (mut counted_to, mut line) = (0usize, 1usize);
        for spanned in parsed.case {
            let start = spanned.span().start.min(text.len()).max(counted_to);
            line += text
                .get(counted_to..start)
                .map_or(0, |t| t.bytes().filter(|&b| b == b'\n').count());
            counted_to = start;
            let case = spanned.into_inner();
            let started = Instant::now();
            let failure = bench
                .case(&case, &mut exercised)
                .with_context(|| format!("{}:{line}: case {:?}", file.display(), case.name))?;
            outcomes.push(Outcome {
                file: file.clone(),
                line,
                name: case.name,
                millis: started.elapsed().as_secs_f64() * 1000.0,
                failure,
            });
        }
    }
    let mut text = render(&outcomes);
    if args.coverage {
        text.push_str(&coverage(&policy, &exercised));
    }
    if let Some(path) = &args.junit {
        std::fs::write(path, junit(&outcomes))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(TestReport {
        text,
        total: outcomes.len(),
        failed: outcomes.iter().filter(|o| o.failure.is_some()).count(),
    })
}

/// The test files: the paths given (a directory means its `*.toml`), else
/// `<policy dir>/tests/*.toml`; sorted.
fn test_files(dir: &Path, paths: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let default = [dir.join("tests")];
    let roots: &[PathBuf] = if paths.is_empty() { &default } else { paths };
    let mut files = Vec::new();
    for root in roots {
        if root.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(root)
                .with_context(|| format!("cannot read {}", root.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "toml") && p.is_file())
                .collect();
            found.sort();
            files.extend(found);
        } else if root.is_file() {
            files.push(root.clone());
        } else {
            bail!("no test file or directory {}", root.display());
        }
    }
    if files.is_empty() {
        bail!(
            "no test files (*.toml) in {}",
            roots
                .iter()
                .map(|r| r.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    Ok(files)
}

/// Who a case calls as, and where.
struct Caller<'a> {
    /// The upstream the case names.
    up: &'a Upstream,
    /// The case's claims.
    claims: &'a auth::Claims,
    /// Who the claims name.
    identity: &'a policy::Identity<'a>,
    /// What the policy lets them reach (or why nothing).
    authority: &'a Result<policy::Authority, policy::NoAuthority>,
}

/// The case's `labels` (the run's labels before the call), when it sets them.
fn case_labels(case: &RawCase) -> anyhow::Result<Option<Labels>> {
    let Some(names) = &case.labels else {
        return Ok(None);
    };
    let labels = names.iter().try_fold(Labels::NONE, |acc, n| {
        Labels::named(n)
            .map(|l| acc.union(l))
            .with_context(|| format!("labels: unknown label {n:?} (private, untrusted)"))
    })?;
    Ok(Some(labels))
}

/// What every case is decided against.
struct Bench<'a> {
    cfg: &'a Config,
    policy: &'a Policy,
    pins: &'a PinStore,
    definitions: Definitions,
    /// No task is anyone's here (a list's scope asks).
    tasks: crate::tasks::Tasks,
}

impl Bench<'_> {
    /// One case: `Ok(None)` when it passed, `Ok(Some(diff))` when not,
    /// `Err` when it is not a valid case.
    fn case(
        &self,
        case: &RawCase,
        exercised: &mut BTreeSet<RuleId>,
    ) -> anyhow::Result<Option<String>> {
        let up = self
            .cfg
            .upstreams
            .iter()
            .find(|u| u.name == case.upstream)
            .with_context(|| format!("no upstream named {:?} in the config", case.upstream))?;
        let claims = super::claims_from_value(&to_json(&case.claims)?);
        let service_issuer = self.cfg.auth.service_account_issuer.as_deref() == Some(&*claims.iss);
        let identity = crate::verdict::identity(&claims, service_issuer);
        let authority = self.policy.authority(&identity);
        let who = Caller {
            up,
            claims: &claims,
            identity: &identity,
            authority: &authority,
        };
        match (&case.call, case.list) {
            (Some(call), false) => self.call_case(case, call, &who, exercised),
            (None, true) => self.list_case(case, &who, exercised),
            (Some(_), true) => bail!("a case has either `call` or `list = true`, not both"),
            (None, false) => {
                bail!("a case needs `call = {{ name = …, arguments = … }}` or `list = true`")
            }
        }
    }

    /// A `call` case: the call's verdict against `expect` (and `reason`).
    fn call_case(
        &self,
        case: &RawCase,
        call: &RawCall,
        who: &Caller<'_>,
        exercised: &mut BTreeSet<RuleId>,
    ) -> anyhow::Result<Option<String>> {
        let expect = case
            .expect
            .as_deref()
            .context("a call case needs `expect` (allow, approve, deny, hidden or invalid)")?;
        let expected = Kind::parse(expect).with_context(|| {
            format!("expect = {expect:?}: not allow, approve, deny, hidden or invalid")
        })?;
        if !case.expect_hidden.is_empty() || !case.expect_listed.is_empty() {
            bail!("expect_hidden and expect_listed belong to a `list = true` case");
        }
        let labels = case_labels(case)?;
        let arguments = match &call.arguments {
            Some(a) => to_json(a)?,
            None => Value::Object(Default::default()),
        };
        let up = who.up;
        let entry = self.entry(up, &call.name, case.tool.as_ref())?;
        let got = match who.authority {
            Err(e) => no_authority(e),
            Ok(authority) => {
                exercised.extend(self.policy.exercised(
                    authority,
                    up.facts(),
                    &call.name,
                    entry.hints,
                ));
                let judge = Judge {
                    policy: self.policy,
                    identity: who.identity,
                    authority,
                    upstream: up,
                    pins: self.pins,
                };
                let raw = arguments.to_string();
                judge.verdict(&call.name, &entry, Some(&raw), &arguments, labels)
            }
        };
        Ok(compare(expected, case, &got))
    }

    /// A `list = true` case: which tools `tools/list` shows the run against
    /// `expect_hidden` and `expect_listed`.
    fn list_case(
        &self,
        case: &RawCase,
        who: &Caller<'_>,
        exercised: &mut BTreeSet<RuleId>,
    ) -> anyhow::Result<Option<String>> {
        if case.expect.is_some() || case.reason.is_some() || case.labels.is_some() {
            bail!("a `list = true` case takes expect_hidden / expect_listed, not expect, reason or labels");
        }
        if case.expect_hidden.is_empty() && case.expect_listed.is_empty() {
            bail!("a `list = true` case needs expect_hidden or expect_listed");
        }
        let up = who.up;
        let mut diff = String::new();
        let names = case.expect_hidden.iter().map(|n| (n, false));
        let names = names.chain(case.expect_listed.iter().map(|n| (n, true)));
        for (name, want) in names {
            let listed = match who.authority {
                Err(_) => None,
                Ok(authority) => {
                    let entry = self.entry(up, name, to_table(case.tools.get(name.as_str()))?)?;
                    exercised.extend(self.policy.exercised(
                        authority,
                        up.facts(),
                        name,
                        entry.hints,
                    ));
                    self.listed(up, authority, who.claims, name, &entry)
                }
            };
            if listed.is_some() != want {
                let _ = writeln!(
                    diff,
                    "  {name}: expected {}, got {}",
                    if want { "listed" } else { "hidden" },
                    self.shown_as(listed, who, name)
                );
            }
        }
        Ok((!diff.is_empty()).then_some(diff))
    }

    /// How a list case's tool `name` came out: listed with its risk and
    /// gate, or hidden and why.
    fn shown_as(
        &self,
        listed: Option<(policy::Risk, policy::Gate)>,
        who: &Caller<'_>,
        name: &str,
    ) -> String {
        match (listed, who.authority) {
            (Some((risk, gate)), _) => format!("listed ({risk}, {gate})"),
            (None, Err(e)) => format!("hidden (no authority: {e})"),
            (None, Ok(a)) => format!(
                "hidden ({})",
                match self.policy.access(a, who.up.facts(), name, None) {
                    policy::Access::Hidden(h) => h.to_string(),
                    policy::Access::Visible { .. } =>
                        "unpinned, or its definition is blocked".to_owned(),
                }
            ),
        }
    }

    /// The tool's definition ([`Definitions`]).
    fn entry(
        &self,
        up: &Upstream,
        name: &str,
        tool: Option<&toml::Table>,
    ) -> anyhow::Result<std::sync::Arc<ToolEntry>> {
        self.definitions
            .get(up, name, tool.map(to_json).transpose()?.as_ref())
    }

    /// Whether `tools/list` shows the tool to the run, as the relay
    /// decides it: pinned, valid `x-mcp-header` annotations, visible to the
    /// run, and not blocked by screening.
    fn listed(
        &self,
        up: &Upstream,
        authority: &policy::Authority,
        claims: &auth::Claims,
        name: &str,
        entry: &ToolEntry,
    ) -> Option<(policy::Risk, policy::Gate)> {
        use crate::verdict::answer::{listed_screen, tool_visible, Scope};
        let scope = Scope {
            policy: self.policy,
            authority,
            upstream: up,
            stateless: false,
            tasks: &self.tasks,
            principal: crate::session::Principal {
                issuer: &claims.iss,
                tenant: &claims.tenant_id,
                subject: &claims.sub,
                upstream: &up.name,
                run: &claims.run_id,
            },
        };
        let pinned = self
            .pins
            .check(up.pinning, &up.name, name, &entry.sha256)
            .is_ok();
        let valid_headers = entry.param_headers().violation().is_none();
        let shown = tool_visible(scope, name, entry.hints, pinned, valid_headers)?;
        let found = listed_screen(scope, Some(name), &entry.definition);
        (found.action != crate::screen::content::Action::Block).then_some(shown)
    }
}

/// Tool definitions as `test` and `audit replay` judge them
/// ([`tool_entry`]), each built once (its schema compiled once) however
/// many cases or rows name it.
pub(crate) struct Definitions {
    pins: std::sync::Arc<PinStore>,
    built: std::cell::RefCell<
        std::collections::HashMap<(String, String, String), std::sync::Arc<ToolEntry>>,
    >,
}

impl Definitions {
    /// Definitions from `pins`, else as given.
    pub(crate) fn new(pins: std::sync::Arc<PinStore>) -> Definitions {
        Definitions {
            pins,
            built: Default::default(),
        }
    }

    /// The definition of `name` on `up` ([`tool_entry`]).
    pub(crate) fn get(
        &self,
        up: &Upstream,
        name: &str,
        tool: Option<&Value>,
    ) -> anyhow::Result<std::sync::Arc<ToolEntry>> {
        let key = (
            up.name.clone(),
            name.to_owned(),
            tool.map(Value::to_string).unwrap_or_default(),
        );
        if let Some(e) = self.built.borrow().get(&key) {
            return Ok(e.clone());
        }
        let entry = std::sync::Arc::new(tool_entry(&self.pins, up, name, tool)?);
        self.built.borrow_mut().insert(key, entry.clone());
        Ok(entry)
    }
}

/// A tool's definition as `test` and `audit replay` judge it: its pin's
/// when the pins have one, else `tool` (`annotations`, `inputSchema`,
/// `description`, `title`), else an empty one (any object arguments).
fn tool_entry(
    pins: &PinStore,
    up: &Upstream,
    name: &str,
    tool: Option<&Value>,
) -> anyhow::Result<ToolEntry> {
    let current = pins.current();
    if let Some(pin) = current.pin(&up.name, Subject::Tool, name) {
        let definition: Value = serde_json::from_str(&pin.definition)
            .with_context(|| format!("the pin of {name} is not JSON"))?;
        return Ok(ToolEntry::of(definition));
    }
    let mut definition = serde_json::Map::new();
    definition.insert("name".to_owned(), Value::String(name.to_owned()));
    if let Some(t) = tool {
        let Some(t) = t.as_object() else {
            bail!("tool: a table {{ annotations, inputSchema }}");
        };
        for (k, v) in t {
            if !matches!(
                k.as_str(),
                "annotations" | "inputSchema" | "description" | "title"
            ) {
                bail!("tool: unknown key {k:?} (annotations, inputSchema, description, title)");
            }
            definition.insert(k.clone(), v.clone());
        }
    }
    definition
        .entry("inputSchema")
        .or_insert_with(|| serde_json::json!({ "type": "object" }));
    Ok(ToolEntry::of(Value::Object(definition)))
}

/// The verdict for a run the policy gives no authority.
pub(crate) fn no_authority(e: &policy::NoAuthority) -> Verdict {
    Verdict {
        kind: Kind::Hidden,
        risk: None,
        reason: format!("no authority: {e} (every upstream answers 404)"),
        rule: "authority".to_owned(),
    }
}

/// The diff between what the case expects and what it got, if any.
fn compare(expected: Kind, case: &RawCase, got: &Verdict) -> Option<String> {
    let kind_ok = expected == got.kind || (expected == Kind::Deny && got.kind.refused());
    let reason_ok = case
        .reason
        .as_deref()
        .is_none_or(|r| got.reason.contains(r));
    let rule_ok = case.rule.as_deref().is_none_or(|r| got.rule.contains(r));
    if kind_ok && reason_ok && rule_ok {
        return None;
    }
    let mut want = expected.as_str().to_owned();
    if let Some(r) = &case.reason {
        let _ = write!(want, " (reason containing {r:?})");
    }
    if let Some(r) = &case.rule {
        let _ = write!(want, " (decided by a rule containing {r:?})");
    }
    let mut out = String::new();
    let _ = writeln!(out, "  expected: {want}");
    let _ = write!(out, "       got: {}", got.kind);
    if let Some(risk) = got.risk {
        let _ = write!(out, " ({risk})");
    }
    if !got.reason.is_empty() {
        let _ = write!(out, ": {}", got.reason);
    }
    let _ = writeln!(out);
    let _ = writeln!(out, "decided by: {}", got.rule);
    Some(out)
}

/// `cargo test`-like output.
fn render(outcomes: &[Outcome]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "\nrunning {} policy cases", outcomes.len());
    for o in outcomes {
        let _ = writeln!(
            out,
            "case {} ... {}",
            o.name,
            if o.failure.is_some() { "FAILED" } else { "ok" }
        );
    }
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.failure.is_some()).collect();
    if !failed.is_empty() {
        let _ = writeln!(out, "\nfailures:\n");
        for o in &failed {
            let _ = writeln!(
                out,
                "---- {} ({}:{}) ----",
                o.name,
                o.file.display(),
                o.line
            );
            let _ = writeln!(out, "{}", o.failure.as_deref().unwrap_or(""));
        }
        let _ = writeln!(out, "failures:");
        for o in &failed {
            let _ = writeln!(out, "    {}", o.name);
        }
    }
    let _ = writeln!(
        out,
        "\ntest result: {}. {} passed; {} failed\n",
        if failed.is_empty() { "ok" } else { "FAILED" },
        outcomes.len() - failed.len(),
        failed.len()
    );
    out
}

/// The rules, roles and gates no case exercised.
fn coverage(policy: &Policy, exercised: &BTreeSet<RuleId>) -> String {
    let all = policy.rule_ids();
    let missed: Vec<&RuleId> = all.iter().filter(|r| !exercised.contains(r)).collect();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "coverage: {} of {} rules, roles and gates exercised",
        all.len() - missed.len(),
        all.len()
    );
    if !missed.is_empty() {
        let _ = writeln!(out, "not exercised by any case:");
        for r in missed {
            let _ = writeln!(out, "  {}", policy.describe(r));
        }
    }
    out
}

/// JUnit XML: a `<testsuite>` per file.
fn junit(outcomes: &[Outcome]) -> String {
    let mut files: Vec<&Path> = outcomes.iter().map(|o| o.file.as_path()).collect();
    files.dedup();
    let failed = outcomes.iter().filter(|o| o.failure.is_some()).count();
    let secs = |ms: f64| format!("{:.6}", ms / 1000.0);
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites name=\"mcp-firewall test\" tests=\"{}\" failures=\"{failed}\" errors=\"0\" time=\"{}\">",
        outcomes.len(),
        secs(outcomes.iter().map(|o| o.millis).sum())
    );
    for file in files {
        let cases: Vec<&Outcome> = outcomes.iter().filter(|o| o.file == file).collect();
        let name = xml_escape(&file.display().to_string());
        let _ = writeln!(
            out,
            "  <testsuite name=\"{name}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"0\" time=\"{}\">",
            cases.len(),
            cases.iter().filter(|o| o.failure.is_some()).count(),
            secs(cases.iter().map(|o| o.millis).sum())
        );
        for o in cases {
            let _ = write!(
                out,
                "    <testcase name=\"{}\" classname=\"{name}\" file=\"{name}\" line=\"{}\" time=\"{}\"",
                xml_escape(&o.name),
                o.line,
                secs(o.millis)
            );
            match &o.failure {
                None => out.push_str("/>\n"),
                Some(diff) => {
                    let first = diff.lines().next().unwrap_or("").trim();
                    let _ = writeln!(
                        out,
                        ">\n      <failure message=\"{}\" type=\"policy\">{}</failure>\n    </testcase>",
                        xml_escape(first),
                        xml_escape(diff)
                    );
                }
            }
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
}

/// Text for an XML attribute or element.
fn xml_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Characters XML 1.0 cannot carry at all.
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\r' | '\t') => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

fn to_json(t: &toml::Table) -> anyhow::Result<Value> {
    serde_json::to_value(t).context("not representable as JSON")
}

fn to_table(v: Option<&toml::Value>) -> anyhow::Result<Option<&toml::Table>> {
    match v {
        None => Ok(None),
        Some(toml::Value::Table(t)) => Ok(Some(t)),
        Some(_) => bail!("tools: each entry is a table {{ annotations, inputSchema }}"),
    }
}

#[cfg(test)]
#[path = "policy_test_tests.rs"]
mod tests;
