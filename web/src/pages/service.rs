//! A service on its task page (see docs/services.md).
//!
//! - Copies: one row per copy with its index, generation, state, worker, uptime or backoff,
//!   restarts and last exit. Read from `GET /api/v1/services/{id}` when the page shows the
//!   service and every few seconds while it runs (a copy's restarts do not change the
//!   service's own row, so no live event names them).
//! - Controls, for its owner and admins while it runs: scale it and change its command and
//!   environment (`PATCH /api/v1/services/{id}`), and stop it after a confirmation
//!   (`POST /api/v1/tasks/{id}/cancel`). Fields are read by the Submit form's helpers.

use leptos::prelude::*;
use leptos::task::spawn_local;
use serde_json::{Map, Value, json};
use sked_types::StateChange;
use sked_types::secrets;
use sked_types::service::{Service, ServiceCopy, ServiceUpdated};
use uuid::Uuid;

use super::submit::{ArgvPreview, Field, parse_env, parse_int, split_command};
use crate::{api, live, ui};

/// Seconds between refetches while the service runs.
const REFRESH_TICKS: u64 = 3;

/// The copies panel of service `id`.
#[component]
pub fn ServiceCopies(id: Uuid, running: bool, tick: ReadSignal<u64>) -> impl IntoView {
    let service = RwSignal::new(None::<Service>);
    let error = RwSignal::new(None::<String>);
    let load = move || {
        spawn_local(async move {
            match api::get::<Service>(&format!("/services/{id}")).await {
                Ok(s) => {
                    service.set(Some(s));
                    error.set(None);
                }
                Err(e) => error.set(Some(e.message)),
            }
        });
    };
    load();
    Effect::new(move |previous: Option<()>| {
        let t = tick.get();
        if previous.is_some() && running && t.is_multiple_of(REFRESH_TICKS) {
            load();
        }
    });
    view! {
        <section class="panel" data-service=id.to_string()>
            <h2>"Copies"</h2>
            <ui::ErrorBox message=error/>
            {move || service.get().map(|s| view! {
                <p class="hint">
                    {format!(
                        "{} of {} up · generation {} · restart {}",
                        s.running, s.replicas, s.generation, s.restart_policy
                    )}
                    {s.health_check.as_ref().map(|h| format!(" · health check {h}"))}
                </p>
                <ui::Table class="copies" heads=view! {
                    <th class="num">"#"</th> <th>"Copy"</th> <th class="num">"Gen"</th>
                    <th>"State"</th> <th>"Worker"</th> <th>"Up"</th> <th class="num">"Restarts"</th>
                    <th class="hide-narrow">"Last exit"</th>
                }>
                    {s.copies.into_iter().map(|c| view! { <CopyRow copy=c/> }).collect_view()}
                </ui::Table>
            })}
        </section>
    }
}

#[component]
fn CopyRow(copy: ServiceCopy) -> impl IntoView {
    let c = copy;
    // Named as the Workers page names it.
    let worker = match c.worker_id {
        Some(w) => view! { <ui::WorkerName id=w/> }.into_any(),
        None => "—".into_any(),
    };
    let up = match (c.uptime_secs, c.backing_off_until) {
        (Some(secs), _) => ui::duration(secs),
        (None, Some(until)) => format!("backing off until {}", ui::local_time(until)),
        _ => "—".into(),
    };
    let last = c.last_exits.first().map(|x| x.error.clone());
    let state = c.state;
    view! {
        <tr class:retired=c.retired>
            <td class="num">{c.index}</td>
            <td>
                <a class="mono" href=format!("/tasks/{}", c.id)>{ui::short_id(&c.id)}</a>
                {c.retired.then_some(" (retired)")}
            </td>
            <td class="num">{c.generation}</td>
            <td><ui::StateBadge state=state/></td>
            <td class="mono">{worker}</td>
            <td>{up}</td>
            <td class="num">{c.restarts}</td>
            <td class="hide-narrow wrap">{last.unwrap_or_else(|| "—".into())}</td>
        </tr>
    }
}

/// The definition fields of the controls as text: the command line (the command and its
/// arguments; the arguments alone for a service that runs an artifact) and the environment
/// as `KEY=VALUE` lines, secret values masked as the API shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DefinitionText {
    /// The service runs an artifact: the line holds its arguments only.
    artifact: bool,
    command: String,
    env: String,
}

impl DefinitionText {
    fn of(s: &Service) -> Self {
        let argv: Vec<String> = match &s.command {
            Some(command) => command.iter().chain(&s.args).cloned().collect(),
            None => s.args.clone(),
        };
        DefinitionText {
            artifact: s.command.is_none(),
            command: ui::command_line(&argv),
            env: s
                .env
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// The replicas typed, refused naming the field and its range (as `PATCH` takes them).
fn scale_change(text: &str) -> Result<Map<String, Value>, String> {
    let replicas = parse_int("Replicas", text, 1, MAX_REPLICAS)?
        .ok_or_else(|| "Give the number of replicas.".to_owned())?;
    let mut changes = Map::new();
    changes.insert("replicas".into(), json!(replicas));
    Ok(changes)
}

/// The keys of `PATCH /api/v1/services/{id}` for the fields that differ from what the
/// service had (`was`): a command line sends `command` (its first word) and `args` (the
/// rest), or `args` alone for an artifact; the environment is sent whole. A value still
/// holding the mask is refused, as the server would: the mask would replace the secret.
fn definition_changes(
    was: &DefinitionText,
    command: &str,
    env: &str,
) -> Result<Map<String, Value>, String> {
    let mut changes = Map::new();
    if command != was.command {
        let argv = split_command(command).map_err(|e| {
            let field = if was.artifact { "arguments" } else { "command" };
            format!("The {field} cannot be split: {e}")
        })?;
        if was.artifact {
            changes.insert("args".into(), json!(argv));
        } else {
            let Some((program, args)) = argv.split_first() else {
                return Err("Give a command to run.".into());
            };
            changes.insert("command".into(), json!([program]));
            changes.insert("args".into(), json!(args));
        }
    }
    if env != was.env {
        let env = parse_env(env)?;
        if let Some((name, _)) = env.iter().find(|(_, v)| v.contains(secrets::MASK)) {
            return Err(format!(
                "Environment: the value of {name} is hidden ({}), as answers show secrets: type \
                 its real value, or remove the line",
                secrets::MASK
            ));
        }
        changes.insert("env".into(), json!(env));
    }
    if changes.is_empty() {
        return Err("Nothing to change: edit the command or the environment.".into());
    }
    Ok(changes)
}

/// Copies a service may want at most (`tasks_replicas_must_be_1_to_1000`).
const MAX_REPLICAS: i32 = 1000;

/// The controls of service `id` that runs, for its owner and admins: scale it, change its
/// definition (a rolling update) and stop it, after a confirmation. Each form shows the
/// API's message when it refuses, and what it did when it did; the page's live updates
/// show the copies that follow.
///
/// The fields are filled from `GET /api/v1/services/{id}` once, and again after a change the
/// API took; what is typed is never replaced meanwhile.
#[component]
pub fn ServiceControls(id: Uuid, owner: String) -> impl IntoView {
    let session = api::session();
    let may = move || {
        session.me.with(|m| {
            m.as_ref()
                .is_some_and(|m| m.role == "admin" || m.owner == owner)
        })
    };
    view! { <Show when=may><Controls id=id/></Show> }
}

#[component]
fn Controls(id: Uuid) -> impl IntoView {
    let live = live::live();
    let service = RwSignal::new(None::<Service>);
    let load_error = RwSignal::new(None::<String>);
    let was = StoredValue::new(None::<DefinitionText>);
    let replicas = RwSignal::new(String::new());
    let command = RwSignal::new(String::new());
    let env = RwSignal::new(String::new());
    let scale_error = RwSignal::new(None::<String>);
    let scale_done = RwSignal::new(None::<String>);
    let update_error = RwSignal::new(None::<String>);
    let update_done = RwSignal::new(None::<String>);
    let stop_error = RwSignal::new(None::<String>);
    let confirming = RwSignal::new(false);
    let stopping = RwSignal::new(false);
    let busy = RwSignal::new(false);

    // Reads the service; `refill` puts its values into the fields (at first, and after a
    // change the API took).
    let load = move |refill: bool| {
        spawn_local(async move {
            match api::get::<Service>(&format!("/services/{id}")).await {
                Ok(s) => {
                    if refill || was.try_get_value().flatten().is_none() {
                        let text = DefinitionText::of(&s);
                        replicas.try_set(s.replicas.to_string());
                        command.try_set(text.command.clone());
                        env.try_set(text.env.clone());
                        was.try_set_value(Some(text));
                    }
                    service.try_set(Some(s));
                    load_error.try_set(None);
                }
                Err(e) => {
                    load_error.try_set(Some(e.message));
                }
            }
        });
    };
    load(true);
    live.on_tasks(move |batch| {
        if batch.iter().any(|t| t.id == id) {
            load(false);
        }
    });
    live.on_change(|l| l.resync.track(), move || load(false));

    // What the last action said goes when another starts: it no longer describes the service.
    let clear_notes = move || {
        for note in [
            scale_error,
            scale_done,
            update_error,
            update_done,
            stop_error,
        ] {
            note.set(None);
        }
    };
    // Sends `changes`; says what the API did, or its message, through `error` and `done`.
    let send = move |changes: Result<Map<String, Value>, String>,
                     error: RwSignal<Option<String>>,
                     done: RwSignal<Option<String>>| {
        clear_notes();
        let changes = match changes {
            Ok(c) => c,
            Err(message) => {
                error.set(Some(message));
                return;
            }
        };
        busy.set(true);
        spawn_local(async move {
            let result = api::patch::<_, ServiceUpdated>(
                &format!("/services/{id}"),
                &Value::Object(changes),
            )
            .await;
            busy.try_set(false);
            match result {
                Ok(u) => {
                    done.try_set(Some(format!(
                        "Done: generation {}, {} {}.",
                        u.generation,
                        u.replicas,
                        if u.replicas == 1 {
                            "replica"
                        } else {
                            "replicas"
                        }
                    )));
                    load(true);
                }
                Err(e) => {
                    error.try_set(Some(e.message));
                }
            }
        });
    };
    let on_scale = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        if !busy.get_untracked() {
            send(
                replicas.with_untracked(|t| scale_change(t)),
                scale_error,
                scale_done,
            );
        }
    };
    let on_update = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        if busy.get_untracked() {
            return;
        }
        let Some(before) = was.get_value() else {
            return;
        };
        let changes = definition_changes(&before, &command.get_untracked(), &env.get_untracked());
        send(changes, update_error, update_done);
    };
    let stop = move |_| {
        busy.set(true);
        clear_notes();
        spawn_local(async move {
            let result = api::post_empty::<StateChange>(&format!("/tasks/{id}/cancel")).await;
            busy.try_set(false);
            confirming.try_set(false);
            match result {
                Ok(_) => {
                    stopping.try_set(true);
                }
                Err(e) => {
                    stop_error.try_set(Some(e.message));
                }
            }
        });
    };

    // Read once the service is: its fields are shown only then.
    let command_label = move || {
        if was.with_value(|w| w.as_ref().is_some_and(|w| w.artifact)) {
            "Arguments"
        } else {
            "Command"
        }
    };
    let argv = Memo::new(move |_| command.with(|c| split_command(c)));
    let env_problem = Memo::new(move |_| env.with(|e| parse_env(e).err().map(Err)));
    let masked = move || env.with(|e| e.contains(secrets::MASK));
    let copies = move || service.with(|s| s.as_ref().map_or(0, |s| s.replicas));
    view! {
        <section class="panel service-controls" data-service-controls=id.to_string()>
            <h2>"Change"</h2>
            <ui::ErrorBox message=load_error/>
            {move || service.get().map(|s| view! {
                <p class="hint" data-generation=s.generation data-replicas=s.replicas>
                    {format!(
                        "Generation {} · {} {} wanted. A change of the definition rolls the copies over \
                         to a new generation one at a time; scaling adds or stops copies.",
                        s.generation,
                        s.replicas,
                        if s.replicas == 1 { "copy" } else { "copies" }
                    )}
                </p>
            })}
            <Show when=move || service.with(Option::is_some)>
            <form class="form service-form" data-form="scale" on:submit=on_scale novalidate=true>
                <Field id="service-replicas" label="Replicas" name="replicas" value=replicas inputmode="numeric"
                    no_autocomplete=true hint="copies to keep running, 1 to 1000"/>
                <span></span>
                <div>
                    <ui::ErrorBox message=scale_error/>
                    {move || scale_done.get().map(|d| view! { <p class="notice" role="status" data-done="">{d}</p> })}
                    <div class="actions">
                        <button type="submit" class="primary" data-action="scale" disabled=move || busy.get()>"Scale"</button>
                    </div>
                </div>
            </form>
            <form class="form service-form" data-form="definition" on:submit=on_update novalidate=true>
                <Field id="service-command" label={command_label()} name="command"
                    value=command class="mono wide" no_autocomplete=true no_spellcheck=true>
                    <p class="hint">
                        "One line, split into arguments like a shell does ('…' and \"…\" quote, \\ escapes); nothing is expanded."
                    </p>
                    <ArgvPreview argv=argv/>
                </Field>
                <Field id="service-env" label="Environment" name="env" value=env rows="4" no_spellcheck=true
                    placeholder="KEY=VALUE, one per line" reading=env_problem>
                    <Show when=masked>
                        <p class="hint" data-masked="">
                            {format!(
                                "Values shown as {} are secret: to change the environment, type the real value \
                                 of each (it is sent whole); leave it as it is to keep them.",
                                secrets::MASK
                            )}
                        </p>
                    </Show>
                </Field>
                <span></span>
                <div>
                    <ui::ErrorBox message=update_error/>
                    {move || update_done.get().map(|d| view! { <p class="notice" role="status" data-done="">{d}</p> })}
                    <div class="actions">
                        <button type="submit" class="primary" data-action="update" disabled=move || busy.get()>
                            "Roll out"
                        </button>
                    </div>
                </div>
            </form>
            </Show>
            <div class="actions service-stop">
                <Show
                    when=move || confirming.get()
                    fallback=move || view! {
                        <ui::ActionButton action="stop" danger=true disabled=Signal::derive(move || busy.get() || stopping.get())
                            title="Stop the service: every copy is stopped" on_click=move |_| confirming.set(true)>
                            {move || if stopping.get() { "Stopping…" } else { "Stop service" }}
                        </ui::ActionButton>
                    }
                >
                    <p class="notice" role="alert" data-confirm="stop">
                        {move || format!(
                            "Stop this service? Its {} {} get SIGTERM, then SIGKILL after the worker's kill grace; \
                             the service ends cancelled (Retry starts it again).",
                            copies(),
                            if copies() == 1 { "copy" } else { "copies" }
                        )}
                    </p>
                    <ui::ActionButton action="confirm-stop" danger=true disabled=busy on_click=stop>
                        "Stop it"
                    </ui::ActionButton>
                    <ui::ActionButton action="keep" disabled=busy on_click=move |_| confirming.set(false)>
                        "Keep it running"
                    </ui::ActionButton>
                </Show>
            </div>
            <ui::ErrorBox message=stop_error/>
        </section>
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn was(artifact: bool) -> DefinitionText {
        DefinitionText {
            artifact,
            command: "sleep 300".into(),
            env: format!("API_TOKEN={}\nMODE=a", secrets::MASK),
        }
    }

    #[test]
    fn replicas_are_read_as_typed_or_refused_naming_the_field_and_its_range() {
        assert_eq!(scale_change(" 2 ").unwrap()["replicas"], 2);
        assert_eq!(scale_change("1e1").unwrap()["replicas"], 10);
        for text in ["0", "-2", "1001", "1.5", "two"] {
            assert_eq!(
                scale_change(text).unwrap_err(),
                format!("Replicas must be a whole number from 1 to 1000, got {text:?}")
            );
        }
        assert_eq!(
            scale_change(" ").unwrap_err(),
            "Give the number of replicas."
        );
    }

    #[test]
    fn only_what_changed_is_sent() {
        let w = was(false);
        let changes = definition_changes(&w, "sleep 'a b'", &w.env).unwrap();
        assert_eq!(
            Value::Object(changes),
            json!({"command": ["sleep"], "args": ["a b"]}),
            "the environment, untouched, keeps its secrets"
        );
        assert_eq!(
            definition_changes(&w, &w.command, &w.env).unwrap_err(),
            "Nothing to change: edit the command or the environment."
        );
        assert_eq!(
            definition_changes(&w, "  ", &w.env).unwrap_err(),
            "Give a command to run."
        );
        assert!(
            definition_changes(&w, "echo 'open", &w.env)
                .unwrap_err()
                .starts_with("The command cannot be split")
        );
        let changes = definition_changes(&was(true), "--port 8080", &w.env).unwrap();
        assert_eq!(
            Value::Object(changes),
            json!({"args": ["--port", "8080"]}),
            "an artifact's line is its arguments"
        );
    }

    #[test]
    fn an_environment_that_still_holds_the_mask_is_refused() {
        let w = was(false);
        let e = definition_changes(&w, &w.command, &w.env.replace("MODE=a", "MODE=b")).unwrap_err();
        assert!(e.contains("API_TOKEN") && e.contains(secrets::MASK), "{e}");
        let changes = definition_changes(&w, &w.command, "API_TOKEN=real\nMODE=b").unwrap();
        assert_eq!(
            Value::Object(changes),
            json!({"env": {"API_TOKEN": "real", "MODE": "b"}})
        );
        assert!(
            definition_changes(&w, &w.command, "MODE")
                .unwrap_err()
                .contains("line 1")
        );
    }
}
