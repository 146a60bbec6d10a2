//! The API server run inside the benchmark (W1's REST methods, W8's reads):
//! `sked_server::serve` on an ephemeral 127.0.0.1 port with the 16-connection pool
//! `sked-server` uses, and an HTTP client for it. Its quota of task rows per owner per minute
//! is the largest allowed: W1 enqueues more than the default through one user token, and
//! its requests still pay for taking from the quota.

use std::time::Duration;

use anyhow::{Result, bail};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::pg::BenchDb;

pub struct InProcessApi {
    /// `http://127.0.0.1:PORT/api/v1`.
    pub base: String,
    pub client: reqwest::Client,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl InProcessApi {
    /// Starts the server on `db` and waits until `/health` answers; requests of `client`
    /// give up after `request_timeout`.
    pub async fn start(db: &BenchDb, request_timeout: Duration) -> Result<InProcessApi> {
        // The pool size `sked-server` uses.
        let pool = db.pool("sked-server", 16).await?;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://{}/api/v1", listener.local_addr()?);
        let shutdown = CancellationToken::new();
        let quotas = sked_server::Quotas {
            max_rows_per_owner_per_minute: sked_server::MAX_ROWS_PER_OWNER_PER_MINUTE,
            ..sked_server::Quotas::default()
        };
        let upkeep = sked_server::upkeep(&pool);
        let server = tokio::spawn(sked_server::serve_configured(
            pool,
            listener,
            shutdown.clone(),
            sked_server::EventsConfig::default(),
            quotas,
            upkeep,
        ));
        let client = reqwest::Client::builder()
            .timeout(request_timeout)
            .build()?;
        let api = InProcessApi {
            base,
            client,
            shutdown,
            server,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ok = api
                .client
                .get(format!("{}/health", api.base))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return Ok(api);
            }
            if Instant::now() > deadline || api.server.is_finished() {
                api.stop().await;
                bail!("the in-process API server did not become healthy");
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.server.await;
    }
}
