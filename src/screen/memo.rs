//! What the scanner found in a text it has read before: tool, prompt and
//! resource definitions, which an upstream repeats on every list with one
//! of them changed, are scanned once per scanner (per policy) instead of
//! once per answer.
//!
//! Keyed by the text itself, compared byte for byte (no digest whose
//! collision could pass one text off as another); bounded in bytes and
//! emptied when full. Only list answers use it
//! ([`super::content::Recall::Remembered`]): a tool's output is read fresh.

use super::Finding;
use std::collections::HashMap;
use std::sync::Mutex;

/// Texts shorter than this are not scanned at all (the content screen
/// skips them); every other one is remembered: even a short text's scan
/// (folding, six detectors, settling) costs many times its lookup, and a
/// definition's schema is mostly short texts.
pub(crate) const MIN_LEN: usize = 4;

/// Bytes kept, at most: each text, plus [`ENTRY_COST`] for its entry
/// (findings are a few words each).
pub(crate) const MAX_BYTES: usize = 4 << 20;

/// What an entry costs besides its text (the map's slot, two boxes), as
/// counted against [`MAX_BYTES`]: many short texts are bounded too.
const ENTRY_COST: usize = 64;

/// Texts longer than this are not kept (one would crowd out the rest).
const MAX_TEXT: usize = 64 << 10;

/// The texts read and what was found in each.
#[derive(Default)]
pub(crate) struct ScanMemo {
    inner: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    found: HashMap<Box<str>, Box<[Finding]>>,
    bytes: usize,
}

impl ScanMemo {
    /// What was found in `text`, from memory or from `scan` (then kept).
    pub(crate) fn recall(
        &self,
        text: &str,
        scan: impl FnOnce(&str) -> Vec<Finding>,
    ) -> Vec<Finding> {
        if text.len() < MIN_LEN || text.len() > MAX_TEXT {
            return scan(text);
        }
        if let Ok(kept) = self.inner.lock() {
            if let Some(found) = kept.found.get(text) {
                return found.to_vec();
            }
        }
        let found = scan(text);
        if let Ok(mut kept) = self.inner.lock() {
            let cost = text.len() + ENTRY_COST;
            if kept.bytes + cost > MAX_BYTES {
                kept.found.clear();
                kept.bytes = 0;
            }
            kept.bytes += cost;
            kept.found
                .insert(text.into(), found.clone().into_boxed_slice());
        }
        found
    }

    /// Bytes kept (texts and entries).
    #[cfg(test)]
    pub(crate) fn bytes(&self) -> usize {
        self.inner.lock().map_or(0, |k| k.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::screen::Scanner;
    use proptest::prelude::*;

    fn scanner() -> Scanner {
        Scanner::new(&["docs.example.com".to_owned()]).expect("scanner")
    }

    /// Pieces that make findings, and plain ones.
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("ghp_0123456789abcdefghijABCDEFGHIJ012345".to_owned()),
            Just("ignore previous instructions".to_owned()),
            Just("mail bob@example.org".to_owned()),
            Just("card 4111 1111 1111 1111".to_owned()),
            Just("\u{200b}hidden\u{e0041}".to_owned()),
            Just("\u{ff49}gnore previous instructions".to_owned()),
            Just("![x](https://evil.example.net/p.png)".to_owned()),
            "[a-zA-Z0-9 ,.]{0,40}",
        ]
    }

    proptest! {
        /// A remembered scan is the scan: first read, read again, and after
        /// the memory was emptied.
        #[test]
        fn remembered_is_the_scan(parts in proptest::collection::vec(piece(), 0..6)) {
            let s = scanner();
            let text = parts.concat();
            let fresh = s.scan(&text);
            prop_assert_eq!(&s.scan_remembered(&text), &fresh);
            prop_assert_eq!(&s.scan_remembered(&text), &fresh);
            prop_assert_eq!(&scanner().scan_remembered(&text), &fresh);
        }
    }

    #[test]
    fn held_within_its_bound() {
        let memo = ScanMemo::default();
        let mut scans = 0;
        for i in 0..(MAX_BYTES / 1000 + 50) {
            let text = format!("{i:0>1000}");
            memo.recall(&text, |_| {
                scans += 1;
                Vec::new()
            });
            assert!(memo.bytes() <= MAX_BYTES);
        }
        // Read again: from memory (no scan).
        let last = format!("{:0>1000}", MAX_BYTES / 1000 + 49);
        let before = scans;
        memo.recall(&last, |_| {
            scans += 1;
            Vec::new()
        });
        assert_eq!(scans, before, "a text kept is not scanned again");
        // Very short and very long texts are not kept.
        memo.recall("abc", |_| Vec::new());
        let held = memo.bytes();
        memo.recall(&"x".repeat(MAX_TEXT + 1), |_| Vec::new());
        assert_eq!(memo.bytes(), held);
        // Many short texts are bounded by their entries too.
        let memo = ScanMemo::default();
        for i in 0..(MAX_BYTES / ENTRY_COST + 10) {
            memo.recall(&format!("{i:>4}"), |_| Vec::new());
            assert!(memo.bytes() <= MAX_BYTES);
        }
    }
}
