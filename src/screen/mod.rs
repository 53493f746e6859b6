//! Content screening's detectors (issue 33, first part): what a text the
//! upstream sent holds that a model should not see or should not trust —
//! secrets by their documented prefixes (the rules are data, in
//! [`rules`]), PEM private keys (also inside a service-account JSON file),
//! JWTs and `password=`-style assignments with a generated-looking value;
//! payment card numbers (Luhn, a card network's first digit), IBANs
//! (mod 97), e-mail addresses and international phone numbers; hidden
//! characters (Unicode tags, zero-width and bidi controls used to hide
//! text), terminal escapes, images and links to hosts outside
//! `screen.link_hosts`, and a small set of phrases aimed at the model
//! ([`CUES`]). One linear pass per kind over the text. Only where a
//! finding is (its range), never its text, leaves this module besides
//! [`redact`]'s output. It is not a model-based classifier: what it does
//! not know by shape, it does not find.
//!
//! What screening does with findings (flag, redact, block), per upstream
//! and tool, and the run's labels, are the answer path's decisions; this
//! module only finds.

pub(crate) mod content;
mod memo;
pub(crate) mod normalize;
mod payment;
pub(crate) mod rules;
mod scanner;
#[cfg(test)]
#[path = "screen_tests.rs"]
mod tests;
pub use self::scanner::*;
