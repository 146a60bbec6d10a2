//! Idempotency keys (docs/sql.md, "Idempotency keys"): an owner's key names the first task
//! submitted with it for as long as that task is kept, in every state, and for a window after
//! it is deleted; a second submission with the same definition is answered with that task
//! (`created` false), one with another definition is a conflict, and a plain INSERT that
//! reuses a key is refused.

use std::time::Duration;

use serde_json::json;
use sked_db::testing::TestDb;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{config, start_worker, wait_for};
use crate::trust_roles::Login;

/// `sked.tasks_submit` of one task: (id, created).
async fn submit(pool: &PgPool, task: serde_json::Value) -> Result<(Uuid, bool), sqlx::Error> {
    sqlx::query_as("select id, created from sked.tasks_submit($1)")
        .bind(json!([task]))
        .fetch_one(pool)
        .await
}

/// The SQLSTATE and constraint of a database error.
fn refusal(e: &sqlx::Error) -> (String, String) {
    let db = e.as_database_error().expect("a database error");
    (
        db.code().unwrap_or_default().into_owned(),
        db.constraint().unwrap_or_default().to_owned(),
    )
}

async fn tasks(pool: &PgPool) -> i64 {
    sqlx::query_scalar("select count(*) from sked.tasks")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_key_names_its_task_in_every_state_until_the_window_after_its_deletion_ends() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let order = json!({"command": ["true"], "idempotency_key": "order-1", "input": {"n": 1}});
    let (id, created) = submit(pool, order.clone()).await.unwrap();
    assert!(created, "the first submission creates the task");
    assert_eq!(
        submit(pool, order.clone()).await.unwrap(),
        (id, false),
        "while the task waits, the key answers with it"
    );

    let worker = start_worker(&db, config(&["default"]));
    assert_eq!(
        wait_for(pool, id, &["succeeded"], Duration::from_secs(20)).await,
        "succeeded"
    );
    worker.shutdown().await;
    assert_eq!(
        submit(pool, order.clone()).await.unwrap(),
        (id, false),
        "after it succeeded, the key still answers with it: the order runs at most once"
    );
    let named: Uuid =
        sqlx::query_scalar("select sked.task_submit(command => array['true'], idempotency_key => 'order-1', input => '{\"n\": 1}')")
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(named, id, "sked.task_submit answers with the same task");
    let later = json!({"command": ["true"], "idempotency_key": "order-1", "input": {"n": 1},
                       "delay": "1 hour", "priority": 0});
    assert_eq!(
        submit(pool, later).await.unwrap(),
        (id, false),
        "when it runs, and a field given its default, are not part of the definition"
    );
    assert_eq!(tasks(pool).await, 1);

    // Deleted (as retention deletes it): the key outlives it for keep_keys.
    let deleted: i32 = sqlx::query_scalar("select sked.tasks_delete(array[$1::uuid])")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let window: f64 = sqlx::query_scalar(
        "select extract(epoch from forget_at - now())::float8 from sked.idempotency_keys
          where key = 'order-1'",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert!(
        (86_390.0..=86_400.0).contains(&window),
        "forgotten a day (the default keep_keys) after the deletion: {window}"
    );
    assert_eq!(
        submit(pool, order.clone()).await.unwrap(),
        (id, false),
        "within the window the key still names the deleted task"
    );
    assert_eq!(tasks(pool).await, 0, "and nothing is inserted");

    // The window passes.
    sqlx::query("update sked.idempotency_keys set forget_at = now() - interval '1 second'")
        .execute(pool)
        .await
        .unwrap();
    let (again, created) = submit(pool, order.clone()).await.unwrap();
    assert!(created && again != id, "a forgotten key is free again");
    assert_eq!(
        submit(pool, order).await.unwrap(),
        (again, false),
        "and names the new task"
    );

    // The prune deletes forgotten keys only.
    sqlx::query("insert into sked.tasks (command, idempotency_key) values (array['true'], 'gone')")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("delete from sked.tasks where idempotency_key = 'gone'")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("update sked.idempotency_keys set forget_at = now() - interval '1 second' where key = 'gone'")
        .execute(pool)
        .await
        .unwrap();
    let pruned: i32 = sqlx::query_scalar("select sked.idempotency_keys_prune()")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(pruned, 1);
    let left: Vec<String> =
        sqlx::query_scalar("select key from sked.idempotency_keys order by key")
            .fetch_all(pool)
            .await
            .unwrap();
    assert_eq!(left, vec!["order-1"]);
}

#[tokio::test]
async fn another_definition_with_a_key_is_a_conflict_and_changes_nothing() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let (id, _) = submit(
        pool,
        json!({"command": ["a"], "idempotency_key": "k", "input": 1}),
    )
    .await
    .unwrap();
    sqlx::query("select sked.task_cancel($1)")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    for other in [
        json!({"command": ["b"], "idempotency_key": "k", "input": 1}),
        json!({"command": ["a"], "idempotency_key": "k", "input": 2}),
        json!({"command": ["a"], "idempotency_key": "k", "input": 1, "queue": "other"}),
    ] {
        let e = submit(pool, other.clone()).await.unwrap_err();
        assert_eq!(
            refusal(&e),
            (
                "23505".to_owned(),
                "tasks_idempotency_key_names_another_definition".to_owned()
            ),
            "{other}: {e}"
        );
        let db_error = e.as_database_error().unwrap();
        assert!(
            db_error.message().contains("another definition"),
            "{}",
            db_error.message()
        );
    }
    // In a batch: the whole batch is refused.
    let e = sqlx::query("select * from sked.tasks_submit($1)")
        .bind(json!([{"command": ["fresh"]},
                     {"command": ["b"], "idempotency_key": "k", "input": 1}]))
        .execute(pool)
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&e).1,
        "tasks_idempotency_key_names_another_definition"
    );
    // Two tasks of one batch with one key and different definitions.
    let e = sqlx::query("select * from sked.tasks_submit($1)")
        .bind(json!([{"command": ["x"], "idempotency_key": "k2"},
                     {"command": ["y"], "idempotency_key": "k2"}]))
        .execute(pool)
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&e).1,
        "tasks_idempotency_key_names_another_definition"
    );
    assert_eq!(tasks(pool).await, 1, "nothing was inserted");
}

#[tokio::test]
async fn a_plain_insert_that_reuses_a_key_is_refused_and_the_functions_answer_with_its_task() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let id: Uuid = sqlx::query_scalar(
        "insert into sked.tasks (command, idempotency_key) values (array['true'], 'k') returning id",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(
        submit(pool, json!({"command": ["true"], "idempotency_key": "k"}))
            .await
            .unwrap(),
        (id, false),
        "a key taken by a plain INSERT names its task for the submit functions"
    );
    sqlx::query("select sked.task_cancel($1)")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
    for sql in [
        "insert into sked.tasks (command, idempotency_key) values (array['true'], 'k')",
        "insert into sked.tasks (command, idempotency_key) values (array['1'], 'j'), (array['1'], 'j')",
    ] {
        let e = sqlx::query(sql).execute(pool).await.unwrap_err();
        assert_eq!(
            refusal(&e),
            (
                "23505".to_owned(),
                "tasks_idempotency_key_names_another_task".to_owned()
            ),
            "{sql}"
        );
    }
    // Neither the key nor the owner of a task with a key changes.
    for sql in [
        "update sked.tasks set idempotency_key = 'other'",
        "update sked.tasks set idempotency_key = null",
        "update sked.tasks set owner = 'someone'",
    ] {
        let e = sqlx::query(sql).execute(pool).await.unwrap_err();
        assert_eq!(
            refusal(&e),
            (
                "23514".to_owned(),
                "tasks_idempotency_key_is_fixed".to_owned()
            ),
            "{sql}"
        );
    }
    assert_eq!(tasks(pool).await, 1);
}

#[tokio::test]
async fn concurrent_submissions_of_one_key_make_one_task() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let task = json!({"command": ["true"], "idempotency_key": "race"});

    // The first transaction holds the key uncommitted; the second waits for it.
    for commit in [true, false] {
        sqlx::query("delete from sked.idempotency_keys")
            .execute(pool)
            .await
            .unwrap();
        sqlx::query("delete from sked.tasks")
            .execute(pool)
            .await
            .unwrap();
        let mut first = pool.begin().await.unwrap();
        let (a, created): (Uuid, bool) =
            sqlx::query_as("select id, created from sked.tasks_submit($1)")
                .bind(json!([task]))
                .fetch_one(&mut *first)
                .await
                .unwrap();
        assert!(created);
        let second = tokio::spawn({
            let pool = pool.clone();
            let task = task.clone();
            async move { submit(&pool, task).await.unwrap() }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !second.is_finished(),
            "the second submission waits for the first"
        );
        if commit {
            first.commit().await.unwrap();
            assert_eq!(
                second.await.unwrap(),
                (a, false),
                "the first committed: the second is answered with its task"
            );
        } else {
            first.rollback().await.unwrap();
            let (b, created) = second.await.unwrap();
            assert!(
                created && b != a,
                "the first rolled back: the second creates the task"
            );
        }
        assert_eq!(tasks(pool).await, 1);
    }
}

#[tokio::test]
async fn a_submitter_neither_takes_nor_learns_another_owners_key() {
    let db = TestDb::new().await;
    let bobs: Uuid = sqlx::query_scalar(
        "select sked.task_submit(command => array['true'], owner => 'bob', idempotency_key => 'k')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let alice = Login::new(&db, "sked_submitter").await;
    let e = submit(
        &alice.pool,
        json!({"command": ["true"], "owner": "bob", "idempotency_key": "k"}),
    )
    .await
    .unwrap_err();
    assert_eq!(refusal(&e).0, "42501", "{e}");
    assert!(!e.to_string().contains(&bobs.to_string()), "{e}");
    let (own, created) = submit(
        &alice.pool,
        json!({"command": ["true"], "idempotency_key": "k"}),
    )
    .await
    .unwrap();
    assert!(created && own != bobs, "keys are per owner");
    let keys: i64 = sqlx::query_scalar("select count(*) from sked.idempotency_keys")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(keys, 2);
    let read = sqlx::query("select * from sked.idempotency_keys")
        .execute(&alice.pool)
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&read).0,
        "42501",
        "the keys are read only by sked's functions"
    );
}

#[tokio::test]
async fn a_schedules_template_takes_no_key() {
    let db = TestDb::new().await;
    let e = sqlx::query("select sked.schedule_create('s', '0 0 1 1 *', $1)")
        .bind(json!({"command": ["true"], "idempotency_key": "k"}))
        .execute(&db.pool)
        .await
        .unwrap_err();
    assert_eq!(
        refusal(&e),
        (
            "23514".to_owned(),
            "schedules_task_template_must_be_valid".to_owned()
        ),
        "{e}"
    );
    assert!(e.to_string().contains("idempotency_key"), "{e}");
}
