//! The queues page (`/queues`): per queue, the tasks due now (its depth), delayed, running and
//! retrying, and how long its oldest due task has waited.
//!
//! The numbers come from `GET /api/v1/overview`, the snapshot `GET /api/v1/queues` is built
//! from: the overview tells due tasks from delayed ones, which `/queues` counts together as
//! `waiting`. Live like the overview page.

use leptos::prelude::*;
use sked_types::QueueOverview;

use crate::api;
use crate::pages::overview::{aged_secs, live_overview};
use crate::ui::{self, ErrorBox};

#[component]
pub fn Queues() -> impl IntoView {
    let (fetched, tick) = live_overview();
    let aged = aged_secs(fetched, tick);
    let queues = Memo::new(move |_| {
        fetched
            .data
            .with(|o| o.as_ref().map(|o| o.queues.clone()).unwrap_or_default())
    });
    let error = move || {
        fetched
            .error
            .get()
            .map(|e| view! { <ErrorBox message=e.message/> })
    };
    let rows = move || {
        queues
            .get()
            .into_iter()
            .map(|q| queue_row(q, aged))
            .collect_view()
    };
    view! {
        <h1>"Queues"</h1>
        {error}
        <Show
            when=move || fetched.data.with(Option::is_some)
            fallback=move || {
                (!fetched.answered()).then(|| view! { <p class="empty loading">"Loading…"</p> })
            }
        >
            <Show
                when=move || queues.with(|qs| !qs.is_empty())
                fallback=|| view! {
                    <p class="empty">"No queue has unfinished tasks or tasks finished in the last hour."</p>
                }
            >
                <p class="hint">
                    {move || fetched.data.with(|o| o.as_ref().map(|o| {
                        let whose = o.owner.as_ref().map_or_else(
                            || "every owner's tasks".to_owned(),
                            |owner| format!("tasks of {owner}"),
                        );
                        format!("Queues with unfinished tasks or tasks finished in the last hour; {whose}.")
                    }))}
                </p>
                <div class="table-wrap">
                    <table class="queues">
                        <thead>
                            <tr>
                                <th>"Queue"</th>
                                <th class="num" title="waiting and due: claimable now">"Depth (due)"</th>
                                <th class="num" title="how long the oldest due task has waited">"Oldest due"</th>
                                <th class="num" title="waiting for their start time">"Delayed"</th>
                                <th class="num">"Running"</th>
                                <th class="num" title="failed attempts waiting for their backoff">"Retry"</th>
                                <th class="num hide-narrow" title="waiting for workflow parents or shards">"Blocked"</th>
                                <th class="hide-narrow"></th>
                            </tr>
                        </thead>
                        <tbody>{rows}</tbody>
                    </table>
                </div>
            </Show>
        </Show>
    }
}

fn queue_row(q: QueueOverview, aged: Signal<f64>) -> impl IntoView {
    let href = format!("/tasks?queue={}", api::enc(&q.queue));
    let cell = |n: i64, class: &'static str| {
        let class = if n == 0 {
            format!("num zero {class}")
        } else {
            format!("num {class}")
        };
        view! { <td class=class>{ui::count(n)}</td> }
    };
    let oldest = q.oldest_due_secs;
    view! {
        <tr data-queue=q.queue.clone()>
            <td><a href=href.clone()>{q.queue.clone()}</a></td>
            {cell(q.waiting_due, "")}
            <td class="num">
                {move || oldest.map(|s| ui::duration(s + aged.get())).unwrap_or_else(|| "—".to_owned())}
            </td>
            {cell(q.waiting_delayed, "")}
            {cell(q.running, "")}
            {cell(q.retry, "")}
            {cell(q.blocked, "hide-narrow")}
            <td class="hide-narrow"><a href=href>"tasks →"</a></td>
        </tr>
    }
}
