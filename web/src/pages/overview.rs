//! The overview page (`/`): cards with the totals, the counts of each queue, and a chart of
//! the tasks finished in each minute of the last hour, from `GET /api/v1/overview`.
//!
//! Live: the page fetches the overview again (at most once a second) when tasks or workers
//! change and on `resync`, and when the database clock enters a new minute, which moves the
//! chart's hour and may make delayed tasks due. Ages grow every second between answers.

use chrono::{DateTime, Duration, Utc};
use leptos::prelude::*;
use sked_types::{FinalCounts, MinuteFinishes, Overview as OverviewData, QueueOverview};

use crate::api;
use crate::live;
use crate::ui::{self, Fetched};

/// Milliseconds after the database clock's next minute at which the page fetches again, so
/// that the new minute has begun on the server too.
const NEXT_MINUTE_MARGIN_MS: f64 = 500.0;

/// The overview from `GET /api/v1/overview`, fetched again (at most once a second) when tasks
/// or workers change, on `resync`, and when the database clock enters a new minute.
pub(crate) fn live_overview() -> (Fetched<OverviewData>, ReadSignal<u64>) {
    let live = live::live();
    let fetched: Fetched<OverviewData> = Fetched::new();
    let load = move || fetched.load(api::get::<OverviewData>("/overview"));
    load();
    let refetch = ui::throttled(1000.0, load);
    live.on_change(
        |l| {
            l.tasks.track();
            l.workers.track();
            l.resync.track();
        },
        refetch.clone(),
    );

    // The last hour ends with the database clock's minute, and delayed tasks become due with
    // time: fetch again when that minute turns.
    let tick = ui::ticker(1000);
    let asked_for_minute = StoredValue::new(None::<DateTime<Utc>>);
    Effect::new(move |_| {
        tick.track();
        let Some((next_minute, at)) = fetched
            .data
            .with_untracked(|o| o.as_ref().map(|o| (o.since + Duration::minutes(60), o.at)))
        else {
            return;
        };
        let due_ms = (next_minute - at).num_milliseconds() as f64 + NEXT_MINUTE_MARGIN_MS;
        let elapsed_ms = js_sys::Date::now() - fetched.received_ms.get_untracked();
        if elapsed_ms >= due_ms && asked_for_minute.get_value() != Some(next_minute) {
            asked_for_minute.set_value(Some(next_minute));
            refetch();
        }
    });
    (fetched, tick)
}

/// Seconds the shown overview has aged since it arrived, re-evaluated at every tick: an age
/// the API gave at its `at` is that age plus this.
pub(crate) fn aged_secs(fetched: Fetched<OverviewData>, tick: ReadSignal<u64>) -> Signal<f64> {
    Signal::derive(move || {
        tick.track();
        ((js_sys::Date::now() - fetched.received_ms.get()) / 1000.0).max(0.0)
    })
}

#[component]
pub fn Overview() -> impl IntoView {
    let (fetched, tick) = live_overview();
    let queues = Memo::new(move |_| {
        fetched
            .data
            .with(|o| o.as_ref().map(|o| o.queues.clone()).unwrap_or_default())
    });
    let series = Memo::new(move |_| {
        fetched
            .data
            .with(|o| o.as_ref().map(|o| o.series.clone()).unwrap_or_default())
    });
    let aged = aged_secs(fetched, tick);

    view! {
        <h1>"Overview"</h1>
        <ui::Loaded error=fetched.error_message() ready=fetched.ready()>
            <p class="hint" data-overview-at=move || fetched.data.with(|o| o.as_ref().map(|o| o.at.to_rfc3339()))>
                {move || fetched.data.with(|o| o.as_ref().map(scope_line))}
            </p>
            <Cards fetched=fetched queues=queues aged=aged/>
            <section class="panel">
                <h2 class="panel-title">"Tasks finished per minute, last hour"</h2>
                <p class="legend">
                    <span class="swatch bar-ok"></span>"succeeded "
                    <span class="swatch bar-bad"></span>"failed"
                </p>
                {move || minute_chart(&series.get())}
            </section>
            <h2>"Queues"</h2>
            <QueueTable queues=queues aged=aged/>
        </ui::Loaded>
    }
}

/// Whose tasks are counted, and when.
fn scope_line(o: &OverviewData) -> String {
    let whose = match &o.owner {
        Some(owner) => format!("Tasks of {owner}"),
        None => "Tasks of every owner".to_owned(),
    };
    format!(
        "{whose}, counted at {}. Finished counts cover the last hour.",
        ui::local_time(o.at)
    )
}

/// The totals over all queues.
#[component]
fn Cards(
    fetched: Fetched<OverviewData>,
    queues: Memo<Vec<QueueOverview>>,
    aged: Signal<f64>,
) -> impl IntoView {
    let sum = move |f: fn(&QueueOverview) -> i64| {
        Signal::derive(move || ui::count(queues.with(|qs| qs.iter().map(f).sum())))
    };
    let oldest = Signal::derive(move || {
        let oldest = queues.with(|qs| {
            qs.iter()
                .filter_map(|q| q.oldest_due_secs)
                .fold(None, |m: Option<f64>, s| Some(m.map_or(s, |m| m.max(s))))
        });
        match oldest {
            Some(secs) => ui::duration(secs + aged.get()),
            None => "none due".to_owned(),
        }
    });
    let workers = Signal::derive(move || {
        fetched.data.with(|o| {
            o.as_ref()
                .map(|o| format!("{} / {}", o.workers.alive, o.workers.total))
                .unwrap_or_default()
        })
    });
    // The failures the card counts: those since the start of the overview's hour.
    let failed_last_hour = Signal::derive(move || {
        fetched.data.with(|o| {
            let since = o.as_ref().map(|o| o.since.to_rfc3339()).unwrap_or_default();
            format!("/tasks?state=failed&finished_after={}", api::enc(&since))
        })
    });
    view! {
        <div class="cards overview-cards">
            <Card key="running" label="running" value=sum(|q| q.running) href="/tasks?state=running"/>
            <Card key="waiting_due" label="waiting, due" value=sum(|q| q.waiting_due) href="/tasks?state=waiting&due=now"/>
            <Card key="delayed" label="delayed" value=sum(|q| q.waiting_delayed) href="/tasks?state=waiting&due=later"/>
            <Card key="retry" label="retrying" value=sum(|q| q.retry) href="/tasks?state=retry"/>
            <Card key="failed_last_hour" label="failed, last hour" value=sum(|q| q.finished.failed) href=failed_last_hour/>
            <Card key="oldest_due" label="oldest due task waiting" value=oldest/>
            <Card key="workers" label="workers alive / total" value=workers href="/workers"/>
        </div>
    }
}

#[component]
fn Card(
    key: &'static str,
    label: &'static str,
    value: Signal<String>,
    /// The list of exactly the tasks the card counts.
    #[prop(optional, into)]
    href: MaybeProp<String>,
) -> impl IntoView {
    view! {
        <a class="card" href=move || href.get() data-card=key>
            <div class="num">{move || value.get()}</div>
            <div class="label">{label}</div>
        </a>
    }
}

/// A count's cell, which follows `n`; a zero is muted. `narrow`: hidden on narrow screens.
#[component]
fn CountCell(#[prop(into)] n: Signal<i64>, #[prop(optional)] narrow: bool) -> impl IntoView {
    let class = move || match (n.get() == 0, narrow) {
        (false, false) => "num",
        (true, false) => "num zero",
        (false, true) => "num hide-narrow",
        (true, true) => "num zero hide-narrow",
    };
    view! { <td class=class>{move || ui::count(n.get())}</td> }
}

/// The heads of the columns that both queue tables (this page's and the queues page's) start
/// with: the queue, then its unfinished tasks; `due` names the column of the tasks due now.
#[component]
pub(crate) fn QueueCountHeads(due: &'static str) -> impl IntoView {
    view! {
        <th>"Queue"</th>
        <th class="num" title="waiting and due: claimable now">{due}</th>
        <th class="num" title="how long the oldest due task has waited">"Oldest due"</th>
        <th class="num" title="waiting for their start time">"Delayed"</th>
        <th class="num">"Running"</th>
        <th class="num" title="failed attempts waiting for their backoff">"Retry"</th>
        <th class="num hide-narrow" title="waiting for workflow parents or shards">"Blocked"</th>
    }
}

/// The cells under [`QueueCountHeads`] of the queue `q`, which they follow: its name (a link
/// to its tasks) and its unfinished tasks, the oldest due one's wait grown by `aged`.
#[component]
pub(crate) fn QueueCountCells(
    #[prop(into)] q: Signal<QueueOverview>,
    aged: Signal<f64>,
) -> impl IntoView {
    let name = q.with_untracked(|q| q.queue.clone());
    let href = format!("/tasks?queue={}", api::enc(&name));
    let n = move |count: fn(&QueueOverview) -> i64| Signal::derive(move || q.with(count));
    let oldest = move || {
        q.with(|q| q.oldest_due_secs)
            .map(|s| ui::duration(s + aged.get()))
            .unwrap_or_else(|| "—".to_owned())
    };
    view! {
        <td><a href=href>{name}</a></td>
        <CountCell n=n(|q| q.waiting_due)/>
        <td class="num">{oldest}</td>
        <CountCell n=n(|q| q.waiting_delayed)/>
        <CountCell n=n(|q| q.running)/>
        <CountCell n=n(|q| q.retry)/>
        <CountCell n=n(|q| q.blocked) narrow=true/>
    }
}

/// Counts of each queue: unfinished tasks now, and tasks finished in the last hour.
#[component]
fn QueueTable(queues: Memo<Vec<QueueOverview>>, aged: Signal<f64>) -> impl IntoView {
    let rows = move || {
        queues
            .get()
            .into_iter()
            .map(|q| {
                let (name, f) = (q.queue.clone(), q.finished);
                view! {
                    <tr data-queue=name>
                        <QueueCountCells q=q aged=aged/>
                        <CountCell n=f.succeeded/>
                        <CountCell n=f.failed/>
                        <CountCell n=f.cancelled narrow=true/>
                        <CountCell n=f.upstream_failed narrow=true/>
                        <CountCell n=f.skipped narrow=true/>
                    </tr>
                }
            })
            .collect_view()
    };
    view! {
        <Show
            when=move || queues.with(|qs| !qs.is_empty())
            fallback=|| view! {
                <ui::Empty>"No queue has unfinished tasks or tasks finished in the last hour."</ui::Empty>
            }
        >
            <ui::Table class="queues" heads=view! {
                <QueueCountHeads due="Due"/>
                <th class="num" title="succeeded in the last hour">"Succeeded 1 h"</th>
                <th class="num" title="failed in the last hour">"Failed 1 h"</th>
                <th class="num hide-narrow" title="cancelled in the last hour">"Cancelled 1 h"</th>
                <th class="num hide-narrow" title="ended in the last hour because a parent failed">"Upstream failed 1 h"</th>
                <th class="num hide-narrow" title="skipped in the last hour">"Skipped 1 h"</th>
            }>
                {rows}
            </ui::Table>
        </Show>
    }
}

/// Width of a chart's drawing, in its own units: about its width on the page when drawn, so
/// that its text has the page's size (the SVG still scales with the page afterwards).
pub(crate) fn chart_width() -> f64 {
    let window = web_sys::window()
        .and_then(|w| w.inner_width().ok())
        .and_then(|w| w.as_f64())
        .unwrap_or(1280.0);
    // The page's and the panel's padding and borders.
    let chrome = if window < 700.0 { 50.0 } else { 62.0 };
    (window.min(1400.0) - chrome).clamp(280.0, 1340.0)
}

/// The largest value of the y axis and the step of its ticks: 1, 2 or 5 times a power of ten,
/// at most four steps up to the largest count.
fn y_scale(max: i64) -> (i64, i64) {
    let max = max.max(1);
    let mut magnitude = 1;
    loop {
        for step in [magnitude, 2 * magnitude, 5 * magnitude] {
            let top = (max + step - 1) / step * step;
            if top / step <= 4 {
                return (top, step);
            }
        }
        magnitude *= 10;
    }
}

/// `at` in the browser's time zone.
pub(crate) fn local_date(at: DateTime<Utc>) -> js_sys::Date {
    js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(
        at.timestamp_millis() as f64
    ))
}

/// `12:34` in the browser's time zone.
pub(crate) fn hour_minute(at: DateTime<Utc>) -> (u32, String) {
    let d = local_date(at);
    let minute = d.get_minutes();
    (minute, format!("{:02}:{:02}", d.get_hours(), minute))
}

/// The tooltip of one step's bar.
fn bar_title(label: &str, f: &FinalCounts, current: bool) -> String {
    let mut parts = vec![
        format!("{} succeeded", ui::count(f.succeeded)),
        format!("{} failed", ui::count(f.failed)),
    ];
    for (n, what) in [
        (f.cancelled, "cancelled"),
        (f.upstream_failed, "upstream failed"),
        (f.skipped, "skipped"),
    ] {
        if n > 0 {
            parts.push(format!("{} {what}", ui::count(n)));
        }
    }
    let so_far = if current { " (so far)" } else { "" };
    format!("{label}{so_far}: {}", parts.join(", "))
}

/// A label of the x axis centred at `x` (ending there near the right edge, so that it shows
/// whole).
pub(crate) fn axis_label(x: f64, width: f64, height: f64, text: String) -> impl IntoView {
    let anchor = if x > width - 45.0 { "end" } else { "middle" };
    view! { <text x=x y=height - 6.0 text-anchor=anchor>{text}</text> }
}

/// The overview's chart: the finishes of each minute of the last hour, a label every 10
/// minutes (15 on narrow screens).
fn minute_chart(series: &[MinuteFinishes]) -> impl IntoView + use<> {
    let label_every = if chart_width() < 500.0 { 15 } else { 10 };
    let points: Vec<(DateTime<Utc>, FinalCounts)> =
        series.iter().map(|m| (m.minute, m.finished)).collect();
    let total: i64 = series.iter().map(|m| m.finished.total()).sum();
    finish_chart(
        &points,
        &|at| {
            let (minute, label) = hour_minute(at);
            let axis = minute.is_multiple_of(label_every).then(|| label.clone());
            (label, axis)
        },
        "finished-per-minute",
        format!("{} tasks finished in the last hour", ui::count(total)),
    )
}

/// Stacked bars of succeeded (below) and failed (above) finishes per step: one bar per point
/// (the step's start and its counts), oldest first, the last one partial. `label` names a
/// step (in its tooltip) and gives its label on the x axis, if any; `name` is the chart's
/// `data-chart`; `summary` describes it under the chart.
pub(crate) fn finish_chart(
    points: &[(DateTime<Utc>, FinalCounts)],
    label: &dyn Fn(DateTime<Utc>) -> (String, Option<String>),
    name: &'static str,
    summary: String,
) -> impl IntoView + use<> {
    const HEIGHT: f64 = 190.0;
    const LEFT: f64 = 40.0;
    const RIGHT: f64 = 6.0;
    const TOP: f64 = 8.0;
    const BOTTOM: f64 = 22.0;
    let width = chart_width();
    let plot_w = width - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let slot = plot_w / points.len().max(1) as f64;
    let bar_w = (slot * 0.78).max(1.0);
    let max = points
        .iter()
        .map(|(_, f)| f.succeeded + f.failed)
        .max()
        .unwrap_or(0);
    let (top, step) = y_scale(max);
    let y = move |n: i64| TOP + plot_h - plot_h * n as f64 / top as f64;

    let grid = (0..=top / step)
        .map(|i| {
            let n = i * step;
            view! {
                <line class="grid" x1=LEFT x2=width - RIGHT y1=y(n) y2=y(n)/>
                <text x=LEFT - 6.0 y=y(n) + 4.0 text-anchor="end">{ui::count(n)}</text>
            }
        })
        .collect_view();
    let last = points.len().saturating_sub(1);
    let bars = points
        .iter()
        .enumerate()
        .map(|(i, (start, f))| {
            let (text, axis) = label(*start);
            let x = LEFT + slot * i as f64;
            let ok_top = y(f.succeeded);
            let bad_top = y(f.succeeded + f.failed);
            let tick_label = axis.map(|axis| axis_label(x + slot / 2.0, width, HEIGHT, axis));
            view! {
                <g class="bar" data-start=start.to_rfc3339()>
                    <title>{bar_title(&text, f, i == last)}</title>
                    <rect class="hit" x=x y=TOP width=slot height=plot_h/>
                    <rect class="bar-ok" x=x + (slot - bar_w) / 2.0 y=ok_top width=bar_w height=TOP + plot_h - ok_top/>
                    <rect class="bar-bad" x=x + (slot - bar_w) / 2.0 y=bad_top width=bar_w height=ok_top - bad_top/>
                </g>
                {tick_label}
            }
        })
        .collect_view();
    view! {
        <svg
            class="chart"
            viewBox=format!("0 0 {width} {HEIGHT}")
            role="img"
            aria-label=summary.clone()
            data-chart=name
        >
            {grid}
            <line class="axis" x1=LEFT x2=width - RIGHT y1=TOP + plot_h y2=TOP + plot_h/>
            {bars}
        </svg>
        <p class="hint">{summary}</p>
    }
}

#[cfg(test)]
mod tests {
    use super::y_scale;

    #[test]
    fn y_axis_covers_the_largest_count_in_at_most_four_round_steps() {
        assert_eq!(y_scale(0), (1, 1));
        assert_eq!(y_scale(3), (3, 1));
        assert_eq!(y_scale(7), (8, 2));
        assert_eq!(y_scale(37), (40, 10));
        assert_eq!(y_scale(1234), (1500, 500));
    }
}
