//! Runs one claimed attempt to its end and turns what happened into a [`Finished`] record:
//! the built-ins `noop` and `sleep` and the deliveries of alerts (`webhook`,
//! [`crate::webhook`]) in-process, a copy of a service by
//! [`crate::service::supervise`], everything else by [`crate::runner::run_command`].

use std::sync::Arc;
use std::time::Duration;

use sked_db::worker::{Claimed, Finished, Outcome};
use sked_types::TaskKind;
use tokio_util::sync::CancellationToken;

use crate::process::Ended;
use crate::runner::{Context, StopReason, Stopper, limit_error, run_command};

/// Runs the attempt and describes how it ended. Never fails: every problem (a missing
/// executable, a bad artifact) is the attempt's failure, recorded with its error.
pub async fn execute(ctx: &Context, task: &Claimed, stopper: Arc<Stopper>) -> Finished {
    let timeout = task.timeout();
    let mut finished = Finished {
        id: task.id,
        attempt: task.attempt,
        outcome: Outcome::Succeeded,
        exit_code: None,
        error: None,
        stdout_tail: None,
        stderr_tail: None,
        output_sha256: None,
        output: None,
    };
    if task.kind == TaskKind::Service {
        // A copy of a service: its process is restarted in place until the copy is stopped.
        // Boxed, as the command below: their state machines are large, and an attempt's future
        // is as large as its largest branch, so an inline one would cost every attempt, noops
        // included, that much memory from its claim to its end.
        Box::pin(crate::service::supervise(
            ctx,
            task,
            &stopper,
            &mut finished,
        ))
        .await;
        return finished;
    }
    let result = match task.kind {
        TaskKind::Noop => Ok(Ended::Exited(success())),
        TaskKind::Sleep => sleep(task, timeout, stopper.token()).await,
        TaskKind::Webhook => crate::webhook::deliver(ctx, task, timeout, stopper.token()).await,
        // Started by sked itself when its parents are done (sql/subworkflows.sql); a row
        // that reaches a worker was written by hand in a state it never has.
        TaskKind::Workflow => Err(
            "a sub-workflow task runs its workflow when its parents are done; a worker never runs it"
                .to_owned(),
        ),
        TaskKind::Command | TaskKind::Service => {
            Box::pin(run_command(ctx, task, timeout, &stopper, &mut finished)).await
        }
    };
    match result {
        Ok(Ended::Exited(status)) => {
            finished.exit_code = status.code();
            if status.success() {
                finished.outcome = Outcome::Succeeded;
            } else {
                finished.outcome = Outcome::Failed;
                finished.error = Some(match (status.code(), signal_of(&status)) {
                    (Some(code), _) => format!("exited with code {code}"),
                    (None, Some(sig)) => format!("killed by signal {sig}"),
                    _ => "exited abnormally".to_owned(),
                });
            }
        }
        Ok(ended @ (Ended::OverMemory { .. } | Ended::OverOutput { .. })) => {
            finished.outcome = Outcome::Failed;
            finished.error = limit_error(&ended);
        }
        Ok(Ended::TimedOut) => {
            finished.outcome = Outcome::TimedOut;
            finished.error = Some(format!(
                "timed out after {:.3} s",
                timeout.unwrap_or_default().as_secs_f64()
            ));
        }
        Ok(Ended::Stopped) => match stopper.reason() {
            Some(StopReason::Shutdown) => {
                finished.outcome = Outcome::Interrupted;
                finished.error = Some("interrupted: the worker shut down".to_owned());
            }
            Some(StopReason::LeaseLost) => {
                finished.outcome = Outcome::Failed;
                finished.error = Some("stopped: the worker lost the lease".to_owned());
            }
            Some(StopReason::Preempted(copy)) => {
                // Not charged: the task waits again, as after a shutdown.
                finished.outcome = Outcome::Interrupted;
                finished.error = Some(format!(
                    "preempted: stopped to make room for a copy of a service (task {copy})"
                ));
            }
            _ => {
                finished.outcome = Outcome::Cancelled;
                finished.error = Some("cancelled".to_owned());
            }
        },
        Err(error) => {
            finished.outcome = Outcome::Failed;
            finished.error = Some(error);
        }
    }
    finished
}

fn success() -> std::process::ExitStatus {
    use std::os::unix::process::ExitStatusExt;
    std::process::ExitStatus::from_raw(0)
}

fn signal_of(status: &std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    status.signal()
}

/// The built-in `sleep`: `input` `{"seconds": N}`, or `args[0]` seconds.
async fn sleep(
    task: &Claimed,
    timeout: Option<Duration>,
    stop: &CancellationToken,
) -> Result<Ended, String> {
    let secs = task
        .input
        .as_ref()
        .and_then(|i| i.get("seconds"))
        .and_then(|s| s.as_f64())
        .or_else(|| task.args.first().and_then(|a| a.parse().ok()))
        .ok_or("the sleep kind needs input {\"seconds\": N} or a number in args[0]")?;
    if !secs.is_finite() || secs < 0.0 {
        return Err(format!("cannot sleep {secs} seconds"));
    }
    let wanted = Duration::from_secs_f64(secs.min(1e9));
    let limit = timeout.unwrap_or(Duration::MAX);
    tokio::select! {
        _ = tokio::time::sleep(wanted.min(limit)) => Ok(if wanted > limit { Ended::TimedOut } else { Ended::Exited(success()) }),
        _ = stop.cancelled() => Ok(Ended::Stopped),
    }
}
