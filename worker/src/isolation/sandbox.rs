//! The optional sandbox wrapper (`--sandbox TEMPLATE`): a command that prefixes every task's
//! argv, such as `bwrap --die-with-parent --unshare-all --ro-bind / / --bind {dir} {dir}
//! --dev /dev --proc /proc --`. `{dir}` stands for the task's working directory; `{{` and
//! `}}` are literal braces. The template is split into words like a shell would (single and
//! double quotes, backslash escapes; no expansions) and checked once at start: it must name
//! an executable program, and any other `{…}` is refused.

use std::path::{Path, PathBuf};

use sked_types::shell::split_words;

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sandbox {
    /// The program, as an absolute path found at start.
    program: PathBuf,
    /// The words after the program, each a list of literal text and `{dir}` parts.
    args: Vec<Vec<Part>>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Dir,
}

impl Sandbox {
    /// Parses `template`, finding its program in `search_path` (a PATH value) when it has no
    /// slash.
    pub fn parse(template: &str, search_path: &str) -> Result<Sandbox, String> {
        let words = split_words(template).map_err(|e| format!("--sandbox: {e}"))?;
        let mut words = words
            .iter()
            .map(|w| placeholders(w))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--sandbox: {e}"))?
            .into_iter();
        let program = match words.next() {
            None => return Err("--sandbox: the template is empty".to_owned()),
            Some(parts) => match parts.as_slice() {
                [Part::Text(p)] => p.clone(),
                _ => return Err("--sandbox: the program may not contain {dir}".to_owned()),
            },
        };
        let program = find_program(&program, search_path).map_err(|e| format!("--sandbox: {e}"))?;
        Ok(Sandbox {
            program,
            args: words.collect(),
        })
    }

    /// The argv that runs `argv` in the sandbox for the working directory `dir`.
    pub fn wrap(&self, dir: &Path, argv: Vec<String>) -> Vec<String> {
        let dir = dir.to_string_lossy();
        let mut wrapped = Vec::with_capacity(1 + self.args.len() + argv.len());
        wrapped.push(self.program.to_string_lossy().into_owned());
        for word in &self.args {
            let mut text = String::new();
            for part in word {
                match part {
                    Part::Text(t) => text.push_str(t),
                    Part::Dir => text.push_str(&dir),
                }
            }
            wrapped.push(text);
        }
        wrapped.extend(argv);
        wrapped
    }

    pub fn program(&self) -> &Path {
        &self.program
    }
}

/// Splits one word into text and `{dir}` parts.
fn placeholders(word: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut rest = word;
    while let Some(i) = rest.find(['{', '}']) {
        text.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("{{") {
            text.push('{');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("}}") {
            text.push('}');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("{dir}") {
            if !text.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut text)));
            }
            parts.push(Part::Dir);
            rest = after;
        } else {
            let shown: String = tail.chars().take(16).collect();
            return Err(format!(
                "unknown placeholder at {shown:?}: the template knows only {{dir}} \
                 (write {{{{ and }}}} for literal braces)"
            ));
        }
    }
    text.push_str(rest);
    if !text.is_empty() || parts.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(parts)
}

/// The executable `name` names: itself when it has a slash, else the first match on
/// `search_path`.
fn find_program(name: &str, search_path: &str) -> Result<PathBuf, String> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let path = PathBuf::from(name);
        return if executable(&path) {
            Ok(path)
        } else {
            Err(format!("{name} is not an executable file"))
        };
    }
    std::env::split_paths(search_path)
        .map(|dir| dir.join(name))
        .find(|p| executable(p))
        .ok_or_else(|| format!("{name:?} is not found on the PATH ({search_path})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "/usr/local/bin:/usr/bin:/bin";

    #[test]
    fn dir_is_replaced_in_every_word_that_names_it() {
        let s = Sandbox::parse("sh --bind {dir} {dir} --x=a{dir}b --lit {{dir}} --", PATH).unwrap();
        assert!(s.program().is_absolute(), "{:?}", s.program());
        let argv = s.wrap(Path::new("/w/t 1"), vec!["echo".into(), "{dir}".into()]);
        assert_eq!(
            argv[1..],
            [
                "--bind",
                "/w/t 1",
                "/w/t 1",
                "--x=a/w/t 1b",
                "--lit",
                "{dir}",
                "--",
                "echo",
                "{dir}"
            ],
            "the task's own words are never rewritten"
        );
    }

    #[test]
    fn bad_templates_are_refused_with_a_reason() {
        for (template, says) in [
            ("", "empty"),
            ("   ", "empty"),
            ("no-such-program-anywhere --", "not found"),
            ("/nonexistent/bwrap --", "not an executable"),
            ("sh --bind {dri} {dir}", "unknown placeholder"),
            ("sh --bind {dir", "unknown placeholder"),
            ("sh }", "unknown placeholder"),
            ("{dir}/x", "program may not contain"),
            ("sh 'unclosed", "not closed"),
        ] {
            let err = Sandbox::parse(template, PATH).unwrap_err();
            assert!(
                err.starts_with("--sandbox: ") && err.contains(says),
                "{template:?} must be refused saying {says:?}, got {err:?}"
            );
        }
    }
}
