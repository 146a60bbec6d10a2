//! The workflow file format: a [`SubmitWorkflow`] written in YAML or JSON, as `sked submit -f
//! FILE` reads it and the dashboard's workflow form reads what is pasted into it. The format
//! is defined here once: the REST form of `POST /api/v1/workflows` (durations as `*_secs`),
//! unknown keys refused, at least one task (see `docs/workflows.md`).

use std::fmt;

use crate::SubmitWorkflow;

/// How a workflow spec is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SpecFormat {
    /// YAML, which also reads most JSON documents.
    Yaml,
    /// JSON.
    Json,
}

impl SpecFormat {
    /// The format of a file by its name: JSON when it ends in `.json`, else YAML (`-`, stdin,
    /// is YAML).
    pub fn of_file_name(name: &str) -> SpecFormat {
        if name.ends_with(".json") {
            SpecFormat::Json
        } else {
            SpecFormat::Yaml
        }
    }
}

/// Why a spec cannot be read: the parser's message, and where in the text when it knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// What is wrong, without its position.
    pub message: String,
    /// The line of the text at fault, from 1.
    pub line: Option<usize>,
    /// The column on that line, from 1.
    pub column: Option<usize>,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.line, self.column) {
            (Some(line), Some(column)) => {
                write!(f, "line {line}, column {column}: {}", self.message)
            }
            (Some(line), None) => write!(f, "line {line}: {}", self.message),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for SpecError {}

/// Reads a workflow spec written in `format`. Unknown keys are errors; a spec without tasks
/// is refused.
pub fn parse_spec(text: &str, format: SpecFormat) -> Result<SubmitWorkflow, SpecError> {
    let spec: SubmitWorkflow = match format {
        SpecFormat::Json => serde_json::from_str(text).map_err(|e| {
            // serde_json counts from 1; line 0 is an error without a position.
            let at = (e.line() > 0).then(|| (e.line(), e.column()));
            SpecError::at(e.to_string(), at)
        })?,
        SpecFormat::Yaml => yaml_serde::from_str(text).map_err(|e| {
            let at = e.location().map(|l| (l.line(), l.column()));
            SpecError::at(e.to_string(), at)
        })?,
    };
    if spec.tasks.is_empty() {
        return Err(SpecError {
            message: "the workflow holds no tasks".to_owned(),
            line: None,
            column: None,
        });
    }
    Ok(spec)
}

impl SpecError {
    /// A parser's `message` at `at` (line, column), without the position the parser wrote
    /// into it (`… at line 3 column 5`, serde_json's and yaml_serde's words), which is kept
    /// apart.
    fn at(message: String, at: Option<(usize, usize)>) -> SpecError {
        let message = match at {
            Some((line, column)) => {
                message.replacen(&format!(" at line {line} column {column}"), "", 1)
            }
            None => message,
        };
        SpecError {
            message,
            line: at.map(|(l, _)| l),
            column: at.map(|(_, c)| c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETL: &str = "\
name: nightly
tasks:
  - name: extract
    command: [\"true\"]
    timeout_secs: 60
  - name: load
    command: [\"true\"]
    depends_on: [extract]
  - name: report
    kind: noop
    depends_on: [load]
    trigger_rule: on_failure
";

    #[test]
    fn yaml_and_json_read_the_same_workflow() {
        let yaml = parse_spec(ETL, SpecFormat::Yaml).unwrap();
        assert_eq!(yaml.name.as_deref(), Some("nightly"));
        assert_eq!(yaml.tasks.len(), 3);
        assert_eq!(yaml.tasks[1].depends_on, vec!["extract".to_owned()]);
        assert_eq!(yaml.tasks[0].task.timeout_secs, Some(60.0));
        let json = serde_json::to_string(&yaml).unwrap();
        assert_eq!(parse_spec(&json, SpecFormat::Json).unwrap(), yaml);
        assert_eq!(
            parse_spec(&json, SpecFormat::Yaml).unwrap(),
            yaml,
            "YAML reads the JSON form too"
        );
    }

    #[test]
    fn a_syntax_error_says_its_line_and_column() {
        let broken = ETL.replace("    depends_on: [extract]", "    depends_on: [extract");
        let e = parse_spec(&broken, SpecFormat::Yaml).unwrap_err();
        // The sequence opened on line 8 is found unclosed at the start of line 9.
        assert_eq!((e.line, e.column), (Some(9), Some(9)), "{e:?}");
        assert!(
            !e.message.contains("at line 9 column 9"),
            "the position is said once: {e}"
        );
        assert!(
            e.message.contains("at line 8 column 17"),
            "where the sequence opened stays in the message: {e}"
        );
        assert!(e.to_string().starts_with("line 9, column 9: "), "{e}");

        let e = parse_spec("{\"tasks\": [}", SpecFormat::Json).unwrap_err();
        assert_eq!((e.line, e.column), (Some(1), Some(12)), "{e:?}");
        assert!(!e.message.contains(" at line "), "{e}");
    }

    #[test]
    fn unknown_keys_and_empty_workflows_are_refused() {
        let e = parse_spec(
            "tasks:\n  - name: a\n    command: [\"true\"]\n    depend_on: [b]\n",
            SpecFormat::Yaml,
        )
        .unwrap_err();
        assert!(e.message.contains("depend_on"), "{e}");
        let e = parse_spec("nmae: x\ntasks: []\n", SpecFormat::Yaml).unwrap_err();
        assert!(e.message.contains("nmae"), "{e}");
        let e = parse_spec("tasks: []\n", SpecFormat::Yaml).unwrap_err();
        assert_eq!(e.to_string(), "the workflow holds no tasks");
    }

    #[test]
    fn a_file_is_json_by_its_name_else_yaml() {
        assert_eq!(SpecFormat::of_file_name("etl.json"), SpecFormat::Json);
        assert_eq!(SpecFormat::of_file_name("etl.yaml"), SpecFormat::Yaml);
        assert_eq!(SpecFormat::of_file_name("-"), SpecFormat::Yaml);
    }
}
