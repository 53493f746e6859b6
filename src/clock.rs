//! Wall-clock time as the firewall records it: milliseconds since the Unix
//! epoch (audit rows, approvals, pins), their RFC 3339 rendering for people
//! (messages, the CLI), and the calendar day a row's partition is named by.
//! Calendar arithmetic is the `time` crate's.

use time::format_description::well_known::Rfc3339;
use time::{Duration, OffsetDateTime};

/// Milliseconds since the Unix epoch now (0 if the clock is before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Milliseconds since the epoch as RFC 3339 UTC to the second
/// (`2025-01-01T00:00:00Z`); empty for an instant `time` cannot represent.
pub fn fmt_ms(ms: u64) -> String {
    i64::try_from(ms / 1000)
        .ok()
        .and_then(|s| OffsetDateTime::from_unix_timestamp(s).ok())
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_default()
}

/// The calendar day `days` after 1970-01-01 as `YYYYMMDD` (0 when out of
/// range).
pub(crate) fn yyyymmdd_from_days(days: i64) -> u32 {
    days.checked_mul(86_400)
        .and_then(|s| OffsetDateTime::UNIX_EPOCH.checked_add(Duration::seconds(s)))
        .and_then(|t| {
            let d = t.date();
            let year = u32::try_from(d.year()).ok()?;
            Some(year * 10_000 + u32::from(u8::from(d.month())) * 100 + u32::from(d.day()))
        })
        .unwrap_or(0)
}

/// An instant a person typed, as milliseconds since the epoch: RFC 3339
/// (`2026-12-05T10:00:00Z`), a UTC day (`2026-12-05`: its first
/// millisecond, or with `end_of_day` its last), or milliseconds.
pub(crate) fn parse_instant_ms(text: &str, end_of_day: bool) -> Option<u64> {
    let text = text.trim();
    if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) {
        return text.parse().ok();
    }
    if let Ok(t) = OffsetDateTime::parse(text, &Rfc3339) {
        return u64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok();
    }
    let mut parts = text.splitn(3, '-');
    let year: i32 = parts.next()?.parse().ok()?;
    let month: u8 = parts.next()?.parse().ok()?;
    let day: u8 = parts.next()?.parse().ok()?;
    let date =
        time::Date::from_calendar_date(year, time::Month::try_from(month).ok()?, day).ok()?;
    let start = u64::try_from(date.midnight().assume_utc().unix_timestamp()).ok()? * 1000;
    Some(if end_of_day {
        start + 86_400_000 - 1
    } else {
        start
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milliseconds_render_as_rfc3339_seconds() {
        assert_eq!(fmt_ms(0), "1970-01-01T00:00:00Z");
        assert_eq!(fmt_ms(1_735_689_600_999), "2025-01-01T00:00:00Z");
        // A leap day, and the turn of a century that is a leap year.
        assert_eq!(fmt_ms(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(fmt_ms(4_102_444_799_000), "2099-12-31T23:59:59Z");
    }

    #[test]
    fn days_since_the_epoch_name_their_calendar_day() {
        assert_eq!(yyyymmdd_from_days(0), 19_700_101);
        assert_eq!(yyyymmdd_from_days(11_016), 20_000_229);
        assert_eq!(yyyymmdd_from_days(20_454), 20_260_101);
        assert_eq!(yyyymmdd_from_days(-1), 19_691_231);
        assert_eq!(yyyymmdd_from_days(i64::MAX), 0);
    }

    #[test]
    fn now_is_after_this_code_was_written() {
        assert!(now_ms() > 1_764_547_200_000);
    }

    #[test]
    fn instants_are_read_as_rfc3339_days_or_milliseconds() {
        use super::parse_instant_ms;
        assert_eq!(
            parse_instant_ms("1796500000000", false),
            Some(1_796_500_000_000)
        );
        assert_eq!(parse_instant_ms("1970-01-02", false), Some(86_400_000));
        assert_eq!(
            parse_instant_ms("1970-01-02", true),
            Some(2 * 86_400_000 - 1)
        );
        assert_eq!(
            parse_instant_ms("1970-01-01T00:00:01.5Z", false),
            Some(1_500)
        );
        assert_eq!(parse_instant_ms("yesterday", false), None);
        assert_eq!(parse_instant_ms("2026-02-30", false), None);
    }
}
