//! Payment data in text: card numbers (13 to 19 digits of a card network,
//! Luhn) and IBANs (a country's length, mod 97), found in one pass over
//! where digit runs start.

use super::{digit_run, is_word_byte, starts_word, Finding, Kind};

/// Card numbers and IBANs, in one pass over where digit runs start (both
/// are there: a card number starts with one, an IBAN's check digits
/// follow its two-letter country code).
pub(super) fn numbers(text: &str, found: &mut Vec<Finding>) {
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut cards_to = 0;
    let mut ibans_to = 0;
    while let Some(d) = bytes
        .get(i..)
        .and_then(|rest| rest.iter().position(u8::is_ascii_digit))
    {
        let d = i + d;
        if d >= 2 && d >= ibans_to + 2 {
            if let Some(end) = iban_at(bytes, d - 2, found) {
                ibans_to = end;
            }
        }
        if d >= cards_to && (d == 0 || !is_word_byte(bytes[d - 1])) {
            cards_to = card_at(bytes, d, found);
        }
        // The rest of this run of digits starts nothing new.
        i = d
            + 1
            + bytes[d + 1..]
                .iter()
                .take_while(|b| b.is_ascii_digit())
                .count();
    }
}

/// A payment card number at `start`: 13 to 19 digits, alone or in groups
/// split by single spaces or dashes, starting with a card network's digit
/// (2–6), passing the Luhn check, not all one digit. Where the digits
/// read end.
fn card_at(bytes: &[u8], start: usize, found: &mut Vec<Finding>) -> usize {
    let mut digits = [0u8; 20];
    let (n, end) = digit_run(bytes, start, b" -", &mut digits);
    let ends_word = bytes.get(end).is_none_or(|b| !is_word_byte(*b));
    if (13..=19).contains(&n) && ends_word && card_like(&digits[..n.min(digits.len())]) {
        found.push(Finding {
            kind: Kind::Card,
            range: start..end,
        });
    }
    end
}

/// Card-shaped digits: a network's first digit (2–6), not all one digit,
/// passing the Luhn check.
fn card_like(digits: &[u8]) -> bool {
    let first = digits.first().copied().unwrap_or(0);
    (2..=6).contains(&first) && digits.iter().any(|d| *d != first) && luhn(digits)
}

/// The Luhn check over `digits` (check digit last).
pub(super) fn luhn(digits: &[u8]) -> bool {
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, d)| {
            let d = u32::from(*d);
            if i % 2 == 1 {
                let x = d * 2;
                if x > 9 {
                    x - 9
                } else {
                    x
                }
            } else {
                d
            }
        })
        .sum();
    sum % 10 == 0
}

/// An IBAN at `i`: a country code, two check digits and the country's
/// length of letters and digits, written solid or in groups of four split
/// by single spaces; valid when the mod-97 check gives 1. Where it ends.
fn iban_at(bytes: &[u8], i: usize, found: &mut Vec<Finding>) -> Option<usize> {
    let head = bytes.get(i..i + 4)?;
    let shaped = head[0].is_ascii_uppercase()
        && head[1].is_ascii_uppercase()
        && head[2].is_ascii_digit()
        && head[3].is_ascii_digit();
    if !shaped || !starts_word(bytes, i) {
        return None;
    }
    let len = iban_length(head[0], head[1])?;
    // What follows must not continue it.
    let mut chars: Vec<u8> = Vec::with_capacity(len);
    let mut j = i;
    while j < bytes.len() && chars.len() < len {
        let b = bytes[j];
        if b.is_ascii_uppercase() || b.is_ascii_digit() {
            chars.push(b);
            j += 1;
        } else if b == b' '
            && !chars.is_empty()
            && bytes
                .get(j + 1)
                .is_some_and(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
        {
            j += 1;
        } else {
            break;
        }
    }
    let ends_word = bytes.get(j).is_none_or(|b| !is_word_byte(*b));
    if chars.len() == len && ends_word && iban_valid(&chars) {
        found.push(Finding {
            kind: Kind::Iban,
            range: i..j,
        });
        return Some(j);
    }
    None
}

/// The countries that issue IBANs and their IBAN lengths (the ISO 13616
/// registry): a candidate of another country or length is not an IBAN,
/// which keeps upper-case hex and ids that pass mod 97 by chance out.
const IBAN_LENGTHS: &[(&str, usize)] = &[
    ("AD", 24),
    ("AE", 23),
    ("AL", 28),
    ("AT", 20),
    ("AZ", 28),
    ("BA", 20),
    ("BE", 16),
    ("BG", 22),
    ("BH", 22),
    ("BR", 29),
    ("BY", 28),
    ("CH", 21),
    ("CR", 22),
    ("CY", 28),
    ("CZ", 24),
    ("DE", 22),
    ("DK", 18),
    ("DO", 28),
    ("EE", 20),
    ("EG", 29),
    ("ES", 24),
    ("FI", 18),
    ("FO", 18),
    ("FR", 27),
    ("GB", 22),
    ("GE", 22),
    ("GI", 23),
    ("GL", 18),
    ("GR", 27),
    ("GT", 28),
    ("HR", 21),
    ("HU", 28),
    ("IE", 22),
    ("IL", 23),
    ("IQ", 23),
    ("IS", 26),
    ("IT", 27),
    ("JO", 30),
    ("KW", 30),
    ("KZ", 20),
    ("LB", 28),
    ("LC", 32),
    ("LI", 21),
    ("LT", 20),
    ("LU", 20),
    ("LV", 21),
    ("MC", 27),
    ("MD", 24),
    ("ME", 22),
    ("MK", 19),
    ("MR", 27),
    ("MT", 31),
    ("MU", 30),
    ("NL", 18),
    ("NO", 15),
    ("PK", 24),
    ("PL", 28),
    ("PS", 29),
    ("PT", 25),
    ("QA", 29),
    ("RO", 24),
    ("RS", 22),
    ("SA", 24),
    ("SC", 31),
    ("SE", 24),
    ("SI", 19),
    ("SK", 24),
    ("SM", 27),
    ("ST", 25),
    ("SV", 28),
    ("TL", 23),
    ("TN", 24),
    ("TR", 26),
    ("UA", 29),
    ("VA", 22),
    ("VG", 24),
    ("XK", 20),
];

/// The IBAN length of the country `a``b`, if it issues IBANs.
fn iban_length(a: u8, b: u8) -> Option<usize> {
    IBAN_LENGTHS
        .iter()
        .find(|(country, _)| country.as_bytes() == [a, b])
        .map(|(_, len)| *len)
}

/// ISO 13616's check: the country's length, then the first four
/// characters moved to the end, letters
/// as 10–35, the number mod 97 is 1.
pub(super) fn iban_valid(chars: &[u8]) -> bool {
    let fits = match chars {
        [a, b, ..] => iban_length(*a, *b) == Some(chars.len()),
        _ => false,
    };
    if !fits {
        return false;
    }
    let (head, rest) = chars.split_at(4);
    let mut r: u32 = 0;
    for &c in rest.iter().chain(head) {
        let v = if c.is_ascii_digit() {
            u32::from(c - b'0')
        } else if c.is_ascii_uppercase() {
            u32::from(c - b'A') + 10
        } else {
            return false;
        };
        r = if v >= 10 {
            (r * 100 + v) % 97
        } else {
            (r * 10 + v) % 97
        };
    }
    r == 1
}
