//! Numbers in tool arguments that every reader of the body reads alike.
//!
//! The policy (CEL conditions), the input-schema check and the approval hash
//! see arguments as `serde_json` values, where an integer is an `i64` /
//! `u64` and anything else an `f64`. An upstream may read the same text with
//! a big-number or exact-decimal decoder (Java's `BigDecimal`, Python's
//! `int`, Go's `json.Number`). Where the two could disagree, the firewall
//! would decide on one value and the upstream act on another:
//! `{"replicas": 10.0000000000000000001}` passes `replicas <= 10` as a double
//! and is more than 10 to an exact reader; two calls differing past 2^53
//! would share one approval.
//!
//! So a number is accepted only when its value is exact in the model:
//! - an integer (no fraction, no exponent) within `i64` or `u64`;
//! - any other number with at most [`MAX_SIGNIFICANT_DIGITS`] significant
//!   digits and a finite, non-underflowing double value. Decimals of up to
//!   15 significant digits map to distinct doubles, in order, so comparisons
//!   and equality between them mean what the text says.
//!
//! Anything else is refused as invalid arguments, before any decision.

/// Most significant digits of a non-integer number (the decimal precision
/// every double preserves).
pub const MAX_SIGNIFICANT_DIGITS: usize = 15;

/// The first number in `json` (a valid JSON text) whose value the firewall
/// cannot hold exactly, with why. Strings are skipped, so digits inside them
/// are not numbers.
pub fn first_inexact(json: &str) -> Option<String> {
    let b = json.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'"' => {
                i += 1;
                while i < b.len() {
                    match b[i] {
                        b'\\' => i += 2,
                        b'"' => break,
                        _ => i += 1,
                    }
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += 1;
                while i < b.len() && matches!(b[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-')
                {
                    i += 1;
                }
                let number = json.get(start..i).unwrap_or_default();
                if let Some(why) = inexact(number) {
                    return Some(why);
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// A number's exact value, whatever its spelling: `42`, `42.0`, `4.2e1` and
/// `420e-1` are one value; `0.1` and `0.10000000000000001` are two (a
/// double cannot tell them apart, an exact reader can).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decimal {
    /// True for values below zero (zero has no sign: `-0` is `0`).
    negative: bool,
    /// The significant digits, without leading or trailing zeros (empty
    /// for zero).
    digits: String,
    /// The power of ten of the last digit.
    exponent: i64,
}

/// The largest integer every reader holds exactly, JavaScript's included
/// (2^53 - 1).
const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

impl Decimal {
    /// The value of `text` when it is a JSON number (`-?int(.frac)?(e±exp)?`,
    /// no leading zeros, no `+`, no spaces); `None` otherwise, and for an
    /// exponent too large to be meant.
    pub fn parse(text: &str) -> Option<Decimal> {
        let (negative, rest) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (mantissa, exponent) = match rest.find(['e', 'E']) {
            Some(at) => (&rest[..at], Some(&rest[at + 1..])),
            None => (rest, None),
        };
        let (int, frac) = match mantissa.split_once('.') {
            Some((int, frac)) => (int, Some(frac)),
            None => (mantissa, None),
        };
        let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !all_digits(int) || (int.len() > 1 && int.starts_with('0')) {
            return None;
        }
        if frac.is_some_and(|f| !all_digits(f)) {
            return None;
        }
        let frac = frac.unwrap_or_default();
        let digits = format!("{int}{frac}");
        let significant = digits.trim_start_matches('0');
        if significant.is_empty() {
            // Zero, whatever its exponent (which must still be a number).
            let exponent_ok =
                exponent.is_none_or(|e| all_digits(e.strip_prefix(['+', '-']).unwrap_or(e)));
            return exponent_ok.then(|| Decimal {
                negative: false,
                digits: String::new(),
                exponent: 0,
            });
        }
        let stated: i64 = match exponent {
            None => 0,
            Some(e) => {
                let unsigned = e.strip_prefix(['+', '-']).unwrap_or(e);
                if !all_digits(unsigned) {
                    return None;
                }
                // Past 18 digits no value is meant (and i64 would overflow).
                let unsigned = unsigned.trim_start_matches('0');
                if unsigned.len() > 18 {
                    return None;
                }
                let magnitude: i64 = if unsigned.is_empty() {
                    0
                } else {
                    unsigned.parse().ok()?
                };
                if e.starts_with('-') {
                    -magnitude
                } else {
                    magnitude
                }
            }
        };
        let trimmed = significant.trim_end_matches('0');
        let trailing = i64::try_from(significant.len() - trimmed.len()).ok()?;
        let frac_len = i64::try_from(frac.len()).ok()?;
        Some(Decimal {
            negative,
            digits: trimmed.to_owned(),
            exponent: stated.checked_sub(frac_len)?.checked_add(trailing)?,
        })
    }

    /// The exact value of a number as `serde_json` holds it: an integer as
    /// itself, a double as the shortest decimal that reads back as it
    /// (which, for the at most 15 significant digits [`first_inexact`]
    /// lets through, is the decimal the body spelled).
    pub fn of(number: &serde_json::Number) -> Option<Decimal> {
        Decimal::parse(&number.to_string())
    }

    /// Whether the value lies within ±(2^53 - 1), where every reader
    /// (JavaScript's `Number` too) holds an integer exactly.
    pub fn within_safe_range(&self) -> bool {
        let len = i64::try_from(self.digits.len()).unwrap_or(i64::MAX);
        let integer_digits = len.saturating_add(self.exponent);
        if integer_digits <= 15 {
            return true;
        }
        if integer_digits > 16 {
            return false;
        }
        // Sixteen integer digits: compare the integer part exactly.
        let mut integer: String = self.digits.chars().take(16).collect();
        while integer.len() < 16 {
            integer.push('0');
        }
        let has_fraction = self.exponent < 0;
        match integer.parse::<u64>() {
            Ok(v) => v < MAX_SAFE_INTEGER || (v == MAX_SAFE_INTEGER && !has_fraction),
            Err(_) => false,
        }
    }
}

/// Why one JSON number token is not exact in the model, if it is not.
fn inexact(number: &str) -> Option<String> {
    let integer = !number.contains(['.', 'e', 'E']);
    if integer {
        if number.parse::<i64>().is_ok() || number.parse::<u64>().is_ok() {
            return None;
        }
        return Some(format!(
            "the integer {number} is outside the 64-bit range; send it as a string"
        ));
    }
    let mantissa = number
        .trim_start_matches('-')
        .split(['e', 'E'])
        .next()
        .unwrap_or_default();
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let significant = digits.trim_start_matches('0').trim_end_matches('0').len();
    if significant > MAX_SIGNIFICANT_DIGITS {
        return Some(format!(
            "the number {number} has {significant} significant digits; at most {MAX_SIGNIFICANT_DIGITS} are exact (send it as a string)"
        ));
    }
    match number.parse::<f64>() {
        Ok(v)
            if v.is_finite()
                && (v.abs() >= f64::MIN_POSITIVE || (v == 0.0 && significant == 0)) =>
        {
            None
        }
        // Below the smallest normal double, precision falls with the
        // exponent: 9659199e-329 reads as 1e-322.
        Ok(v) if v.is_finite() => Some(format!(
            "the number {number} is too small for a double to hold exactly; send it as a string"
        )),
        _ => Some(format!(
            "the number {number} is outside the range of a double; send it as a string"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ordinary_numbers_are_exact() {
        for ok in [
            r#"{"a":1,"b":-7,"c":0.5,"d":1e3,"e":0,"f":-0.0,"g":123456789012345}"#,
            r#"{"big":18446744073709551615,"neg":-9223372036854775808}"#,
            r#"{"s":"99999999999999999999999999","x":[1.25,2.5e-3]}"#,
            r#"{"trailing":1.50000000000000000000000}"#,
        ] {
            assert_eq!(first_inexact(ok), None, "{ok}");
        }
    }

    #[test]
    fn integers_past_64_bits_are_refused() {
        let why = first_inexact(r#"{"id":18446744073709551616}"#).expect("refused");
        assert!(why.contains("64-bit"), "{why}");
        assert!(first_inexact(r#"{"id":-9223372036854775809}"#).is_some());
    }

    #[test]
    fn decimals_past_double_precision_are_refused() {
        let why = first_inexact(r#"{"replicas":10.0000000000000000001}"#).expect("refused");
        assert!(why.contains("significant digits"), "{why}");
        assert!(first_inexact(r#"{"a":[0.10000000000000001]}"#).is_some());
        assert!(first_inexact(r#"{"a":1e400}"#).is_some());
        assert!(first_inexact(r#"{"a":1e-400}"#).is_some());
        // Found by the mcp_headers fuzz target: a subnormal double holds
        // fewer than 15 digits, so an exact reader and the policy would
        // see two values.
        let why = first_inexact(r#"{"a":9659199e-329}"#).expect("refused");
        assert!(why.contains("too small"), "{why}");
        assert!(first_inexact(r#"{"a":-2.5e-310}"#).is_some());
        assert_eq!(first_inexact(r#"{"a":3e-308}"#), None);
        assert_eq!(first_inexact(r#"{"a":0e400}"#), None);
    }

    fn value(text: &str) -> Decimal {
        Decimal::parse(text).unwrap_or_else(|| panic!("{text} is a number"))
    }

    #[test]
    fn spellings_of_one_value_are_one_decimal() {
        for same in [
            &[
                "42", "42.0", "4.2e1", "4.2E+1", "420e-1", "0.42e2", "42.000e0",
            ][..],
            &["0", "-0", "0.0", "0e999999", "-0.000e-3"],
            &["-1.5", "-15e-1", "-0.15E1"],
            &["1e23", "100000000000000000000000"],
        ] {
            for text in same {
                assert_eq!(value(text), value(same[0]), "{text} and {}", same[0]);
            }
        }
        for (a, b) in [
            ("0.1", "0.10000000000000001"),
            ("4503599627370496", "4503599627370495.5"),
            ("42", "-42"),
            ("1e2", "1e-2"),
        ] {
            assert_ne!(value(a), value(b), "{a} and {b}");
        }
    }

    #[test]
    fn only_json_numbers_are_decimals() {
        for bad in [
            "",
            "-",
            "+1",
            "01",
            "-01",
            "1.",
            ".5",
            "1e",
            "1e+",
            "0x10",
            "1_000",
            " 1",
            "1 ",
            "inf",
            "NaN",
            "1.5.2",
            "1e5e5",
            "1e1234567890123456789",
            "١",
        ] {
            assert_eq!(Decimal::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_double_reads_as_the_decimal_it_was_written_as() {
        for text in [
            "0.1",
            "123456789012345",
            "1.23456789012345e-300",
            "-2.5",
            "1e23",
        ] {
            let number: serde_json::Number = serde_json::from_str(text).expect("a number");
            assert_eq!(Decimal::of(&number), Some(value(text)), "{text}");
        }
    }

    #[test]
    fn the_safe_range_is_exact_at_its_edge() {
        for ok in [
            "9007199254740991",
            "-9007199254740991",
            "9007199254740990.5",
            "0.5",
            "1e15",
        ] {
            assert!(value(ok).within_safe_range(), "{ok}");
        }
        for out in [
            "9007199254740992",
            "9007199254740991.5",
            "-9007199254740992",
            "1e16",
            "1e300",
        ] {
            assert!(!value(out).within_safe_range(), "{out}");
        }
    }

    #[test]
    fn digits_inside_strings_are_not_numbers() {
        assert_eq!(
            first_inexact(r#"{"q":"select 1.00000000000000000000001 \" 99999999999999999999999"}"#),
            None
        );
    }
}
