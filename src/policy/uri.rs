//! Resource URIs as policy rules compare them: RFC 3986 §6.2.2
//! normalization, and refusal of URIs whose normalization is ambiguous.
//!
//! A rule and a request name the same resource only if they agree after
//! [`normalize`]: the scheme and host lower-cased, percent-encodings of
//! unreserved characters decoded (others with upper-case hex digits), dot
//! segments removed from the path (§5.2.4, after decoding, so `%2e%2e` is
//! `..`) and an empty port dropped. Default ports are kept as written.
//!
//! What different readers of a URI could take for different resources is
//! refused rather than guessed at: `%2F` in the path (a separator or not),
//! a backslash, literal or `%5C` (a separator on some systems), NUL, literal
//! or `%00`, any other ASCII control character, a `%` without two hex
//! digits, more than one `@` in the authority, and a path without an
//! authority that would start with `//` once its dot segments are gone.
//!
//! Everything else is left as written: non-ASCII characters stay UTF-8 (no
//! Unicode normalization), percent-encodings of anything but unreserved
//! ASCII stay encoded, and a rootless path (`secret:db-password`,
//! `urn:x:y`) only has its percent-encodings normalized.

use std::fmt;

/// Why a URI cannot be matched safely.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UriError {
    /// No `scheme:` before the first `/`, `?` or `#`.
    NoScheme,
    /// The text before the first `:` is not `ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`.
    InvalidScheme,
    /// A literal NUL byte.
    Nul,
    /// A literal ASCII control character other than NUL, at this byte.
    ControlChar { at: usize },
    /// A literal backslash.
    Backslash,
    /// A `%` not followed by two hex digits, at this byte.
    InvalidPercentEncoding { at: usize },
    /// `%00`.
    EncodedNul,
    /// `%5C`.
    EncodedBackslash,
    /// `%2F` in the path.
    EncodedSlash,
    /// More than one `@` in the authority.
    AmbiguousUserinfo,
    /// `[` or `]` in the host other than around a whole IP literal.
    InvalidHost,
    /// A port that is not all digits.
    InvalidPort,
    /// A path without an authority that starts with `//` after dot-segment
    /// removal (it would read back as an authority).
    AmbiguousPath,
    /// The normalized text is not UTF-8 (cannot happen: only ASCII is
    /// decoded; kept so that the conversion needs no `unwrap`).
    InvalidUtf8,
    /// A `file:` URI naming another host than the local one (RFC 8089:
    /// only an empty host or `localhost` is this machine).
    FileHost,
    /// A `file:` URI in a form other than `file:///path`,
    /// `file://localhost/path` or `file:/path`.
    FileForm,
}

impl fmt::Display for UriError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UriError::NoScheme => f.write_str("no scheme"),
            UriError::InvalidScheme => f.write_str(
                "invalid scheme: it must be a letter followed by letters, digits, '+', '-' or '.'",
            ),
            UriError::Nul => f.write_str("NUL in the URI"),
            UriError::ControlChar { at } => write!(f, "control character at byte {at}"),
            UriError::Backslash => f.write_str("backslash in the URI"),
            UriError::InvalidPercentEncoding { at } => {
                write!(f, "invalid percent-encoding at byte {at}")
            }
            UriError::EncodedNul => f.write_str("percent-encoded NUL (%00) in the URI"),
            UriError::EncodedBackslash => {
                f.write_str("percent-encoded backslash (%5C) in the URI is ambiguous")
            }
            UriError::EncodedSlash => {
                f.write_str("percent-encoded '/' (%2F) in the path is ambiguous")
            }
            UriError::AmbiguousUserinfo => {
                f.write_str("more than one '@' in the authority is ambiguous")
            }
            UriError::InvalidHost => {
                f.write_str("invalid host: '[' and ']' may only enclose a whole IP literal")
            }
            UriError::InvalidPort => f.write_str("invalid port: it must be digits only"),
            UriError::AmbiguousPath => f.write_str(
                "path starts with '//' after removing dot segments but the URI has no authority",
            ),
            UriError::InvalidUtf8 => f.write_str("invalid UTF-8 after percent-decoding"),
            UriError::FileHost => {
                f.write_str("a file: URI naming another host than localhost cannot be matched")
            }
            UriError::FileForm => {
                f.write_str("a file: URI must be file:///path, file://localhost/path or file:/path")
            }
        }
    }
}

impl std::error::Error for UriError {}

/// The normalized form of `uri` (RFC 3986 §6.2.2): scheme and host lower-cased,
/// percent-encodings of unreserved characters decoded, other percent-encodings' hex digits upper-cased,
/// dot segments removed (§5.2.4) from the path, empty port dropped.
pub fn normalize(uri: &str) -> Result<String, UriError> {
    check_literal_bytes(uri)?;
    let parts = split(uri)?;
    let mut out = parts.scheme.to_ascii_lowercase();
    out.push(':');
    if let Some(authority) = &parts.authority {
        out.push_str("//");
        out.push_str(&normalize_authority(authority)?);
    }
    out.push_str(&normalize_path(&parts.path, parts.authority.is_some())?);
    if let Some(query) = &parts.query {
        out.push('?');
        out.push_str(&normalize_percent(query, Part::Other)?);
    }
    if let Some(fragment) = &parts.fragment {
        out.push('#');
        out.push_str(&normalize_percent(fragment, Part::Other)?);
    }
    if out.starts_with("file:") {
        return file_form(&out);
    }
    Ok(out)
}

/// A normalized `file:` URI in the one form rules compare (RFC 8089):
/// `file:///path`. `file://localhost/path` (the host in any case) and
/// `file:/path` name the same file, and so do paths with repeated `/`
/// (`//etc//shadow` is `/etc/shadow` to the system that opens it);
/// another host and a relative or empty path are refused.
fn file_form(normalized: &str) -> Result<String, UriError> {
    let rest = normalized.get("file:".len()..).unwrap_or("");
    let path = match rest.strip_prefix("//") {
        Some(after) => {
            let host_end = after.find(['/', '?', '#']).unwrap_or(after.len());
            let (host, path) = after.split_at(host_end);
            if !(host.is_empty() || host == "localhost") {
                return Err(UriError::FileHost);
            }
            path
        }
        None => rest,
    };
    if !path.starts_with('/') {
        return Err(UriError::FileForm);
    }
    let end = path.find(['?', '#']).unwrap_or(path.len());
    let (p, rest) = path.split_at(end);
    let mut out = String::with_capacity(normalized.len());
    out.push_str("file://");
    for c in p.chars() {
        if !(c == '/' && out.ends_with('/') && out.len() > "file://".len()) {
            out.push(c);
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// A piece of the URI and the byte offset where it starts (for errors).
#[derive(Debug, Clone, Copy)]
struct Piece<'a> {
    text: &'a str,
    at: usize,
}

/// A URI split into its RFC 3986 components (§3), not yet normalized.
#[derive(Debug)]
struct Parts<'a> {
    scheme: &'a str,
    authority: Option<Piece<'a>>,
    path: Piece<'a>,
    query: Option<Piece<'a>>,
    fragment: Option<Piece<'a>>,
}

/// Which component a percent-encoded piece belongs to: the rules differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Part {
    /// The host: lower-cased.
    Host,
    /// The path: `%2F` refused.
    Path,
    /// Userinfo, query, fragment.
    Other,
}

/// Refuses literal NUL, other ASCII control characters and backslashes.
fn check_literal_bytes(uri: &str) -> Result<(), UriError> {
    for (at, b) in uri.bytes().enumerate() {
        match b {
            0 => return Err(UriError::Nul),
            b'\\' => return Err(UriError::Backslash),
            b if b.is_ascii_control() => return Err(UriError::ControlChar { at }),
            _ => {}
        }
    }
    Ok(())
}

/// `s` split before the first character in `delims` (the second part
/// starts with it, or is empty when there is none).
fn split_before<'a>(s: &'a str, delims: &[char]) -> (&'a str, &'a str) {
    match s.find(delims) {
        Some(i) => s.split_at_checked(i).unwrap_or((s, "")),
        None => (s, ""),
    }
}

/// Whether `scheme` is `ALPHA *( ALPHA / DIGIT / "+" / "-" / "." )`.
fn is_valid_scheme(scheme: &str) -> bool {
    let mut bytes = scheme.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'))
}

/// Splits `uri` into scheme, authority, path, query and fragment (§3).
fn split(uri: &str) -> Result<Parts<'_>, UriError> {
    let (scheme, rest) = split_before(uri, &[':', '/', '?', '#']);
    let Some(mut rest) = rest.strip_prefix(':') else {
        return Err(UriError::NoScheme);
    };
    if scheme.is_empty() {
        return Err(UriError::NoScheme);
    }
    if !is_valid_scheme(scheme) {
        return Err(UriError::InvalidScheme);
    }
    let mut at = scheme.len() + 1;
    let mut authority = None;
    if let Some(after) = rest.strip_prefix("//") {
        let (text, after) = split_before(after, &['/', '?', '#']);
        authority = Some(Piece { text, at: at + 2 });
        at += 2 + text.len();
        rest = after;
    }
    let (text, mut rest) = split_before(rest, &['?', '#']);
    let path = Piece { text, at };
    at += text.len();
    let mut query = None;
    if let Some(after) = rest.strip_prefix('?') {
        let (text, after) = split_before(after, &['#']);
        query = Some(Piece { text, at: at + 1 });
        at += 1 + text.len();
        rest = after;
    }
    let fragment = rest
        .strip_prefix('#')
        .map(|text| Piece { text, at: at + 1 });
    Ok(Parts {
        scheme,
        authority,
        path,
        query,
        fragment,
    })
}

/// The normalized authority: userinfo percent-normalized, host lower-cased
/// and percent-normalized, an empty port dropped.
fn normalize_authority(authority: &Piece<'_>) -> Result<String, UriError> {
    let mut out = String::with_capacity(authority.text.len());
    let host_port = match authority.text.split_once('@') {
        Some((_, host_port)) if host_port.contains('@') => {
            return Err(UriError::AmbiguousUserinfo);
        }
        Some((userinfo, host_port)) => {
            let userinfo = Piece {
                text: userinfo,
                at: authority.at,
            };
            out.push_str(&normalize_percent(&userinfo, Part::Other)?);
            out.push('@');
            Piece {
                text: host_port,
                at: authority.at + userinfo.text.len() + 1,
            }
        }
        None => *authority,
    };
    let (host, port) = split_host_port(host_port.text)?;
    let host = Piece {
        text: host,
        at: host_port.at,
    };
    out.push_str(&normalize_percent(&host, Part::Host)?);
    if let Some(port) = port.filter(|p| !p.is_empty()) {
        if !port.bytes().all(|b| b.is_ascii_digit()) {
            return Err(UriError::InvalidPort);
        }
        out.push(':');
        out.push_str(port);
    }
    Ok(out)
}

/// `host_port` split into the host (an IP literal keeps its brackets) and
/// the port after `:`, if there is a `:`.
fn split_host_port(host_port: &str) -> Result<(&str, Option<&str>), UriError> {
    if host_port.starts_with('[') {
        let close = host_port.find(']').ok_or(UriError::InvalidHost)?;
        let (host, after) = host_port
            .split_at_checked(close + 1)
            .ok_or(UriError::InvalidHost)?;
        if host.get(1..).is_some_and(|inner| inner.contains('[')) {
            return Err(UriError::InvalidHost);
        }
        return match after.strip_prefix(':') {
            Some(port) => Ok((host, Some(port))),
            None if after.is_empty() => Ok((host, None)),
            None => Err(UriError::InvalidHost),
        };
    }
    let (host, port) = match host_port.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (host_port, None),
    };
    if host.contains(['[', ']']) {
        return Err(UriError::InvalidHost);
    }
    Ok((host, port))
}

/// The normalized path: percent-normalized, then (when it is hierarchical:
/// under an authority, or starting with `/`) without dot segments.
fn normalize_path(path: &Piece<'_>, has_authority: bool) -> Result<String, UriError> {
    let decoded = normalize_percent(path, Part::Path)?;
    if !has_authority && !decoded.starts_with('/') {
        return Ok(decoded);
    }
    let clean = remove_dot_segments(&decoded);
    if !has_authority && clean.starts_with("//") {
        return Err(UriError::AmbiguousPath);
    }
    Ok(clean)
}

/// RFC 3986 §5.2.4 `remove_dot_segments`.
fn remove_dot_segments(path: &str) -> String {
    let mut input = path;
    let mut output = String::with_capacity(path.len());
    while !input.is_empty() {
        if let Some(rest) = input
            .strip_prefix("../")
            .or_else(|| input.strip_prefix("./"))
        {
            input = rest;
        } else if let Some(rest) = strip_dot_segment(input, "/.") {
            input = if rest.is_empty() { "/" } else { rest };
        } else if let Some(rest) = strip_dot_segment(input, "/..") {
            input = if rest.is_empty() { "/" } else { rest };
            pop_last_segment(&mut output);
        } else if input == "." || input == ".." {
            input = "";
        } else {
            let (segment, rest) = split_first_segment(input);
            output.push_str(segment);
            input = rest;
        }
    }
    output
}

/// What follows `dots` (`/.` or `/..`) when it is a whole segment: empty,
/// or starting with `/`.
fn strip_dot_segment<'a>(input: &'a str, dots: &str) -> Option<&'a str> {
    input
        .strip_prefix(dots)
        .filter(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Removes the last segment of `output` and the `/` before it, if any.
fn pop_last_segment(output: &mut String) {
    match output.rfind('/') {
        Some(i) => output.truncate(i),
        None => output.clear(),
    }
}

/// `input` split after its first segment (with its leading `/`, if any).
fn split_first_segment(input: &str) -> (&str, &str) {
    let end = input
        .char_indices()
        .skip(1)
        .find(|&(_, c)| c == '/')
        .map_or(input.len(), |(i, _)| i);
    input.split_at_checked(end).unwrap_or((input, ""))
}

/// Whether `b` is an RFC 3986 unreserved character.
fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

/// The value of an ASCII hex digit.
fn hex_value(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// The upper-case hex digit for the low four bits of `n`.
fn hex_digit(n: u8) -> u8 {
    b"0123456789ABCDEF"
        .get(usize::from(n & 0x0f))
        .copied()
        .unwrap_or(b'0')
}

/// The byte that `%XX` at the start of `bytes` encodes, if it is one.
fn decode_escape(bytes: &[u8]) -> Option<u8> {
    match bytes {
        [b'%', hi, lo, ..] => Some((hex_value(*hi)? << 4) | hex_value(*lo)?),
        _ => None,
    }
}

/// `piece` with unreserved characters decoded, other percent-encodings in
/// upper-case hex, and (for the host) ASCII letters lower-cased; refuses a
/// malformed `%`, `%00`, `%5C` and, in the path, `%2F`.
fn normalize_percent(piece: &Piece<'_>, part: Part) -> Result<String, UriError> {
    let bytes = piece.text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(rest @ [b, ..]) = bytes.get(i..) {
        if *b != b'%' {
            out.push(lower_if_host(*b, part));
            i += 1;
            continue;
        }
        let value =
            decode_escape(rest).ok_or(UriError::InvalidPercentEncoding { at: piece.at + i })?;
        match value {
            0 => return Err(UriError::EncodedNul),
            b'\\' => return Err(UriError::EncodedBackslash),
            b'/' if part == Part::Path => return Err(UriError::EncodedSlash),
            v if is_unreserved(v) => out.push(lower_if_host(v, part)),
            v => out.extend_from_slice(&[b'%', hex_digit(v >> 4), hex_digit(v)]),
        }
        i += 3;
    }
    String::from_utf8(out).map_err(|_| UriError::InvalidUtf8)
}

/// `b` lower-cased if it belongs to the host (only ASCII letters change).
fn lower_if_host(b: u8, part: Part) -> u8 {
    if part == Part::Host {
        b.to_ascii_lowercase()
    } else {
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `normalize(input)`, which must succeed.
    fn ok(input: &str) -> String {
        match normalize(input) {
            Ok(n) => n,
            Err(e) => panic!("{input:?} was refused: {e}"),
        }
    }

    #[test]
    fn examples_from_the_spec() {
        let cases = [
            ("SECRET://db-password", "secret://db-password"),
            ("secret://DB-password", "secret://db-password"),
            ("file:///tmp/../etc/passwd", "file:///etc/passwd"),
            ("file:///%65tc/passwd", "file:///etc/passwd"),
            ("file:///etc/./passwd", "file:///etc/passwd"),
            ("file:///../../etc/passwd", "file:///etc/passwd"),
            ("file:///tmp/%2e%2e/etc/passwd", "file:///etc/passwd"),
            (
                "HTTP://Example.COM:/a/%7euser/%c3%a9",
                "http://example.com/a/~user/%C3%A9",
            ),
            ("file:///etc/passwd", "file:///etc/passwd"),
        ];
        for (input, want) in cases {
            assert_eq!(ok(input), want, "{input}");
        }
    }

    #[test]
    fn refusals_from_the_spec() {
        assert_eq!(
            normalize("file:///etc%2Fpasswd"),
            Err(UriError::EncodedSlash)
        );
        assert_eq!(
            normalize("file:///etc%2fpasswd"),
            Err(UriError::EncodedSlash)
        );
        assert_eq!(
            normalize("file:///etc/passwd%00"),
            Err(UriError::EncodedNul)
        );
        assert_eq!(normalize("file:///etc\\passwd"), Err(UriError::Backslash));
        assert_eq!(
            normalize("file:///etc/%zzpasswd"),
            Err(UriError::InvalidPercentEncoding { at: 12 })
        );
    }

    #[test]
    fn more_refusals() {
        assert_eq!(normalize("file:///etc/passwd\0"), Err(UriError::Nul));
        assert_eq!(
            normalize("file:///etc\n/passwd"),
            Err(UriError::ControlChar { at: 11 })
        );
        assert_eq!(
            normalize("file:///a\x7f"),
            Err(UriError::ControlChar { at: 9 })
        );
        assert_eq!(normalize("file:///a%5cb"), Err(UriError::EncodedBackslash));
        assert_eq!(normalize("file:///a?%5C"), Err(UriError::EncodedBackslash));
        assert_eq!(normalize("file:///a#%00"), Err(UriError::EncodedNul));
        assert_eq!(normalize("/etc/passwd"), Err(UriError::NoScheme));
        assert_eq!(normalize("etc/pass:wd"), Err(UriError::NoScheme));
        assert_eq!(normalize(":x"), Err(UriError::NoScheme));
        assert_eq!(normalize(""), Err(UriError::NoScheme));
        assert_eq!(normalize("1file:x"), Err(UriError::InvalidScheme));
        assert_eq!(normalize("fi_le:x"), Err(UriError::InvalidScheme));
        assert_eq!(normalize("http://a@b@c/"), Err(UriError::AmbiguousUserinfo));
        assert_eq!(normalize("http://h:8a/"), Err(UriError::InvalidPort));
        assert_eq!(normalize("http://h:80:80/"), Err(UriError::InvalidPort));
        assert_eq!(normalize("http://[::1/"), Err(UriError::InvalidHost));
        assert_eq!(normalize("http://[::1]x/"), Err(UriError::InvalidHost));
        assert_eq!(normalize("http://a]b/"), Err(UriError::InvalidHost));
        assert_eq!(normalize("file:/a/..//etc"), Err(UriError::AmbiguousPath));
        assert_eq!(normalize("file:/.//etc"), Err(UriError::AmbiguousPath));
    }

    #[test]
    fn percent_errors_report_the_byte_in_the_whole_uri() {
        let cases = [
            ("s:%", 2),
            ("s:%4", 2),
            ("s://u%g@h", 5),
            ("s://u@h%", 7),
            ("s:/p?q=%", 7),
            ("s:/p?q#f%x1", 8),
            ("s:%é", 2),
            ("s:é%", 4),
        ];
        for (input, at) in cases {
            assert_eq!(
                normalize(input),
                Err(UriError::InvalidPercentEncoding { at }),
                "{input}"
            );
        }
    }

    #[test]
    fn authority() {
        assert_eq!(ok("http://User%3a@Host:8080/"), "http://User%3A@host:8080/");
        assert_eq!(ok("http://%41B.c/"), "http://ab.c/");
        assert_eq!(ok("http://h%C3%A9/"), "http://h%C3%A9/");
        assert_eq!(ok("http://HÉ.COM/"), "http://hÉ.com/");
        assert_eq!(ok("http://[FE80::1%25EN0]:/"), "http://[fe80::1%25en0]/");
        assert_eq!(ok("http://[::1]:443"), "http://[::1]:443");
        assert_eq!(ok("http://h:80/"), "http://h:80/");
        assert_eq!(ok("http://@h/"), "http://@h/");
        assert_eq!(ok("http://h%2Fx/"), "http://h%2Fx/");
        assert_eq!(ok("http://h?q"), "http://h?q");
        assert_eq!(normalize("file://?q"), Err(UriError::FileForm));
    }

    #[test]
    fn paths() {
        assert_eq!(ok("file:///a/b/c/./../../g"), "file:///a/g");
        assert_eq!(ok("file:///a/b/.."), "file:///a/");
        assert_eq!(ok("file:///a/b/."), "file:///a/b/");
        assert_eq!(ok("file:///a/..b/.c"), "file:///a/..b/.c");
        assert_eq!(ok("file:///a//../b"), "file:///a/b");
        assert_eq!(ok("file:/a/../b"), "file:///b");
        assert_eq!(ok("file:///..//etc"), "file:///etc");
        assert_eq!(ok("http://h/.."), "http://h/");
        assert_eq!(ok("http://h"), "http://h");
        assert_eq!(normalize("file:///%2E%2E%2Fx"), Err(UriError::EncodedSlash));
        assert_eq!(ok("file:///a/%2E%2E"), "file:///");
    }

    #[test]
    fn rootless_paths_only_get_percent_normalization() {
        assert_eq!(ok("secret:db-password"), "secret:db-password");
        assert_eq!(ok("URN:X:%79"), "urn:X:y");
        assert_eq!(ok("secret:a/../b"), "secret:a/../b");
        assert_eq!(ok("secret:%2e%2e/b"), "secret:../b");
        assert_eq!(ok("secret:"), "secret:");
    }

    #[test]
    fn query_and_fragment() {
        assert_eq!(ok("s:/p?a=%7e&b=%2f#%41%3a"), "s:/p?a=~&b=%2F#A%3A");
        assert_eq!(ok("s:/p?a/../b#c/./d"), "s:/p?a/../b#c/./d");
        assert_eq!(ok("s:/p?#"), "s:/p?#");
        assert_eq!(ok("s:/p#a#b?c"), "s:/p#a#b?c");
    }

    #[test]
    fn file_uris_have_one_form() {
        for uri in [
            "file:///etc/shadow",
            "file://localhost/etc/shadow",
            "FILE://LOCALHOST/etc/shadow",
            "file:/etc/shadow",
            "file://LocalHost/etc/./shadow",
            "file:/etc/%73hadow",
        ] {
            assert_eq!(ok(uri), "file:///etc/shadow", "{uri}");
        }
        assert_eq!(
            normalize("file://server/etc/shadow"),
            Err(UriError::FileHost)
        );
        assert_eq!(
            normalize("file://user@localhost/etc"),
            Err(UriError::FileHost)
        );
        assert_eq!(normalize("file:etc/shadow"), Err(UriError::FileForm));
        assert_eq!(ok("file:////etc//shadow"), "file:///etc/shadow");
        assert_eq!(normalize("file://"), Err(UriError::FileForm));
    }

    #[test]
    fn non_ascii_is_kept() {
        assert_eq!(ok("file:///tmp/é/../ü"), "file:///tmp/ü");
        assert_eq!(ok("file:///e\u{301}"), "file:///e\u{301}");
    }

    #[test]
    fn error_messages() {
        assert_eq!(
            UriError::EncodedSlash.to_string(),
            "percent-encoded '/' (%2F) in the path is ambiguous"
        );
        assert_eq!(UriError::Nul.to_string(), "NUL in the URI");
        assert_eq!(
            UriError::InvalidPercentEncoding { at: 7 }.to_string(),
            "invalid percent-encoding at byte 7"
        );
        let boxed: Box<dyn std::error::Error> = Box::new(UriError::NoScheme);
        assert_eq!(boxed.to_string(), "no scheme");
    }

    /// Asserts `input` does not panic and, if accepted, that its normal
    /// form is a fixed point with well-formed escapes.
    fn check(input: &str) {
        let Ok(once) = normalize(input) else { return };
        assert_eq!(normalize(&once).as_ref(), Ok(&once), "{input:?}");
        let bytes = once.as_bytes();
        for (i, b) in bytes.iter().enumerate() {
            if *b == b'%' {
                let hex = bytes.get(i + 1..i + 3).unwrap_or_default();
                assert!(
                    hex.len() == 2
                        && hex
                            .iter()
                            .all(|h| h.is_ascii_digit() || h.is_ascii_uppercase()),
                    "{input:?} -> {once:?}"
                );
            }
        }
    }

    /// Every string of up to four symbols from a small alphabet, after a
    /// few prefixes that select each kind of URI.
    #[test]
    fn exhaustive_short_strings() {
        const ALPHABET: [&str; 14] = [
            "%", "2", "e", "F", "/", ".", ":", "@", "[", "]", "?", "#", "A", "é",
        ];
        let prefixes = ["s:", "s:/", "s://", "S://H", ""];
        let n = ALPHABET.len();
        for prefix in prefixes {
            for len in 0..=4u32 {
                for mut code in 0..n.pow(len) {
                    let mut s = String::from(prefix);
                    for _ in 0..len {
                        s.push_str(ALPHABET[code % n]);
                        code /= n;
                    }
                    check(&s);
                }
            }
        }
    }

    /// Longer pseudo-random strings (a fixed xorshift generator, so the
    /// test is deterministic) built from URI-ish fragments.
    #[test]
    fn random_strings() {
        const PIECES: [&str; 30] = [
            "%", "%2e", "%2E", "%2f", "%41", "%7e", "%c3%a9", "%00", "%5c", "%zz", "%é", "/", "//",
            ".", "..", "/../", "/./", ":", "@", "[", "]", "?", "#", "a", "Z", "é", "\\", "\0",
            "\t", "1",
        ];
        let prefixes = ["file://", "file:", "HTTP://", "secret:", "x", ""];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            usize::try_from(state % 1_000_003).unwrap_or(0)
        };
        for _ in 0..50_000 {
            let mut s = String::from(prefixes[next() % prefixes.len()]);
            for _ in 0..next() % 12 {
                s.push_str(PIECES[next() % PIECES.len()]);
            }
            check(&s);
        }
    }
}
