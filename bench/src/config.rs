//! The command line of `sked-bench`, parsed once into a validated [`Config`].

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// A workload of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, ValueEnum)]
pub enum Workload {
    /// Enqueue throughput: SQL bulk, REST bulk, single-row INSERTs, REST single, COPY.
    W1,
    /// Drain throughput of one worker process over queued noop tasks (and its peak RSS).
    W2,
    /// Claim latency of an idle worker under a steady trickle (and its idle RSS).
    W3,
    /// Drain throughput of one worker process running real processes (`true`).
    W4,
    /// On-time starts of delayed tasks: lateness of an idle worker over a minute of due times.
    W5,
    /// A DAG end to end: a root, 10,000 noop children and a sink, submit to sink finished.
    W6,
    /// Cron without drift: 1,000 schedules firing every second; lateness of each occurrence.
    W7,
    /// The dashboard's reads over HTTP on a million tasks: listings, overview, queues.
    W8,
    /// The dashboard's commit→DOM latency: state changes committed by SQL until a headless
    /// Chromium's task list shows them (needs chromium, chromedriver and a built dashboard;
    /// run only when named).
    W9,
    /// Placement and queue controls: claim throughput with CPU and memory requests against
    /// without, in SQL and by a worker process.
    W10,
    /// Drain throughput as data ages: W2 on an empty table, then beside `--w11-history`
    /// finished tasks (10 million by default; run only when named).
    W11,
    /// A held snapshot: drains while one session holds a snapshot open (10 minutes by
    /// default), then after its release (run only when named).
    W12,
    /// Retention beside the hot path: a drain while the prune deletes `--w13-history`
    /// finished tasks past their retention (10 million by default; run only when named).
    W13,
    /// Await latency: from a task's finish to the moment an application awaiting it (by SQL
    /// and by a REST long poll) knows its state, `--w14-rounds` times each.
    W14,
    /// Live events at scale: a `sked-server` process's memory per idle websocket, and the
    /// latency of live events while REST requests saturate its pool (run only when named).
    W15,
    /// REST throughput under a dashboard's mix: `--w16-clients` HTTP clients back to back
    /// against the in-process API on W8's data set packed into `--w16-hours` hours, so that
    /// at least 100,000 tasks finished in the last hour (run only when named).
    W16,
    /// Many worker processes: W2's drain with its slots shared by 1, 2, 4, 8 and 16 worker
    /// processes (`--w17-processes`), the rate of each and the tasks each process ran, then
    /// the transactions idle workers cost the database (run only when named).
    W17,
    /// Through a pooler: PgBouncer in transaction mode in front of the server; W2's drain
    /// direct and through it, alternated, then `--w18-workers` polling worker processes
    /// through `--w18-pool-size` server connections (needs pgbouncer; run only when named).
    W18,
    /// sked beside graphile-worker on the same PostgreSQL: W2's drain and graphile-worker's
    /// drain of as many no-op jobs, alternated (installs graphile-worker and Node 22 with
    /// npm; run only when named).
    Peer,
}

impl Workload {
    pub fn name(self) -> &'static str {
        match self {
            Workload::W1 => "W1",
            Workload::W2 => "W2",
            Workload::W3 => "W3",
            Workload::W4 => "W4",
            Workload::W5 => "W5",
            Workload::W6 => "W6",
            Workload::W7 => "W7",
            Workload::W8 => "W8",
            Workload::W9 => "W9",
            Workload::W10 => "W10",
            Workload::W11 => "W11",
            Workload::W12 => "W12",
            Workload::W13 => "W13",
            Workload::W14 => "W14",
            Workload::W15 => "W15",
            Workload::W16 => "W16",
            Workload::W17 => "W17",
            Workload::W18 => "W18",
            Workload::Peer => "peer",
        }
    }
}

/// sked benchmarks: run on demand against a local PostgreSQL. Each workload runs in a fresh
/// database (`sked_bench_<workload>`) that is dropped afterwards. Quote medians of
/// `--repeat 3` or more.
#[derive(Debug, Parser)]
#[command(name = "sked-bench", version)]
pub struct Cli {
    /// Workloads to run (w1 … w18, peer); all but w9, w11, w12, w13, w15, w16, w17, w18 and
    /// peer when none is named (w9 needs a browser, w11 and w13 make 10 million rows, w12
    /// takes over 11 minutes, w15 opens a thousand websockets, w16 loads a million tasks
    /// before it measures, w17 drains five times and idles a minute, w18 needs pgbouncer and
    /// starts 200 worker processes, peer installs graphile-worker with npm).
    #[arg(value_enum)]
    pub workloads: Vec<Workload>,
    /// PostgreSQL server to create the benchmark databases on (any database of it).
    #[arg(
        long,
        env = "DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres",
        hide_env_values = true
    )]
    pub database_url: String,
    /// Tasks enqueued by each bulk method of W1 and drained by W2.
    #[arg(long, default_value_t = 100_000)]
    pub tasks: usize,
    /// Runs of each workload; the table reports the median of each metric. Default: 1, and 3
    /// rounds for peer.
    #[arg(long)]
    pub repeat: Option<usize>,
    /// Tasks per call of the bulk methods (sked.tasks_submit and POST /api/v1/tasks/batch).
    #[arg(long, default_value_t = 5_000)]
    pub batch: usize,
    /// Tasks enqueued one by one in W1 (at most --tasks).
    #[arg(long, default_value_t = 10_000)]
    pub single_tasks: usize,
    /// Concurrent connections of the one-by-one methods of W1.
    #[arg(long, default_value_t = 4)]
    pub single_conns: usize,
    /// Worker concurrency in W2 (all the processes' slots together).
    #[arg(long, default_value_t = 2_000)]
    pub w2_concurrency: usize,
    /// Worker processes W2 drains with, sharing `--w2-concurrency` slots.
    #[arg(long, default_value_t = 1)]
    pub w2_processes: usize,
    /// Worker concurrency in W3.
    #[arg(long, default_value_t = 16)]
    pub w3_concurrency: usize,
    /// Milliseconds between two enqueues in W3.
    #[arg(long, default_value_t = 10)]
    pub w3_interval_ms: u64,
    /// Seconds of enqueueing in W3.
    #[arg(long, default_value_t = 20.0)]
    pub w3_secs: f64,
    /// Tasks (processes) drained in W4.
    #[arg(long, default_value_t = 5_000)]
    pub w4_tasks: usize,
    /// Worker concurrency in W4.
    #[arg(long, default_value_t = 32)]
    pub w4_concurrency: usize,
    /// Delayed tasks in each phase of W5.
    #[arg(long, default_value_t = 5_000)]
    pub w5_tasks: usize,
    /// Seconds over which the due times of W5's tasks are spread.
    #[arg(long, default_value_t = 60.0)]
    pub w5_spread_secs: f64,
    /// Batches inserted during the spread in W5's second phase.
    #[arg(long, default_value_t = 10)]
    pub w5_batches: usize,
    /// Worker concurrency in W5.
    #[arg(long, default_value_t = 16)]
    pub w5_concurrency: usize,
    /// Children of the root (and parents of the sink) in W6's workflow.
    #[arg(long, default_value_t = 10_000)]
    pub w6_children: usize,
    /// Worker concurrency in W6.
    #[arg(long, default_value_t = 2_000)]
    pub w6_concurrency: usize,
    /// W6 as a map: the root outputs an array of `--w6-children` elements and one task maps
    /// over it (noop instances) before the sink.
    #[arg(long)]
    pub w6_map: bool,
    /// Schedules firing every second in W7.
    #[arg(long, default_value_t = 1_000)]
    pub w7_schedules: usize,
    /// Seconds W7's schedules fire for.
    #[arg(long, default_value_t = 30.0)]
    pub w7_secs: f64,
    /// Worker concurrency in W7 (a slot per schedule: all of them are due at once).
    #[arg(long, default_value_t = 1_000)]
    pub w7_concurrency: usize,
    /// Tasks in W8's data set (and in W16's).
    #[arg(long, default_value_t = 1_000_000)]
    pub w8_tasks: usize,
    /// Requests of each endpoint in W8.
    #[arg(long, default_value_t = 50)]
    pub w8_requests: usize,
    /// State changes W9 commits and times (half inserts, half cancels).
    #[arg(long, default_value_t = 200)]
    pub w9_changes: usize,
    /// Tasks claimed by each variant of W10's SQL part.
    #[arg(long, default_value_t = 20_000)]
    pub w10_tasks: usize,
    /// Rounds of W10's SQL part (each runs every variant once, alternating the order).
    #[arg(long, default_value_t = 5)]
    pub w10_rounds: usize,
    /// Tasks drained by the worker in each variant of W10's worker part.
    #[arg(long, default_value_t = 50_000)]
    pub w10_drain_tasks: usize,
    /// Finished tasks in the table during W11's second drain.
    #[arg(long, default_value_t = 10_000_000)]
    pub w11_history: usize,
    /// Seconds W12 holds its snapshot open while it drains.
    #[arg(long, default_value_t = 600)]
    pub w12_hold_secs: u64,
    /// Seconds W12 waits after the release before its last drain.
    #[arg(long, default_value_t = 60)]
    pub w12_recover_secs: u64,
    /// W12 starts a drain while the snapshot is held every this many seconds, so that tasks
    /// flow at a steady rate (`--tasks` per period); 0 drains back to back, at full rate.
    #[arg(long, default_value_t = 0)]
    pub w12_every_secs: u64,
    /// Finished tasks past their retention that W13's prune deletes beside its drain.
    #[arg(long, default_value_t = 10_000_000)]
    pub w13_history: usize,
    /// Tasks W14 awaits by SQL, and as many by REST.
    #[arg(long, default_value_t = 1_000)]
    pub w14_rounds: usize,
    /// W15's idle websocket clients (and as many reading ones under load).
    #[arg(long, default_value_t = 500)]
    pub w15_clients: usize,
    /// How long W15 inserts tasks under load, in seconds.
    #[arg(long, default_value_t = 20)]
    pub w15_secs: u64,
    /// Single-row INSERTs a second in W15.
    #[arg(long, default_value_t = 300)]
    pub w15_inserts_per_sec: u32,
    /// HTTP clients W15 runs back to back to saturate the server's pool.
    #[arg(long, default_value_t = 64)]
    pub w15_rest_clients: usize,
    /// Hours over which W16's data set (W8's, `--w8-tasks` tasks) was created: W8's span
    /// is 24; fewer put more of its finishes in the last hour.
    #[arg(long, default_value_t = 7.0)]
    pub w16_hours: f64,
    /// HTTP clients W16 runs back to back.
    #[arg(long, default_value_t = 64)]
    pub w16_clients: usize,
    /// Seconds W16 measures for (after a 3 s warm-up).
    #[arg(long, default_value_t = 20)]
    pub w16_secs: u64,
    /// The counts of worker processes W17 drains with, one drain each, sharing
    /// `--w2-concurrency` slots.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 2, 4, 8, 16])]
    pub w17_processes: Vec<usize>,
    /// The counts of idle worker processes whose cost W17 measures, one measurement each.
    #[arg(long, value_delimiter = ',', default_values_t = [16])]
    pub w17_idle_workers: Vec<usize>,
    /// Seconds over which W17 counts the idle workers' transactions.
    #[arg(long, default_value_t = 60)]
    pub w17_idle_secs: u64,
    /// W17's workers reach the database through a PgBouncer in transaction mode
    /// (`--w18-pool-size` server connections; LISTEN on the direct URL), as many processes
    /// must when their connections do not fit the server's max_connections (needs pgbouncer).
    #[arg(long)]
    pub w17_pooler: bool,
    /// Server connections of W18's PgBouncer (its default_pool_size).
    #[arg(long, default_value_t = 40)]
    pub w18_pool_size: usize,
    /// Worker processes W18 runs through the pooler at once (polling, without a listen URL).
    #[arg(long, default_value_t = 200)]
    pub w18_workers: usize,
    /// Slots of each of W18's many workers.
    #[arg(long, default_value_t = 8)]
    pub w18_slots: usize,
    /// Noop tasks W18's many workers drain.
    #[arg(long, default_value_t = 40_000)]
    pub w18_tasks: usize,
    /// graphile-worker's concurrency (jobs at once in its one process) in peer.
    #[arg(long, default_value_t = 100)]
    pub graphile_concurrency: usize,
    /// graphile-worker's local queue size (jobs fetched and locked at a time) in peer.
    #[arg(long, default_value_t = 1_000)]
    pub graphile_local_queue: usize,
    /// graphile-worker's connection pool size in peer (its default, 10).
    #[arg(long, default_value_t = 10)]
    pub graphile_max_pool: usize,
    /// Where peer installs the other queues (default: target/bench-peers of the workspace).
    #[arg(long)]
    pub peers_dir: Option<PathBuf>,
    /// The npm that installs graphile-worker and Node 22 for peer.
    #[arg(long, default_value = "npm")]
    pub npm: PathBuf,
    /// The sked-worker binary (default: next to this executable).
    #[arg(long)]
    pub worker_bin: Option<PathBuf>,
    /// Directory the JSON results are written to.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/results"))]
    pub results_dir: PathBuf,
    /// Give up on a drain that has not finished after this many seconds.
    #[arg(long, default_value_t = 600)]
    pub timeout_secs: u64,
}

/// A validated configuration.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Config {
    #[serde(skip)]
    pub workloads: Vec<Workload>,
    #[serde(skip)]
    pub database_url: String,
    pub tasks: usize,
    pub repeat: usize,
    pub batch: usize,
    pub single_tasks: usize,
    pub single_conns: usize,
    pub w2_concurrency: usize,
    pub w2_processes: usize,
    pub w3_concurrency: usize,
    pub w3_interval: Duration,
    pub w3_duration: Duration,
    pub w4_tasks: usize,
    pub w4_concurrency: usize,
    pub w5_tasks: usize,
    pub w5_spread: Duration,
    pub w5_batches: usize,
    pub w5_concurrency: usize,
    pub w6_children: usize,
    pub w6_concurrency: usize,
    pub w6_map: bool,
    pub w7_schedules: usize,
    pub w7_duration: Duration,
    pub w7_concurrency: usize,
    pub w8_tasks: usize,
    pub w8_requests: usize,
    pub w9_changes: usize,
    pub w10_tasks: usize,
    pub w10_rounds: usize,
    pub w10_drain_tasks: usize,
    pub w11_history: usize,
    pub w12_hold: Duration,
    pub w12_recover: Duration,
    pub w12_every: Duration,
    pub w13_history: usize,
    pub w14_rounds: usize,
    pub w15_clients: usize,
    pub w15_duration: Duration,
    pub w15_inserts_per_sec: u32,
    pub w15_rest_clients: usize,
    pub w16_hours: f64,
    pub w16_clients: usize,
    pub w16_duration: Duration,
    pub w17_processes: Vec<usize>,
    pub w17_idle_workers: Vec<usize>,
    pub w17_idle: Duration,
    pub w17_pooler: bool,
    pub w18_pool_size: usize,
    pub w18_workers: usize,
    pub w18_slots: usize,
    pub w18_tasks: usize,
    /// Rounds of peer (each a sked drain and a graphile-worker drain).
    pub peer_rounds: usize,
    pub graphile_concurrency: usize,
    pub graphile_local_queue: usize,
    pub graphile_max_pool: usize,
    pub peers_dir: PathBuf,
    pub npm: PathBuf,
    pub worker_bin: PathBuf,
    pub results_dir: PathBuf,
    pub timeout: Duration,
}

impl Cli {
    pub fn into_config(self) -> Result<Config, String> {
        let mut workloads = self.workloads;
        if workloads.is_empty() {
            workloads = vec![
                Workload::W1,
                Workload::W2,
                Workload::W3,
                Workload::W4,
                Workload::W5,
                Workload::W6,
                Workload::W7,
                Workload::W8,
                Workload::W10,
                Workload::W14,
            ];
        }
        workloads.sort();
        workloads.dedup();
        if self.tasks == 0 || self.repeat == Some(0) || self.w4_tasks == 0 || self.single_conns == 0
        {
            return Err(
                "--tasks, --repeat, --w4-tasks and --single-conns must be at least 1".into(),
            );
        }
        if self.batch == 0 || self.batch > sked_server::MAX_BATCH {
            return Err(format!(
                "--batch must be between 1 and {}, got {}",
                sked_server::MAX_BATCH,
                self.batch
            ));
        }
        for (flag, value) in [
            ("w2-concurrency", self.w2_concurrency),
            ("w3-concurrency", self.w3_concurrency),
            ("w4-concurrency", self.w4_concurrency),
            ("w5-concurrency", self.w5_concurrency),
            ("w6-concurrency", self.w6_concurrency),
            ("w7-concurrency", self.w7_concurrency),
            ("graphile-concurrency", self.graphile_concurrency),
        ] {
            if value == 0 || value > 10_000 {
                return Err(format!("--{flag} must be between 1 and 10000, got {value}"));
            }
        }
        if self.w3_interval_ms == 0 || !(self.w3_secs.is_finite() && self.w3_secs > 0.0) {
            return Err("--w3-interval-ms and --w3-secs must be positive".into());
        }
        if self.w5_tasks == 0 || self.w5_batches == 0 || self.w5_batches > self.w5_tasks {
            return Err(format!(
                "--w5-tasks and --w5-batches must be at least 1, with no more batches than \
                 tasks; got {} tasks in {} batches",
                self.w5_tasks, self.w5_batches
            ));
        }
        if !(self.w5_spread_secs.is_finite() && (1.0..=3600.0).contains(&self.w5_spread_secs)) {
            return Err(format!(
                "--w5-spread-secs must be between 1 and 3600, got {}",
                self.w5_spread_secs
            ));
        }
        if !(1..=100_000).contains(&self.w6_children) {
            return Err(format!(
                "--w6-children must be between 1 and 100000, got {}",
                self.w6_children
            ));
        }
        if !(1..=100_000).contains(&self.w7_schedules) || !(3.0..=3600.0).contains(&self.w7_secs) {
            return Err(format!(
                "--w7-schedules must be between 1 and 100000 and --w7-secs between 3 and 3600, \
                 got {} and {}",
                self.w7_schedules, self.w7_secs
            ));
        }
        if !(10_000..=100_000_000).contains(&self.w8_tasks) || self.w8_requests == 0 {
            return Err(format!(
                "--w8-tasks must be between 10000 and 100000000 and --w8-requests at least 1, \
                 got {} and {}",
                self.w8_tasks, self.w8_requests
            ));
        }
        if !(2..=100_000).contains(&self.w9_changes) {
            return Err(format!(
                "--w9-changes must be between 2 and 100000, got {}",
                self.w9_changes
            ));
        }
        if !(1_000..=10_000_000).contains(&self.w10_tasks)
            || !(1..=100).contains(&self.w10_rounds)
            || !(1_000..=10_000_000).contains(&self.w10_drain_tasks)
        {
            return Err(format!(
                "--w10-tasks and --w10-drain-tasks must be between 1000 and 10000000 and \
                 --w10-rounds between 1 and 100, got {}, {} and {}",
                self.w10_tasks, self.w10_drain_tasks, self.w10_rounds
            ));
        }
        if !(1..=100_000_000).contains(&self.w11_history) {
            return Err(format!(
                "--w11-history must be between 1 and 100000000, got {}",
                self.w11_history
            ));
        }
        if !(1..=1_000_000).contains(&self.w14_rounds) {
            return Err(format!(
                "--w14-rounds must be between 1 and 1000000, got {}",
                self.w14_rounds
            ));
        }
        if !(1..=10_000).contains(&self.w15_clients)
            || !(1..=3600).contains(&self.w15_secs)
            || !(1..=10_000).contains(&self.w15_inserts_per_sec)
            || !(1..=1_000).contains(&self.w15_rest_clients)
        {
            return Err(format!(
                "--w15-clients must be between 1 and 10000, --w15-secs between 1 and 3600, \
                 --w15-inserts-per-sec between 1 and 10000 and --w15-rest-clients between 1 \
                 and 1000, got {}, {}, {} and {}",
                self.w15_clients, self.w15_secs, self.w15_inserts_per_sec, self.w15_rest_clients
            ));
        }
        let w16_valid = self.w16_hours.is_finite()
            && (1.0..=24.0).contains(&self.w16_hours)
            && (1..=1_000).contains(&self.w16_clients)
            && (1..=3600).contains(&self.w16_secs);
        if !w16_valid {
            return Err(format!(
                "--w16-hours must be between 1 and 24, --w16-clients between 1 and 1000 and \
                 --w16-secs between 1 and 3600, got {}, {} and {}",
                self.w16_hours, self.w16_clients, self.w16_secs
            ));
        }
        if !(1..=100_000_000).contains(&self.w13_history) {
            return Err(format!(
                "--w13-history must be between 1 and 100000000, got {}",
                self.w13_history
            ));
        }
        if !(1..=86_400).contains(&self.w12_hold_secs)
            || self.w12_recover_secs > 86_400
            || self.w12_every_secs > 86_400
        {
            return Err(format!(
                "--w12-hold-secs must be between 1 and 86400, --w12-recover-secs and \
                 --w12-every-secs at most 86400, got {}, {} and {}",
                self.w12_hold_secs, self.w12_recover_secs, self.w12_every_secs
            ));
        }
        let mut w17_counts = self.w17_processes.iter().chain(&self.w17_idle_workers);
        if !(1..=64).contains(&self.w2_processes)
            || self.w2_processes > self.w2_concurrency
            || self.w17_processes.is_empty()
            || w17_counts.any(|&n| !(1..=64).contains(&n) || n > self.w2_concurrency)
            || !(1..=3600).contains(&self.w17_idle_secs)
        {
            return Err(format!(
                "--w2-processes and each of --w17-processes (at least one) and \
                 --w17-idle-workers must be between 1 and 64 and at most --w2-concurrency, \
                 and --w17-idle-secs between 1 and 3600; got {}, {:?}, {:?} and {}",
                self.w2_processes, self.w17_processes, self.w17_idle_workers, self.w17_idle_secs
            ));
        }
        if !(1..=1_000).contains(&self.w18_pool_size)
            || !(1..=2_000).contains(&self.w18_workers)
            || !(1..=1_000).contains(&self.w18_slots)
            || !(1..=10_000_000).contains(&self.w18_tasks)
        {
            return Err(format!(
                "--w18-pool-size must be between 1 and 1000, --w18-workers between 1 and 2000, \
                 --w18-slots between 1 and 1000 and --w18-tasks between 1 and 10000000, got \
                 {}, {}, {} and {}",
                self.w18_pool_size, self.w18_workers, self.w18_slots, self.w18_tasks
            ));
        }
        if !(1..=100_000).contains(&self.graphile_local_queue)
            || !(2..=1_000).contains(&self.graphile_max_pool)
        {
            return Err(format!(
                "--graphile-local-queue must be between 1 and 100000 and --graphile-max-pool \
                 between 2 and 1000, got {} and {}",
                self.graphile_local_queue, self.graphile_max_pool
            ));
        }
        let worker_bin = match self.worker_bin {
            Some(path) => path,
            None => default_worker_bin()?,
        };
        Ok(Config {
            workloads,
            database_url: self.database_url,
            tasks: self.tasks,
            repeat: self.repeat.unwrap_or(1),
            batch: self.batch,
            single_tasks: self.single_tasks.clamp(1, self.tasks),
            single_conns: self.single_conns,
            w2_concurrency: self.w2_concurrency,
            w2_processes: self.w2_processes,
            w3_concurrency: self.w3_concurrency,
            w3_interval: Duration::from_millis(self.w3_interval_ms),
            w3_duration: Duration::from_secs_f64(self.w3_secs),
            w4_tasks: self.w4_tasks,
            w4_concurrency: self.w4_concurrency,
            w5_tasks: self.w5_tasks,
            w5_spread: Duration::from_secs_f64(self.w5_spread_secs),
            w5_batches: self.w5_batches,
            w5_concurrency: self.w5_concurrency,
            w6_children: self.w6_children,
            w6_concurrency: self.w6_concurrency,
            w6_map: self.w6_map,
            w7_schedules: self.w7_schedules,
            w7_duration: Duration::from_secs_f64(self.w7_secs),
            w7_concurrency: self.w7_concurrency,
            w8_tasks: self.w8_tasks,
            w8_requests: self.w8_requests,
            w9_changes: self.w9_changes,
            w10_tasks: self.w10_tasks,
            w10_rounds: self.w10_rounds,
            w10_drain_tasks: self.w10_drain_tasks,
            w11_history: self.w11_history,
            w12_hold: Duration::from_secs(self.w12_hold_secs),
            w12_recover: Duration::from_secs(self.w12_recover_secs),
            w12_every: Duration::from_secs(self.w12_every_secs),
            w13_history: self.w13_history,
            w14_rounds: self.w14_rounds,
            w15_clients: self.w15_clients,
            w15_duration: Duration::from_secs(self.w15_secs),
            w15_inserts_per_sec: self.w15_inserts_per_sec,
            w15_rest_clients: self.w15_rest_clients,
            w16_hours: self.w16_hours,
            w16_clients: self.w16_clients,
            w16_duration: Duration::from_secs(self.w16_secs),
            w17_processes: self.w17_processes,
            w17_idle_workers: self.w17_idle_workers,
            w17_idle: Duration::from_secs(self.w17_idle_secs),
            w17_pooler: self.w17_pooler,
            w18_pool_size: self.w18_pool_size,
            w18_workers: self.w18_workers,
            w18_slots: self.w18_slots,
            w18_tasks: self.w18_tasks,
            peer_rounds: self.repeat.unwrap_or(3),
            graphile_concurrency: self.graphile_concurrency,
            graphile_local_queue: self.graphile_local_queue,
            graphile_max_pool: self.graphile_max_pool,
            peers_dir: self.peers_dir.unwrap_or_else(default_peers_dir),
            npm: self.npm,
            worker_bin,
            results_dir: self.results_dir,
            timeout: Duration::from_secs(self.timeout_secs),
        })
    }
}

impl Config {
    /// Runs of `workload`: `--repeat`, whose default is 1, or 3 for peer.
    pub fn runs(&self, workload: Workload) -> usize {
        match workload {
            Workload::Peer => self.peer_rounds,
            _ => self.repeat,
        }
    }

    /// The most runs of any chosen workload.
    pub fn most_runs(&self) -> usize {
        self.workloads
            .iter()
            .map(|w| self.runs(*w))
            .max()
            .unwrap_or(1)
    }

    /// True when a chosen workload starts a worker process.
    pub fn needs_worker(&self) -> bool {
        self.workloads.iter().any(|w| {
            !matches!(
                w,
                Workload::W1 | Workload::W8 | Workload::W9 | Workload::W14 | Workload::W16
            )
        })
    }
}

/// `target/bench-peers` of the workspace this crate is in (git-ignored with `target`).
fn default_peers_dir() -> PathBuf {
    let bench = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    bench
        .parent()
        .unwrap_or(&bench)
        .join("target")
        .join("bench-peers")
}

/// `sked-worker` in the directory of this executable (both are built into `target/release`).
fn default_worker_bin() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating this executable: {e}"))?;
    let dir = exe
        .parent()
        .ok_or_else(|| format!("{} has no parent directory", exe.display()))?;
    Ok(dir.join("sked-worker"))
}
