//! Prometheus metrics (`docs/operations.md`): what one process saw, kept in memory by the
//! process ([`Metrics`], the worker's attempts, claims and leases), and what the database
//! holds, read when scraped ([`Scrape`]: tasks per queue and state, the oldest due task,
//! workers, schedule ticks). Both are written in the Prometheus text format (0.0.4), which
//! Prometheus and every tool that scrapes it read (and `promtool check metrics` lints);
//! `sked-server` serves them on `/metrics`, a worker on `--metrics-listen`.
//!
//! Queue names are labels, and an owner chooses them: the families read from the database
//! keep the queues with the most unfinished tasks, up to a cap, and add up the others under
//! the label `queue="_other"` (no queue is called that: a queue name starts with a letter or
//! digit), so that a submitter cannot make a scrape, or Prometheus, as large as it likes. A
//! worker's own families name only the queues it was told to serve.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;

use chrono::{DateTime, Utc};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use sqlx::PgPool;

use crate::Result;

/// The content type of [`encode`]'s text.
pub const CONTENT_TYPE: &str = prometheus_text::CONTENT_TYPE;

/// The label of the queues a scrape adds up (see the module's documentation).
pub const OTHER_QUEUES: &str = "_other";

/// Default of the cap on queues named in one scrape (`sked-server --metrics-max-queues`).
pub const DEFAULT_MAX_QUEUES: usize = 200;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueueLabel {
    pub queue: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AttemptLabels {
    pub queue: String,
    /// How the attempt ended, as the worker saw it: `succeeded`, `failed`, `timed_out`,
    /// `cancelled` or `interrupted` (see [`crate::worker::Outcome`]).
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct QueueState {
    queue: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Due → start, in seconds: from milliseconds (a worker that was waiting) to an hour.
const LATENESS_BUCKETS: [f64; 16] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

/// An attempt's run, in seconds: from a no-op to a day.
const DURATION_BUCKETS: [f64; 16] = [
    0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0,
    21600.0, 86400.0,
];

/// Tasks taken by one claim (at most `MAX_CLAIM`, 1024).
const CLAIM_BUCKETS: [f64; 11] = [
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
];

fn lateness_histogram() -> Histogram {
    Histogram::new(LATENESS_BUCKETS)
}

fn duration_histogram() -> Histogram {
    Histogram::new(DURATION_BUCKETS)
}

/// The metrics one process keeps: a worker's (a server has none of its own yet; `sked dev`
/// runs both in one process).
pub struct Metrics {
    registry: Registry,
    pub task_lateness: Histograms<QueueLabel>,
    pub attempt_duration: Histograms<AttemptLabels>,
    pub attempts: Family<AttemptLabels, Counter>,
    pub worker_slots: Gauge,
    pub worker_slots_busy: Gauge,
    pub lease_renewal_failures: Counter,
    pub claim_batch_size: Histogram,
}

impl Metrics {
    fn new() -> Metrics {
        let mut registry = Registry::default();
        let m = Metrics {
            task_lateness: Family::new_with_constructor(lateness_histogram),
            attempt_duration: Family::new_with_constructor(duration_histogram),
            attempts: Family::default(),
            worker_slots: Gauge::default(),
            worker_slots_busy: Gauge::default(),
            lease_renewal_failures: Counter::default(),
            claim_batch_size: Histogram::new(CLAIM_BUCKETS),
            registry: Registry::default(),
        };
        registry.register(
            "sked_task_lateness_seconds",
            "Seconds from a task's due time to the claim that started its attempt, per queue",
            m.task_lateness.clone(),
        );
        registry.register(
            "sked_attempt_duration_seconds",
            "Seconds an attempt ran, per queue and outcome",
            m.attempt_duration.clone(),
        );
        registry.register(
            "sked_attempts",
            "Attempts this worker ran to their end, per queue and outcome",
            m.attempts.clone(),
        );
        registry.register(
            "sked_worker_slots",
            "Attempts this worker may hold at once (--concurrency)",
            m.worker_slots.clone(),
        );
        registry.register(
            "sked_worker_slots_busy",
            "Slots held by attempts: running, or waiting for their result to be written",
            m.worker_slots_busy.clone(),
        );
        registry.register(
            "sked_lease_renewal_failures",
            "Lease renewals of this worker that failed (the database unreachable or too slow)",
            m.lease_renewal_failures.clone(),
        );
        registry.register(
            "sked_claim_batch_size",
            "Tasks taken by each claim of this worker that took any",
            m.claim_batch_size.clone(),
        );
        Metrics { registry, ..m }
    }

    /// This process's metrics, in the Prometheus text format.
    pub fn encode_into(&self, out: &mut String) {
        prometheus_text::encode(out, &self.registry).expect("writing to a String cannot fail");
    }

    /// An attempt that ran `secs` and ended with `outcome`.
    pub fn attempt_ended(&self, queue: &str, outcome: &str, secs: f64) {
        let labels = AttemptLabels {
            queue: queue.to_owned(),
            outcome: outcome.to_owned(),
        };
        self.attempts.get_or_create(&labels).inc();
        self.attempt_duration.get_or_create(&labels).observe(secs);
    }
}

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);
    &METRICS
}

/// The process's metrics and, when `scrape` is given, the database's, as one text in the
/// Prometheus text format.
pub fn encode(scrape: Option<&Scrape>) -> String {
    let mut out = String::new();
    metrics().encode_into(&mut out);
    if let Some(scrape) = scrape {
        scrape.encode_into(&mut out);
    }
    out
}

/// The unfinished tasks of one queue and its oldest due task.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QueueGauges {
    pub queue: String,
    pub blocked: i64,
    pub waiting: i64,
    pub due: i64,
    pub running: i64,
    pub retry: i64,
    pub oldest_due_secs: Option<f64>,
}

impl QueueGauges {
    fn unfinished(&self) -> i64 {
        self.blocked + self.waiting + self.running + self.retry
    }

    fn add(&mut self, other: &QueueGauges) {
        self.blocked += other.blocked;
        self.waiting += other.waiting;
        self.due += other.due;
        self.running += other.running;
        self.retry += other.retry;
        self.oldest_due_secs = match (self.oldest_due_secs, other.oldest_due_secs) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }
}

/// What a scrape reads from the database: one snapshot, in one read-only transaction of
/// three statements whose cost follows the unfinished tasks, the workers and the schedules'
/// outcomes, never the finished history (see `sql/overview.sql`).
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// At most the cap's queues, the others added up under [`OTHER_QUEUES`].
    pub queues: Vec<QueueGauges>,
    pub workers_alive: i64,
    pub workers_registered: i64,
    /// Ticks of all schedules since the database was created, per outcome.
    pub schedule_ticks: Vec<(String, i64)>,
}

impl Scrape {
    /// Reads the database's gauges, naming at most `max_queues` queues.
    pub async fn read(pool: &PgPool, max_queues: usize) -> Result<Scrape> {
        let mut tx = crate::pooler::begin_snapshot(pool).await?;
        type Row = (
            String,
            i64,
            i64,
            i64,
            i64,
            i64,
            Option<DateTime<Utc>>,
            DateTime<Utc>,
        );
        let rows: Vec<Row> = sqlx::query_as(
            "select queue, blocked, waiting_due, waiting_delayed, running, retry, oldest_due_at,
                    now()
               from sked.queues_unfinished(null, now())",
        )
        .persistent(false)
        .fetch_all(&mut *tx)
        .await?;
        let (workers_alive, workers_registered): (i64, i64) = sqlx::query_as(
            "select count(*) filter (where heartbeat_at + lease > now()), count(*)
               from sked.workers",
        )
        .fetch_one(&mut *tx)
        .await?;
        let schedule_ticks: Vec<(String, i64)> =
            sqlx::query_as("select outcome, ticks from sked.schedule_ticks order by outcome")
                .fetch_all(&mut *tx)
                .await?;
        tx.commit().await?;
        let queues = rows
            .into_iter()
            .map(
                |(queue, blocked, due, delayed, running, retry, oldest, now)| QueueGauges {
                    queue,
                    blocked,
                    waiting: due + delayed,
                    due,
                    running,
                    retry,
                    oldest_due_secs: oldest.map(|at| {
                        ((now - at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6).max(0.0)
                    }),
                },
            )
            .collect();
        Ok(Scrape {
            queues: capped(queues, max_queues),
            workers_alive,
            workers_registered,
            schedule_ticks,
        })
    }

    fn encode_into(&self, out: &mut String) {
        let mut registry = Registry::default();
        let tasks = Family::<QueueState, Gauge>::default();
        let due = Family::<QueueLabel, Gauge>::default();
        let oldest = Family::<QueueLabel, Gauge<f64, AtomicU64>>::default();
        for q in &self.queues {
            for (state, n) in [
                ("blocked", q.blocked),
                ("waiting", q.waiting),
                ("running", q.running),
                ("retry", q.retry),
            ] {
                tasks
                    .get_or_create(&QueueState {
                        queue: q.queue.clone(),
                        state,
                    })
                    .set(n);
            }
            let label = QueueLabel {
                queue: q.queue.clone(),
            };
            due.get_or_create(&label).set(q.due);
            oldest
                .get_or_create(&label)
                .set(q.oldest_due_secs.unwrap_or(0.0));
        }
        registry.register(
            "sked_tasks",
            "Unfinished tasks per queue and state (blocked, waiting, running, retry)",
            tasks,
        );
        registry.register(
            "sked_tasks_due",
            "Waiting tasks whose due time has come, per queue: the backlog",
            due,
        );
        registry.register(
            "sked_queue_oldest_due_seconds",
            "Seconds since the due time of the queue's oldest due task (0 when none is due)",
            oldest,
        );
        let alive: Gauge = Gauge::default();
        alive.set(self.workers_alive);
        registry.register(
            "sked_workers_alive",
            "Workers whose heartbeat is within their lease",
            alive,
        );
        let registered: Gauge = Gauge::default();
        registered.set(self.workers_registered);
        registry.register(
            "sked_workers_registered",
            "Workers in the registry, alive or not yet pruned",
            registered,
        );
        let ticks = Family::<OutcomeLabel, Counter>::default();
        for (outcome, n) in &self.schedule_ticks {
            ticks
                .get_or_create(&OutcomeLabel {
                    outcome: outcome.clone(),
                })
                .inc_by(u64::try_from(*n).unwrap_or(0));
        }
        registry.register(
            "sked_schedule_ticks",
            "Ticks of all schedules, per outcome (fired, skipped, missed)",
            ticks,
        );
        prometheus_text::encode(out, &registry).expect("writing to a String cannot fail");
    }
}

/// The `max` queues with the most unfinished tasks (ties by name), the rest added up under
/// [`OTHER_QUEUES`]; in name order, the added-up ones last.
fn capped(mut queues: Vec<QueueGauges>, max: usize) -> Vec<QueueGauges> {
    if queues.len() <= max {
        return queues;
    }
    queues.sort_by(|a, b| {
        b.unfinished()
            .cmp(&a.unfinished())
            .then_with(|| a.queue.cmp(&b.queue))
    });
    let rest = queues.split_off(max);
    queues.sort_by(|a, b| a.queue.cmp(&b.queue));
    let mut other = QueueGauges {
        queue: OTHER_QUEUES.to_owned(),
        ..QueueGauges::default()
    };
    for q in &rest {
        other.add(q);
    }
    queues.push(other);
    queues
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(name: &str, waiting: i64) -> QueueGauges {
        QueueGauges {
            queue: name.to_owned(),
            waiting,
            due: waiting,
            oldest_due_secs: Some(waiting as f64),
            ..QueueGauges::default()
        }
    }

    #[test]
    fn a_scrape_names_the_largest_queues_and_adds_up_the_others() {
        let kept = capped(vec![q("a", 1), q("b", 5), q("c", 3), q("d", 2)], 2);
        let names: Vec<&str> = kept.iter().map(|q| q.queue.as_str()).collect();
        assert_eq!(names, ["b", "c", OTHER_QUEUES]);
        assert_eq!(kept[2].waiting, 3, "a and d add up");
        assert_eq!(
            kept[2].oldest_due_secs,
            Some(2.0),
            "the oldest of the others"
        );
        assert_eq!(
            capped(vec![q("a", 1)], 2).len(),
            1,
            "under the cap: all named"
        );
    }

    #[test]
    fn the_text_has_every_family() {
        let scrape = Scrape {
            queues: vec![q("mail", 4)],
            workers_alive: 1,
            workers_registered: 2,
            schedule_ticks: vec![("fired".into(), 7)],
        };
        metrics().attempt_ended("mail", "succeeded", 0.2);
        let text = encode(Some(&scrape));
        for line in [
            "sked_tasks{queue=\"mail\",state=\"waiting\"} 4",
            "sked_tasks_due{queue=\"mail\"} 4",
            "sked_queue_oldest_due_seconds{queue=\"mail\"} 4",
            "sked_workers_alive 1",
            "sked_schedule_ticks_total{outcome=\"fired\"} 7",
            "sked_attempts_total{queue=\"mail\",outcome=\"succeeded\"} 1",
            "sked_attempt_duration_seconds_bucket{queue=\"mail\",outcome=\"succeeded\",le=\"0.5\"} 1",
            "# TYPE sked_claim_batch_size histogram",
            "# TYPE sked_worker_slots_busy gauge",
            "# TYPE sked_lease_renewal_failures_total counter",
        ] {
            assert!(text.contains(line), "{line:?} in:\n{text}");
        }
    }
}
