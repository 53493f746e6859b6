//! Which MCP revision a request speaks, and the rules that differ by revision.
//!
//! The revision comes from the `MCP-Protocol-Version` header (2025-06-18 and
//! later), else from the per-request `_meta` of the stateless 2026-07-28
//! revision, else from an `initialize` request's `protocolVersion`; with none
//! of them the transport spec says to assume 2025-03-26. Revisions are dates,
//! so they compare as numbers; a value that is not a date is treated as the
//! newest revision, the strictest choice.

use std::fmt;

use http::HeaderMap;
use serde::Deserialize;

use crate::mcp::jsonrpc::Envelope;

/// A protocol revision, `YYYYMMDD`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct ProtocolVersion(u32);

// === impl ProtocolVersion ===

impl ProtocolVersion {
    /// 2025-03-26: streamable HTTP, batches allowed.
    pub(crate) const V2025_03_26: ProtocolVersion = ProtocolVersion(20250326);
    /// 2025-06-18: batches removed, `MCP-Protocol-Version` header.
    pub(crate) const V2025_06_18: ProtocolVersion = ProtocolVersion(20250618);
    /// 2025-11-25: the last session-based revision.
    pub(crate) const V2025_11_25: ProtocolVersion = ProtocolVersion(20251125);
    /// 2026-07-28: stateless, `Mcp-*` headers mirror the body.
    pub(crate) const V2026_07_28: ProtocolVersion = ProtocolVersion(20260728);

    /// Parses `YYYY-MM-DD`; anything else counts as the newest known revision.
    pub(crate) fn parse(s: &str) -> ProtocolVersion {
        let b = s.as_bytes();
        let digits = |r: std::ops::Range<usize>| -> Option<u32> {
            let part = b.get(r)?;
            part.iter().try_fold(0u32, |acc, &c| {
                c.is_ascii_digit().then(|| acc * 10 + u32::from(c - b'0'))
            })
        };
        if b.len() == 10 && b[4] == b'-' && b[7] == b'-' {
            if let (Some(y), Some(m), Some(d)) = (digits(0..4), digits(5..7), digits(8..10)) {
                return ProtocolVersion(y * 10_000 + m * 100 + d);
            }
        }
        ProtocolVersion::V2026_07_28
    }

    /// The revision a request speaks.
    pub(crate) fn of_request(headers: &HeaderMap, env: &Envelope) -> ProtocolVersion {
        if let Some(v) = headers
            .get("mcp-protocol-version")
            .and_then(|v| v.to_str().ok())
        {
            return ProtocolVersion::parse(v.trim());
        }
        if let [m] = env.messages.as_slice() {
            if let Some(v) = m.protocol_version() {
                return ProtocolVersion::parse(&v);
            }
            if m.method.as_deref() == Some("initialize") {
                if let Some(params) = &m.params {
                    #[derive(Deserialize)]
                    struct Init<'a> {
                        #[serde(borrow, rename = "protocolVersion")]
                        version: Option<&'a str>,
                    }
                    if let Ok(Init { version: Some(v) }) =
                        serde_json::from_str::<Init>(params.get())
                    {
                        return ProtocolVersion::parse(v);
                    }
                }
            }
        }
        ProtocolVersion::V2025_03_26
    }

    /// JSON-RPC batches exist only in 2025-03-26.
    pub(crate) fn allows_batches(self) -> bool {
        self < ProtocolVersion::V2025_06_18
    }

    /// The stateless revision (no sessions, `Mcp-*` headers, input-required results).
    pub(crate) fn is_stateless(self) -> bool {
        self >= ProtocolVersion::V2026_07_28
    }
}

impl fmt::Display for ProtocolVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04}-{:02}-{:02}",
            self.0 / 10_000,
            self.0 / 100 % 100,
            self.0 % 100
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_parse_and_order() {
        assert!(ProtocolVersion::parse("2025-03-26") < ProtocolVersion::parse("2025-11-25"));
        assert_eq!(
            ProtocolVersion::parse("2026-07-28"),
            ProtocolVersion::V2026_07_28
        );
        assert_eq!(
            ProtocolVersion::parse("2025-06-18").to_string(),
            "2025-06-18"
        );
    }

    #[test]
    fn garbage_counts_as_newest() {
        assert_eq!(
            ProtocolVersion::parse("latest"),
            ProtocolVersion::V2026_07_28
        );
        assert_eq!(
            ProtocolVersion::parse("2025-0a-26"),
            ProtocolVersion::V2026_07_28
        );
    }

    #[test]
    fn batches_only_in_2025_03_26() {
        assert!(ProtocolVersion::V2025_03_26.allows_batches());
        assert!(!ProtocolVersion::V2025_06_18.allows_batches());
        assert!(!ProtocolVersion::V2026_07_28.allows_batches());
    }
}
