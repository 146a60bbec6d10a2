//! Tests of cron schedules over the REST API (`/api/v1/schedules`, `/api/v1/cron/preview`)
//! and the CLI (`sked schedule …`, `sked cron next`): the lifecycle, owner isolation,
//! validation that changes nothing, and a schedule that fires through a real worker.

use std::time::Duration;

use axum::http::{Method, StatusCode};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};
use uuid::Uuid;

use crate::api::{Api, assert_error};
use crate::cli::{self, output, text};
use crate::support;

/// A schedule that does not fire while a test runs (the router alone runs no background upkeep,
/// and a yearly tick is far away).
fn yearly(name: &str) -> Value {
    json!({"name": name, "cron": "0 0 1 1 *", "task": {"command": ["echo", "hi"]}})
}

async fn create(api: &Api, token: &str, body: Value) -> Value {
    let (status, json) = api.post("/api/v1/schedules", token, body).await;
    assert_eq!(
        status,
        StatusCode::CREATED,
        "a valid schedule is created: {json}"
    );
    json
}

impl Api {
    /// Runs alice's schedule `id` now; the answer, once it says it submitted.
    pub async fn run_now(&self, id: Uuid) -> Value {
        let (status, ran) = self
            .post(
                &format!("/api/v1/schedules/{id}/run"),
                &self.alice,
                json!({}),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{ran}");
        ran
    }
}

fn id_of(json: &Value) -> Uuid {
    json["id"].as_str().expect("an id").parse().expect("a UUID")
}

fn time_of(json: &Value) -> DateTime<Utc> {
    json.as_str()
        .expect("a time")
        .parse()
        .expect("an RFC 3339 time")
}

async fn count(api: &Api, table: &str) -> i64 {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("select count(*) from {table}")))
        .fetch_one(&api.db.pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn create_list_show_change_pause_resume_run_and_delete() {
    let api = Api::new().await;
    let created = create(
        &api,
        &api.alice,
        json!({
            "name": "nightly",
            "cron": "0 3 * * *",
            "time_zone": "Europe/Berlin",
            "task": {"command": ["sh", "-c", "echo hi"], "queue": "ops", "timeout_secs": 60},
            "overlap_policy": "queue_one",
            "jitter_secs": 5,
        }),
    )
    .await;
    let id = id_of(&created);
    assert_eq!(created["owner"], "alice", "a user's schedule is its own");
    assert_eq!(created["time_zone"], "Europe/Berlin");
    assert_eq!(created["overlap_policy"], "queue_one");
    assert_eq!(created["misfire_policy"], "run_once", "the default policy");
    assert_eq!(created["jitter_secs"], 5.0);
    assert_eq!(created["task"]["queue"], "ops");
    assert!(created["paused_at"].is_null());
    let next = time_of(&created["next_run_at"]);
    assert!(
        next > Utc::now(),
        "a new schedule is armed at a future tick"
    );

    let (status, page) = api.get("/api/v1/schedules", &api.alice).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["schedules"].as_array().unwrap().len(), 1);
    assert_eq!(page["schedules"][0]["id"], id.to_string());

    // The detail: the next five ticks from next_run_at on, 03:00 in Berlin a day apart.
    let (status, detail) = api
        .get(&format!("/api/v1/schedules/{id}"), &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(
        detail["name"], "nightly",
        "the schedule's fields are inline"
    );
    let times: Vec<DateTime<Utc>> = detail["next_fire_times"]
        .as_array()
        .unwrap()
        .iter()
        .map(time_of)
        .collect();
    assert_eq!(times.len(), 5, "five next fire times: {detail}");
    assert_eq!(times[0], next, "the first is the armed tick");
    for pair in times.windows(2) {
        let gap = pair[1] - pair[0];
        assert!(
            gap >= chrono::Duration::hours(23) && gap <= chrono::Duration::hours(25),
            "a daily schedule fires a day apart (23 or 25 hours across DST): {times:?}"
        );
    }
    assert_eq!(detail["runs"], json!([]), "nothing has run yet");

    // A change re-arms at the next tick of the new expression; other fields stay.
    let (status, changed) = api
        .call(
            Method::PATCH,
            &format!("/api/v1/schedules/{id}"),
            &api.alice,
            Some(
                json!({"cron": "30 4 * * *", "time_zone": "UTC", "history_limit": 10,
                        "misfire_policy": "skip", "overlap_policy": "replace"}),
            ),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["cron"], "30 4 * * *");
    assert_eq!(changed["history_limit"], 10);
    assert_eq!(changed["misfire_policy"], "skip");
    assert_eq!(changed["overlap_policy"], "replace");
    assert_eq!(
        changed["task"]["queue"], "ops",
        "absent fields keep their values"
    );
    assert_eq!(changed["jitter_secs"], 5.0);
    let rearmed = time_of(&changed["next_run_at"]);
    assert_eq!(
        rearmed.format("%H:%M:%S").to_string(),
        "04:30:00",
        "a new expression re-arms the schedule at its next tick"
    );
    // A task template replaces the task template.
    let (status, changed) = api
        .call(
            Method::PATCH,
            &format!("/api/v1/schedules/{id}"),
            &api.alice,
            Some(json!({"task": {"kind": "noop"}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert_eq!(changed["task"], json!({"kind": "noop"}));

    // Pause: no next fire times while paused; resume re-arms at a future tick.
    let (status, paused) = api
        .post(
            &format!("/api/v1/schedules/{id}/pause"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{paused}");
    assert!(paused["paused_at"].is_string(), "{paused}");
    let (_, detail) = api
        .get(&format!("/api/v1/schedules/{id}"), &api.alice)
        .await;
    assert_eq!(
        detail["next_fire_times"],
        json!([]),
        "nothing fires while paused"
    );
    let (status, resumed) = api
        .post(
            &format!("/api/v1/schedules/{id}/resume"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{resumed}");
    assert!(resumed["paused_at"].is_null(), "{resumed}");
    assert!(time_of(&resumed["next_run_at"]) > Utc::now());

    // Run now: a task of the schedule's owner, recorded as a manual run.
    let ran = api.run_now(id).await;
    assert_eq!(ran["schedule_id"], id.to_string());
    assert!(ran["workflow_id"].is_null());
    let task: Uuid = ran["task_id"].as_str().unwrap().parse().unwrap();
    let row = sked_db::task::get(&api.db.pool, task)
        .await
        .unwrap()
        .expect("run now submitted a task");
    assert_eq!(row.owner, "alice");
    assert_eq!(
        row.kind,
        sked_types::TaskKind::Noop,
        "the occurrence follows the current template"
    );
    let (_, detail) = api
        .get(&format!("/api/v1/schedules/{id}"), &api.alice)
        .await;
    assert_eq!(detail["runs"][0]["outcome"], "manual", "{detail}");
    assert_eq!(detail["runs"][0]["task_id"], task.to_string());
    assert_eq!(detail["last_task_id"], task.to_string());

    // Delete: the schedule and its runs go, its occurrence stays.
    let (status, deleted) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/schedules/{id}"),
            &api.alice,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{deleted}");
    assert_eq!(deleted["id"], id.to_string());
    let (status, json) = api
        .get(&format!("/api/v1/schedules/{id}"), &api.alice)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_error(&json, "not_found");
    assert_eq!(count(&api, "sked.schedules").await, 0);
    assert_eq!(count(&api, "sked.schedule_runs").await, 0);
    assert!(
        sked_db::task::get(&api.db.pool, task)
            .await
            .unwrap()
            .is_some(),
        "a deleted schedule's occurrences stay"
    );
    let (status, _) = api
        .call(
            Method::DELETE,
            &format!("/api/v1/schedules/{id}"),
            &api.alice,
            None,
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "deleting twice is 404");
}

#[tokio::test]
async fn schedules_show_their_latest_tick_but_not_manual_runs() {
    let api = Api::new().await;
    let ticking = id_of(&create(&api, &api.alice, yearly("ticking")).await);
    let mut paused = yearly("quiet");
    paused["paused"] = json!(true);
    let quiet = id_of(&create(&api, &api.alice, paused).await);
    let last_tick = |page: &Value, id: Uuid| {
        page["schedules"]
            .as_array()
            .expect("a list of schedules")
            .iter()
            .find(|s| s["id"] == id.to_string())
            .expect("the schedule is listed")["last_tick"]
            .clone()
    };
    let (_, page) = api.get("/api/v1/schedules", &api.alice).await;
    assert!(
        last_tick(&page, ticking).is_null(),
        "no tick before the first one: {page}"
    );

    // A manual run is not a tick.
    let (status, ran) = api
        .post(
            &format!("/api/v1/schedules/{ticking}/run"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{ran}");
    let (_, page) = api.get("/api/v1/schedules", &api.alice).await;
    assert!(
        last_tick(&page, ticking).is_null(),
        "a manual run is left out of last_tick: {page}"
    );

    // Its tick comes (time as an input) while the manual occurrence is unfinished: the
    // overlap policy `skip` skips it, and the list says so.
    let manual: Uuid = ran["task_id"].as_str().unwrap().parse().unwrap();
    let fire_next = |api: &Api| {
        let pool = api.db.pool.clone();
        async move {
            let tick: DateTime<Utc> =
                sqlx::query_scalar("select next_run_at from sked.schedules where id = $1")
                    .bind(ticking)
                    .fetch_one(&pool)
                    .await
                    .unwrap();
            let fired: i32 = sqlx::query_scalar("select sked.schedules_fire(p_now => $1)")
                .bind(tick + chrono::Duration::seconds(1))
                .fetch_one(&pool)
                .await
                .unwrap();
            assert_eq!(fired, 1, "the tick is handled");
            tick
        }
    };
    let skipped_tick = fire_next(&api).await;
    let (_, page) = api.get("/api/v1/schedules", &api.alice).await;
    let last = last_tick(&page, ticking);
    assert_eq!(last["outcome"], "skipped", "{page}");
    assert_eq!(time_of(&last["fire_at"]), skipped_tick, "{page}");
    assert!(
        last["detail"]
            .as_str()
            .is_some_and(|d| d.contains("unfinished")),
        "the detail says why: {page}"
    );
    assert!(last["task_id"].is_null(), "{page}");

    // Once the occurrence is over, the next tick fires.
    let (status, cancelled) = api
        .post(
            &format!("/api/v1/tasks/{manual}/cancel"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{cancelled}");
    let tick = fire_next(&api).await;
    let occurrence: Uuid =
        sqlx::query_scalar("select last_task_id from sked.schedules where id = $1")
            .bind(ticking)
            .fetch_one(&api.db.pool)
            .await
            .unwrap();
    assert_ne!(occurrence, manual);
    let (_, page) = api.get("/api/v1/schedules", &api.alice).await;
    let last = last_tick(&page, ticking);
    assert_eq!(last["outcome"], "fired", "{page}");
    assert_eq!(time_of(&last["fire_at"]), tick, "{page}");
    assert_eq!(last["task_id"], occurrence.to_string(), "{page}");
    assert!(
        last_tick(&page, quiet).is_null(),
        "each schedule shows its own ticks: {page}"
    );
    let (_, detail) = api
        .get(&format!("/api/v1/schedules/{ticking}"), &api.alice)
        .await;
    assert_eq!(detail["last_tick"], last, "the detail shows the same tick");
    assert_eq!(
        detail["runs"].as_array().map(Vec::len),
        Some(3),
        "the detail's runs hold both ticks and the manual run: {detail}"
    );
}

#[tokio::test]
async fn another_owners_schedule_is_not_found_and_unchanged() {
    let api = Api::new().await;
    let id = id_of(&create(&api, &api.alice, yearly("alices")).await);
    let before = sked_db::schedule::get(&api.db.pool, id)
        .await
        .unwrap()
        .unwrap();

    let calls: Vec<(Method, String, Option<Value>)> = vec![
        (Method::GET, format!("/api/v1/schedules/{id}"), None),
        (
            Method::PATCH,
            format!("/api/v1/schedules/{id}"),
            Some(json!({"cron": "* * * * *"})),
        ),
        (
            Method::POST,
            format!("/api/v1/schedules/{id}/pause"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/api/v1/schedules/{id}/resume"),
            Some(json!({})),
        ),
        (
            Method::POST,
            format!("/api/v1/schedules/{id}/run"),
            Some(json!({})),
        ),
        (Method::DELETE, format!("/api/v1/schedules/{id}"), None),
    ];
    for (method, uri, body) in calls {
        let (status, json) = api.call(method.clone(), &uri, &api.bob, body).await;
        assert_eq!(
            status,
            StatusCode::NOT_FOUND,
            "{method} {uri} with another owner's token is 404: {json}"
        );
        assert_error(&json, "not_found");
    }
    let after = sked_db::schedule::get(&api.db.pool, id)
        .await
        .unwrap()
        .expect("another owner cannot delete the schedule");
    assert_eq!(after, before, "another owner's calls change nothing");
    assert_eq!(count(&api, "sked.tasks").await, 0, "nor run it");
    assert_eq!(count(&api, "sked.schedule_runs").await, 0);

    // Listings: a user sees its own; naming another owner is forbidden.
    let bobs = id_of(&create(&api, &api.bob, yearly("bobs")).await);
    let (_, page) = api.get("/api/v1/schedules", &api.bob).await;
    let ids: Vec<&str> = page["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec![bobs.to_string()], "bob lists only his own");
    let (status, json) = api.get("/api/v1/schedules?owner=alice", &api.bob).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_error(&json, "forbidden");

    // A user may not create for another owner; an admin may, and sees all.
    let mut for_alice = yearly("from-bob");
    for_alice["owner"] = json!("alice");
    let (status, json) = api.post("/api/v1/schedules", &api.bob, for_alice).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{json}");
    assert_error(&json, "forbidden");
    assert_eq!(
        count(&api, "sked.schedules").await,
        2,
        "nothing was created"
    );
    let mut by_admin = yearly("from-admin");
    by_admin["owner"] = json!("alice");
    let created = create(&api, &api.admin, by_admin).await;
    assert_eq!(created["owner"], "alice", "an admin creates for anyone");
    let (_, page) = api.get("/api/v1/schedules", &api.admin).await;
    assert_eq!(page["schedules"].as_array().unwrap().len(), 3, "{page}");
    let (_, page) = api.get("/api/v1/schedules?owner=alice", &api.admin).await;
    let names: Vec<&str> = page["schedules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["alices", "from-admin"], "by name, one owner's");
    let (status, _) = api
        .get(&format!("/api/v1/schedules/{id}"), &api.admin)
        .await;
    assert_eq!(status, StatusCode::OK, "an admin reads any schedule");
}

#[tokio::test]
async fn invalid_schedules_are_rejected_with_the_rule_and_insert_nothing() {
    let api = Api::new().await;
    let task = json!({"command": ["true"]});
    let cases: Vec<(Value, StatusCode, &str, &[&str])> = vec![
        (
            json!({"name": "a", "cron": "61 * * * *", "task": task}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            &[
                "cron expression '61 * * * *'",
                "minute field",
                "out of range 0-59",
            ],
        ),
        (
            json!({"name": "a", "cron": "* * *", "task": task}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            &["cron expression", "expected 5 fields"],
        ),
        (
            json!({"name": "a", "cron": "0 0 30 2 *", "task": task}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            &["never fires"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "time_zone": "Mars/Olympus", "task": task}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &["time zone 'Mars/Olympus' is not known"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": task, "misfire_policy": "often"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            &["misfire_policy must be one of skip, run_once, catch_up"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": task, "overlap_policy": "both"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            &["overlap_policy must be one of"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": task, "catch_up_limit": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            &["catch_up_limit must be 1 to 10000"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": task, "history_limit": 0}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            &["history_limit must be at least 1"],
        ),
        (
            json!({"name": "", "cron": "* * * * *", "task": task}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            &["name must not be empty"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": {"command": ["x"], "queue": "no spaces"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            &["task template is not valid", "queue must be"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": {"command": ["x"], "timeout_secs": -1}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            &[
                "task template is not valid",
                "timeout_secs must be positive",
            ],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": {"queue": "q"}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            &["task template is not valid", "command"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": task, "jitter_secs": -1}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &["jitter_secs must be"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": task, "misfire_grace_secs": 1e300}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &["misfire_grace_secs must be"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": {"command": ["x"], "delay_secs": 5}}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &["task.delay_secs"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": {"command": ["x"], "owner": "bob"}}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &["task.owner"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *"}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &["exactly one of task and workflow"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": task, "workflow": {"tasks": []}}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &["exactly one of task and workflow"],
        ),
        (
            json!({"name": "a", "cron": "* * * * *", "task": task, "colour": "red"}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &["unknown field"],
        ),
        (
            json!({"name": "a\u{0}", "cron": "* * * * *", "task": task}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            &["NUL"],
        ),
    ];
    for (body, status, code, words) in cases {
        let (got, json) = api
            .post("/api/v1/schedules", &api.alice, body.clone())
            .await;
        assert_eq!(got, status, "{body} is answered {status}: {json}");
        assert_error(&json, code);
        let message = json["message"].as_str().unwrap();
        for word in words {
            assert!(
                message.contains(word),
                "the message for {body} names the rule ({word:?}): {message}"
            );
        }
        assert_eq!(
            count(&api, "sked.schedules").await,
            0,
            "a rejected schedule is not inserted: {body}"
        );
        assert_eq!(
            count(&api, "sked.tasks").await,
            0,
            "checking a template leaves no task behind: {body}"
        );
    }

    // A name is unique per owner (another owner may use it).
    create(&api, &api.alice, yearly("nightly")).await;
    let (status, json) = api
        .post("/api/v1/schedules", &api.alice, yearly("nightly"))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{json}");
    assert_error(&json, "conflict");
    assert!(json["message"].as_str().unwrap().contains("name"), "{json}");
    create(&api, &api.bob, yearly("nightly")).await;
    assert_eq!(count(&api, "sked.schedules").await, 2);
}

#[tokio::test]
async fn an_invalid_change_is_rejected_and_changes_nothing() {
    let api = Api::new().await;
    let id = id_of(&create(&api, &api.alice, yearly("a")).await);
    create(&api, &api.alice, yearly("b")).await;
    let before = sked_db::schedule::get(&api.db.pool, id)
        .await
        .unwrap()
        .unwrap();
    let cases: Vec<(Value, StatusCode, &str, &str)> = vec![
        (
            json!({"cron": "*/0 * * * *"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            "minute field",
        ),
        (
            json!({"time_zone": "Nowhere/Land"}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "time zone",
        ),
        (
            json!({"overlap_policy": "sometimes"}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            "overlap_policy",
        ),
        (
            json!({"task": {"command": []}}),
            StatusCode::UNPROCESSABLE_ENTITY,
            "rejected",
            "command",
        ),
        (
            json!({"task": {"command": ["x"]}, "workflow": {"tasks": []}}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "at most one of task and workflow",
        ),
        (
            json!({"jitter_secs": -3}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "jitter_secs",
        ),
        (
            json!({"workflow": {"tasks": [
                {"name": "a", "command": ["true"]},
                {"name": "b", "command": ["true"], "timeout_secs": 3155760001.0_f64},
            ]}}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "workflow.tasks[1].timeout_secs must be a number of seconds of at most 100 years",
        ),
        (
            json!({"name": "b"}),
            StatusCode::CONFLICT,
            "conflict",
            "name",
        ),
        (
            json!({"paused": true}),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "unknown field",
        ),
    ];
    for (body, status, code, word) in cases {
        let (got, json) = api
            .call(
                Method::PATCH,
                &format!("/api/v1/schedules/{id}"),
                &api.alice,
                Some(body.clone()),
            )
            .await;
        assert_eq!(got, status, "PATCH {body} is answered {status}: {json}");
        assert_error(&json, code);
        assert!(
            json["message"].as_str().unwrap().contains(word),
            "the message for {body} names {word:?}: {json}"
        );
        let after = sked_db::schedule::get(&api.db.pool, id)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(after, before, "a rejected change changes nothing: {body}");
    }
}

#[tokio::test]
async fn cron_preview_lists_fire_times_or_the_parsers_message() {
    let api = Api::new().await;
    let (status, json) = api
        .get(
            "/api/v1/cron/preview?cron=*/15%20*%20*%20*%20*&n=4",
            &api.alice,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(json["cron"], "*/15 * * * *");
    assert_eq!(json["time_zone"], "UTC", "the default time zone");
    let times: Vec<DateTime<Utc>> = json["next_fire_times"]
        .as_array()
        .unwrap()
        .iter()
        .map(time_of)
        .collect();
    assert_eq!(times.len(), 4);
    assert!(times[0] > Utc::now() - chrono::Duration::seconds(1));
    for t in &times {
        assert_eq!(t.timestamp() % (15 * 60), 0, "on a quarter hour: {t}");
    }
    for pair in times.windows(2) {
        assert_eq!(pair[1] - pair[0], chrono::Duration::minutes(15));
    }

    // Six fields: seconds first; a time zone shifts the ticks.
    let (status, json) = api
        .get(
            "/api/v1/cron/preview?cron=0%200%209%20*%20*%20*&time_zone=Asia/Kolkata&n=1",
            &api.alice,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    let t = time_of(&json["next_fire_times"][0]);
    assert_eq!(
        t.format("%H:%M").to_string(),
        "03:30",
        "09:00 in Kolkata is 03:30 UTC"
    );
    // Its older name, a link of the time zone database, is the same zone.
    let (status, json) = api
        .get(
            "/api/v1/cron/preview?cron=0%200%209%20*%20*%20*&time_zone=Asia/Calcutta&n=1",
            &api.alice,
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{json}");
    assert_eq!(time_of(&json["next_fire_times"][0]), t);

    let bad: &[(&str, &str)] = &[
        ("cron=bogus", "cron expression 'bogus': expected 5 fields"),
        (
            "cron=0%2025%20*%20*%20*",
            "hour field: 25 is out of range 0-23",
        ),
        (
            "cron=*%20*%20*%20*%20*&time_zone=Mars/Olympus",
            "time zone 'Mars/Olympus' is not known",
        ),
        // PostgreSQL reads an abbreviation as a fixed offset, without daylight saving time:
        // not a time zone the document lists.
        (
            "cron=*%20*%20*%20*%20*&time_zone=PST",
            "time zone 'PST' is not known",
        ),
        (
            "cron=*%20*%20*%20*%20*&time_zone=",
            "time zone '' is not known",
        ),
        ("cron=*%20*%20*%20*%20*&n=0", "n must be between 1 and 100"),
        (
            "cron=*%20*%20*%20*%20*&n=101",
            "n must be between 1 and 100",
        ),
        ("n=3", "cron"),
    ];
    for (query, words) in bad {
        let (status, json) = api
            .get(&format!("/api/v1/cron/preview?{query}"), &api.alice)
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "?{query}: {json}");
        assert_error(&json, "invalid_request");
        assert!(
            json["message"].as_str().unwrap().contains(words),
            "?{query} explains {words:?}: {json}"
        );
    }
    let (status, _, _) = api
        .raw(Method::GET, "/api/v1/cron/preview?cron=@daily", None, None)
        .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "a preview needs a token");
}

#[tokio::test]
async fn a_schedule_created_over_rest_fires_through_a_real_worker() {
    let api = Api::new().await;
    // Every second, with seconds as the first field.
    let created = create(
        &api,
        &api.alice,
        json!({"name": "every-second", "cron": "*/1 * * * * *",
               "task": {"command": ["sh", "-c", "echo tick"]}}),
    )
    .await;
    let id = id_of(&created);
    // The worker fires ticks in its background upkeep as well as running the tasks.
    let worker = support::start_worker(&api.db, support::config(&["default"]));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let task = loop {
        let (_, detail) = api
            .get(&format!("/api/v1/schedules/{id}"), &api.alice)
            .await;
        let done = detail["runs"].as_array().unwrap().iter().find_map(|r| {
            let task: Uuid = r["task_id"].as_str()?.parse().ok()?;
            (r["outcome"] == "fired").then_some(task)
        });
        if let Some(task) = done
            && support::state(&api.db.pool, task).await == "succeeded"
        {
            break task;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "an occurrence should fire and succeed within 15 s: {detail}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let row = sked_db::task::get(&api.db.pool, task)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        row.owner, "alice",
        "an occurrence belongs to the schedule's owner"
    );
    assert_eq!(row.stdout_tail.as_deref(), Some("tick\n"));
    // Pausing stops the ticks (a tick already queued within the horizon may still run).
    let (status, _) = api
        .post(
            &format!("/api/v1/schedules/{id}/pause"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let fired = count(&api, "sked.schedule_runs").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        count(&api, "sked.schedule_runs").await,
        fired,
        "a paused schedule fires no more ticks"
    );
    worker.shutdown().await;
}

#[tokio::test]
async fn cli_creates_shows_runs_pauses_and_deletes_schedules() {
    let api = cli::Api::start().await;
    let pool = &api.db.pool;
    let out = api
        .ok(&[
            "schedule",
            "create",
            "backup",
            "--cron",
            "0 0 * * *",
            "--tz",
            "UTC",
            "--misfire",
            "skip",
            "--overlap",
            "skip",
            "--jitter",
            "2",
            "--queue",
            "ops",
            "--env",
            "A=1",
            "--",
            "sh",
            "-c",
            "echo backup",
        ])
        .await;
    let id: Uuid = out.trim().parse().expect("create prints the schedule's id");
    let s = sked_db::schedule::get(pool, id)
        .await
        .unwrap()
        .expect("the schedule exists");
    assert_eq!(s.name, "backup");
    assert_eq!(s.misfire_policy, "skip");
    assert_eq!(s.jitter_secs, 2.0);
    assert_eq!(
        s.task,
        Some(json!({"command": ["sh", "-c", "echo backup"], "queue": "ops", "env": {"A": "1"}}))
    );

    let listed = api.ok(&["schedule", "list"]).await;
    assert!(
        listed.contains("backup") && listed.contains(&id.to_string()),
        "{listed}"
    );

    // Run now, then fire the schedule's ticks with time as input: the next tick finds the
    // manual occurrence unfinished (skipped), and ticks three days late are missed.
    let out = api.ok(&["schedule", "run", "backup"]).await;
    let task: Uuid = out.trim().parse().expect("run prints the task id");
    assert_eq!(support::state(pool, task).await, "waiting");
    sqlx::query(
        "select sked.schedules_fire(p_now => next_run_at) from sked.schedules where id = $1",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "select sked.schedules_fire(p_now => next_run_at + interval '3 days 1 hour')
           from sked.schedules where id = $1",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    let shown = api.ok(&["schedule", "show", "backup"]).await;
    for expected in [
        "0 0 * * * (time zone UTC)",
        "sh -c 'echo backup' (queue ops)",
        "next ticks (UTC):",
        "manual",
        &task.to_string(),
        "skipped",
        "the previous occurrence was unfinished (overlap policy skip)",
        "missed",
        "4 ticks missed",
    ] {
        assert!(
            shown.contains(expected),
            "show prints {expected:?}:\n{shown}"
        );
    }
    let json: Value = serde_json::from_str(
        &api.ok(&["schedule", "show", "--json", &id.to_string()])
            .await,
    )
    .unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), 3, "{json}");

    let paused = api.ok(&["schedule", "pause", "backup"]).await;
    assert!(paused.contains("paused"), "{paused}");
    let s = sked_db::schedule::get(pool, id).await.unwrap().unwrap();
    assert!(s.paused_at.is_some(), "pause pauses");
    assert!(
        api.ok(&["schedule", "show", "backup"])
            .await
            .contains("none while paused")
    );
    api.ok(&["schedule", "resume", &id.to_string()]).await;
    let s = sked_db::schedule::get(pool, id).await.unwrap().unwrap();
    assert!(s.paused_at.is_none(), "resume resumes");

    let next = api.ok(&["cron", "next", "*/10 * * * *", "-n", "3"]).await;
    assert_eq!(next.lines().count(), 3, "{next}");
    assert!(
        next.lines().all(|l| l.ends_with("0:00 UTC")),
        "every ten minutes: {next}"
    );

    // Bad flags and bad expressions: a clear message, a non-zero exit, nothing created.
    let bad: &[(&[&str], &str)] = &[
        (
            &[
                "schedule",
                "create",
                "x",
                "--cron",
                "61 * * * *",
                "--",
                "true",
            ],
            "minute field: 61 is out of range 0-59",
        ),
        (
            &[
                "schedule",
                "create",
                "x",
                "--cron",
                "* * * * *",
                "--tz",
                "Mars/Olympus",
                "--",
                "true",
            ],
            "time zone 'Mars/Olympus' is not known",
        ),
        (
            &[
                "schedule",
                "create",
                "x",
                "--cron",
                "* * * * *",
                "--misfire",
                "often",
                "--",
                "true",
            ],
            "possible values",
        ),
        (
            &[
                "schedule",
                "create",
                "x",
                "--cron",
                "* * * * *",
                "--overlap",
                "both",
                "--",
                "true",
            ],
            "possible values",
        ),
        (
            &[
                "schedule",
                "create",
                "x",
                "--cron",
                "* * * * *",
                "--jitter",
                "-1",
                "--",
                "true",
            ],
            "--jitter must be zero or more seconds",
        ),
        (
            &[
                "schedule",
                "create",
                "x",
                "--cron",
                "* * * * *",
                "--catch-up-limit",
                "0",
                "--",
                "true",
            ],
            "--catch-up-limit",
        ),
        (&["schedule", "create", "x", "--", "true"], "--cron <EXPR>"),
        (
            &["schedule", "create", "x", "--cron", "* * * * *"],
            "give the command each tick runs after `--`",
        ),
        (
            &[
                "schedule",
                "create",
                "x",
                "--cron",
                "* * * * *",
                "--task-json",
                "{bad",
            ],
            "not a valid task",
        ),
        (
            &[
                "schedule",
                "create",
                "x",
                "--cron",
                "* * * * *",
                "--task-json",
                r#"{"command": ["true"]}"#,
                "--queue",
                "q",
            ],
            "cannot be used with",
        ),
        (
            &[
                "schedule",
                "create",
                "x",
                "--cron",
                "* * * * *",
                "--workflow",
                "/nonexistent/flow.json",
            ],
            "reading --workflow",
        ),
        (
            &[
                "schedule",
                "create",
                "backup",
                "--cron",
                "* * * * *",
                "--",
                "true",
            ],
            "(conflict)",
        ),
        (
            &["schedule", "show", "nosuch"],
            "no schedule is named \"nosuch\"",
        ),
        (
            &["schedule", "pause", &Uuid::nil().to_string()],
            "(not_found)",
        ),
        (&["cron", "next", "bogus"], "cron expression 'bogus'"),
        (&["cron", "next", "* * * * *", "-n", "0"], "-n <N>"),
    ];
    for (args, expected) in bad {
        let out = output(&mut api.sked(args)).await;
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "sked {args:?} should fail: {out:?}");
        assert!(
            stderr.contains(expected),
            "sked {args:?} should explain {expected:?}, got: {stderr}"
        );
    }
    assert_eq!(
        sked_db::schedule::list(pool, None, None)
            .await
            .unwrap()
            .len(),
        1,
        "no bad command created a schedule"
    );

    let out = api.ok(&["schedule", "delete", "backup"]).await;
    assert!(out.contains("deleted"), "{out}");
    assert!(sked_db::schedule::get(pool, id).await.unwrap().is_none());
}

#[tokio::test]
async fn the_openapi_document_lists_the_schedule_endpoints() {
    let api = Api::new().await;
    let (status, _, doc) = api
        .raw(Method::GET, "/api/v1/openapi.json", None, None)
        .await;
    assert_eq!(status, StatusCode::OK);
    for (path, methods) in [
        ("/api/v1/schedules", &["get", "post"][..]),
        ("/api/v1/schedules/{id}", &["get", "patch", "delete"][..]),
        ("/api/v1/schedules/{id}/pause", &["post"][..]),
        ("/api/v1/schedules/{id}/resume", &["post"][..]),
        ("/api/v1/schedules/{id}/run", &["post"][..]),
        ("/api/v1/cron/preview", &["get"][..]),
    ] {
        for method in methods {
            assert!(
                doc["paths"][path][method].is_object(),
                "the document lists {method} {path}"
            );
        }
    }
    for schema in [
        "CreateSchedule",
        "UpdateSchedule",
        "Schedule",
        "ScheduleDetail",
        "SchedulePage",
        "ScheduleRun",
        "CronPreview",
        "RunNow",
    ] {
        assert!(
            doc["components"]["schemas"][schema].is_object(),
            "the document describes {schema}"
        );
    }
}

#[tokio::test]
async fn a_workflow_template_runs_as_a_workflow() {
    let api = Api::new().await;
    let created = create(
        &api,
        &api.alice,
        json!({"name": "etl", "cron": "@yearly", "workflow": {"name": "etl", "tasks": [
            {"name": "collect", "kind": "noop"},
            {"name": "export", "kind": "noop", "depends_on": ["collect"]}]}}),
    )
    .await;
    assert!(created["task"].is_null(), "{created}");
    let id = id_of(&created);
    let ran = api.run_now(id).await;
    assert!(ran.get("task_id").is_none(), "no task: left out: {ran}");
    let workflow: Uuid = ran["workflow_id"].as_str().unwrap().parse().unwrap();
    let tasks: i64 = sqlx::query_scalar(
        "select count(*) from sked.tasks where workflow_id = $1 and owner = 'alice'",
    )
    .bind(workflow)
    .fetch_one(&api.db.pool)
    .await
    .unwrap();
    assert_eq!(
        tasks, 2,
        "run now submitted the whole workflow for the owner"
    );

    // A bad workflow template is rejected with the workflow rule's own message.
    let (status, json) = api
        .post(
            "/api/v1/schedules",
            &api.alice,
            json!({"name": "loop", "cron": "@daily", "workflow": {"tasks": [
                {"name": "a", "kind": "noop", "depends_on": ["a"]}]}}),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{json}");
    assert_error(&json, "rejected");
    let message = json["message"].as_str().unwrap();
    assert!(
        message.contains("the workflow template is not valid: task 'a' depends on itself"),
        "the message names the workflow's rule and task: {message}"
    );
    // A change to a task template replaces the workflow template.
    let (status, changed) = api
        .call(
            Method::PATCH,
            &format!("/api/v1/schedules/{id}"),
            &api.alice,
            Some(json!({"task": {"kind": "noop"}})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{changed}");
    assert!(changed["workflow"].is_null(), "{changed}");
    assert_eq!(changed["task"], json!({"kind": "noop"}));
}

#[tokio::test]
async fn a_workflow_template_is_a_workflow_as_post_workflows_takes_it() {
    let api = Api::new().await;
    // Durations in seconds and whole numbers written with a fraction of zero, as
    // `POST /api/v1/workflows` takes them; a grace too small for an interval is none.
    let created = create(
        &api,
        &api.alice,
        json!({"name": "etl", "cron": "@yearly", "misfire_grace_secs": 2.225073858507203e-309,
               "workflow": {"tasks": [
                   {"name": "collect", "kind": "noop", "timeout_secs": 5, "max_attempts": 2.0},
                   {"name": "export", "kind": "noop", "depends_on": ["collect"],
                    "backoff_base_secs": 0.25}]}}),
    )
    .await;
    assert_eq!(created["misfire_grace_secs"], 0.0, "{created}");
    let id = id_of(&created);
    let ran = api.run_now(id).await;
    let workflow: Uuid = ran["workflow_id"].as_str().unwrap().parse().unwrap();
    let tasks: Vec<(String, Option<f64>, i32, f64)> = sqlx::query_as(
        "select name, extract(epoch from timeout)::float8, max_attempts,
                extract(epoch from backoff_base)::float8
           from sked.tasks where workflow_id = $1 order by name",
    )
    .bind(workflow)
    .fetch_all(&api.db.pool)
    .await
    .unwrap();
    assert_eq!(
        tasks,
        vec![
            ("collect".to_owned(), Some(5.0), 2, 1.0),
            ("export".to_owned(), None, 3, 0.25),
        ],
        "each tick submits the workflow as POST /api/v1/workflows would"
    );

    // The schedule's owner owns each occurrence: the template names none.
    let before = count(&api, "sked.schedules").await;
    let (status, json) = api
        .post(
            "/api/v1/schedules",
            &api.alice,
            json!({"name": "other", "cron": "@yearly",
                   "workflow": {"owner": "bob", "tasks": [{"name": "a", "kind": "noop"}]}}),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{json}");
    assert_error(&json, "invalid_request");
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .starts_with("workflow.owner"),
        "{json}"
    );
    assert_eq!(
        count(&api, "sked.schedules").await,
        before,
        "nothing was created"
    );
}

#[tokio::test]
async fn a_broadcast_template_with_no_live_worker_is_a_conflict() {
    let api = Api::new().await;
    let (status, json) = api
        .post(
            "/api/v1/schedules",
            &api.alice,
            json!({"name": "everywhere", "cron": "@yearly",
                   "task": {"kind": "noop", "broadcast": true}}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{json}");
    assert_error(&json, "conflict");
    assert_eq!(
        json["message"],
        "schedule 'everywhere': the task template is not valid: broadcast: no live worker \
         serves queue 'default'"
    );
    assert_eq!(
        count(&api, "sked.schedules").await,
        0,
        "nothing was created"
    );
}

#[tokio::test]
async fn a_template_holding_the_largest_double_reads_back_in_every_answer() {
    // jsonb writes 1.7976931348623157e308 out as 309 digits; they read back as the same double.
    let api = Api::new().await;
    let mut body = yearly("huge");
    body["task"]["input"] = json!({"n": f64::MAX, "m": [f64::MIN]});
    let created = create(&api, &api.alice, body).await;
    let want = json!({"n": f64::MAX, "m": [f64::MIN]});
    assert_eq!(created["task"]["input"], want, "the answer to the create");
    let id = id_of(&created);
    let (status, list) = api.get("/api/v1/schedules", &api.alice).await;
    assert_eq!(status, StatusCode::OK, "the list reads: {list}");
    assert_eq!(list["schedules"][0]["task"]["input"], want, "the list");
    let (status, one) = api
        .get(&format!("/api/v1/schedules/{id}"), &api.alice)
        .await;
    assert_eq!(status, StatusCode::OK, "the schedule reads: {one}");
    assert_eq!(one["task"]["input"], want, "the schedule");
}

/// The start of the hour `hours` hours before now's.
fn hour_ago(hours: i64) -> DateTime<Utc> {
    let now = Utc::now();
    let hour = now - chrono::Duration::seconds(i64::from(now.timestamp() as i32 % 3600));
    let hour = hour - chrono::Duration::nanoseconds(i64::from(hour.timestamp_subsec_nanos()));
    hour - chrono::Duration::hours(hours)
}

impl Api {
    /// Follows alice's backfill until it is not running (30 s at most); its last answer.
    async fn backfill_ended(&self, id: &str) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let (status, b) = self
                .get(&format!("/api/v1/backfills/{id}"), &self.alice)
                .await;
            assert_eq!(status, StatusCode::OK, "{b}");
            if b["state"] != "running" {
                return b;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the backfill should end within 30 s: {b}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

#[tokio::test]
async fn a_backfill_over_rest_runs_each_past_tick_once_through_a_real_worker() {
    let api = Api::new().await;
    let created = create(
        &api,
        &api.alice,
        json!({"name": "hourly", "cron": "0 * * * *", "paused": true,
               "task": {"command": ["sh", "-c", "echo \"$SKED_TICK_UTC\""]}}),
    )
    .await;
    let id = id_of(&created);
    let (from, to) = (hour_ago(5), hour_ago(1));
    let range = json!({"from": from, "to": to, "max_active": 2});
    let (status, started) = api
        .post(
            &format!("/api/v1/schedules/{id}/backfills"),
            &api.alice,
            range.clone(),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{started}");
    assert_eq!(started["state"], "running");
    assert_eq!(started["ticks"], 5);
    assert_eq!(started["order"], "oldest_first");
    assert_eq!(time_of(&started["next_tick"]), from);
    let backfill = started["id"].as_str().unwrap().to_owned();

    // The worker's background upkeep steps the backfill, even of a paused schedule.
    let worker = support::start_worker(&api.db, support::config(&["default"]));
    let ended = api.backfill_ended(&backfill).await;
    assert_eq!(ended["state"], "succeeded", "{ended}");
    assert_eq!(
        (
            &ended["fired"],
            &ended["already"],
            &ended["succeeded"],
            &ended["active"]
        ),
        (&json!(5), &json!(0), &json!(5), &json!(0)),
        "{ended}"
    );
    assert!(ended["next_tick"].is_null());
    let ran: Vec<(DateTime<Utc>, Option<String>)> = sqlx::query_as(
        "select r.fire_at, t.stdout_tail from sked.schedule_runs r
           join sked.tasks t on t.id = r.task_id
          where r.schedule_id = $1 order by r.fire_at",
    )
    .bind(id)
    .fetch_all(&api.db.pool)
    .await
    .unwrap();
    let ticks: Vec<DateTime<Utc>> = (1..=5).rev().map(hour_ago).collect();
    assert_eq!(ran.iter().map(|r| r.0).collect::<Vec<_>>(), ticks);
    for (tick, stdout) in &ran {
        assert_eq!(
            stdout.as_deref(),
            Some(format!("{}\n", tick.format("%Y-%m-%dT%H:%M:%SZ")).as_str()),
            "each occurrence saw its own tick"
        );
    }
    let (_, detail) = api
        .get(&format!("/api/v1/schedules/{id}"), &api.alice)
        .await;
    assert_eq!(detail["backfills"][0]["id"], backfill.as_str(), "{detail}");
    assert!(
        detail["runs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|r| r["backfill_id"] == backfill.as_str()),
        "each run names its backfill: {detail}"
    );

    // The same range again runs nothing twice.
    let (status, again) = api
        .post(
            &format!("/api/v1/schedules/{id}/backfills"),
            &api.alice,
            range,
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{again}");
    let again = api.backfill_ended(again["id"].as_str().unwrap()).await;
    assert_eq!(
        (&again["state"], &again["fired"], &again["already"]),
        (&json!("succeeded"), &json!(0), &json!(5)),
        "{again}"
    );
    assert_eq!(count(&api, "sked.tasks").await, 5, "no tick ran twice");
    worker.shutdown().await;

    let (_, listed) = api
        .get(&format!("/api/v1/schedules/{id}/backfills"), &api.alice)
        .await;
    assert_eq!(listed["backfills"].as_array().unwrap().len(), 2, "{listed}");
    assert_eq!(
        listed["backfills"][1]["id"],
        backfill.as_str(),
        "newest first"
    );
    let (status, json) = api
        .post(
            &format!("/api/v1/backfills/{backfill}/cancel"),
            &api.alice,
            json!({}),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{json}");
    assert_error(&json, "conflict");
    assert!(
        json["message"]
            .as_str()
            .unwrap()
            .contains("it is succeeded"),
        "{json}"
    );

    // Another owner's schedule and backfills are not there for bob.
    for (method, uri) in [
        (Method::POST, format!("/api/v1/schedules/{id}/backfills")),
        (Method::GET, format!("/api/v1/schedules/{id}/backfills")),
        (Method::GET, format!("/api/v1/backfills/{backfill}")),
        (Method::POST, format!("/api/v1/backfills/{backfill}/cancel")),
    ] {
        let body = (method == Method::POST).then(|| json!({"from": from, "to": to}));
        let (status, json) = api.call(method, &uri, &api.bob, body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{uri}: {json}");
        assert_error(&json, "not_found");
    }
}

#[tokio::test]
async fn bad_backfill_requests_are_refused_with_the_rule_and_start_nothing() {
    let api = Api::new().await;
    let id = id_of(&create(&api, &api.alice, yearly("yearly")).await);
    let uri = format!("/api/v1/schedules/{id}/backfills");
    let future = Utc::now() + chrono::Duration::days(400);
    let cases = [
        (
            json!({"from": "2025-01-01T00:00:00Z", "to": future}),
            422,
            "is in the future",
        ),
        (
            json!({"from": "2025-02-01T00:00:00Z", "to": "2025-01-01T00:00:00Z"}),
            422,
            "is after to",
        ),
        (
            json!({"from": "2025-02-01T00:00:00Z", "to": "2025-03-01T00:00:00Z"}),
            422,
            "has no tick from",
        ),
        (
            json!({"from": "2020-01-01T00:00:00Z", "to": "2025-03-01T00:00:00Z", "max_active": 0}),
            422,
            "max_active must be 1 to 1000",
        ),
        (
            json!({"from": "2020-01-01T00:00:00Z", "to": "2025-03-01T00:00:00Z", "order": "sideways"}),
            400,
            "order",
        ),
        (
            json!({"from": "yesterday", "to": "2025-03-01T00:00:00Z"}),
            400,
            "from",
        ),
        (json!({"to": "2025-03-01T00:00:00Z"}), 400, "from"),
        (
            json!({"from": "2020-01-01T00:00:00Z", "to": "2025-03-01T00:00:00Z", "wait": true}),
            400,
            "wait",
        ),
    ];
    for (body, status, says) in cases {
        let (got, json) = api.post(&uri, &api.alice, body.clone()).await;
        assert_eq!(got.as_u16(), status, "{body}: {json}");
        assert!(
            json["message"].as_str().unwrap().contains(says),
            "{body}: {json} should say {says:?}"
        );
    }
    assert_eq!(
        count(&api, "sked.schedule_backfills").await,
        0,
        "nothing was started"
    );
    let (status, json) = api
        .post(
            &format!("/api/v1/schedules/{}/backfills", Uuid::nil()),
            &api.alice,
            json!({"from": "2020-01-01T00:00:00Z", "to": "2025-03-01T00:00:00Z"}),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{json}");
    let (status, _) = api
        .get(&format!("/api/v1/backfills/{}", Uuid::nil()), &api.alice)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn cli_backfills_a_schedule_and_follows_it_to_the_end() {
    let api = cli::Api::start().await;
    api.ok(&[
        "schedule",
        "create",
        "hourly",
        "--cron",
        "0 * * * *",
        "--paused",
        "--",
        "true",
    ])
    .await;
    let worker = support::start_worker(&api.db, support::config(&["default"]));
    let from = hour_ago(3).to_rfc3339();
    let to = hour_ago(1).to_rfc3339();
    let out = output(&mut api.sked(&[
        "schedule",
        "backfill",
        "hourly",
        "--from",
        &from,
        "--to",
        &to,
        "--max-active",
        "3",
        "--newest-first",
        "--wait",
    ]))
    .await;
    assert!(out.status.success(), "{out:?}");
    let stdout = text(&out.stdout);
    assert!(
        stdout.starts_with("succeeded: 3 of 3 ticks fired, 0 had run already"),
        "{stdout}"
    );
    assert!(text(&out.stderr).contains(": 3 ticks"), "{out:?}");
    let listed = api.ok(&["schedule", "backfills", "hourly"]).await;
    assert!(listed.contains("succeeded"), "{listed}");
    let shown = api.ok(&["schedule", "show", "hourly"]).await;
    assert!(shown.contains("backfills (newest first):"), "{shown}");

    // Again: nothing to run, it says so and succeeds.
    let again = api
        .ok(&[
            "schedule", "backfill", "hourly", "--from", &from, "--to", &to, "--wait",
        ])
        .await;
    assert!(
        again.starts_with("succeeded: 0 of 3 ticks fired, 3 had run already"),
        "{again}"
    );
    worker.shutdown().await;

    let out =
        output(&mut api.sked(&["schedule", "backfill", "hourly", "--from", "tomorrow"])).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--from must be an RFC 3339 time"),
        "{out:?}"
    );
    let future = (Utc::now() + chrono::Duration::days(1)).to_rfc3339();
    let out = output(&mut api.sked(&[
        "schedule", "backfill", "hourly", "--from", &from, "--to", &future,
    ]))
    .await;
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("is in the future"), "{out:?}");
}
