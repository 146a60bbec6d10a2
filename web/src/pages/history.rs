//! The history page (`/history?range=24h|7d&queue=…`): the tasks finished in each step of
//! the last 24 hours (5 minutes) or 7 days (an hour), and the 50th, 90th and 99th
//! percentiles of their durations and lateness, for every queue or one, from
//! `GET /api/v1/history` (read from the rollups sked keeps as tasks finish). The range switch
//! and the queue filter are links and a select that change the URL; the page fetches again
//! when the URL changes and every minute.

use chrono::{DateTime, Utc};
use leptos::prelude::*;
use leptos_router::NavigateOptions;
use leptos_router::hooks::{use_navigate, use_query_map};
use sked_types::{FinalCounts, History as HistoryData, HistoryPoint, HistoryRange, Percentiles};

use crate::api;
use crate::pages::overview::{axis_label, chart_width, finish_chart, hour_minute, local_date};
use crate::ui::{self, Fetched};

/// How often the page fetches again while it is open, in milliseconds: a 5-minute step fills
/// a minute at a time.
const REFETCH_MS: u32 = 60_000;

/// The page's URL for `range` and `queue` (and the API's, under `/api/v1`).
fn href(range: HistoryRange, queue: Option<&str>) -> String {
    match queue {
        Some(q) => format!("/history?range={}&queue={}", range.as_str(), api::enc(q)),
        None => format!("/history?range={}", range.as_str()),
    }
}

#[component]
pub fn History() -> impl IntoView {
    let query = use_query_map();
    let range = Memo::new(move |_| {
        query.with(|q| match q.get("range").as_deref() {
            Some("7d") => HistoryRange::Week,
            _ => HistoryRange::Day,
        })
    });
    let queue = Memo::new(move |_| query.with(|q| q.get("queue").filter(|q| !q.is_empty())));
    let fetched: Fetched<HistoryData> = Fetched::new();
    let tick = ui::ticker(REFETCH_MS);
    Effect::new(move |_| {
        tick.track();
        // The API's path under /api/v1 is the page's.
        let path = href(range.get(), queue.get().as_deref());
        fetched.load(async move { api::get::<HistoryData>(&path).await });
    });
    let points = Memo::new(move |_| {
        fetched
            .data
            .with(|h| h.as_ref().map(|h| h.points.clone()).unwrap_or_default())
    });
    let navigate = use_navigate();
    let on_queue = move |ev: leptos::ev::Event| {
        let q = event_target_value(&ev);
        let q = (!q.is_empty()).then_some(q);
        navigate(
            &href(range.get_untracked(), q.as_deref()),
            NavigateOptions {
                scroll: false,
                ..NavigateOptions::default()
            },
        );
    };
    let queue_options = move || {
        let current = queue.get();
        let mut names = fetched
            .data
            .with(|h| h.as_ref().map(|h| h.queues.clone()).unwrap_or_default());
        if let Some(q) = &current
            && !names.contains(q)
        {
            names.push(q.clone());
        }
        let all = view! { <option value="" selected=current.is_none()>"every queue"</option> };
        let each = names
            .into_iter()
            .map(|n| {
                let selected = current.as_deref() == Some(n.as_str());
                view! { <option value=n.clone() selected=selected>{n.clone()}</option> }
            })
            .collect_view();
        view! { {all} {each} }
    };
    let switch = move |r: HistoryRange, text: &'static str| {
        let current = move || (range.get() == r).then_some("page");
        view! {
            <a href=move || href(r, queue.get().as_deref()) aria-current=current data-range=r.as_str()>
                {text}
            </a>
        }
    };

    view! {
        <h1>"History"</h1>
        <form class="filters" role="search" on:submit=|ev| ev.prevent_default()>
            <span class="switch" role="group" aria-label="Range">
                {switch(HistoryRange::Day, "24 hours")}
                {switch(HistoryRange::Week, "7 days")}
            </span>
            <select name="queue" aria-label="Queue" on:change=on_queue>{queue_options}</select>
        </form>
        <ui::Loaded error=fetched.error_message() ready=fetched.ready()>
            <p class="hint" data-history-at=move || fetched.data.with(|h| h.as_ref().map(|h| h.at.to_rfc3339()))>
                {move || fetched.data.with(|h| h.as_ref().map(scope_line))}
            </p>
            <section class="panel">
                <h2 class="panel-title">{move || format!("Tasks finished per {}", step_name(range.get()))}</h2>
                <p class="legend">
                    <span class="swatch bar-ok"></span>"succeeded "
                    <span class="swatch bar-bad"></span>"failed"
                </p>
                {move || {
                    let r = range.get();
                    points.with(|p| finished_chart(p, r))
                }}
            </section>
            <section class="panel">
                <h2 class="panel-title">"Duration: start of the last attempt to its end"</h2>
                <PercentileLegend/>
                {move || {
                    let r = range.get();
                    points.with(|p| percentile_chart(p, r, |p| p.duration, "duration"))
                }}
            </section>
            <section class="panel">
                <h2 class="panel-title">"Lateness: due time to start"</h2>
                <PercentileLegend/>
                {move || {
                    let r = range.get();
                    points.with(|p| percentile_chart(p, r, |p| p.lateness, "lateness"))
                }}
            </section>
        </ui::Loaded>
    }
}

/// The legend of a percentile chart.
#[component]
fn PercentileLegend() -> impl IntoView {
    view! {
        <p class="legend">
            <span class="swatch line-p50"></span>"median "
            <span class="swatch line-p90"></span>"90th percentile "
            <span class="swatch line-p99"></span>"99th percentile"
        </p>
    }
}

/// Whose tasks are counted, where, and when.
fn scope_line(h: &HistoryData) -> String {
    let whose = match &h.owner {
        Some(owner) => format!("Tasks of {owner}"),
        None => "Tasks of every owner".to_owned(),
    };
    let queue = match &h.queue {
        Some(q) => format!(" in queue {q}"),
        None => String::new(),
    };
    format!(
        "{whose}{queue}, counted at {}. Percentiles are estimated from histograms (within a factor of 1.4).",
        ui::local_time(h.at)
    )
}

/// "5 minutes" or "hour".
fn step_name(range: HistoryRange) -> &'static str {
    match range {
        HistoryRange::Day => "5 minutes",
        HistoryRange::Week => "hour",
    }
}

/// A step's name, and its label on the x axis: the time every 3 hours over a day, the day
/// at every (local) midnight over a week.
fn step_label(range: HistoryRange, at: DateTime<Utc>) -> (String, Option<String>) {
    const DAYS: [&str; 7] = ["Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"];
    let (minute, hm) = hour_minute(at);
    let d = local_date(at);
    match range {
        HistoryRange::Day => {
            let axis = (minute == 0 && d.get_hours().is_multiple_of(3)).then(|| hm.clone());
            (hm, axis)
        }
        HistoryRange::Week => {
            let day = format!("{} {}", DAYS[d.get_day() as usize % 7], d.get_date());
            let axis = (d.get_hours() == 0).then(|| day.clone());
            (format!("{day} {hm}"), axis)
        }
    }
}

fn finished_chart(points: &[HistoryPoint], range: HistoryRange) -> impl IntoView + use<> {
    let bars: Vec<(DateTime<Utc>, FinalCounts)> =
        points.iter().map(|p| (p.start, p.finished)).collect();
    let total: i64 = points.iter().map(|p| p.finished.total()).sum();
    let failed: i64 = points.iter().map(|p| p.finished.failed).sum();
    let span = match range {
        HistoryRange::Day => "24 hours",
        HistoryRange::Week => "7 days",
    };
    finish_chart(
        &bars,
        &|at| step_label(range, at),
        "finished-per-step",
        format!(
            "{} tasks finished in the last {span}, {} of them failed",
            ui::count(total),
            ui::count(failed)
        ),
    )
}

/// `1 ms`, `100 ms`, `10 s`, `1000 s`: a power of ten of seconds.
fn secs_label(v: f64) -> String {
    if v < 1.0 {
        format!("{} ms", (v * 1000.0).round())
    } else {
        format!("{} s", v.round())
    }
}

/// Lines of the 50th, 90th and 99th percentiles per step on a logarithmic axis of seconds;
/// a step where nothing that ran finished leaves a gap.
fn percentile_chart(
    points: &[HistoryPoint],
    range: HistoryRange,
    pick: fn(&HistoryPoint) -> Percentiles,
    name: &'static str,
) -> impl IntoView + use<> {
    const HEIGHT: f64 = 170.0;
    const LEFT: f64 = 52.0;
    const RIGHT: f64 = 6.0;
    const TOP: f64 = 8.0;
    const BOTTOM: f64 = 22.0;
    let width = chart_width();
    let plot_w = width - LEFT - RIGHT;
    let plot_h = HEIGHT - TOP - BOTTOM;
    let slot = plot_w / points.len().max(1) as f64;
    let values: Vec<f64> = points
        .iter()
        .flat_map(|p| {
            let q = pick(p);
            [q.p50, q.p90, q.p99]
        })
        .flatten()
        .map(|v| v.max(0.001))
        .collect();
    let lo = values
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .log10()
        .floor();
    let hi = values
        .iter()
        .copied()
        .fold(f64::NEG_INFINITY, f64::max)
        .log10()
        .ceil();
    let (lo, hi) = if values.is_empty() {
        (-3.0, 0.0)
    } else if hi <= lo {
        (lo, lo + 1.0)
    } else {
        (lo, hi)
    };
    let y = move |v: f64| TOP + plot_h - plot_h * (v.max(0.001).log10() - lo) / (hi - lo);
    let x = move |i: usize| LEFT + slot * (i as f64 + 0.5);

    let grid = (lo as i32..=hi as i32)
        .map(|e| {
            let v = 10f64.powi(e);
            view! {
                <line class="grid" x1=LEFT x2=width - RIGHT y1=y(v) y2=y(v)/>
                <text x=LEFT - 6.0 y=y(v) + 4.0 text-anchor="end">{secs_label(v)}</text>
            }
        })
        .collect_view();
    let line = |which: fn(&Percentiles) -> Option<f64>| {
        let mut d = String::new();
        let mut drawing = false;
        for (i, p) in points.iter().enumerate() {
            match which(&pick(p)) {
                Some(v) => {
                    if drawing {
                        d.push_str(&format!("L{:.1} {:.1} ", x(i), y(v)));
                    } else {
                        // A line starts with a step-wide tick, so a lone point shows too.
                        let half = (slot * 0.4).max(1.5);
                        d.push_str(&format!(
                            "M{:.1} {:.1} L{:.1} {:.1} ",
                            x(i) - half,
                            y(v),
                            x(i) + half,
                            y(v)
                        ));
                    }
                    drawing = true;
                }
                None => drawing = false,
            }
        }
        d
    };
    let steps = points
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (text, axis) = step_label(range, p.start);
            let q = pick(p);
            let show = |v: Option<f64>| v.map(ui::duration).unwrap_or_else(|| "—".to_owned());
            let title = format!(
                "{text}: median {}, 90th {}, 99th {}",
                show(q.p50),
                show(q.p90),
                show(q.p99)
            );
            let left = LEFT + slot * i as f64;
            let tick_label = axis.map(|axis| axis_label(left + slot / 2.0, width, HEIGHT, axis));
            view! {
                <g class="bar" data-start=p.start.to_rfc3339()>
                    <title>{title}</title>
                    <rect class="hit" x=left y=TOP width=slot height=plot_h/>
                </g>
                {tick_label}
            }
        })
        .collect_view();
    let known = points.iter().filter(|p| pick(p).p50.is_some()).count();
    let summary = match values.iter().copied().reduce(f64::max) {
        Some(worst) => format!(
            "{name} percentiles of {known} steps; the largest 99th percentile is {}",
            ui::duration(worst)
        ),
        None => format!("no {name} yet: no task that ran finished in the range"),
    };
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
            {steps}
            <path class="line-p50" d=line(|q| q.p50)/>
            <path class="line-p90" d=line(|q| q.p90)/>
            <path class="line-p99" d=line(|q| q.p99)/>
        </svg>
        <p class="hint">{summary}</p>
    }
}
