//! How values the file writes as text are read: durations (`5m`, `90s`,
//! `1h 30m`), networks and moments (RFC 3339).

use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Durations are written as `5m`, `90s`, `1h 30m`.
pub(crate) fn duration<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(deserializer)?;
    humantime::parse_duration(&text).map_err(|e| serde::de::Error::custom(format!("`{text}`: {e}")))
}

pub(crate) fn optional_duration<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Duration>, D::Error> {
    Option::<String>::deserialize(deserializer)?
        .map(|text| {
            humantime::parse_duration(&text).map_err(|e| serde::de::Error::custom(format!("`{text}`: {e}")))
        })
        .transpose()
}

/// `10.0.0.0/8` or a single address `10.1.2.3`.
pub(crate) fn networks<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Vec<ipnet::IpNet>, D::Error> {
    Vec::<String>::deserialize(deserializer)?
        .into_iter()
        .map(|text| {
            text.parse::<ipnet::IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
                .map_err(|_| serde::de::Error::custom(format!("`{text}` is not an IP address or CIDR")))
        })
        .collect()
}

/// A moment, written as RFC 3339 text (`2027-03-01T09:00:00Z`).
pub(crate) fn rfc3339<'de, D: Deserializer<'de>>(deserializer: D) -> Result<time::OffsetDateTime, D::Error> {
    let text = String::deserialize(deserializer)?;
    time::OffsetDateTime::parse(&text, &time::format_description::well_known::Rfc3339).map_err(|e| {
        serde::de::Error::custom(format!(
            "`{text}` is not an RFC 3339 time such as 2027-03-01T09:00:00Z: {e}"
        ))
    })
}
