//! Tests of the SQL contract: constraints, submission functions, claims, fencing, rescue.

use std::collections::HashSet;
use std::time::Duration;

use sked_db::testing::TestDb;
use sked_db::worker::{Finished, Free, Outcome, Position};
use sked_types::TaskState;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::insert;

async fn count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sked.tasks")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn bad_rows_are_rejected_with_a_readable_message_and_leave_nothing() {
    let db = TestDb::new().await;
    let cases: &[(&str, &str)] = &[
        (
            "(command) values (array[]::text[])",
            "tasks_command_must_not_be_empty",
        ),
        (
            "(command) values (array[''])",
            "tasks_command_must_not_be_empty",
        ),
        (
            "(queue) values ('q')",
            "tasks_command_or_artifact_is_required",
        ),
        (
            "(command, max_attempts) values (array['true'], 0)",
            "tasks_max_attempts_must_be_at_least_1",
        ),
        (
            "(command, timeout) values (array['true'], '-1 s')",
            "tasks_timeout_must_be_positive",
        ),
        (
            "(command, env) values (array['true'], '{\"A\": 1}')",
            "tasks_env_must_be_an_object_of_strings",
        ),
        (
            "(command, env) values (array['true'], '[\"A\"]')",
            "tasks_env_must_be_an_object_of_strings",
        ),
        (
            "(command, state) values (array['true'], 'bogus')",
            "tasks_state_is_known",
        ),
        (
            "(command, state) values (array['true'], 'running')",
            "tasks_lease_is_set_iff_running",
        ),
        (
            "(command, state, lease_expires_at) values (array['true'], 'running', now())",
            "tasks_running_requires_worker_and_lease",
        ),
        (
            "(command, state) values (array['true'], 'succeeded')",
            "tasks_finished_at_is_set_iff_state_is_final",
        ),
        (
            "(command, queue) values (array['true'], 'bad queue!')",
            "tasks_queue_name_must_be_1_to_64_word_characters",
        ),
        (
            "(command, kind) values (array['true'], 'teleport')",
            "tasks_kind_is_known",
        ),
        (
            "(artifact_url) values ('file:///bin/true')",
            "tasks_artifact_requires_sha256",
        ),
        (
            "(artifact_url, artifact_sha256) values ('ftp://x', repeat('a', 64))",
            "tasks_artifact_url_scheme_must_be_file_http_https_or_pg",
        ),
        (
            "(artifact_url, artifact_sha256) values ('file:///x', 'abc')",
            "tasks_artifact_sha256_must_be_64_lowercase_hex",
        ),
        (
            "(command, artifact_url, artifact_sha256) values (array['x'], 'file:///x', repeat('a', 64))",
            "tasks_command_and_artifact_are_exclusive",
        ),
        (
            "(command, backoff_base) values (array['true'], '0 s')",
            "tasks_backoff_must_be_positive",
        ),
    ];
    for (values, constraint) in cases {
        let err = sqlx::query(sqlx::AssertSqlSafe(format!(
            "insert into sked.tasks {values}"
        )))
        .execute(&db.pool)
        .await
        .expect_err(&format!("{values} must be rejected"));
        let message = err
            .as_database_error()
            .map(|e| e.message().to_owned())
            .unwrap_or_default();
        assert!(
            message.contains(constraint),
            "{values}: expected {constraint}, got {message}"
        );
    }
    // A malformed value is rejected by its type before any constraint, also readably.
    let err = sqlx::query(
        "insert into sked.tasks (command, next_run_at) values (array['true'], 'not a time')",
    )
    .execute(&db.pool)
    .await
    .unwrap_err();
    assert!(err.to_string().contains("invalid input syntax"), "{err}");
    // One bad row in a multi-row insert rejects the whole statement.
    let err =
        sqlx::query("insert into sked.tasks (command) values (array['true']), (array[]::text[])")
            .execute(&db.pool)
            .await;
    assert!(err.is_err());
    assert_eq!(count(&db.pool).await, 0, "nothing half-written remains");
}

#[tokio::test]
async fn the_submit_function_uses_the_tables_defaults_and_answers_a_key_with_its_task() {
    let db = TestDb::new().await;
    let by_insert = insert(&db.pool, "(command) values (array['echo','x'])").await;
    let by_fn: Uuid = sqlx::query_scalar("select sked.task_submit(command => array['echo','x'])")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let defaults = "select to_jsonb(d) from (
                      select owner, queue, priority, kind, args, env, labels, max_attempts, backoff_base,
                             backoff_max, state, attempt, timeout, input from sked.tasks where id = $1) d";
    let a: serde_json::Value = sqlx::query_scalar(defaults)
        .bind(by_insert)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let b: serde_json::Value = sqlx::query_scalar(defaults)
        .bind(by_fn)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(a, b, "task_submit's defaults are the table's");

    let first: Uuid = sqlx::query_scalar(
        "select sked.task_submit(command => array['a'], idempotency_key => 'order-1')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let second: Uuid = sqlx::query_scalar(
        "select sked.task_submit(command => array['a'], idempotency_key => 'order-1')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        first, second,
        "a key names its task (the rule: tests/it/idempotency.rs)"
    );

    let delayed_id: Uuid = sqlx::query_scalar(
        "select sked.task_submit(command => array['x'], delay => interval '15 minutes')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let delayed: f64 = sqlx::query_scalar(
        "select extract(epoch from next_run_at - created_at)::float8 from sked.tasks where id = $1",
    )
    .bind(delayed_id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        (899.0..901.0).contains(&delayed),
        "delay => 15 minutes: {delayed}"
    );
}

#[tokio::test]
async fn bulk_submit_and_copy_insert_many_tasks_with_one_notification() {
    let db = TestDb::new().await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&db.pool)
        .await
        .unwrap();
    listener.listen("sked_tasks").await.unwrap();
    let body = serde_json::json!([
        {"command": ["echo", "1"], "queue": "a"},
        {"kind": "noop", "queue": "b", "idempotency_key": "k"},
        {"kind": "noop", "queue": "b", "idempotency_key": "k"},
        {"command": ["echo", "3"], "delay": "1 hour", "env": {"X": "y"}}
    ]);
    let ids: Vec<Uuid> = sqlx::query_scalar("select id from sked.tasks_submit($1)")
        .bind(&body)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(ids.len(), 4, "one id per input, in order");
    assert_eq!(
        ids[1], ids[2],
        "a repeated key in one batch names the same task"
    );
    assert_eq!(count(&db.pool).await, 3);
    let queues: Vec<String> = sqlx::query_scalar(
        "select t.queue from unnest($1::uuid[]) with ordinality as u(id, n)
               join sked.tasks t on t.id = u.id where u.n <> 3 order by u.n",
    )
    .bind(&ids)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(queues, vec!["a", "b", "default"]);

    let n = tokio::time::timeout(Duration::from_secs(2), listener.recv())
        .await
        .unwrap()
        .unwrap();
    let mut named: Vec<&str> = n.payload().split(',').collect();
    named.sort();
    assert_eq!(
        named,
        vec!["a", "b", "default"],
        "one notification names the queues"
    );
    let extra = tokio::time::timeout(Duration::from_millis(300), listener.recv()).await;
    assert!(
        extra.is_err(),
        "one notification per statement, not per row"
    );

    let bad = serde_json::json!([{"kind": "noop"}, {"command": []}]);
    assert!(
        sqlx::query("select * from sked.tasks_submit($1)")
            .bind(&bad)
            .execute(&db.pool)
            .await
            .is_err()
    );
    assert_eq!(
        count(&db.pool).await,
        3,
        "a bad task rejects the whole batch"
    );

    let mut conn = db.pool.acquire().await.unwrap();
    let mut copy = conn
        .copy_in_raw("copy sked.tasks (command, queue) from stdin")
        .await
        .unwrap();
    copy.send("{sh,-c,\"echo copied\"}\tcopied\n{true}\tcopied\n".as_bytes())
        .await
        .unwrap();
    let rows = copy.finish().await.unwrap();
    assert_eq!(rows, 2);
    let copied: i64 = sqlx::query_scalar(
        "select count(*) from sked.tasks where queue = 'copied' and state = 'waiting'",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(copied, 2, "COPY into the table makes waiting tasks");
}

/// A function that turns sequential scans off makes every plan that still needs one (a small
/// table without an index for the question: `sked.workers` in the rescue) cost over 10^10,
/// far past `jit_above_cost`, and PostgreSQL then compiles the statement to machine code on
/// every run: 26 ms a rescue instead of 1 ms, run by every worker. Each such function turns
/// JIT off too.
#[tokio::test]
async fn functions_that_turn_sequential_scans_off_also_turn_jit_off() {
    let db = TestDb::new().await;
    let seqscan_off: i64 = sqlx::query_scalar(
        "select count(*) from pg_proc p
          where p.pronamespace = 'sked'::regnamespace
            and 'enable_seqscan=off' = any(p.proconfig)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        seqscan_off > 20,
        "the hot-path functions are found: {seqscan_off}"
    );
    let compiled: Vec<String> = sqlx::query_scalar(
        "select p.proname::text from pg_proc p
          where p.pronamespace = 'sked'::regnamespace
            and 'enable_seqscan=off' = any(p.proconfig)
            and not 'jit=off' = any(p.proconfig)
          order by 1",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        compiled,
        Vec::<String>::new(),
        "these functions turn sequential scans off but leave JIT on"
    );
}

#[tokio::test]
async fn concurrent_claimers_claim_each_task_exactly_once() {
    let db = TestDb::new().await;
    const TASKS: i64 = 5000;
    sqlx::query("insert into sked.tasks (kind) select 'noop' from generate_series(1, $1)")
        .bind(TASKS)
        .execute(&db.pool)
        .await
        .unwrap();
    let mut claimers = Vec::new();
    for _ in 0..8 {
        let pool = db.pool.clone();
        claimers.push(tokio::spawn(async move {
            let worker = Uuid::new_v4();
            let queues = vec!["default".to_string()];
            let mut mine = Vec::new();
            loop {
                let rows = sked_db::worker::claim(
                    &pool,
                    worker,
                    &queues,
                    &[],
                    37,
                    Duration::from_secs(30),
                )
                .await
                .unwrap();
                if rows.is_empty() {
                    return mine;
                }
                let done: Vec<Finished> = rows
                    .iter()
                    .map(|r| finished(r.id, r.attempt, Outcome::Succeeded))
                    .collect();
                let states = sked_db::worker::finish(&pool, &done).await.unwrap();
                assert!(
                    states.iter().all(|s| *s == Some(TaskState::Succeeded)),
                    "every fenced finish lands"
                );
                mine.extend(rows.into_iter().map(|r| r.id));
            }
        }));
    }
    let mut all = Vec::new();
    let mut busy = 0;
    for c in claimers {
        let mine = c.await.unwrap();
        busy += usize::from(!mine.is_empty());
        all.extend(mine);
    }
    let unique: HashSet<Uuid> = all.iter().copied().collect();
    assert_eq!(
        all.len() as i64,
        TASKS,
        "every task was claimed exactly once in total"
    );
    assert_eq!(unique.len(), all.len(), "no task was claimed twice");
    assert!(busy > 1, "the claimers actually raced");
    let succeeded: i64 = sqlx::query_scalar(
        "select count(*) from sked.tasks where state = 'succeeded' and attempt = 1",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(succeeded, TASKS);
}

/// Claims up to `limit` tasks of `default` for `worker`, after `after` when given; the ids
/// taken in claim order, and the position of the last.
async fn claim_ids(
    pool: &PgPool,
    worker: Uuid,
    limit: i32,
    after: Option<Position>,
) -> (Vec<Uuid>, Option<Position>) {
    let claim = sked_db::worker::claim_after(
        pool,
        worker,
        &["default".to_string()],
        &[],
        limit,
        Duration::from_secs(30),
        Free::default(),
        after,
    )
    .await
    .unwrap();
    let mut taken: Vec<(i32, Uuid)> = claim.tasks.iter().map(|t| (-t.priority, t.id)).collect();
    taken.sort();
    (taken.into_iter().map(|(_, id)| id).collect(), claim.last)
}

#[tokio::test]
async fn a_claim_from_a_position_takes_what_follows_it_and_more_urgent_tasks_only() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let worker = Uuid::new_v4();
    // Four tasks of priority 0, due an hour ago, a second apart.
    let mut zero = Vec::new();
    for s in 0..4 {
        zero.push(
            insert(
                pool,
                &format!(
                    "(kind, next_run_at) values ('noop', now() - interval '1 hour' + interval '{s} s')"
                ),
            )
            .await,
        );
    }
    let (first, position) = claim_ids(pool, worker, 2, None).await;
    assert_eq!(
        first,
        zero[..2],
        "a claim from the front takes the first two in claim order"
    );
    let position = position.expect("the claim names the position of its last task");
    assert_eq!(position.id, zero[1]);

    // Behind the position: a task of the same priority due before it (its transaction began
    // earlier). Ahead of it: a more urgent task, and a less urgent one.
    let behind = insert(
        pool,
        "(kind, next_run_at) values ('noop', now() - interval '1 hour' + interval '500 ms')",
    )
    .await;
    let urgent = insert(
        pool,
        "(kind, priority, next_run_at) values ('noop', 5, now())",
    )
    .await;
    let later = insert(pool, "(kind, priority) values ('noop', -1)").await;

    let (one, _) = claim_ids(pool, worker, 1, Some(position)).await;
    assert_eq!(
        one,
        [urgent],
        "a more urgent task comes first, also from a position"
    );
    let (rest, last) = claim_ids(pool, worker, 10, Some(position)).await;
    assert_eq!(
        rest,
        [zero[2], zero[3], later],
        "from the position: the rest of its priority, then the lower priorities; not the task behind it"
    );
    assert_eq!(
        last.map(|p| p.id),
        Some(later),
        "the last position is the last task in claim order"
    );
    let (front, _) = claim_ids(pool, worker, 10, None).await;
    assert_eq!(
        front,
        [behind],
        "the claim from the front finds the task behind the position"
    );
    let (none, _) = claim_ids(pool, worker, 10, last).await;
    assert!(none.is_empty(), "nothing is left");

    // From a position of a lower priority, a whole higher priority is more urgent.
    let again = insert(
        pool,
        "(kind, next_run_at) values ('noop', now() - interval '2 hours')",
    )
    .await;
    let (urgent_again, _) = claim_ids(pool, worker, 10, last).await;
    assert_eq!(
        urgent_again,
        [again],
        "a task of a higher priority than the position is taken"
    );
}

#[tokio::test]
async fn under_an_open_snapshot_a_claim_from_a_position_reads_no_entry_of_the_tasks_claimed_before()
{
    let db = TestDb::new().await;
    let pool = &db.pool;
    let worker = Uuid::new_v4();
    sqlx::query("insert into sked.tasks (kind) select 'noop' from generate_series(1, 3000)")
        .execute(pool)
        .await
        .unwrap();
    // A session holds a snapshot: no entry of a task claimed from now on can be removed.
    let mut holder = pool.acquire().await.unwrap();
    sqlx::query("begin isolation level repeatable read")
        .execute(&mut *holder)
        .await
        .unwrap();
    sqlx::query("select count(*) from sked.tasks")
        .execute(&mut *holder)
        .await
        .unwrap();

    let mut position = None;
    for _ in 0..20 {
        let (ids, last) = claim_ids(pool, worker, 100, position).await;
        assert_eq!(ids.len(), 100);
        let done: Vec<Finished> = ids
            .iter()
            .map(|&id| finished(id, 1, Outcome::Succeeded))
            .collect();
        sked_db::worker::finish(pool, &done).await.unwrap();
        position = last;
    }
    // The entries of claimable tasks one claim returns from the claim index (including those
    // of rows that are no longer claimable, which only a visit of the table tells apart).
    // The backend's counters of the transaction also hold what its earlier transactions read
    // until it flushes them to the shared statistics (at most once a second), so the count is
    // the difference over the claim, inside one transaction (no flush happens within one).
    async fn entries_read(pool: &PgPool, worker: Uuid, after: Option<Position>) -> i64 {
        let returned = "select pg_stat_get_xact_tuples_returned('sked.tasks_claimable'::regclass)";
        let mut tx = pool.begin().await.unwrap();
        let before: i64 = sqlx::query_scalar(returned)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        let took: i64 = sqlx::query_scalar(
            "select count(*) from sked.tasks_claim($1, '{default}', '{}', 100, '30 s', null, null,
                                                   $2, $3, $4)",
        )
        .bind(worker)
        .bind(after.map(|p| p.priority))
        .bind(after.map(|p| p.next_run_at))
        .bind(after.map(|p| p.id))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        assert_eq!(took, 100);
        let after: i64 = sqlx::query_scalar(returned)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        after - before
    }
    let from_front = entries_read(pool, worker, None).await;
    let from_position = entries_read(pool, worker, position).await;
    assert!(
        from_front >= 2000,
        "from the front the claim walks the 2,000 claimed tasks' entries: {from_front}"
    );
    assert!(
        from_position <= 110,
        "from the position it reads the entries it takes: {from_position}"
    );
    sqlx::query("rollback").execute(&mut *holder).await.unwrap();
}

fn finished(id: Uuid, attempt: i32, outcome: Outcome) -> Finished {
    Finished {
        id,
        attempt,
        outcome,
        exit_code: Some(if outcome == Outcome::Succeeded { 0 } else { 1 }),
        error: None,
        stdout_tail: None,
        stderr_tail: None,
        output_sha256: None,
        output: None,
    }
}

#[tokio::test]
async fn a_stale_attempt_cannot_finish_a_task_that_was_taken_over() {
    let db = TestDb::new().await;
    let id = insert(&db.pool, "(command) values (array['true'])").await;
    let q = vec!["default".to_string()];
    let (zombie, rescuer) = (Uuid::new_v4(), Uuid::new_v4());
    let first = sked_db::worker::claim(&db.pool, zombie, &q, &[], 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(first[0].attempt, 1);
    // The lease runs out (time is an input: rescue as of one minute from now).
    let rescued: Vec<(Uuid, String)> =
        sqlx::query_as("select * from sked.tasks_rescue(p_now => now() + interval '1 minute')")
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        rescued,
        vec![(id, "retry".to_string())],
        "an expired lease is a failed attempt with retries left"
    );
    let second: Vec<i32> = sqlx::query_scalar(
        "select attempt from sked.tasks_claim($1, '{default}', '{}', 1, '30 s', now() + interval '1 minute')",
    )
    .bind(rescuer)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        second,
        vec![2],
        "the rescued task is claimed again as attempt 2"
    );

    let late = sked_db::worker::finish(&db.pool, &[finished(id, 1, Outcome::Succeeded)])
        .await
        .unwrap();
    assert_eq!(
        late,
        vec![None],
        "the stale attempt's result is refused (lease lost)"
    );
    let (st, attempt): (String, i32) =
        sqlx::query_as("select state, attempt from sked.tasks where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (st.as_str(), attempt),
        ("running", 2),
        "the stale result changed nothing"
    );
    let renewed =
        sked_db::worker::renew_leases(&db.pool, zombie, &[(id, 1)], Duration::from_secs(30))
            .await
            .unwrap();
    assert!(
        renewed.is_empty(),
        "the zombie cannot renew a lease it lost"
    );
    let now = sked_db::worker::finish(&db.pool, &[finished(id, 2, Outcome::Succeeded)])
        .await
        .unwrap();
    assert_eq!(now, vec![Some(TaskState::Succeeded)]);
}

#[tokio::test]
async fn backoff_doubles_from_the_base_up_to_the_cap() {
    let db = TestDb::new().await;
    let id = insert(
        &db.pool,
        "(command, max_attempts, backoff_max) values (array['false'], 5, '3 s')",
    )
    .await;
    let t0 = "2030-01-01 00:00:00+00";
    let mut delays = Vec::new();
    for attempt in 1..=5 {
        // Claim as of the moment the task is due, then fail it at that same moment.
        let due: chrono::DateTime<chrono::Utc> = sqlx::query_scalar(
            "select greatest(next_run_at, $2::timestamptz) from sked.tasks where id = $1",
        )
        .bind(id)
        .bind(t0)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        let claimed: i64 = sqlx::query_scalar(
            "select count(*) from sked.tasks_claim(gen_random_uuid(), '{default}', '{}', 1, '30 s', $1)",
        )
        .bind(due)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        assert_eq!(claimed, 1, "attempt {attempt} is claimable once due");
        let state: String = sqlx::query_scalar(
            "select state from sked.tasks_finish(array[$1]::uuid[], array[$2], array['failed'], array[1], array['x'],
                                                 array[null]::text[], array[null]::text[], array[null]::text[],
                                                 array[null]::jsonb[], $3)",
        )
        .bind(id)
        .bind(attempt)
        .bind(due)
        .fetch_one(&db.pool)
        .await
        .unwrap();
        if attempt < 5 {
            assert_eq!(state, "retry");
            let delay: f64 = sqlx::query_scalar("select extract(epoch from next_run_at - $2::timestamptz)::float8 from sked.tasks where id = $1")
                .bind(id)
                .bind(due)
                .fetch_one(&db.pool)
                .await
                .unwrap();
            delays.push(delay);
        } else {
            assert_eq!(state, "failed", "the last failure is final");
        }
    }
    for (delay, base) in delays.iter().zip([1.0, 2.0, 3.0, 3.0]) {
        assert!(
            *delay >= base && *delay <= base * 1.1 + 1e-6,
            "delay {delay} should be {base} s plus up to 10% jitter: {delays:?}"
        );
    }
}

#[tokio::test]
async fn retry_reruns_a_finished_task_and_keeps_its_history() {
    let db = TestDb::new().await;
    let id = insert(
        &db.pool,
        "(command, max_attempts) values (array['true'], 1)",
    )
    .await;
    let q = vec!["default".to_string()];
    let w = Uuid::new_v4();
    sked_db::worker::claim(&db.pool, w, &q, &[], 1, Duration::from_secs(30))
        .await
        .unwrap();
    sked_db::worker::finish(&db.pool, &[finished(id, 1, Outcome::Failed)])
        .await
        .unwrap();
    let not_final: String = sqlx::query_scalar("select sked.task_retry($1)")
        .bind(insert(&db.pool, "(command, queue) values (array['true'], 'other')").await)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        not_final, "waiting",
        "retry of an unfinished task changes nothing and reports its state"
    );
    let after: String = sqlx::query_scalar("select sked.task_retry($1)")
        .bind(id)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, "waiting");
    let (attempt, max): (i32, i32) =
        sqlx::query_as("select attempt, max_attempts from sked.tasks where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (attempt, max),
        (1, 2),
        "the attempt count stays; one more attempt is granted"
    );
    let rows = sked_db::worker::claim(&db.pool, w, &q, &[], 1, Duration::from_secs(30))
        .await
        .unwrap();
    assert_eq!(rows[0].attempt, 2);
    sked_db::worker::finish(&db.pool, &[finished(id, 2, Outcome::Succeeded)])
        .await
        .unwrap();
    sqlx::query("select sked.task_retry($1)")
        .bind(id)
        .execute(&db.pool)
        .await
        .unwrap();
    let history: Vec<(i32, String)> = sqlx::query_as("select attempt, outcome from sked.task_attempt_history where task_id = $1 order by attempt")
        .bind(id)
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        history,
        vec![(1, "failed".into()), (2, "succeeded".into())],
        "re-running keeps every attempt"
    );
}

#[tokio::test]
async fn schema_check_refuses_older_and_newer_databases() {
    let empty = TestDb::empty().await;
    let err = sked_db::check_schema(&empty.pool).await.unwrap_err();
    assert!(
        err.to_string().contains("sked migrate"),
        "an older schema asks for a migration: {err}"
    );
    let db = TestDb::new().await;
    sked_db::check_schema(&db.pool)
        .await
        .expect("a migrated database matches");
    sqlx::query(
        "insert into _sqlx_migrations (version, description, success, checksum, execution_time)
                 values (99991231000000, 'from the future', true, '\\x00', 0)",
    )
    .execute(&db.pool)
    .await
    .unwrap();
    let err = sked_db::check_schema(&db.pool).await.unwrap_err();
    assert!(
        err.to_string().contains("newer"),
        "a newer schema is refused: {err}"
    );
}

#[tokio::test]
async fn pruning_deletes_old_finished_tasks_with_their_history_and_nothing_else() {
    let db = TestDb::new().await;
    let old = insert(&db.pool, "(command) values (array['true'])").await;
    let waiting = insert(&db.pool, "(command) values (array['true'])").await;
    sqlx::query("select sked.task_cancel($1)")
        .bind(old)
        .execute(&db.pool)
        .await
        .unwrap();
    sqlx::query(
        "insert into sked.task_logs (task_id, attempt, stream, data) values ($1, 1, 'stdout', 'x')",
    )
    .bind(old)
    .execute(&db.pool)
    .await
    .unwrap();
    let none: i32 = sqlx::query_scalar("select sked.tasks_prune(now() - interval '1 day')")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        none, 0,
        "a task finished just now is younger than the cut-off"
    );
    let pruned: i32 = sqlx::query_scalar("select sked.tasks_prune(now() + interval '1 second')")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(pruned, 1, "only the finished task goes");
    let left: Vec<Uuid> = sqlx::query_scalar("select id from sked.tasks")
        .fetch_all(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, vec![waiting], "unfinished tasks are never pruned");
    let logs: i64 = sqlx::query_scalar("select count(*) from sked.task_logs")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(logs, 0, "the pruned task's logs go with it");
}

#[tokio::test]
async fn two_prunes_at_once_leave_no_workflow_row_behind() {
    let db = TestDb::new().await;
    let workflow: Uuid = sqlx::query_scalar(
        r#"select sked.workflow_submit('{"name": "w", "tasks": [
             {"name": "a", "command": ["true"]}, {"name": "b", "command": ["true"]}]}')"#,
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    sqlx::query("select sked.workflow_cancel($1)")
        .bind(workflow)
        .execute(&db.pool)
        .await
        .unwrap();
    // The first prune takes one of the workflow's two tasks and has not committed yet.
    let mut first = db.pool.begin().await.unwrap();
    let took: i32 = sqlx::query_scalar("select sked.tasks_prune(now() + interval '1 second', 1)")
        .fetch_one(&mut *first)
        .await
        .unwrap();
    assert_eq!(took, 1);
    // A second one meanwhile waits for it, then takes the other task and the workflow row;
    // without waiting it would see the first's task still there and keep the row forever.
    let second = tokio::spawn({
        let pool = db.pool.clone();
        async move {
            sqlx::query_scalar::<_, i32>("select sked.tasks_prune(now() + interval '1 second')")
                .fetch_one(&pool)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second prune waits for the first"
    );
    first.commit().await.unwrap();
    assert_eq!(second.await.unwrap().unwrap(), 1);
    let left: i64 = sqlx::query_scalar("select count(*) from sked.workflows")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(left, 0, "the workflow row went with its last task");
}

#[tokio::test]
async fn large_batches_go_in_by_copy_with_every_character_and_default_intact() {
    let db = TestDb::new().await;
    let tricky = [
        "tab\there",
        "new\nline",
        "back\\slash",
        "\"quoted\"",
        "{braces},commas",
        "\\N",
        "NULL",
        "",
        "ünïcødé ✓",
        "cr\rlf",
    ];
    let mut tasks: Vec<sked_types::SubmitTask> = (0..100)
        .map(|i| sked_types::SubmitTask {
            command: Some(vec!["echo".into(), format!("task {i}")]),
            ..Default::default()
        })
        .collect();
    tasks[7] = sked_types::SubmitTask {
        command: Some(vec!["printf".into(), "%s".into()]),
        args: tricky.iter().map(|s| s.to_string()).collect(),
        labels: vec!["a\tb".into(), "c,d".into()],
        env: [("K\\EY".to_string(), "v\"a\tl\nue".to_string())].into(),
        input: Some(serde_json::json!({"text": "line\nbreak\t\\ \"q\"", "n": [1, null]})),
        queue: Some("q.1:x-y".into()),
        priority: Some(-3),
        max_attempts: Some(7),
        timeout_secs: Some(1.5),
        output_path: Some("out dir/file\t1".into()),
        ..Default::default()
    };
    let ids = sked_db::task::submit(&db.pool, &tasks, "copier")
        .await
        .unwrap()
        .ids;
    assert_eq!(ids.len(), 100, "one id per task, in order");
    let row = sked_db::task::get(&db.pool, ids[7])
        .await
        .unwrap()
        .expect("the tricky task");
    assert_eq!(
        row.args,
        tricky.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    );
    assert_eq!(row.labels, vec!["a\tb", "c,d"]);
    assert_eq!(row.env, tasks[7].env, "env survives COPY escaping");
    assert_eq!(row.input, tasks[7].input, "input survives COPY escaping");
    assert_eq!(
        (row.queue.as_str(), row.priority, row.max_attempts),
        ("q.1:x-y", -3, 7)
    );
    assert_eq!(row.output_path.as_deref(), Some("out dir/file\t1"));
    assert_eq!(
        row.owner, "copier",
        "tasks without an owner get the caller's"
    );
    let first = sked_db::task::get(&db.pool, ids[0]).await.unwrap().unwrap();
    assert_eq!(
        first.command,
        Some(vec!["echo".to_string(), "task 0".to_string()])
    );

    // A task that names only its command gets exactly the defaults of a plain insert.
    let plain = insert(
        &db.pool,
        "(command, owner) values (array['echo','task 0'], 'copier')",
    )
    .await;
    let defaults = "select to_jsonb(d) from (
                      select owner, queue, priority, kind, args, env, labels, max_attempts, backoff_base,
                             backoff_max, state, attempt, timeout, input, command from sked.tasks where id = $1) d";
    let a: serde_json::Value = sqlx::query_scalar(defaults)
        .bind(plain)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let b: serde_json::Value = sqlx::query_scalar(defaults)
        .bind(ids[0])
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(a, b, "the COPY path fills in the table's defaults");
    let queued_now: bool = sqlx::query_scalar(
        "select next_run_at <= now() and created_at <= now() from sked.tasks where id = $1",
    )
    .bind(ids[0])
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(queued_now, "next_run_at defaults to the database's now()");

    // One bad task rejects the whole batch, with the rule's name.
    let before = count(&db.pool).await;
    tasks[50].command = Some(vec![]);
    let err = sked_db::task::submit(&db.pool, &tasks, "copier")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, sked_db::DbError::Rejected { constraint, .. } if constraint == "tasks_command_must_not_be_empty"),
        "{err:?}"
    );
    assert_eq!(
        count(&db.pool).await,
        before,
        "nothing of the rejected batch remains"
    );
}

/// The names a check constraint admits, read from its definition in `pg_constraint`
/// (`CHECK ((state = ANY (ARRAY['blocked'::text, …])))`: its quoted literals).
async fn admitted(pool: &PgPool, table: &str, constraint: &str) -> Vec<String> {
    let definition: String = sqlx::query_scalar(
        "select pg_get_constraintdef(oid) from pg_constraint
          where conrelid = $1::regclass and conname = $2",
    )
    .bind(table)
    .bind(constraint)
    .fetch_one(pool)
    .await
    .unwrap_or_else(|e| panic!("reading {constraint}: {e}"));
    definition
        .split('\'')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// The names a row of `table` decodes from: its first row with `column` set to each of
/// `names` (`jsonb_populate_record` over the stored row, so every other column is the
/// row's own), read as `R`.
async fn decoded<R>(pool: &PgPool, table: &str, column: &str, names: &[&str]) -> Vec<R>
where
    R: for<'r> sqlx::FromRow<'r, sqlx::postgres::PgRow> + Send + Unpin,
{
    let sql = format!(
        "select (jsonb_populate_record(t, jsonb_build_object('{column}', $1::text))).*
           from {table} t limit 1"
    );
    let mut rows = Vec::new();
    for name in names {
        rows.push(
            sqlx::query_as(sqlx::AssertSqlSafe(sql.clone()))
                .bind(name)
                .fetch_one(pool)
                .await
                .unwrap_or_else(|e| panic!("decoding {column} {name:?} of {table}: {e}")),
        );
    }
    rows
}

/// Rust and the schema name the same states and kinds: the enums list exactly what the
/// check constraints admit, and a row of the table decodes with each of them into the value
/// of that name; a name the enum does not know fails to decode (nothing stands in for it).
#[tokio::test]
async fn every_state_and_kind_the_schema_admits_decodes_to_its_enum_value() {
    use sked_db::task::TaskRow;
    use sked_db::workflow::WorkflowRow;
    use sked_types::{TaskKind, WorkflowState};
    let db = TestDb::new().await;
    insert(&db.pool, "(kind) values ('noop')").await;
    sqlx::query("insert into sked.workflows (name) values ('w')")
        .execute(&db.pool)
        .await
        .unwrap();

    let states = admitted(&db.pool, "sked.tasks", "tasks_state_is_known").await;
    let names: Vec<&str> = TaskState::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(
        states, names,
        "TaskState::ALL is the schema's list, in its order"
    );
    let rows: Vec<TaskRow> = decoded(&db.pool, "sked.tasks", "state", &names).await;
    let got: Vec<TaskState> = rows.iter().map(|r| r.state).collect();
    assert_eq!(got, TaskState::ALL);

    let kinds = admitted(&db.pool, "sked.tasks", "tasks_kind_is_known").await;
    let names: Vec<&str> = TaskKind::ALL.iter().map(|k| k.as_str()).collect();
    assert_eq!(
        kinds, names,
        "TaskKind::ALL is the schema's list, in its order"
    );
    let rows: Vec<TaskRow> = decoded(&db.pool, "sked.tasks", "kind", &names).await;
    let got: Vec<TaskKind> = rows.iter().map(|r| r.kind).collect();
    assert_eq!(got, TaskKind::ALL);

    let workflow_states = admitted(&db.pool, "sked.workflows", "workflows_state_is_known").await;
    let names: Vec<&str> = WorkflowState::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(
        workflow_states, names,
        "WorkflowState::ALL is the schema's list"
    );
    let rows: Vec<WorkflowRow> = decoded(&db.pool, "sked.workflows", "state", &names).await;
    let got: Vec<WorkflowState> = rows.iter().map(|r| r.state).collect();
    assert_eq!(got, WorkflowState::ALL);

    for (table, column) in [
        ("sked.tasks", "state"),
        ("sked.tasks", "kind"),
        ("sked.workflows", "state"),
    ] {
        let sql = format!(
            "select (jsonb_populate_record(t, jsonb_build_object('{column}', 'bogus'))).*
               from {table} t limit 1"
        );
        let query = sqlx::query(sqlx::AssertSqlSafe(sql));
        let row = query.fetch_one(&db.pool).await.unwrap();
        let refused = if table == "sked.tasks" {
            <TaskRow as sqlx::FromRow<_>>::from_row(&row).err()
        } else {
            <WorkflowRow as sqlx::FromRow<_>>::from_row(&row).err()
        };
        let refused = refused.unwrap_or_else(|| panic!("{table}.{column} 'bogus' decoded"));
        assert!(
            refused.to_string().contains(column),
            "the error names the column: {refused}"
        );
    }
}

/// Time is an input (ARCHITECTURE.md): every function of the schema that takes `p_now`
/// takes it as its last argument, so a caller passes the clock last or by name and tests
/// move it. Reads the input arguments of every function in `pg_proc`.
#[tokio::test]
async fn every_function_takes_now_as_its_last_argument() {
    let db = TestDb::new().await;
    let inputs: Vec<(String, Vec<String>)> = sqlx::query_as(
        "select p.oid::regprocedure::text,
                array(select a.name
                        from unnest(p.proargnames, coalesce(p.proargmodes,
                                    array_fill('i'::\"char\", array[cardinality(p.proargnames)])))
                             with ordinality as a(name, mode, n)
                       where a.mode in ('i', 'b', 'v')
                       order by a.n)
           from pg_proc p
          where p.pronamespace = 'sked'::regnamespace and p.proargnames is not null",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let takes_now: Vec<&(String, Vec<String>)> = inputs
        .iter()
        .filter(|(_, args)| args.iter().any(|a| a == "p_now"))
        .collect();
    assert!(
        takes_now.len() > 20,
        "the functions that take the clock are found: {takes_now:?}"
    );
    let misplaced: Vec<&String> = takes_now
        .iter()
        .filter(|(_, args)| args.last().map(String::as_str) != Some("p_now"))
        .map(|(function, _)| function)
        .collect();
    assert!(
        misplaced.is_empty(),
        "these functions take p_now before their last argument: {misplaced:?}"
    );
}

/// A new field of a task is a column and its name in the list of fields (sql/tasks.sql):
/// with nothing else changed, every way in takes it and every copy of a task carries it.
#[tokio::test]
async fn a_new_field_is_a_column_and_its_name_in_the_list_of_fields() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    sqlx::query("alter table sked.tasks add column scratch boolean not null default false")
        .execute(pool)
        .await
        .unwrap();
    for (name, sql) in sked_db::CONTRACT {
        let mut sql = sql.to_string();
        if *name == "sql/tasks.sql" {
            // The new field's name at the end of the list.
            let list = "fields constant text[] := array[";
            assert_eq!(sql.matches(list).count(), 1, "the list of fields starts so");
            let start = sql.find(list).unwrap();
            let end = start + sql[start..].find("];").expect("the list of fields ends");
            sql.insert_str(end, ", 'scratch'");
        }
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(pool)
            .await
            .unwrap_or_else(|e| panic!("applying {name} with the new field: {e}"));
    }
    let scratch = async |id: Uuid| -> bool {
        sqlx::query_scalar("select scratch from sked.tasks where id = $1")
            .bind(id)
            .fetch_one(pool)
            .await
            .unwrap()
    };
    let one = async |sql: &str| -> Uuid {
        sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_owned()))
            .fetch_one(pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
    };

    let named = one("select sked.task_submit(command => array['true'], scratch => true)").await;
    assert!(scratch(named).await, "sked.task_submit takes it by name");
    let plain = one("select sked.task_submit(command => array['true'])").await;
    assert!(
        !scratch(plain).await,
        "and leaves it to the table's default"
    );
    let json =
        one(r#"select id from sked.tasks_submit('[{"command": ["true"], "scratch": true}]')"#)
            .await;
    assert!(scratch(json).await, "sked.tasks_submit takes it as a key");
    let resubmitted = one(&format!("select sked.task_resubmit('{named}')")).await;
    assert!(scratch(resubmitted).await, "a resubmission carries it");

    let workflow = one(
        r#"select sked.workflow_submit('{"tasks": [{"name": "a", "command": ["true"], "scratch": true},
                                                    {"name": "b", "command": ["true"], "depends_on": ["a"]}]}')"#,
    )
    .await;
    let in_workflow: Vec<(String, bool)> =
        sqlx::query_as("select name, scratch from sked.tasks where workflow_id = $1 order by name")
            .bind(workflow)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(
        in_workflow,
        [("a".to_owned(), true), ("b".to_owned(), false)],
        "a workflow's task takes it"
    );

    let schedule = one(r#"insert into sked.schedules (name, cron, task)
           values ('s', '@daily', '{"command": ["true"], "scratch": true}') returning id"#)
    .await;
    let occurrence = one(&format!("select sked.schedule_run_now('{schedule}')")).await;
    assert!(scratch(occurrence).await, "a schedule's template takes it");

    let sharded =
        one("select sked.task_submit(command => array['true'], shards => 3, scratch => true)")
            .await;
    let shards: Vec<bool> =
        sqlx::query_scalar("select scratch from sked.tasks where shard_of = $1")
            .bind(sharded)
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(shards, [true, true, true], "shards carry their parent's");

    let service = one(
        "select sked.task_submit(kind => 'service', command => array['sleep', '9'], scratch => true)",
    )
    .await;
    sqlx::query(r#"select sked.service_update($1, '{"replicas": 2}')"#)
        .bind(service)
        .execute(pool)
        .await
        .unwrap();
    let copies: Vec<bool> = sqlx::query_scalar(
        "select scratch from sked.tasks where shard_of = $1 order by shard_index",
    )
    .bind(service)
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(
        copies,
        [true, true],
        "the first copy and the one scaling added carry it"
    );

    let err =
        sqlx::query(r#"select * from sked.tasks_submit('[{"command": ["true"], "scratch": 1}]')"#)
            .execute(pool)
            .await
            .expect_err("a boolean field takes JSON booleans only");
    assert_eq!(
        err.as_database_error().and_then(|e| e.constraint()),
        Some("tasks_scratch_must_be_a_boolean")
    );
    let insertable: bool = sqlx::query_scalar(
        "select has_column_privilege('sked_submitter', 'sked.tasks', 'scratch', 'INSERT')
            and has_column_privilege('sked_server', 'sked.tasks', 'scratch', 'INSERT')",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(insertable, "the submitting roles may set it");
    let shown = sked_db::task::get(pool, named).await.unwrap().unwrap();
    assert_eq!(
        shown.id, named,
        "a row with a column the API does not know still reads"
    );
}

#[tokio::test]
async fn a_task_that_is_not_a_json_object_is_refused_saying_so() {
    let db = TestDb::new().await;
    for tasks in [
        serde_json::json!([{"kind": "noop"}, 1]),
        serde_json::json!(["preemptible"]),
        serde_json::json!([[{"kind": "noop"}]]),
    ] {
        let err = sqlx::query("select * from sked.tasks_submit($1)")
            .bind(&tasks)
            .execute(&db.pool)
            .await
            .expect_err("an element that is not an object is refused");
        let err = err.as_database_error().expect("a database error");
        assert_eq!(err.code().as_deref(), Some("22023"), "{tasks}: {err}");
        assert!(
            err.message().contains("a task is a JSON object"),
            "{tasks}: {err}"
        );
    }
    assert_eq!(count(&db.pool).await, 0, "nothing was inserted");
}

/// What one statement did to `sked.tasks` and read of `sked.tasks_running` and of the primary
/// key, from the backend's counters of the transaction it runs in (which also hold what the
/// connection's earlier transactions did until they are flushed, hence the difference).
#[derive(Debug, Default, Clone, Copy)]
struct Touched {
    updated: i64,
    hot_updated: i64,
    running_entries_read: i64,
    pkey_scans: i64,
}

async fn touched(
    tx: &mut sqlx::PgConnection,
    statement: sqlx::query::Query<'_, sqlx::Postgres, sqlx::postgres::PgArguments>,
) -> Touched {
    let counters = "select pg_stat_get_xact_tuples_updated('sked.tasks'::regclass),
                           pg_stat_get_xact_tuples_hot_updated('sked.tasks'::regclass),
                           pg_stat_get_xact_tuples_returned('sked.tasks_running'::regclass),
                           pg_stat_get_xact_numscans('sked.tasks_pkey'::regclass)";
    let before: (i64, i64, i64, i64) = sqlx::query_as(counters).fetch_one(&mut *tx).await.unwrap();
    statement.execute(&mut *tx).await.unwrap();
    let after: (i64, i64, i64, i64) = sqlx::query_as(counters).fetch_one(&mut *tx).await.unwrap();
    Touched {
        updated: after.0 - before.0,
        hot_updated: after.1 - before.1,
        running_entries_read: after.2 - before.2,
        pkey_scans: after.3 - before.3,
    }
}

/// A lease renewal changes no indexed column, so it is a HOT update: the new row version goes
/// on the same page and no index gains an entry. The fenced updates of running tasks by id
/// (renewal, the cancel poll, the finish) find their rows by the primary key, also when the
/// statistics were taken while nothing ran, and never walk tasks_running (the index of every
/// running task) once per row of their batch.
#[tokio::test]
async fn lease_renewals_are_hot_and_fenced_updates_find_running_tasks_by_primary_key() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let worker = Uuid::new_v4();
    sqlx::query("insert into sked.tasks (kind) select 'noop' from generate_series(1, 1000)")
        .execute(pool)
        .await
        .unwrap();
    // The statistics say that no task runs.
    sqlx::query("analyze sked.tasks")
        .execute(pool)
        .await
        .unwrap();
    let mut ids = Vec::new();
    for _ in 0..10 {
        ids.extend(claim_ids(pool, worker, 100, None).await.0);
    }
    assert_eq!(ids.len(), 1000);
    let attempts = vec![1; ids.len()];

    // Renewals, each its own transaction as a worker's are.
    let mut renewals = Vec::new();
    for round in 0..20 {
        let mut tx = pool.begin().await.unwrap();
        renewals.push(
            touched(
                &mut tx,
                sqlx::query(
                    "select count(*) from sked.tasks_renew_leases($1, $2, $3, $4::interval)",
                )
                .bind(worker)
                .bind(&ids)
                .bind(&attempts)
                .bind(format!("{} s", 30 + round)),
            )
            .await,
        );
        tx.commit().await.unwrap();
    }
    let mut tx = pool.begin().await.unwrap();
    let cancel_poll = touched(
        &mut tx,
        sqlx::query("select count(*) from sked.tasks_cancel_requested($1, $2)")
            .bind(&ids)
            .bind(&attempts),
    )
    .await;
    let finish = touched(
        &mut tx,
        sqlx::query(
            "select count(*) from sked.tasks_finish($1, $2, array_fill('succeeded'::text, array[$3]),
                                                    '{}', '{}', '{}', '{}', '{}', '{}')",
        )
        .bind(&ids)
        .bind(&attempts)
        .bind(ids.len() as i32),
    )
    .await;
    tx.rollback().await.unwrap();
    for (round, r) in renewals.iter().enumerate() {
        assert_eq!(r.updated, 1000, "renewal {round} renews every lease: {r:?}");
        assert_eq!(
            (r.running_entries_read, r.pkey_scans),
            (0, 1000),
            "renewal {round} finds each task by its id: {r:?}"
        );
    }
    // No index names the lease: not as a key, an included column or in a predicate.
    let naming: Vec<String> = sqlx::query_scalar(
        "select i.indexrelid::regclass::text from pg_index i
          where i.indrelid = 'sked.tasks'::regclass
            and pg_get_indexdef(i.indexrelid) like '%lease_expires_at%'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(naming.is_empty(), "indexes naming the lease: {naming:?}");
    // A renewal's new row version needs room on its page: the first renewals of tasks
    // claimed together move rows to pages with room, and the later ones stay in place (on a
    // quiet machine a third of the first renewal is HOT, 99 % of the twentieth). Transactions
    // open elsewhere delay the pruning that makes room (under the whole suite's load the first
    // renewals were 10 % HOT), so this asks only that renewals are HOT where they can be:
    // with the lease in an index, none is.
    let hot: Vec<i64> = renewals.iter().map(|r| r.hot_updated).collect();
    assert!(
        hot.iter().sum::<i64>() >= 1000,
        "renewals are HOT where their page has room: {hot:?}"
    );
    for (name, t) in [("the cancel poll", cancel_poll), ("the finish", finish)] {
        assert_eq!(
            (t.running_entries_read, t.pkey_scans),
            (0, 1000),
            "{name} finds each task by its id: {t:?}"
        );
    }
    assert_eq!(finish.updated, 1000, "{finish:?}");
}
