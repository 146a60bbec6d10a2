//! W8, the dashboard's reads on a million tasks: `--w8-tasks` (1,000,000) tasks are loaded
//! with one `INSERT … SELECT generate_series` (`reads.sql`: mostly succeeded, some failed,
//! waiting, running, retry and blocked, five owners and six queues, realistic command lines),
//! then the rollups of their finishes are folded (as the upkeep would), and every listing,
//! overview and history the dashboard uses is requested `--w8-requests` times over
//! HTTP from the API served in this process, one request at a time, and so is a Prometheus
//! scrape of `/metrics`. Reported per endpoint: the
//! median and the 99th percentile of the request time, seen by the client on the loopback
//! interface, against the target of 100 ms.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use sqlx::Executor;
use tokio::time::Instant;

use crate::api::InProcessApi;
use crate::config::Config;
use crate::pg::{self, BenchDb};
use crate::report::{Sample, Target, percentile};

const W: &str = "W8";
/// Every listing and overview answers within this many milliseconds.
const TARGET_MS: f64 = 100.0;
/// The data set, for `$1` tasks over the last `$2` hours.
const DATA: &str = include_str!("reads.sql");
/// W8's data set spans a day.
const SPAN_HOURS: f64 = 24.0;

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w8", async |db| {
        let mut out = Vec::new();
        prepare(db, W, cfg.w8_tasks, SPAN_HOURS, &mut out).await?;
        let api = Api::start(db).await?;
        let result = measure(&api, cfg.w8_requests, &mut out).await;
        api.stop().await;
        result?;
        Ok(out)
    })
    .await
}

/// The data set of `n` tasks created over the last `hours` hours, its rollups folded and
/// the text search's trigram index made, each timed into `out` under `workload` (W8, W16).
pub async fn prepare(
    db: &BenchDb,
    workload: &'static str,
    n: usize,
    hours: f64,
    out: &mut Vec<Sample>,
) -> Result<()> {
    let started = Instant::now();
    load(db, n, hours).await?;
    out.push(Sample::new(
        workload,
        format!("load {n} tasks (INSERT … SELECT, VACUUM ANALYZE)"),
        "s",
        started.elapsed().as_secs_f64(),
        None,
    ));
    let started = Instant::now();
    let folded = fold(db).await?;
    out.push(Sample::new(
        workload,
        format!("fold the rollups of finishes ({folded} deltas)"),
        "s",
        started.elapsed().as_secs_f64(),
        None,
    ));
    // The text search's trigram index, as `sked search-index enable` makes it.
    let started = Instant::now();
    sked_db::listing::text_index_enable(&db.pool).await?;
    out.push(Sample::new(
        workload,
        "make the trigram index of the text search (CREATE INDEX CONCURRENTLY, ANALYZE)",
        "s",
        started.elapsed().as_secs_f64(),
        None,
    ));
    Ok(())
}

/// Ten live workers and the data set (`n` tasks over the last `hours` hours), then the
/// statistics and visibility map autovacuum would leave.
async fn load(db: &BenchDb, n: usize, hours: f64) -> Result<()> {
    db.pool
        .execute(
            "insert into sked.workers (id, name, host, pid, version, queues, concurrency, lease)
             select ('00000000-0000-4000-8000-0000000000' || lpad(k::text, 2, '0'))::uuid,
                    'w' || k, 'host' || k, 1000 + k, '0.1.0',
                    array['default', 'emails', 'reports', 'etl', 'gpu', 'ml-rare'], 200,
                    interval '1 hour'
               from generate_series(1, 10) k",
        )
        .await?;
    // The same data set every run: the random draws follow one seed on one connection.
    let mut conn = db.pool.acquire().await?;
    conn.execute("select setseed(0.42)").await?;
    let inserted = sqlx::query(DATA)
        .bind(i32::try_from(n).context("--w8-tasks is too large")?)
        .bind(hours)
        .execute(&mut *conn)
        .await?
        .rows_affected();
    drop(conn);
    if inserted != n as u64 {
        bail!("the data set has {inserted} tasks instead of {n}");
    }
    db.pool.execute("vacuum analyze sked.tasks").await?;
    Ok(())
}

/// Folds the deltas that the load's finishes wrote into the rollups, as the upkeep of a
/// server or worker would within seconds; returns how many.
async fn fold(db: &BenchDb) -> Result<i64> {
    let mut folded = 0;
    loop {
        let n = sked_db::history::fold(&db.pool, sked_db::history::FOLD_BATCH).await?;
        folded += i64::from(n);
        if n == 0 {
            return Ok(folded);
        }
    }
}

/// The instant `minutes` ago, as a query parameter (RFC 3339, `Z`).
fn ago(minutes: i64) -> String {
    (chrono::Utc::now() - chrono::Duration::minutes(minutes))
        .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

/// The endpoints the dashboard reads, each `requests` times.
async fn measure(api: &Api, requests: usize, out: &mut Vec<Sample>) -> Result<()> {
    let first: Value = api.get(api.admin.as_str(), "/tasks?limit=50").await?;
    let cursor = first["next_cursor"]
        .as_str()
        .context("the first page has a cursor")?
        .to_owned();
    let task = first["tasks"][0]["id"]
        .as_str()
        .context("the first page has a task")?
        .to_owned();
    let running: Value = api
        .get(api.admin.as_str(), "/tasks?state=running&limit=1")
        .await?;
    let worker = running["tasks"][0]["worker_id"]
        .as_str()
        .context("a task is running")?
        .to_owned();
    let cases: Vec<(String, &str, String)> = vec![
        (
            "list, newest 50".into(),
            api.admin.as_str(),
            "/tasks".into(),
        ),
        (
            "list, second page by cursor".into(),
            api.admin.as_str(),
            format!("/tasks?after={cursor}"),
        ),
        (
            "list, view=summary".into(),
            api.admin.as_str(),
            "/tasks?view=summary".into(),
        ),
        (
            "list, state=failed".into(),
            api.admin.as_str(),
            "/tasks?state=failed".into(),
        ),
        (
            "list, state=running".into(),
            api.admin.as_str(),
            "/tasks?state=running".into(),
        ),
        (
            "list, state=failed,cancelled,upstream_failed".into(),
            api.admin.as_str(),
            "/tasks?state=failed,cancelled,upstream_failed".into(),
        ),
        (
            "list, state=waiting".into(),
            api.admin.as_str(),
            "/tasks?state=waiting".into(),
        ),
        (
            "list, state=succeeded".into(),
            api.admin.as_str(),
            "/tasks?state=succeeded".into(),
        ),
        (
            "list, unfinished (blocked,waiting,running,retry)".into(),
            api.admin.as_str(),
            "/tasks?state=blocked,waiting,running,retry".into(),
        ),
        (
            "list, queue=gpu".into(),
            api.admin.as_str(),
            "/tasks?queue=gpu".into(),
        ),
        (
            "list, queue=ml-rare (1 %)".into(),
            api.admin.as_str(),
            "/tasks?queue=ml-rare".into(),
        ),
        (
            "list, queue=reports&state=waiting".into(),
            api.admin.as_str(),
            "/tasks?queue=reports&state=waiting".into(),
        ),
        (
            "list, submitted in a 10-minute range 12 h ago".into(),
            api.admin.as_str(),
            format!(
                "/tasks?created_after={}&created_before={}",
                ago(12 * 60),
                ago(12 * 60 - 10)
            ),
        ),
        (
            "list, state=failed&finished_after=1 h ago".into(),
            api.admin.as_str(),
            format!("/tasks?state=failed&finished_after={}", ago(60)),
        ),
        (
            "list, owner=intern (1 %)".into(),
            api.admin.as_str(),
            "/tasks?owner=intern".into(),
        ),
        (
            "list, queue=ml-rare&state=failed".into(),
            api.admin.as_str(),
            "/tasks?queue=ml-rare&state=failed".into(),
        ),
        (
            "list, worker=ID (its running tasks)".into(),
            api.admin.as_str(),
            format!("/tasks?worker={worker}"),
        ),
        (
            "list, user token of owner ml (9 %)".into(),
            api.ml.as_str(),
            "/tasks".into(),
        ),
        (
            "list, user token of owner intern (1 %)".into(),
            api.intern.as_str(),
            "/tasks".into(),
        ),
        (
            "list, user intern, state=failed".into(),
            api.intern.as_str(),
            "/tasks?state=failed".into(),
        ),
        (
            "list, user intern, state=succeeded&queue=gpu".into(),
            api.intern.as_str(),
            "/tasks?state=succeeded&queue=gpu".into(),
        ),
        (
            "list, q=report (common: 15 %)".into(),
            api.admin.as_str(),
            "/tasks?q=report".into(),
        ),
        (
            "list, q=c-4242 (rare: 13 tasks)".into(),
            api.admin.as_str(),
            "/tasks?q=c-4242".into(),
        ),
        (
            "list, user intern, q=c-4242".into(),
            api.intern.as_str(),
            "/tasks?q=c-4242".into(),
        ),
        (
            "list, q=user123 (0.1 %)".into(),
            api.admin.as_str(),
            "/tasks?q=user123".into(),
        ),
        (
            "list, user intern, q=report&state=failed".into(),
            api.intern.as_str(),
            "/tasks?q=report&state=failed".into(),
        ),
        (
            "count, all".into(),
            api.admin.as_str(),
            "/tasks/count".into(),
        ),
        (
            "count, state=failed".into(),
            api.admin.as_str(),
            "/tasks/count?state=failed".into(),
        ),
        (
            "count, queue=ml-rare".into(),
            api.admin.as_str(),
            "/tasks/count?queue=ml-rare".into(),
        ),
        (
            "count, user intern, state=failed".into(),
            api.intern.as_str(),
            "/tasks/count?state=failed".into(),
        ),
        (
            "count, q=c-4242".into(),
            api.admin.as_str(),
            "/tasks/count?q=c-4242".into(),
        ),
        (
            "count, q=report".into(),
            api.admin.as_str(),
            "/tasks/count?q=report".into(),
        ),
        (
            "count, user intern, q=report&state=failed".into(),
            api.intern.as_str(),
            "/tasks/count?q=report&state=failed".into(),
        ),
        (
            "task detail".into(),
            api.admin.as_str(),
            format!("/tasks/{task}"),
        ),
        (
            "overview, admin".into(),
            api.admin.as_str(),
            "/overview".into(),
        ),
        (
            "overview, user ops (45 %)".into(),
            api.ops.as_str(),
            "/overview".into(),
        ),
        (
            "history 24 h, admin".into(),
            api.admin.as_str(),
            "/history?range=24h".into(),
        ),
        (
            "history 7 d, admin".into(),
            api.admin.as_str(),
            "/history?range=7d".into(),
        ),
        (
            "history 24 h, queue=gpu".into(),
            api.admin.as_str(),
            "/history?range=24h&queue=gpu".into(),
        ),
        (
            "history 24 h, user ops (45 %)".into(),
            api.ops.as_str(),
            "/history?range=24h".into(),
        ),
        ("queues, admin".into(), api.admin.as_str(), "/queues".into()),
        ("workers".into(), api.admin.as_str(), "/workers".into()),
        (
            "Prometheus scrape (/metrics)".into(),
            api.admin.as_str(),
            METRICS.into(),
        ),
    ];
    for (name, token, path) in cases {
        // Warm up the connection and the statement cache, as a dashboard that is open would.
        for _ in 0..3 {
            api.get(token, &path).await?;
        }
        let mut ms = Vec::with_capacity(requests);
        for _ in 0..requests {
            let started = Instant::now();
            api.get(token, &path).await?;
            ms.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        ms.sort_by(f64::total_cmp);
        let p50 = percentile(&ms, 0.5);
        let p99 = percentile(&ms, 0.99);
        eprintln!("  {name:<50} p50 {p50:8.2} ms  p99 {p99:8.2} ms  ({path})");
        out.push(Sample::new(
            W,
            format!("GET {name}: p50"),
            "ms",
            p50,
            Target::at_most(TARGET_MS),
        ));
        out.push(Sample::new(
            W,
            format!("GET {name}: p99"),
            "ms",
            p99,
            Target::at_most(TARGET_MS),
        ));
    }
    Ok(())
}

/// The API served in this process on an ephemeral port, with an admin token and user tokens
/// of three owners.
pub struct Api {
    pub api: InProcessApi,
    pub admin: String,
    pub ops: String,
    pub ml: String,
    pub intern: String,
}

impl Api {
    pub async fn start(db: &BenchDb) -> Result<Api> {
        use sked_db::token::{Role, create};
        let admin = create(&db.pool, "root", Role::Admin, "bench").await?;
        let ops = create(&db.pool, "ops", Role::User, "bench").await?;
        let ml = create(&db.pool, "ml", Role::User, "bench").await?;
        let intern = create(&db.pool, "intern", Role::User, "bench").await?;
        let api = InProcessApi::start(db, Duration::from_secs(60)).await?;
        Ok(Api {
            api,
            admin,
            ops,
            ml,
            intern,
        })
    }

    pub async fn stop(self) {
        self.api.stop().await;
    }

    /// `GET` of `path` (under `/api/v1`, but [`METRICS`]), which must answer 200 with JSON
    /// (the metrics: text, answered as `null`).
    pub async fn get(&self, token: &str, path: &str) -> Result<Value> {
        let url = if path == METRICS {
            format!("{}{path}", self.api.base.trim_end_matches("/api/v1"))
        } else {
            format!("{}{path}", self.api.base)
        };
        let resp = self.api.client.get(url).bearer_auth(token).send().await?;
        let status = resp.status();
        let body = resp.bytes().await?;
        if status != reqwest::StatusCode::OK {
            bail!(
                "GET {path} answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        if path == METRICS {
            return Ok(Value::Null);
        }
        Ok(serde_json::from_slice(&body)?)
    }
}

/// The server's Prometheus metrics, at the root rather than under `/api/v1`.
const METRICS: &str = "/metrics";

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 0.5), 50.0);
        assert_eq!(percentile(&v, 0.99), 99.0);
        assert_eq!(percentile(&[3.0], 0.99), 3.0);
    }
}
