//! Resource amounts as people write them: CPU in cores (`1.5`, `0.5`) or millicores (`500m`),
//! sizes with a binary unit (`512M`, `2G`; 1K = 1024, as in container runtimes' memory flags;
//! `Mi`, `Gi` and `MB`, `GB` are read the same way). The CLI's `--cpu`, `--memory` and
//! `--max-output` flags and the dashboard's Submit form read them with these functions, so
//! both accept the same text and refuse it with the same sentences. Each function takes the
//! name of what is read (`--cpu`, or `CPU` in the form), which starts its messages.

/// Millicores from cores (`2`, `0.25`) or millicores (`250m`); 1 to 1,000,000.
pub fn parse_cpu(name: &str, s: &str) -> Result<i32, String> {
    let text = s.trim();
    let millis = match text.strip_suffix('m') {
        Some(m) => m.trim().parse::<f64>().ok(),
        None => text.parse::<f64>().ok().map(|cores| cores * 1000.0),
    }
    .filter(|v| v.is_finite())
    .ok_or_else(|| format!("{name} must be cores (1, 0.5) or millicores (500m), got {s:?}"))?;
    let millis = millis.round();
    if !(1.0..=1_000_000.0).contains(&millis) {
        return Err(format!(
            "{name} must be between 1m and 1000 cores (1 to 1000000 millicores), got {s:?}"
        ));
    }
    Ok(millis as i32)
}

/// Bytes from a number with an optional unit: B, K, M, G, T (binary; `Ki`, `KB` … too).
fn parse_size(name: &str, s: &str, default_unit: u64) -> Result<u64, String> {
    let text = s.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let unit = unit.trim().to_ascii_uppercase();
    let per = match unit.trim_end_matches(['B', 'I']) {
        _ if unit.is_empty() => default_unit,
        "" if unit == "B" => 1,
        "K" => 1 << 10,
        "M" => 1 << 20,
        "G" => 1 << 30,
        "T" => 1 << 40,
        _ => return Err(format!("{name}: unknown unit in {s:?} (use K, M, G or T)")),
    };
    let value: f64 = number
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite())
        .ok_or_else(|| format!("{name} must be a size like 512M or 2G, got {s:?}"))?;
    let bytes = value * per as f64;
    if bytes < 1.0 || bytes > 2f64.powi(62) {
        return Err(format!("{name} must be a positive size, got {s:?}"));
    }
    Ok(bytes.round() as u64)
}

/// Megabytes from a size (`512M`, `2G`; a plain number is MB), rounded up to a whole MB;
/// 1 MB to 16 TB.
pub fn parse_memory_mb(name: &str, s: &str) -> Result<i32, String> {
    let bytes = parse_size(name, s, 1 << 20)?;
    let mb = bytes.div_ceil(1 << 20);
    if mb > 16_777_216 {
        return Err(format!("{name} must be at most 16T, got {s:?}"));
    }
    Ok(mb as i32)
}

/// Bytes from a size (`10M`; a plain number is bytes).
pub fn parse_output_bytes(name: &str, s: &str) -> Result<i64, String> {
    parse_size(name, s, 1).map(|b| b as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cpu(s: &str) -> Result<i32, String> {
        parse_cpu("--cpu", s)
    }

    fn memory(s: &str) -> Result<i32, String> {
        parse_memory_mb("--memory", s)
    }

    fn output(s: &str) -> Result<i64, String> {
        parse_output_bytes("--max-output", s)
    }

    #[test]
    fn cpu_takes_cores_or_millicores() {
        assert_eq!(cpu("2"), Ok(2000));
        assert_eq!(cpu("0.25"), Ok(250));
        assert_eq!(cpu("250m"), Ok(250));
        assert_eq!(cpu(" 1500m "), Ok(1500));
        for bad in ["0", "0m", "-1", "abc", "1.5x", "", "2000", "nan"] {
            assert!(cpu(bad).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn memory_takes_sizes_in_binary_units_and_plain_megabytes() {
        assert_eq!(memory("512"), Ok(512));
        assert_eq!(memory("512M"), Ok(512));
        assert_eq!(memory("512Mi"), Ok(512));
        assert_eq!(memory("512MB"), Ok(512));
        assert_eq!(memory("2G"), Ok(2048));
        assert_eq!(memory("1.5g"), Ok(1536));
        assert_eq!(memory("100K"), Ok(1), "rounded up to whole MB");
        for bad in ["0", "-5M", "12X", "M", "", "17T"] {
            assert!(memory(bad).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn output_caps_are_bytes_unless_a_unit_says_otherwise() {
        assert_eq!(output("1000"), Ok(1000));
        assert_eq!(output("10K"), Ok(10 * 1024));
        assert_eq!(output("10M"), Ok(10 << 20));
        assert_eq!(output("1B"), Ok(1));
        for bad in ["0", "x", "0.1"] {
            assert!(output(bad).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn messages_start_with_the_name_given_and_quote_the_text() {
        assert_eq!(
            cpu("abc").unwrap_err(),
            r#"--cpu must be cores (1, 0.5) or millicores (500m), got "abc""#
        );
        assert_eq!(
            parse_cpu("CPU", "2000").unwrap_err(),
            r#"CPU must be between 1m and 1000 cores (1 to 1000000 millicores), got "2000""#
        );
        assert_eq!(
            parse_memory_mb("Memory", "12X").unwrap_err(),
            r#"Memory: unknown unit in "12X" (use K, M, G or T)"#
        );
        assert_eq!(
            memory("M").unwrap_err(),
            r#"--memory must be a size like 512M or 2G, got "M""#
        );
        assert_eq!(
            memory("17T").unwrap_err(),
            r#"--memory must be at most 16T, got "17T""#
        );
        assert_eq!(
            output("0").unwrap_err(),
            r#"--max-output must be a positive size, got "0""#
        );
    }
}
