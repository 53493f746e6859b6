//! The docs' commands and configurations run: every fenced block of
//! `README.md` and `docs/*.md` is looked at, by its language, and none is
//! passed over without being counted.
//!
//! - ```` ```toml ````: the line just before the fence says what the block
//!   is (an HTML comment, invisible when rendered); a block without one
//!   fails the test.
//!   - `<!-- config -->`: a firewall configuration, whole or some of its
//!     sections. It is loaded by the firewall's own loader
//!     ([`mcp_firewall::config::load_str`], what `serve` and `check` read a
//!     file with: unknown keys, types and every semantic check) on top of a
//!     minimal configuration supplying what a section shown alone lacks:
//!     `[server]` and `[auth]` when the block has none, and a plain
//!     upstream for each member its `[[virtual_server]]` names but does not
//!     define. Every environment variable it names is set; relative paths
//!     resolve in a scratch directory. Keys shown commented out (`# key =
//!     value`, for the reader to uncomment) are loaded too, uncommented.
//!   - `<!-- config; needs npx /srv/docs -->`: the same, for a block that
//!     names what must exist on the firewall's machine (a stdio server's
//!     program, its sandbox's directories), which the loader insists on:
//!     each directory (`/…`) is made in the scratch directory and each
//!     program is a stub there, and the block is loaded with its quoted
//!     mentions of them pointing there.
//!   - `<!-- policy -->`: a policy file, compiled by
//!     [`mcp_firewall::policy::compile`] (the loader of `policy.dir`).
//!   - `<!-- policy-test -->`: a policy test file, run by `mcp-firewall
//!     test`'s own code ([`mcp_firewall::cli::policy_test::run`]) against
//!     the shipped estate (`config/policy-tests.toml`, `policies/`): it must
//!     parse and every `[[case]]` be decided. Whether a case passes is not
//!     asserted: the docs show the format, with placeholders (`reason =
//!     "…"`); the shipped policies' own cases are `policies/tests/`.
//!   - `<!-- fragment: why -->`: not a whole file on purpose (elided
//!     values); counted, never loaded.
//! - ```` ```sh ````: every command (comments dropped, `\` continuations
//!   joined, split at `&&`, `||`, `;`, `|`; leading `NAME=value`
//!   assignments set aside). A `mcp-firewall` command (any path ending in
//!   it) is given to the binary's own parser with `--help` appended: clap
//!   checks the subcommand, every flag and every value as written, then
//!   prints help instead of running anything (so a required flag the line
//!   leaves to the environment is not asked for). Any other program must be
//!   one of [`OTHER_PROGRAMS`], checked elsewhere or not ours. A
//!   `<!-- fragment: why -->` before the fence skips a block, counted.
//! - ```` ```sql ````: the auditors' queries, run on ClickHouse 18.16 and on
//!   a current release by `audit_e2e`, `dashboard`, `approvals_e2e` and
//!   `modern_clickhouse`, and held to the SQL the `mcp-firewall audit`
//!   commands run by `cli::audit`'s unit test; here only counted.
//! - ```` ``` ```` without a language: output shown, not run; counted.
//!
//! Any other language fails the test, so a new kind of block gets a rule
//! here first.
//!
//! And the screening table of `docs/security.md` is the gate's own
//! (`FIELDS` in `src/proxy/outbound/gate.rs`): as many rows, in order,
//! each treated as the gate treats it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Programs the docs' shell blocks run besides `mcp-firewall`, not checked
/// here: the build (`cargo`), CI (`.ci/run`), the bench harness
/// (`mcp-bench`: its parser is in the bench crate, which this test does not
/// link), and the shell's and other people's tools.
const OTHER_PROGRAMS: &[&str] = &[".ci/run", "cargo", "curl", "export", "mcp-bench"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The documents: the README, then `docs/*.md` by name.
fn documents() -> Vec<(PathBuf, String)> {
    let mut paths = vec![root().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 4, "docs/ holds the four guides: {docs:?}");
    paths.extend(docs);
    paths
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// One fenced block.
struct Block {
    /// `file:line` of the opening fence.
    at: String,
    /// The language after the fence (empty: none).
    lang: String,
    /// The comment on the line before the fence (`config`, `fragment: …`).
    marker: Option<String>,
    /// The lines inside, with the fence's indentation taken off.
    text: String,
}

fn blocks(file: &Path, text: &str) -> Vec<Block> {
    let name = file.strip_prefix(root()).unwrap_or(file).display();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let indent = line.len() - line.trim_start().len();
        let Some(lang) = line.trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let marker = i
            .checked_sub(1)
            .map(|j| lines[j].trim())
            .and_then(|l| l.strip_prefix("<!--"))
            .and_then(|l| l.strip_suffix("-->"))
            .map(|m| m.trim().to_owned());
        let start = i;
        let mut body = Vec::new();
        i += 1;
        while i < lines.len() && lines[i].trim() != "```" {
            let l = lines[i];
            let cut = l.len() - l.trim_start().len();
            body.push(&l[cut.min(indent)..]);
            i += 1;
        }
        assert!(
            i < lines.len(),
            "{name}:{}: a block never closed",
            start + 1
        );
        out.push(Block {
            at: format!("{name}:{}", start + 1),
            lang: lang.trim().to_owned(),
            marker,
            text: body.join("\n"),
        });
        i += 1;
    }
    out
}

/// What was checked, for the summary (and the assertions on counts).
#[derive(Default, Debug)]
struct Tally {
    configs: usize,
    policies: usize,
    policy_tests: usize,
    toml_fragments: usize,
    sh_blocks: usize,
    sh_fragments: usize,
    firewall_commands: usize,
    other_commands: BTreeMap<String, usize>,
    sql: usize,
    output: usize,
}

#[test]
fn every_command_and_configuration_of_the_docs_runs() {
    let scratch = tempfile::tempdir().unwrap();
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    for (file, text) in documents() {
        for b in blocks(&file, &text) {
            let fragment = b
                .marker
                .as_deref()
                .is_some_and(|m| m.starts_with("fragment:"));
            let needs = b.marker.as_deref().and_then(config_needs);
            let outcome = match (b.lang.as_str(), b.marker.as_deref()) {
                ("toml", Some(_)) if needs.is_some() => {
                    tally.configs += 1;
                    let needs = needs.unwrap_or_default();
                    provide(&b.text, &needs, scratch.path()).and_then(|text| {
                        load_config(&text, scratch.path())?;
                        match uncommented(&text) {
                            Some(all) => load_config(&all, scratch.path())
                                .map_err(|e| format!("with its commented keys uncommented, {e}")),
                            None => Ok(()),
                        }
                    })
                }
                ("toml", Some("policy")) => {
                    tally.policies += 1;
                    compile_policy(&b.text)
                }
                ("toml", Some("policy-test")) => {
                    tally.policy_tests += 1;
                    run_policy_tests(&b.text, scratch.path())
                }
                ("toml" | "sh", Some(m)) if fragment => {
                    assert!(
                        m.len() > "fragment:".len() + 10,
                        "{}: a fragment says why it is one: {m:?}",
                        b.at
                    );
                    if b.lang == "toml" {
                        tally.toml_fragments += 1;
                    } else {
                        tally.sh_fragments += 1;
                    }
                    Ok(())
                }
                ("toml", m) => Err(format!(
                    "a toml block needs <!-- config -->, <!-- policy -->, \
                     <!-- policy-test --> or <!-- fragment: why --> on the line \
                     before its fence (found {m:?})"
                )),
                ("sh", _) => {
                    tally.sh_blocks += 1;
                    check_commands(&b.text, &mut tally)
                }
                ("sql", _) => {
                    tally.sql += 1;
                    Ok(())
                }
                ("", _) => {
                    tally.output += 1;
                    Ok(())
                }
                (lang, _) => Err(format!(
                    "a ```{lang} block: no rule in tests/integration/docs.rs says how it runs"
                )),
            };
            if let Err(e) = outcome {
                failures.push(format!("{}: {e}\n{}", b.at, b.text));
            }
        }
    }
    eprintln!("docs checked: {tally:#?}");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // What the docs hold today; fewer means a block went uncounted.
    assert!(tally.configs >= 11, "{tally:?}");
    assert!(tally.policies >= 2, "{tally:?}");
    assert!(tally.policy_tests >= 1, "{tally:?}");
    assert!(tally.firewall_commands >= 20, "{tally:?}");
    assert!(tally.sql >= 3, "{tally:?}");
}

/// A minimal configuration: what a section shown alone is loaded inside.
const BASE: &str = r#"
[server]
listen = "127.0.0.1:0"
plaintext = true

[auth]
mcp_audience = "mcp-firewall"
admin_audience = "mcp-firewall-admin"
issuers = ["https://idp.example.com"]

[[auth.keys]]
kid = "docs"
alg = "HS256"
secret = "docs-only-not-a-secret-of-anything-at-all"
"#;

/// What a `config` marker says the block needs (`config` alone: nothing).
fn config_needs(marker: &str) -> Option<Vec<String>> {
    if marker == "config" {
        return Some(Vec::new());
    }
    let needs = marker.strip_prefix("config; needs ")?;
    Some(needs.split_whitespace().map(str::to_owned).collect())
}

/// The block with each directory and program it needs made in `scratch`
/// (a program as a stub) and its quoted mentions pointing there.
fn provide(text: &str, needs: &[String], scratch: &Path) -> Result<String, String> {
    let mut text = text.to_owned();
    for need in needs {
        let quoted = format!("\"{need}\"");
        if !text.contains(&quoted) {
            return Err(format!(
                "the marker needs {need:?}, which the block never names"
            ));
        }
        let made = scratch.join("needs").join(need.trim_start_matches('/'));
        if need.starts_with('/') {
            std::fs::create_dir_all(&made).unwrap();
        } else {
            use std::os::unix::fs::PermissionsExt;
            std::fs::create_dir_all(made.parent().unwrap()).unwrap();
            std::fs::write(&made, "#!/bin/sh\nexit 0\n").unwrap();
            std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        text = text.replace(&quoted, &format!("\"{}\"", made.display()));
    }
    Ok(text)
}

/// The block with the keys it shows commented out (`# key = value`, `#
/// [table]`) uncommented; `None` when it shows none.
fn uncommented(text: &str) -> Option<String> {
    let is_key = |rest: &str| {
        let (key, _) = rest.split_once(" = ").unwrap_or(("", ""));
        let bare = |c: char| c.is_ascii_alphanumeric() || "_-.".contains(c);
        (!key.is_empty() && key.chars().all(bare))
            || (rest.starts_with('[') && rest.trim_end().ends_with(']'))
    };
    let mut any = false;
    let lines: Vec<&str> = text
        .lines()
        .map(|l| match l.trim_start().strip_prefix("# ") {
            Some(rest) if is_key(rest) => {
                any = true;
                rest
            }
            _ => l,
        })
        .collect();
    any.then(|| lines.join("\n"))
}

fn load_config(text: &str, scratch: &Path) -> Result<(), String> {
    let mut doc: toml::Table = text.parse().map_err(|e| format!("not TOML: {e}"))?;
    let base: toml::Table = BASE.parse().unwrap();
    for key in ["server", "auth"] {
        if !doc.contains_key(key) {
            doc.insert(key.to_owned(), base[key].clone());
        }
    }
    let defined: Vec<String> = doc
        .get("upstream")
        .and_then(|u| u.as_array())
        .into_iter()
        .flatten()
        .filter_map(|u| u.get("name")?.as_str().map(str::to_owned))
        .collect();
    let mut members: Vec<String> = doc
        .get("virtual_server")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
        .filter_map(|v| v.get("upstreams")?.as_array())
        .flatten()
        .filter_map(|m| m.as_str().map(str::to_owned))
        .filter(|m| !defined.contains(m))
        .collect();
    members.sort();
    members.dedup();
    if !members.is_empty() {
        let upstreams = doc
            .entry("upstream")
            .or_insert_with(|| toml::Value::Array(Vec::new()));
        let upstreams = upstreams
            .as_array_mut()
            .ok_or("`upstream` is not an array")?;
        for m in members {
            let mut u = toml::Table::new();
            u.insert("name".into(), m.clone().into());
            u.insert("url".into(), format!("http://{m}.invalid/mcp").into());
            upstreams.push(toml::Value::Table(u));
        }
    }
    let text = toml::to_string(&doc).map_err(|e| e.to_string())?;
    let env = |_: &str| Some("docs-test-value-0123456789abcdef0123456789abcdef".to_owned());
    mcp_firewall::config::load_str(&text, &scratch.join("firewall.toml"), scratch, &env)
        .map(drop)
        .map_err(|e| format!("the firewall refuses it: {e}"))
}

fn compile_policy(text: &str) -> Result<(), String> {
    // A block that names its file (`# policies/40-content.toml`) is
    // compiled under that name.
    let name = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("# "))
        .filter(|l| l.ends_with(".toml") && !l.contains(' '))
        .and_then(|l| l.rsplit('/').next())
        .unwrap_or("docs.toml");
    mcp_firewall::policy::compile(&[(PathBuf::from(name), text.to_owned())])
        .map(drop)
        .map_err(|e| format!("the policy does not compile: {e}"))
}

fn run_policy_tests(text: &str, scratch: &Path) -> Result<(), String> {
    let cases = text
        .parse::<toml::Table>()
        .map_err(|e| format!("not TOML: {e}"))?
        .get("case")
        .and_then(|c| c.as_array())
        .map_or(0, Vec::len);
    let file = scratch.join("docs-cases.toml");
    std::fs::write(&file, text).unwrap();
    let cfg = mcp_firewall::config::load(&root().join("config/policy-tests.toml"))
        .map_err(|e| e.to_string())?;
    let report = mcp_firewall::cli::policy_test::run(
        &cfg,
        &mcp_firewall::cli::policy_test::TestArgs {
            policy_dir: None,
            paths: vec![file],
            junit: None,
            coverage: false,
        },
    )
    .map_err(|e| format!("`mcp-firewall test` cannot read it: {e:#}"))?;
    if cases == 0 || report.total != cases {
        return Err(format!(
            "{} of {cases} cases decided:\n{}",
            report.total, report.text
        ));
    }
    Ok(())
}

/// A shell block's commands, each as its words.
fn commands(text: &str) -> Result<Vec<Vec<String>>, String> {
    let joined = text.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        let mut cmd: Vec<String> = Vec::new();
        let mut word: Option<String> = None;
        let mut chars = line.chars().peekable();
        let end_word = |word: &mut Option<String>, cmd: &mut Vec<String>| {
            if let Some(w) = word.take() {
                cmd.push(w);
            }
        };
        while let Some(c) = chars.next() {
            match c {
                '\'' => {
                    let w = word.get_or_insert_with(String::new);
                    loop {
                        match chars.next() {
                            Some('\'') => break,
                            Some(c) => w.push(c),
                            None => return Err(format!("unclosed ' in {line:?}")),
                        }
                    }
                }
                '"' => {
                    let w = word.get_or_insert_with(String::new);
                    loop {
                        match chars.next() {
                            Some('"') => break,
                            Some('\\') => match chars.next() {
                                Some(c @ ('"' | '\\' | '$' | '`')) => w.push(c),
                                Some(c) => {
                                    w.push('\\');
                                    w.push(c);
                                }
                                None => return Err(format!("unclosed \" in {line:?}")),
                            },
                            Some(c) => w.push(c),
                            None => return Err(format!("unclosed \" in {line:?}")),
                        }
                    }
                }
                '\\' => {
                    if let Some(c) = chars.next() {
                        word.get_or_insert_with(String::new).push(c);
                    }
                }
                '#' if word.is_none() => break,
                ';' | '|' | '&' => {
                    end_word(&mut word, &mut cmd);
                    if chars.peek() == Some(&c) {
                        chars.next();
                    }
                    if !cmd.is_empty() {
                        out.push(std::mem::take(&mut cmd));
                    }
                }
                c if c.is_whitespace() => end_word(&mut word, &mut cmd),
                c => word.get_or_insert_with(String::new).push(c),
            }
        }
        end_word(&mut word, &mut cmd);
        if !cmd.is_empty() {
            out.push(cmd);
        }
    }
    Ok(out)
}

fn check_commands(text: &str, tally: &mut Tally) -> Result<(), String> {
    let mut failures = Vec::new();
    for cmd in commands(text)? {
        // `NAME=value` before a command sets its environment.
        let words: Vec<&String> = cmd
            .iter()
            .skip_while(|w| {
                w.split_once('=').is_some_and(|(k, _)| {
                    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                })
            })
            .collect();
        let Some((program, args)) = words.split_first() else {
            *tally.other_commands.entry("NAME=value".into()).or_default() += 1;
            continue;
        };
        if program.rsplit('/').next() == Some("mcp-firewall") {
            tally.firewall_commands += 1;
            if let Err(e) = parses(args) {
                failures.push(format!("`{}`: {e}", cmd.join(" ")));
            }
            continue;
        }
        let known = OTHER_PROGRAMS
            .iter()
            .find(|p| program.as_str() == **p || program.rsplit('/').next() == Some(**p));
        match known {
            Some(p) => *tally.other_commands.entry((*p).to_owned()).or_default() += 1,
            None => failures.push(format!(
                "`{}`: {program:?} is neither mcp-firewall nor in OTHER_PROGRAMS",
                cmd.join(" ")
            )),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("\n"))
    }
}

/// The binary's own parser takes `args`: the subcommand, its flags and
/// their values (with `--help` last, it prints help instead of running).
fn parses(args: &[&String]) -> Result<(), String> {
    let mut argv: Vec<&str> = args.iter().map(|a| a.as_str()).collect();
    let at = argv.iter().position(|a| *a == "--").unwrap_or(argv.len());
    argv.insert(at, "--help");
    let out = Command::new(env!("CARGO_BIN_EXE_mcp-firewall"))
        .args(&argv)
        .env_remove("MCP_FIREWALL_CONFIG")
        .env_remove("MCP_FIREWALL_ADMIN_URL")
        .env_remove("MCP_FIREWALL_ADMIN_TOKEN")
        .output()
        .map_err(|e| format!("cannot run mcp-firewall: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && stdout.contains("Usage:") {
        Ok(())
    } else {
        Err(format!(
            "the command line parser refuses it: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

#[test]
fn the_shell_reader_splits_as_a_shell_would() {
    let cmds = commands(
        "A=1 mcp-firewall audit --since 1h   # a comment\n\
         cargo build && target/x/mcp-firewall demo; echo 'a # b' | x \"c \\\" d\" \\\n  --flag",
    )
    .unwrap();
    assert_eq!(
        cmds,
        vec![
            vec!["A=1", "mcp-firewall", "audit", "--since", "1h"],
            vec!["cargo", "build"],
            vec!["target/x/mcp-firewall", "demo"],
            vec!["echo", "a # b"],
            vec!["x", "c \" d", "--flag"],
        ]
    );
    // The parser check tells a real command from a misspelt one.
    let ok = ["audit", "--spool", "DIR", "tail"].map(String::from);
    assert!(parses(&ok.iter().collect::<Vec<_>>()).is_ok());
    for bad in [
        &["audti", "tail"][..],
        &["audit", "--spool", "DIR", "tial"],
        &["check", "--config", "f.toml", "--no-such-flag"],
        &["audit", "--spool", "DIR", "denials", "--since"],
    ] {
        let bad: Vec<String> = bad.iter().map(|s| (*s).to_owned()).collect();
        assert!(
            parses(&bad.iter().collect::<Vec<_>>()).is_err(),
            "{bad:?} should not parse"
        );
    }
}

#[test]
fn the_screening_table_is_the_gates() {
    use mcp_firewall::internals::{Treated, GATED_FIELDS as FIELDS};
    let text = std::fs::read_to_string(root().join("docs/security.md")).unwrap();
    let at = text
        .find("### The screening table")
        .expect("docs/security.md has the screening table");
    let rows: Vec<Vec<&str>> = text[at..]
        .lines()
        .skip_while(|l| !l.starts_with("| message |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| l.trim_matches('|').split(" | ").map(str::trim).collect())
        .collect();
    assert_eq!(
        rows.len(),
        FIELDS.len(),
        "one row per field of the gate: {rows:?}"
    );
    for (row, field) in rows.iter().zip(FIELDS) {
        let treated = match field.treated {
            Treated::Content => "content",
            Treated::Definition => "definition",
            Treated::Protocol => "protocol",
        };
        assert_eq!(row.get(2), Some(&treated), "{row:?} against {field:?}");
    }
}
