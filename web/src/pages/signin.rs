//! Sign-in with an API token.

use leptos::prelude::*;
use leptos::task::spawn_local;

use crate::{api, ui};

#[component]
pub fn SignIn() -> impl IntoView {
    let session = api::session();
    let token = RwSignal::new(String::new());
    let error = RwSignal::new(None::<String>);
    let busy = RwSignal::new(false);
    let submit = move |ev: leptos::ev::SubmitEvent| {
        ev.prevent_default();
        let t = token.get_untracked().trim().to_owned();
        if t.is_empty() {
            error.set(Some("Paste an API token.".into()));
            return;
        }
        busy.set(true);
        spawn_local(async move {
            match api::me_with(&t).await {
                Ok(me) => {
                    error.set(None);
                    api::store_token(Some(&t));
                    session.me.set(Some(me));
                    session.token.set(Some(t));
                }
                Err(e) if e.status == 401 => {
                    error.set(Some("This token is not valid (unknown or revoked).".into()))
                }
                Err(e) => error.set(Some(e.message)),
            }
            busy.set(false);
        });
    };
    view! {
        <main class="signin">
            <h1>"sked"</h1>
            <form on:submit=submit>
                <label for="token">"API token"</label>
                <input
                    id="token"
                    name="token"
                    type="password"
                    autocomplete="current-password"
                    placeholder="sked_…"
                    prop:value=move || token.get()
                    on:input=move |ev| token.set(event_target_value(&ev))
                />
                <button type="submit" class="primary" disabled=move || busy.get()>"Sign in"</button>
                <ui::ErrorBox message=error/>
                <p class="hint">
                    "Create a token with " <code>"sked token create --owner NAME"</code>
                    "; " <code>"sked dev"</code> " prints a sign-in link."
                </p>
            </form>
        </main>
    }
}
