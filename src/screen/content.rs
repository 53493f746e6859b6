//! What screening does with a JSON value the upstream sent: every string
//! in it (member names too), decoded, is scanned; each finding gets the
//! action its family is configured with ([`Actions`]); the strongest one
//! decides the value ([`Report::action`]). A value with something to
//! redact is rewritten (only the strings that hold it), one to block is
//! left to the caller to replace whole. The matched text never leaves:
//! a [`Report`] names kinds, not contents.
//!
//! The first pass reads the text with serde_json's own reader (the strict
//! reader accepted it before) without building a value: strings without
//! escapes are scanned where they lie. Only a value to redact is built and
//! written again.

use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::Value;

use super::{redact, Family, Kind, Scanner};

/// What happens to content where a kind is found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Not looked for.
    Off,
    /// Passed, and on record.
    Flag,
    /// Replaced by `[redacted:<kind>]` (hidden characters removed); the
    /// rest passes.
    Redact,
    /// The whole content is withheld; the client is told which kind.
    Block,
}

impl Action {
    /// `off`, `flag`, `redact` or `block`.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Off => "off",
            Action::Flag => "flag",
            Action::Redact => "redact",
            Action::Block => "block",
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An action per family (`[screen] secrets`, `pii`, `injection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Actions {
    /// Credentials and keys.
    pub secrets: Action,
    /// Personal and payment data.
    pub pii: Action,
    /// Content aimed at the model.
    pub injection: Action,
}

impl Actions {
    /// `secrets = "redact"`, `pii = "flag"`, `injection = "flag"`.
    pub const DEFAULT: Actions = Actions {
        secrets: Action::Redact,
        pii: Action::Flag,
        injection: Action::Flag,
    };

    /// The action for a finding of `kind`: its family's, except that
    /// e-mail addresses and phone numbers are only ever flagged (they are
    /// everywhere in legitimate answers).
    pub fn for_kind(self, kind: Kind) -> Action {
        let a = match kind.family() {
            Family::Secrets => self.secrets,
            Family::Pii => self.pii,
            Family::Injection => self.injection,
        };
        match kind {
            Kind::Email | Kind::Phone => a.min(Action::Flag),
            _ => a,
        }
    }

    /// Whether some family's finding withholds content.
    pub fn blocks_any(self) -> bool {
        self.secrets == Action::Block
            || self.pii == Action::Block
            || self.injection == Action::Block
    }

    /// Whether nothing is looked for.
    pub fn all_off(self) -> bool {
        self.secrets == Action::Off && self.pii == Action::Off && self.injection == Action::Off
    }
}

/// What screening found in one piece of content: the kinds (each once,
/// in the order first found) and the strongest action they call for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The kinds found (not those configured `off`).
    pub kinds: Vec<Kind>,
    /// The strongest action of those kinds.
    pub action: Action,
}

impl Default for Report {
    fn default() -> Self {
        Report {
            kinds: Vec::new(),
            action: Action::Off,
        }
    }
}

impl Report {
    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.kinds.is_empty()
    }

    /// Whether content aimed at the model was found (the content is
    /// untrusted, whatever its source).
    pub fn injection(&self) -> bool {
        self.kinds.iter().any(|k| k.family() == Family::Injection)
    }

    /// The kinds' names, for records.
    pub fn names(&self) -> Vec<&'static str> {
        self.kinds.iter().map(|k| k.name()).collect()
    }

    /// The names of the kinds that call for `action`.
    pub fn names_for(&self, actions: Actions, action: Action) -> Vec<&'static str> {
        self.kinds
            .iter()
            .filter(|k| actions.for_kind(**k) == action)
            .map(|k| k.name())
            .collect()
    }

    /// Adds what `other` found.
    pub fn merge(&mut self, other: &Report) {
        for k in &other.kinds {
            if !self.kinds.contains(k) {
                self.kinds.push(*k);
            }
        }
        self.action = self.action.max(other.action);
    }

    /// Adds the findings of one text.
    fn add(&mut self, scanner: &Scanner, actions: Actions, text: &str) {
        // Most strings are short and plain: no finding is possible in
        // fewer bytes than the shortest kind needs.
        if text.len() < 4 {
            return;
        }
        for f in scanner.scan(text) {
            let action = actions.for_kind(f.kind);
            if action == Action::Off {
                continue;
            }
            if !self.kinds.contains(&f.kind) {
                self.kinds.push(f.kind);
            }
            self.action = self.action.max(action);
        }
    }
}

/// The outcome of screening one JSON value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Screened {
    /// What was found.
    pub report: Report,
    /// The value with what is to be redacted redacted (JSON text), when
    /// the report's action is [`Action::Redact`].
    pub redacted: Option<String>,
}

/// Screens the JSON text `json` (a value the strict reader accepted).
///
/// # Errors
/// Text that is not JSON.
pub fn screen_json(
    scanner: &Scanner,
    actions: Actions,
    json: &str,
) -> Result<Screened, serde_json::Error> {
    let mut report = Report::default();
    if actions.all_off() {
        return Ok(Screened {
            report,
            redacted: None,
        });
    }
    let mut de = serde_json::Deserializer::from_str(json);
    Walk {
        scanner,
        actions,
        report: &mut report,
    }
    .deserialize(&mut de)?;
    de.end()?;
    let redacted = if report.action == Action::Redact {
        let mut v: Value = serde_json::from_str(json)?;
        redact_value(scanner, actions, &mut v);
        Some(v.to_string())
    } else {
        None
    };
    Ok(Screened { report, redacted })
}

/// Screens a value already built (a listed tool's definition).
pub fn screen_value(scanner: &Scanner, actions: Actions, v: &Value) -> Report {
    let mut report = Report::default();
    if !actions.all_off() {
        scan_value(scanner, actions, v, &mut report);
    }
    report
}

fn scan_value(scanner: &Scanner, actions: Actions, v: &Value, report: &mut Report) {
    match v {
        Value::String(s) => report.add(scanner, actions, s),
        Value::Array(a) => a
            .iter()
            .for_each(|x| scan_value(scanner, actions, x, report)),
        Value::Object(m) => {
            for (k, x) in m {
                report.add(scanner, actions, k);
                scan_value(scanner, actions, x, report);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// Redacts, in place, what `actions` says to redact in every string of `v`.
pub fn redact_value(scanner: &Scanner, actions: Actions, v: &mut Value) {
    match v {
        Value::String(s) => {
            if let Some(r) = redact_text(scanner, actions, s) {
                *s = r;
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| redact_value(scanner, actions, x)),
        Value::Object(m) => {
            let old = std::mem::take(m);
            for (k, mut x) in old {
                redact_value(scanner, actions, &mut x);
                let k = redact_text(scanner, actions, &k).unwrap_or(k);
                m.insert(k, x);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// `text` with what is to be redacted in it redacted, if anything is.
fn redact_text(scanner: &Scanner, actions: Actions, text: &str) -> Option<String> {
    let findings: Vec<_> = scanner
        .scan(text)
        .into_iter()
        .filter(|f| actions.for_kind(f.kind) == Action::Redact)
        .collect();
    (!findings.is_empty()).then(|| redact(text, &findings))
}

/// One pass over a JSON text, scanning each string (and member name) as
/// serde_json decodes it.
struct Walk<'a> {
    scanner: &'a Scanner,
    actions: Actions,
    report: &'a mut Report,
}

impl Walk<'_> {
    fn again(&mut self) -> Walk<'_> {
        Walk {
            scanner: self.scanner,
            actions: self.actions,
            report: self.report,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }

    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }

    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }

    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }

    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_str<E>(self, v: &str) -> Result<(), E> {
        self.report.add(self.scanner, self.actions, v);
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(mut self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self.again())?.is_some() {}
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(mut self, mut map: A) -> Result<(), A::Error> {
        while map.next_key_seed(self.again())?.is_some() {
            map.next_value_seed(self.again())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scanner() -> Scanner {
        Scanner::new(&["docs.example.com".to_owned()]).unwrap()
    }

    const KEY: &str = "AKIAIOSFODNN7EXAMPLQ";

    #[test]
    fn a_secret_is_redacted_and_the_rest_kept() {
        let json = format!(
            r#"{{"content":[{{"type":"text","text":"key {KEY} ok"}},{{"type":"text","text":"plain"}}]}}"#
        );
        let s = screen_json(&scanner(), Actions::DEFAULT, &json).unwrap();
        assert_eq!(s.report.names(), ["aws_access_key_id"]);
        assert_eq!(s.report.action, Action::Redact);
        let out = s.redacted.unwrap();
        assert!(!out.contains(KEY), "{out}");
        assert!(out.contains("key [redacted:aws_access_key_id] ok"), "{out}");
        assert!(out.contains("plain"), "{out}");
    }

    #[test]
    fn escaped_text_is_screened_decoded() {
        // A tag character and a key written with JSON escapes.
        let json = r#"{"text":"hi \udb40\udc41 there","k":"AKIA\u0049OSFODNN7EXAMPLQ"}"#;
        let s = screen_json(&scanner(), Actions::DEFAULT, json).unwrap();
        assert!(s.report.kinds.contains(&Kind::HiddenCharacters), "{s:?}");
        assert!(
            s.report.kinds.contains(&Kind::Secret("aws_access_key_id")),
            "{s:?}"
        );
        // Hidden characters are flagged by default; the key is redacted.
        let out = s.redacted.unwrap();
        assert!(!out.contains("EXAMPLQ"), "{out}");
    }

    #[test]
    fn member_names_are_screened_too() {
        let json = format!(r#"{{"structuredContent":{{"{KEY}":1}}}}"#);
        let s = screen_json(&scanner(), Actions::DEFAULT, &json).unwrap();
        let out = s.redacted.unwrap();
        assert!(!out.contains(KEY), "{out}");
    }

    #[test]
    fn e_mail_is_only_ever_flagged_and_off_finds_nothing() {
        let block = Actions {
            secrets: Action::Block,
            pii: Action::Block,
            injection: Action::Block,
        };
        let s = screen_json(&scanner(), block, r#"{"t":"write to ops@corp.example"}"#).unwrap();
        assert_eq!(s.report.action, Action::Flag);
        let off = Actions {
            secrets: Action::Off,
            pii: Action::Off,
            injection: Action::Off,
        };
        let s = screen_json(&scanner(), off, &format!(r#"{{"t":"{KEY}"}}"#)).unwrap();
        assert!(s.report.is_empty());
    }

    #[test]
    fn the_strongest_action_decides() {
        let a = Actions {
            injection: Action::Block,
            ..Actions::DEFAULT
        };
        let json = format!(r#"{{"t":"{KEY} and \u001b[2J"}}"#);
        let s = screen_json(&scanner(), a, &json).unwrap();
        assert_eq!(s.report.action, Action::Block);
        assert!(s.redacted.is_none());
        assert_eq!(s.report.names_for(a, Action::Block), ["terminal_escape"]);
        assert!(s.report.injection());
    }

    #[test]
    fn hidden_characters_under_redact_are_removed() {
        let a = Actions {
            injection: Action::Redact,
            ..Actions::DEFAULT
        };
        let s = screen_json(&scanner(), a, r#"{"t":"a\u200bb"}"#).unwrap();
        assert_eq!(s.redacted.as_deref(), Some(r#"{"t":"ab"}"#));
    }

    #[test]
    fn clean_content_reports_nothing() {
        let s = screen_json(
            &scanner(),
            Actions::DEFAULT,
            r#"{"content":[{"type":"text","text":"3 pods running, 0 restarts"}],"isError":false}"#,
        )
        .unwrap();
        assert!(s.report.is_empty() && s.redacted.is_none());
    }
}
