//! Small views shared by the pages: times, badges, action buttons, tables, and the loading,
//! empty and error views every page shows around its data ([`Loaded`]).

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

/// How long from `start` to `end`, or to now while there is no end (following `tick`):
/// `3 min 5 s`.
pub fn elapsed(start: DateTime<Utc>, end: Option<DateTime<Utc>>, tick: ReadSignal<u64>) -> String {
    let end = end.unwrap_or_else(|| {
        tick.track();
        now()
    });
    duration((end - start).num_milliseconds().max(0) as f64 / 1000.0)
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

/// A time of day in the browser's time zone, to the millisecond: `23:01:02.345`.
pub fn local_clock(at: DateTime<Utc>) -> String {
    let d = js_sys::Date::new(&wasm_bindgen::JsValue::from_f64(
        at.timestamp_millis() as f64
    ));
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        d.get_hours(),
        d.get_minutes(),
        d.get_seconds(),
        d.get_milliseconds()
    )
}

/// The browser's IANA time zone (`Europe/Paris`), if it tells.
pub fn browser_zone() -> Option<String> {
    let options = js_sys::Intl::DateTimeFormat::new(&js_sys::Array::new(), &js_sys::Object::new())
        .resolved_options();
    js_sys::Reflect::get(&options, &"timeZone".into())
        .ok()?
        .as_string()
}

/// The time zone in which [`local_time`] shows times, the browser's: its name and its offset
/// from UTC now, `Europe/Paris (UTC+01:00)`; the offset alone (`UTC+00:00`) when the browser
/// gives no name or its zone is UTC.
pub fn time_zone() -> String {
    // getTimezoneOffset is UTC minus local time, in minutes.
    let offset = -(js_sys::Date::new_0().get_timezone_offset() as i64);
    let sign = if offset < 0 { '-' } else { '+' };
    let utc = format!("UTC{sign}{:02}:{:02}", offset.abs() / 60, offset.abs() % 60);
    match browser_zone() {
        Some(name) if !(offset == 0 && name.ends_with("UTC")) => format!("{name} ({utc})"),
        _ => utc,
    }
}

/// A `<time>` showing the local time, with the UTC instant as its title.
#[component]
pub fn Time(at: DateTime<Utc>) -> impl IntoView {
    view! { <time datetime=at.to_rfc3339() title=at.to_rfc3339()>{local_time(at)}</time> }
}

/// A relative time (`12 s ago`, `in 3 min 5 s`) that follows `tick`, with the local time as
/// its title.
pub fn age(at: DateTime<Utc>, tick: ReadSignal<u64>) -> impl IntoView {
    view! {
        <time datetime=at.to_rfc3339() title=local_time(at)>
            {move || {
                tick.track();
                relative(at)
            }}
        </time>
    }
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

/// A button of a page's actions, named by `data-action`, disabled while `disabled` holds (an
/// action runs, or this one does not apply); `danger` marks one that destroys or stops.
#[component]
pub fn ActionButton(
    action: &'static str,
    #[prop(into)] disabled: Signal<bool>,
    #[prop(optional)] danger: bool,
    #[prop(optional)] title: Option<&'static str>,
    on_click: impl FnMut(leptos::ev::MouseEvent) + 'static,
    children: Children,
) -> impl IntoView {
    view! {
        <button
            type="button"
            class=danger.then_some("danger")
            data-action=action
            disabled=disabled
            title=title
            on:click=on_click
        >
            {children()}
        </button>
    }
}

/// An error box with the message of the API, or of a form's own check, while there is one;
/// nothing while `message` is `None`.
#[component]
pub fn ErrorBox(#[prop(into)] message: Signal<Option<String>>) -> impl IntoView {
    move || {
        message
            .get()
            .map(|m| view! { <p class="error" role="alert">{m}</p> })
    }
}

/// What stands in for a page's data until its first answer.
#[component]
pub fn Loading() -> impl IntoView {
    view! { <p class="empty loading">"Loading…"</p> }
}

/// A sentence saying that there is nothing to show, and why or what to do about it.
#[component]
pub fn Empty(children: Children) -> impl IntoView {
    view! { <p class="empty">{children()}</p> }
}

/// Data a page fetches, in each of its states: the error of the last request while there is
/// one (above the data, which stays), [`Loading`] until a first answer, the `when_empty`
/// sentence (in an [`Empty`]) when the answer holds nothing to show, else the children.
/// Nothing but the error shows when the first request failed.
#[component]
pub fn Loaded(
    /// The message of the last request's error.
    #[prop(into)]
    error: Signal<Option<String>>,
    /// Whether an answer the children can show has arrived.
    #[prop(into)]
    ready: Signal<bool>,
    /// Whether that answer holds nothing to show; never, when not given.
    #[prop(into, optional)]
    empty: Signal<bool>,
    /// What an empty answer shows, inside an [`Empty`]. It is built, without tracking, each time
    /// the answer turns empty: a sentence that follows signals is returned as a closure.
    #[prop(into, optional)]
    when_empty: ViewFn,
    children: ChildrenFn,
) -> impl IntoView {
    #[derive(Clone, Copy, PartialEq)]
    enum Phase {
        Loading,
        Failed,
        Empty,
        Ready,
    }
    let phase = Memo::new(move |_| match (ready.get(), empty.get()) {
        (true, true) => Phase::Empty,
        (true, false) => Phase::Ready,
        (false, _) if error.with(Option::is_some) => Phase::Failed,
        (false, _) => Phase::Loading,
    });
    view! {
        <ErrorBox message=error/>
        {move || match phase.get() {
            Phase::Loading => view! { <Loading/> }.into_any(),
            Phase::Failed => ().into_any(),
            Phase::Empty => {
                let sentence = untrack(|| when_empty.run());
                view! { <Empty>{sentence}</Empty> }.into_any()
            }
            Phase::Ready => untrack(|| children()).into_any(),
        }}
    }
}

/// A table in its scrolling wrapper: `heads` (its `<th>` cells) in its head row, the
/// `children` (its rows) in its body.
#[component]
pub fn Table(
    class: &'static str,
    heads: impl IntoView + 'static,
    children: Children,
) -> impl IntoView {
    view! {
        <div class="table-wrap">
            <table class=class>
                <thead>
                    <tr>{heads}</tr>
                </thead>
                <tbody>{children()}</tbody>
            </table>
        </div>
    }
}

/// The workers' names by id (`GET /api/v1/workers`, the registry's `name`, which the Workers
/// page shows), so that a page names a worker as that page does. A page that shows workers'
/// ids calls [`WorkerNames::provide`]; [`WorkerName`] reads them.
#[derive(Clone, Copy)]
pub struct WorkerNames(RwSignal<std::collections::HashMap<uuid::Uuid, String>>);

impl WorkerNames {
    /// Fetches the names now and again when a worker registers, stops or leaves (at most
    /// once a second), and provides them to the page's components.
    pub fn provide() {
        let names = WorkerNames(RwSignal::new(Default::default()));
        let fetched = Fetched::<Vec<sked_types::Worker>>::new();
        let load = move || fetched.load(crate::api::get("/workers"));
        load();
        let reload = throttled(1000.0, load);
        crate::live::live().on_change(move |l| l.workers.track(), reload);
        Effect::new(move |_| {
            if let Some(workers) = fetched.data.get() {
                names
                    .0
                    .set(workers.into_iter().map(|w| (w.id, w.name)).collect());
            }
        });
        provide_context(names);
    }
}

/// A worker as the Workers page names it, a link to that page with its id as the title; its
/// short id while the names are loading and once the registry has forgotten it (a day after
/// it stopped).
#[component]
pub fn WorkerName(id: uuid::Uuid) -> impl IntoView {
    let names = use_context::<WorkerNames>();
    let name = move || {
        names
            .and_then(|n| n.0.with(|m| m.get(&id).cloned()))
            .unwrap_or_else(|| short_id(&id))
    };
    view! {
        <a class="mono worker-name" href="/workers" title=id.to_string() data-worker-id=id.to_string()>
            {name}
        </a>
    }
}

/// A short form of a UUID (its last 12 hex digits, which vary most between v7 ids).
pub fn short_id(id: &uuid::Uuid) -> String {
    let s = id.simple().to_string();
    s[s.len() - 12..].to_owned()
}

/// A counter that ticks every `ms` milliseconds while the calling component is mounted: read
/// it in a view to re-render values that change with time alone (ages, "in 3 s").
pub fn ticker(ms: u32) -> ReadSignal<u64> {
    let (tick, set_tick) = signal(0u64);
    if let Ok(handle) = set_interval_with_handle(
        move || {
            set_tick.try_update(|n| *n += 1);
        },
        std::time::Duration::from_millis(u64::from(ms)),
    ) {
        on_cleanup(move || handle.clear());
    }
    tick
}

/// Wraps `f` so that calls run it at most once per `gap_ms` milliseconds: the first call runs
/// it at once, calls within the gap after a run are merged into one run at the gap's end.
/// Nothing runs after the calling component is unmounted.
pub fn throttled(gap_ms: f64, f: impl Fn() + 'static) -> impl Fn() + Clone + 'static {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    struct State<F> {
        f: F,
        last: Cell<f64>,
        pending: Cell<bool>,
        mounted: Arc<AtomicBool>,
    }
    fn call<F: Fn() + 'static>(state: &Rc<State<F>>, gap_ms: f64) {
        if state.pending.get() || !state.mounted.load(Ordering::Relaxed) {
            return;
        }
        let wait = state.last.get() + gap_ms - js_sys::Date::now();
        if wait <= 0.0 {
            state.last.set(js_sys::Date::now());
            (state.f)();
            return;
        }
        state.pending.set(true);
        let state = Rc::clone(state);
        set_timeout(
            move || {
                state.pending.set(false);
                if state.mounted.load(Ordering::Relaxed) {
                    state.last.set(js_sys::Date::now());
                    (state.f)();
                }
            },
            std::time::Duration::from_millis(wait.ceil() as u64),
        );
    }

    let mounted = Arc::new(AtomicBool::new(true));
    let on_unmount = Arc::clone(&mounted);
    on_cleanup(move || on_unmount.store(false, Ordering::Relaxed));
    let state = Rc::new(State {
        f,
        last: Cell::new(f64::NEG_INFINITY),
        pending: Cell::new(false),
        mounted,
    });
    move || call(&state, gap_ms)
}

/// The latest answer of a `GET` that a page fetches again when something changes. It keeps
/// the last good answer while a new request runs and when one fails, and drops an answer
/// that arrives after the answer to a later request.
pub struct Fetched<T: Send + Sync + 'static> {
    /// The last good answer; `None` until there is one.
    pub data: RwSignal<Option<T>>,
    /// The error of the last answer, `None` when it succeeded.
    pub error: RwSignal<Option<crate::api::ApiError>>,
    /// When `data` arrived, in milliseconds of the browser's clock: ages the API gives in
    /// seconds at its own `now` grow from here.
    pub received_ms: RwSignal<f64>,
    sent: StoredValue<u64>,
    shown: StoredValue<u64>,
}

impl<T: Send + Sync + 'static> Clone for Fetched<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Send + Sync + 'static> Copy for Fetched<T> {}

impl<T: Send + Sync + 'static> Default for Fetched<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + Sync + 'static> Fetched<T> {
    pub fn new() -> Self {
        Fetched {
            data: RwSignal::new(None),
            error: RwSignal::new(None),
            received_ms: RwSignal::new(0.0),
            sent: StoredValue::new(0),
            shown: StoredValue::new(0),
        }
    }

    /// Whether a good answer has arrived: its data shows from then on.
    pub fn ready(self) -> Signal<bool> {
        Signal::derive(move || self.data.with(Option::is_some))
    }

    /// The message of the last answer's error, `None` when it succeeded.
    pub fn error_message(self) -> Signal<Option<String>> {
        Signal::derive(move || self.error.with(|e| e.as_ref().map(|e| e.message.clone())))
    }

    /// Runs `request` and shows its answer unless a later request answered first.
    pub fn load<Fut>(self, request: Fut)
    where
        Fut: std::future::Future<Output = crate::api::ApiResult<T>> + 'static,
    {
        let Some(n) = self.sent.try_update_value(|n| {
            *n += 1;
            *n
        }) else {
            return;
        };
        leptos::task::spawn_local(async move {
            let answer = request.await;
            let newer = self.shown.try_update_value(|shown| {
                let newer = n > *shown;
                if newer {
                    *shown = n;
                }
                newer
            });
            if newer != Some(true) {
                return;
            }
            match answer {
                Ok(value) => {
                    self.received_ms.try_set(js_sys::Date::now());
                    self.data.try_set(Some(value));
                    if self.error.try_with_untracked(Option::is_some) == Some(true) {
                        self.error.try_set(None);
                    }
                }
                Err(e) => {
                    self.error.try_set(Some(e));
                }
            }
        });
    }

    /// Calls `refetch` once the answer shown is `max_age_ms(answer)` milliseconds old (never
    /// while that is `None`), looking at every tick of `tick`: for data that changes without
    /// a live event. Once per answer: after a failed refetch, not again until another answer.
    pub fn refetch_when_older(
        self,
        tick: ReadSignal<u64>,
        max_age_ms: impl Fn(&T) -> Option<f64> + 'static,
        refetch: impl Fn() + 'static,
    ) {
        let asked_at = StoredValue::new(0.0f64);
        Effect::new(move |_| {
            tick.track();
            let Some(max_age_ms) = self
                .data
                .with_untracked(|d| d.as_ref().and_then(&max_age_ms))
            else {
                return;
            };
            let received = self.received_ms.get_untracked();
            if js_sys::Date::now() - received >= max_age_ms && asked_at.get_value() != received {
                asked_at.set_value(received);
                refetch();
            }
        });
    }
}

/// A count with thousands separators: `12,345`.
pub fn count(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3 + 1);
    if n < 0 {
        out.push('-');
    }
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A size in bytes as people read it: `512 bytes`, `12.5 KB`, `3.2 MB` (1 KB = 1,024 bytes).
pub fn bytes(n: u64) -> String {
    const KB: f64 = 1024.0;
    let f = n as f64;
    if f < KB {
        format!("{n} bytes")
    } else if f < KB * KB {
        format!("{:.1} KB", f / KB)
    } else {
        format!("{:.1} MB", f / (KB * KB))
    }
}

/// A task list's line of what a task runs: its command line (a built-in's kind first), and,
/// when the API cut it to its preview (`argv_cut`), `…` and the size of the whole line.
pub fn summary_line(t: &sked_types::events::TaskSummary) -> String {
    let mut line = if t.kind == sked_types::TaskKind::Command {
        command_line(&t.argv)
    } else {
        // A built-in (`noop`, `sleep`): its arguments alone would read as a command.
        format!("({}) {}", t.kind, command_line(&t.argv))
    };
    if t.argv_cut {
        line.push_str(&format!("… ({} in all)", bytes(t.argv_bytes)));
    }
    line
}

/// The characters of a value a page shows before [`Cut`] cuts it.
pub const CUT_CHARS: usize = 300;

/// A value shown whole when it has at most [`CUT_CHARS`] characters; a longer one cut there
/// and followed by `…` and a "show all" button (`data-action=show-all`) that says its size
/// and shows it whole, then "show less".
#[component]
pub fn Cut(text: String) -> impl IntoView {
    let Some((end, _)) = text.char_indices().nth(CUT_CHARS) else {
        return view! { <span class="cut">{text}</span> }.into_any();
    };
    let open = RwSignal::new(false);
    let size = bytes(text.len() as u64);
    let head = StoredValue::new(format!("{}…", &text[..end]));
    let whole = StoredValue::new(text);
    view! {
        <span class="cut" data-cut=move || if open.get() { "open" } else { "cut" }>
            {move || if open.get() { whole.get_value() } else { head.get_value() }}
            " "
            <button
                type="button"
                class="link show-all"
                data-action="show-all"
                on:click=move |_| open.update(|o| *o = !*o)
            >
                {move || if open.get() { "show less".to_owned() } else { format!("show all ({size})") }}
            </button>
        </span>
    }
    .into_any()
}

/// A command line as a shell would read it back: arguments joined by spaces, each quoted
/// with `'…'` when it holds anything but letters, digits and `-_./:=@%+,`.
pub fn command_line(argv: &[String]) -> String {
    argv.iter()
        .map(|arg| shell_quote(arg))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(arg: &str) -> String {
    let plain = !arg.is_empty()
        && arg
            .chars()
            .all(|c| c.is_alphanumeric() || "-_./:=@%+,".contains(c));
    if plain {
        arg.to_owned()
    } else {
        format!("'{}'", arg.replace('\'', r"'\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn counts_have_a_separator_every_three_digits() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1_234_567), "1,234,567");
        assert_eq!(count(-12_345), "-12,345");
    }
}
