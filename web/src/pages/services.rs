//! The services page (`/services`): the long-running services that run (docs/services.md),
//! from `GET /api/v1/services`, oldest first: each one's name (a link to its task page, whose
//! Copies panel shows every copy), whether all the copies it wants are up, copies up out of
//! replicas wanted, queue, generation, restart policy, command, owner (admins) and age.
//!
//! The listing counts the copies whose process is up; it carries no copy, so restarts, health
//! checks and uptimes are on each service's own page. A copy's process starting or exiting is
//! no live event, so the page fetches the list again every few seconds while it is open.
//! Task events about a service or its copies (a copy claimed or ended, a service stopped) and
//! `resync` fetch it at once, at most once a second.

use leptos::prelude::*;
use sked_types::TaskKind;
use sked_types::events::TaskSummary;
use sked_types::service::{Service, ServiceList};

use crate::ui::{self, Fetched};
use crate::{api, live};

/// Milliseconds without an answer after which the page fetches the list again.
const REFRESH_MS: f64 = 3000.0;
/// Most services the API lists (`MAX_SERVICES` of the server).
const LISTED_AT_MOST: usize = 1000;

/// Whether a service has the copies it wants up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Health {
    /// As many copies up as it wants, or more while old ones stop (a rolling update or a
    /// scale-down).
    Up,
    /// Some copies up, fewer than it wants.
    Degraded,
    /// No copy up.
    Down,
}

impl Health {
    fn of(running: i32, replicas: i32) -> Health {
        if running >= replicas {
            Health::Up
        } else if running > 0 {
            Health::Degraded
        } else {
            Health::Down
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Health::Up => "up",
            Health::Degraded => "degraded",
            Health::Down => "down",
        }
    }

    /// The badge colour, shared with the task states of the same meaning.
    fn class(self) -> &'static str {
        match self {
            Health::Up => "state-succeeded",
            Health::Degraded => "state-retry",
            Health::Down => "state-failed",
        }
    }
}

/// The counts of the summary line.
#[derive(Debug, Default, PartialEq, Eq)]
struct Tally {
    services: usize,
    up: usize,
    degraded: usize,
    down: usize,
    /// Copies up that count toward what the services want (each service's surplus of old
    /// copies still stopping left out).
    copies_up: i64,
    copies_wanted: i64,
}

fn tally(services: &[Service]) -> Tally {
    let mut t = Tally {
        services: services.len(),
        ..Tally::default()
    };
    for s in services {
        match Health::of(s.running, s.replicas) {
            Health::Up => t.up += 1,
            Health::Degraded => t.degraded += 1,
            Health::Down => t.down += 1,
        }
        t.copies_up += i64::from(s.running.clamp(0, s.replicas));
        t.copies_wanted += i64::from(s.replicas);
    }
    t
}

fn summary_line(t: &Tally) -> String {
    let noun = if t.services == 1 {
        "service runs"
    } else {
        "services run"
    };
    let mut line = format!(
        "{} {noun}: {} up, {} degraded, {} down; {} of {} copies up.",
        ui::count(t.services as i64),
        t.up,
        t.degraded,
        t.down,
        ui::count(t.copies_up),
        ui::count(t.copies_wanted)
    );
    if t.services >= LISTED_AT_MOST {
        line.push_str(&format!(
            " The API lists the oldest {}.",
            ui::count(LISTED_AT_MOST as i64)
        ));
    }
    line
}

/// Whether a batch of changed tasks holds a service or a copy of one: it may change the list.
fn about_services(changed: &[TaskSummary]) -> bool {
    changed.iter().any(|t| t.kind == TaskKind::Service)
}

/// What a service runs: its command or artifact, and its arguments.
fn command_of(s: &Service) -> String {
    let mut argv: Vec<String> = match (&s.command, &s.artifact_url) {
        (Some(command), _) => command.clone(),
        (None, Some(url)) => vec![url.clone()],
        (None, None) => Vec::new(),
    };
    argv.extend(s.args.iter().cloned());
    ui::command_line(&argv)
}

#[component]
pub fn Services() -> impl IntoView {
    let session = api::session();
    let live = live::live();
    let fetched: Fetched<ServiceList> = Fetched::new();
    let load = move || fetched.load(api::get::<ServiceList>("/services"));
    load();
    let refetch = ui::throttled(1000.0, load);
    live.on_change(|l| l.resync.track(), refetch.clone());
    live.on_tasks({
        let refetch = refetch.clone();
        move |changed| {
            if about_services(changed) {
                refetch();
            }
        }
    });
    // Copies coming up and going down send no event: fetch again once the answer is old.
    let tick = ui::ticker(1000);
    fetched.refetch_when_older(tick, |_| Some(REFRESH_MS), refetch);

    let is_admin = move || {
        session
            .me
            .with(|m| m.as_ref().is_some_and(|m| m.role == "admin"))
    };
    let rows = move || {
        let admin = is_admin();
        fetched.data.with(|l| {
            l.iter()
                .flat_map(|l| l.services.iter())
                .map(|s| service_row(s.clone(), admin, tick))
                .collect_view()
        })
    };
    view! {
        <h1>"Services"</h1>
        <ui::Loaded
            error=fetched.error_message()
            ready=fetched.ready()
            empty=Signal::derive(move || fetched.data.with(|l| l.as_ref().is_some_and(|l| l.services.is_empty())))
            when_empty=|| view! {
                "No services run. Submit one as a task of kind " <code>"service"</code>
                " (" <code>"sked submit --service --replicas 2 -- COMMAND"</code>
                "); see " <code>"docs/services.md"</code> "."
            }
        >
            <p class="hint">
                {move || fetched.data.with(|l| {
                    l.as_ref().map(|l| summary_line(&tally(&l.services))).unwrap_or_default()
                })}
            </p>
            <ui::Table class="service-list" heads=view! {
                <th>"Service"</th> <th>"State"</th> <th>"Copies"</th> <th>"Queue"</th>
                <th class="num hide-narrow">"Gen"</th> <th class="hide-narrow">"Restart"</th>
                <th class="hide-narrow">"Command"</th>
                <Show when=is_admin><th class="hide-narrow">"Owner"</th></Show> <th>"Created"</th>
            }>
                {rows}
            </ui::Table>
        </ui::Loaded>
    }
}

/// What else the copies say, in words: how many passed their health check (when the service
/// has one), how many wait for a worker, and their restarts; empty when there is nothing.
fn copy_details(s: &Service) -> String {
    let mut parts = Vec::new();
    if let Some(healthy) = s.healthy {
        parts.push(format!("{healthy} healthy"));
    }
    if s.waiting > 0 {
        parts.push(format!("{} waiting for a worker", s.waiting));
    }
    if s.restarts > 0 {
        parts.push(format!(
            "{} restart{}",
            s.restarts,
            if s.restarts == 1 { "" } else { "s" }
        ));
    }
    parts.join(" · ")
}

/// A service's row.
fn service_row(s: Service, admin: bool, tick: ReadSignal<u64>) -> impl IntoView {
    let health = Health::of(s.running, s.replicas);
    // Without a name, the short id, as the task list shows it.
    let (name, name_class) = match &s.name {
        Some(name) => (name.clone(), ""),
        None => (ui::short_id(&s.id), "mono"),
    };
    let command = command_of(&s);
    let percent = if s.replicas > 0 {
        (f64::from(s.running) / f64::from(s.replicas) * 100.0).clamp(0.0, 100.0)
    } else {
        0.0
    };
    let copies_title = if s.running > s.replicas {
        format!(
            "{} copies wanted; {} old copies are still stopping (a rolling update or a scale-down)",
            s.replicas,
            s.running - s.replicas
        )
    } else {
        format!(
            "{} of {} copies wanted have their process up",
            s.running, s.replicas
        )
    };
    let created = s.created_at;
    let details = copy_details(&s);
    view! {
        <tr
            data-service-id=s.id.to_string()
            data-health=health.as_str()
            data-running=s.running.to_string()
            data-replicas=s.replicas.to_string()
        >
            <td>
                <a class=name_class href=format!("/tasks/{}", s.id) title=s.id.to_string()>
                    {name}
                </a>
            </td>
            <td>
                <span class=format!("badge {}", health.class()) data-health=health.as_str()>
                    {health.as_str()}
                </span>
            </td>
            <td>
                <span class="slots" title=copies_title>
                    <span class="slots-bar"><span style=format!("width: {percent:.0}%")></span></span>
                    {format!("{} of {} up", s.running, s.replicas)}
                </span>
                {(!details.is_empty()).then(|| view! { <div class="hint" data-copy-details="">{details.clone()}</div> })}
            </td>
            <td>{s.queue.clone()}</td>
            <td class="num hide-narrow">{s.generation}</td>
            <td class="hide-narrow">{s.restart_policy.clone()}</td>
            <td class="hide-narrow"><div class="cmd" title=command.clone()>{command.clone()}</div></td>
            {admin.then(|| view! { <td class="hide-narrow">{s.owner.clone()}</td> })}
            <td>{ui::age(created, tick)}</td>
        </tr>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};
    use sked_types::TaskState;
    use uuid::Uuid;

    fn service(running: i32, replicas: i32) -> Service {
        let t: DateTime<Utc> = "2026-12-01T00:00:00Z".parse().unwrap();
        Service {
            id: Uuid::from_u128(1),
            owner: "alice".into(),
            name: None,
            queue: "default".into(),
            state: TaskState::Blocked,
            command: Some(vec!["sleep".into()]),
            args: vec!["300".into()],
            artifact_url: None,
            artifact_sha256: None,
            input: None,
            env: Default::default(),
            labels: vec![],
            cpu_millis: None,
            memory_mb: None,
            max_output_bytes: None,
            run_as: None,
            restart_policy: "always".into(),
            health_check: None,
            replicas,
            running,
            healthy: None,
            waiting: 0,
            restarts: 0,
            generation: 1,
            created_at: t,
            finished_at: None,
            copies: vec![],
        }
    }

    #[test]
    fn a_service_with_fewer_copies_up_than_it_wants_is_degraded_or_down() {
        assert_eq!(Health::of(2, 2), Health::Up);
        assert_eq!(
            Health::of(3, 2),
            Health::Up,
            "an old copy still stopping next to the wanted ones is no fault"
        );
        assert_eq!(Health::of(1, 2), Health::Degraded);
        assert_eq!(Health::of(0, 2), Health::Down);
        assert_eq!(Health::of(0, 1), Health::Down);
    }

    #[test]
    fn the_summary_counts_services_by_health_and_copies_up_of_those_wanted() {
        let services = [service(2, 2), service(3, 2), service(1, 3), service(0, 1)];
        let t = tally(&services);
        assert_eq!(
            t,
            Tally {
                services: 4,
                up: 2,
                degraded: 1,
                down: 1,
                copies_up: 5,
                copies_wanted: 8,
            },
            "a surplus of stopping copies does not count toward what is wanted"
        );
        assert_eq!(
            summary_line(&t),
            "4 services run: 2 up, 1 degraded, 1 down; 5 of 8 copies up."
        );
        assert_eq!(
            summary_line(&tally(&services[..1])),
            "1 service runs: 1 up, 0 degraded, 0 down; 2 of 2 copies up."
        );
    }

    #[test]
    fn only_events_about_services_or_their_copies_refetch_the_list() {
        let task = |kind| TaskSummary {
            kind,
            ..crate::fixtures::task_summary(2, TaskState::Running)
        };
        assert!(!about_services(&[
            task(TaskKind::Command),
            task(TaskKind::Noop)
        ]));
        assert!(about_services(&[
            task(TaskKind::Command),
            task(TaskKind::Service)
        ]));
        assert!(!about_services(&[]));
    }

    #[test]
    fn the_command_is_the_command_or_artifact_then_the_arguments() {
        let mut s = service(1, 1);
        assert_eq!(command_of(&s), "sleep 300");
        s.command = None;
        s.artifact_url = Some("https://example.com/app".into());
        s.args = vec!["--port".into(), "8080 1".into()];
        assert_eq!(command_of(&s), "https://example.com/app --port '8080 1'");
    }

    #[test]
    fn copy_details_name_health_waiting_copies_and_restarts_only_when_they_say_something() {
        let mut s = service(2, 3);
        assert_eq!(copy_details(&s), "");
        s.healthy = Some(1);
        s.waiting = 1;
        s.restarts = 1;
        assert_eq!(
            copy_details(&s),
            "1 healthy · 1 waiting for a worker · 1 restart"
        );
        s.healthy = None;
        s.waiting = 0;
        s.restarts = 7;
        assert_eq!(copy_details(&s), "7 restarts");
    }
}
