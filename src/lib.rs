//! The code behind the `sked`, `sked-server` and `sked-worker` binaries: running the server and
//! the worker ([`app`]), the private PostgreSQL of `sked dev` ([`embedded_pg`]), the REST
//! API client of the CLI ([`client`]) and their logs ([`logging`]).

pub mod app;
pub mod client;
pub mod embedded_pg;
pub mod logging;
