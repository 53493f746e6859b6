//! Resource URI normalization: what it accepts it normalizes idempotently
//! (a normalized URI normalizes to itself), never panics, and spellings
//! RFC 3986 (§6.2.2) calls equivalent normalize alike: the scheme or host
//! in upper case, an unreserved character percent-encoded, a
//! percent-encoding's hex digits in lower case, a `./` or `x/../` put in
//! an absolute path. The first byte picks the rewrites, the second where.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mcp_firewall::policy::uri::normalize;

/// `uri` respelled as `ops` says, at about `at`; `None` where a rewrite
/// does not apply.
fn respell(uri: &str, ops: u8, at: u8) -> Option<String> {
    let colon = uri.find(':')?;
    let (scheme, rest) = uri.split_at(colon);
    let mut rest = rest[1..].to_owned();
    let mut scheme = scheme.to_owned();
    if ops & 1 != 0 {
        scheme = scheme.to_ascii_uppercase();
    }
    let authority_end = rest
        .strip_prefix("//")
        .map(|a| 2 + a.find(['/', '?', '#']).unwrap_or(a.len()));
    if ops & 2 != 0 {
        if let Some(end) = authority_end {
            let auth = &rest[2..end];
            // The host only: user information is case-sensitive.
            let host_from = 2 + auth.rfind('@').map_or(0, |i| i + 1);
            let host = rest[host_from..end].to_ascii_uppercase();
            rest.replace_range(host_from..end, &host);
        }
    }
    let path_from = authority_end.unwrap_or(0);
    let path_end = path_from
        + rest[path_from..]
            .find(['?', '#'])
            .unwrap_or(rest.len() - path_from);
    if ops & 4 != 0 {
        // An unreserved character of the path, percent-encoded.
        let path = &rest[path_from..path_end];
        // Not a hex digit of a percent-encoding already there.
        let pb = path.as_bytes();
        let in_escape = |i: usize| (1..=2).any(|k| i >= k && pb[i - k] == b'%');
        let picks: Vec<usize> = path
            .char_indices()
            .filter(|(i, c)| (c.is_ascii_alphanumeric() || "-._~".contains(*c)) && !in_escape(*i))
            .map(|(i, _)| i)
            .collect();
        if !picks.is_empty() {
            let i = path_from + picks[usize::from(at) % picks.len()];
            let c = rest.as_bytes()[i];
            let enc = if ops & 8 != 0 {
                format!("%{c:02x}")
            } else {
                format!("%{c:02X}")
            };
            rest.replace_range(i..i + 1, &enc);
        }
    } else if ops & 8 != 0 {
        // Existing percent-encodings' hex digits in lower case.
        rest = lower_hex(&rest);
    }
    if ops & 0x30 != 0 {
        let path_end = path_from
            + rest[path_from..]
                .find(['?', '#'])
                .unwrap_or(rest.len() - path_from);
        let path = &rest[path_from..path_end];
        if path.starts_with('/') {
            let slashes: Vec<usize> = path.match_indices('/').map(|(i, _)| i).collect();
            let i = path_from + slashes[usize::from(at) % slashes.len()] + 1;
            let insert = if ops & 0x10 != 0 { "./" } else { "x/../" };
            rest.insert_str(i, insert);
        }
    }
    Some(format!("{scheme}:{rest}"))
}

fn lower_hex(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if b[i] == b'%' && i + 2 < s.len() && s.is_char_boundary(i + 3) {
            out.push('%');
            out.push_str(&s[i + 1..i + 3].to_ascii_lowercase());
            i += 3;
            continue;
        }
        let c = s[i..].chars().next().unwrap_or('\0');
        out.push(c);
        i += c.len_utf8();
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let (ops, at, text) = match data {
        [ops, at, rest @ ..] => (*ops, *at, rest),
        _ => return,
    };
    let Ok(text) = std::str::from_utf8(text) else {
        return;
    };
    let Ok(once) = normalize(text) else {
        return;
    };
    let twice = normalize(&once).expect("a normalized URI normalizes");
    assert_eq!(once, twice, "normalization is not idempotent for {text:?}");
    if let Some(other) = respell(text, ops, at) {
        assert_eq!(
            normalize(&other).as_ref(),
            Ok(&once),
            "{text:?} and its equivalent {other:?} normalize apart"
        );
    }
});
