//! Command lines as words: the dashboard's Submit form splits what is typed into `argv`, and
//! the worker splits its `--sandbox` template, by the same rules.

/// Splits a command line into words the way a POSIX shell does: whitespace
/// separates arguments; `'…'` quotes everything literally; `"…"` quotes with `\` escaping
/// `"`, `\`, `$` and `` ` ``; outside quotes `\` escapes any character. Nothing is
/// expanded: `$VAR`, `*`, `|`, `>` and `&&` are ordinary characters.
pub fn split_words(line: &str) -> Result<Vec<String>, String> {
    let mut args = Vec::new();
    let mut current = String::new();
    let mut in_word = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if in_word {
                    args.push(std::mem::take(&mut current));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => current.push(c),
                        None => return Err("a single quote (') is not closed".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => current.push(c),
                            Some(c) => {
                                current.push('\\');
                                current.push(c);
                            }
                            None => return Err("a double quote (\") is not closed".into()),
                        },
                        Some(c) => current.push(c),
                        None => return Err("a double quote (\") is not closed".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                match chars.next() {
                    Some(c) => current.push(c),
                    None => return Err("the line ends with a backslash (\\)".into()),
                }
            }
            c => {
                in_word = true;
                current.push(c);
            }
        }
    }
    if in_word {
        args.push(current);
    }
    Ok(args)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(line: &str) -> Vec<String> {
        split_words(line).unwrap()
    }

    #[test]
    fn splits_like_a_shell() {
        assert_eq!(split("echo hello  world"), ["echo", "hello", "world"]);
        assert_eq!(split("  "), Vec::<String>::new());
        assert_eq!(
            split(r#"sh -c 'echo "$HOME" | wc'"#),
            ["sh", "-c", r#"echo "$HOME" | wc"#]
        );
        assert_eq!(
            split(r#"printf "a \"b\" \\ \$x \n""#),
            ["printf", r#"a "b" \ $x \n"#]
        );
        assert_eq!(split(r"a\ b c\'d"), ["a b", "c'd"]);
        assert_eq!(
            split("'' \"\" x"),
            ["", "", "x"],
            "empty quotes are empty arguments"
        );
        assert_eq!(split("pre'fix'\"ed\" next"), ["prefixed", "next"]);
    }

    #[test]
    fn a_sandbox_template_splits_into_its_words() {
        assert_eq!(
            split(r#" a  'b c' "d \"e\" \n" f\ g '' "#),
            ["a", "b c", r#"d "e" \n"#, "f g", ""]
        );
    }

    #[test]
    fn unclosed_quotes_are_errors() {
        assert!(
            split_words("echo 'oops")
                .unwrap_err()
                .contains("single quote")
        );
        assert!(
            split_words("echo \"oops")
                .unwrap_err()
                .contains("double quote")
        );
        assert!(
            split_words("echo oops\\")
                .unwrap_err()
                .contains("backslash")
        );
    }
}
