//! `sked schedule …` (create, list, show, pause, resume, run, backfill, delete) and
//! `sked cron next`:
//! the cron-schedule commands, which talk to the REST API. Flags are validated here, before
//! any request; a schedule is named by its id or by its name.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use sked::client::{Client, ScheduleQuery};
use sked_types::{
    Backfill, BackfillOrder, CreateSchedule, Schedule, ScheduleDetail, ScheduleRun, StartBackfill,
    SubmitTask, SubmitWorkflow, TaskKind,
};
use uuid::Uuid;

use super::args::{
    ApiArgs, OwnerListArgs, TaskFlags, one_of, parse_json, parse_secs, print_answer, read_text,
    time_or_ago,
};
use super::format::{quote, time, truncate};
use super::units::ResourceFlags;

#[derive(Debug, clap::Subcommand)]
pub enum ScheduleCommand {
    /// Create a schedule: `sked schedule create NAME --cron EXPR [flags] -- COMMAND [ARGS...]`.
    Create(Box<CreateArgs>),
    /// List schedules by owner and name.
    List(OwnerListArgs),
    /// Show a schedule, its next fire times and its latest runs.
    Show(ShowArgs),
    /// Pause a schedule: no tick fires until it is resumed.
    Pause(RefArgs),
    /// Resume a paused schedule at its next tick from now.
    Resume(RefArgs),
    /// Run a schedule's task (or workflow) now, outside its ticks; prints the new id.
    Run(RefArgs),
    /// Run a schedule for every tick of a past range (ticks that ran already are not run
    /// again); prints the backfill's id, or follows it with --wait.
    Backfill(BackfillArgs),
    /// List a schedule's backfills, newest first.
    Backfills(BackfillsArgs),
    /// Cancel a running backfill: it starts no more ticks.
    CancelBackfill(CancelBackfillArgs),
    /// Delete a schedule and its run history (occurrences it submitted stay).
    Delete(RefArgs),
}

#[derive(Debug, clap::Subcommand)]
pub enum CronCommand {
    /// Print the next fire times of a cron expression (UTC).
    Next(CronNextArgs),
}

#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// A name, unique among the owner's schedules.
    name: String,
    /// Cron expression: 5 fields (minute hour day-of-month month day-of-week), 6 with seconds
    /// first, or @hourly, @daily, @weekly, @monthly, @yearly.
    #[arg(long, value_name = "EXPR")]
    cron: String,
    /// IANA time zone the expression is read in (default UTC).
    #[arg(long = "tz", value_name = "ZONE")]
    time_zone: Option<String>,
    /// Ticks missed while nothing fired them: skip them, run once for all of them (default),
    /// or catch up on each.
    #[arg(long, value_parser = ["skip", "run_once", "catch_up"])]
    misfire: Option<String>,
    /// A tick later than this when seen counts as missed (default 60).
    #[arg(long, value_name = "SECS", allow_negative_numbers = true,
          value_parser = |s: &str| parse_secs(s, "--misfire-grace", 0.0))]
    misfire_grace: Option<f64>,
    /// The most missed ticks --misfire catch_up runs (default 100).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..=10_000))]
    catch_up_limit: Option<i32>,
    /// A tick while the previous occurrence is unfinished: run anyway (allow), skip it
    /// (default), queue one behind it (queue_one), or cancel it and run (replace).
    #[arg(long, value_parser = ["allow", "skip", "queue_one", "replace"])]
    overlap: Option<String>,
    /// Start each occurrence up to this many seconds after its tick (random; default 0).
    #[arg(long, value_name = "SECS", allow_negative_numbers = true,
          value_parser = |s: &str| parse_secs(s, "--jitter", 0.0))]
    jitter: Option<f64>,
    /// Runs kept in the schedule's history (default 1000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..))]
    history_limit: Option<i32>,
    /// Create it paused.
    #[arg(long)]
    paused: bool,
    /// Create it for this owner (admin tokens only).
    #[arg(long)]
    owner: Option<String>,
    /// An alert target told when ticks are missed (no server or worker fired them in time);
    /// repeat for more.
    #[arg(long = "alert-missed", value_name = "TARGET")]
    alert_missed: Vec<String>,
    /// An alert target told when occurrences fail --failures-in-a-row times in a row.
    #[arg(long = "alert-failing", value_name = "TARGET")]
    alert_failing: Vec<String>,
    /// How many occurrences in a row fail before --alert-failing is told (default 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..=1000),
          requires = "alert_failing")]
    failures_in_a_row: Option<i32>,
    #[command(flatten)]
    task: TaskFlags,
    #[command(flatten)]
    template: TemplateFlags,
    #[command(flatten)]
    resources: ResourceFlags,
    /// The task template as JSON, with the fields of `POST /api/v1/tasks` (instead of a
    /// command after `--`).
    #[arg(long, value_name = "JSON", value_parser = parse_task,
          conflicts_with_all = ["workflow", "command", "TaskFlags", "TemplateFlags", "ResourceFlags"])]
    task_json: Option<SubmitTask>,
    /// A file (`-` for stdin) holding a workflow spec in JSON, as `POST /api/v1/workflows`
    /// takes it: each tick submits the workflow.
    #[arg(long, value_name = "FILE",
          conflicts_with_all = ["command", "TaskFlags", "TemplateFlags", "ResourceFlags"])]
    workflow: Option<PathBuf>,
    /// Print the created schedule as JSON.
    #[arg(long)]
    json: bool,
    /// The command each tick runs and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// The task flags of `sked schedule create` that `sked submit` takes otherwise. With
/// [`TaskFlags`] and [`ResourceFlags`], they shape a task given as a command after `--`, so
/// the three groups conflict with `--task-json` and `--workflow`.
#[derive(Debug, Default, clap::Args)]
struct TemplateFlags {
    /// JSON input, given to the process on stdin.
    #[arg(long, value_name = "JSON", value_parser = parse_json)]
    input: Option<serde_json::Value>,
    /// Timeout of one attempt, in seconds.
    #[arg(long, value_name = "SECS", allow_negative_numbers = true,
          value_parser = |s: &str| parse_secs(s, "--timeout", f64::MIN_POSITIVE))]
    timeout: Option<f64>,
    /// `command` (default) runs COMMAND; the built-ins `noop` and `sleep` take ARGS only.
    #[arg(long, value_parser = one_of(&[TaskKind::Command, TaskKind::Noop, TaskKind::Sleep], TaskKind::as_str))]
    kind: Option<TaskKind>,
    /// Each occurrence may be stopped while it runs to make room for a copy of a service;
    /// it then waits again without losing an attempt (see docs/runtime.md).
    #[arg(long)]
    preemptible: bool,
}

#[derive(Debug, clap::Args)]
pub struct ShowArgs {
    #[command(flatten)]
    schedule: RefArgs,
    /// Print the raw JSON answer.
    #[arg(long)]
    json: bool,
}

/// A schedule named by its id or its name.
#[derive(Debug, clap::Args)]
pub struct RefArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The schedule's id, or its name.
    #[arg(value_name = "NAME|ID")]
    schedule: String,
    /// The owner of the named schedule, when several owners use the name (admin tokens).
    #[arg(long)]
    owner: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct BackfillArgs {
    #[command(flatten)]
    schedule: RefArgs,
    /// The first moment of the range: RFC 3339 (2026-03-01T00:00:00Z) or a duration ago (7d).
    #[arg(long, value_name = "TIME", value_parser = time_or_ago("--from"))]
    from: chrono::DateTime<chrono::Utc>,
    /// The last moment of the range (included), not in the future: RFC 3339 or a duration
    /// ago (default: now).
    #[arg(long, value_name = "TIME", value_parser = time_or_ago("--to"))]
    to: Option<chrono::DateTime<chrono::Utc>>,
    /// Occurrences running at once (default 1).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(i32).range(1..=1000))]
    max_active: Option<i32>,
    /// Run the newest tick first (default: the oldest).
    #[arg(long)]
    newest_first: bool,
    /// Follow the backfill until it ends, printing its progress; exit 1 unless it succeeded.
    #[arg(long)]
    wait: bool,
    /// Print the backfill as JSON (when it started, or when it ended with --wait).
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct BackfillsArgs {
    #[command(flatten)]
    schedule: RefArgs,
    /// Print the raw JSON answer.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, clap::Args)]
pub struct CancelBackfillArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The backfill's id.
    #[arg(value_name = "ID")]
    id: Uuid,
}

#[derive(Debug, clap::Args)]
pub struct CronNextArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The cron expression (quote it: `sked cron next '*/15 * * * *'`).
    #[arg(value_name = "EXPR")]
    cron: String,
    /// IANA time zone the expression is read in (default UTC).
    #[arg(long = "tz", value_name = "ZONE")]
    time_zone: Option<String>,
    /// How many fire times.
    #[arg(short = 'n', default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=100))]
    n: u32,
}

fn parse_task(s: &str) -> Result<SubmitTask, String> {
    serde_json::from_str(s).map_err(|e| format!("not a valid task: {e}"))
}

pub async fn schedule(cmd: ScheduleCommand) -> anyhow::Result<()> {
    match cmd {
        ScheduleCommand::Create(args) => create(*args).await,
        ScheduleCommand::List(args) => list(args).await,
        ScheduleCommand::Show(args) => show(args).await,
        ScheduleCommand::Pause(args) => {
            let (client, id) = resolve(&args).await?;
            let s = client.pause_schedule(id).await?;
            outln!("{}: paused", label(&s));
            Ok(())
        }
        ScheduleCommand::Resume(args) => {
            let (client, id) = resolve(&args).await?;
            let s = client.resume_schedule(id).await?;
            outln!(
                "{}: active, next tick {}",
                label(&s),
                time(Some(s.next_run_at))
            );
            Ok(())
        }
        ScheduleCommand::Run(args) => {
            let (client, id) = resolve(&args).await?;
            let ran = client.run_schedule(id).await?;
            match (ran.task_id, ran.workflow_id) {
                (Some(task), _) => outln!("{task}"),
                (None, Some(workflow)) => outln!("{workflow}"),
                (None, None) => bail!("the server answered without the new occurrence's id"),
            }
            Ok(())
        }
        ScheduleCommand::Backfill(args) => backfill(args).await,
        ScheduleCommand::Backfills(args) => {
            let (client, id) = resolve(&args.schedule).await?;
            let page = client.backfills(id).await?;
            if args.json {
                outln!("{}", serde_json::to_string_pretty(&page)?);
            } else if page.backfills.is_empty() {
                eprintln!("no backfills");
            } else {
                outln!("{}", backfill_table(&page.backfills));
            }
            Ok(())
        }
        ScheduleCommand::CancelBackfill(args) => {
            let b = args.api.client()?.cancel_backfill(args.id).await?;
            outln!("{}: {}", b.id, progress(&b));
            Ok(())
        }
        ScheduleCommand::Delete(args) => {
            let (client, id) = resolve(&args).await?;
            let s = client.delete_schedule(id).await?;
            outln!("{}: deleted", label(&s));
            Ok(())
        }
    }
}

pub async fn cron(cmd: CronCommand) -> anyhow::Result<()> {
    let CronCommand::Next(args) = cmd;
    let preview = args
        .api
        .client()?
        .cron_preview(&args.cron, args.time_zone.as_deref(), args.n)
        .await?;
    if preview.next_fire_times.is_empty() {
        eprintln!("{:?} does not fire within eight years", preview.cron);
    }
    for t in preview.next_fire_times {
        outln!("{} UTC", time(Some(t)));
    }
    Ok(())
}

/// How often `sked schedule backfill --wait` reads the backfill.
const BACKFILL_POLL: std::time::Duration = std::time::Duration::from_secs(1);

async fn backfill(args: BackfillArgs) -> anyhow::Result<()> {
    let (client, id) = resolve(&args.schedule).await?;
    let request = StartBackfill {
        from: args.from,
        to: args.to.unwrap_or_else(chrono::Utc::now),
        max_active: args.max_active,
        order: args.newest_first.then_some(BackfillOrder::NewestFirst),
    };
    let mut b = client.start_backfill(id, &request).await?;
    if !args.wait {
        if args.json {
            outln!("{}", serde_json::to_string_pretty(&b)?);
        } else {
            outln!("{}", b.id);
        }
        return Ok(());
    }
    eprintln!("backfill {}: {} ticks", b.id, b.ticks);
    let mut shown = String::new();
    while b.state == "running" {
        let line = progress(&b);
        if line != shown {
            eprintln!("{line}");
            shown = line;
        }
        tokio::time::sleep(BACKFILL_POLL).await;
        b = client.backfill(b.id).await?;
    }
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&b)?);
    } else {
        outln!("{}", progress(&b));
    }
    if b.state != "succeeded" {
        bail!("backfill {} {}", b.id, b.state);
    }
    Ok(())
}

/// A backfill's state and counts on one line.
fn progress(b: &Backfill) -> String {
    let mut line = format!(
        "{}: {} of {} ticks fired, {} had run already; {} running, {} succeeded, {} failed",
        b.state, b.fired, b.ticks, b.already, b.active, b.succeeded, b.failed
    );
    if let Some(next) = b.next_tick {
        line.push_str(&format!("; next tick {}", time(Some(next))));
    }
    if let Some(error) = &b.error {
        line.push_str(&format!("; {error}"));
    }
    line
}

/// Backfills as a table, one per line.
fn backfill_table(backfills: &[Backfill]) -> String {
    let mut out = format!(
        "{:<36}  {:<9}  {:<19}  {:<19}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}",
        "ID", "STATE", "FROM (UTC)", "TO (UTC)", "TICKS", "FIRED", "RAN", "OK", "FAILED"
    );
    for b in backfills {
        out.push_str(&format!(
            "\n{:<36}  {:<9}  {:<19}  {:<19}  {:>6}  {:>6}  {:>6}  {:>6}  {:>6}",
            b.id,
            b.state,
            time(Some(b.from)),
            time(Some(b.to)),
            b.ticks,
            b.fired,
            b.already,
            b.succeeded,
            b.failed
        ));
    }
    out
}

/// `name (id)` of a schedule, as the one-line answers print it.
fn label(s: &Schedule) -> String {
    format!("{} ({})", s.name, s.id)
}

/// The client and the id of the schedule `args` names: an id as it is, a name looked up
/// among the caller's schedules (all of them for an admin token, or `--owner`'s).
async fn resolve(args: &RefArgs) -> anyhow::Result<(Client, Uuid)> {
    let client = args.api.client()?;
    if let Ok(id) = args.schedule.parse::<Uuid>() {
        return Ok((client, id));
    }
    let query = ScheduleQuery {
        owner: args.owner.clone(),
        name: Some(args.schedule.clone()),
    };
    let found = client.schedules(&query).await?.schedules;
    match found.as_slice() {
        [] => bail!("no schedule is named {:?}", args.schedule),
        [one] => Ok((client, one.id)),
        several => {
            let owners: Vec<&str> = several.iter().map(|s| s.owner.as_str()).collect();
            bail!(
                "schedules of several owners are named {:?} ({}): give its id or --owner",
                args.schedule,
                owners.join(", ")
            )
        }
    }
}

async fn create(args: CreateArgs) -> anyhow::Result<()> {
    let (task, workflow) = match (&args.task_json, &args.workflow) {
        (Some(task), _) => (Some(task.clone()), None),
        (None, Some(path)) => (None, Some(read_workflow(path)?)),
        (None, None) => (Some(task_from_flags(&args)?), None),
    };
    let request = CreateSchedule {
        name: args.name,
        cron: args.cron,
        time_zone: args.time_zone,
        task,
        workflow,
        misfire_policy: args.misfire,
        misfire_grace_secs: args.misfire_grace,
        catch_up_limit: args.catch_up_limit,
        overlap_policy: args.overlap,
        jitter_secs: args.jitter,
        history_limit: args.history_limit,
        paused: args.paused,
        owner: args.owner,
        notify: schedule_notify(
            &args.alert_missed,
            &args.alert_failing,
            args.failures_in_a_row,
        ),
    };
    let created = args.api.client()?.create_schedule(&request).await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&created)?);
    } else {
        outln!("{}", created.id);
    }
    Ok(())
}

/// A schedule's notify from its flags; `None` when they name no target.
fn schedule_notify(
    missed: &[String],
    failing: &[String],
    in_a_row: Option<i32>,
) -> Option<serde_json::Value> {
    let mut notify = serde_json::Map::new();
    if !missed.is_empty() {
        notify.insert("on_missed".into(), serde_json::json!(missed));
    }
    if !failing.is_empty() {
        notify.insert("on_failure".into(), serde_json::json!(failing));
    }
    if let Some(n) = in_a_row {
        notify.insert("failures_in_a_row".into(), n.into());
    }
    (!notify.is_empty()).then_some(serde_json::Value::Object(notify))
}

/// The task template of a command after `--` and the task flags.
fn task_from_flags(create: &CreateArgs) -> anyhow::Result<SubmitTask> {
    let (flags, command) = (&create.template, &create.command);
    let (command, args) = if flags.kind.unwrap_or_default() == TaskKind::Command {
        if command.is_empty() {
            bail!(
                "give the command each tick runs after `--` (for example: sked schedule create \
                 nightly --cron '0 3 * * *' -- echo hello), or --task-json or --workflow"
            );
        }
        (Some(command.to_vec()), vec![])
    } else {
        (None, command.to_vec())
    };
    let mut task = SubmitTask {
        command,
        args,
        kind: flags.kind,
        input: flags.input.clone(),
        timeout_secs: flags.timeout,
        preemptible: flags.preemptible,
        ..SubmitTask::default()
    };
    create.task.apply(&mut task);
    create.resources.apply(&mut task);
    Ok(task)
}

fn read_workflow(path: &Path) -> anyhow::Result<SubmitWorkflow> {
    let text = read_text(path, "--workflow")?;
    let spec: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("--workflow {} is not valid JSON", path.display()))?;
    if !spec.is_object() {
        bail!(
            "--workflow {} must hold a JSON object (a workflow spec)",
            path.display()
        );
    }
    sked_types::strict::from_value(spec).with_context(|| {
        format!(
            "--workflow {} is not a workflow spec as POST /api/v1/workflows takes it",
            path.display()
        )
    })
}

async fn list(args: OwnerListArgs) -> anyhow::Result<()> {
    let client = args.api.client()?;
    let query = ScheduleQuery {
        owner: args.owner,
        name: None,
    };
    if args.json {
        let page = client.schedules_json(&query).await?;
        outln!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    let page = client.schedules(&query).await?;
    if page.schedules.is_empty() {
        eprintln!("no schedules");
        return Ok(());
    }
    outln!(
        "{:<36}  {:<12}  {:<20}  {:<16}  {:<16}  {:<19}  RUNS",
        "ID",
        "OWNER",
        "NAME",
        "CRON",
        "TIME ZONE",
        "NEXT TICK (UTC)"
    );
    for s in &page.schedules {
        let next = match s.paused_at {
            Some(_) => "paused".to_owned(),
            None => time(Some(s.next_run_at)),
        };
        outln!(
            "{:<36}  {:<12}  {:<20}  {:<16}  {:<16}  {:<19}  {}",
            s.id,
            truncate(&s.owner, 12),
            truncate(&s.name, 20),
            truncate(&s.cron, 16),
            truncate(&s.time_zone, 16),
            next,
            truncate(&template(s), 50)
        );
    }
    Ok(())
}

async fn show(args: ShowArgs) -> anyhow::Result<()> {
    let (client, id) = resolve(&args.schedule).await?;
    print_answer(args.json, client.schedule_json(id).await?, describe)
}

/// What a schedule's occurrences run, as a shell-like line (or the workflow's task count).
fn template(s: &Schedule) -> String {
    if let Some(spec) = &s.workflow {
        let tasks = spec
            .get("tasks")
            .and_then(|t| t.as_array())
            .map(Vec::len)
            .unwrap_or(0);
        return format!("workflow of {tasks} tasks");
    }
    let Some(task) = &s.task else {
        return String::new();
    };
    let words = |key: &str| -> Vec<String> {
        task.get(key)
            .and_then(|v| v.as_array())
            .map(|a| a.iter().filter_map(|w| w.as_str()).map(quote).collect())
            .unwrap_or_default()
    };
    let mut line = words("command");
    if line.is_empty() {
        match task.get("artifact_url").and_then(|v| v.as_str()) {
            Some(url) => line.push(url.to_owned()),
            None => {
                let kind = task.get("kind").and_then(|v| v.as_str()).unwrap_or("task");
                line.push(format!("({kind})"));
            }
        }
    }
    line.extend(words("args"));
    line.join(" ")
}

/// The text `sked schedule show` prints.
pub fn describe(detail: &ScheduleDetail) -> String {
    let s = &detail.schedule;
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<13} {v}\n"));
    line("id:", s.id.to_string());
    line("name:", s.name.clone());
    line("owner:", s.owner.clone());
    line("cron:", format!("{} (time zone {})", s.cron, s.time_zone));
    match s.paused_at {
        Some(at) => line("status:", format!("paused since {}", time(Some(at)))),
        None => line("status:", "active".to_owned()),
    }
    let queue = s
        .task
        .as_ref()
        .and_then(|t| t.get("queue"))
        .and_then(|q| q.as_str())
        .map(|q| format!(" (queue {q})"))
        .unwrap_or_default();
    line("runs:", format!("{}{queue}", template(s)));
    line(
        "misfire:",
        format!(
            "{} (grace {} s, catch-up limit {})",
            s.misfire_policy, s.misfire_grace_secs, s.catch_up_limit
        ),
    );
    line("overlap:", s.overlap_policy.clone());
    if s.jitter_secs > 0.0 {
        line("jitter:", format!("up to {} s", s.jitter_secs));
    }
    if let Some(at) = s.queued_fire_at {
        line(
            "queued:",
            format!("{} (waits for the previous occurrence)", time(Some(at))),
        );
    }
    let last = s.last_task_id.or(s.last_workflow_id);
    line(
        "last fired:",
        match (s.last_fire_at, last) {
            (Some(at), Some(id)) => format!("{} ({id})", time(Some(at))),
            (at, _) => time(at),
        },
    );
    line("created:", time(Some(s.created_at)));
    line("updated:", time(Some(s.updated_at)));
    if detail.next_fire_times.is_empty() {
        out.push_str("next ticks:   none while paused\n");
    } else {
        out.push_str("next ticks (UTC):\n");
        for t in &detail.next_fire_times {
            out.push_str(&format!("  {}\n", time(Some(*t))));
        }
    }
    if detail.runs.is_empty() {
        out.push_str("recent runs:  none yet\n");
    } else {
        out.push_str(&format!(
            "recent runs (newest first):\n  {:<19}  {:<7}  {:<36}  DETAIL\n",
            "TICK (UTC)", "OUTCOME", "TASK/WORKFLOW"
        ));
        for r in &detail.runs {
            out.push_str(&format!(
                "  {:<19}  {:<7}  {:<36}  {}\n",
                time(Some(r.fire_at)),
                r.outcome,
                r.task_id
                    .or(r.workflow_id)
                    .map(|id| id.to_string())
                    .unwrap_or_else(|| "-".to_owned()),
                run_detail(r)
            ));
        }
    }
    if !detail.backfills.is_empty() {
        out.push_str("backfills (newest first):\n");
        for b in &detail.backfills {
            out.push_str(&format!(
                "  {} from {} to {}: {}\n",
                b.id,
                time(Some(b.from)),
                time(Some(b.to)),
                progress(b)
            ));
        }
    }
    out
}

/// A run's detail, with the ticks it stands for when it counts missed ones.
fn run_detail(r: &ScheduleRun) -> String {
    let detail = r.detail.clone().unwrap_or_default();
    if r.missed_ticks > 0 && !detail.contains("missed") {
        return format!("{detail} ({} missed ticks)", r.missed_ticks);
    }
    detail
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};
    use sked_types::ScheduleRun;

    fn schedule() -> Schedule {
        let at = Utc.with_ymd_and_hms(2026, 1, 2, 3, 4, 5).unwrap();
        Schedule {
            id: Uuid::nil(),
            owner: "alice".into(),
            name: "nightly".into(),
            cron: "0 3 * * *".into(),
            time_zone: "Europe/Berlin".into(),
            task: Some(serde_json::json!({"command": ["sh", "-c", "echo hi"], "queue": "ops"})),
            workflow: None,
            notify: None,
            misfire_policy: "run_once".into(),
            misfire_grace_secs: 60.0,
            catch_up_limit: 100,
            overlap_policy: "skip".into(),
            jitter_secs: 0.0,
            history_limit: 1000,
            paused_at: None,
            next_run_at: at,
            last_fire_at: None,
            last_task_id: None,
            last_workflow_id: None,
            queued_fire_at: None,
            created_at: at,
            updated_at: at,
            last_tick: None,
        }
    }

    #[test]
    fn templates_read_as_command_lines() {
        let mut s = schedule();
        assert_eq!(template(&s), "sh -c 'echo hi'");
        s.task = Some(serde_json::json!({"kind": "sleep", "args": ["5"]}));
        assert_eq!(template(&s), "(sleep) 5");
        s.task = None;
        s.workflow = Some(serde_json::json!({"tasks": [{}, {}]}));
        assert_eq!(template(&s), "workflow of 2 tasks");
    }

    #[test]
    fn show_lists_next_ticks_and_runs_with_their_detail() {
        let s = schedule();
        let tick = s.next_run_at;
        let detail = ScheduleDetail {
            schedule: s,
            next_fire_times: vec![tick],
            runs: vec![ScheduleRun {
                fire_at: tick,
                outcome: "skipped".into(),
                task_id: None,
                workflow_id: None,
                missed_ticks: 0,
                detail: Some("the previous occurrence was unfinished".into()),
                recorded_at: tick,
                backfill_id: None,
            }],
            backfills: vec![],
        };
        let text = describe(&detail);
        assert!(
            text.contains("0 3 * * * (time zone Europe/Berlin)"),
            "{text}"
        );
        assert!(text.contains("sh -c 'echo hi' (queue ops)"), "{text}");
        assert!(text.contains("  2026-01-02 03:04:05\n"), "{text}");
        assert!(
            text.contains("skipped  -") && text.contains("the previous occurrence was unfinished"),
            "{text}"
        );
    }
}
