//! Concurrent identical reads share one computation: the overview and the history are the
//! same answer for every dashboard that asks at once (an admin's, or one owner's), and
//! under load dozens ask at once. A request that finds the same read running waits for it
//! and answers what it answers; a request that finds none starts one. Nothing is kept once
//! a read has answered, so an answer is never older than the request that waited for it by
//! more than one read's time (`docs/api.md`, "The overview").

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::OnceCell;

use crate::error::{Error, Result};

/// The error a shared read ended with, given to each request that waited for it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct SharedError(String);

/// One read's answer, once it has one: the value, or its error's message.
type Answer<V> = Arc<OnceCell<Result<V, String>>>;

/// Reads in flight, by a key that names what they read.
pub(crate) struct Coalesce<V> {
    in_flight: Mutex<HashMap<String, Answer<V>>>,
}

impl<V> std::fmt::Debug for Coalesce<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let in_flight = self.in_flight.lock().map(|m| m.len()).unwrap_or(0);
        f.debug_struct("Coalesce")
            .field("in_flight", &in_flight)
            .finish()
    }
}

impl<V> Default for Coalesce<V> {
    fn default() -> Self {
        Coalesce {
            in_flight: Mutex::new(HashMap::new()),
        }
    }
}

impl<V: Clone> Coalesce<V> {
    /// The answer of the read `key` names: the one in flight, or `read`'s. If the request
    /// that runs a read goes away, a waiting one runs it again.
    pub(crate) async fn run<F, Fut>(&self, key: String, read: F) -> Result<V>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<V>>,
    {
        let cell = self
            .in_flight
            .lock()
            .expect("the map of reads in flight is never poisoned")
            .entry(key.clone())
            .or_default()
            .clone();
        let answer = cell
            .get_or_init(|| async {
                read().await.map_err(|e| {
                    // The request that ran the read logs its cause; the others say internal.
                    tracing::error!(error = %e, "a shared read failed");
                    e.to_string()
                })
            })
            .await
            .clone();
        // The next request reads afresh.
        let mut in_flight = self
            .in_flight
            .lock()
            .expect("the map of reads in flight is never poisoned");
        if in_flight.get(&key).is_some_and(|c| Arc::ptr_eq(c, &cell)) {
            in_flight.remove(&key);
        }
        drop(in_flight);
        answer.map_err(|message| Error::Internal(Box::new(SharedError(message))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[tokio::test]
    async fn concurrent_reads_of_one_key_run_once_and_later_ones_afresh() {
        let reads = Arc::new(Coalesce::<usize>::default());
        let runs = Arc::new(AtomicUsize::new(0));
        let ask = |key: &'static str| {
            let (reads, runs) = (reads.clone(), runs.clone());
            tokio::spawn(async move {
                reads
                    .run(key.to_owned(), || async move {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Ok(runs.fetch_add(1, Ordering::SeqCst))
                    })
                    .await
                    .unwrap()
            })
        };
        let together: Vec<_> = (0..8).map(|_| ask("overview")).collect();
        let other = ask("history");
        let mut answers = Vec::new();
        for t in together {
            answers.push(t.await.unwrap());
        }
        other.await.unwrap();
        assert!(
            answers.iter().all(|a| *a == answers[0]),
            "eight requests at once share one read: {answers:?}"
        );
        assert_eq!(runs.load(Ordering::SeqCst), 2, "one read per key");
        let later = ask("overview").await.unwrap();
        assert_eq!(
            runs.load(Ordering::SeqCst),
            3,
            "a later request reads afresh"
        );
        assert_ne!(later, answers[0]);
        assert!(
            reads.in_flight.lock().unwrap().is_empty(),
            "nothing is kept"
        );
    }

    #[tokio::test]
    async fn a_failed_read_fails_its_waiters_and_is_not_kept() {
        let reads = Coalesce::<u8>::default();
        let failed = reads
            .run("k".into(), || async {
                Err(Error::Internal(Box::new(SharedError("boom".into()))))
            })
            .await;
        assert!(matches!(failed, Err(Error::Internal(_))));
        assert_eq!(reads.run("k".into(), || async { Ok(7) }).await.unwrap(), 7);
    }
}
