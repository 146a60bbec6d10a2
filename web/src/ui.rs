//! Small views shared by the pages.

use chrono::{DateTime, Utc};
use leptos::prelude::*;
use sked_types::TaskState;

/// Now, from the browser's clock.
pub fn now() -> DateTime<Utc> {
    let ms = js_sys::Date::now();
    DateTime::from_timestamp_millis(ms as i64).unwrap_or_default()
}

/// A duration in seconds as `850 ms`, `12 s`, `3 min 5 s`, `2 h 10 min`, `3 d 4 h`.
pub fn duration(secs: f64) -> String {
    let s = secs.abs();
    let sign = if secs < 0.0 { "-" } else { "" };
    if s < 1.0 {
        format!("{sign}{} ms", (s * 1000.0).round() as i64)
    } else if s < 60.0 {
        format!("{sign}{:.0} s", s.floor())
    } else if s < 3600.0 {
        let m = (s / 60.0).floor();
        format!("{sign}{m:.0} min {:.0} s", (s - m * 60.0).floor())
    } else if s < 86_400.0 {
        let h = (s / 3600.0).floor();
        format!(
            "{sign}{h:.0} h {:.0} min",
            ((s - h * 3600.0) / 60.0).floor()
        )
    } else {
        let d = (s / 86_400.0).floor();
        format!(
            "{sign}{d:.0} d {:.0} h",
            ((s - d * 86_400.0) / 3600.0).floor()
        )
    }
}

/// `12 s ago` / `in 3 min 5 s`.
pub fn relative(at: DateTime<Utc>) -> String {
    let secs = (now() - at).num_milliseconds() as f64 / 1000.0;
    if secs >= 0.0 {
        format!("{} ago", duration(secs))
    } else {
        format!("in {}", duration(-secs))
    }
}

/// A timestamp in the browser's time zone, `2026-11-29 23:01:02`.
pub fn local_time(at: DateTime<Utc>) -> String {
    let d = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(
        at.timestamp_millis() as f64
    ));
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        d.get_full_year(),
        d.get_month() + 1,
        d.get_date(),
        d.get_hours(),
        d.get_minutes(),
        d.get_seconds()
    )
}

/// A `<time>` showing the local time, with the UTC instant as its title.
#[component]
pub fn Time(at: DateTime<Utc>) -> impl IntoView {
    view! { <time datetime=at.to_rfc3339() title=at.to_rfc3339()>{local_time(at)}</time> }
}

/// A task state as a coloured badge; `data-state` holds the state's name.
#[component]
pub fn StateBadge(#[prop(into)] state: Signal<TaskState>) -> impl IntoView {
    view! {
        <span class=move || format!("badge state-{}", state.get().as_str()) data-state=move || state.get().as_str()>
            {move || state.get().as_str().replace('_', " ")}
        </span>
    }
}

/// An error box, with the message of the API.
#[component]
pub fn ErrorBox(#[prop(into)] message: Signal<String>) -> impl IntoView {
    view! { <p class="error" role="alert">{move || message.get()}</p> }
}

/// A short form of a UUID (its last 12 hex digits, which vary most between v7 ids).
pub fn short_id(id: &uuid::Uuid) -> String {
    let s = id.simple().to_string();
    s[s.len() - 12..].to_owned()
}
