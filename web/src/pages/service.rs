//! A service's copies on its task page (see docs/services.md): one row per copy with its
//! index, generation, state, worker, uptime or backoff, restarts and last exit. Read from
//! `GET /api/v1/services/{id}` when the page shows the service and every few seconds while
//! it runs (a copy's restarts do not change the service's own row, so no live event names
//! them).

use leptos::prelude::*;
use leptos::task::spawn_local;
use sked_types::service::{Service, ServiceCopy};
use uuid::Uuid;

use crate::{api, ui};

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
