//! The sked dashboard: a client-side Leptos app, served by `sked-server` at `/`.
//!
//! - [`api`] — REST calls with the signed-in token, and the [`api::Session`].
//! - [`live`] — the websocket of live events, with reconnection and a polling fallback.
//! - [`ui`] — small shared views: state badges, times, action buttons, tables, and the loading,
//!   empty and error views.
//! - [`pages`] — one module per page.
//!
//! Sign-in: paste an API token (`sked token create`), or open a link whose fragment carries
//! it (`/#token=…`, as `sked dev` prints; a fragment never reaches a server's logs). The
//! token is kept in `localStorage` until signing out.

pub mod api;
pub mod live;
pub mod pages;
pub mod ui;

#[cfg(test)]
mod fixtures;

use leptos::prelude::*;
use leptos::task::spawn_local;
use leptos_router::components::{A, Route, Router, Routes};
use leptos_router::path;

use api::Session;
use live::{Live, LiveStatus};

#[component]
pub fn App() -> impl IntoView {
    let session = Session {
        token: RwSignal::new(token_from_fragment().or_else(api::stored_token)),
        me: RwSignal::new(None),
    };
    provide_context(session);
    api::set_session(session);
    let live = Live::new();
    provide_context(live);

    // Whenever the token changes: check it, learn who it is, and open the live connection.
    Effect::new(move |_| {
        let Some(token) = session.token.get() else {
            return;
        };
        spawn_local(async move {
            match api::me_with(&token).await {
                Ok(me) => {
                    if session.token.get_untracked().as_deref() == Some(token.as_str()) {
                        api::store_token(Some(&token));
                        session.me.set(Some(me));
                        live.start(session, token);
                    }
                }
                Err(e) if e.status == 401 => session.sign_out(),
                // The server is unreachable: keep the token and show the app; pages show the error.
                Err(_) => session.me.set(None),
            }
        });
    });

    view! {
        <Router>
            <Show
                when=move || session.token.with(Option::is_some)
                fallback=|| view! { <pages::signin::SignIn/> }
            >
                <Shell/>
            </Show>
        </Router>
    }
}

/// Takes `#token=…` from the address, if present, and removes it from the address bar.
fn token_from_fragment() -> Option<String> {
    let window = web_sys::window()?;
    let hash = window.location().hash().ok()?;
    let token = hash.strip_prefix("#token=")?.to_owned();
    if let Ok(history) = window.history() {
        let path = window.location().pathname().unwrap_or_else(|_| "/".into());
        let _ = history.replace_state_with_url(&wasm_bindgen::JsValue::NULL, "", Some(&path));
    }
    let token = String::from(js_sys::decode_uri_component(&token).ok()?);
    (!token.is_empty()).then_some(token)
}

#[component]
fn Shell() -> impl IntoView {
    let session = api::session();
    let live = live::live();
    let who = move || {
        session
            .me
            .get()
            .map(|m| format!("{} ({})", m.owner, m.role))
            .unwrap_or_default()
    };
    let status = move || match live.status.get() {
        LiveStatus::Live => ("live", "live"),
        LiveStatus::Connecting => ("connecting", "connecting…"),
        LiveStatus::Polling => ("polling", "polling"),
    };
    view! {
        <header class="top">
            <a class="brand" href="/">"sked"</a>
            <nav class="nav">
                <A href="/" exact=true>"Overview"</A>
                <A href="/history">"History"</A>
                <A href="/tasks">"Tasks"</A>
                <A href="/workflows">"Workflows"</A>
                <A href="/schedules">"Schedules"</A>
                <A href="/services">"Services"</A>
                <A href="/workers">"Workers"</A>
                <A href="/queues">"Queues"</A>
                <A href="/submit">"Submit"</A>
            </nav>
            <span class="who">
                <span class="zone" data-zone=ui::browser_zone().unwrap_or_default()
                    title="Times are shown in the browser's time zone (schedules name their own)">
                    {format!("times in {}", ui::time_zone())}
                </span>
                <span class=move || format!("live-dot {}", status().0) title="live updates" data-live=move || status().0>
                    {move || status().1}
                </span>
                <span class="owner">{who}</span>
                <button class="link" data-action="sign-out" on:click=move |_| session.sign_out()>"Sign out"</button>
            </span>
        </header>
        <main class="page">
            <Routes fallback=|| view! { <ui::Empty>"No such page."</ui::Empty> }>
                <Route path=path!("/") view=pages::overview::Overview/>
                <Route path=path!("/history") view=pages::history::History/>
                <Route path=path!("/tasks") view=pages::tasks::TaskList/>
                <Route path=path!("/tasks/:id") view=pages::task::TaskPage/>
                <Route path=path!("/workflows") view=pages::workflows::WorkflowList/>
                <Route path=path!("/workflows/:id") view=pages::workflows::WorkflowPage/>
                <Route path=path!("/schedules") view=pages::schedules::ScheduleList/>
                <Route path=path!("/schedules/:id") view=pages::schedules::SchedulePage/>
                <Route path=path!("/services") view=pages::services::Services/>
                <Route path=path!("/workers") view=pages::workers::Workers/>
                <Route path=path!("/queues") view=pages::queues::Queues/>
                <Route path=path!("/submit") view=pages::submit::Submit/>
                <Route path=path!("/submit/workflow") view=pages::submit_workflow::SubmitWorkflowPage/>
            </Routes>
        </main>
    }
}
