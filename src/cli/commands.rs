//! The one-shot subcommands of the `sked` binary: database administration (`migrate`,
//! `token create`) and the REST API commands (`submit`, `list`, `show`, `logs`, `cancel`,
//! `retry`, `resubmit`). Flags are validated here, before any connection or request.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use sked::app::DatabaseArgs;
use sked::client::ListQuery;
use sked_db::token::Role;
use sked_types::{SubmitTask, Submitted, TaskKind};
use uuid::Uuid;

use super::args::{
    ApiArgs, ShowArgs, TaskFilterArgs, TaskFlags, one_of, parse_json, print_answer, read_text,
};
use super::format::{describe, print_change, time, truncate, what};

#[derive(Debug, clap::Subcommand)]
pub enum TokenCommand {
    /// Create an API token and print its secret (shown only this once).
    Create(TokenCreateArgs),
    /// List API tokens (ids, owners, roles; never secrets).
    List(TokenListArgs),
    /// Revoke an API token by id; it is refused from the next request on.
    Revoke(TokenRevokeArgs),
}

#[derive(Debug, clap::Args)]
pub struct TokenListArgs {
    #[command(flatten)]
    db: DatabaseArgs,
}

#[derive(Debug, clap::Args)]
pub struct TokenRevokeArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Id of the token, as `sked token list` shows it.
    id: uuid::Uuid,
}

#[derive(Debug, clap::Args)]
pub struct TokenCreateArgs {
    #[command(flatten)]
    db: DatabaseArgs,
    /// Owner of the token: the tasks it submits belong to this owner.
    #[arg(long)]
    owner: String,
    /// `admin` sees and acts on all tasks, `user` on its owner's tasks only.
    #[arg(long, value_parser = ["admin", "user"])]
    role: String,
    /// A name to recognise the token by.
    #[arg(long, default_value = "")]
    name: String,
    /// The token stops working this long after it is created (`12h`, `30d`, `1w`); by
    /// default it works until it is revoked.
    #[arg(long)]
    expires_in: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    api: ApiArgs,
    #[command(flatten)]
    task: TaskFlags,
    /// JSON input, given to the process on stdin.
    #[arg(long, value_name = "JSON", value_parser = parse_json, conflicts_with = "input_file")]
    input: Option<serde_json::Value>,
    /// File holding the JSON input (`-` for stdin).
    #[arg(long, value_name = "FILE")]
    input_file: Option<PathBuf>,
    /// Start no earlier than this long from now: seconds, or a duration like 15m, 1h30m, 2d
    /// (a delayed task; see docs/delayed.md).
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true, conflicts_with = "at",
          value_parser = |s: &str| super::when::parse_duration(s, "--delay", 0.0))]
    delay: Option<f64>,
    /// Start no earlier than this time, RFC 3339 (2030-01-02T03:04:05Z or with an offset).
    #[arg(long, value_name = "TIME",
          value_parser = |s: &str| super::when::parse_time(s, "--at"))]
    at: Option<chrono::DateTime<chrono::Utc>>,
    /// Timeout of one attempt: seconds, or a duration like 30s, 5m, 2h.
    #[arg(long, value_name = "DURATION", allow_negative_numbers = true,
          value_parser = |s: &str| super::when::parse_duration(s, "--timeout", f64::MIN_POSITIVE))]
    timeout: Option<f64>,
    /// At most one unfinished task of yours has this key; submitting it again returns it.
    #[arg(long)]
    idempotency_key: Option<String>,
    /// `command` (default) runs COMMAND; the built-ins `noop` and `sleep` take ARGS only;
    /// `service` keeps COMMAND running (as --service).
    #[arg(long, value_parser = one_of(&TaskKind::SUBMITTED, TaskKind::as_str))]
    kind: Option<TaskKind>,
    /// A long-running service: COMMAND is kept running, restarted when it exits, on
    /// --replicas workers; stop it with `sked cancel ID` (see docs/services.md).
    #[arg(long, conflicts_with_all = ["kind", "shards", "broadcast", "timeout"])]
    service: bool,
    /// Copies of the service to keep running (1 to 1000, default 1).
    #[arg(long, value_name = "N", requires = "service", allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(1..=1000))]
    replicas: Option<i32>,
    /// When a copy's process exits: restart it `always` (default) or only `on_failure`.
    #[arg(long, value_name = "POLICY", requires = "service",
          value_parser = ["always", "on_failure"])]
    restart: Option<String>,
    #[command(flatten)]
    health: super::services::HealthArgs,
    /// Submit on behalf of this owner (admin tokens only).
    #[arg(long)]
    owner: Option<String>,
    /// Run as N shard tasks (1 to 10000) that see SKED_SHARD_INDEX and SKED_SHARD_TOTAL; the
    /// task succeeds when all have (see docs/shards.md).
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(1..=10_000))]
    shards: Option<i32>,
    /// Run once on every live worker that serves the queue and has the labels.
    #[arg(long, conflicts_with = "shards")]
    broadcast: bool,
    #[command(flatten)]
    resources: super::units::ResourceFlags,
    /// The task may be stopped while it runs to make room for a copy of a service; it then
    /// waits again without losing an attempt. For short batch tasks that can start over; a
    /// service cannot be preemptible (see docs/runtime.md, "Services first").
    #[arg(long, conflicts_with = "service")]
    preemptible: bool,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
    /// The command and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
    /// Submit the workflow in this file (YAML, or JSON when the name ends in `.json`; `-`
    /// for stdin) instead of one task: see docs/workflows.md.
    #[arg(short = 'f', long = "file", value_name = "FILE", conflicts_with_all = [
        "command", "queue", "priority", "env", "input", "input_file", "delay", "at", "max_attempts",
        "timeout", "idempotency_key", "labels", "kind", "shards", "broadcast", "cpu", "memory",
        "max_output", "run_as", "preemptible", "service", "replicas", "restart", "health_cmd",
        "health_url",
    ])]
    file: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    api: ApiArgs,
    #[command(flatten)]
    filters: TaskFilterArgs,
    /// Tasks per page.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=sked_server::MAX_PAGE))]
    limit: u32,
    /// Only tasks older than this one (the cursor printed below a full page).
    #[arg(long)]
    after: Option<Uuid>,
    /// Print how many tasks the filters select instead (exact up to 10,000; "more than" or
    /// "at least" otherwise).
    #[arg(long, conflicts_with_all = ["after", "json"])]
    count: bool,
    /// Print the raw JSON answer.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    #[command(flatten)]
    api: ApiArgs,
    id: Uuid,
    /// Keep printing new output until the task is finished.
    #[arg(long, short)]
    follow: bool,
}

#[derive(Debug, clap::Args)]
pub struct TaskIdArgs {
    #[command(flatten)]
    api: ApiArgs,
    id: Uuid,
}

pub async fn migrate(args: DatabaseArgs) -> anyhow::Result<()> {
    args.pooling.configure(false)?;
    let pool = sked_db::connect_session(&args.database_url, "sked-migrate", 2, "sked migrate")
        .await
        .context("connecting to the database")?;
    sked_db::migrate(&pool).await.context("migrating")?;
    let version = sked_db::schema_version(&pool).await?;
    pool.close().await;
    outln!("migrated: schema version {version}");
    Ok(())
}

pub async fn token(cmd: TokenCommand) -> anyhow::Result<()> {
    let args = match cmd {
        TokenCommand::Create(args) => args,
        TokenCommand::List(args) => return token_list(args).await,
        TokenCommand::Revoke(args) => return token_revoke(args).await,
    };
    let role = Role::parse(&args.role)?;
    if args.owner.trim().is_empty() {
        bail!("--owner must not be empty");
    }
    let expires_in = args
        .expires_in
        .as_deref()
        .map(|s| super::when::parse_duration(s, "--expires-in", 1.0))
        .transpose()
        .map_err(anyhow::Error::msg)?
        .map(Duration::from_secs_f64);
    let pool = token_db(&args.db).await?;
    let secret =
        sked_db::token::create_expiring(&pool, &args.owner, role, &args.name, expires_in).await?;
    pool.close().await;
    eprintln!(
        "Created a {} token for owner {:?}. Its secret is shown only this once:",
        role.as_str(),
        args.owner
    );
    outln!("{secret}");
    Ok(())
}

/// The database of `sked token …`, checked to have the schema this binary knows.
async fn token_db(db: &DatabaseArgs) -> anyhow::Result<sqlx::PgPool> {
    db.pooling.configure(false)?;
    let pool = sked_db::connect(&db.database_url, "sked-token", 2)
        .await
        .context("connecting to the database")?;
    sked_db::check_schema(&pool).await?;
    Ok(pool)
}

async fn token_list(args: TokenListArgs) -> anyhow::Result<()> {
    let pool = token_db(&args.db).await?;
    let tokens = sked_db::token::list(&pool).await?;
    pool.close().await;
    outln!(
        "{:<36}  {:<16}  {:<5}  {:<19}  {:<19}  {:<19}  NAME",
        "ID",
        "OWNER",
        "ROLE",
        "CREATED",
        "REVOKED",
        "EXPIRES"
    );
    let at = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_else(|| "-".into())
    };
    for t in tokens {
        outln!(
            "{:<36}  {:<16}  {:<5}  {:<19}  {:<19}  {:<19}  {}",
            t.id,
            t.owner,
            t.role,
            t.created_at.format("%Y-%m-%d %H:%M:%S"),
            at(t.revoked_at),
            at(t.expires_at),
            t.name
        );
    }
    Ok(())
}

async fn token_revoke(args: TokenRevokeArgs) -> anyhow::Result<()> {
    let pool = token_db(&args.db).await?;
    let revoked = sked_db::token::revoke(&pool, args.id).await?;
    pool.close().await;
    if !revoked {
        bail!("no active token has id {}", args.id);
    }
    eprintln!("Revoked token {}.", args.id);
    Ok(())
}

pub async fn submit(args: SubmitArgs) -> anyhow::Result<()> {
    if let Some(path) = &args.file {
        return super::workflows::submit_file(&args.api, path, args.owner.clone(), args.json).await;
    }
    let kind = if args.service {
        TaskKind::Service
    } else {
        args.kind.unwrap_or_default()
    };
    let health_check = args.health.to_json()?;
    if health_check.is_some() && kind != TaskKind::Service {
        bail!("--health-cmd and --health-url are for services: add --service");
    }
    if args.preemptible && kind == TaskKind::Service {
        bail!(
            "--preemptible is not for services: a service cannot be preemptible, its copies are \
             what preemption makes room for"
        );
    }
    let input = match (&args.input, &args.input_file) {
        (Some(v), _) => Some(v.clone()),
        (None, Some(path)) => Some(read_input(path)?),
        (None, None) => None,
    };
    let (command, task_args) = if !kind.is_builtin() {
        if args.command.is_empty() {
            bail!("give the command to run after `--`, for example: sked submit -- echo hello");
        }
        (Some(args.command.clone()), vec![])
    } else {
        (None, args.command.clone())
    };
    let mut task = SubmitTask {
        command,
        args: task_args,
        kind: (kind != TaskKind::Command).then_some(kind),
        input,
        run_at: args.at,
        delay_secs: args.delay,
        timeout_secs: args.timeout,
        idempotency_key: args.idempotency_key.clone(),
        owner: args.owner.clone(),
        shards: args.shards,
        broadcast: args.broadcast,
        replicas: args.replicas,
        restart_policy: args.restart.clone(),
        health_check,
        preemptible: args.preemptible,
        ..SubmitTask::default()
    };
    args.task.apply(&mut task);
    args.resources.apply(&mut task);
    let submitted = args.api.client()?.submit(&task).await?;
    print_submitted(&submitted, args.json)
}

/// Prints the ids of the tasks, one a line, or the whole answer as JSON with `--json`; a
/// task the request did not create (its idempotency key named it already) is said so on
/// stderr.
fn print_submitted(submitted: &Submitted, json: bool) -> anyhow::Result<()> {
    if json {
        outln!("{}", serde_json::to_string_pretty(submitted)?);
    } else {
        for (i, id) in submitted.ids.iter().enumerate() {
            outln!("{id}");
            if submitted.created.get(i) == Some(&false) {
                eprintln!("{id}: not created, its idempotency key names this task already");
            }
        }
    }
    Ok(())
}

fn read_input(path: &Path) -> anyhow::Result<serde_json::Value> {
    let text = read_text(path, "--input-file")?;
    serde_json::from_str(&text)
        .with_context(|| format!("--input-file {} is not valid JSON", path.display()))
}

pub async fn list(args: ListArgs) -> anyhow::Result<()> {
    let client = args.api.client()?;
    let query = ListQuery {
        after: args.after,
        limit: Some(args.limit),
        ..args.filters.query()
    };
    if args.count {
        let counted = client.count(&query).await?;
        let shown = sked_types::bulk::thousands(counted.count.max(0) as u64);
        outln!("{}{shown}", counted.qualifier());
        return Ok(());
    }
    if args.json {
        let page = client.list_json(&query).await?;
        outln!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    let page = client.list(&query).await?;
    if page.tasks.is_empty() && page.next_cursor.is_none() {
        eprintln!("no tasks");
        return Ok(());
    }
    if page.tasks.is_empty() {
        eprintln!("no matching tasks among the tasks read");
    } else {
        print_tasks(&page.tasks);
    }
    if let Some(cursor) = page.next_cursor {
        if page.scan_limit_reached {
            // The server read as many tasks as it reads in one request; the filters go on.
            eprintln!(
                "more (the search stopped at its scan limit): sked list --after {cursor} with the same filters"
            );
        } else {
            eprintln!("more: sked list --after {cursor}");
        }
    }
    Ok(())
}

fn print_tasks(tasks: &[sked_types::Task]) {
    outln!(
        "{:<36}  {:<15}  {:<12}  {:>7}  {:<19}  COMMAND",
        "ID",
        "STATE",
        "QUEUE",
        "ATTEMPT",
        "CREATED"
    );
    for t in tasks {
        outln!(
            "{:<36}  {:<15}  {:<12}  {:>7}  {:<19}  {}",
            t.id,
            t.state.as_str(),
            truncate(&t.queue, 12),
            sked_types::service::attempts_text(t.attempt, t.max_attempts),
            time(Some(t.created_at)),
            truncate(&what(t), 60)
        );
    }
}

pub async fn show(args: ShowArgs) -> anyhow::Result<()> {
    let answer = args.api.client()?.task_json(args.id).await?;
    print_answer(args.json, answer, describe)
}

pub async fn logs(args: LogsArgs) -> anyhow::Result<()> {
    const PAGE: u32 = 1000;
    let client = args.api.client()?;
    let mut after = 0;
    loop {
        // The state is read before the logs: once it is final, the worker has written every
        // chunk, so draining the logs after seeing it misses nothing.
        let finished = !args.follow || client.task(args.id).await?.task.state.is_final();
        loop {
            let chunks = client.logs(args.id, after, PAGE).await?;
            for chunk in &chunks {
                let bytes = chunk.data.as_bytes();
                if chunk.stream == "stderr" {
                    let mut err = std::io::stderr().lock();
                    err.write_all(bytes)?;
                    err.flush()?;
                } else {
                    let mut out = std::io::stdout().lock();
                    out.write_all(bytes)?;
                    out.flush()?;
                }
                after = after.max(chunk.id);
            }
            if chunks.len() < PAGE as usize {
                break;
            }
        }
        if finished {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

pub async fn cancel(args: TaskIdArgs) -> anyhow::Result<()> {
    let change = args.api.client()?.cancel(args.id).await?;
    print_change(&change);
    Ok(())
}

pub async fn retry(args: TaskIdArgs) -> anyhow::Result<()> {
    let change = args.api.client()?.retry(args.id).await?;
    print_change(&change);
    Ok(())
}

#[derive(Debug, clap::Args)]
pub struct ResubmitArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The task whose definition to submit again.
    id: Uuid,
    /// Print the answer as JSON.
    #[arg(long)]
    json: bool,
}

pub async fn resubmit(args: ResubmitArgs) -> anyhow::Result<()> {
    let submitted = args.api.client()?.resubmit(args.id).await?;
    print_submitted(&submitted, args.json)
}
