//! The one text form of a time in the API and the audit trail: RFC 3339
//! UTC with exactly six fractional digits, which the record hash covers;
//! and the serde adapters that write and read it.

use serde::{Deserialize, Deserializer, Serializer};
use time::OffsetDateTime;

/// `t` without what its text form cannot hold (below a microsecond).
pub fn truncate_to_micros(t: OffsetDateTime) -> OffsetDateTime {
    let micros = t.microsecond();
    t.replace_nanosecond(micros * 1000).unwrap_or(t)
}

/// RFC 3339 UTC with six fractional digits: the one text form of a time.
pub fn format_micros(t: OffsetDateTime) -> String {
    let t = t.to_offset(time::UtcOffset::UTC);
    let Ok(year) = u32::try_from(t.year()) else {
        return format_micros_with_format(t);
    };
    if year > 9999 {
        return format_micros_with_format(t);
    }
    // Digit by digit: every record's hash formats four times, under the
    // chain lock, and `format!` costs several times as much.
    let mut out = String::with_capacity(27);
    let mut push = |value: u32, width: u32, then: char| {
        for place in (0..width).rev() {
            let digit = value / 10u32.pow(place) % 10;
            out.push(char::from_digit(digit, 10).unwrap_or('0'));
        }
        out.push(then);
    };
    push(year, 4, '-');
    push(u32::from(u8::from(t.month())), 2, '-');
    push(u32::from(t.day()), 2, 'T');
    push(u32::from(t.hour()), 2, ':');
    push(u32::from(t.minute()), 2, ':');
    push(u32::from(t.second()), 2, '.');
    push(t.microsecond(), 6, 'Z');
    out
}

/// [`format_micros`] for any year (the fast path takes 0 to 9999).
fn format_micros_with_format(t: OffsetDateTime) -> String {
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:06}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.microsecond()
    )
}

/// An RFC 3339 time.
pub fn parse_micros(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
}

fn time_from<'de, D: Deserializer<'de>>(text: &str) -> Result<OffsetDateTime, D::Error> {
    parse_micros(text).ok_or_else(|| serde::de::Error::custom(format!("`{text}` is not an RFC 3339 time")))
}

/// A time in its one text form ([`format_micros`]).
pub mod micros {
    use super::*;

    pub fn serialize<S: Serializer>(t: &OffsetDateTime, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_micros(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<OffsetDateTime, D::Error> {
        time_from::<D>(&String::deserialize(d)?)
    }
}

/// An optional time in its one text form, `null` when absent.
pub mod micros_option {
    use super::*;

    pub fn serialize<S: Serializer>(t: &Option<OffsetDateTime>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.serialize_str(&format_micros(*t)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<OffsetDateTime>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| time_from::<D>(&text))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_time_is_formatted_digit_by_digit_as_format_writes_it() {
        let mut seconds: i64 = -62_167_219_200; // 0000-01-01T00:00:00Z
        let last = 253_402_300_799; // 9999-12-31T23:59:59Z
        let mut n: u64 = 1;
        while seconds <= last {
            n = n
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let nanos = (n >> 34) as u32 % 1_000_000_000;
            let t = OffsetDateTime::from_unix_timestamp(seconds)
                .unwrap()
                .replace_nanosecond(nanos)
                .unwrap();
            let offset = time::UtcOffset::from_whole_seconds(((n >> 20) % 86_399) as i32 - 43_199).unwrap();
            for t in [t, t.checked_to_offset(offset).unwrap_or(t)] {
                assert_eq!(
                    format_micros(t),
                    format_micros_with_format(t.to_offset(time::UtcOffset::UTC))
                );
            }
            seconds += 1_000_003 + (n >> 40) as i64;
        }
        let edges = [
            time::macros::datetime!(0000-01-01 00:00:00 UTC),
            time::macros::datetime!(9999-12-31 23:59:59.999999999 UTC),
            time::macros::datetime!(2026-12-01 09:05:03.000042 UTC),
        ];
        let texts: Vec<String> = edges.into_iter().map(format_micros).collect();
        assert_eq!(
            texts,
            [
                "0000-01-01T00:00:00.000000Z",
                "9999-12-31T23:59:59.999999Z",
                "2026-12-01T09:05:03.000042Z"
            ]
        );
    }
}
