//! Resource amounts on the command line: `--cpu 500m` or `--cpu 1.5` (cores), `--memory 512M`
//! or `--memory 2G`, `--max-output 10M`. Units are binary (1K = 1024), as in container
//! runtimes' memory flags; `Mi`, `Gi` and `MB`, `GB` are read the same way.

/// The flags of what a task asks of its worker, shared by `sked submit`, `sked schedule
/// create` and `sked service update`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ResourceFlags {
    /// CPU to reserve and cap: cores (1, 0.5) or millicores (500m). Only a worker with that
    /// much free claims the task (see docs/runtime.md).
    #[arg(long, value_name = "CORES", allow_negative_numbers = true, value_parser = parse_cpu)]
    pub cpu: Option<i32>,
    /// Memory to reserve and cap: 512M, 2G (a plain number is MB).
    #[arg(long, value_name = "SIZE", allow_negative_numbers = true,
          value_parser = parse_memory_mb)]
    pub memory: Option<i32>,
    /// The most stdout and stderr may write together: 10M, 1G (a plain number is bytes).
    #[arg(long, value_name = "SIZE", allow_negative_numbers = true,
          value_parser = parse_output_bytes)]
    pub max_output: Option<i64>,
    /// The user to run as (a name or a uid); the worker's default when absent.
    #[arg(long, value_name = "USER")]
    pub run_as: Option<String>,
}

impl ResourceFlags {
    /// The flags given, as the fields of a submission or of a service's change.
    pub fn fields(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut fields = serde_json::Map::new();
        let mut set = |name: &str, value: Option<serde_json::Value>| {
            if let Some(value) = value {
                fields.insert(name.to_owned(), value);
            }
        };
        set("cpu_millis", self.cpu.map(Into::into));
        set("memory_mb", self.memory.map(Into::into));
        set("max_output_bytes", self.max_output.map(Into::into));
        set("run_as", self.run_as.clone().map(Into::into));
        fields
    }

    /// Sets the task's requests, output cap and user from the flags.
    pub fn apply(&self, task: &mut sked_types::SubmitTask) {
        task.cpu_millis = self.cpu;
        task.memory_mb = self.memory;
        task.max_output_bytes = self.max_output;
        task.run_as = self.run_as.clone();
    }
}

/// Millicores from cores (`2`, `0.25`) or millicores (`250m`); 1 to 1,000,000.
pub fn parse_cpu(s: &str) -> Result<i32, String> {
    let text = s.trim();
    let millis = match text.strip_suffix('m') {
        Some(m) => m.trim().parse::<f64>().ok(),
        None => text.parse::<f64>().ok().map(|cores| cores * 1000.0),
    }
    .filter(|v| v.is_finite())
    .ok_or_else(|| format!("--cpu must be cores (1, 0.5) or millicores (500m), got {s:?}"))?;
    let millis = millis.round();
    if !(1.0..=1_000_000.0).contains(&millis) {
        return Err(format!(
            "--cpu must be between 1m and 1000 cores (1 to 1000000 millicores), got {s:?}"
        ));
    }
    Ok(millis as i32)
}

/// Bytes from a number with an optional unit: B, K, M, G, T (binary; `Ki`, `KB` … too).
fn parse_size(s: &str, flag: &str, default_unit: u64) -> Result<u64, String> {
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
        _ => return Err(format!("{flag}: unknown unit in {s:?} (use K, M, G or T)")),
    };
    let value: f64 = number
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite())
        .ok_or_else(|| format!("{flag} must be a size like 512M or 2G, got {s:?}"))?;
    let bytes = value * per as f64;
    if bytes < 1.0 || bytes > 2f64.powi(62) {
        return Err(format!("{flag} must be a positive size, got {s:?}"));
    }
    Ok(bytes.round() as u64)
}

/// Megabytes from a size (`512M`, `2G`; a plain number is MB); 1 MB to 16 TB.
pub fn parse_memory_mb(s: &str) -> Result<i32, String> {
    let bytes = parse_size(s, "--memory", 1 << 20)?;
    let mb = bytes.div_ceil(1 << 20);
    if mb > 16_777_216 {
        return Err(format!("--memory must be at most 16T, got {s:?}"));
    }
    Ok(mb as i32)
}

/// Bytes from a size (`10M`; a plain number is bytes).
pub fn parse_output_bytes(s: &str) -> Result<i64, String> {
    parse_size(s, "--max-output", 1).map(|b| b as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_takes_cores_or_millicores() {
        assert_eq!(parse_cpu("2"), Ok(2000));
        assert_eq!(parse_cpu("0.25"), Ok(250));
        assert_eq!(parse_cpu("250m"), Ok(250));
        assert_eq!(parse_cpu(" 1500m "), Ok(1500));
        for bad in ["0", "0m", "-1", "abc", "1.5x", "", "2000", "nan"] {
            assert!(parse_cpu(bad).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn memory_takes_sizes_in_binary_units_and_plain_megabytes() {
        assert_eq!(parse_memory_mb("512"), Ok(512));
        assert_eq!(parse_memory_mb("512M"), Ok(512));
        assert_eq!(parse_memory_mb("512Mi"), Ok(512));
        assert_eq!(parse_memory_mb("512MB"), Ok(512));
        assert_eq!(parse_memory_mb("2G"), Ok(2048));
        assert_eq!(parse_memory_mb("1.5g"), Ok(1536));
        assert_eq!(parse_memory_mb("100K"), Ok(1), "rounded up to whole MB");
        for bad in ["0", "-5M", "12X", "M", "", "17T"] {
            assert!(parse_memory_mb(bad).is_err(), "{bad:?} is refused");
        }
    }

    #[test]
    fn output_caps_are_bytes_unless_a_unit_says_otherwise() {
        assert_eq!(parse_output_bytes("1000"), Ok(1000));
        assert_eq!(parse_output_bytes("10K"), Ok(10 * 1024));
        assert_eq!(parse_output_bytes("10M"), Ok(10 << 20));
        assert_eq!(parse_output_bytes("1B"), Ok(1));
        for bad in ["0", "x", "0.1"] {
            assert!(parse_output_bytes(bad).is_err(), "{bad:?} is refused");
        }
    }
}
