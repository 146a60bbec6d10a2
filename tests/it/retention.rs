//! Retention with time as input: which finished tasks the prune deletes and which it keeps
//! (the defaults of 7 days and 30 days for failed tasks, a queue's own retention, unfinished
//! tasks, whole workflows, a task's logs, attempts and edges with it), retention off, batches
//! that walk the index `tasks_finished` and never the table, the artifacts' collection, and
//! bad settings refused in SQL, over REST and by the CLI with nothing changed.

use axum::http::{Method, StatusCode};
use chrono::{DateTime, Duration as Age, Utc};
use serde_json::json;
use sked_db::testing::TestDb;
use sked_db::upkeep::{prune_artifacts_batch, prune_tasks_batch};
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::insert;

/// The time the tests pass to the prune: now, to the microsecond (as Postgres keeps it), so
/// that what the database stamps itself (an artifact stored again) is not in its future.
fn now() -> DateTime<Utc> {
    let t = Utc::now();
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap()
}

/// A task of `queue` that ended in `state` at `finished_at`, with an attempt, a log chunk
/// and an edge to a parent `edge_to` (when given), as a worker and a workflow leave them.
async fn finished(pool: &PgPool, queue: &str, state: &str, finished_at: DateTime<Utc>) -> Uuid {
    let id = insert(
        pool,
        &format!("(command, queue) values (array['true'], '{queue}')"),
    )
    .await;
    sqlx::query(
        "update sked.tasks set state = $2, attempt = 1, started_at = $3 - interval '1 minute',
                finished_at = $3
          where id = $1",
    )
    .bind(id)
    .bind(state)
    .bind(finished_at)
    .execute(pool)
    .await
    .unwrap_or_else(|e| panic!("a {state} task: {e}"));
    sqlx::query(
        "insert into sked.task_logs (task_id, attempt, stream, data) values ($1, 1, 'stdout', 'x');
         ",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "insert into sked.task_attempts (task_id, attempt, started_at, finished_at, outcome)
         values ($1, 1, $2 - interval '1 minute', $2, 'failed')",
    )
    .bind(id)
    .bind(finished_at)
    .execute(pool)
    .await
    .unwrap();
    id
}

/// Runs batches of `sked.tasks_prune_expired` at `now`, of `limit` tasks examined each,
/// until the prune says nothing is left; returns what each batch deleted.
async fn prune_at(pool: &PgPool, now: DateTime<Utc>, limit: i32) -> Vec<i32> {
    let mut after = None;
    let mut batches = Vec::new();
    loop {
        let (deleted, next) = prune_tasks_batch(pool, after, limit, Some(now))
            .await
            .expect("a batch of the prune");
        batches.push(deleted);
        match next {
            None => return batches,
            Some(next) => after = Some(next),
        }
        assert!(batches.len() < 1000, "the prune ends");
    }
}

async fn task_ids(pool: &PgPool) -> Vec<Uuid> {
    sqlx::query_scalar("select id from sked.tasks order by id")
        .fetch_all(pool)
        .await
        .unwrap()
}

fn sorted(mut ids: Vec<Uuid>) -> Vec<Uuid> {
    ids.sort();
    ids
}

async fn count(pool: &PgPool, sql: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .fetch_one(pool)
        .await
        .unwrap_or_else(|e| panic!("`{sql}`: {e}"))
}

/// The task rows that `ids` left in the tables of a task's history.
async fn history_of(pool: &PgPool, ids: &[Uuid]) -> (i64, i64) {
    sqlx::query_as(
        "select (select count(*) from sked.task_logs where task_id = any($1)),
                (select count(*) from sked.task_attempts where task_id = any($1))",
    )
    .bind(ids)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn by_default_finished_tasks_go_after_7_days_failed_ones_after_30_and_unfinished_never() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let t = now();
    let succeeded_8d = finished(pool, "default", "succeeded", t - Age::days(8)).await;
    let cancelled_8d = finished(pool, "default", "cancelled", t - Age::days(8)).await;
    let succeeded_6d = finished(pool, "default", "succeeded", t - Age::days(6)).await;
    let failed_8d = finished(pool, "default", "failed", t - Age::days(8)).await;
    let failed_29d = finished(pool, "default", "failed", t - Age::days(29)).await;
    let failed_31d = finished(pool, "default", "failed", t - Age::days(31)).await;
    // Unfinished tasks submitted a year ago: waiting, and retrying.
    let waiting = insert(pool, "(command) values (array['true'])").await;
    let retrying = insert(pool, "(command) values (array['true'])").await;
    sqlx::query(
        "update sked.tasks set created_at = $2 - interval '1 year', next_run_at = $2,
                state = case when id = $3 then 'retry' else state end,
                attempt = case when id = $3 then 1 else attempt end
          where id = any($1)",
    )
    .bind(vec![waiting, retrying])
    .bind(t)
    .bind(retrying)
    .execute(pool)
    .await
    .unwrap();

    let deleted: i32 = prune_at(pool, t, 1000).await.iter().sum();
    assert_eq!(deleted, 3, "three tasks are past their retention");
    assert_eq!(
        task_ids(pool).await,
        sorted(vec![succeeded_6d, failed_8d, failed_29d, waiting, retrying]),
        "a task finished 6 days ago, failed ones within 30 days and unfinished ones of any age are kept"
    );
    assert_eq!(
        history_of(pool, &[succeeded_8d, cancelled_8d, failed_31d]).await,
        (0, 0),
        "the logs and attempts of the deleted tasks went with them"
    );
    assert_eq!(
        history_of(pool, &[succeeded_6d, failed_8d, failed_29d]).await,
        (3, 3),
        "the kept tasks keep their logs and attempts"
    );

    // A day later the failed task of 29 days is past 30 days too.
    prune_at(pool, t + Age::days(2), 1000).await;
    assert_eq!(
        task_ids(pool).await,
        sorted(vec![failed_8d, waiting, retrying]),
        "two days later the succeeded task (8 days) and the failed one (31 days) went"
    );
}

#[tokio::test]
async fn a_queue_with_a_retention_of_a_day_loses_its_2_day_old_tasks_and_the_default_queue_keeps_them()
 {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let t = now();
    sqlx::query("select sked.queue_set_retention('scratch', interval '1 day', null, $1)")
        .bind(t)
        .execute(pool)
        .await
        .unwrap();
    sqlx::query(
        "select sked.queue_set_retention('audit', interval '90 days', interval '1 year', $1)",
    )
    .bind(t)
    .execute(pool)
    .await
    .unwrap();
    let scratch_2d = finished(pool, "scratch", "succeeded", t - Age::days(2)).await;
    let scratch_12h = finished(pool, "scratch", "succeeded", t - Age::hours(12)).await;
    // The queue keeps the cluster's keep-failed retention (30 days).
    let scratch_failed_2d = finished(pool, "scratch", "failed", t - Age::days(2)).await;
    let default_2d = finished(pool, "default", "succeeded", t - Age::days(2)).await;
    let audit_60d = finished(pool, "audit", "succeeded", t - Age::days(60)).await;
    let audit_failed_200d = finished(pool, "audit", "failed", t - Age::days(200)).await;
    let audit_100d = finished(pool, "audit", "succeeded", t - Age::days(100)).await;

    prune_at(pool, t, 1000).await;
    assert_eq!(
        task_ids(pool).await,
        sorted(vec![
            scratch_12h,
            scratch_failed_2d,
            default_2d,
            audit_60d,
            audit_failed_200d
        ]),
        "scratch (1 day) lost its task of 2 days, the default queue (7 days) kept its own, \
         audit (90 days, failed 1 year) lost only its task of 100 days"
    );
    assert_eq!(history_of(pool, &[scratch_2d, audit_100d]).await, (0, 0));

    // Back to the cluster's retention: scratch's failed task now goes after 30 days only.
    sqlx::query("select sked.queue_set_retention('scratch', null, null, $1)")
        .bind(t)
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(
        count(
            pool,
            "select count(*) from sked.queues where name = 'scratch'"
        )
        .await,
        0,
        "a queue left without a control has no row"
    );
    prune_at(pool, t + Age::days(6), 1000).await;
    assert!(
        task_ids(pool).await.contains(&scratch_failed_2d),
        "a failed task of 8 days is kept by the cluster's 30 days"
    );
    assert!(
        !task_ids(pool).await.contains(&default_2d),
        "the default queue's task of 8 days went"
    );
}

#[tokio::test]
async fn a_workflows_tasks_go_only_once_the_whole_workflow_finished_past_retention() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let t = now();
    let workflow: Uuid = sqlx::query_scalar("select sked.workflow_submit($1, 'alice', $2)")
        .bind(json!({"name": "w", "tasks": [
            {"name": "a", "command": ["true"]},
            {"name": "b", "command": ["true"], "depends_on": ["a"]}]}))
        .bind(t - Age::days(20))
        .fetch_one(pool)
        .await
        .unwrap();
    let a = crate::support::task_id(pool, workflow, "a").await;
    let b = crate::support::task_id(pool, workflow, "b").await;
    // `a` finished 10 days ago; `b` still waits, so the workflow has not finished.
    sqlx::query(
        "update sked.tasks set state = 'succeeded', attempt = 1, started_at = $2, finished_at = $2
          where id = $1",
    )
    .bind(a)
    .bind(t - Age::days(10))
    .execute(pool)
    .await
    .unwrap();
    prune_at(pool, t, 1000).await;
    assert_eq!(
        task_ids(pool).await,
        sorted(vec![a, b]),
        "a task of an unfinished workflow stays, however old"
    );

    // The workflow ends (b cancelled) 3 days ago: within the retention, both stay.
    sqlx::query("select sked.workflow_cancel($1, $2)")
        .bind(workflow)
        .bind(t - Age::days(3))
        .execute(pool)
        .await
        .unwrap();
    prune_at(pool, t, 1000).await;
    assert_eq!(
        task_ids(pool).await,
        sorted(vec![a, b]),
        "a task 10 days old stays while its workflow finished 3 days ago"
    );
    // Five days later the workflow finished 8 days ago: its tasks, edges and row go.
    let batches = prune_at(pool, t + Age::days(5), 1000).await;
    assert_eq!(batches.iter().sum::<i32>(), 2, "{batches:?}");
    assert!(task_ids(pool).await.is_empty());
    assert_eq!(count(pool, "select count(*) from sked.task_edges").await, 0);
    assert_eq!(
        count(pool, "select count(*) from sked.workflows").await,
        0,
        "the workflow row went with its last task"
    );
}

#[tokio::test]
async fn retention_off_deletes_nothing_and_on_again_resumes() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let t = now();
    let old = finished(pool, "default", "succeeded", t - Age::days(400)).await;
    sqlx::query(
        "insert into sked.artifacts (sha256, content, created_at)
         values (encode(sha256('x'), 'hex'), 'x', $1)",
    )
    .bind(t - Age::days(400))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query("select sked.queue_set_retention('default', interval '1 hour', null, $1)")
        .bind(t)
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("select sked.retention_set(p_enabled => false, p_now => $1)")
        .bind(t)
        .execute(pool)
        .await
        .unwrap();
    assert_eq!(prune_at(pool, t, 1000).await, [0]);
    let (artifacts, next) = prune_artifacts_batch(pool, None, 100, Some(t))
        .await
        .unwrap();
    assert_eq!((artifacts, next), (0, None));
    assert_eq!(
        (
            task_ids(pool).await,
            count(pool, "select count(*) from sked.artifacts").await
        ),
        (vec![old], 1),
        "retention off: nothing is deleted, whatever the queue says"
    );
    sqlx::query("select sked.retention_set(p_enabled => true, p_now => $1)")
        .bind(t)
        .execute(pool)
        .await
        .unwrap();
    prune_at(pool, t, 1000).await;
    assert!(
        task_ids(pool).await.is_empty(),
        "on again: the old task goes"
    );
}

#[tokio::test]
async fn batches_examine_at_most_their_limit_and_walk_the_index_never_the_table() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let t = now();
    // 2,500 tasks finished 8 days ago at 2,500 different times, and 1,500 that one statement
    // finished at one time (one finish of a batch), and 3,000 finished yesterday.
    let mut setup = pool.acquire().await.unwrap();
    sqlx::query(
        "insert into sked.tasks (command, state, attempt, started_at, finished_at)
         select array['true'], 'succeeded', 1, f, f
           from (select $1 - interval '8 days' + n * interval '1 ms' as f
                   from generate_series(1, 2500) n
                 union all select $1 - interval '9 days' from generate_series(1, 1500)
                 union all select $1 - interval '1 day' + n * interval '1 ms'
                   from generate_series(1, 3000) n) x",
    )
    .bind(t)
    .execute(&mut *setup)
    .await
    .unwrap();
    // The setup's statistics reach the shared counters now, not while the prune runs.
    for sql in ["analyze sked.tasks", "select pg_stat_force_next_flush()"] {
        sqlx::query(sql).execute(&mut *setup).await.unwrap();
    }
    drop(setup);
    let scans = || async {
        sqlx::query("select pg_stat_force_next_flush()")
            .execute(pool)
            .await
            .unwrap();
        sqlx::query_as::<_, (i64, i64)>(
            "select (select seq_scan from pg_stat_user_tables where relid = 'sked.tasks'::regclass),
                    (select idx_scan from pg_stat_user_indexes
                      where indexrelid = 'sked.tasks_finished'::regclass)",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    };
    let (seq_before, finished_before) = scans().await;

    let batches = prune_at(pool, t, 1000).await;
    assert!(
        batches.iter().all(|&n| n <= 1000),
        "no batch deletes more than its limit: {batches:?}"
    );
    assert_eq!(batches.iter().sum::<i32>(), 4000, "{batches:?}");
    assert!(
        batches.len() >= 5,
        "4,000 tasks in batches of at most 1,000, and a last one that finds nothing: {batches:?}"
    );
    // The prune ran on other connections of the pool, whose statistics reach the shared
    // counters when each flushes (within about ten seconds of going idle).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let (seq_after, finished_after) = loop {
        let (seq, finished) = scans().await;
        if finished > finished_before || std::time::Instant::now() > deadline {
            break (seq, finished);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert!(
        finished_after > finished_before,
        "the prune walks tasks_finished ({finished_before} → {finished_after})"
    );
    assert_eq!(seq_after, seq_before, "the prune never scans the table");
    assert_eq!(
        count(pool, "select count(*) from sked.tasks").await,
        3000,
        "the tasks of yesterday are kept"
    );
}

#[tokio::test]
async fn artifacts_no_task_refers_to_go_after_their_grace_and_referenced_or_fresh_ones_stay() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let t = now();
    let store = |content: &'static str, age: Age| {
        let pool = pool.clone();
        async move {
            sqlx::query_scalar::<_, String>(
                "insert into sked.artifacts (sha256, content, created_at)
                 values (encode(sha256($1::bytea), 'hex'), $1::bytea, $2) returning sha256",
            )
            .bind(content.as_bytes())
            .bind(t - age)
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    let executable = store("executable", Age::days(10)).await;
    let output = store("output", Age::days(10)).await;
    let scheduled = store("scheduled", Age::days(10)).await;
    let orphan = store("orphan", Age::days(10)).await;
    let of_an_old_task = store("of an old task", Age::days(10)).await;
    let fresh = store("fresh", Age::hours(2)).await;

    // A waiting task runs `executable`; a task finished yesterday left `output`; one finished
    // 8 days ago ran `of an old task`; a schedule's workflow template runs `scheduled`.
    let runs = insert(
        pool,
        &format!("(artifact_url, artifact_sha256) values ('pg:{executable}', '{executable}')"),
    )
    .await;
    let left_output = finished(pool, "default", "succeeded", t - Age::days(1)).await;
    sqlx::query("update sked.tasks set output_sha256 = $2 where id = $1")
        .bind(left_output)
        .bind(&output)
        .execute(pool)
        .await
        .unwrap();
    let old = insert(
        pool,
        &format!(
            "(artifact_url, artifact_sha256) values ('pg:{of_an_old_task}', '{of_an_old_task}')"
        ),
    )
    .await;
    sqlx::query(
        "update sked.tasks set state = 'succeeded', attempt = 1, started_at = $2, finished_at = $2
          where id = $1",
    )
    .bind(old)
    .bind(t - Age::days(8))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "insert into sked.schedules (name, cron, workflow) values ('nightly', '0 0 * * *', $1)",
    )
    .bind(
        json!({"name": "n", "tasks": [{"name": "a", "artifact_url": format!("pg:{scheduled}"),
                                          "artifact_sha256": scheduled}]}),
    )
    .execute(pool)
    .await
    .unwrap();

    let all_artifacts = || async {
        sqlx::query_scalar::<_, String>("select sha256 from sked.artifacts order by sha256")
            .fetch_all(pool)
            .await
            .unwrap()
    };
    let mut expected = vec![
        executable.clone(),
        output.clone(),
        scheduled.clone(),
        of_an_old_task.clone(),
        fresh.clone(),
    ];
    expected.sort();
    // Batches of 2: the collection goes on from where each stopped.
    let mut after = None;
    let mut deleted = 0;
    loop {
        let (n, next) = prune_artifacts_batch(pool, after, 2, Some(t))
            .await
            .unwrap();
        deleted += n;
        match next {
            None => break,
            Some(next) => after = Some(next),
        }
    }
    assert_eq!(deleted, 1);
    assert_eq!(
        all_artifacts().await,
        expected,
        "only the old artifact nothing refers to ({orphan}) went"
    );

    // Once the old task is pruned, its artifact has no reference left and goes too.
    prune_at(pool, t, 1000).await;
    assert!(!task_ids(pool).await.contains(&old));
    let (n, _) = prune_artifacts_batch(pool, None, 100, Some(t))
        .await
        .unwrap();
    assert_eq!(n, 1);
    expected.retain(|a| *a != of_an_old_task);
    assert_eq!(all_artifacts().await, expected);
    assert!(task_ids(pool).await.contains(&runs));

    // Storing an artifact again renews its grace period.
    sqlx::query("delete from sked.tasks where id = $1")
        .bind(runs)
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("select sked.artifact_put($1, 'executable')")
        .bind(&executable)
        .execute(pool)
        .await
        .unwrap();
    let (n, _) = prune_artifacts_batch(pool, None, 100, Some(t + Age::hours(1)))
        .await
        .unwrap();
    assert_eq!(
        n, 0,
        "an artifact stored again just now is within its grace"
    );
    assert!(all_artifacts().await.contains(&executable));
    let (n, _) = prune_artifacts_batch(pool, None, 100, Some(t + Age::days(2)))
        .await
        .unwrap();
    assert_eq!(n, 2, "past its new grace, it goes with the fresh one");
    assert!(!all_artifacts().await.contains(&executable));
}

#[tokio::test]
async fn bad_retentions_are_refused_in_sql_with_the_rule_named_and_change_nothing() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    sqlx::query("select sked.queue_set_retention('q', interval '3 days', interval '40 days')")
        .execute(pool)
        .await
        .unwrap();
    let snapshot = || async {
        sqlx::query_as::<_, (String, String, String)>(
            "select (select string_agg(name || ' ' || retention::text || ' ' || keep_failed::text, ',')
                       from sked.queues),
                    (select retention::text from sked.retention_settings),
                    (select keep_failed::text || ' ' || enabled::text from sked.retention_settings)",
        )
        .fetch_one(pool)
        .await
        .unwrap()
    };
    let before = snapshot().await;
    assert_eq!(
        before,
        (
            "q 3 days 40 days".to_owned(),
            "7 days".to_owned(),
            "30 days true".to_owned()
        ),
        "the defaults are 7 days and 30 days, on"
    );
    for (call, rule) in [
        (
            "sked.queue_set_retention('q', interval '-1 day', null)",
            "queues_retention_must_be_1_hour_to_36500_days",
        ),
        (
            "sked.queue_set_retention('q', interval '0', null)",
            "queues_retention_must_be_1_hour_to_36500_days",
        ),
        (
            "sked.queue_set_retention('q', interval '59 minutes', null)",
            "queues_retention_must_be_1_hour_to_36500_days",
        ),
        (
            "sked.queue_set_retention('q', null, interval '1000 years')",
            "queues_keep_failed_must_be_1_hour_to_36500_days",
        ),
        (
            "sked.queue_set_retention('bad queue!', interval '1 day', null)",
            "queues_name_must_be_1_to_64_word_characters",
        ),
        (
            "sked.retention_set(p_retention => interval '0')",
            "retention_settings_retention_must_be_1_hour_to_36500_days",
        ),
        (
            "sked.retention_set(p_retention => interval '1 month -40 days')",
            "retention_settings_retention_must_be_1_hour_to_36500_days",
        ),
        (
            "sked.retention_set(p_keep_failed => interval '36501 days')",
            "retention_settings_keep_failed_must_be_1_hour_to_36500_days",
        ),
    ] {
        let err = sqlx::query(sqlx::AssertSqlSafe(format!("select {call}")))
            .execute(pool)
            .await
            .unwrap_err();
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.constraint(), Some(rule), "{call}: {db_err}");
        assert_eq!(db_err.code().as_deref(), Some("23514"), "{call}");
        assert!(db_err.message().starts_with("sked."), "{call}: {db_err}");
    }
    // Plain updates meet the same rules as constraints; the settings keep their one row.
    for (sql, rule) in [
        (
            "update sked.queues set retention = interval '0'",
            "queues_retention_must_be_1_hour_to_36500_days",
        ),
        (
            "update sked.retention_settings set keep_failed = interval '-5 days'",
            "retention_settings_keep_failed_must_be_1_hour_to_36500_days",
        ),
        (
            "delete from sked.retention_settings",
            "retention_settings_has_one_row",
        ),
        (
            "insert into sked.retention_settings (id) values (false)",
            "retention_settings_has_one_row",
        ),
    ] {
        let err = sqlx::query(sql).execute(pool).await.unwrap_err();
        assert_eq!(
            err.as_database_error().and_then(|e| e.constraint()),
            Some(rule),
            "{sql}: {err}"
        );
    }
    assert_eq!(snapshot().await, before, "nothing changed");
}

#[tokio::test]
async fn rest_sets_and_shows_retentions_for_admins_and_refuses_bad_values_with_nothing_changed() {
    let api = crate::api::Api::new().await;
    let (status, body) = api.get("/api/v1/retention", &api.alice).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (
            &body["enabled"],
            &body["retention_secs"],
            &body["keep_failed_secs"]
        ),
        (&json!(true), &json!(604800.0), &json!(2592000.0)),
        "any token reads the defaults: {body}"
    );
    assert_eq!(body["artifact_grace_secs"], json!(86400.0));

    // Users may not change retention.
    let (status, _) = api
        .call(
            Method::PATCH,
            "/api/v1/retention",
            &api.alice,
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _) = api
        .call(
            Method::PATCH,
            "/api/v1/queues/mail",
            &api.alice,
            Some(json!({"retention_secs": 86400})),
        )
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN);

    // An admin sets a queue's retention, and the cluster's.
    let (status, body) = api
        .call(
            Method::PATCH,
            "/api/v1/queues/mail",
            &api.admin,
            Some(json!({"retention_secs": 86400, "max_running": 2})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (
            &body["retention_secs"],
            &body["keep_failed_secs"],
            &body["max_running"]
        ),
        (&json!(86400.0), &json!(null), &json!(2)),
        "{body}"
    );
    let (status, body) = api
        .call(
            Method::PATCH,
            "/api/v1/queues/mail",
            &api.admin,
            Some(json!({"max_running": null})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["retention_secs"],
        json!(86400.0),
        "a queue with only a retention keeps it: {body}"
    );
    let (status, body) = api
        .call(
            Method::PATCH,
            "/api/v1/retention",
            &api.admin,
            Some(json!({"retention_secs": 1209600, "keep_failed_secs": 5184000})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (&body["retention_secs"], &body["keep_failed_secs"]),
        (&json!(1209600.0), &json!(5184000.0))
    );
    let (_, queues) = api.get("/api/v1/queues", &api.alice).await;
    let mail = queues
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["queue"] == "mail")
        .unwrap_or_else(|| panic!("a queue with a retention is listed: {queues}"));
    assert_eq!(mail["retention_secs"], json!(86400.0), "{mail}");
    assert_eq!(mail["keep_failed_secs"], json!(null), "{mail}");

    // Bad values: a readable 400, nothing changed.
    let snapshot = || async {
        sqlx::query_as::<_, (String, String)>(
            "select (select string_agg(name || ' ' || coalesce(retention::text, '-') || ' '
                                       || coalesce(keep_failed::text, '-'), ',') from sked.queues),
                    (select enabled || ' ' || retention || ' ' || keep_failed
                       from sked.retention_settings)",
        )
        .fetch_one(&api.db.pool)
        .await
        .unwrap()
    };
    let before = snapshot().await;
    for (path, body, says) in [
        (
            "/api/v1/queues/mail",
            json!({"retention_secs": -86400}),
            "retention_secs must be between 3600",
        ),
        (
            "/api/v1/queues/mail",
            json!({"retention_secs": 0}),
            "retention_secs must be between 3600",
        ),
        (
            "/api/v1/queues/mail",
            json!({"keep_failed_secs": 1e300}),
            "keep_failed_secs must be between 3600",
        ),
        (
            "/api/v1/queues/mail",
            json!({"keep_failed_secs": 3153600001_u64, "max_running": 5}),
            "keep_failed_secs must be between 3600",
        ),
        (
            "/api/v1/queues/mail",
            json!({"retention_secs": "7 days"}),
            "invalid type",
        ),
        (
            "/api/v1/retention",
            json!({"retention_secs": 0}),
            "retention_secs must be between 3600",
        ),
        (
            "/api/v1/retention",
            json!({"retention_secs": -1, "enabled": false}),
            "retention_secs must be between 3600",
        ),
        (
            "/api/v1/retention",
            json!({"keep_failed_secs": 1e12}),
            "keep_failed_secs must be between 3600",
        ),
        (
            "/api/v1/retention",
            json!({"keep_keys_secs": 60}),
            "keep_keys_secs must be between 3600",
        ),
        (
            "/api/v1/retention",
            json!({"enable": false}),
            "unknown field",
        ),
    ] {
        let (got, answer) = api
            .call(Method::PATCH, path, &api.admin, Some(body.clone()))
            .await;
        assert_eq!(got, StatusCode::BAD_REQUEST, "{path} {body}: {answer}");
        assert!(
            answer["message"].as_str().unwrap_or("").contains(says),
            "{path} {body}: {answer}"
        );
    }
    assert_eq!(snapshot().await, before, "nothing changed");

    // Off, and the answer says so.
    let (status, body) = api
        .call(
            Method::PATCH,
            "/api/v1/retention",
            &api.admin,
            Some(json!({"enabled": false})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["enabled"], json!(false));
    assert_eq!(body["retention_secs"], json!(1209600.0), "the rest is kept");
}

#[tokio::test]
async fn cli_shows_and_sets_the_clusters_retention_and_a_queues() {
    let api = crate::cli::Api::start().await;
    let out = api.ok(&["retention", "show"]).await;
    assert_eq!(
        out.trim(),
        "retention on: finished tasks kept 7d, failed ones 30d; artifacts nothing refers to kept 1d; \
         idempotency keys kept 1d after their task"
    );
    let out = api
        .ok(&["retention", "set", "--keep", "14d", "--keep-failed", "8w"])
        .await;
    assert!(out.contains("kept 14d, failed ones 56d"), "{out}");
    let out = api.ok(&["retention", "set", "--keep-keys", "3d"]).await;
    assert!(out.contains("idempotency keys kept 3d"), "{out}");
    let out = crate::cli::output(&mut api.sked(&["retention", "set", "--keep-keys", "10m"])).await;
    let said = crate::cli::text(&out.stderr);
    assert!(
        !out.status.success() && said.contains("--keep-keys must be between an hour"),
        "{said}"
    );
    let out = api
        .ok(&["queue", "retention", "scratch", "--keep", "12h"])
        .await;
    assert_eq!(
        out.trim(),
        "scratch: active, no limits, keeps finished tasks 12h, failed ones as the default"
    );
    let out = api.ok(&["queue", "list"]).await;
    assert!(
        out.lines()
            .any(|l| l.starts_with("scratch ") && l.contains("keeps finished tasks 12h")),
        "{out}"
    );
    let out = api.ok(&["retention", "set", "--off"]).await;
    assert!(out.starts_with("retention off"), "{out}");
    let enabled: bool = sqlx::query_scalar("select enabled from sked.retention_settings")
        .fetch_one(&api.db.pool)
        .await
        .unwrap();
    assert!(!enabled);

    for args in [
        &["retention", "set", "--keep", "0"][..],
        &["retention", "set", "--keep", "-1d"],
        &["retention", "set", "--keep-failed", "36501d"],
        &["retention", "set"],
        &["retention", "set", "--on", "--off"],
        &["queue", "retention", "scratch", "--keep", "30m"],
        &["queue", "retention", "scratch"],
    ] {
        let out = crate::cli::output(&mut api.sked(args)).await;
        let stderr = crate::cli::text(&out.stderr);
        assert!(!out.status.success(), "{args:?} fails");
        assert!(!stderr.trim().is_empty(), "{args:?} says why");
    }
    let left: String =
        sqlx::query_scalar("select retention::text from sked.queues where name = 'scratch'")
            .fetch_one(&api.db.pool)
            .await
            .unwrap();
    assert_eq!(left, "12:00:00", "nothing changed");
}

/// `sked.tasks_prune` (a cut-off given by the caller) still deletes by its own cut-off.
#[tokio::test]
async fn the_prune_with_a_cut_off_of_ones_own_ignores_the_settings() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let t = Utc::now();
    let two_days = finished(pool, "default", "succeeded", t - Age::days(2)).await;
    let deleted: i32 = sqlx::query_scalar("select sked.tasks_prune(now() - interval '1 day')")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    assert!(!task_ids(pool).await.contains(&two_days));
}

#[tokio::test]
async fn the_server_role_may_change_and_apply_retention_and_the_worker_role_may_not() {
    let db = TestDb::new().await;
    let rights: Vec<(String, bool, bool)> = sqlx::query_as(
        "select p.proname::text,
                has_function_privilege('sked_server', p.oid, 'execute'),
                has_function_privilege('sked_worker', p.oid, 'execute')
           from pg_proc p
          where p.pronamespace = 'sked'::regnamespace
            and p.proname in ('tasks_prune_expired', 'artifacts_prune', 'retention_set',
                              'queue_set_retention', 'tasks_delete', 'task_retention')
          order by p.proname",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let expected: Vec<(String, bool, bool)> = [
        ("artifacts_prune", true, false),
        ("queue_set_retention", true, false),
        ("retention_set", true, false),
        ("task_retention", false, false),
        ("tasks_delete", false, false),
        ("tasks_prune_expired", true, false),
    ]
    .into_iter()
    .map(|(name, server, worker)| (name.to_owned(), server, worker))
    .collect();
    assert_eq!(
        rights, expected,
        "the server applies and changes retention through its functions; the worker deletes nothing"
    );
    let (server_reads, worker_reads): (bool, bool) = sqlx::query_as(
        "select has_table_privilege('sked_server', 'sked.retention_settings', 'select'),
                has_table_privilege('sked_worker', 'sked.retention_settings', 'select')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!((server_reads, worker_reads), (true, false));
}
