//! Batched writes that one bad row cannot sink: a batch the database refuses for good is
//! split in halves, each written on its own, down to the single rows that cause the refusal,
//! so every other row is written. Used by the completer (results) and the log shipper.
//!
//! A statement is atomic, so a refused batch wrote nothing and its halves can be written again
//! safely. Transient errors (the connection, a serialization failure) are retried with a
//! growing delay instead, as many times as the caller allows. Narrowing one bad row in a batch
//! of n costs about 2·log2(n) extra statements.

use std::future::Future;
use std::ops::Range;
use std::time::Duration;

use sked_db::DbError;

/// How transient errors are retried.
#[derive(Debug, Clone, Copy)]
pub struct Retry {
    /// Most tries of one statement (`None`: until it succeeds or fails for good).
    pub tries: Option<u32>,
    pub first_delay: Duration,
    pub max_delay: Duration,
}

/// What became of a batch: each row's answer (`None` for a row that was not written), the
/// rows the database refused for good, each alone with its error, and the ranges of rows whose
/// transient errors outlasted the retries, with the last one.
#[derive(Debug)]
pub struct Written<O> {
    pub answers: Vec<Option<O>>,
    pub refused: Vec<(usize, DbError)>,
    pub given_up: Vec<(Range<usize>, DbError)>,
}

/// Writes `rows` with `write`, one statement per call, which answers one value per row in
/// order. A permanent error splits the batch in halves, written first half first, down to
/// single rows.
pub async fn write<'a, T, O, W, F>(rows: &'a [T], retry: Retry, mut write: W) -> Written<O>
where
    W: FnMut(&'a [T]) -> F,
    F: Future<Output = Result<Vec<O>, DbError>>,
{
    let mut answers: Vec<Option<O>> = std::iter::repeat_with(|| None).take(rows.len()).collect();
    let mut refused = Vec::new();
    let mut given_up = Vec::new();
    // Ranges still to write, the next one last.
    let mut todo: Vec<Range<usize>> = Vec::new();
    todo.push(0..rows.len());
    while let Some(range) = todo.pop() {
        if range.is_empty() {
            continue;
        }
        let mut delay = retry.first_delay;
        let mut tries = 0;
        loop {
            tries += 1;
            match write(&rows[range.clone()]).await {
                Ok(written) => {
                    for (slot, answer) in answers[range.clone()].iter_mut().zip(written) {
                        *slot = Some(answer);
                    }
                    break;
                }
                Err(e) if e.is_transient() && retry.tries.is_none_or(|most| tries < most) => {
                    tracing::warn!(error = %e, rows = range.len(), "a batched write failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(retry.max_delay);
                }
                Err(e) if !e.is_transient() && range.len() > 1 => {
                    tracing::warn!(error = %e, rows = range.len(), "a batched write was refused; writing it in halves to find the rows that cause it");
                    let middle = range.start + range.len() / 2;
                    todo.push(middle..range.end);
                    todo.push(range.start..middle);
                    break;
                }
                Err(e) if e.is_transient() => {
                    given_up.push((range, e));
                    break;
                }
                Err(e) => {
                    refused.push((range.start, e));
                    break;
                }
            }
        }
    }
    Written {
        answers,
        refused,
        given_up,
    }
}
