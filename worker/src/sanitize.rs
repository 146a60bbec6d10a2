//! Makes what a task printed or left storable by PostgreSQL before it reaches a batch, so one
//! task's bytes never make the database refuse a statement that carries other tasks' rows.
//!
//! PostgreSQL's `text` cannot hold the NUL character and `jsonb` cannot hold `\u0000`; every
//! other Unicode text is storable. Bytes that are not UTF-8 never get this far: the worker
//! reads a task's stdout and stderr as UTF-8 and turns each invalid byte into U+FFFD
//! (`process.rs`). The rules (see "What PostgreSQL cannot store" in `docs/runtime.md`):
//! - in text (log chunks, stdout and stderr tails, errors) a NUL is written as the two
//!   characters `\0`, visibly and in place;
//! - a JSON output that holds a NUL anywhere (a string or a key, at any depth) is refused: the
//!   attempt fails with [`NUL_IN_OUTPUT`] and no output is stored. Escaping it instead could
//!   merge two keys or change a value that downstream tasks read as data.

use std::borrow::Cow;

use sked_db::worker::{Finished, Outcome};

/// The error of an attempt whose JSON output holds a NUL character.
pub const NUL_IN_OUTPUT: &str =
    "the task's output contains a NUL character (\\u0000), which PostgreSQL cannot store";

/// `text` with every NUL written as `\0`; borrowed (no copy) when it has none.
pub fn text(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\\0"))
    } else {
        Cow::Borrowed(text)
    }
}

/// [`text`] in place.
pub fn text_in_place(text: &mut String) {
    if let Cow::Owned(escaped) = self::text(text) {
        *text = escaped;
    }
}

/// True when a string or a key anywhere in the document holds a NUL character.
pub fn json_has_nul(value: &serde_json::Value) -> bool {
    use serde_json::Value;
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(json_has_nul),
        Value::Object(map) => map.iter().any(|(k, v)| k.contains('\0') || json_has_nul(v)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// Makes a finished attempt storable: NULs in its error and tails are escaped, and an output
/// holding a NUL fails a successful attempt with [`NUL_IN_OUTPUT`] (the output is dropped).
pub fn finished(f: &mut Finished) {
    if f.output.as_ref().is_some_and(json_has_nul) {
        f.output = None;
        if f.outcome == Outcome::Succeeded {
            f.outcome = Outcome::Failed;
            f.error = Some(NUL_IN_OUTPUT.to_owned());
        }
    }
    for text in [&mut f.error, &mut f.stdout_tail, &mut f.stderr_tail]
        .into_iter()
        .flatten()
    {
        text_in_place(text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_nul_is_written_as_backslash_zero_and_other_text_is_untouched() {
        assert_eq!(text("a\0b\0"), "a\\0b\\0");
        assert!(
            matches!(text("plain \u{FFFD} text"), Cow::Borrowed(_)),
            "text without a NUL is not copied"
        );
    }

    #[test]
    fn a_nul_anywhere_in_a_json_document_is_found() {
        assert!(json_has_nul(&json!({"a": [1, {"b": "x\u{0}"}]})));
        assert!(json_has_nul(&json!({"a": {"k\u{0}": 1}})));
        assert!(!json_has_nul(
            &json!({"a": [1, null, true, {"b": "\\u0000"}]})
        ));
    }
}
