//! A fresh, migrated database per test, on the server named by `DATABASE_URL`
//! (default `postgres://postgres@127.0.0.1:5432/postgres`).
//!
//! `TestDb::new().await` creates `sked_test_<random>` and migrates it; dropping the `TestDb`
//! drops the database (with `FORCE`, so connections a test leaked do not keep it alive).

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{ConnectOptions, Connection, Executor};
use std::str::FromStr;

/// The server that tests create their databases on.
pub fn admin_url() -> String {
    std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned())
}

pub struct TestDb {
    pub pool: PgPool,
    /// A URL of this database, for processes a test starts (workers, servers).
    pub url: String,
    pub name: String,
}

impl TestDb {
    /// Creates and migrates a fresh database.
    pub async fn new() -> TestDb {
        let db = TestDb::empty().await;
        crate::migrate(&db.pool)
            .await
            .expect("migrating the test database");
        db
    }

    /// Creates a fresh database without migrating it.
    pub async fn empty() -> TestDb {
        let admin = PgConnectOptions::from_str(&admin_url()).expect("DATABASE_URL is a valid URL");
        let name = format!("sked_test_{}", uuid::Uuid::new_v4().simple());
        let mut conn = admin
            .connect()
            .await
            .unwrap_or_else(|e| panic!("tests need PostgreSQL at {}: {e}", admin_url()));
        conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
            "create database {name}"
        ))))
        .await
        .expect("creating the test database");
        conn.close().await.ok();
        let options = admin.database(&name);
        let url = options.to_url_lossy().to_string();
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(10)
            .connect_with(options)
            .await
            .expect("connecting to the test database");
        TestDb { pool, url, name }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        execute_as_admin_in_drop(format!(
            "drop database if exists {} with (force)",
            self.name
        ));
    }
}

/// Runs `sql` on the server of [`admin_url`] from a `Drop` of a test's fixture, ignoring
/// errors: drops run inside the test's runtime, which the fixture's pooled connections
/// belong to, so this uses a thread with a runtime of its own and waits for it.
pub fn execute_as_admin_in_drop(sql: String) {
    let _ = std::thread::spawn(move || {
        let rt = tokio_rt();
        rt.block_on(async move {
            if let Ok(mut conn) = PgConnectOptions::from_str(&admin_url())
                .unwrap()
                .connect()
                .await
            {
                let _ = conn.execute(sqlx::raw_sql(sqlx::AssertSqlSafe(sql))).await;
            }
        });
    })
    .join();
}

fn tokio_rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}
