//! The workers page (`/workers`): the worker registry from `GET /api/v1/workers`, with the
//! tasks each worker runs now (`GET /api/v1/tasks?worker=ID&view=summary`).
//!
//! Live: worker changes and `resync` fetch everything again; task changes move tasks in and
//! out of the running lists at once and fetch everything again at most once a second. A
//! heartbeat is no event, so while nothing else happens the page fetches again once per
//! heartbeat period (a third of the shortest lease), which keeps heartbeat ages and liveness
//! true; ages grow every second in between.

use std::collections::HashMap;

use leptos::prelude::*;
use sked_types::events::TaskSummary;
use sked_types::{TaskState, TaskSummaryPage, Worker};
use uuid::Uuid;

use crate::api::{self, ApiResult};
use crate::live;
use crate::ui::{self, Fetched};

/// Running tasks listed under a worker; the rest are behind a link to the task list.
const RUNNING_SHOWN: usize = 10;

/// The registry and, for each worker that runs something, its running tasks (newest first).
#[derive(Debug, Clone, Default, PartialEq)]
struct Registry {
    workers: Vec<Worker>,
    running: HashMap<Uuid, Vec<TaskSummary>>,
}

async fn load_registry() -> ApiResult<Registry> {
    let workers: Vec<Worker> = api::get("/workers").await?;
    let busy: Vec<Uuid> = workers
        .iter()
        .filter(|w| w.running > 0)
        .map(|w| w.id)
        .collect();
    let pages = futures::future::join_all(busy.iter().map(|id| async move {
        let path = format!("/tasks?worker={id}&view=summary&limit={RUNNING_SHOWN}");
        api::get::<TaskSummaryPage>(&path).await
    }))
    .await;
    let mut running = HashMap::new();
    for (id, page) in busy.into_iter().zip(pages) {
        running.insert(id, page?.tasks);
    }
    Ok(Registry { workers, running })
}

/// Moves changed tasks in and out of the running lists; true when a list changed.
fn patch(registry: &mut Registry, changed: &[TaskSummary]) -> bool {
    let mut any = false;
    for task in changed {
        for (worker, tasks) in registry.running.iter_mut() {
            let runs_here = task.state == TaskState::Running && task.worker_id == Some(*worker);
            match tasks.iter().position(|t| t.id == task.id) {
                Some(i) if runs_here && tasks[i] != *task => {
                    tasks[i] = task.clone();
                    any = true;
                }
                Some(_) if runs_here => {}
                Some(i) => {
                    tasks.remove(i);
                    any = true;
                }
                None => {}
            }
        }
        if task.state == TaskState::Running
            && let Some(worker) = task.worker_id
            && registry.workers.iter().any(|w| w.id == worker)
        {
            let tasks = registry.running.entry(worker).or_default();
            if !tasks.iter().any(|t| t.id == task.id) && tasks.len() < RUNNING_SHOWN {
                tasks.insert(0, task.clone());
                any = true;
            }
        }
    }
    any
}

/// How often the quickest alive worker beats (a third of its lease), in milliseconds, kept
/// between a second and a minute; `None` when no worker is alive.
fn heartbeat_period_ms(r: &Registry) -> Option<f64> {
    r.workers
        .iter()
        .filter(|w| w.alive)
        .map(|w| w.lease_secs * 1000.0 / 3.0)
        .reduce(f64::min)
        .map(|period| period.clamp(1000.0, 60_000.0))
}

#[component]
pub fn Workers() -> impl IntoView {
    let live = live::live();
    let fetched: Fetched<Registry> = Fetched::new();
    let load = move || fetched.load(load_registry());
    load();
    let refetch = ui::throttled(1000.0, load);
    live.on_change(
        |l| {
            l.workers.track();
            l.resync.track();
        },
        refetch.clone(),
    );
    live.on_tasks({
        let refetch = refetch.clone();
        move |changed| {
            fetched
                .data
                .maybe_update(|r| r.as_mut().is_some_and(|r| patch(r, changed)));
            refetch();
        }
    });

    // Heartbeats send no event: fetch again once per heartbeat period of the quickest worker.
    let tick = ui::ticker(1000);
    fetched.refetch_when_older(tick, heartbeat_period_ms, refetch);

    let rows = move || {
        fetched.data.with(|r| {
            let Some(r) = r else {
                return Vec::new();
            };
            r.workers
                .iter()
                .map(|w| {
                    let running = r.running.get(&w.id).cloned().unwrap_or_default();
                    worker_rows(w.clone(), running, tick)
                })
                .collect::<Vec<_>>()
        })
    };
    view! {
        <h1>"Workers"</h1>
        <ui::Loaded
            error=fetched.error_message()
            ready=fetched.ready()
            empty=Signal::derive(move || fetched.data.with(|r| r.as_ref().is_some_and(|r| r.workers.is_empty())))
            when_empty=|| view! { "No worker is registered. Start one with " <code>"sked-worker"</code> "." }
        >
            <p class="hint">{move || summary_line(fetched)}</p>
            <ui::Table class="workers" heads=view! {
                <th>"Worker"</th> <th>"State"</th> <th>"Slots"</th> <th>"Heartbeat"</th>
                <th>"Queues"</th> <th>"Host"</th> <th class="num hide-narrow">"PID"</th>
                <th class="hide-narrow">"Version"</th> <th class="hide-narrow">"Labels"</th>
                <th class="hide-narrow">"Started"</th>
            }>
                {rows}
            </ui::Table>
        </ui::Loaded>
    }
}

fn summary_line(fetched: Fetched<Registry>) -> String {
    fetched.data.with(|r| {
        let Some(r) = r else {
            return String::new();
        };
        let alive = r.workers.iter().filter(|w| w.alive).count();
        let slots: i64 = r
            .workers
            .iter()
            .filter(|w| w.alive)
            .map(|w| i64::from(w.concurrency))
            .sum();
        let busy: i64 = r.workers.iter().map(|w| w.running).sum();
        format!(
            "{alive} of {} registered alive; {} of {} slots in use.",
            r.workers.len(),
            ui::count(busy),
            ui::count(slots)
        )
    })
}

/// `alive`, `stopping` (alive, finishing its tasks before it exits) or `dead` (no heartbeat
/// within its lease).
fn worker_state(w: &Worker) -> &'static str {
    match (w.alive, w.stopping_at.is_some()) {
        (false, _) => "dead",
        (true, true) => "stopping",
        (true, false) => "alive",
    }
}

fn list_or_dash(items: &[String]) -> String {
    if items.is_empty() {
        "—".to_owned()
    } else {
        items.join(", ")
    }
}

/// A worker's row, and below it the tasks it runs.
fn worker_rows(w: Worker, running: Vec<TaskSummary>, tick: ReadSignal<u64>) -> impl IntoView {
    let state = worker_state(&w);
    let used = w.running;
    let capacity = i64::from(w.concurrency.max(0));
    let percent = if capacity > 0 {
        (used as f64 / capacity as f64 * 100.0).clamp(0.0, 100.0)
    } else {
        0.0
    };
    let heartbeat_at = w.heartbeat_at;
    let heartbeat = move || {
        tick.track();
        let secs = (ui::now() - heartbeat_at).num_milliseconds() as f64 / 1000.0;
        if secs < 1.0 {
            "just now".to_owned()
        } else {
            format!("{} ago", ui::duration(secs))
        }
    };
    let stopping_title = w
        .stopping_at
        .map(|at| format!("stopping since {}", ui::local_time(at)));
    let lease_title = format!(
        "lease {}: a worker without a heartbeat for that long is dead",
        ui::duration(w.lease_secs)
    );
    let more = (used as usize > running.len()).then(|| {
        let rest = used - running.len() as i64;
        view! { <li class="more">{format!("and {} more", ui::count(rest))}</li> }
    });
    let tasks = (!running.is_empty()).then(|| {
        let items = running
            .into_iter()
            .map(|t| running_task(t, tick))
            .collect_view();
        view! {
            <tr class="sub" data-running-of=w.id.to_string()>
                <td colspan="10">
                    <ul class="running-tasks">{items}{more}</ul>
                </td>
            </tr>
        }
    });
    view! {
        <tr data-worker-id=w.id.to_string() data-worker-state=state>
            <td title=w.id.to_string()>
                <span class="mono">{w.name.clone()}</span>
            </td>
            <td>
                <span class=format!("badge worker-{state}") title=stopping_title>{state}</span>
            </td>
            <td>
                <span class="slots" title=format!("{used} of {capacity} slots in use")>
                    <span class="slots-bar"><span style=format!("width: {percent:.0}%")></span></span>
                    {format!("{used}/{capacity}")}
                </span>
            </td>
            <td title=lease_title>{heartbeat}</td>
            <td class="wrap">{list_or_dash(&w.queues)}</td>
            <td>{w.host.clone()}</td>
            <td class="num hide-narrow">{w.pid.map(|p| p.to_string()).unwrap_or_default()}</td>
            <td class="hide-narrow">{w.version.clone()}</td>
            <td class="wrap hide-narrow">{list_or_dash(&w.labels)}</td>
            <td class="hide-narrow"><ui::Time at=w.started_at/></td>
        </tr>
        {tasks}
    }
}

/// One running task under its worker: a link to it, what it runs, and for how long.
fn running_task(t: TaskSummary, tick: ReadSignal<u64>) -> impl IntoView {
    let what = t.name.clone().unwrap_or_else(|| ui::summary_line(&t));
    let started = t.started_at;
    let age = move || {
        tick.track();
        started
            .map(|s| ui::duration(((ui::now() - s).num_milliseconds() as f64 / 1000.0).max(0.0)))
            .unwrap_or_default()
    };
    view! {
        <li data-task-id=t.id.to_string() data-state=t.state.as_str()>
            <a class="mono" href=format!("/tasks/{}", t.id)>{ui::short_id(&t.id)}</a>
            <span class="queue">{t.queue.clone()}</span>
            <span class="cmd" title=what.clone()>{what.clone()}</span>
            <span class="age" title="running for">{age}</span>
        </li>
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{DateTime, Utc};

    fn worker(id: Uuid) -> Worker {
        let t: DateTime<Utc> = "2026-11-30T00:00:00Z".parse().unwrap();
        Worker {
            id,
            name: "w".into(),
            host: "h".into(),
            pid: None,
            version: "0".into(),
            queues: vec![],
            labels: vec![],
            concurrency: 4,
            lease_secs: 30.0,
            started_at: t,
            heartbeat_at: t,
            stopping_at: None,
            alive: true,
            running: 0,
            cpu_millis: None,
            memory_mb: None,
            running_cpu_millis: 0,
            running_memory_mb: 0,
        }
    }

    fn task(n: u128, state: TaskState, worker_id: Option<Uuid>) -> TaskSummary {
        let t = crate::fixtures::task_summary(n, state);
        TaskSummary {
            attempt: 1,
            started_at: Some(t.created_at),
            worker_id,
            ..t
        }
    }

    #[test]
    fn changed_tasks_move_in_and_out_of_their_workers_lists() {
        let (a, b) = (Uuid::from_u128(100), Uuid::from_u128(200));
        let mut r = Registry {
            workers: vec![worker(a), worker(b)],
            running: HashMap::from([(a, vec![task(1, TaskState::Running, Some(a))])]),
        };
        let changed = patch(
            &mut r,
            &[
                task(1, TaskState::Succeeded, Some(a)),
                task(2, TaskState::Running, Some(b)),
                task(3, TaskState::Running, Some(Uuid::from_u128(999))),
                task(4, TaskState::Waiting, None),
            ],
        );
        assert!(changed, "the lists changed");
        assert!(
            r.running[&a].is_empty(),
            "a finished task leaves its worker's list"
        );
        let on_b: Vec<Uuid> = r.running[&b].iter().map(|t| t.id).collect();
        assert_eq!(
            on_b,
            [Uuid::from_u128(2)],
            "a started task joins its worker's list"
        );
        assert_eq!(
            r.running.len(),
            2,
            "tasks of unknown workers are not listed"
        );

        // A task handed to another worker (a rescue) moves.
        assert!(patch(&mut r, &[task(2, TaskState::Running, Some(a))]));
        assert!(r.running[&b].is_empty());
        assert_eq!(r.running[&a].len(), 1);
        assert!(
            !patch(&mut r, &[task(2, TaskState::Running, Some(a))]),
            "the same summary again changes nothing"
        );
    }

    #[test]
    fn a_workers_list_holds_at_most_the_shown_number() {
        let a = Uuid::from_u128(100);
        let mut r = Registry {
            workers: vec![worker(a)],
            running: HashMap::new(),
        };
        let started: Vec<TaskSummary> = (1..=RUNNING_SHOWN as u128 + 5)
            .map(|n| task(n, TaskState::Running, Some(a)))
            .collect();
        patch(&mut r, &started);
        assert_eq!(r.running[&a].len(), RUNNING_SHOWN);
    }
}
