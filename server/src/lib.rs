//! The sked REST API server (axum), under `/api/v1`.

use std::net::SocketAddr;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// Command-line flags of `sked-server` (and of the server inside `sked dev`).
#[derive(Debug, Clone, clap::Args)]
pub struct ServerArgs {
    /// Address to listen on.
    #[arg(long, env = "SKED_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
}

/// The API router over a pool.
pub fn router(pool: PgPool) -> axum::Router {
    let _ = pool;
    axum::Router::new()
}

/// Serves the API on `listener` until `shutdown` is cancelled.
pub async fn serve(
    pool: PgPool,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(pool))
        .with_graceful_shutdown(async move { shutdown.cancelled().await })
        .await
}
