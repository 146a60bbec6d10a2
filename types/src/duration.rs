//! Durations as people type them: a number of seconds (`90`, `1.5`) or a sequence of numbers
//! with units (`15m`, `1h30m`, `1h 30m`, `2.5s`, `500ms`, `1d`): `ms`,
//! `s`/`sec`/`secs`/`second(s)`, `m`/`min`/`mins`/`minute(s)`, `h`/`hr`/`hrs`/`hour(s)`,
//! `d`/`day(s)`, `w`/`week(s)`. The CLI's flags (`--delay 15m`) and the API's query
//! parameters (`?wait=30s`) read them.

/// The longest duration accepted: the API refuses durations over 100 years.
pub const MAX_SECS: f64 = 100.0 * 365.25 * 86_400.0;

/// Seconds of one unit, or `None` for an unknown unit.
fn unit_secs(unit: &str) -> Option<f64> {
    Some(match unit {
        "ms" | "msec" | "msecs" | "millisecond" | "milliseconds" => 0.001,
        "s" | "sec" | "secs" | "second" | "seconds" => 1.0,
        "m" | "min" | "mins" | "minute" | "minutes" => 60.0,
        "h" | "hr" | "hrs" | "hour" | "hours" => 3_600.0,
        "d" | "day" | "days" => 86_400.0,
        "w" | "week" | "weeks" => 604_800.0,
        _ => return None,
    })
}

/// Parses a duration in seconds (see the module documentation); `flag` names it in errors.
/// It must be at least `min` seconds (and positive when `min` is above zero).
pub fn parse_duration(s: &str, flag: &str, min: f64) -> Result<f64, String> {
    let examples = "like 90 (seconds), 2.5s, 15m, 1h30m or 1d";
    let text = s.trim();
    let secs = match text.parse::<f64>() {
        Ok(v) => v,
        Err(_) => {
            let mut total = 0.0;
            let mut rest = text;
            if rest.is_empty() {
                return Err(format!("{flag} needs a duration {examples}"));
            }
            while !rest.is_empty() {
                let digits = rest
                    .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                    .unwrap_or(rest.len());
                let (number, after) = rest.split_at(digits);
                let after = after.trim_start();
                let letters = after
                    .find(|c: char| !c.is_ascii_alphabetic())
                    .unwrap_or(after.len());
                let (unit, after) = after.split_at(letters);
                let value: f64 = number
                    .parse()
                    .map_err(|_| format!("{flag} must be a duration {examples}, got {s:?}"))?;
                let per = unit_secs(unit).ok_or_else(|| {
                    if unit.is_empty() {
                        format!("{flag} must be a duration {examples}, got {s:?}")
                    } else {
                        format!("{flag}: unknown unit {unit:?} in {s:?} (use ms, s, m, h, d or w)")
                    }
                })?;
                total += value * per;
                rest = after.trim_start();
            }
            total
        }
    };
    if !secs.is_finite() || secs < min || (min > 0.0 && secs <= 0.0) {
        let bound = if min > 0.0 {
            "positive"
        } else {
            "zero or more"
        };
        return Err(format!("{flag} must be {bound} seconds, got {s}"));
    }
    if secs > MAX_SECS {
        return Err(format!("{flag} must be at most 100 years, got {s}"));
    }
    Ok(secs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: &str) -> Result<f64, String> {
        parse_duration(s, "--delay", 0.0)
    }

    #[test]
    fn durations_take_seconds_or_units() {
        assert_eq!(secs("90"), Ok(90.0));
        assert_eq!(secs("1.5"), Ok(1.5));
        assert_eq!(secs("0"), Ok(0.0));
        assert_eq!(secs("15m"), Ok(900.0));
        assert_eq!(secs("1h30m"), Ok(5_400.0));
        assert_eq!(secs("1h 30m"), Ok(5_400.0));
        assert_eq!(secs("2.5s"), Ok(2.5));
        assert_eq!(secs("500ms"), Ok(0.5));
        assert_eq!(secs("1d"), Ok(86_400.0));
        assert_eq!(secs("2 weeks"), Ok(1_209_600.0));
        assert_eq!(secs(" 10 minutes "), Ok(600.0));
    }

    #[test]
    fn bad_durations_say_what_is_expected() {
        for bad in [
            "",
            "m",
            "15x",
            "15m5",
            "1.2.3s",
            "-5m",
            "ten minutes",
            "15m-",
        ] {
            let err = secs(bad).expect_err(bad);
            assert!(err.starts_with("--delay"), "{bad:?}: {err}");
        }
        assert!(secs("15x").unwrap_err().contains("unknown unit \"x\""));
        assert_eq!(
            secs("-5"),
            Err("--delay must be zero or more seconds, got -5".into())
        );
        assert!(secs("NaN").is_err());
        assert!(secs("inf").is_err());
        assert!(secs("101 weeks").is_ok());
        assert!(secs("36525d").is_ok());
        assert!(secs("36526d").unwrap_err().contains("at most 100 years"));
        assert!(parse_duration("0", "--timeout", f64::MIN_POSITIVE).is_err());
        assert!(parse_duration("0s", "--timeout", f64::MIN_POSITIVE).is_err());
        assert_eq!(
            parse_duration("2m", "--timeout", f64::MIN_POSITIVE),
            Ok(120.0)
        );
    }
}
