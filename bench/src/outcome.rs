//! What an answer was, and whether it is what the scenario expects from the
//! target.
//!
//! Classification scans the body for a few byte patterns instead of parsing
//! it: a 60 KB `tools/list` parsed as JSON would cost the load generator tens
//! of microseconds per answer and make it the bottleneck. The scan is exact
//! for what the canned upstream and the firewall send (the catalog never
//! contains the key `"error"` or the text `skipped`; see `catalog`), which is
//! all the bench ever talks to.
//!
//! Invariant: every answer maps to exactly one [`Outcome`], and
//! [`Expect::accepts`] is the only judge of success.

use std::fmt;

use memchr::memmem;

/// What one answer was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Outcome {
    /// A single JSON-RPC result (not a tool list).
    Result,
    /// A result the firewall marked as not executed (`skipped`, e.g. past a
    /// run's step cap).
    Skipped,
    /// A `tools/list` result with this many tools.
    Tools(u32),
    /// A single JSON-RPC error with this code.
    RpcError(i32),
    /// A batch answer: how many elements were results and errors.
    Batch {
        /// Elements with a `result`.
        results: u16,
        /// Elements with an `error`.
        errors: u16,
    },
    /// `202 Accepted` without a body.
    Accepted,
    /// Any other HTTP status.
    Status(u16),
    /// A 200 whose body is neither a result nor an error.
    Malformed,
}

/// What a scenario expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// A result.
    Result,
    /// A result, or `skipped` (once step caps exist).
    ResultOrSkipped,
    /// A tool list of exactly this many tools.
    Tools(u32),
    /// A JSON-RPC error with this code.
    Error(i32),
    /// A batch answer with these counts.
    Batch {
        /// Results.
        results: u16,
        /// Errors.
        errors: u16,
    },
}

/// Pattern finders built once (memmem precomputes its tables).
pub struct Classifier {
    error: memmem::Finder<'static>,
    result: memmem::Finder<'static>,
    code: memmem::Finder<'static>,
    skipped: memmem::Finder<'static>,
    schema: memmem::Finder<'static>,
    tools: memmem::Finder<'static>,
}

// === impl Classifier ===

impl Default for Classifier {
    fn default() -> Self {
        Classifier {
            error: memmem::Finder::new(b"\"error\":"),
            result: memmem::Finder::new(b"\"result\":"),
            code: memmem::Finder::new(b"\"code\":"),
            skipped: memmem::Finder::new(b"skipped"),
            schema: memmem::Finder::new(b"\"inputSchema\""),
            tools: memmem::Finder::new(b"\"tools\":["),
        }
    }
}

impl Classifier {
    /// Classifies an answer from its HTTP status and whole body (JSON or SSE).
    pub fn classify(&self, status: u16, body: &[u8]) -> Outcome {
        match status {
            200 => {}
            202 => return Outcome::Accepted,
            s => return Outcome::Status(s),
        }
        let first = body
            .iter()
            .position(|b| !b.is_ascii_whitespace())
            .map(|i| body[i]);
        // An SSE batch answer starts with `event:`/`data:`; look at the
        // first JSON byte of the data instead.
        let json_start = match first {
            Some(b'{') | Some(b'[') => first,
            _ => memmem::find(body, b"data: ")
                .and_then(|i| body.get(i + 6).copied())
                .filter(|b| *b == b'[' || *b == b'{'),
        };
        if json_start == Some(b'[') {
            let errors = self.error.find_iter(body).count();
            let results = self.result.find_iter(body).count();
            return Outcome::Batch {
                results: u16::try_from(results).unwrap_or(u16::MAX),
                errors: u16::try_from(errors).unwrap_or(u16::MAX),
            };
        }
        if let Some(at) = self.error.find(body) {
            let rest = &body[at..];
            return match self.code.find(rest).and_then(|c| parse_int(&rest[c + 7..])) {
                Some(code) => Outcome::RpcError(code),
                None => Outcome::Malformed,
            };
        }
        if self.result.find(body).is_none() {
            return Outcome::Malformed;
        }
        if self.tools.find(body).is_some() {
            let n = self.schema.find_iter(body).count();
            return Outcome::Tools(u32::try_from(n).unwrap_or(u32::MAX));
        }
        if self.skipped.find(body).is_some() {
            return Outcome::Skipped;
        }
        Outcome::Result
    }
}

/// Parses an optionally negative integer after optional spaces.
fn parse_int(b: &[u8]) -> Option<i32> {
    let mut i = b.iter().position(|c| *c != b' ')?;
    let negative = b.get(i) == Some(&b'-');
    if negative {
        i += 1;
    }
    let digits = b[i..].iter().take_while(|c| c.is_ascii_digit()).count();
    if digits == 0 || digits > 9 {
        return None;
    }
    let mut v: i32 = 0;
    for d in &b[i..i + digits] {
        v = v * 10 + i32::from(d - b'0');
    }
    Some(if negative { -v } else { v })
}

// === impl Expect ===

impl Expect {
    /// Whether `outcome` is what was expected.
    pub fn accepts(self, outcome: Outcome) -> bool {
        match (self, outcome) {
            (Expect::Result, Outcome::Result) => true,
            (Expect::ResultOrSkipped, Outcome::Result | Outcome::Skipped) => true,
            (Expect::Tools(n), Outcome::Tools(m)) => n == m,
            (Expect::Error(c), Outcome::RpcError(d)) => c == d,
            (
                Expect::Batch { results, errors },
                Outcome::Batch {
                    results: r,
                    errors: e,
                },
            ) => results == r && errors == e,
            _ => false,
        }
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Outcome::Result => f.write_str("result"),
            Outcome::Skipped => f.write_str("skipped"),
            Outcome::Tools(n) => write!(f, "tools {n}"),
            Outcome::RpcError(c) => write!(f, "rpc error {c}"),
            Outcome::Batch { results, errors } => {
                write!(f, "batch {results} results/{errors} errors")
            }
            Outcome::Accepted => f.write_str("202 accepted"),
            Outcome::Status(s) => write!(f, "http {s}"),
            Outcome::Malformed => f.write_str("malformed"),
        }
    }
}

impl fmt::Display for Expect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Expect::Result => f.write_str("result"),
            Expect::ResultOrSkipped => f.write_str("result or skipped"),
            Expect::Tools(n) => write!(f, "tools {n}"),
            Expect::Error(c) => write!(f, "rpc error {c}"),
            Expect::Batch { results, errors } => {
                write!(f, "batch {results} results/{errors} errors")
            }
        }
    }
}

#[cfg(test)]
#[path = "outcome_tests.rs"]
mod tests;
