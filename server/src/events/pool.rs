//! The live events' own connections: a small pool beside the server's, so that requests
//! holding every connection of the server's pool never delay what the hub reads, nor the
//! token checks of its clients.

use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::PgPoolOptions;

/// The connections the hub holds by default: one `LISTEN` connection for its hints, one for
/// its reads and its row in `sked.event_listeners`, two for its clients' token checks.
pub const DEFAULT_POOL_SIZE: u32 = 4;

/// The fewest connections the hub works with: its `LISTEN` connection and one for the rest.
pub const MIN_POOL_SIZE: u32 = 2;

/// A pool of `size` connections to the database of `server_pool`, acting as the role its
/// connections act as (a server narrowed to `sked_server` by `sked_db::connect_as` keeps
/// those rights for its live events too). It connects lazily: a hub without clients holds
/// no connection.
pub(crate) async fn connect(server_pool: &PgPool, size: u32) -> Result<PgPool, sqlx::Error> {
    let (current, session): (String, String) =
        sqlx::query_as("select current_user::text, session_user::text")
            .fetch_one(sked_db::on(server_pool))
            .await?;
    // Its LISTEN and its role need sessions: behind a transaction-mode pooler, they are on
    // the direct URL.
    let options = sked_db::pooler::direct_options(server_pool)
        .map_err(|e| sqlx::Error::Configuration(e.into()))?;
    let name = format!(
        "{} (live events)",
        options.get_application_name().unwrap_or("sked-server")
    );
    let options = options.application_name(&name);
    let mut pool = PgPoolOptions::new()
        .max_connections(size.max(MIN_POOL_SIZE))
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(10));
    if current != session {
        pool = pool.after_connect(move |conn, _meta| {
            let role = current.clone();
            Box::pin(async move {
                sqlx::query("select set_config('role', $1, false)")
                    .bind(role)
                    .execute(conn)
                    .await?;
                Ok(())
            })
        });
    }
    Ok(pool.connect_lazy_with(options))
}
