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
        Ok(v) if v.is_finite() && (v != 0.0 || significant == 0) => None,
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
        assert_eq!(first_inexact(r#"{"a":0e400}"#), None);
    }

    #[test]
    fn digits_inside_strings_are_not_numbers() {
        assert_eq!(
            first_inexact(r#"{"q":"select 1.00000000000000000000001 \" 99999999999999999999999"}"#),
            None
        );
    }
}
