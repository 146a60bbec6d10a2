//! The sked dashboard, mounted on the page's body.

fn main() {
    console_error_panic_hook::set_once();
    leptos::mount::mount_to_body(sked_web::App);
}
