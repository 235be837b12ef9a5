//! Timestamps on the wire: the REST API and envd both use RFC 3339.

/// `ms` since the Unix epoch as RFC 3339 (UTC, fractional seconds only when needed).
pub fn rfc3339(ms: i64) -> String {
    use time::format_description::well_known::Rfc3339;
    time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
        .ok()
        .and_then(|t| t.format(&Rfc3339).ok())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_owned())
}
