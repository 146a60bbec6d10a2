//! `sked alert target …`: the webhooks that tasks' notifications are delivered to (admin
//! tokens; docs/operations.md, "Alerts").

use std::path::PathBuf;

use anyhow::{Context, bail};
use sked_types::{AlertTarget, SetAlertTarget};

use super::args::{ApiArgs, read_text};

/// `sked alert …`.
#[derive(Debug, clap::Subcommand)]
pub enum AlertCommand {
    /// Alert targets: webhooks that notifications are POSTed to, signed with their secret.
    #[command(subcommand)]
    Target(TargetCommand),
}

/// `sked alert target …`.
#[derive(Debug, clap::Subcommand)]
pub enum TargetCommand {
    /// Create or replace a target: `sked alert target set NAME --webhook URL --secret-file FILE`
    /// (or the secret in SKED_ALERT_SECRET).
    Set(SetArgs),
    /// List the targets (never their secrets).
    List(ListArgs),
    /// Delete a target; tasks that name it keep their notify, and its deliveries fail.
    Delete(NameArgs),
}

#[derive(Debug, clap::Args)]
pub struct SetArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The target's name, which tasks name in their notify.
    name: String,
    /// The webhook's URL, where deliveries are POSTed (http:// or https://).
    #[arg(long, value_name = "URL")]
    webhook: String,
    /// A file holding the secret deliveries are signed with (16 to 512 characters; `-`:
    /// stdin; a final newline is dropped). Not a flag's value: those show in `ps`.
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// The secret, from the environment when no --secret-file is given.
    #[arg(long, env = "SKED_ALERT_SECRET", hide_env_values = true, hide = true)]
    secret: Option<String>,
    /// The queue of its deliveries (default: default): a worker must serve it.
    #[arg(long)]
    queue: Option<String>,
    /// Attempts of each delivery, 1 to 100 (default 10).
    #[arg(long, value_parser = clap::value_parser!(i32).range(1..=100))]
    max_attempts: Option<i32>,
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    api: ApiArgs,
}

#[derive(Debug, clap::Args)]
pub struct NameArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// The target.
    name: String,
}

fn describe(t: &AlertTarget) -> String {
    format!(
        "{}  {}  queue {}, {} attempts",
        t.name, t.url, t.queue, t.max_attempts
    )
}

pub async fn run(cmd: AlertCommand) -> anyhow::Result<()> {
    let AlertCommand::Target(cmd) = cmd;
    match cmd {
        TargetCommand::Set(args) => {
            let secret = match (&args.secret_file, &args.secret) {
                (Some(path), _) => {
                    let text = read_text(path, "--secret-file")?;
                    text.strip_suffix('\n').unwrap_or(&text).to_owned()
                }
                (None, Some(secret)) => secret.clone(),
                (None, None) => bail!(
                    "give the secret deliveries are signed with: --secret-file FILE (or - for \
                     stdin), or SKED_ALERT_SECRET"
                ),
            };
            let target = SetAlertTarget {
                url: args.webhook.clone(),
                secret,
                queue: args.queue.clone(),
                max_attempts: args.max_attempts,
            };
            let t = args
                .api
                .client()?
                .set_alert_target(&args.name, &target)
                .await
                .context("setting the alert target")?;
            outln!("{}", describe(&t));
        }
        TargetCommand::List(args) => {
            for t in args.api.client()?.alert_targets().await? {
                outln!("{}", describe(&t));
            }
        }
        TargetCommand::Delete(args) => {
            let t = args.api.client()?.delete_alert_target(&args.name).await?;
            outln!("deleted {}", describe(&t));
        }
    }
    Ok(())
}
