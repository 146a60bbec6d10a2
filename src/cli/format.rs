//! How the `sked` CLI shows tasks as text: the `show` page, the `list` columns, state changes,
//! and argv as a shell-like line. A module of the `sked` binary.

use chrono::{DateTime, Utc};
use sked_types::{StateChange, Task, TaskDetail};

/// The text `sked show` prints.
pub fn describe(detail: &TaskDetail) -> String {
    let t = &detail.task;
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<13} {v}\n"));
    line("id:", t.id.to_string());
    let exit = t.exit_code.map(|c| format!(" (exit code {c})"));
    line("state:", format!("{}{}", t.state, exit.unwrap_or_default()));
    line("owner:", t.owner.clone());
    line("queue:", format!("{} (priority {})", t.queue, t.priority));
    line("kind:", t.kind.to_string());
    line("run:", what(t));
    if let Some(workflow) = t.workflow_id {
        let name = t.name.as_deref().unwrap_or("");
        line(
            "workflow:",
            format!(
                "{workflow} (task {name:?}, trigger rule {})",
                t.trigger_rule
            ),
        );
        if t.parents_pending > 0 && t.state == sked_types::TaskState::Blocked {
            line("waits for:", format!("{} parents", t.parents_pending));
        }
    }
    if !t.env.is_empty() {
        let env: Vec<String> = t.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        line("env:", env.join(" "));
    }
    if let Some(input) = &t.input {
        line("input:", input.to_string());
    }
    if !t.labels.is_empty() {
        line("labels:", t.labels.join(", "));
    }
    if let Some(timeout) = t.timeout_secs {
        line("timeout:", format!("{timeout} s"));
    }
    let mut requests = Vec::new();
    if let Some(cpu) = t.cpu_millis {
        requests.push(format!("cpu {cpu}m"));
    }
    if let Some(memory) = t.memory_mb {
        requests.push(format!("memory {memory} MB"));
    }
    if !requests.is_empty() {
        line("requests:", requests.join(", "));
    }
    if let Some(bytes) = t.max_output_bytes {
        line("max output:", format!("{bytes} bytes"));
    }
    if let Some(user) = &t.run_as {
        line("runs as:", user.clone());
    }
    if t.preemptible {
        line(
            "preemptible:",
            "yes (may be stopped to make room for a service, then waits again)".to_owned(),
        );
    }
    match (t.shard_of, t.shard_index, t.shard_total) {
        (Some(parent), Some(index), Some(total)) => {
            line("shard:", format!("{index} of {total} (of task {parent})"))
        }
        (None, _, Some(total)) => line(
            "shards:",
            format!(
                "{total}{} (sked list --shard-of {})",
                if t.broadcast {
                    ", one per live worker"
                } else {
                    ""
                },
                t.id
            ),
        ),
        _ => {}
    }
    if let Some(worker) = t.pinned_worker {
        line("pinned to:", format!("worker {worker}"));
    }
    line(
        "attempt:",
        sked_types::service::attempts_text(t.attempt, t.max_attempts).replace('/', " of "),
    );
    line("created:", time(Some(t.created_at)));
    if !t.state.is_final() {
        line("next run:", time(Some(t.next_run_at)));
    }
    if let Some(reason) = &detail.waiting_reason {
        line("waits:", format!("{} ({})", reason.message, reason.code));
    }
    line("started:", time(t.started_at));
    line("finished:", time(t.finished_at));
    if let Some(err) = &t.error {
        line("error:", err.clone());
    }
    if let Some(output) = &t.output {
        line("output:", truncate(&output.to_string(), 200));
    }
    for (name, tail) in [("stdout:", &t.stdout_tail), ("stderr:", &t.stderr_tail)] {
        if let Some(tail) = tail.as_deref().filter(|s| !s.is_empty()) {
            out.push_str(&format!("{name}\n"));
            for l in tail.lines() {
                out.push_str(&format!("  | {l}\n"));
            }
        }
    }
    if !detail.attempts.is_empty() {
        out.push_str(&format!(
            "attempts:\n  {:>3}  {:<12}  {:>4}  {:<19}  {:<19}  ERROR\n",
            "#", "OUTCOME", "EXIT", "STARTED", "FINISHED"
        ));
        for a in &detail.attempts {
            out.push_str(&format!(
                "  {:>3}  {:<12}  {:>4}  {:<19}  {:<19}  {}\n",
                a.attempt,
                a.outcome,
                a.exit_code.map(|c| c.to_string()).unwrap_or_default(),
                time(a.started_at),
                time(a.finished_at),
                truncate(a.error.as_deref().unwrap_or(""), 60)
            ));
        }
    }
    out
}

pub fn print_change(change: &StateChange) {
    if change.cancel_requested {
        outln!(
            "{}: {} (cancel requested: its worker stops it)",
            change.id,
            change.state
        );
    } else {
        outln!("{}: {}", change.id, change.state);
    }
}

/// What a task runs, as a shell-like line.
pub fn what(t: &Task) -> String {
    let mut words: Vec<String> = vec![];
    match (&t.command, &t.artifact_url) {
        (Some(cmd), _) => words.extend(cmd.iter().map(|w| quote(w))),
        (None, Some(url)) => words.push(url.clone()),
        (None, None) => words.push(format!("({})", t.kind)),
    }
    words.extend(t.args.iter().map(|w| quote(w)));
    words.join(" ")
}

/// Quotes a word for a POSIX shell when it needs it.
pub fn quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

pub fn truncate(s: &str, max: usize) -> String {
    let one_line = s.replace('\n', " ");
    match one_line.char_indices().nth(max.saturating_sub(1)) {
        Some((cut, _)) if one_line.chars().count() > max => format!("{}…", &one_line[..cut]),
        _ => one_line,
    }
}

pub fn time(t: Option<DateTime<Utc>>) -> String {
    t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
        .unwrap_or_else(|| "-".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_quoted_for_the_shell() {
        assert_eq!(quote("echo"), "echo");
        assert_eq!(quote("echo hi"), "'echo hi'");
        assert_eq!(quote("it's"), "'it'\\''s'");
        assert_eq!(quote(""), "''");
        assert_eq!(truncate("abcdef", 4), "abc…");
        assert_eq!(truncate("abc", 4), "abc");
    }
}
