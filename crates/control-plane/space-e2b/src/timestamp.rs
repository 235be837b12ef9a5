//! Timestamps on the wire: the REST API and envd both use RFC 3339.

/// `ms` since the Unix epoch as RFC 3339 (UTC, fractional seconds only when needed).
pub fn rfc3339(ms: i64) -> String {
    use time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_owned())
}

/// An RFC 3339 time as ms since the Unix epoch; `None` if it is not one.
pub fn parse_rfc3339_ms(text: &str) -> Option<i64> {
    use time::format_description::well_known::Rfc3339;
    let t = time::OffsetDateTime::parse(text.trim(), &Rfc3339).ok()?;
    i64::try_from(t.unix_timestamp_nanos() / 1_000_000).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_round_trip() {
        assert_eq!(rfc3339(1_764_417_600_500), "2025-11-29T12:00:00.5Z");
        assert_eq!(
            parse_rfc3339_ms("2025-11-29T12:00:00.5Z"),
            Some(1_764_417_600_500)
        );
        assert_eq!(
            parse_rfc3339_ms("2025-11-29T13:00:00+01:00"),
            Some(1_764_417_600_000)
        );
        assert_eq!(parse_rfc3339_ms("noon"), None);
    }
}
