//! The `Scanner`: one pass over decoded text that finds secrets, personal data,
//! hidden characters, escapes and instructions planted for the model.

use super::*;
use aho_corasick::{AhoCorasick, MatchKind};
use std::ops::Range;

/// The families screening is configured by (`[screen] secrets`, `pii`,
/// `injection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// Credentials and keys.
    Secrets,
    /// Personal and payment data.
    Pii,
    /// Content aimed at the model rather than the reader.
    Injection,
}

/// What was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A token of a [`rules::Rule`], by the rule's name.
    Secret(&'static str),
    /// A PEM private key block.
    PrivateKey,
    /// A JSON Web Token (header, payload, signature).
    Jwt,
    /// A payment card number.
    Card,
    /// An International Bank Account Number.
    Iban,
    /// Unicode tag characters, zero-width or bidi controls used to hide text.
    HiddenCharacters,
    /// A terminal (ANSI) escape sequence.
    TerminalEscape,
    /// A `password=`-style assignment whose value looks generated (enough
    /// entropy), not a placeholder.
    Password,
    /// An e-mail address (only ever flagged).
    Email,
    /// A phone number in international form (only ever flagged).
    Phone,
    /// A markdown or HTML image or link to a host outside `link_hosts`
    /// (the exfiltration channel of a rendered answer).
    ForeignLink,
    /// A phrase aimed at the model ("ignore previous instructions").
    InstructionCue,
}

impl Kind {
    /// The family it is configured by.
    pub fn family(self) -> Family {
        match self {
            Kind::Secret(_) | Kind::PrivateKey | Kind::Jwt | Kind::Password => Family::Secrets,
            Kind::Card | Kind::Iban | Kind::Email | Kind::Phone => Family::Pii,
            Kind::HiddenCharacters
            | Kind::TerminalEscape
            | Kind::ForeignLink
            | Kind::InstructionCue => Family::Injection,
        }
    }

    /// Its name in records and in `[redacted:<name>]`.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Secret(name) => name,
            Kind::PrivateKey => "private_key",
            Kind::Jwt => "jwt",
            Kind::Card => "card_number",
            Kind::Iban => "iban",
            Kind::HiddenCharacters => "hidden_characters",
            Kind::TerminalEscape => "terminal_escape",
            Kind::Password => "password",
            Kind::Email => "email",
            Kind::Phone => "phone",
            Kind::ForeignLink => "foreign_link",
            Kind::InstructionCue => "instruction_cue",
        }
    }

    /// Whether redaction removes it (hidden content) rather than replacing
    /// it with a marker.
    pub fn removed_when_redacted(self) -> bool {
        matches!(self, Kind::HiddenCharacters | Kind::TerminalEscape)
    }
}

/// One finding: its kind and where it is in the text (byte offsets, on
/// character boundaries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// What it is.
    pub kind: Kind,
    /// Where it is.
    pub range: Range<usize>,
}

/// The detectors, built once.
pub struct Scanner {
    /// The secret rules' prefixes, then the PEM and JWT openings.
    prefixes: AhoCorasick,
    /// Searchers of the words every instruction cue holds ([`CUE_ANCHORS`]).
    anchors: Vec<memchr::memmem::Finder<'static>>,
    /// Each cue (lower case), the anchor it holds and where.
    cue_places: Vec<(usize, &'static str, usize)>,
    /// The END line of a PEM block ([`pem_tail`]).
    pem_end: memchr::memmem::Finder<'static>,
    /// Where answers may link and load images from (`screen.link_hosts`):
    /// a name, or `*.name` for its subdomains.
    link_hosts: Vec<String>,
    /// What list answers' definitions held when last read.
    memo: super::memo::ScanMemo,
}

/// Phrases aimed at the model rather than the reader: a small set, each
/// tested, matched as whole words without regard to ASCII case. Their
/// verdict is a flag unless configured otherwise: a page about prompt
/// injection quotes them too.
pub(crate) const CUES: &[&str] = &[
    "ignore previous instructions",
    "ignore all previous instructions",
    "ignore the previous instructions",
    "ignore all prior instructions",
    "ignore the above instructions",
    "disregard previous instructions",
    "disregard all previous instructions",
    "disregard your instructions",
    "forget your instructions",
    "forget all previous instructions",
    "new instructions for the assistant",
    "do not tell the user",
    "don't tell the user",
    "without telling the user",
    "reveal your system prompt",
    "print your system prompt",
];

/// Names whose assigned value is a secret (the password rule), longest
/// first (`client_secret` before `secret`).
pub(super) const ASSIGNED: &[&str] = &[
    "secret_access_key",
    "client_secret",
    "refresh_token",
    "session_token",
    "access_token",
    "secret_key",
    "auth_token",
    "password",
    "api_key",
    "passwd",
    "secret",
    "apikey",
    "pwd",
];

/// Words one of which every cue holds: the text is searched for these
/// (fast, in a lower-cased copy), the cues around them are then compared.
pub(super) const CUE_ANCHORS: [&str; 3] = ["instructions", "the user", "system prompt"];

/// The HTML attributes that load or link a URL (a markdown image's or
/// link's `](` is the other place a URL is rendered).
pub(super) const URL_ATTRIBUTES: [&str; 2] = ["src", "href"];

thread_local! {
    /// The lower-cased copy of the text being scanned (kept between scans
    /// of a serving thread, so no text allocates one).
    static LOWER: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Most bytes [`LOWER`] keeps allocated between scans.
pub(super) const LOWER_KEEP: usize = 256 * 1024;

/// Prefixes after the rules': a PEM block's opening and a JWT's header.
pub(super) const PEM_BEGIN: &str = "-----BEGIN ";
/// A PEM block's END line.
pub(super) const PEM_END: &str = "-----END ";
pub(super) const JWT_HEADER: &str = "eyJ";

impl Scanner {
    /// Builds the prefix automaton.
    ///
    /// # Errors
    /// If the automaton cannot be built (it can, for these few prefixes).
    pub fn new(link_hosts: &[String]) -> Result<Scanner, aho_corasick::BuildError> {
        let patterns = rules::RULES
            .iter()
            .map(|r| r.prefix)
            .chain([PEM_BEGIN, JWT_HEADER]);
        // A DFA: these few prefixes make a small one, and it reads a byte
        // in a few instructions where the default automaton takes several
        // times that (every string of every answer passes it).
        let prefixes = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .kind(Some(aho_corasick::AhoCorasickKind::DFA))
            .build(patterns)?;
        let mut cue_places = Vec::with_capacity(CUES.len());
        for cue in CUES {
            let place = CUE_ANCHORS
                .iter()
                .enumerate()
                .find_map(|(a, anchor)| cue.find(anchor).map(|at| (a, *cue, at)));
            // Every cue holds an anchor (a test checks it); one that did
            // not would never be found, so it is not kept.
            cue_places.extend(place);
        }
        let anchors = CUE_ANCHORS
            .iter()
            .map(|a| memchr::memmem::Finder::new(a.as_bytes()))
            .collect();
        Ok(Scanner {
            prefixes,
            pem_end: memchr::memmem::Finder::new(PEM_END.as_bytes()),
            anchors,
            cue_places,
            link_hosts: link_hosts.iter().map(|h| h.to_ascii_lowercase()).collect(),
            memo: super::memo::ScanMemo::default(),
        })
    }

    /// Every finding in `text`, in order, not overlapping. The detectors
    /// read the text folded ([`normalize::fold`]: compatibility and width
    /// forms folded, default-ignorable characters removed); each finding's
    /// range is the original span it covers. Hidden characters are looked
    /// for in the original.
    pub fn scan(&self, text: &str) -> Vec<Finding> {
        let mut found = Vec::new();
        match normalize::fold(text) {
            None => self.detect(text, &mut found),
            Some(folded) => {
                let mut inner = Vec::new();
                self.detect(&folded.text, &mut inner);
                found.extend(inner.into_iter().map(|f| Finding {
                    kind: f.kind,
                    range: folded.original(&f.range),
                }));
            }
        }
        // Every character that hides text is outside ASCII.
        if !text.is_ascii() {
            hidden(text, &mut found);
        }
        settle(found)
    }

    /// [`Scanner::scan`], remembered for a text read before (a definition
    /// an upstream lists again): the same findings, read once
    /// ([`super::memo`]).
    pub(crate) fn scan_remembered(&self, text: &str) -> Vec<Finding> {
        self.memo.recall(text, |t| self.scan(t))
    }

    /// The detectors but the hidden characters', over a folded text.
    fn detect(&self, text: &str, found: &mut Vec<Finding>) {
        self.secrets(text, found);
        payment::numbers(text, found);
        if text.as_bytes().contains(&0x1b) || text.as_bytes().contains(&0xc2) {
            escapes(text, found);
        }
        emails(text, found);
        phones(text, found);
        self.words(text, found);
    }

    /// Where `text` ends inside a secret rule's token (its prefix and at
    /// least [`CUT_BODY`] bytes of its body, to the end, fewer than the
    /// rule's length): what an event that ends there must not carry, since
    /// its rest may follow in the next one (whose start is then found
    /// across the boundary). Only for a text the caller knows may go on.
    pub fn cut_at_end(&self, text: &str) -> Option<Finding> {
        match normalize::fold(text) {
            None => self.cut_in(text),
            Some(f) => self.cut_in(&f.text).map(|x| Finding {
                kind: x.kind,
                range: f.original(&x.range),
            }),
        }
    }

    /// [`Scanner::cut_at_end`] of a folded text.
    fn cut_in(&self, text: &str) -> Option<Finding> {
        let bytes = text.as_bytes();
        let from = text.len().saturating_sub(96);
        let mut at = from;
        while !text.is_char_boundary(at) {
            at += 1;
        }
        let pem = rules::RULES.len();
        self.prefixes
            .find_iter(text.get(at..)?)
            .map(|m| (m.pattern().as_usize(), at + m.start(), at + m.end()))
            .filter(|(_, start, _)| starts_word(bytes, *start))
            .find_map(|(i, start, end)| {
                let rule = rules::RULES.get(i).filter(|_| i < pem)?;
                let body = bytes.len() - end;
                let admits = bytes.get(end..)?.iter().all(|b| rule.body.admits(*b));
                (admits && body >= CUT_BODY && body < rule.min).then_some(Finding {
                    kind: Kind::Secret(rule.name),
                    range: start..bytes.len(),
                })
            })
    }

    /// Where the trailing run of word characters of `text` starts, when
    /// it may be the first part of a secret rule's token cut there: it
    /// starts with a rule's prefix, or is the start of one (`AK`).
    pub fn open_end(&self, text: &str) -> Option<usize> {
        let bytes = text.as_bytes();
        let floor = bytes.len().saturating_sub(97);
        let mut at = bytes.len();
        while at > floor && is_token_byte(bytes[at - 1]) {
            at -= 1;
        }
        let run = bytes.len() - at;
        // Every rule's prefix starts with one of RULE_INITIALS.
        if run == 0 || run > 96 || !RULE_INITIALS.contains(&bytes[at]) {
            return None;
        }
        let tail = text.get(at..)?;
        rules::RULES
            .iter()
            .any(|r| tail.starts_with(r.prefix) || r.prefix.starts_with(tail))
            .then_some(at)
    }

    /// Whether a string starting with `start` may continue the open end
    /// `end` ([`Scanner::open_end`]) into a rule's token: the rest of a
    /// prefix `end` began, or a body after a whole prefix.
    pub fn may_continue(&self, end: &str, start: &str) -> bool {
        rules::RULES.iter().any(|r| {
            end.starts_with(r.prefix)
                || r.prefix
                    .strip_prefix(end)
                    .is_some_and(|rest| start.starts_with(rest))
        })
    }

    /// A member `name` whose value is `value` (a JSON pair, as
    /// `{"db_password": "…"}`): where in `value` a secret is when the
    /// name names one ([`ASSIGNED`]) and the value looks generated, as the
    /// `password=` rule judges a `name=value` text.
    pub fn assigned(&self, name: &str, value: &str) -> Option<Range<usize>> {
        if name.len() > 128 || !name.is_ascii() || value.len() < 12 {
            return None;
        }
        // Most members name no secret: decided before the pair is built.
        let b = name.as_bytes();
        let named = ASSIGNED.iter().any(|a| {
            b.len() >= a.len() && b[b.len() - a.len()..].eq_ignore_ascii_case(a.as_bytes())
        });
        if !named {
            return None;
        }
        let text = format!("{name}={value}");
        let mut found = Vec::new();
        assignment(&text, name.len(), &mut found);
        let f = found.pop()?;
        let shift = name.len() + 1;
        Some(f.range.start.checked_sub(shift)?..f.range.end.checked_sub(shift)?)
    }

    /// Instruction cues, `password=`-style assignments and images and
    /// links: cues around their anchors; assignments, attributes and
    /// markdown links at the `=`, `:` and `]` they need.
    fn words(&self, text: &str, found: &mut Vec<Finding>) {
        self.cues(text, found);
        let bytes = text.as_bytes();
        // Markers inside a URL already read are not new links.
        let mut read_to = 0;
        for at in memchr::memchr3_iter(b'=', b':', b']', bytes) {
            let link = match bytes[at] {
                b']' if bytes.get(at + 1) == Some(&b'(') => Some((true, at, at + 2)),
                b'=' => attribute(bytes, at).map(|start| (false, start, at + 1)),
                _ => None,
            };
            match link {
                Some((markdown, start, end)) if start >= read_to => {
                    if let Some(to) = self.link(text, markdown, start, end, found) {
                        read_to = to;
                    }
                }
                Some(_) => {}
                None if bytes[at] != b']' => assignment(text, at, found),
                None => {}
            }
        }
    }

    /// The instruction cues ([`CUES`]), without regard to ASCII case, as
    /// whole words.
    fn cues(&self, text: &str, found: &mut Vec<Finding>) {
        let bytes = text.as_bytes();
        LOWER.with(|lower| {
            let Ok(mut lower) = lower.try_borrow_mut() else {
                return;
            };
            lower.clear();
            lower.extend_from_slice(bytes);
            lower.make_ascii_lowercase();
            for (a, finder) in self.anchors.iter().enumerate() {
                for pos in finder.find_iter(&lower) {
                    for (_, cue, off) in self.cue_places.iter().filter(|p| p.0 == a) {
                        let Some(start) = pos.checked_sub(*off) else {
                            continue;
                        };
                        let end = start + cue.len();
                        let whole = lower.get(start..end) == Some(cue.as_bytes())
                            && starts_word(bytes, start)
                            && bytes.get(end).is_none_or(|b| !is_word_byte(*b));
                        if whole {
                            found.push(Finding {
                                kind: Kind::InstructionCue,
                                range: start..end,
                            });
                        }
                    }
                }
            }
            if lower.capacity() > LOWER_KEEP {
                *lower = Vec::new();
            }
        });
    }

    /// A markdown image or link (`![a](url)`, `[a](url)`: `markdown`, the
    /// marker `](` at `start..end`) or an HTML `src=` or `href=` attribute
    /// whose URL names a host outside `link_hosts`; where the URL it read
    /// ends. Relative URLs and bare URLs in prose are not findings: a
    /// client renders (and fetches) only the former kinds.
    fn link(
        &self,
        text: &str,
        markdown: bool,
        start: usize,
        end: usize,
        found: &mut Vec<Finding>,
    ) -> Option<usize> {
        let bytes = text.as_bytes();
        let at = if markdown {
            end
        } else if start > 0 && bytes[start - 1].is_ascii_whitespace() {
            end + usize::from(matches!(bytes.get(end), Some(b'"' | b'\'')))
        } else {
            return None;
        };
        let len = bytes.get(at..).map_or(0, |r| {
            r.iter()
                .take_while(|b| !b" \t\n\r)\"'>".contains(b))
                .count()
        });
        let url = text.get(at..at + len).unwrap_or("");
        if let Some(host) = url_host(url) {
            if !self.link_allowed(&host) {
                found.push(Finding {
                    kind: Kind::ForeignLink,
                    range: at..at + len,
                });
            }
        }
        Some(at + len)
    }

    fn link_allowed(&self, host: &str) -> bool {
        self.link_hosts
            .iter()
            .any(|allowed| match allowed.strip_prefix("*.") {
                Some(parent) => host
                    .strip_suffix(parent)
                    .is_some_and(|sub| sub.ends_with('.') && sub.len() > 1),
                None => host == allowed,
            })
    }

    fn secrets(&self, text: &str, found: &mut Vec<Finding>) {
        for at in self.pem_end.find_iter(text.as_bytes()) {
            pem_tail(text, at, found);
        }
        let bytes = text.as_bytes();
        let pem = rules::RULES.len();
        // Where the last token ended: a token may start right there, glued
        // to it (otherwise the second is found only once the first is
        // redacted: found by the `screen_planted` fuzz target).
        let mut after = None;
        for m in self.prefixes.find_iter(text) {
            if !starts_word(bytes, m.start()) && after != Some(m.start()) {
                continue;
            }
            let hit = match m.pattern().as_usize() {
                i if i < pem => rules::RULES.get(i).and_then(|r| {
                    rule_token(bytes, m.end(), r).map(|end| (Kind::Secret(r.name), end))
                }),
                i if i == pem => pem_block(text, m.start()).map(|end| (Kind::PrivateKey, end)),
                _ => jwt(bytes, m.start()).map(|end| (Kind::Jwt, end)),
            };
            if let Some((kind, end)) = hit {
                after = Some(end);
                found.push(Finding {
                    kind,
                    range: m.start()..end,
                });
            }
        }
    }
}

/// Where `src` or `href` (any case) ends right before the `=` at `eq`:
/// the attribute's start.
pub(super) fn attribute(bytes: &[u8], eq: usize) -> Option<usize> {
    URL_ATTRIBUTES.iter().find_map(|name| {
        let start = eq.checked_sub(name.len())?;
        bytes
            .get(start..eq)?
            .eq_ignore_ascii_case(name.as_bytes())
            .then_some(start)
    })
}

/// A `password=`-style assignment whose `=` or `:` is at `sep`: the name
/// ([`ASSIGNED`], longest first) before it, quotes and spaces between.
pub(super) fn assignment(text: &str, sep: usize, found: &mut Vec<Finding>) {
    let bytes = text.as_bytes();
    let mut name_end = sep;
    while name_end > 0 && matches!(bytes[name_end - 1], b'"' | b'\'' | b' ') {
        name_end -= 1;
    }
    // Every name in ASSIGNED ends in one of these: most `=` and `:` are
    // decided by one byte.
    let last = name_end
        .checked_sub(1)
        .and_then(|i| bytes.get(i))
        .map(u8::to_ascii_lowercase);
    if !matches!(last, Some(b'd' | b'y' | b't' | b'n')) {
        return;
    }
    let named = ASSIGNED.iter().find_map(|name| {
        let start = name_end.checked_sub(name.len())?;
        bytes
            .get(start..name_end)?
            .eq_ignore_ascii_case(name.as_bytes())
            .then_some(start)
    });
    if let Some(start) = named {
        password(text, start, name_end, found);
    }
}

/// A `password=`-style assignment whose name ([`ASSIGNED`], any case,
/// alone or ending an identifier after `_`, `-` or `.`) is at
/// `at..name_end`, then `=` or `:`, quotes allowed, and whose value is at
/// least 12 characters with at least 3.5 bits of entropy per character
/// and not a placeholder.
pub(super) fn password(text: &str, at: usize, name_end: usize, found: &mut Vec<Finding>) {
    let bytes = text.as_bytes();
    // `DB_PASSWORD` and `dbPassword` name one too; `mypassword` is
    // another word.
    let camel = at > 0
        && bytes.get(at).is_some_and(u8::is_ascii_uppercase)
        && bytes.get(at - 1).is_some_and(u8::is_ascii_lowercase);
    if at > 0 && bytes.get(at - 1).is_some_and(u8::is_ascii_alphanumeric) && !camel {
        return;
    }
    let mut j = name_end;
    while matches!(bytes.get(j), Some(b'"' | b'\'' | b' ')) {
        j += 1;
    }
    if !matches!(bytes.get(j), Some(b'=' | b':')) {
        return;
    }
    j += 1;
    while matches!(bytes.get(j), Some(b'"' | b'\'' | b' ')) {
        j += 1;
    }
    let len = bytes.get(j..).map_or(0, |r| {
        r.iter()
            .enumerate()
            .take_while(|(k, b)| {
                b.is_ascii_graphic()
                    && !b"\"',;".contains(b)
                    && !(**b == b'&' && next_param(&r[k + 1..]))
            })
            .count()
    });
    let value = text.get(j..j + len).unwrap_or("");
    if value.len() >= 12 && !placeholder(value) && entropy(value) >= 3.5 {
        found.push(Finding {
            kind: Kind::Password,
            range: j..j + len,
        });
    }
}

/// The host of an absolute `http(s)://` or protocol-relative URL, lower
/// case, without user info or port; `None` for a relative URL.
pub(super) fn url_host(url: &str) -> Option<String> {
    let lower = url.to_ascii_lowercase();
    let rest = ["https://", "http://", "//"]
        .iter()
        .find_map(|p| lower.strip_prefix(p))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = authority.rsplit('@').next().unwrap_or("");
    let host = if host.starts_with('[') {
        host.split(']')
            .next()
            .map(|h| format!("{h}]"))
            .unwrap_or_default()
    } else {
        host.split(':').next().unwrap_or("").to_owned()
    };
    let host = host.trim_end_matches('.').to_owned();
    (!host.is_empty()).then_some(host)
}

/// Whether `rest` (after an `&`) starts a query string's next parameter
/// (`name=`): then the `&` ends the value.
pub(super) fn next_param(rest: &[u8]) -> bool {
    let name = rest
        .iter()
        .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
        .count();
    name > 0 && rest.get(name) == Some(&b'=')
}

/// A value that is not a secret's: a template, a marker, a path or a URL
/// (a redacted value is one of these, so a redacted text screened again
/// finds nothing).
pub(super) fn placeholder(value: &str) -> bool {
    value.starts_with("[redacted:")
        || value.starts_with('/')
        || value.starts_with("./")
        || value.starts_with("~/")
        || value.contains("://")
        || value.starts_with("${")
        || value.starts_with("{{")
        || value.starts_with('<')
        || value.starts_with('%')
        || value.bytes().all(|b| b == b'*' || b == b'x' || b == b'X')
}

/// Shannon entropy of `s`'s bytes, bits per byte.
pub(super) fn entropy(s: &str) -> f64 {
    let mut counts = [0u32; 256];
    for b in s.bytes() {
        counts[usize::from(b)] += 1;
    }
    let n = s.len() as f64;
    counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = f64::from(*c) / n;
            -p * p.log2()
        })
        .sum()
}

/// E-mail addresses: a local part, `@`, and a domain with a dot and a
/// letters-only top-level label.
pub(super) fn emails(text: &str, found: &mut Vec<Finding>) {
    let bytes = text.as_bytes();
    let local = |b: u8| b.is_ascii_alphanumeric() || b"._%+-".contains(&b);
    let domain = |b: u8| b.is_ascii_alphanumeric() || b == b'.' || b == b'-';
    for (at, _) in text.match_indices('@') {
        let start = at - bytes[..at].iter().rev().take_while(|b| local(**b)).count();
        let dlen = bytes[at + 1..].iter().take_while(|b| domain(**b)).count();
        let d = text
            .get(at + 1..at + 1 + dlen)
            .unwrap_or("")
            .trim_end_matches('.');
        let tld_ok = d.rsplit_once('.').is_some_and(|(head, tld)| {
            !head.is_empty() && tld.len() >= 2 && tld.bytes().all(|b| b.is_ascii_alphabetic())
        });
        if start < at && tld_ok {
            found.push(Finding {
                kind: Kind::Email,
                range: start..at + 1 + d.len(),
            });
        }
    }
}

/// Phone numbers in international form: `+`, then 8 to 15 digits, alone or
/// in groups split by single spaces, dashes or dots.
pub(super) fn phones(text: &str, found: &mut Vec<Finding>) {
    let bytes = text.as_bytes();
    for (at, _) in text.match_indices('+') {
        if at > 0 && is_word_byte(bytes[at - 1]) {
            continue;
        }
        let (digits, end) = digit_run(bytes, at + 1, b" -.", &mut []);
        let ends_word = bytes.get(end).is_none_or(|b| !is_word_byte(*b));
        if (8..=15).contains(&digits) && ends_word {
            found.push(Finding {
                kind: Kind::Phone,
                range: at..end,
            });
        }
    }
}

/// Whether a token may start at `at`: nothing word-like right before it.
pub(super) fn starts_word(bytes: &[u8], at: usize) -> bool {
    at == 0
        || bytes
            .get(at - 1)
            .is_none_or(|b| !(b.is_ascii_alphanumeric() || *b == b'_' || *b == b'-'))
}

/// The end of a rule's token whose body starts at `from`, if its length
/// fits and nothing the body admits follows it.
pub(super) fn rule_token(bytes: &[u8], from: usize, rule: &rules::Rule) -> Option<usize> {
    let body = bytes
        .get(from..)?
        .iter()
        .take(rule.max + 1)
        .take_while(|b| rule.body.admits(**b))
        .count();
    (rule.min..=rule.max).contains(&body).then_some(from + body)
}

/// The first bytes of the secret rules' prefixes (a test holds them to
/// [`rules::RULES`]).
pub(super) const RULE_INITIALS: &[u8] = b"Agxsr";

/// A byte of a token's run (what [`starts_word`] does not break).
pub(super) fn is_token_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// Fewest body bytes of a token a text ends inside for [`Scanner::cut_at_end`].
pub(super) const CUT_BODY: usize = 4;

/// A PEM block of a private key starting at `at`: through its END line, or
/// to the end of the text if it was cut off (a partial key is still a key).
pub(super) fn pem_block(text: &str, at: usize) -> Option<usize> {
    let rest = text.get(at..)?;
    let line_end = rest.find('\n').unwrap_or(rest.len()).min(80);
    let header = rest.get(..line_end)?;
    if !header.contains("PRIVATE KEY-----") {
        return None;
    }
    match rest.find("-----END ") {
        Some(end) => {
            let tail = rest.get(end..)?;
            let close = tail
                .get(9..)
                .and_then(|t| t.find("-----"))
                .map_or(tail.len(), |i| 9 + i + 5);
            Some(at + end + close)
        }
        None => Some(text.len()),
    }
}

/// The body of a private key whose BEGIN line is not in this text (it
/// was cut off in an earlier part or event), for the `-----END ` at `at`:
/// base64 lines ending in an `-----END … PRIVATE KEY-----` line, from
/// where the base64 starts (a partial first line included) through the
/// END line.
pub(super) fn pem_tail(text: &str, at: usize, found: &mut Vec<Finding>) {
    let Some(rest) = text.get(at..) else {
        return;
    };
    let line_end = rest.find('\n').map_or(text.len(), |i| at + i);
    let line = &text[at..line_end];
    if !line.contains("PRIVATE KEY-----") {
        return;
    }
    let close = line
        .get(PEM_END.len()..)
        .and_then(|t| t.find("-----"))
        .map_or(line_end, |i| at + PEM_END.len() + i + 5);
    // Back over the base64 lines before it.
    let b64 = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=' | b'\n' | b'\r');
    let bytes = text.as_bytes();
    let mut start = at;
    while start > 0 && b64(bytes[start - 1]) {
        start -= 1;
    }
    let body = bytes[start..at]
        .iter()
        .filter(|b| b.is_ascii_alphanumeric())
        .count();
    if body >= 4 {
        found.push(Finding {
            kind: Kind::PrivateKey,
            range: start..close,
        });
    }
}

/// A JWT starting at `at`: three base64url segments, the first two JSON
/// objects (`eyJ`), the signature at least 16 characters.
pub(super) fn jwt(bytes: &[u8], at: usize) -> Option<usize> {
    let seg = |from: usize| -> usize {
        bytes
            .get(from..)
            .map_or(0, |r| r.iter().take_while(|b| is_b64url(**b)).count())
    };
    let h = seg(at);
    let p_start = at + h + 1;
    if h < 10 || bytes.get(at + h) != Some(&b'.') || !bytes.get(p_start..)?.starts_with(b"eyJ") {
        return None;
    }
    let p = seg(p_start);
    let s_start = p_start + p + 1;
    if p < 10 || bytes.get(p_start + p) != Some(&b'.') {
        return None;
    }
    let s = seg(s_start);
    (s >= 16).then_some(s_start + s)
}

pub(super) fn is_b64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// Digits from `from`, alone or in groups split by single bytes of
/// `seps`: how many digits there are and where the last one ends; the
/// first ones' values go into `values` (as many as it holds).
pub(super) fn digit_run(
    bytes: &[u8],
    from: usize,
    seps: &[u8],
    values: &mut [u8],
) -> (usize, usize) {
    let mut n = 0;
    let mut end = from;
    let mut j = from;
    while let Some(&b) = bytes.get(j) {
        if b.is_ascii_digit() {
            if let Some(v) = values.get_mut(n) {
                *v = b - b'0';
            }
            n += 1;
            j += 1;
            end = j;
        } else if seps.contains(&b) && n > 0 && bytes.get(j + 1).is_some_and(u8::is_ascii_digit) {
            j += 1;
        } else {
            break;
        }
    }
    (n, end)
}

/// A byte that continues a word (letters, digits, `_`).
pub(super) fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Characters that hide text: Unicode tags (U+E0000–E007F), zero-width
/// spaces and joiners where no script needs them (a joiner counts only
/// between ASCII characters: Arabic, Persian, Indic scripts and emoji
/// sequences use them), invisible operators, a byte-order mark inside the
/// text, bidi overrides between ASCII text, and bidi embeddings and
/// isolates between ASCII text in a text without right-to-left script (the
/// "Trojan Source" reordering; the marks, embeddings and isolates that
/// right-to-left text uses are not findings). Neighbouring ones are one
/// finding.
pub(super) fn hidden(text: &str, found: &mut Vec<Finding>) {
    // Right-to-left text embeds and isolates left-to-right runs (a file
    // name, a number) legitimately.
    let rtl = text.chars().any(|c| {
        matches!(c, '\u{0590}'..='\u{08FF}' | '\u{FB1D}'..='\u{FDFF}' | '\u{FE70}'..='\u{FEFC}')
    });
    let mut run: Option<Range<usize>> = None;
    let mut prev: Option<char> = None;
    let mut chars = text.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        let next = chars.peek().map(|(_, n)| *n);
        let ascii_around = prev.is_none_or(|p| p.is_ascii()) && next.is_none_or(|n| n.is_ascii());
        let hides = match c {
            '\u{E0000}'..='\u{E007F}' => true,
            '\u{200B}' | '\u{2060}'..='\u{2064}' | '\u{180E}' => true,
            '\u{FEFF}' => at > 0,
            '\u{200C}' | '\u{200D}' => ascii_around,
            '\u{202D}' | '\u{202E}' => ascii_around,
            '\u{202A}'..='\u{202C}' | '\u{2066}'..='\u{2069}' => ascii_around && !rtl,
            _ => false,
        };
        if hides {
            let end = at + c.len_utf8();
            run = Some(match run {
                Some(r) if r.end == at => r.start..end,
                Some(r) => {
                    found.push(Finding {
                        kind: Kind::HiddenCharacters,
                        range: r,
                    });
                    at..end
                }
                None => at..end,
            });
        }
        prev = Some(c);
    }
    if let Some(r) = run {
        found.push(Finding {
            kind: Kind::HiddenCharacters,
            range: r,
        });
    }
}

/// Terminal escapes: ESC (or the one-character CSI, U+009B) and the
/// sequence it starts — a control sequence through its final byte, an
/// operating-system command through BEL or ESC `\`, else ESC and the next
/// character.
pub(super) fn escapes(text: &str, found: &mut Vec<Finding>) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let (csi_from, start) = match bytes[i] {
            0x1b => match bytes.get(i + 1) {
                Some(b'[') => (Some(i + 2), i),
                Some(b']') => {
                    let end = osc_end(bytes, i + 2);
                    found.push(Finding {
                        kind: Kind::TerminalEscape,
                        range: i..end,
                    });
                    i = end;
                    continue;
                }
                Some(b) if (0x20..0x7f).contains(b) => {
                    found.push(Finding {
                        kind: Kind::TerminalEscape,
                        range: i..i + 2,
                    });
                    i += 2;
                    continue;
                }
                _ => (None, i),
            },
            0xc2 if bytes.get(i + 1) == Some(&0x9b) => (Some(i + 2), i),
            _ => (None, i),
        };
        match csi_from {
            Some(from) => {
                let mut j = from;
                while j < bytes.len() && (0x20..=0x3f).contains(&bytes[j]) {
                    j += 1;
                }
                let end = if j < bytes.len() && (0x40..=0x7e).contains(&bytes[j]) {
                    j + 1
                } else {
                    j
                };
                found.push(Finding {
                    kind: Kind::TerminalEscape,
                    range: start..end,
                });
                i = end.max(i + 1);
            }
            None if bytes[i] == 0x1b => {
                found.push(Finding {
                    kind: Kind::TerminalEscape,
                    range: i..i + 1,
                });
                i += 1;
            }
            None => i += 1,
        }
    }
}

/// Where an operating-system command that starts at `from` ends: after BEL
/// or ESC `\`, else at the end of the text.
pub(super) fn osc_end(bytes: &[u8], from: usize) -> usize {
    let mut j = from;
    while j < bytes.len() {
        match bytes[j] {
            0x07 => return j + 1,
            0x1b if bytes.get(j + 1) == Some(&b'\\') => return j + 2,
            _ => j += 1,
        }
    }
    bytes.len()
}

/// Findings whose actions can differ: a family's, with e-mail addresses
/// and phone numbers apart (they are only ever flagged).
pub(super) fn action_class(kind: Kind) -> usize {
    match (kind.family(), kind) {
        (Family::Secrets, _) => 0,
        (Family::Pii, Kind::Email | Kind::Phone) => 1,
        (Family::Pii, _) => 2,
        (Family::Injection, _) => 3,
    }
}

/// Sorts findings by where they start; overlapping findings of one
/// [`action_class`] become one (the earlier, then the longer, gives its
/// kind; the span is their union). Findings of classes whose actions can
/// differ are all kept, overlapping or not: an unterminated terminal
/// escape (flagged) spanning a key (redacted) must not shadow the key
/// (found by the `screen_planted` fuzz target), nor a finding's tail pass
/// because a shorter one of its class started first.
pub(crate) fn settle(mut found: Vec<Finding>) -> Vec<Finding> {
    found.sort_by(|a, b| {
        a.range
            .start
            .cmp(&b.range.start)
            .then(b.range.end.cmp(&a.range.end))
    });
    let mut kept: Vec<Finding> = Vec::with_capacity(found.len());
    let mut last = [None::<usize>; 4];
    for f in found {
        let class = action_class(f.kind);
        let open = last[class]
            .and_then(|i| kept.get_mut(i))
            .filter(|k| f.range.start < k.range.end);
        match open {
            Some(k) => k.range.end = k.range.end.max(f.range.end),
            None => {
                last[class] = Some(kept.len());
                kept.push(f);
            }
        }
    }
    kept
}

/// `text` with each of `findings` (from [`Scanner::scan`] of that text,
/// in order of their starts; they may overlap) replaced by
/// `[redacted:<name>]`, or removed where it hides content: every byte of
/// every finding is gone.
pub(crate) fn redact(text: &str, findings: &[Finding]) -> String {
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for f in findings {
        if f.range.end <= at || f.range.end > text.len() {
            continue;
        }
        let start = f.range.start.max(at);
        let Some(before) = text.get(at..start) else {
            continue;
        };
        out.push_str(before);
        if !f.kind.removed_when_redacted() {
            out.push_str("[redacted:");
            out.push_str(f.kind.name());
            out.push(']');
        }
        at = f.range.end;
    }
    out.push_str(text.get(at..).unwrap_or(""));
    out
}
