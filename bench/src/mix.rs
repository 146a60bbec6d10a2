//! W16, REST throughput under a dashboard's mix: W8's data set (`--w8-tasks`, 1,000,000)
//! created over the last `--w16-hours` hours instead of 24, so that at least 100,000 tasks
//! finished in the last hour (checked by SQL before the requests; the workload fails
//! below), its rollups folded and the trigram index made as in W8; then the API served in
//! this process (W8's, a 16-connection pool) answers `--w16-clients` HTTP clients that send
//! requests back to back for `--w16-secs` seconds after a 3 s warm-up, each client cycling
//! through a fixed mix of what an open dashboard asks (overview, task list, a page of
//! failures, a queue's tasks, a user's tasks, a text search, a task, a count, the history).
//! Reported: the requests answered per second (target ≥ 400), p50 and p99 of a request's
//! time seen by the client, and the answers other than 2xx (must be none: the workload fails
//! otherwise); per endpoint, its count and percentiles on stderr, with what PostgreSQL's
//! backends were doing (sampled from `pg_stat_activity`) and where the CPU went.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use tokio::time::Instant;

use crate::config::Config;
use crate::pg::{self, BenchDb};
use crate::process::CpuSnapshot;
use crate::reads::{self, Api};
use crate::report::{Sample, Target, percentile};

const W: &str = "W16";
/// Requests a second the API should answer under the mix.
const TARGET_RPS: f64 = 400.0;
/// The data set must have at least this many tasks finished in the last hour.
const MIN_FINISHED_LAST_HOUR: i64 = 100_000;
/// Requests before the measured window (connections, statement caches, the buffer cache).
const WARM_UP: Duration = Duration::from_secs(3);
/// How often `pg_stat_activity` is sampled during the window.
const ACTIVITY_EVERY: Duration = Duration::from_millis(50);

pub async fn run(cfg: &Config) -> Result<Vec<Sample>> {
    pg::with_db(&cfg.database_url, "w16", async |db| {
        let mut out = Vec::new();
        reads::prepare(db, W, cfg.w8_tasks, cfg.w16_hours, &mut out).await?;
        let finished: i64 = sqlx::query_scalar(
            "select count(*) from sked.tasks where finished_at > now() - interval '1 hour'",
        )
        .fetch_one(&db.pool)
        .await?;
        eprintln!(
            "  {finished} tasks finished in the last hour ({} tasks over {} hours)",
            cfg.w8_tasks, cfg.w16_hours
        );
        if finished < MIN_FINISHED_LAST_HOUR {
            bail!(
                "only {finished} tasks finished in the last hour, fewer than \
                 {MIN_FINISHED_LAST_HOUR}: pass a shorter --w16-hours or more --w8-tasks"
            );
        }
        out.push(Sample::new(
            W,
            "tasks finished in the last hour (before the requests)",
            "count",
            finished as f64,
            Target::at_least(MIN_FINISHED_LAST_HOUR as f64),
        ));
        let api = Api::start(db).await?;
        let result = measure(cfg, db, &api, &mut out).await;
        api.stop().await;
        result?;
        Ok(out)
    })
    .await
}

/// One kind of request of the mix.
struct Endpoint {
    name: &'static str,
    /// Requests of this kind in each cycle of the mix.
    weight: usize,
    token: String,
    /// URLs taken in turn (several for the task detail, one otherwise).
    urls: Vec<String>,
}

/// What one client saw.
#[derive(Default)]
struct Seen {
    /// (endpoint, ms) of the 2xx answers completed within the window.
    answered: Vec<(usize, f64)>,
    /// Answers other than 2xx, over the whole run (warm-up included).
    non_2xx: u64,
    /// Requests without an answer (connection errors, timeouts), over the whole run.
    failed: u64,
    /// The first of those, to show.
    first_problem: Option<String>,
}

/// The mix: what an open dashboard asks for, weighted by how often it asks. The overview
/// refetches up to once a second while live events arrive (an admin's and a user's); the
/// task list shows the newest summaries and its pages open tasks; the rest are a click each.
fn endpoints(api: &Api, tasks: &[String]) -> Vec<Endpoint> {
    let base = &api.api.base;
    let one = |name, weight, token: &String, path: &str| Endpoint {
        name,
        weight,
        token: token.clone(),
        urls: vec![format!("{base}{path}")],
    };
    vec![
        one("overview, admin", 3, &api.admin, "/overview"),
        one("overview, user ops (45 %)", 2, &api.ops, "/overview"),
        one(
            "list, newest, view=summary",
            3,
            &api.admin,
            "/tasks?view=summary",
        ),
        one("list, state=failed", 1, &api.admin, "/tasks?state=failed"),
        one("list, queue=gpu", 1, &api.admin, "/tasks?queue=gpu"),
        one("list, user token of owner ml (9 %)", 1, &api.ml, "/tasks"),
        one("list, q=report (15 %)", 1, &api.admin, "/tasks?q=report"),
        Endpoint {
            name: "task detail (the newest 50 in turn)",
            weight: 2,
            token: api.admin.clone(),
            urls: tasks
                .iter()
                .map(|id| format!("{base}/tasks/{id}"))
                .collect(),
        },
        one(
            "count, state=failed",
            1,
            &api.admin,
            "/tasks/count?state=failed",
        ),
        one("history 24 h, admin", 1, &api.admin, "/history?range=24h"),
    ]
}

/// The order of one cycle of the mix: each endpoint `weight` times, interleaved (every
/// endpoint once, then those of weight 2 or more again, and so on).
fn cycle(endpoints: &[Endpoint]) -> Vec<usize> {
    let rounds = endpoints.iter().map(|e| e.weight).max().unwrap_or(0);
    (0..rounds)
        .flat_map(|round| {
            endpoints
                .iter()
                .enumerate()
                .filter(move |(_, e)| e.weight > round)
                .map(|(i, _)| i)
        })
        .collect()
}

async fn measure(cfg: &Config, db: &BenchDb, api: &Api, out: &mut Vec<Sample>) -> Result<()> {
    let first: Value = api.get(api.admin.as_str(), "/tasks?limit=50").await?;
    let tasks: Vec<String> = first["tasks"]
        .as_array()
        .context("the first page has tasks")?
        .iter()
        .filter_map(|t| t["id"].as_str().map(str::to_owned))
        .collect();
    if tasks.is_empty() {
        bail!("the first page of tasks is empty");
    }
    let endpoints = Arc::new(endpoints(api, &tasks));
    let cycle = Arc::new(cycle(&endpoints));
    let start = Instant::now() + WARM_UP;
    let end = start + cfg.w16_duration;
    let clients: Vec<_> = (0..cfg.w16_clients)
        .map(|i| {
            let (http, endpoints, cycle) =
                (api.api.client.clone(), endpoints.clone(), cycle.clone());
            tokio::spawn(async move {
                let mut seen = Seen::default();
                // Clients start at different places of the cycle, so that every kind of
                // request is in flight at any moment.
                let mut k = i;
                while Instant::now() < end {
                    let e = cycle[k % cycle.len()];
                    let endpoint = &endpoints[e];
                    let url = &endpoint.urls[(k / cycle.len()) % endpoint.urls.len()];
                    k += 1;
                    let sent = Instant::now();
                    let answer = match http.get(url).bearer_auth(&endpoint.token).send().await {
                        Ok(resp) => {
                            let status = resp.status();
                            resp.bytes().await.map(|body| (status, body))
                        }
                        Err(err) => Err(err),
                    };
                    let done = Instant::now();
                    match answer {
                        Ok((status, _)) if status.is_success() => {
                            if done >= start && done <= end {
                                let ms = done.duration_since(sent).as_secs_f64() * 1000.0;
                                seen.answered.push((e, ms));
                            }
                        }
                        Ok((status, body)) => {
                            seen.non_2xx += 1;
                            seen.first_problem.get_or_insert_with(|| {
                                format!(
                                    "GET {url} answered {status}: {}",
                                    String::from_utf8_lossy(&body[..body.len().min(300)])
                                )
                            });
                        }
                        Err(err) => {
                            seen.failed += 1;
                            seen.first_problem
                                .get_or_insert_with(|| format!("GET {url}: {err}"));
                        }
                    }
                }
                seen
            })
        })
        .collect();

    // During the window: what PostgreSQL's backends of this database are doing, and the CPU.
    tokio::time::sleep_until(start).await;
    let cpu_before = CpuSnapshot::take(std::process::id(), &db.name);
    let activity = sample_activity(db, end).await;
    if let Err(err) = &activity {
        eprintln!("  sampling pg_stat_activity failed: {err:#}");
        tokio::time::sleep_until(end).await;
    }
    let cpu = cpu_before.until(&CpuSnapshot::take(std::process::id(), &db.name));
    let load_average = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();

    let mut all = Seen::default();
    for client in clients {
        let seen = client.await.context("a client panicked")?;
        all.answered.extend(seen.answered);
        all.non_2xx += seen.non_2xx;
        all.failed += seen.failed;
        if all.first_problem.is_none() {
            all.first_problem = seen.first_problem;
        }
    }
    let secs = cfg.w16_duration.as_secs_f64();
    let rate = all.answered.len() as f64 / secs;
    let mut ms: Vec<f64> = all.answered.iter().map(|a| a.1).collect();
    ms.sort_by(f64::total_cmp);
    let (p50, p99) = (percentile(&ms, 0.5), percentile(&ms, 0.99));
    eprintln!(
        "  {} clients, {secs:.0} s: {} answers, {rate:.0} requests/s, p50 {p50:.1} ms, \
         p99 {p99:.1} ms; {} not 2xx, {} without an answer",
        cfg.w16_clients,
        ms.len(),
        all.non_2xx,
        all.failed
    );
    for (i, endpoint) in endpoints.iter().enumerate() {
        let mut ms: Vec<f64> = all
            .answered
            .iter()
            .filter(|a| a.0 == i)
            .map(|a| a.1)
            .collect();
        ms.sort_by(f64::total_cmp);
        eprintln!(
            "    {:<40} {:>6} answers  p50 {:8.1} ms  p99 {:8.1} ms",
            endpoint.name,
            ms.len(),
            percentile(&ms, 0.5),
            percentile(&ms, 0.99)
        );
    }
    eprintln!(
        "  CPU during the window, in cores: this process (API server and clients) {:.2}, \
         PostgreSQL backends of the database {:.2}, all PostgreSQL {:.2}, the machine {:.2} \
         (load average {})",
        cpu.worker_secs / secs,
        cpu.postgres_db_secs / secs,
        cpu.postgres_all_secs / secs,
        cpu.machine_busy_cores,
        load_average.trim()
    );
    if let Ok((samples, mut rows)) = activity {
        rows.sort_by_key(|row| std::cmp::Reverse(row.1));
        eprintln!(
            "  PostgreSQL backends busy at once, on average, by statement and wait event (CPU: \
             none; or idle in a transaction) ({samples} samples of pg_stat_activity):"
        );
        for ((query, wait), n) in rows.iter().take(10) {
            eprintln!(
                "    {:5.2}  {wait:<22} {query}",
                *n as f64 / samples.max(1) as f64
            );
        }
    }
    out.extend([
        Sample::new(
            W,
            format!("requests answered ({} clients)", cfg.w16_clients),
            "requests/s",
            rate,
            Target::at_least(TARGET_RPS),
        ),
        Sample::new(W, "request time p50", "ms", p50, None),
        Sample::new(W, "request time p99", "ms", p99, None),
        Sample::new(
            W,
            "answers other than 2xx",
            "count",
            all.non_2xx as f64,
            Target::at_most(0.0),
        ),
        Sample::new(
            W,
            "CPU of this process (API server and clients)",
            "cores",
            cpu.worker_secs / secs,
            None,
        ),
        Sample::new(
            W,
            "CPU of the database's PostgreSQL backends",
            "cores",
            cpu.postgres_db_secs / secs,
            None,
        ),
    ]);
    if all.non_2xx > 0 || all.failed > 0 {
        bail!(
            "{} answers other than 2xx and {} requests without an answer; the first: {}",
            all.non_2xx,
            all.failed,
            all.first_problem.unwrap_or_default()
        );
    }
    Ok(())
}

/// Samples the busy backends (active, or idle in a transaction) of the benchmark database every [`ACTIVITY_EVERY`] until
/// `end`: how many samples, and how often each (statement, wait event) was seen.
async fn sample_activity(
    db: &BenchDb,
    end: Instant,
) -> Result<(u64, Vec<((String, String), u64)>)> {
    let mut counts: HashMap<(String, String), u64> = HashMap::new();
    let mut samples = 0u64;
    let mut tick = tokio::time::interval(ACTIVITY_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while Instant::now() < end {
        tick.tick().await;
        let rows: Vec<(String, String)> = sqlx::query_as(
            "select left(regexp_replace(query, '\\s+', ' ', 'g'), 110),
                    case when state = 'active'
                         then coalesce(wait_event_type || ':' || wait_event, 'CPU')
                         else state end
               from pg_stat_activity
              where datname = current_database() and state <> 'idle'
                and backend_type = 'client backend' and pid <> pg_backend_pid()",
        )
        .fetch_all(&db.pool)
        .await?;
        samples += 1;
        for row in rows {
            *counts.entry(row).or_default() += 1;
        }
    }
    Ok((samples, counts.into_iter().collect()))
}

#[cfg(test)]
mod tests {
    use super::{Endpoint, cycle};

    #[test]
    fn a_cycle_holds_each_endpoint_as_often_as_its_weight() {
        let e = |weight| Endpoint {
            name: "",
            weight,
            token: String::new(),
            urls: vec![],
        };
        assert_eq!(cycle(&[e(3), e(1), e(2)]), vec![0, 1, 2, 0, 2, 0]);
    }
}
