//! Durations and times as people type them on the command line: `--delay 15m`,
//! `--timeout 1h30m` (`sked_types::duration`), `--at 2030-01-02T03:04:05Z`.

use chrono::{DateTime, Utc};

pub use sked_types::duration::parse_duration;

/// Parses an RFC 3339 time (`2030-01-02T03:04:05Z`, `2030-01-02T04:04:05+01:00`).
pub fn parse_time(s: &str, flag: &str) -> Result<DateTime<Utc>, String> {
    DateTime::parse_from_rfc3339(s.trim())
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            format!(
                "{flag} must be an RFC 3339 time like 2030-01-02T03:04:05Z or \
                 2030-01-02T04:04:05+01:00, got {s:?} ({e})"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_any_offset() {
        let t = parse_time("2030-01-02T04:04:05+01:00", "--at").unwrap();
        assert_eq!(t, "2030-01-02T03:04:05Z".parse::<DateTime<Utc>>().unwrap());
        let err = parse_time("tomorrow", "--at").unwrap_err();
        assert!(err.starts_with("--at must be an RFC 3339 time"), "{err}");
        assert!(parse_time("2030-01-02 03:04", "--at").is_err());
    }
}
