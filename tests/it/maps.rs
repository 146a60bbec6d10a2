//! Tests of maps (dynamic fan-out, "Map" in docs/workflows.md): a workflow task with
//! `map_over` runs once per element of an array in its parent's output. Real workers run the
//! instances with their elements; in SQL, with time as an input: the expansion at the
//! parent's finish, the refusals (not an array, nothing at the path, over the cap), an empty
//! array, the rule across instances, hostile outputs in one finish batch, retries and
//! re-runs, the claim taking instances at full speed, and the submission rules.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use sked_db::testing::TestDb;
use sqlx::PgPool;
use uuid::Uuid;

use crate::support::{config, insert, start_worker, task_id};
use crate::workflows::{
    assert_refused, claim_all, finish_as, map as pairs, states, submit, workflow_state,
};

async fn column<T>(pool: &PgPool, workflow: Uuid, name: &str, col: &str) -> T
where
    T: for<'r> sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres> + Send + Unpin,
{
    let sql = format!("select {col} from sked.tasks where workflow_id = $1 and name = $2");
    sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
        .bind(workflow)
        .bind(name)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// extract → m (a map over `map_over`, with `extra` keys) → sink.
fn mapped(map_over: &str, extra: Value) -> Value {
    let mut m = json!({"name": "m", "command": ["true"], "depends_on": ["extract"],
                       "map_over": map_over, "max_attempts": 1});
    for (k, v) in extra.as_object().unwrap() {
        m[k] = v.clone();
    }
    json!({"name": "mapped", "tasks": [
        {"name": "extract", "command": ["true"]},
        m,
        {"name": "sink", "command": ["true"], "depends_on": ["m"]},
    ]})
}

/// Submits `mapped(...)` and finishes extract with `output`; returns the workflow.
async fn extract_writes(
    pool: &PgPool,
    map_over: &str,
    extra: Value,
    output: Value,
    now: DateTime<Utc>,
) -> Uuid {
    let wf = submit(pool, mapped(map_over, extra)).await;
    assert_eq!(claim_all(pool, now).await, vec!["extract"]);
    assert_eq!(
        finish_as(pool, wf, "extract", "succeeded", Some(output), now).await,
        "succeeded"
    );
    wf
}

/// A moment after the tasks a test submits became due (they are due at the database's now).
fn soon() -> DateTime<Utc> {
    Utc::now() + chrono::Duration::seconds(5)
}

#[tokio::test]
async fn a_worker_runs_one_instance_per_element_with_its_item_and_the_sink_gets_their_outputs() {
    let db = TestDb::new().await;
    let worker = start_worker(&db, config(&["default"]));
    let wf = submit(
        &db.pool,
        json!({"tasks": [
            {"name": "extract", "command": ["sh", "-c", r#"echo '{"rows": [1, "two", {"x": 3}]}'"#]},
            {"name": "m", "depends_on": ["extract"], "map_over": "extract.rows",
             "command": ["sh", "-c",
                         r#"in=$(cat); echo "{\"stdin\": $in, \"item\": $SKED_MAP_ITEM, \"index\": $SKED_MAP_INDEX}""#]},
            {"name": "sink", "depends_on": ["m"], "command": ["sh", "-c", "cat"]},
        ]}),
    )
    .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while workflow_state(&db.pool, wf).await == "running" {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the workflow finishes: {:?}",
            states(&db.pool, wf).await
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(workflow_state(&db.pool, wf).await, "succeeded");
    assert_eq!(
        states(&db.pool, wf).await,
        pairs(&[
            ("extract", "succeeded"),
            ("m", "succeeded"),
            ("m[0]", "succeeded"),
            ("m[1]", "succeeded"),
            ("m[2]", "succeeded"),
            ("sink", "succeeded"),
        ])
    );
    let outputs = json!([
        {"stdin": 1, "item": 1, "index": 0},
        {"stdin": "two", "item": "two", "index": 1},
        {"stdin": {"x": 3}, "item": {"x": 3}, "index": 2},
    ]);
    let m: Option<Value> = column(&db.pool, wf, "m", "output").await;
    assert_eq!(
        m,
        Some(outputs.clone()),
        "the map's output is its instances' by index"
    );
    let sink: Option<Value> = column(&db.pool, wf, "sink", "output").await;
    assert_eq!(
        sink,
        Some(json!({"m": outputs})),
        "the sink gets the map's output"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn a_map_expands_when_its_parent_succeeds_and_its_instances_are_claimed_at_once() {
    let db = TestDb::new().await;
    let now = soon();
    let wf = extract_writes(
        &db.pool,
        "extract",
        json!({}),
        json!([10, 11, 12, 13, 14]),
        now,
    )
    .await;
    let m = task_id(&db.pool, wf, "m").await;
    let (state, total, rule, pending): (String, i32, String, i32) = sqlx::query_as(
        "select state, shard_total, trigger_rule, parents_pending from sked.tasks where id = $1",
    )
    .bind(m)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (state.as_str(), total, rule.as_str(), pending),
        ("blocked", 5, "shards", 5)
    );
    let inputs: Vec<(String, Value, i32, i32)> = sqlx::query_as(
        "select name, input, shard_index, parents from sked.tasks where shard_of = $1 order by shard_index",
    )
    .bind(m)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        inputs,
        (0..5)
            .map(|i| (format!("m[{i}]"), json!(10 + i), i, 0))
            .collect::<Vec<_>>()
    );
    // Unlike new shards of a sharded task, which one claim takes one at a time, a map's
    // instances are all taken by one claim.
    let claimed = claim_all(&db.pool, now).await;
    assert_eq!(claimed, vec!["m[0]", "m[1]", "m[2]", "m[3]", "m[4]"]);
    for i in 0..5 {
        let out = json!({"i": i});
        finish_as(
            &db.pool,
            wf,
            &format!("m[{i}]"),
            "succeeded",
            Some(out),
            now,
        )
        .await;
    }
    let out: Option<Value> = column(&db.pool, wf, "m", "output").await;
    assert_eq!(
        out,
        Some(json!([{"i": 0}, {"i": 1}, {"i": 2}, {"i": 3}, {"i": 4}]))
    );
    assert_eq!(claim_all(&db.pool, now).await, vec!["sink"]);
}

#[tokio::test]
async fn an_array_the_map_cannot_take_ends_it_upstream_failed_saying_what_was_found() {
    let db = TestDb::new().await;
    let now = soon();
    let cases = [
        (
            "extract.rows",
            json!({}),
            json!({"rows": {"a": 1}}),
            r#"not run: the map over 'extract.rows' needs an array, but the output of 'extract' has an object there: {"a": 1}"#,
        ),
        (
            "extract.rows",
            json!({}),
            json!({"rows": "1,2,3"}),
            r#"not run: the map over 'extract.rows' needs an array, but the output of 'extract' has a string there: "1,2,3""#,
        ),
        (
            "extract.rows",
            json!({}),
            json!({"other": [1]}),
            "not run: the map over 'extract.rows' needs an array, but the output of 'extract' has nothing at that path",
        ),
        (
            "extract.a.b",
            json!({}),
            json!({"a": [1]}),
            "not run: the map over 'extract.a.b' needs an array, but the output of 'extract' has nothing at that path",
        ),
        (
            "extract",
            json!({}),
            json!(null),
            "not run: the map over 'extract' needs an array, but the output of 'extract' has a null there: null",
        ),
        (
            "extract",
            json!({"map_max": 2}),
            json!([1, 2, 3]),
            "not run: the map over 'extract' has 3 elements, more than its cap (map_max 2)",
        ),
    ];
    for (map_over, extra, output, says) in cases {
        let wf = extract_writes(&db.pool, map_over, extra, output.clone(), now).await;
        assert_eq!(
            states(&db.pool, wf).await,
            pairs(&[
                ("extract", "succeeded"),
                ("m", "upstream_failed"),
                ("sink", "upstream_failed"),
            ]),
            "{output}"
        );
        let error: Option<String> = column(&db.pool, wf, "m", "error").await;
        assert_eq!(error.as_deref(), Some(says));
        assert_eq!(workflow_state(&db.pool, wf).await, "failed");
    }
}

#[tokio::test]
async fn the_default_cap_of_ten_thousand_holds_and_a_larger_map_max_lifts_it() {
    let db = TestDb::new().await;
    let now = soon();
    let big: Vec<i32> = (0..10_001).collect();
    let wf = extract_writes(&db.pool, "extract", json!({}), json!(big), now).await;
    let error: Option<String> = column(&db.pool, wf, "m", "error").await;
    assert_eq!(
        error.as_deref(),
        Some(
            "not run: the map over 'extract' has 10001 elements, more than its cap (map_max 10000)"
        )
    );
    let wf = extract_writes(
        &db.pool,
        "extract",
        json!({"map_max": 20000}),
        json!(big),
        now,
    )
    .await;
    let total: Option<i32> = column(&db.pool, wf, "m", "shard_total").await;
    assert_eq!(total, Some(10_001));
}

#[tokio::test]
async fn an_empty_array_succeeds_the_map_at_once_with_an_empty_output_and_its_children_run() {
    let db = TestDb::new().await;
    let now = soon();
    let wf = extract_writes(
        &db.pool,
        "extract.rows",
        json!({}),
        json!({"rows": []}),
        now,
    )
    .await;
    assert_eq!(
        states(&db.pool, wf).await,
        pairs(&[
            ("extract", "succeeded"),
            ("m", "succeeded"),
            ("sink", "waiting")
        ])
    );
    let out: Option<Value> = column(&db.pool, wf, "m", "output").await;
    assert_eq!(out, Some(json!([])));
    assert_eq!(claim_all(&db.pool, now).await, vec!["sink"]);
    finish_as(&db.pool, wf, "sink", "succeeded", None, now).await;
    assert_eq!(workflow_state(&db.pool, wf).await, "succeeded");
}

#[tokio::test]
async fn a_failed_instance_fails_the_map_by_default_and_all_done_lets_the_children_run() {
    let db = TestDb::new().await;
    let now = soon();
    for (extra, m_state, sink_state) in [
        (json!({}), "upstream_failed", "upstream_failed"),
        (
            json!({"map_trigger_rule": "all_success"}),
            "upstream_failed",
            "upstream_failed",
        ),
        (
            json!({"map_trigger_rule": "all_done"}),
            "succeeded",
            "waiting",
        ),
    ] {
        let wf = extract_writes(
            &db.pool,
            "extract",
            extra.clone(),
            json!(["a", "b", "c"]),
            now,
        )
        .await;
        assert_eq!(claim_all(&db.pool, now).await, vec!["m[0]", "m[1]", "m[2]"]);
        finish_as(&db.pool, wf, "m[0]", "succeeded", Some(json!(0)), now).await;
        assert_eq!(
            finish_as(&db.pool, wf, "m[1]", "failed", None, now).await,
            "failed"
        );
        finish_as(&db.pool, wf, "m[2]", "succeeded", Some(json!(2)), now).await;
        let s = states(&db.pool, wf).await;
        assert_eq!(
            (s["m"].as_str(), s["sink"].as_str()),
            (m_state, sink_state),
            "{extra}"
        );
        let (out, error): (Option<Value>, Option<String>) = (
            column(&db.pool, wf, "m", "output").await,
            column(&db.pool, wf, "m", "error").await,
        );
        if m_state == "succeeded" {
            assert_eq!(
                out,
                Some(json!([0, null, 2])),
                "null for the failed instance"
            );
            assert_eq!(error, None);
            assert_eq!(claim_all(&db.pool, now).await, vec!["sink"]);
            finish_as(&db.pool, wf, "sink", "succeeded", None, now).await;
            assert_eq!(
                workflow_state(&db.pool, wf).await,
                "failed",
                "a failed instance is a failed task of the workflow"
            );
        } else {
            assert_eq!(out, None);
            assert!(
                error
                    .as_deref()
                    .unwrap_or("")
                    .starts_with("shard 1 of 3 failed"),
                "{error:?}"
            );
        }
    }
}

#[tokio::test]
async fn retrying_a_failed_instance_reruns_it_alone_and_the_map_and_its_children_follow() {
    let db = TestDb::new().await;
    let now = soon();
    let wf = extract_writes(&db.pool, "extract", json!({}), json!(["a", "b", "c"]), now).await;
    claim_all(&db.pool, now).await;
    finish_as(&db.pool, wf, "m[0]", "succeeded", Some(json!(0)), now).await;
    finish_as(&db.pool, wf, "m[1]", "failed", None, now).await;
    finish_as(&db.pool, wf, "m[2]", "succeeded", Some(json!(2)), now).await;
    assert_eq!(workflow_state(&db.pool, wf).await, "failed");

    let one = task_id(&db.pool, wf, "m[1]").await;
    let after: String = sqlx::query_scalar("select sked.task_retry($1, $2)")
        .bind(one)
        .bind(now)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, "waiting");
    assert_eq!(
        states(&db.pool, wf).await,
        pairs(&[
            ("extract", "succeeded"),
            ("m", "blocked"),
            ("m[0]", "succeeded"),
            ("m[1]", "waiting"),
            ("m[2]", "succeeded"),
            ("sink", "blocked"),
        ])
    );
    assert_eq!(claim_all(&db.pool, now).await, vec!["m[1]"]);
    finish_as(&db.pool, wf, "m[1]", "succeeded", Some(json!(1)), now).await;
    let out: Option<Value> = column(&db.pool, wf, "m", "output").await;
    assert_eq!(out, Some(json!([0, 1, 2])));
    let attempts: Vec<i32> =
        sqlx::query_scalar("select attempt from sked.tasks where shard_of = (select id from sked.tasks where workflow_id = $1 and name = 'm') order by shard_index")
            .bind(wf)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        attempts,
        vec![1, 2, 1],
        "only the failed instance ran again"
    );
    assert_eq!(claim_all(&db.pool, now).await, vec!["sink"]);
}

#[tokio::test]
async fn rerunning_the_parent_of_a_map_that_could_not_expand_expands_it() {
    let db = TestDb::new().await;
    let now = soon();
    let wf = extract_writes(&db.pool, "extract.rows", json!({}), json!({"rows": 7}), now).await;
    assert_eq!(states(&db.pool, wf).await["m"], "upstream_failed");
    let extract = task_id(&db.pool, wf, "extract").await;
    let _: String = sqlx::query_scalar("select sked.task_retry($1, $2)")
        .bind(extract)
        .bind(now)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        states(&db.pool, wf).await,
        pairs(&[
            ("extract", "waiting"),
            ("m", "blocked"),
            ("sink", "blocked")
        ])
    );
    assert_eq!(claim_all(&db.pool, now).await, vec!["extract"]);
    finish_as(
        &db.pool,
        wf,
        "extract",
        "succeeded",
        Some(json!({"rows": [1, 2]})),
        now,
    )
    .await;
    assert_eq!(claim_all(&db.pool, now).await, vec!["m[0]", "m[1]"]);
}

/// Everything in the parent's output is a task's to choose: in one finish batch, outputs that
/// no map can take (deeply nested, huge, not arrays, elements too large for an instance, far
/// more elements than any cap, strings of escapes) each end their own map, and the other
/// tasks of the batch finish as usual.
#[tokio::test]
async fn hostile_outputs_in_one_finish_batch_fail_only_their_own_maps() {
    let db = TestDb::new().await;
    let now = soon();
    let huge_element = "x".repeat(70_000);
    let many: Vec<u8> = vec![0; 200_000];
    let cases: Vec<(&str, Value, &str)> = vec![
        // Nested 3,000 deep: put in place by the statement below.
        ("extract.rows", json!(null), "has an object there"),
        (
            "extract",
            json!([1, huge_element, 3]),
            "not run: element 1 of the map over 'extract' takes 70002 bytes as JSON, more than an instance takes (65536)",
        ),
        (
            "extract",
            json!(many),
            "has 200000 elements, more than its cap (map_max 10000)",
        ),
        (
            "extract.rows",
            json!({"rows": "x".repeat(1_000_000)}),
            "has a string there",
        ),
        (
            "extract.a.b.c",
            json!({"a": [{"b": 1}]}),
            "has nothing at that path",
        ),
    ];
    let mut workflows = vec![];
    for (map_over, _, _) in &cases {
        workflows.push(submit(&db.pool, mapped(map_over, json!({}))).await);
    }
    let good = submit(&db.pool, mapped("extract", json!({}))).await;
    let plain = insert(&db.pool, "(command) values ('{true}')").await;
    let claimed = claim_all(&db.pool, now).await;
    assert_eq!(claimed.len(), cases.len() + 2, "{claimed:?}");

    let mut ids = vec![];
    let mut outputs = vec![];
    for (wf, (_, output, _)) in workflows.iter().zip(&cases) {
        ids.push(task_id(&db.pool, *wf, "extract").await);
        outputs.push(Some(output.clone()));
    }
    ids.push(task_id(&db.pool, good, "extract").await);
    outputs.push(Some(json!(["ok", "\\u0000", "\u{1}", {"a.b": "c"}])));
    ids.push(plain);
    outputs.push(None);
    let n = ids.len();
    let finished: Vec<(Uuid, String)> = sqlx::query_as(
        "select * from sked.tasks_finish($1, array_fill(1, array[$2]), array_fill('succeeded'::text, array[$2]),
                                         array_fill(0, array[$2]), array_fill(null::text, array[$2]),
                                         array_fill(null::text, array[$2]), array_fill(null::text, array[$2]),
                                         array_fill(null::text, array[$2]),
                                         array[(repeat('{\"rows\": ', 3000) || '[1]' || repeat('}', 3000))::jsonb]
                                           || ($3::jsonb[])[2:], $4)",
    )
    .bind(&ids)
    .bind(n as i32)
    .bind(&outputs)
    .bind(now)
    .fetch_all(&db.pool)
    .await
    .expect("one statement finishes the whole batch");
    assert_eq!(finished.len(), n);
    assert!(
        finished.iter().all(|(_, s)| s == "succeeded"),
        "{finished:?}"
    );

    for (wf, (_, _, says)) in workflows.iter().zip(&cases) {
        assert_eq!(states(&db.pool, *wf).await["m"], "upstream_failed");
        let error: Option<String> = column(&db.pool, *wf, "m", "error").await;
        let error = error.unwrap();
        assert!(error.contains(says), "{error:.300} says {says}");
        assert!(error.len() < 1000, "the error quotes at most an excerpt");
    }
    let items: Vec<(Value, String)> = sqlx::query_as(
        "select s.input, s.state from sked.tasks s join sked.tasks m on m.id = s.shard_of
          where m.workflow_id = $1 order by s.shard_index",
    )
    .bind(good)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        items,
        vec![
            (json!("ok"), "waiting".to_string()),
            (json!("\\u0000"), "waiting".to_string()),
            (json!("\u{1}"), "waiting".to_string()),
            (json!({"a.b": "c"}), "waiting".to_string()),
        ]
    );
}

#[tokio::test]
async fn bad_maps_are_rejected_with_the_rule_and_nothing_is_inserted() {
    let db = TestDb::new().await;
    let cases = [
        (
            mapped("other.rows", json!({})),
            "workflows_map_over_must_name_a_parent",
            "task 'm' maps over \"other.rows\", which does not begin with the name of a task it depends on (it depends on: 'extract')",
        ),
        (
            mapped("extractx", json!({})),
            "workflows_map_over_must_name_a_parent",
            "which does not begin with the name of a task it depends on",
        ),
        (
            json!({"tasks": [{"name": "extract", "command": ["true"]},
                             {"name": "m", "command": ["true"], "map_over": 5, "depends_on": ["extract"]}]}),
            "workflows_map_over_must_name_a_parent",
            "map_over of task 'm' must be a string",
        ),
        (
            json!({"tasks": [{"name": "extract", "command": ["true"]},
                             {"name": "m", "command": ["true"], "map_over": "extract"}]}),
            "workflows_map_over_must_name_a_parent",
            "(it depends on: none)",
        ),
        (
            mapped("extract", json!({"shards": 2})),
            "workflows_map_must_not_be_sharded_or_a_branch",
            "task 'm' maps over an array and is sharded (shards or broadcast)",
        ),
        (
            mapped("extract", json!({"branch": true})),
            "workflows_map_must_not_be_sharded_or_a_branch",
            "is a branch",
        ),
        (
            mapped("extract", json!({"map_max": 0})),
            "workflows_map_max_must_be_1_to_100000",
            "map_max of task 'm' must be a whole number from 1 to 100000, not 0",
        ),
        (
            mapped("extract", json!({"map_max": 100001})),
            "workflows_map_max_must_be_1_to_100000",
            "not 100001",
        ),
        (
            mapped("extract", json!({"map_max": 2.5})),
            "workflows_map_max_must_be_1_to_100000",
            "not 2.5",
        ),
        (
            mapped("extract", json!({"map_max": "10"})),
            "workflows_map_max_must_be_1_to_100000",
            "not \"10\"",
        ),
        (
            mapped("extract", json!({"map_trigger_rule": "one_failed"})),
            "workflows_map_trigger_rule_is_known",
            "task 'm' has the map_trigger_rule \"one_failed\" (expected all_success or all_done)",
        ),
        (
            json!({"tasks": [{"name": "a", "command": ["true"], "map_max": 3}]}),
            "workflows_map_settings_need_map_over",
            "task 'a' has map_max or map_trigger_rule but no map_over",
        ),
    ];
    for (spec, rule, says) in cases {
        assert_refused(&db.pool, &spec, rule, says).await;
    }
}

#[tokio::test]
async fn a_parent_whose_name_has_dots_is_matched_whole_and_a_number_picks_an_element() {
    let db = TestDb::new().await;
    let now = soon();
    let wf = submit(
        &db.pool,
        json!({"tasks": [
            {"name": "ex", "command": ["true"]},
            {"name": "ex.tract", "command": ["true"]},
            {"name": "m", "command": ["true"], "depends_on": ["ex", "ex.tract"],
             "map_over": "ex.tract.pages.1"},
        ]}),
    )
    .await;
    claim_all(&db.pool, now).await;
    finish_as(
        &db.pool,
        wf,
        "ex",
        "succeeded",
        Some(json!({"tract": 1})),
        now,
    )
    .await;
    finish_as(
        &db.pool,
        wf,
        "ex.tract",
        "succeeded",
        Some(json!({"pages": [[0], ["p", "q"]]})),
        now,
    )
    .await;
    assert_eq!(claim_all(&db.pool, now).await, vec!["m[0]", "m[1]"]);
}

async fn call(
    router: &axum::Router,
    method: axum::http::Method,
    uri: &str,
    token: &str,
    body: Option<Value>,
) -> (axum::http::StatusCode, Value) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let request = axum::http::Request::builder()
        .method(method)
        .uri(uri)
        .header(axum::http::header::AUTHORIZATION, format!("Bearer {token}"))
        .header(axum::http::header::CONTENT_TYPE, "application/json")
        .body(body.map_or_else(axum::body::Body::empty, |b| {
            axum::body::Body::from(b.to_string())
        }))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn rest_and_cli_submit_maps_and_list_their_instances() {
    use axum::http::{Method, StatusCode};
    let db = TestDb::new().await;
    let router = sked_server::router(db.pool.clone());
    let alice = sked_db::token::create(&db.pool, "alice", sked_db::token::Role::User, "t")
        .await
        .unwrap();
    let spec = json!({"tasks": [
        {"name": "extract", "command": ["true"]},
        {"name": "m", "command": ["true"], "depends_on": ["extract"], "map_over": "extract.rows",
         "map_max": 5, "map_trigger_rule": "all_done"},
    ]});
    let (status, body) = call(
        &router,
        Method::POST,
        "/api/v1/workflows",
        &alice,
        Some(spec),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let wf: Uuid = body["id"].as_str().unwrap().parse().unwrap();
    let (over, max, rule): (Option<String>, Option<i32>, Option<String>) = sqlx::query_as(
        "select map_over, map_max, map_trigger_rule from sked.tasks where workflow_id = $1 and name = 'm'",
    )
    .bind(wf)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        (over.as_deref(), max, rule.as_deref()),
        (Some("extract.rows"), Some(5), Some("all_done"))
    );
    let now = soon();
    claim_all(&db.pool, now).await;
    finish_as(
        &db.pool,
        wf,
        "extract",
        "succeeded",
        Some(json!({"rows": ["a", "b"]})),
        now,
    )
    .await;
    let (status, detail) = call(
        &router,
        Method::GET,
        &format!("/api/v1/workflows/{wf}"),
        &alice,
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    let names: Vec<&str> = detail["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["extract", "m", "m[0]", "m[1]"],
        "each instance is listed"
    );

    for (spec, says) in [
        (
            json!({"tasks": [{"name": "a", "command": ["true"]},
                             {"name": "m", "command": ["true"], "depends_on": ["a"], "map_over": "b"}]}),
            "task 'm' maps over \"b\", which does not begin with the name of a task it depends on (it depends on: 'a')",
        ),
        (
            json!({"tasks": [{"name": "a", "command": ["true"]},
                             {"name": "m", "command": ["true"], "depends_on": ["a"], "map_over": "a",
                              "map_max": 0}]}),
            "map_max of task 'm' must be a whole number from 1 to 100000",
        ),
    ] {
        let (status, body) = call(
            &router,
            Method::POST,
            "/api/v1/workflows",
            &alice,
            Some(spec),
        )
        .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        assert!(body["message"].as_str().unwrap().contains(says), "{body}");
    }
    let (status, body) = call(
        &router,
        Method::POST,
        "/api/v1/workflows",
        &alice,
        Some(
            json!({"tasks": [{"name": "a", "command": ["true"], "map_trigger_rule": "sometimes"}]}),
        ),
    )
    .await;
    assert!(status.is_client_error(), "{body}");

    // The CLI reads the same keys from YAML.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let stop = tokio_util::sync::CancellationToken::new();
    let _stop_on_drop = stop.clone().drop_guard();
    tokio::spawn(sked_server::serve(db.pool.clone(), listener, stop));
    let file = std::env::temp_dir().join(format!("sked-map-{}.yaml", Uuid::new_v4().simple()));
    std::fs::write(
        &file,
        "tasks:\n  - name: extract\n    command: [\"true\"]\n  - name: per-row\n    command: [\"true\"]\n    depends_on: [extract]\n    map_over: extract.rows\n    map_max: 100\n",
    )
    .unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_sked"))
        .args(["submit", "-f", file.to_str().unwrap()])
        .env("SKED_URL", &url)
        .env("SKED_TOKEN", &alice)
        .env_remove("DATABASE_URL")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .unwrap();
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "{out:?}");
    let id: Uuid = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap();
    let over: Option<String> = column(&db.pool, id, "per-row", "map_over").await;
    assert_eq!(over.as_deref(), Some("extract.rows"));
}

#[tokio::test]
async fn retrying_an_all_done_map_reruns_its_failed_instances_and_takes_their_outputs_again() {
    let db = TestDb::new().await;
    let now = soon();
    let extra = json!({"map_trigger_rule": "all_done"});
    let wf = extract_writes(&db.pool, "extract", extra, json!(["a", "b"]), now).await;
    claim_all(&db.pool, now).await;
    finish_as(&db.pool, wf, "m[0]", "succeeded", Some(json!(0)), now).await;
    finish_as(&db.pool, wf, "m[1]", "failed", None, now).await;
    assert_eq!(states(&db.pool, wf).await["m"], "succeeded");
    let m = task_id(&db.pool, wf, "m").await;
    let after: String = sqlx::query_scalar("select sked.task_retry($1, $2)")
        .bind(m)
        .bind(now)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(after, "blocked");
    assert_eq!(claim_all(&db.pool, now).await, vec!["m[1]", "sink"]);
    finish_as(&db.pool, wf, "m[1]", "succeeded", Some(json!(1)), now).await;
    let out: Option<Value> = column(&db.pool, wf, "m", "output").await;
    assert_eq!(out, Some(json!([0, 1])));
}
