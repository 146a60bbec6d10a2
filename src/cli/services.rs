//! The service commands of the `sked` binary: `sked services` lists the services that run,
//! `sked service show ID` shows one with its copies, `sked service update ID …` changes its
//! definition (a rolling update) or its replicas. A service is submitted with
//! `sked submit --service` and stopped with `sked cancel ID`. See docs/services.md.

use std::collections::BTreeMap;

use anyhow::bail;
use serde_json::{Map, Value, json};
use sked_types::service::{Service, ServiceCopy};
use uuid::Uuid;

use super::args::{ApiArgs, ShowArgs, parse_env, parse_json, print_answer};
use super::format::{time, truncate};

/// The arguments of `sked services`.
pub use super::args::OwnerListArgs as ListArgs;

#[derive(Debug, clap::Subcommand)]
pub enum ServiceCommand {
    /// Show a service and its copies: worker, uptime, restarts, backoff, last exits.
    Show(ShowArgs),
    /// Change a service: its definition (its copies roll over one at a time) or --replicas.
    Update(Box<UpdateArgs>),
}

/// The flags of a service's health check, shared by `sked submit --service` and
/// `sked service update`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct HealthArgs {
    /// Health check: a shell command run in the copy's working directory; exit 0 is healthy.
    #[arg(long, value_name = "SHELL", conflicts_with = "health_url")]
    pub health_cmd: Option<String>,
    /// Health check: a URL probed with GET; a 2xx answer is healthy.
    #[arg(long, value_name = "URL")]
    pub health_url: Option<String>,
    /// Seconds between probes (default 10).
    #[arg(long, value_name = "SECS")]
    pub health_interval: Option<f64>,
    /// Seconds a probe may take (default 5).
    #[arg(long, value_name = "SECS")]
    pub health_timeout: Option<f64>,
    /// Failed probes in a row that restart the copy (default 3).
    #[arg(long, value_name = "N")]
    pub health_failures: Option<u32>,
}

impl HealthArgs {
    /// The health check as the API takes it, or `None` when no probe is given (the other
    /// flags alone are refused).
    pub fn to_json(&self) -> anyhow::Result<Option<Value>> {
        let probe = match (&self.health_cmd, &self.health_url) {
            (Some(cmd), _) => json!({"command": ["sh", "-c", cmd]}),
            (None, Some(url)) => json!({"http": url}),
            (None, None) => {
                if self.health_interval.is_some()
                    || self.health_timeout.is_some()
                    || self.health_failures.is_some()
                {
                    bail!(
                        "--health-interval, --health-timeout and --health-failures need --health-cmd or --health-url"
                    );
                }
                return Ok(None);
            }
        };
        let mut check = probe;
        let map = check.as_object_mut().expect("an object");
        if let Some(v) = self.health_interval {
            map.insert("interval_secs".into(), json!(v));
        }
        if let Some(v) = self.health_timeout {
            map.insert("timeout_secs".into(), json!(v));
        }
        if let Some(v) = self.health_failures {
            map.insert("failures".into(), json!(v));
        }
        Ok(Some(check))
    }
}

#[derive(Debug, clap::Args)]
pub struct UpdateArgs {
    #[command(flatten)]
    api: ApiArgs,
    id: Uuid,
    /// Copies to keep running (1 to 1000): adds copies, or stops those of the highest indexes.
    #[arg(long, value_name = "N", allow_negative_numbers = true,
          value_parser = clap::value_parser!(i32).range(1..=1000))]
    replicas: Option<i32>,
    /// The whole new environment (KEY=VALUE, repeat for more); replaces the old one.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Remove every environment variable.
    #[arg(long, conflicts_with = "env")]
    clear_env: bool,
    /// New JSON input (`null` removes it).
    #[arg(long, value_name = "JSON", value_parser = parse_json)]
    input: Option<Value>,
    /// `always` or `on_failure`.
    #[arg(long, value_parser = ["always", "on_failure"])]
    restart: Option<String>,
    #[command(flatten)]
    health: HealthArgs,
    /// Remove the health check.
    #[arg(long, conflicts_with_all = ["health_cmd", "health_url"])]
    no_health_check: bool,
    #[command(flatten)]
    resources: super::units::ResourceFlags,
    /// Print the raw JSON answer.
    #[arg(long)]
    json: bool,
    /// A new command and its arguments, after `--`.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

pub async fn list(args: ListArgs) -> anyhow::Result<()> {
    let page = args.api.client()?.services(args.owner.as_deref()).await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    if page.services.is_empty() {
        outln!("No services run.");
        return Ok(());
    }
    outln!(
        "{:<36}  {:<10}  {:>7}  {:>7}  {:>8}  {:>3}  {:<10}  COMMAND",
        "ID",
        "OWNER",
        "RUNNING",
        "WAITING",
        "RESTARTS",
        "GEN",
        "RESTART"
    );
    for s in &page.services {
        outln!(
            "{:<36}  {:<10}  {:>7}  {:>7}  {:>8}  {:>3}  {:<10}  {}",
            s.id,
            truncate(&s.owner, 10),
            format!("{}/{}", s.running, s.replicas),
            s.waiting,
            s.restarts,
            s.generation,
            s.restart_policy,
            truncate(&command_line(s), 60)
        );
    }
    Ok(())
}

pub async fn run(cmd: ServiceCommand) -> anyhow::Result<()> {
    match cmd {
        ServiceCommand::Show(args) => show(args).await,
        ServiceCommand::Update(args) => update(*args).await,
    }
}

async fn show(args: ShowArgs) -> anyhow::Result<()> {
    let answer = args.api.client()?.service_json(args.id).await?;
    print_answer(args.json, answer, describe)
}

fn command_line(s: &Service) -> String {
    let mut words: Vec<String> = s.command.clone().unwrap_or_default();
    if let Some(url) = &s.artifact_url {
        words.push(url.clone());
    }
    words.extend(s.args.iter().cloned());
    words
        .iter()
        .map(|w| super::format::quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A service as `sked service show` prints it.
pub fn describe(s: &Service) -> String {
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<15} {v}\n"));
    line("id:", s.id.to_string());
    line("state:", s.state.to_string());
    line("owner:", s.owner.clone());
    line("queue:", s.queue.clone());
    line("command:", command_line(s));
    let mut copies = format!("{} running of {} wanted", s.running, s.replicas);
    if let Some(healthy) = s.healthy {
        copies.push_str(&format!(", {healthy} healthy"));
    }
    if s.waiting > 0 {
        copies.push_str(&format!(", {} waiting for a worker", s.waiting));
    }
    line("replicas:", copies);
    line("restarts:", s.restarts.to_string());
    line("generation:", s.generation.to_string());
    line("restart:", s.restart_policy.clone());
    if let Some(check) = &s.health_check {
        line("health check:", check.to_string());
    }
    for (k, v) in &s.env {
        line("env:", format!("{k}={v}"));
    }
    line("created:", time(Some(s.created_at)));
    if s.finished_at.is_some() {
        line("finished:", time(s.finished_at));
    }
    out.push_str("\ncopies:\n");
    for c in &s.copies {
        out.push_str(&copy_line(c));
    }
    out
}

fn copy_line(c: &ServiceCopy) -> String {
    let worker = c
        .worker_host
        .as_deref()
        .or(c.worker_name.as_deref())
        .map(str::to_owned)
        .or(c.worker_id.map(|w| w.to_string()))
        .unwrap_or_else(|| "-".into());
    let status = match (c.up_since, c.backing_off_until) {
        (Some(_), _) => format!("up {}", secs(c.uptime_secs.unwrap_or(0.0))),
        (None, Some(until)) => format!("backing off until {}", time(Some(until))),
        _ => c.state.to_string(),
    };
    let mut out = format!(
        "  [{}] {}  gen {}  {:<9} {}  on {}  restarts {}{}{}\n",
        c.index,
        c.id,
        c.generation,
        c.state.to_string(),
        status,
        worker,
        c.restarts,
        if c.retired { "  (retired)" } else { "" },
        if c.cancel_requested {
            "  (stopping)"
        } else {
            ""
        },
    );
    for x in c.last_exits.iter().take(5) {
        out.push_str(&format!(
            "      exited {}: {}{}\n",
            time(Some(x.exited_at)),
            x.error,
            x.restart_at
                .map(|r| format!("; restart at {}", time(Some(r))))
                .unwrap_or_default()
        ));
    }
    out
}

fn secs(s: f64) -> String {
    let s = s.max(0.0) as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{}s", s / 60, s % 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

async fn update(args: UpdateArgs) -> anyhow::Result<()> {
    let mut changes = Map::new();
    if let Some(r) = args.replicas {
        changes.insert("replicas".into(), json!(r));
    }
    if !args.env.is_empty() {
        let env: BTreeMap<_, _> = args.env.iter().cloned().collect();
        changes.insert("env".into(), json!(env));
    }
    if args.clear_env {
        changes.insert("env".into(), json!({}));
    }
    if let Some(input) = &args.input {
        changes.insert("input".into(), input.clone());
    }
    if let Some(r) = &args.restart {
        changes.insert("restart_policy".into(), json!(r));
    }
    if let Some(check) = args.health.to_json()? {
        changes.insert("health_check".into(), check);
    }
    if args.no_health_check {
        changes.insert("health_check".into(), Value::Null);
    }
    changes.extend(args.resources.fields());
    if let Some((program, rest)) = args.command.split_first() {
        changes.insert("command".into(), json!([program]));
        changes.insert("args".into(), json!(rest));
    }
    if changes.is_empty() {
        bail!("nothing to change: give --replicas, --env, a new command after `--`, …");
    }
    let updated = args
        .api
        .client()?
        .update_service(args.id, &Value::Object(changes))
        .await?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&updated)?);
    } else {
        outln!(
            "Service {}: generation {}, {} replicas.",
            updated.id,
            updated.generation,
            updated.replicas
        );
    }
    Ok(())
}
