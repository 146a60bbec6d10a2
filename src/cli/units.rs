//! Resource amounts on the command line: `--cpu 500m` or `--cpu 1.5` (cores), `--memory 512M`
//! or `--memory 2G`, `--max-output 10M`. Units are binary (1K = 1024), as in container
//! runtimes' memory flags; `Mi`, `Gi` and `MB`, `GB` are read the same way. The parsing is
//! [`sked_types::units`], which the dashboard's Submit form uses too.

use sked_types::units;

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

/// `--cpu`: millicores from cores (`2`, `0.25`) or millicores (`250m`); 1 to 1,000,000.
pub fn parse_cpu(s: &str) -> Result<i32, String> {
    units::parse_cpu("--cpu", s)
}

/// `--memory`: megabytes from a size (`512M`, `2G`; a plain number is MB); 1 MB to 16 TB.
pub fn parse_memory_mb(s: &str) -> Result<i32, String> {
    units::parse_memory_mb("--memory", s)
}

/// `--max-output`: bytes from a size (`10M`; a plain number is bytes).
pub fn parse_output_bytes(s: &str) -> Result<i64, String> {
    units::parse_output_bytes("--max-output", s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flags_name_themselves_in_their_messages() {
        assert_eq!(parse_cpu("500m"), Ok(500));
        assert_eq!(parse_memory_mb("2G"), Ok(2048));
        assert_eq!(parse_output_bytes("10K"), Ok(10 * 1024));
        assert_eq!(
            parse_cpu("x").unwrap_err(),
            r#"--cpu must be cores (1, 0.5) or millicores (500m), got "x""#
        );
        assert_eq!(
            parse_memory_mb("x").unwrap_err(),
            r#"--memory: unknown unit in "x" (use K, M, G or T)"#
        );
        assert_eq!(
            parse_output_bytes("0").unwrap_err(),
            r#"--max-output must be a positive size, got "0""#
        );
    }
}
