//! Tests of the task state machine (docs/state_machine.md): the documented transitions are
//! the rows of `sked.task_transitions`, and every change of state the contract's functions
//! make, driven through them with time as input, is one of those rows.

use std::collections::{BTreeSet, HashMap};

use serde_json::json;
use sked_db::testing::TestDb;
use sked_types::TaskState;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{insert, task_id};

const STATE_MACHINE: &str = include_str!("../../docs/state_machine.md");

/// A change of state: from (None: the row was inserted) to.
type Pair = (Option<String>, String);

/// The rows of the table under `heading` in docs/state_machine.md, as trimmed cells.
fn doc_table(heading: &str) -> Vec<Vec<String>> {
    let section = STATE_MACHINE
        .split(&format!("\n{heading}\n"))
        .nth(1)
        .unwrap_or_else(|| panic!("docs/state_machine.md has a section {heading:?}"));
    section
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .skip(2) // the header and its separator
        .map(|line| {
            line.trim_matches('|')
                .split('|')
                .map(|cell| cell.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The states named in a cell of the transitions table: `—` is no state (an inserted row);
/// otherwise every backticked word, each of which must be a state.
fn states_of(cell: &str) -> Vec<Option<String>> {
    if cell == "—" {
        return vec![None];
    }
    let names: Vec<Option<String>> = cell
        .split('`')
        .skip(1)
        .step_by(2)
        .map(|name| {
            let state: TaskState = name.parse().unwrap_or_else(|e| {
                panic!("docs/state_machine.md, Transitions: a state cell names only states: {e}")
            });
            Some(state.as_str().to_owned())
        })
        .collect();
    assert!(
        !names.is_empty(),
        "docs/state_machine.md, Transitions: the cell {cell:?} names no state"
    );
    names
}

async fn view_pairs(pool: &PgPool) -> BTreeSet<Pair> {
    let rows: Vec<(Option<String>, String)> =
        sqlx::query_as("select from_state, to_state from sked.task_transitions")
            .fetch_all(pool)
            .await
            .unwrap();
    rows.into_iter().collect()
}

#[tokio::test]
async fn the_documented_transitions_are_the_rows_of_the_view() {
    let db = TestDb::new().await;
    let mut documented = BTreeSet::new();
    for row in doc_table("## Transitions") {
        for from in states_of(&row[0]) {
            for to in states_of(&row[1]) {
                let to = to.expect("a transition goes to a state");
                if from.as_deref() != Some(to.as_str()) {
                    documented.insert((from.clone(), to));
                }
            }
        }
    }
    let view = view_pairs(&db.pool).await;
    assert!(
        view.iter()
            .flat_map(|(from, to)| from.iter().chain([to]))
            .all(|state| state.parse::<TaskState>().is_ok()),
        "sked.task_transitions names only states: {view:?}"
    );
    assert_eq!(
        documented.difference(&view).collect::<Vec<_>>(),
        Vec::<&Pair>::new(),
        "every transition docs/state_machine.md shows is a row of sked.task_transitions"
    );
    assert_eq!(
        view.difference(&documented).collect::<Vec<_>>(),
        Vec::<&Pair>::new(),
        "every row of sked.task_transitions is shown in docs/state_machine.md"
    );
}

#[tokio::test]
async fn the_documented_states_are_claimable_and_final_as_the_code_says() {
    let db = TestDb::new().await;
    let rows = doc_table("## States");
    assert_eq!(
        rows.len(),
        TaskState::ALL.len(),
        "the States table has a row per state"
    );
    let into_running: BTreeSet<String> = view_pairs(&db.pool)
        .await
        .into_iter()
        .filter(|(_, to)| to == "running")
        .filter_map(|(from, _)| from)
        .collect();
    for state in TaskState::ALL {
        let row = rows
            .iter()
            .find(|row| row[0] == format!("`{state}`"))
            .unwrap_or_else(|| panic!("the States table has a row for {state}"));
        let (claimable, waits, unfinished): (bool, bool, bool) = sqlx::query_as(
            "select sked.state_is_claimable($1), sked.state_waits_to_run($1), \
                    sked.state_is_unfinished($1)",
        )
        .bind(state.as_str())
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(
            row[2].starts_with("yes"),
            claimable,
            "{state}: the doc's claimable column agrees with sked.state_is_claimable"
        );
        assert_eq!(
            into_running.contains(state.as_str()),
            claimable,
            "{state}: the claim starts exactly the claimable states (sked.task_transitions)"
        );
        assert_eq!(
            waits,
            claimable || state == TaskState::Blocked,
            "{state}: the states that wait to run are blocked and the claimable ones"
        );
        assert_eq!(
            unfinished,
            !state.is_final(),
            "{state}: sked.state_is_unfinished holds for exactly the states that are not final"
        );
        assert_eq!(
            row[3].starts_with("yes"),
            state.is_final(),
            "{state}: the doc's final column agrees with TaskState::is_final"
        );
    }
}

/// Watches the states of every task between calls of the contract's functions, and collects
/// each change it sees.
struct Observer {
    pool: PgPool,
    states: HashMap<Uuid, String>,
    seen: BTreeSet<Pair>,
}

impl Observer {
    async fn look(&mut self) {
        let rows: Vec<(Uuid, String)> = sqlx::query_as("select id, state from sked.tasks")
            .fetch_all(&self.pool)
            .await
            .unwrap();
        for (id, state) in rows {
            let before = self.states.insert(id, state.clone());
            if before.as_deref() != Some(state.as_str()) {
                self.seen.insert((before, state));
            }
        }
    }

    /// Runs one statement (a call of the contract) and looks at the states after it.
    async fn run(&mut self, sql: &str, id: Uuid) {
        sqlx::query(sqlx::AssertSqlSafe(sql.to_owned()))
            .bind(id)
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
        self.look().await;
    }

    /// Claims the due tasks of `queue` at now + `secs`; returns (id, attempt) of each.
    async fn claim(&mut self, worker: Uuid, queue: &str, secs: i32) -> Vec<(Uuid, i32)> {
        let claimed = sqlx::query_as(
            "select id, attempt from sked.tasks_claim($1, array[$2], '{}', 100, '30 s', null, null,
                                                    now() + make_interval(secs => $3))",
        )
        .bind(worker)
        .bind(queue)
        .bind(secs)
        .fetch_all(&self.pool)
        .await
        .unwrap();
        self.look().await;
        claimed
    }

    /// Claims the one due task of `queue` and finishes it with `outcome`.
    async fn run_once(&mut self, worker: Uuid, queue: &str, secs: i32, outcome: &str) -> Uuid {
        let claimed = self.claim(worker, queue, secs).await;
        assert_eq!(claimed.len(), 1, "one task of {queue} is due");
        self.finish(claimed[0], outcome).await;
        claimed[0].0
    }

    async fn finish(&mut self, (id, attempt): (Uuid, i32), outcome: &str) {
        let finished: Vec<(Uuid, String)> = sqlx::query_as(
            "select * from sked.tasks_finish(array[$1], array[$2], array[$3], '{null}', '{null}',
                                             '{null}', '{null}', '{null}', '{null}')",
        )
        .bind(id)
        .bind(attempt)
        .bind(outcome)
        .fetch_all(&self.pool)
        .await
        .unwrap();
        assert_eq!(
            finished.len(),
            1,
            "the attempt of {id} is finished {outcome}"
        );
        self.look().await;
    }
}

async fn workflow(pool: &PgPool, queue: &str, child_rule: &str, parent_attempts: i32) -> Uuid {
    sqlx::query_scalar("select sked.workflow_submit($1)")
        .bind(json!({"name": queue, "tasks": [
            {"name": "p", "command": ["true"], "queue": queue, "max_attempts": parent_attempts},
            {"name": "c", "command": ["true"], "queue": queue, "depends_on": ["p"],
             "trigger_rule": child_rule, "max_attempts": 1},
        ]}))
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn every_change_of_state_the_functions_make_is_in_the_table() {
    let db = TestDb::new().await;
    let pool = db.pool.clone();
    let worker = Uuid::new_v4();
    sqlx::query(
        "select sked.worker_register($1, 'w', 'h', 1, 'v', '{default}', '{}', 64, '30 s', null, null)",
    )
    .bind(worker)
    .execute(&pool)
    .await
    .unwrap();
    let mut o = Observer {
        pool: pool.clone(),
        states: HashMap::new(),
        seen: BTreeSet::new(),
    };
    let cancel = "select sked.task_cancel($1)";
    let retry = "select sked.task_retry($1)";
    // The rescue an hour or two from now, when the leases of the claims before have expired.
    let rescue = |hours: i32| {
        format!(
            "select count(*) from sked.tasks_rescue(p_now => now() + interval '{hours} hours')
              where $1 is not null"
        )
    };

    // A task: retried after a failure, interrupted, succeeded, run again; failed at its
    // last attempt, run again; cancelled while it runs, run again; cancelled while waiting.
    let a = insert(&pool, "(command, queue) values (array['true'], 'a')").await;
    o.look().await;
    o.run_once(worker, "a", 0, "failed").await;
    o.run_once(worker, "a", 3600, "interrupted").await;
    o.run_once(worker, "a", 0, "succeeded").await;
    o.run(retry, a).await;
    o.run_once(worker, "a", 0, "timed_out").await;
    o.run(retry, a).await;
    let running = o.claim(worker, "a", 0).await[0];
    o.run(cancel, a).await;
    o.finish(running, "failed").await;
    o.run(retry, a).await;
    o.run(cancel, a).await;
    // Cancelled in retry.
    let d = insert(&pool, "(command, queue) values (array['true'], 'd')").await;
    o.look().await;
    o.run_once(worker, "d", 0, "failed").await;
    o.run(cancel, d).await;
    // Rescued: retried, failed at its last attempt, cancelled on request.
    let b = insert(
        &pool,
        "(command, queue, max_attempts) values (array['true'], 'b', 2)",
    )
    .await;
    o.look().await;
    o.claim(worker, "b", 0).await;
    o.run(&rescue(1), b).await;
    o.claim(worker, "b", 3600).await;
    o.run(&rescue(2), b).await;
    o.run(retry, b).await;
    o.claim(worker, "b", 0).await;
    o.run(cancel, b).await;
    o.run(&rescue(1), b).await;

    // Workflows: released, failed upstream, skipped, re-run, cancelled.
    let w = workflow(&pool, "wa", "all_success", 1).await;
    let (p, c) = (task_id(&pool, w, "p").await, task_id(&pool, w, "c").await);
    o.look().await;
    o.run_once(worker, "wa", 0, "succeeded").await;
    o.run_once(worker, "wa", 0, "failed").await;
    o.run(retry, p).await; // c waits for p again
    o.run(retry, c).await; // c is failed: back to blocked while p is waiting
    o.run_once(worker, "wa", 0, "failed").await; // p fails: c upstream_failed
    o.run(retry, p).await;
    o.run(
        "select sked.workflow_cancel(workflow_id) from sked.tasks where id = $1",
        c,
    )
    .await;
    o.run(
        "select sked.workflow_retry(workflow_id) from sked.tasks where id = $1",
        c,
    )
    .await;
    let w = workflow(&pool, "wb", "one_failed", 1).await;
    let p = task_id(&pool, w, "p").await;
    o.look().await;
    o.run_once(worker, "wb", 0, "succeeded").await; // c skipped
    o.run(retry, p).await;

    // Shards: the parent succeeds with them and runs again; a pinned shard without its
    // worker fails.
    let s = insert(
        &pool,
        "(command, queue, shard_total) values (array['true'], 's', 2)",
    )
    .await;
    o.look().await;
    let shards = o.claim(worker, "s", 2).await;
    assert_eq!(
        shards.len(),
        2,
        "shards that are not new are claimed together"
    );
    for shard in shards {
        o.finish(shard, "succeeded").await;
    }
    o.run(retry, s).await;
    // A broadcast needs a live worker of its queue.
    o.run("select sked.worker_touch($1)", worker).await;
    let broadcast = insert(
        &pool,
        "(command, queue, broadcast) values (array['true'], 'default', true)",
    )
    .await;
    o.look().await;
    o.run("select sked.worker_deregister($1)", worker).await;
    o.run(&rescue(1), broadcast).await;

    let view = view_pairs(&pool).await;
    assert_eq!(
        o.seen.difference(&view).collect::<Vec<_>>(),
        Vec::<&Pair>::new(),
        "every change of state the functions made is a row of sked.task_transitions"
    );
    // The changes this test does not make: retries and re-runs whose trigger rule meets
    // parents that ended since, and a pinned shard that failed once before its worker left.
    let not_driven: BTreeSet<Pair> = [
        ("failed", "upstream_failed"),
        ("failed", "skipped"),
        ("cancelled", "upstream_failed"),
        ("cancelled", "skipped"),
        ("succeeded", "upstream_failed"),
        ("succeeded", "skipped"),
        ("upstream_failed", "skipped"),
        ("skipped", "upstream_failed"),
        ("skipped", "waiting"),
        ("retry", "failed"),
    ]
    .into_iter()
    .map(|(from, to)| (Some(from.to_owned()), to.to_owned()))
    .collect();
    let missed: Vec<&Pair> = view
        .difference(&o.seen)
        .filter(|pair| !not_driven.contains(*pair))
        .collect();
    assert_eq!(
        missed,
        Vec::<&Pair>::new(),
        "the test drives every other transition of sked.task_transitions"
    );
}
