//! `sked wait ID…`: waits until tasks and workflows are in a final state, by long polls of
//! the API (`GET …?wait=`), and exits with what they became.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::bail;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use sked::client::{Client, ClientError, MAX_WAIT};
use sked_types::{TaskState, WorkflowState};
use tokio::time::Instant;
use uuid::Uuid;

use super::args::ApiArgs;
use super::when::parse_duration;

/// Every one succeeded.
const SUCCEEDED: u8 = 0;
/// At least one ended in another final state (failed, cancelled, upstream_failed, skipped).
const NOT_SUCCEEDED: u8 = 2;
/// The timeout passed while at least one was unfinished, and none ended otherwise.
const TIMED_OUT: u8 = 3;

#[derive(Debug, clap::Args)]
#[command(
    after_help = "Exit status: 0 when every one succeeded, 2 when one ended in another \
final state (failed, cancelled, upstream_failed or skipped), 3 when the timeout passed first, \
1 on an error (such as an id that names no task or workflow of yours)."
)]
pub struct WaitArgs {
    #[command(flatten)]
    api: ApiArgs,
    /// Ids of tasks or workflows.
    #[arg(required = true)]
    ids: Vec<Uuid>,
    /// Give up after this long: seconds (`90`) or a duration (`30s`, `15m`, `1h`); default:
    /// wait for ever.
    #[arg(long, value_parser = |s: &str| parse_duration(s, "--timeout", f64::MIN_POSITIVE))]
    timeout: Option<f64>,
    /// Print each one's final answer as a line of JSON instead of `ID STATE`.
    #[arg(long)]
    json: bool,
}

/// A task's or a workflow's state once the wait for it ended.
struct Ended {
    id: Uuid,
    state: String,
    finished: bool,
    succeeded: bool,
    json: serde_json::Value,
}

pub async fn wait(args: WaitArgs) -> anyhow::Result<ExitCode> {
    let client = args.api.client()?;
    let deadline = args
        .timeout
        .map(|secs| Instant::now() + Duration::from_secs_f64(secs));
    let waits = args
        .ids
        .iter()
        .map(|&id| wait_one(&client, id, deadline))
        .collect::<Vec<_>>();
    let (mut not_succeeded, mut unfinished) = (false, false);
    let mut pending: FuturesUnordered<_> = waits.into_iter().collect();
    while let Some(ended) = pending.next().await {
        let ended = ended?;
        if args.json {
            outln!("{}", serde_json::to_string(&ended.json)?);
        } else {
            outln!("{} {}", ended.id, ended.state);
        }
        unfinished |= !ended.finished;
        not_succeeded |= ended.finished && !ended.succeeded;
    }
    // An ending other than success says more than a timeout.
    Ok(ExitCode::from(if not_succeeded {
        NOT_SUCCEEDED
    } else if unfinished {
        TIMED_OUT
    } else {
        SUCCEEDED
    }))
}

/// Waits for `id`, a task or else a workflow, until it is final or `deadline`.
async fn wait_one(client: &Client, id: Uuid, deadline: Option<Instant>) -> anyhow::Result<Ended> {
    let left = || {
        deadline
            .map(|d| d.saturating_duration_since(Instant::now()))
            .unwrap_or(MAX_WAIT)
            .min(MAX_WAIT)
    };
    match client.task_waiting(id, left()).await {
        Ok(task) => {
            let poll = |wait| client.task_waiting(id, wait);
            return follow(id, task, left, poll, |t| {
                let state = t.task.state;
                (
                    state.to_string(),
                    state.is_final(),
                    state == TaskState::Succeeded,
                )
            })
            .await;
        }
        Err(ClientError::Api { status: 404, .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let workflow = match client.workflow_waiting(id, left()).await {
        Ok(w) => w,
        Err(ClientError::Api { status: 404, .. }) => {
            bail!("no task or workflow {id} (or not one of yours)")
        }
        Err(e) => return Err(e.into()),
    };
    let poll = |wait| client.workflow_waiting(id, wait);
    follow(id, workflow, left, poll, |w| {
        let state = w.workflow.state;
        let finished = state != WorkflowState::Running;
        (
            state.to_string(),
            finished,
            state == WorkflowState::Succeeded,
        )
    })
    .await
}

/// Asks `poll` again, for what is `left` of the wait, until the answer's `outcome` (its state,
/// whether final, whether succeeded) is final or nothing is left.
async fn follow<T: serde::Serialize, F: Future<Output = Result<T, ClientError>>>(
    id: Uuid,
    mut answer: T,
    left: impl Fn() -> Duration,
    poll: impl Fn(Duration) -> F,
    outcome: impl Fn(&T) -> (String, bool, bool),
) -> anyhow::Result<Ended> {
    loop {
        let (state, finished, succeeded) = outcome(&answer);
        if finished || left().is_zero() {
            return Ok(Ended {
                id,
                state,
                finished,
                succeeded,
                json: serde_json::to_value(&answer)?,
            });
        }
        answer = poll(left()).await?;
    }
}
