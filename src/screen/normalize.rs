//! The text the detectors read: compatibility and width folding (NFKC, character by
//! character: fullwidth `ＡＫＩＡ`, mathematical `𝐀`,
//! ligatures) and the default-ignorable characters removed (zero-width
//! spaces and joiners, soft hyphens, variation selectors, bidi controls,
//! Unicode tags), so that a key written with hidden or look-alike
//! characters is the same key. Every byte of the folded text knows the
//! original character it came from, so a finding maps back to the exact
//! original span (hidden characters inside it included) and redaction
//! replaces what the client would have read.

use std::ops::Range;

use unicode_normalization::UnicodeNormalization;

/// A folded text and where each of its bytes came from.
#[derive(Debug)]
pub struct Folded {
    /// The folded text.
    pub text: String,
    /// For each byte of `text`, the original character's byte range.
    from: Vec<(u32, u32)>,
}

impl Folded {
    /// The original range a folded range covers: from the start of the
    /// character its first byte came from to the end of the one its last
    /// byte came from.
    pub fn original(&self, r: &Range<usize>) -> Range<usize> {
        let start = self.from.get(r.start).map_or(0, |f| f.0 as usize);
        let end = r
            .end
            .checked_sub(1)
            .and_then(|last| self.from.get(last))
            .map_or(start, |f| f.1 as usize);
        start..end.max(start)
    }
}

/// Whether `c` is a default-ignorable code point (Unicode's
/// `Default_Ignorable_Code_Point`): invisible, and removed before
/// detection.
pub(crate) fn ignorable(c: char) -> bool {
    matches!(
        c,
        '\u{00AD}'
            | '\u{034F}'
            | '\u{061C}'
            | '\u{115F}'..='\u{1160}'
            | '\u{17B4}'..='\u{17B5}'
            | '\u{180B}'..='\u{180F}'
            | '\u{200B}'..='\u{200F}'
            | '\u{202A}'..='\u{202E}'
            | '\u{2060}'..='\u{206F}'
            | '\u{3164}'
            | '\u{FE00}'..='\u{FE0F}'
            | '\u{FEFF}'
            | '\u{FFA0}'
            | '\u{FFF0}'..='\u{FFF8}'
            | '\u{1BCA0}'..='\u{1BCA3}'
            | '\u{1D173}'..='\u{1D17A}'
            | '\u{E0000}'..='\u{E0FFF}'
    )
}

/// `text` folded for detection; `None` when folding changes nothing (all
/// ASCII, or nothing to fold), so the caller reads `text` itself.
pub fn fold(text: &str) -> Option<Folded> {
    if text.is_ascii() {
        return None;
    }
    let changes = text.chars().any(|c| {
        if c.is_ascii() {
            return false;
        }
        if ignorable(c) {
            return true;
        }
        let mut folded = std::iter::once(c).nfkc();
        folded.next() != Some(c) || folded.next().is_some()
    });
    if !changes {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut from = Vec::with_capacity(text.len());
    for (at, c) in text.char_indices() {
        let span = (at as u32, (at + c.len_utf8()) as u32);
        if c.is_ascii() {
            out.push(c);
            from.push(span);
            continue;
        }
        if ignorable(c) {
            continue;
        }
        for d in std::iter::once(c).nfkc() {
            if ignorable(d) {
                continue;
            }
            out.push(d);
            from.extend(std::iter::repeat_n(span, d.len_utf8()));
        }
    }
    Some(Folded { text: out, from })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ascii_is_left_alone() {
        assert!(fold("AKIA plain").is_none());
        assert!(fold("Grüße, ここ").is_none());
    }

    #[test]
    fn hidden_characters_are_removed_and_wide_forms_folded() {
        let text = "key AKIA\u{200b}IOSF \u{FF21}\u{FF22} \u{1D400}";
        let f = fold(text).unwrap();
        assert_eq!(f.text, "key AKIAIOSF AB A");
        // "AKIAIOSF" in the folded text covers the zero-width space.
        let at = f.text.find("AKIAIOSF").unwrap();
        let r = f.original(&(at..at + 8));
        assert_eq!(&text[r], "AKIA\u{200b}IOSF");
        let at = f.text.find("AB").unwrap();
        assert_eq!(&text[f.original(&(at..at + 2))], "\u{FF21}\u{FF22}");
    }

    #[test]
    fn tags_and_variation_selectors_are_ignorable() {
        let f = fold("a\u{E0041}b\u{FE0F}c\u{00AD}d").unwrap();
        assert_eq!(f.text, "abcd");
    }
}
