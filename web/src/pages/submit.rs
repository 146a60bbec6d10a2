//! The submit page (`/submit`): one task now, after a delay or at a time, or a cron schedule.
//!
//! The command is one line split into arguments like a shell splits it (see
//! [`split_command`]); nothing else of a shell applies. The form checks the environment
//! lines and the input JSON before sending, and shows the API's message when it refuses.
//! With "cron", the page creates a schedule (`POST /api/v1/schedules`) whose template is the
//! task, and previews the expression's next fire times while it is typed.
//!
//! "Resources and limits" (folded by default) carries what the task asks of its worker: CPU
//! and memory to reserve, an output cap, the user to run as, and whether it is preemptible.
//! The amounts are read by [`sked_types::units`], as the CLI's `--cpu`, `--memory` and
//! `--max-output` read them, and refused with the same sentences before anything is sent.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::hooks::use_navigate;
use sked_types::duration::MAX_SECS;
use sked_types::units;
use sked_types::{CreateSchedule, CronPreview, QueueCounts, Schedule, SubmitTask, Submitted};

use crate::{api, ui};

/// Wait after the last keystroke in the cron expression before asking for a preview.
const PREVIEW_DEBOUNCE_MS: u64 = 300;
/// Fire times the preview shows.
const PREVIEW_COUNT: u32 = 5;

/// Splits a command line into arguments the way a POSIX shell splits words, expanding
/// nothing ([`sked_types::shell::split_words`]).
pub use sked_types::shell::split_words as split_command;

/// `KEY=VALUE` lines; blank lines and lines starting with `#` are skipped.
pub fn parse_env(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            return Err(format!(
                "Environment line {}: expected KEY=VALUE, got {trimmed:?}",
                n + 1
            ));
        };
        let key_ok = key
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !key_ok {
            return Err(format!(
                "Environment line {}: {key:?} is not a variable name (letters, digits and _, \
                 not starting with a digit)",
                n + 1
            ));
        }
        if env.insert(key.to_owned(), value.to_owned()).is_some() {
            return Err(format!("Environment line {}: {key} is set twice", n + 1));
        }
    }
    Ok(env)
}

/// The input JSON, or `None` for a blank field.
pub fn parse_input(text: &str) -> Result<Option<serde_json::Value>, String> {
    if text.trim().is_empty() {
        return Ok(None);
    }
    serde_json::from_str(text).map(Some).map_err(|e| {
        format!(
            "The input is not valid JSON (line {}, column {}): {}",
            e.line(),
            e.column(),
            json_reason(&e)
        )
    })
}

/// serde_json's message without its own " at line L column C" suffix.
fn json_reason(e: &serde_json::Error) -> String {
    let text = e.to_string();
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_owned(),
        None => text,
    }
}

/// A whole number from `min` to `max` from a field, as typed (a sign, an exponent: `-3`,
/// `1e3`), or `None` when it is blank; anything else is refused naming the field and the
/// range.
pub(crate) fn parse_int(
    label: &str,
    text: &str,
    min: i32,
    max: i32,
) -> Result<Option<i32>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let whole = text
        .parse::<i64>()
        .ok()
        .or_else(|| {
            let v = text.parse::<f64>().ok()?;
            // Within i64, exactly: whole numbers up to 2^53 are exact doubles.
            (v.is_finite() && v.fract() == 0.0 && v.abs() < 9.0e15).then_some(v as i64)
        })
        .filter(|v| (i64::from(min)..=i64::from(max)).contains(v));
    match whole {
        Some(v) => Ok(Some(v as i32)),
        None => Err(format!(
            "{label} must be a whole number from {min} to {max}, got {text:?}"
        )),
    }
}

/// A number of seconds (possibly fractional) from a field, or `None` when it is blank:
/// 0 or more (more than 0 when `positive`), at most 100 years.
fn parse_secs(label: &str, text: &str, positive: bool) -> Result<Option<f64>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    let least = if positive { "more than 0" } else { "0 or more" };
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && (v > 0.0 || (v == 0.0 && !positive)) && v <= MAX_SECS => {
            Ok(Some(v))
        }
        _ => Err(format!(
            "{label} must be a number of seconds, {least} and at most {MAX_SECS} (100 years), \
             got {text:?}"
        )),
    }
}

/// An amount read by `parse` from a field, or `None` when it is blank.
fn parse_amount<T>(
    text: &str,
    parse: impl Fn(&str) -> Result<T, String>,
) -> Result<Option<T>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    parse(text).map(Some)
}

/// The CPU field: cores (`0.5`) or millicores (`500m`), as `--cpu` reads them.
fn parse_cpu(text: &str) -> Result<Option<i32>, String> {
    parse_amount(text, |t| units::parse_cpu("CPU", t))
}

/// The memory field: a size (`512M`, `2G`; a plain number is MB), as `--memory` reads it.
fn parse_memory(text: &str) -> Result<Option<i32>, String> {
    parse_amount(text, |t| units::parse_memory_mb("Memory", t))
}

/// The output cap: a size (`10M`; a plain number is bytes), as `--max-output` reads it.
fn parse_max_output(text: &str) -> Result<Option<i64>, String> {
    parse_amount(text, |t| units::parse_output_bytes("Max output", t))
}

/// What a resource field is read as, said under it while it is typed (nothing when blank).
fn reading<T>(
    parsed: Result<Option<T>, String>,
    say: impl Fn(T) -> String,
) -> Option<Result<String, String>> {
    parsed.map(|v| v.map(say)).transpose()
}

/// A `datetime-local` value (`2026-12-01T14:30`), read in the browser's time zone.
fn local_input_time(text: &str) -> Option<DateTime<Utc>> {
    let ms = js_sys::Date::new(&wasm_bindgen::JsValue::from_str(text)).get_time();
    if ms.is_nan() {
        return None;
    }
    DateTime::from_timestamp_millis(ms as i64)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum When {
    Now,
    Delay,
    At,
    Cron,
}

impl When {
    const ALL: [(When, &'static str, &'static str); 4] = [
        (When::Now, "now", "Now"),
        (When::Delay, "delay", "After a delay"),
        (When::At, "at", "At a time"),
        (When::Cron, "cron", "On a cron schedule"),
    ];
}

/// The form's fields, as typed.
#[derive(Clone, Copy)]
struct Form {
    command: RwSignal<String>,
    env: RwSignal<String>,
    input: RwSignal<String>,
    queue: RwSignal<String>,
    priority: RwSignal<String>,
    max_attempts: RwSignal<String>,
    timeout_secs: RwSignal<String>,
    labels: RwSignal<String>,
    cpu: RwSignal<String>,
    memory: RwSignal<String>,
    max_output: RwSignal<String>,
    run_as: RwSignal<String>,
    preemptible: RwSignal<bool>,
    when: RwSignal<When>,
    delay: RwSignal<String>,
    delay_unit: RwSignal<String>,
    run_at: RwSignal<String>,
    cron: RwSignal<String>,
    time_zone: RwSignal<String>,
    name: RwSignal<String>,
}

impl Form {
    fn new() -> Self {
        Form::blank(ui::browser_zone().unwrap_or_else(|| "UTC".to_owned()))
    }

    /// An empty form whose time zone field holds `time_zone`.
    fn blank(time_zone: String) -> Self {
        let text = || RwSignal::new(String::new());
        Form {
            command: text(),
            env: text(),
            input: text(),
            queue: text(),
            priority: text(),
            max_attempts: text(),
            timeout_secs: text(),
            labels: text(),
            cpu: text(),
            memory: text(),
            max_output: text(),
            run_as: text(),
            preemptible: RwSignal::new(false),
            when: RwSignal::new(When::Now),
            delay: text(),
            delay_unit: RwSignal::new("minutes".to_owned()),
            run_at: text(),
            cron: text(),
            time_zone: RwSignal::new(time_zone),
            name: text(),
        }
    }

    /// The task the form describes, without its start time.
    fn task(&self) -> Result<SubmitTask, String> {
        let argv = split_command(&self.command.get_untracked())
            .map_err(|e| format!("The command cannot be split: {e}"))?;
        if argv.is_empty() {
            return Err("Give a command to run.".into());
        }
        let queue = self.queue.get_untracked().trim().to_owned();
        let labels = self
            .labels
            .get_untracked()
            .split(',')
            .map(|l| l.trim().to_owned())
            .filter(|l| !l.is_empty())
            .collect();
        let run_as = self.run_as.get_untracked().trim().to_owned();
        Ok(SubmitTask {
            command: Some(argv),
            env: parse_env(&self.env.get_untracked())?,
            input: parse_input(&self.input.get_untracked())?,
            queue: (!queue.is_empty()).then_some(queue),
            priority: parse_int(
                "Priority",
                &self.priority.get_untracked(),
                i32::MIN,
                i32::MAX,
            )?,
            max_attempts: parse_int(
                "Max attempts",
                &self.max_attempts.get_untracked(),
                1,
                i32::MAX,
            )?,
            timeout_secs: parse_secs("Timeout", &self.timeout_secs.get_untracked(), true)?,
            labels,
            cpu_millis: parse_cpu(&self.cpu.get_untracked())?,
            memory_mb: parse_memory(&self.memory.get_untracked())?,
            max_output_bytes: parse_max_output(&self.max_output.get_untracked())?,
            run_as: (!run_as.is_empty()).then_some(run_as),
            preemptible: self.preemptible.get_untracked(),
            ..SubmitTask::default()
        })
    }
}

/// What the form asks the API to create.
enum Request {
    Task(Box<SubmitTask>),
    Schedule(Box<CreateSchedule>),
}

impl Form {
    /// The request the form describes, or the first thing wrong with it.
    fn request(&self) -> Result<Request, String> {
        let mut task = self.task()?;
        match self.when.get_untracked() {
            When::Now => {}
            When::Delay => {
                let amount = parse_secs("The delay", &self.delay.get_untracked(), false)?
                    .ok_or("Give the delay.")?;
                let unit = if self.delay_unit.get_untracked() == "minutes" {
                    60.0
                } else {
                    1.0
                };
                task.delay_secs = Some(amount * unit);
            }
            When::At => {
                let text = self.run_at.get_untracked();
                task.run_at =
                    Some(local_input_time(&text).ok_or("Give the date and time to start.")?);
            }
            When::Cron => return self.schedule(task).map(|s| Request::Schedule(Box::new(s))),
        }
        Ok(Request::Task(Box::new(task)))
    }

    /// The schedule whose template is `task`.
    fn schedule(&self, task: SubmitTask) -> Result<CreateSchedule, String> {
        let name = self.name.get_untracked().trim().to_owned();
        if name.is_empty() {
            return Err("Give the schedule a name.".into());
        }
        let cron = self.cron.get_untracked().trim().to_owned();
        if cron.is_empty() {
            return Err("Give a cron expression.".into());
        }
        let time_zone = self.time_zone.get_untracked().trim().to_owned();
        Ok(CreateSchedule {
            name,
            cron,
            time_zone: (!time_zone.is_empty()).then_some(time_zone),
            task: Some(task),
            ..CreateSchedule::default()
        })
    }
}

/// What a submission created.
enum Created {
    Task(uuid::Uuid),
    Schedule(uuid::Uuid),
}

/// Sends the request; the API's message when it refuses.
async fn send(request: Request) -> Result<Created, String> {
    match request {
        Request::Schedule(schedule) => {
            let schedule: Schedule = api::post("/schedules", &schedule)
                .await
                .map_err(|e| e.message)?;
            Ok(Created::Schedule(schedule.id))
        }
        Request::Task(task) => {
            let submitted: Submitted = api::post("/tasks", &task).await.map_err(|e| e.message)?;
            submitted
                .ids
                .first()
                .copied()
                .map(Created::Task)
                .ok_or_else(|| "The server answered without the new task's id.".into())
        }
    }
}

#[component]
pub fn Submit() -> impl IntoView {
    let form = Form::new();
    let error = RwSignal::new(None::<String>);
    let busy = RwSignal::new(false);
    let navigate = use_navigate();

    // Sends the form once at a time, then opens what it created or shows why not.
    let on_submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        if busy.get_untracked() {
            return;
        }
        busy.set(true);
        error.set(None);
        let navigate = navigate.clone();
        let request = form.request();
        spawn_local(async move {
            let result = match request {
                Ok(request) => send(request).await,
                Err(message) => Err(message),
            };
            busy.try_set(false);
            match result {
                Ok(Created::Task(id)) => navigate(&format!("/tasks/{id}"), Default::default()),
                Ok(Created::Schedule(id)) => {
                    navigate(&format!("/schedules/{id}"), Default::default())
                }
                Err(message) => {
                    error.try_set(Some(message));
                }
            }
        });
    };

    view! {
        <h1>"Submit"</h1>
        <SubmitTabs workflow=false/>
        <form class="form submit" on:submit=on_submit novalidate=true>
            <CommandField form=form/>
            <EnvAndInputFields form=form/>
            <PlacementFields form=form/>
            <WhenFields form=form/>
            <ResourceFields form=form/>
            <span></span>
            <div>
                <ui::ErrorBox message=error/>
                <div class="actions">
                    <button type="submit" class="primary" data-action="submit" disabled=move || busy.get()>
                        {move || if form.when.get() == When::Cron { "Create schedule" } else { "Submit task" }}
                    </button>
                </div>
            </div>
        </form>
    }
}

/// What the Submit page submits: a task (`/submit`) or a workflow in YAML
/// (`/submit/workflow`).
#[component]
pub fn SubmitTabs(workflow: bool) -> impl IntoView {
    view! {
        <p>
            <span class="switch" role="group" aria-label="What to submit">
                <a href="/submit" data-tab="task" aria-current=(!workflow).then_some("page")>"A task"</a>
                <a href="/submit/workflow" data-tab="workflow" aria-current=workflow.then_some("page")>
                    "A workflow (YAML)"
                </a>
            </span>
        </p>
    }
}

/// The command line, with the arguments it splits into (or why it cannot be split).
#[component]
fn CommandField(form: Form) -> impl IntoView {
    let argv = Memo::new(move |_| form.command.with(|c| split_command(c)));
    view! {
        <Field id="submit-command" label="Command" name="command" value=form.command class="mono wide"
            placeholder="e.g. python3 -c 'print(42)'" no_autocomplete=true no_spellcheck=true>
            <p class="hint">
                "One line, split into arguments like a shell does: spaces separate them, '…' and \"…\" quote, \\ escapes. "
                "Nothing is expanded ($VAR, *, |, > are plain text): for a shell, run sh -c '…'."
            </p>
            <ArgvPreview argv=argv/>
        </Field>
    }
}

/// The environment lines and the input JSON, each with what is wrong with it as it is typed.
#[component]
fn EnvAndInputFields(form: Form) -> impl IntoView {
    let env_problem = Memo::new(move |_| form.env.with(|e| parse_env(e).err().map(Err)));
    let input_problem = Memo::new(move |_| form.input.with(|i| parse_input(i).err().map(Err)));
    view! {
        <Field id="submit-env" label="Environment" name="env" value=form.env rows="3" no_spellcheck=true
            placeholder="KEY=VALUE, one per line" reading=env_problem/>
        <Field id="submit-input" label="Input (JSON)" name="input" value=form.input rows="4" no_spellcheck=true
            placeholder="{\"any\": \"JSON\"} — given to the process on stdin" reading=input_problem/>
    }
}

/// Where and how the task runs: queue (with the known queues as suggestions), priority,
/// attempts, timeout and labels.
#[component]
fn PlacementFields(form: Form) -> impl IntoView {
    // Queue names for suggestions.
    let queues = RwSignal::new(Vec::<String>::new());
    spawn_local(async move {
        if let Ok(counts) = api::get::<Vec<QueueCounts>>("/queues").await {
            queues.try_set(counts.into_iter().map(|c| c.queue).collect());
        }
    });
    view! {
        <Field id="submit-queue" label="Queue" name="queue" value=form.queue placeholder="default" list="submit-queues">
            <datalist id="submit-queues">
                {move || queues.get().into_iter().map(|q| view! { <option value=q></option> }).collect_view()}
            </datalist>
        </Field>
        <Field id="submit-priority" label="Priority" name="priority" value=form.priority inputmode="numeric" placeholder="0"
            hint="Higher runs first."/>
        <Field id="submit-max-attempts" label="Max attempts" name="max_attempts" value=form.max_attempts inputmode="numeric"
            placeholder="3"/>
        <Field id="submit-timeout" label="Timeout" name="timeout_secs" value=form.timeout_secs inputmode="decimal"
            placeholder="none" hint="seconds per attempt"/>
        <Field id="submit-labels" label="Labels" name="labels" value=form.labels placeholder="gpu, linux"
            hint="comma-separated; only workers with all of them run it"/>
    }
}

/// When the task runs: now, after a delay, at a time, or on a cron schedule; the fields of
/// the choice made.
#[component]
fn WhenFields(form: Form) -> impl IntoView {
    let when_is = move |w: When| move || form.when.get() == w;
    view! {
        <span class="label">"When"</span>
        <div class="choices" role="radiogroup" aria-label="When">
            {When::ALL
                .into_iter()
                .map(|(w, value, label)| view! {
                    <label class="choice">
                        <input
                            type="radio"
                            name="when"
                            value=value
                            prop:checked=move || form.when.get() == w
                            on:change=move |_| form.when.set(w)
                        />
                        {label}
                    </label>
                })
                .collect_view()}
        </div>

        <Show when=when_is(When::Delay)>
            <DelayFields form=form/>
        </Show>
        <Show when=when_is(When::At)>
            <RunAtField form=form/>
        </Show>
        <Show when=when_is(When::Cron)>
            <CronFields form=form/>
        </Show>
    }
}

/// The delay, in seconds or minutes.
#[component]
fn DelayFields(form: Form) -> impl IntoView {
    view! {
        <Field id="submit-delay" label="Delay" name="delay_secs" value=form.delay inputmode="decimal">
            " "
            <select
                name="delay_unit"
                aria-label="Unit of the delay"
                on:change=move |ev| form.delay_unit.set(event_target_value(&ev))
            >
                <option value="seconds" selected=move || form.delay_unit.get() == "seconds">"seconds"</option>
                <option value="minutes" selected=move || form.delay_unit.get() == "minutes">"minutes"</option>
            </select>
        </Field>
    }
}

/// The start time, in the browser's time zone, with the UTC time it stands for.
#[component]
fn RunAtField(form: Form) -> impl IntoView {
    let feedback = move || {
        let text = form.run_at.get();
        if text.is_empty() {
            return String::new();
        }
        match local_input_time(&text) {
            Some(at) if at <= ui::now() => format!(
                "{} UTC — in the past: it starts at once",
                at.format("%Y-%m-%d %H:%M")
            ),
            Some(at) => format!("{} UTC, {}", at.format("%Y-%m-%d %H:%M"), ui::relative(at)),
            None => "not a valid date and time".into(),
        }
    };
    view! {
        <Field id="submit-run-at" label="Start at" name="run_at" value=form.run_at kind="datetime-local">
            <p class="hint">"Your local time. " {feedback}</p>
        </Field>
    }
}

/// The schedule's name, cron expression and time zone, and its next fire times.
#[component]
fn CronFields(form: Form) -> impl IntoView {
    view! {
        <Field id="submit-name" label="Schedule name" name="name" value=form.name placeholder="nightly-report"/>
        <Field id="submit-cron" label="Cron" name="cron" value=form.cron class="mono" placeholder="*/5 * * * *"
            no_autocomplete=true no_spellcheck=true>
            <p class="hint">
                "5 fields (minute hour day month weekday), 6 with seconds first, or @hourly, @daily…"
            </p>
        </Field>
        <Field id="submit-time-zone" label="Time zone" name="time_zone" value=form.time_zone placeholder="UTC"/>
        <span class="label">"Next fire times"</span>
        <CronPreviewView form=form/>
    }
}

/// The next fire times of the expression and zone as they are typed, asked of the API
/// [`PREVIEW_DEBOUNCE_MS`] after the last keystroke.
#[component]
fn CronPreviewView(form: Form) -> impl IntoView {
    let preview = RwSignal::new(None::<Result<CronPreview, String>>);
    let generation = StoredValue::new(0u64);
    Effect::new(move |_| {
        let cron = form.cron.get().trim().to_owned();
        let zone = form.time_zone.get().trim().to_owned();
        generation.update_value(|g| *g += 1);
        let mine = generation.get_value();
        if cron.is_empty() {
            preview.set(None);
            return;
        }
        spawn_local(async move {
            gloo_timers::future::sleep(Duration::from_millis(PREVIEW_DEBOUNCE_MS)).await;
            if generation.try_get_value() != Some(mine) {
                return;
            }
            let mut path = format!("/cron/preview?cron={}&n={PREVIEW_COUNT}", api::enc(&cron));
            if !zone.is_empty() {
                path.push_str(&format!("&time_zone={}", api::enc(&zone)));
            }
            let result = api::get::<CronPreview>(&path).await;
            if generation.try_get_value() == Some(mine) {
                preview.set(Some(result.map_err(|e| e.message)));
            }
        });
    });
    view! {
        <div class="cron-preview" data-cron-preview="">
            {move || match preview.get() {
                None => view! { <p class="hint">"Type an expression to see when it fires."</p> }.into_any(),
                Some(Err(e)) => view! { <p class="hint bad">{e}</p> }.into_any(),
                Some(Ok(p)) if p.next_fire_times.is_empty() => {
                    view! { <p class="hint">"It never fires again."</p> }.into_any()
                }
                Some(Ok(p)) => view! {
                    <ol class="times">
                        {p.next_fire_times
                            .into_iter()
                            .map(|at| view! {
                                <li><ui::Time at=at/> <span class="hint">" " {ui::relative(at)}</span></li>
                            })
                            .collect_view()}
                    </ol>
                }
                .into_any(),
            }}
        </div>
    }
}

/// "Resources and limits", folded: CPU, memory and output cap (each with what it is read
/// as), the user to run as, and whether the task is preemptible.
#[component]
fn ResourceFields(form: Form) -> impl IntoView {
    let cpu_reading = move || {
        reading(form.cpu.with(|t| parse_cpu(t)), |m| {
            format!("{m} millicores = {} cores", f64::from(m) / 1000.0)
        })
    };
    let memory_reading = move || {
        reading(form.memory.with(|t| parse_memory(t)), |mb| {
            format!("{mb} MB")
        })
    };
    let max_output_reading = move || {
        reading(form.max_output.with(|t| parse_max_output(t)), |b| {
            format!("{b} bytes")
        })
    };
    view! {
        <details class="full resources" data-resources="">
            <summary>"Resources and limits"</summary>
            <div class="form submit">
                <Field id="submit-cpu" label="CPU" name="cpu_millis" value=form.cpu placeholder="e.g. 0.5 or 500m"
                    no_autocomplete=true hint="cores or millicores; only a worker with that much free runs it" reading=cpu_reading/>
                <Field id="submit-memory" label="Memory" name="memory_mb" value=form.memory placeholder="e.g. 512M or 2G"
                    no_autocomplete=true hint="reserved, and its limit; a plain number is MB" reading=memory_reading/>
                <Field id="submit-max-output" label="Max output" name="max_output_bytes" value=form.max_output
                    placeholder="worker's default" no_autocomplete=true
                    hint="stdout and stderr together, e.g. 10M; a plain number is bytes" reading=max_output_reading/>
                <Field id="submit-run-as" label="Run as" name="run_as" value=form.run_as placeholder="worker's default"
                    no_autocomplete=true no_spellcheck=true hint="a user name or uid"/>
                <Field id="submit-preemptible" label="Preemptible" name="preemptible" value=form.preemptible
                    hint="may be stopped to make room for a service's copy; it then waits again, not charged"/>
            </div>
        </details>
    }
}

/// What a field edits: its text, or a checkbox's tick.
#[derive(Clone, Copy)]
pub enum Value {
    Text(RwSignal<String>),
    Ticked(RwSignal<bool>),
}

impl From<RwSignal<String>> for Value {
    fn from(text: RwSignal<String>) -> Self {
        Value::Text(text)
    }
}

impl From<RwSignal<bool>> for Value {
    fn from(ticked: RwSignal<bool>) -> Self {
        Value::Ticked(ticked)
    }
}

/// One field of the form: its label, its control, a `hint` after the control, under it what
/// the text is read as (`Ok`) or why it is refused (`Err`) while `reading` holds one, then any
/// `children` (a longer hint, suggestions, a unit).
///
/// The control edits `value`: text in an `<input>` of type `kind` (a `<textarea>` when `rows`
/// is given), or the tick of a checkbox. `id` (which the label names), `name`, `placeholder`,
/// `class`, `inputmode` and `list` (the id of a `<datalist>` of suggestions) are its
/// attributes. Numbers are text with an `inputmode`, never `type="number"`: a browser gives
/// such an input's text as "" while it is not yet a number (`-`, `1e`), which would erase what
/// is being typed, and drops what it cannot read; `no_autocomplete` and `no_spellcheck` turn off the browser's suggestions of
/// earlier entries and its spell checking.
#[component]
pub fn Field(
    id: &'static str,
    label: &'static str,
    name: &'static str,
    #[prop(into)] value: Value,
    #[prop(optional)] kind: Option<&'static str>,
    #[prop(optional)] rows: Option<&'static str>,
    #[prop(optional)] placeholder: Option<&'static str>,
    #[prop(optional)] class: Option<&'static str>,
    #[prop(optional)] inputmode: Option<&'static str>,
    #[prop(optional)] list: Option<&'static str>,
    #[prop(optional)] no_autocomplete: bool,
    #[prop(optional)] no_spellcheck: bool,
    #[prop(optional)] hint: Option<&'static str>,
    #[prop(optional, into)] reading: Option<Signal<Option<Result<String, String>>>>,
    #[prop(optional)] children: Option<Children>,
) -> impl IntoView {
    let autocomplete = no_autocomplete.then_some("off");
    let spellcheck = no_spellcheck.then_some("false");
    let control = match (value, rows) {
        (Value::Ticked(ticked), _) => {
            view! { <input id=id type="checkbox" name=name bind:checked=ticked/> }.into_any()
        }
        (Value::Text(text), Some(rows)) => view! {
            <textarea id=id name=name rows=rows spellcheck=spellcheck placeholder=placeholder bind:value=text></textarea>
        }
        .into_any(),
        (Value::Text(text), None) => view! {
            <input
                id=id
                name=name
                type=kind
                inputmode=inputmode
                class=class
                placeholder=placeholder
                list=list
                autocomplete=autocomplete
                spellcheck=spellcheck
                bind:value=text
            />
        }
        .into_any(),
    };
    let reading = move || {
        reading.and_then(|r| r.get()).map(|r| match r {
            Ok(text) => view! { <p class="hint" data-reading="">{text}</p> }.into_any(),
            Err(e) => view! { <p class="hint bad">{e}</p> }.into_any(),
        })
    };
    view! {
        <label for=id>{label}</label>
        <div>
            {control}
            {hint.map(|h| view! { <span class="hint">{format!(" {h}")}</span> })}
            {reading}
            {children.map(|c| c())}
        </div>
    }
}

/// What a command line typed in a form splits into (`argv: [...]`), or why it cannot be
/// split; nothing for an empty one.
#[component]
pub(crate) fn ArgvPreview(argv: Memo<Result<Vec<String>, String>>) -> impl IntoView {
    move || match argv.get() {
        Ok(args) if !args.is_empty() => Some(
            view! {
                <p class="hint mono" data-argv="">
                    {format!("argv: {}", serde_json::to_string(&args).unwrap_or_default())}
                </p>
            }
            .into_any(),
        ),
        Ok(_) => None,
        Err(e) => Some(view! { <p class="hint bad">{e}</p> }.into_any()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_joined_command_line_splits_back_to_its_arguments() {
        let cases: &[&[&str]] = &[
            &["echo", "hello world"],
            &["sh", "-c", "echo 'it''s' \"$HOME\" | wc -l"],
            &["", "tab\there", "new\nline", "back\\slash", "--flag=a,b"],
        ];
        for argv in cases {
            let argv: Vec<String> = argv.iter().map(|s| s.to_string()).collect();
            let line = ui::command_line(&argv);
            assert_eq!(split_command(&line).unwrap(), argv, "round trip of {line}");
        }
    }

    #[test]
    fn environment_lines() {
        let env = parse_env("A=1\n\n# comment\n B=x=y\nEMPTY=\n").unwrap();
        assert_eq!(env.get("A").map(String::as_str), Some("1"));
        assert_eq!(env.get("B").map(String::as_str), Some("x=y"));
        assert_eq!(env.get("EMPTY").map(String::as_str), Some(""));
        assert_eq!(env.len(), 3);
        assert!(parse_env("A=1\nnope").unwrap_err().contains("line 2"));
        assert!(
            parse_env("1A=x")
                .unwrap_err()
                .contains("not a variable name")
        );
        assert!(parse_env("A=1\nA=2").unwrap_err().contains("set twice"));
    }

    #[test]
    fn input_json() {
        assert_eq!(parse_input("  ").unwrap(), None);
        assert_eq!(
            parse_input(r#"{"n": 1}"#).unwrap(),
            Some(serde_json::json!({"n": 1}))
        );
        let e = parse_input("{\"n\": }").unwrap_err();
        assert!(e.contains("line 1, column 7"), "{e}");
        assert!(!e.contains(" at line "), "the position is said once: {e}");
    }

    /// A form with `command` typed in it.
    fn form(command: &str) -> Form {
        let form = Form::blank("UTC".to_owned());
        form.command.set(command.to_owned());
        form
    }

    #[test]
    fn resources_and_limits_go_into_the_task_under_the_apis_names() {
        let form = form("sleep 1");
        form.cpu.set("0.5".into());
        form.memory.set(" 256M ".into());
        form.max_output.set("10K".into());
        form.run_as.set(" nobody ".into());
        form.preemptible.set(true);
        let task = form.task().unwrap();
        assert_eq!(task.cpu_millis, Some(500));
        assert_eq!(task.memory_mb, Some(256));
        assert_eq!(task.max_output_bytes, Some(10 * 1024));
        assert_eq!(task.run_as.as_deref(), Some("nobody"));
        assert!(task.preemptible);
        let json = serde_json::to_value(&task).unwrap();
        assert_eq!(json["cpu_millis"], 500);
        assert_eq!(json["memory_mb"], 256);
        assert_eq!(json["max_output_bytes"], 10240);
        assert_eq!(json["run_as"], "nobody");
        assert_eq!(json["preemptible"], true);

        form.cpu.set("250m".into());
        form.memory.set("2G".into());
        assert_eq!(form.task().unwrap().cpu_millis, Some(250));
        assert_eq!(form.task().unwrap().memory_mb, Some(2048));
    }

    #[test]
    fn blank_resource_fields_are_not_sent() {
        let form = form("true");
        form.cpu.set("  ".into());
        form.run_as.set(" ".into());
        let task = form.task().unwrap();
        assert_eq!(task.cpu_millis, None);
        assert_eq!(task.run_as, None);
        let json = serde_json::to_value(&task).unwrap();
        for name in [
            "cpu_millis",
            "memory_mb",
            "max_output_bytes",
            "run_as",
            "preemptible",
        ] {
            assert!(json.get(name).is_none(), "{name} is left out: {json}");
        }
    }

    #[test]
    fn bad_amounts_are_refused_with_the_clis_sentences_naming_the_field() {
        let form = form("true");
        form.memory.set("12X".into());
        assert_eq!(
            form.task().unwrap_err(),
            r#"Memory: unknown unit in "12X" (use K, M, G or T)"#
        );
        form.memory.set("256M".into());
        form.cpu.set("2000".into());
        assert_eq!(
            form.task().unwrap_err(),
            r#"CPU must be between 1m and 1000 cores (1 to 1000000 millicores), got "2000""#
        );
        form.cpu.set("half".into());
        assert_eq!(
            form.task().unwrap_err(),
            r#"CPU must be cores (1, 0.5) or millicores (500m), got "half""#
        );
        form.cpu.set(String::new());
        form.max_output.set("0".into());
        assert_eq!(
            form.task().unwrap_err(),
            r#"Max output must be a positive size, got "0""#
        );
    }

    #[test]
    fn number_fields_keep_what_is_typed_or_refuse_it_naming_the_field_and_its_range() {
        let form = form("true");
        form.priority.set("-3".into());
        form.max_attempts.set("1e3".into());
        form.timeout_secs.set("2.5".into());
        let task = form.task().unwrap();
        assert_eq!(
            (task.priority, task.max_attempts, task.timeout_secs),
            (Some(-3), Some(1000), Some(2.5)),
            "a sign and an exponent are read as typed"
        );
        for (field, text, says) in [
            (
                "priority",
                "99999999999",
                "Priority must be a whole number from -2147483648 to 2147483647, got \"99999999999\"",
            ),
            (
                "priority",
                "1.5",
                "Priority must be a whole number from -2147483648 to 2147483647, got \"1.5\"",
            ),
            (
                "max_attempts",
                "0",
                "Max attempts must be a whole number from 1 to 2147483647, got \"0\"",
            ),
            (
                "max_attempts",
                "-1",
                "Max attempts must be a whole number from 1 to 2147483647, got \"-1\"",
            ),
            (
                "timeout",
                "-5",
                "Timeout must be a number of seconds, more than 0 and at most 3155760000 (100 years), got \"-5\"",
            ),
            (
                "timeout",
                "0",
                "Timeout must be a number of seconds, more than 0 and at most 3155760000 (100 years), got \"0\"",
            ),
            (
                "timeout",
                "1e12",
                "Timeout must be a number of seconds, more than 0 and at most 3155760000 (100 years), got \"1e12\"",
            ),
        ] {
            let form = form_with_defaults();
            match field {
                "priority" => form.priority.set(text.into()),
                "max_attempts" => form.max_attempts.set(text.into()),
                _ => form.timeout_secs.set(text.into()),
            }
            assert_eq!(form.task().unwrap_err(), says, "{field} {text:?}");
        }
        let form = form_with_defaults();
        form.when.set(When::Delay);
        form.delay.set("-10".into());
        assert_eq!(
            form.request().err().as_deref(),
            Some(
                "The delay must be a number of seconds, 0 or more and at most 3155760000 \
                 (100 years), got \"-10\""
            )
        );
    }

    fn form_with_defaults() -> Form {
        form("true")
    }

    #[test]
    fn a_delay_is_sent_in_seconds() {
        let form = form("true");
        form.when.set(When::Delay);
        form.delay.set("1.5".into());
        let Ok(Request::Task(task)) = form.request() else {
            panic!("a delayed task is a task");
        };
        assert_eq!(task.delay_secs, Some(90.0), "minutes unless told otherwise");
        form.delay_unit.set("seconds".into());
        let Ok(Request::Task(task)) = form.request() else {
            panic!("a delayed task is a task");
        };
        assert_eq!(task.delay_secs, Some(1.5));
        form.delay.set(" ".into());
        assert_eq!(form.request().err().as_deref(), Some("Give the delay."));
    }

    #[test]
    fn a_cron_schedule_is_created_with_the_task_as_its_template() {
        let form = form("echo hi");
        form.when.set(When::Cron);
        assert_eq!(
            form.request().err().as_deref(),
            Some("Give the schedule a name.")
        );
        form.name.set(" nightly ".into());
        assert_eq!(
            form.request().err().as_deref(),
            Some("Give a cron expression.")
        );
        form.cron.set("0 0 * * *".into());
        form.time_zone.set(" ".into());
        let Ok(Request::Schedule(schedule)) = form.request() else {
            panic!("the cron choice creates a schedule");
        };
        assert_eq!(schedule.name, "nightly");
        assert_eq!(schedule.cron, "0 0 * * *");
        assert_eq!(
            schedule.time_zone, None,
            "a blank zone is left to the server"
        );
        let template = schedule.task.expect("the task is the template");
        assert_eq!(
            template.command,
            Some(vec!["echo".to_owned(), "hi".to_owned()])
        );
        form.command.set(String::new());
        assert_eq!(
            form.request().err().as_deref(),
            Some("Give a command to run."),
            "the task is checked before the schedule"
        );
    }

    #[test]
    fn readings_say_what_a_field_is_read_as() {
        assert_eq!(reading(parse_memory(""), |mb| format!("{mb} MB")), None);
        assert_eq!(
            reading(parse_memory("1.5G"), |mb| format!("{mb} MB")),
            Some(Ok("1536 MB".to_owned()))
        );
        assert!(matches!(
            reading(parse_cpu("x"), |m| m.to_string()),
            Some(Err(e)) if e.starts_with("CPU must be")
        ));
    }
}
