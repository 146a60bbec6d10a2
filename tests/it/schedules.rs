//! Tests of cron schedules in SQL: next fire times across daylight saving changes, validation
//! at insert, misfire and overlap policies, pause/resume, run now, and concurrent firing. Time
//! is an input (`p_now`): nothing here sleeps.

use std::collections::HashMap;

use chrono::{DateTime, Duration, Utc};
use serde_json::{Value, json};
use sked_db::testing::TestDb;
use sqlx::PgPool;
use uuid::Uuid;

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .unwrap_or_else(|e| panic!("{s}: {e}"))
        .with_timezone(&Utc)
}

async fn next_times(
    pool: &PgPool,
    expr: &str,
    tz: &str,
    after: &str,
    n: i32,
) -> Vec<DateTime<Utc>> {
    sqlx::query_scalar("select t from sked.cron_next_times($1, $2, $3, $4) t")
        .bind(expr)
        .bind(tz)
        .bind(at(after))
        .bind(n)
        .fetch_all(pool)
        .await
        .unwrap_or_else(|e| panic!("{expr} in {tz}: {e}"))
}

#[tokio::test]
async fn next_fire_times_follow_the_expression_and_the_zone() {
    let db = TestDb::new().await;
    // (expression, zone, after, expected next fire times in UTC)
    let table: &[(&str, &str, &str, &[&str])] = &[
        // Plain fields, names, lists, ranges, steps.
        (
            "*/15 * * * *",
            "UTC",
            "2026-01-01T00:07:00Z",
            &[
                "2026-01-01T00:15:00Z",
                "2026-01-01T00:30:00Z",
                "2026-01-01T00:45:00Z",
            ],
        ),
        (
            "0 9-17/4 * * MON-FRI",
            "UTC",
            "2026-01-02T10:00:00Z", // a Friday
            &[
                "2026-01-02T13:00:00Z",
                "2026-01-02T17:00:00Z",
                "2026-01-05T09:00:00Z",
            ],
        ),
        (
            "30 4 1,15 JAN,jul *",
            "UTC",
            "2026-01-01T05:00:00Z",
            &[
                "2026-01-15T04:30:00Z",
                "2026-07-01T04:30:00Z",
                "2026-07-15T04:30:00Z",
            ],
        ),
        // Seconds field first.
        (
            "*/20 * * * * *",
            "UTC",
            "2026-02-27T12:00:00Z",
            &[
                "2026-02-27T12:00:20Z",
                "2026-02-27T12:00:40Z",
                "2026-02-27T12:01:00Z",
            ],
        ),
        // Macros.
        (
            "@hourly",
            "UTC",
            "2026-01-01T00:00:00Z",
            &["2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z"],
        ),
        (
            "@daily",
            "UTC",
            "2026-01-01T00:00:00Z",
            &["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"],
        ),
        (
            "@weekly",
            "UTC",
            "2026-01-01T00:00:00Z",
            &["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"],
        ),
        (
            "@monthly",
            "UTC",
            "2026-01-15T00:00:00Z",
            &["2026-02-01T00:00:00Z", "2026-03-01T00:00:00Z"],
        ),
        (
            "@yearly",
            "UTC",
            "2026-01-15T00:00:00Z",
            &["2027-01-01T00:00:00Z", "2028-01-01T00:00:00Z"],
        ),
        // Sunday is 0 and 7.
        (
            "0 0 * * 0",
            "UTC",
            "2026-01-01T00:00:00Z",
            &["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"],
        ),
        (
            "0 0 * * 7",
            "UTC",
            "2026-01-01T00:00:00Z",
            &["2026-01-04T00:00:00Z", "2026-01-11T00:00:00Z"],
        ),
        // Vixie: both day fields restricted, a day matching either fires (the 1st, the 15th,
        // and Mondays); with one of them starred, both must match.
        (
            "0 0 1,15 * MON",
            "UTC",
            "2026-02-27T12:00:00Z",
            &[
                "2026-03-01T00:00:00Z",
                "2026-03-02T00:00:00Z",
                "2026-03-09T00:00:00Z",
                "2026-03-15T00:00:00Z",
            ],
        ),
        (
            "0 0 */10 * MON",
            "UTC",
            "2026-01-01T00:00:00Z", // 1st, 11th, 21st, 31st that are Mondays
            &["2026-05-11T00:00:00Z", "2026-06-01T00:00:00Z"],
        ),
        // L, LW, nW, nL, n#k.
        (
            "0 0 L * *",
            "UTC",
            "2026-02-27T12:00:00Z",
            &[
                "2026-02-28T00:00:00Z",
                "2026-03-31T00:00:00Z",
                "2026-04-30T00:00:00Z",
            ],
        ),
        (
            "0 0 LW * *",
            "UTC",
            "2026-05-01T00:00:00Z",
            &["2026-05-29T00:00:00Z", "2026-06-30T00:00:00Z"],
        ),
        (
            "0 0 15W * *",
            "UTC",
            "2026-03-01T00:00:00Z",
            &["2026-03-16T00:00:00Z", "2026-04-15T00:00:00Z"],
        ),
        (
            "0 0 1W * *",
            "UTC",
            "2026-07-15T00:00:00Z",
            &["2026-08-03T00:00:00Z", "2026-09-01T00:00:00Z"],
        ),
        (
            "0 0 * * 5L",
            "UTC",
            "2026-03-01T00:00:00Z",
            &["2026-03-27T00:00:00Z", "2026-04-24T00:00:00Z"],
        ),
        (
            "0 0 * * FRI#2",
            "UTC",
            "2026-03-01T00:00:00Z",
            &["2026-03-13T00:00:00Z", "2026-04-10T00:00:00Z"],
        ),
        // February 29th only in leap years.
        (
            "0 0 29 2 *",
            "UTC",
            "2026-01-01T00:00:00Z",
            &["2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"],
        ),
        // A zone without DST.
        (
            "0 9 * * *",
            "Asia/Tokyo",
            "2026-01-01T00:00:00Z",
            &["2026-01-02T00:00:00Z", "2026-01-03T00:00:00Z"],
        ),
        // America/New_York, spring forward on 2026-03-08 at 02:00 EST -> 03:00 EDT.
        // Fixed time in the gap: once, at the first instant after it (03:00 EDT = 07:00Z).
        (
            "30 2 * * *",
            "America/New_York",
            "2026-03-06T12:00:00Z",
            &[
                "2026-03-07T07:30:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:30:00Z",
            ],
        ),
        // Real time: matches in the gap do not exist.
        (
            "*/30 * * * *",
            "America/New_York",
            "2026-03-08T06:00:00Z",
            &[
                "2026-03-08T06:30:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-08T07:30:00Z",
            ],
        ),
        (
            "0 * * * *",
            "America/New_York",
            "2026-03-08T05:30:00Z",
            &[
                "2026-03-08T06:00:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-08T08:00:00Z",
            ],
        ),
        // America/New_York, fall back on 2026-11-01 at 02:00 EDT -> 01:00 EST.
        // Fixed time in the repeated hour: the first occurrence only (01:30 EDT = 05:30Z).
        (
            "30 1 * * *",
            "America/New_York",
            "2026-10-31T12:00:00Z",
            &["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"],
        ),
        // Real time: both passes of the repeated hour.
        (
            "0 * * * *",
            "America/New_York",
            "2026-11-01T03:30:00Z",
            &[
                "2026-11-01T04:00:00Z",
                "2026-11-01T05:00:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T07:00:00Z",
            ],
        ),
        // ... also when asked from inside the first pass.
        (
            "0 * * * *",
            "America/New_York",
            "2026-11-01T05:59:00Z",
            &["2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"],
        ),
        (
            "*/20 1 * * *",
            "America/New_York",
            "2026-11-01T05:30:00Z",
            &[
                "2026-11-01T05:40:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:20:00Z",
                "2026-11-01T06:40:00Z",
                "2026-11-02T06:00:00Z",
            ],
        ),
        // Europe/Berlin, spring forward on 2026-03-29 at 02:00 CET -> 03:00 CEST.
        (
            "0 2 * * *",
            "Europe/Berlin",
            "2026-03-28T12:00:00Z",
            &["2026-03-29T01:00:00Z", "2026-03-30T00:00:00Z"],
        ),
        (
            "15 * * * *",
            "Europe/Berlin",
            "2026-03-29T00:00:00Z",
            &[
                "2026-03-29T00:15:00Z",
                "2026-03-29T01:15:00Z",
                "2026-03-29T02:15:00Z",
            ],
        ),
        // Europe/Berlin, fall back on 2026-10-25 at 03:00 CEST -> 02:00 CET.
        (
            "30 2 * * *",
            "Europe/Berlin",
            "2026-10-24T12:00:00Z",
            &["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"],
        ),
        (
            "30 * * * *",
            "Europe/Berlin",
            "2026-10-24T23:45:00Z",
            &[
                "2026-10-25T00:30:00Z",
                "2026-10-25T01:30:00Z",
                "2026-10-25T02:30:00Z",
            ],
        ),
    ];
    for (expr, tz, after, expected) in table {
        let got = next_times(&db.pool, expr, tz, after, expected.len() as i32).await;
        let want: Vec<DateTime<Utc>> = expected.iter().map(|s| at(s)).collect();
        assert_eq!(got, want, "{expr} in {tz} after {after}");
    }
}

/// The REST API takes the time zones of `sked_types::time_zones` and no other; each must be one
/// PostgreSQL knows, or a schedule the document allows would be refused.
#[tokio::test]
async fn every_time_zone_the_api_takes_is_one_postgres_knows() {
    let db = TestDb::new().await;
    let names: Vec<&str> = sked_types::time_zones::TIME_ZONES.to_vec();
    let unknown: Vec<String> = sqlx::query_scalar(
        "select tz from unnest($1::text[]) tz
          where not exists (select 1 from pg_timezone_names n where n.name = tz)",
    )
    .bind(&names)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert!(unknown.is_empty(), "PostgreSQL does not know {unknown:?}");
    // And the schema's own check takes each (it refuses some names PostgreSQL reads).
    let checked: i64 =
        sqlx::query_scalar("select count(*) from unnest($1::text[]) tz, lateral sked.tz_check(tz)")
            .bind(&names)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(checked as usize, names.len());
}

#[tokio::test]
async fn invalid_expressions_zones_and_templates_are_rejected_at_insert() {
    let db = TestDb::new().await;
    let cases: &[(&str, &str, &str, &str)] = &[
        // (cron, time zone, task template, words the message must contain)
        (
            "* * * *",
            "UTC",
            r#"{"command":["true"]}"#,
            "expected 5 fields",
        ),
        (
            "60 * * * *",
            "UTC",
            r#"{"command":["true"]}"#,
            "minute field: 60 is out of range 0-59",
        ),
        (
            "0 24 * * *",
            "UTC",
            r#"{"command":["true"]}"#,
            "hour field: 24 is out of range 0-23",
        ),
        (
            "0 0 32 * *",
            "UTC",
            r#"{"command":["true"]}"#,
            "day of month field: 32 is out of range 1-31",
        ),
        (
            "0 0 * FOO *",
            "UTC",
            r#"{"command":["true"]}"#,
            "month field: 'FOO' is not a number or a month name",
        ),
        (
            "0 0 * * 8",
            "UTC",
            r#"{"command":["true"]}"#,
            "day of week field: 8 is out of range 0-7",
        ),
        ("*/0 * * * *", "UTC", r#"{"command":["true"]}"#, "step 0"),
        (
            "5-1 * * * *",
            "UTC",
            r#"{"command":["true"]}"#,
            "range 5-1 runs backwards",
        ),
        ("@reboot", "UTC", r#"{"command":["true"]}"#, "unknown macro"),
        (
            "0 0 * * 1#6",
            "UTC",
            r#"{"command":["true"]}"#,
            "the week must be 1 to 5",
        ),
        (
            "0 0 30 2 *",
            "UTC",
            r#"{"command":["true"]}"#,
            "never fires",
        ),
        (
            "0 0 * * *",
            "Mars/Olympus",
            r#"{"command":["true"]}"#,
            "time zone 'Mars/Olympus' is not known",
        ),
        (
            "0 0 * * *",
            "UTC",
            r#"{"comand":["true"]}"#,
            "unknown or unsettable keys: comand",
        ),
        (
            "0 0 * * *",
            "UTC",
            r#"{"command":["true"],"run_at":"2026-01-01T00:00:00Z"}"#,
            "unsettable keys: run_at",
        ),
        (
            "0 0 * * *",
            "UTC",
            r#"{"queue":"q"}"#,
            "tasks_command_or_artifact_is_required",
        ),
        (
            "0 0 * * *",
            "UTC",
            r#"{"command":["true"],"queue":"no spaces"}"#,
            "queue 'no spaces' must be",
        ),
    ];
    for (cron, tz, task, words) in cases {
        let err = sqlx::query(
            "insert into sked.schedules (name, cron, time_zone, task) values ('s', $1, $2, $3::jsonb)",
        )
        .bind(cron)
        .bind(tz)
        .bind(task)
        .execute(&db.pool)
        .await
        .expect_err(&format!("{cron} / {tz} / {task} must be rejected"));
        let db_err = err.as_database_error().expect("a database error");
        assert_eq!(db_err.code().as_deref(), Some("23514"), "{cron}: {db_err}");
        assert!(
            db_err.message().contains(words),
            "{cron}: {:?} lacks {words:?}",
            db_err.message()
        );
    }
    let bad_policy = sqlx::query(
        "insert into sked.schedules (name, cron, task, overlap_policy) values ('s', '@daily', '{\"command\":[\"true\"]}', 'sometimes')",
    )
    .execute(&db.pool)
    .await
    .expect_err("an unknown policy is rejected");
    assert_eq!(
        bad_policy.as_database_error().and_then(|e| e.constraint()),
        Some("schedules_overlap_policy_is_allow_skip_queue_one_or_replace")
    );
    let rows: (i64, i64) = sqlx::query_as(
        "select (select count(*) from sked.schedules), (select count(*) from sked.tasks)",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        rows,
        (0, 0),
        "nothing was inserted, not even a trial occurrence"
    );
}

#[tokio::test]
async fn a_plain_insert_is_armed_and_a_change_of_expression_rearms_it() {
    let db = TestDb::new().await;
    let (id, next, now): (Uuid, DateTime<Utc>, DateTime<Utc>) = sqlx::query_as(
        "insert into sked.schedules (name, cron, time_zone, task)
         values ('nightly', '0 0 * * *', 'Europe/Berlin', '{\"command\": [\"true\"]}')
         returning id, next_run_at, now()",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let expected: DateTime<Utc> = sqlx::query_scalar(
        "select sked.cron_next(sked.cron_parse('0 0 * * *'), 'Europe/Berlin', $1)",
    )
    .bind(now)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(next, expected);
    assert!(next > now && next <= now + Duration::days(1));

    let rearmed: DateTime<Utc> = sqlx::query_scalar(
        "update sked.schedules set cron = '*/5 * * * *' where id = $1 returning next_run_at",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert!(
        rearmed <= now + Duration::minutes(6),
        "re-armed at {rearmed}"
    );
    let err = sqlx::query("update sked.schedules set cron = '0 0 31 4 *' where id = $1")
        .bind(id)
        .execute(&db.pool)
        .await
        .expect_err("an expression that never fires is rejected on update too");
    assert!(err.to_string().contains("never fires"), "{err}");
}

/// Creates a schedule at `now` with the given cron and policies; returns its id.
async fn schedule(pool: &PgPool, cron: &str, misfire: &str, overlap: &str, now: &str) -> Uuid {
    sqlx::query_scalar(
        "select sked.schedule_create(name => $1, cron => $2, task => '{\"command\": [\"true\"]}',
                                     misfire_policy => $3, overlap_policy => $4, catch_up_limit => 3,
                                     p_now => $5)",
    )
    .bind(format!("{cron} {misfire} {overlap}"))
    .bind(cron)
    .bind(misfire)
    .bind(overlap)
    .bind(at(now))
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn fire(pool: &PgPool, now: &str) -> i32 {
    sqlx::query_scalar("select sked.schedules_fire(p_now => $1)")
        .bind(at(now))
        .fetch_one(pool)
        .await
        .unwrap()
}

/// (fire_at, outcome, has an occurrence, missed_ticks, detail) of a run.
type Run = (DateTime<Utc>, String, bool, i32, Option<String>);

/// A schedule's runs, oldest first.
async fn runs(pool: &PgPool, id: Uuid) -> Vec<Run> {
    sqlx::query_as(
        "select fire_at, outcome, task_id is not null, missed_ticks, detail
           from sked.schedule_runs where schedule_id = $1 order by fire_at, id",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn occurrences(pool: &PgPool, id: Uuid) -> Vec<(Uuid, String, DateTime<Utc>)> {
    sqlx::query_as(
        "select t.id, t.state, t.next_run_at from sked.schedule_runs r
           join sked.tasks t on t.id = r.task_id
          where r.schedule_id = $1 order by r.fire_at",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap()
}

async fn next_run_at(pool: &PgPool, id: Uuid) -> DateTime<Utc> {
    sqlx::query_scalar("select next_run_at from sked.schedules where id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn an_on_time_tick_inserts_one_occurrence_and_advances() {
    let db = TestDb::new().await;
    let id = schedule(
        &db.pool,
        "0 * * * *",
        "run_once",
        "allow",
        "2026-06-01T10:20:00Z",
    )
    .await;
    assert_eq!(next_run_at(&db.pool, id).await, at("2026-06-01T11:00:00Z"));
    assert_eq!(
        fire(&db.pool, "2026-06-01T10:59:59Z").await,
        0,
        "not due yet"
    );
    assert_eq!(fire(&db.pool, "2026-06-01T11:00:00.020Z").await, 1);
    assert_eq!(
        fire(&db.pool, "2026-06-01T11:00:00.040Z").await,
        0,
        "each tick fires once"
    );
    let occ = occurrences(&db.pool, id).await;
    assert_eq!(occ.len(), 1);
    assert_eq!(occ[0].1, "waiting");
    assert_eq!(
        occ[0].2,
        at("2026-06-01T11:00:00Z"),
        "the occurrence is due at its tick"
    );
    assert_eq!(next_run_at(&db.pool, id).await, at("2026-06-01T12:00:00Z"));
    // Fired a little ahead (the firing duty's horizon), the occurrence still waits for its tick.
    let fired: i32 =
        sqlx::query_scalar("select sked.schedules_fire(interval '100 ms', p_now => $1)")
            .bind(at("2026-06-01T11:59:59.950Z"))
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(fired, 1);
    assert_eq!(
        occurrences(&db.pool, id).await[1].2,
        at("2026-06-01T12:00:00Z")
    );
}

#[tokio::test]
async fn misfire_policies_after_a_downtime() {
    let db = TestDb::new().await;
    // Hourly from 10:00; nothing fires until 15:10: the ticks 11:00 … 15:00 (5) were missed.
    let created = "2026-06-01T10:20:00Z";
    let skip = schedule(&db.pool, "0 * * * *", "skip", "allow", created).await;
    let once = schedule(&db.pool, "0 * * * *", "run_once", "allow", created).await;
    let catch_up = schedule(&db.pool, "0 * * * *", "catch_up", "allow", created).await;
    assert_eq!(fire(&db.pool, "2026-06-01T15:10:00Z").await, 3);

    let r = runs(&db.pool, skip).await;
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(
        (r[0].0, r[0].1.as_str(), r[0].2, r[0].3),
        (at("2026-06-01T11:00:00Z"), "missed", false, 5)
    );
    assert!(r[0].4.as_deref().unwrap().contains("misfire policy skip"));
    assert!(occurrences(&db.pool, skip).await.is_empty());

    let r = runs(&db.pool, once).await;
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(
        (r[0].0, r[0].1.as_str(), r[0].2, r[0].3),
        (at("2026-06-01T11:00:00Z"), "fired", true, 4)
    );
    assert!(
        r[0].4
            .as_deref()
            .unwrap()
            .contains("one run for 5 missed ticks"),
        "{r:?}"
    );

    // catch_up_limit 3: three occurrences, the other two counted as missed.
    let r = runs(&db.pool, catch_up).await;
    let fired: Vec<_> = r.iter().filter(|x| x.1 == "fired").map(|x| x.0).collect();
    assert_eq!(
        fired,
        vec![
            at("2026-06-01T11:00:00Z"),
            at("2026-06-01T12:00:00Z"),
            at("2026-06-01T13:00:00Z")
        ]
    );
    let missed: Vec<_> = r
        .iter()
        .filter(|x| x.1 == "missed")
        .map(|x| (x.0, x.3))
        .collect();
    assert_eq!(missed, vec![(at("2026-06-01T14:00:00Z"), 2)]);
    assert_eq!(occurrences(&db.pool, catch_up).await.len(), 3);

    // All resume at the next future tick.
    for id in [skip, once, catch_up] {
        assert_eq!(next_run_at(&db.pool, id).await, at("2026-06-01T16:00:00Z"));
    }
    // A tick that is late by less than the grace (1 minute) is not a misfire.
    assert_eq!(fire(&db.pool, "2026-06-01T16:00:30Z").await, 3);
    let r = runs(&db.pool, skip).await;
    assert_eq!((r[1].1.as_str(), r[1].2), ("fired", true));
}

#[tokio::test]
async fn overlap_policies_when_the_previous_occurrence_is_unfinished() {
    let db = TestDb::new().await;
    let t0 = "2026-06-01T10:00:30Z";
    let allow = schedule(&db.pool, "* * * * *", "run_once", "allow", t0).await;
    let skip = schedule(&db.pool, "* * * * *", "run_once", "skip", t0).await;
    let queue_one = schedule(&db.pool, "* * * * *", "run_once", "queue_one", t0).await;
    let replace = schedule(&db.pool, "* * * * *", "run_once", "replace", t0).await;
    // 10:01 fires everywhere; the occurrences stay waiting (no worker runs them).
    assert_eq!(fire(&db.pool, "2026-06-01T10:01:00Z").await, 4);
    assert_eq!(fire(&db.pool, "2026-06-01T10:02:00Z").await, 4);
    assert_eq!(fire(&db.pool, "2026-06-01T10:03:00Z").await, 4);

    let outcomes = |r: Vec<Run>| r.into_iter().map(|x| x.1).collect::<Vec<_>>();
    assert_eq!(
        outcomes(runs(&db.pool, allow).await),
        ["fired", "fired", "fired"]
    );
    assert_eq!(occurrences(&db.pool, allow).await.len(), 3);

    assert_eq!(
        outcomes(runs(&db.pool, skip).await),
        ["fired", "skipped", "skipped"]
    );
    let r = runs(&db.pool, skip).await;
    assert!(r[1].4.as_deref().unwrap().contains("overlap policy skip"));
    assert_eq!(occurrences(&db.pool, skip).await.len(), 1);

    assert_eq!(
        outcomes(runs(&db.pool, queue_one).await),
        ["fired", "queued", "skipped"]
    );
    let first = occurrences(&db.pool, queue_one).await[0].0;
    // Nothing is released while the first occurrence is unfinished…
    assert_eq!(fire(&db.pool, "2026-06-01T10:03:10Z").await, 0);
    // …and the queued tick fires once it has finished.
    let state: String = sqlx::query_scalar("select sked.task_cancel($1)")
        .bind(first)
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(state, "cancelled");
    assert_eq!(fire(&db.pool, "2026-06-01T10:03:20Z").await, 1);
    let r = runs(&db.pool, queue_one).await;
    assert_eq!(
        (r[1].0, r[1].1.as_str(), r[1].2),
        (at("2026-06-01T10:02:00Z"), "fired", true)
    );
    assert_eq!(occurrences(&db.pool, queue_one).await.len(), 2);
    let queued: Option<DateTime<Utc>> =
        sqlx::query_scalar("select queued_fire_at from sked.schedules where id = $1")
            .bind(queue_one)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(queued, None);

    assert_eq!(
        outcomes(runs(&db.pool, replace).await),
        ["fired", "fired", "fired"]
    );
    let states: Vec<String> = occurrences(&db.pool, replace)
        .await
        .into_iter()
        .map(|o| o.1)
        .collect();
    assert_eq!(
        states,
        ["cancelled", "cancelled", "waiting"],
        "each tick replaced the one before"
    );
}

#[tokio::test]
async fn pause_resume_and_run_now() {
    let db = TestDb::new().await;
    let id = schedule(
        &db.pool,
        "0 * * * *",
        "run_once",
        "allow",
        "2026-06-01T10:20:00Z",
    )
    .await;
    let paused: bool = sqlx::query_scalar("select sked.schedule_pause($1, $2)")
        .bind(id)
        .bind(at("2026-06-01T10:30:00Z"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(paused);
    assert_eq!(
        fire(&db.pool, "2026-06-01T13:30:00Z").await,
        0,
        "a paused schedule does not fire"
    );
    let resumed: bool = sqlx::query_scalar("select sked.schedule_resume($1, $2)")
        .bind(id)
        .bind(at("2026-06-01T13:30:00Z"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert!(resumed);
    // Ticks that passed while paused are neither run nor counted as missed.
    assert_eq!(next_run_at(&db.pool, id).await, at("2026-06-01T14:00:00Z"));
    assert!(runs(&db.pool, id).await.is_empty());

    let task: Uuid = sqlx::query_scalar("select sked.schedule_run_now($1, $2)")
        .bind(id)
        .bind(at("2026-06-01T13:31:00Z"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    let r = runs(&db.pool, id).await;
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].1, "manual");
    let (state, command): (String, Vec<String>) =
        sqlx::query_as("select state, command from sked.tasks where id = $1")
            .bind(task)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        (state.as_str(), command),
        ("waiting", vec!["true".to_string()])
    );
    assert_eq!(
        next_run_at(&db.pool, id).await,
        at("2026-06-01T14:00:00Z"),
        "run now leaves the schedule as it was"
    );
    let none: Option<Uuid> = sqlx::query_scalar("select sked.schedule_run_now($1)")
        .bind(Uuid::nil())
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(none, None);
}

#[tokio::test]
async fn three_concurrent_firing_loops_fire_each_tick_once() {
    let db = TestDb::new().await;
    let start = at("2026-06-01T10:00:00.500Z");
    for i in 0..40 {
        sqlx::query(
            "select sked.schedule_create(name => $1, cron => '* * * * * *', overlap_policy => 'allow',
                                         task => '{\"kind\": \"noop\"}', p_now => $2)",
        )
        .bind(format!("every second {i}"))
        .bind(start)
        .execute(&db.pool)
        .await
        .unwrap();
    }
    // Three loops walk the same 30 seconds of clock in step, all three firing at each moment
    // at once. (Out of step, a loop far ahead in the clock would find a tick that another
    // loop held locked as missed, which is the misfire policy's business, not this test's.)
    let step_together = std::sync::Arc::new(tokio::sync::Barrier::new(3));
    let mut loops = Vec::new();
    for _ in 0..3 {
        let pool = db.pool.clone();
        let step_together = step_together.clone();
        loops.push(tokio::spawn(async move {
            let mut handled = 0;
            for step in 1..=120 {
                step_together.wait().await;
                let now = start + Duration::milliseconds(250 * step);
                let n: i32 = sqlx::query_scalar("select sked.schedules_fire(p_now => $1)")
                    .bind(now)
                    .fetch_one(&pool)
                    .await
                    .expect("firing never fails");
                handled += n;
            }
            handled
        }));
    }
    let mut total = 0;
    for l in loops {
        total += l.await.unwrap();
    }
    // 40 schedules × 30 ticks (10:00:01 … 10:00:30), each handled exactly once.
    assert_eq!(
        total,
        40 * 30,
        "schedule-ticks handled across the three loops"
    );
    let per_tick: Vec<(DateTime<Utc>, i64, i64)> = sqlx::query_as(
        "select fire_at, count(*), count(distinct task_id) from sked.schedule_runs
          where outcome = 'fired' group by fire_at order by fire_at",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(per_tick.len(), 30);
    for (i, (fire_at, runs, tasks)) in per_tick.iter().enumerate() {
        assert_eq!(
            *fire_at,
            at("2026-06-01T10:00:01Z") + Duration::seconds(i as i64)
        );
        assert_eq!((*runs, *tasks), (40, 40), "tick {fire_at}");
    }
    let tasks: i64 = sqlx::query_scalar("select count(*) from sked.tasks")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(
        tasks,
        40 * 30,
        "one occurrence per schedule and tick, no more"
    );
}

#[tokio::test]
async fn runs_are_trimmed_to_the_history_limit() {
    let db = TestDb::new().await;
    let id: Uuid = sqlx::query_scalar(
        "select sked.schedule_create(name => 'h', cron => '* * * * *', overlap_policy => 'skip',
                                     task => '{\"kind\": \"noop\"}', history_limit => 5,
                                     p_now => '2026-06-01T10:00:30Z')",
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    for minute in 1..=12 {
        fire(&db.pool, &format!("2026-06-01T10:{minute:02}:00Z")).await;
    }
    let before: HashMap<String, i64> = sqlx::query_as::<_, (String, i64)>(
        "select outcome, count(*) from sked.schedule_runs group by outcome",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap()
    .into_iter()
    .collect();
    assert_eq!(before.get("fired"), Some(&1));
    assert_eq!(
        before.get("skipped"),
        Some(&11),
        "skipped ticks are recorded, never silent"
    );
    let deleted: i32 = sqlx::query_scalar("select sked.schedule_runs_prune()")
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(deleted, 7);
    let kept: Vec<DateTime<Utc>> = runs(&db.pool, id).await.into_iter().map(|r| r.0).collect();
    assert_eq!(
        kept.first(),
        Some(&at("2026-06-01T10:08:00Z")),
        "the newest five are kept"
    );
    assert_eq!(kept.len(), 5);
}

#[tokio::test]
async fn a_schedule_fires_a_whole_workflow() {
    let db = TestDb::new().await;
    let id: Uuid = sqlx::query_scalar(
        r#"select sked.schedule_create(name => 'etl', cron => '0 * * * *',
             workflow => '{"name": "etl", "tasks": [
                            {"name": "collect", "kind": "noop"},
                            {"name": "clean", "kind": "noop", "depends_on": ["collect"]},
                            {"name": "export", "kind": "noop", "depends_on": ["clean"]}]}',
             p_now => '2026-06-01T10:20:00Z')"#,
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(fire(&db.pool, "2026-06-01T11:00:00Z").await, 1);
    let (outcome, workflow): (String, Option<Uuid>) = sqlx::query_as(
        "select outcome, workflow_id from sked.schedule_runs where schedule_id = $1",
    )
    .bind(id)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(outcome, "fired");
    let workflow = workflow.expect("the run names the workflow it submitted");
    let states: Vec<(String, String)> =
        sqlx::query_as("select name, state from sked.tasks where workflow_id = $1 order by name")
            .bind(workflow)
            .fetch_all(&db.pool)
            .await
            .unwrap();
    let expected = [
        ("clean", "blocked"),
        ("collect", "waiting"),
        ("export", "blocked"),
    ]
    .map(|(n, s)| (n.to_string(), s.to_string()));
    assert_eq!(states, expected);
    // The workflow is unfinished at the next tick: the default overlap policy skips it.
    assert_eq!(fire(&db.pool, "2026-06-01T12:00:00Z").await, 1);
    let outcomes: Vec<String> = sqlx::query_scalar(
        "select outcome from sked.schedule_runs where schedule_id = $1 order by fire_at",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(outcomes, ["fired", "skipped"]);
    // A bad workflow template is rejected at insert, naming the workflow's rule.
    let err = sqlx::query(
        r#"insert into sked.schedules (name, cron, workflow)
           values ('bad', '@daily', '{"tasks": [{"name": "a", "kind": "noop", "depends_on": ["a"]}]}')"#,
    )
    .execute(&db.pool)
    .await
    .expect_err("a self-edge is rejected");
    let db_err = err.as_database_error().unwrap();
    assert_eq!(
        db_err.constraint(),
        Some("schedules_workflow_template_must_be_valid")
    );
    assert!(
        db_err.message().contains("workflow template is not valid"),
        "{}",
        db_err.message()
    );
}

#[tokio::test]
async fn a_schedule_without_further_ticks_is_paused_not_broken() {
    let db = TestDb::new().await;
    // The fifth Monday of February: 2016-02-29, then none until 2044 (beyond eight years),
    // so after that tick the schedule runs out.
    let id = schedule(
        &db.pool,
        "0 0 * 2 MON#5",
        "run_once",
        "allow",
        "2015-06-01T00:00:00Z",
    )
    .await;
    let tick = next_run_at(&db.pool, id).await;
    assert_eq!(tick, at("2016-02-29T00:00:00Z"));
    assert_eq!(fire(&db.pool, &tick.to_rfc3339()).await, 1);
    let (paused, next): (Option<DateTime<Utc>>, DateTime<Utc>) =
        sqlx::query_as("select paused_at, next_run_at from sked.schedules where id = $1")
            .bind(id)
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(paused, Some(tick), "paused where it ended");
    assert_eq!(next, tick);
    let r = runs(&db.pool, id).await;
    assert_eq!(r[0].1, "fired");
    assert!(
        r[1].4
            .as_deref()
            .unwrap()
            .contains("no tick within eight years"),
        "{r:?}"
    );
    let err = sqlx::query("select sked.schedule_resume($1)")
        .bind(id)
        .execute(&db.pool)
        .await
        .expect_err("it cannot be resumed");
    assert!(err.to_string().contains("never fires"), "{err}");
}

#[tokio::test]
async fn run_now_on_a_tick_keeps_both_records() {
    let db = TestDb::new().await;
    let id = schedule(
        &db.pool,
        "0 * * * *",
        "run_once",
        "allow",
        "2026-06-01T10:20:00Z",
    )
    .await;
    let manual: Uuid = sqlx::query_scalar("select sked.schedule_run_now($1, $2)")
        .bind(id)
        .bind(at("2026-06-01T11:00:00Z"))
        .fetch_one(&db.pool)
        .await
        .unwrap();
    assert_eq!(fire(&db.pool, "2026-06-01T11:00:00Z").await, 1);
    let r: Vec<(DateTime<Utc>, String, Option<Uuid>)> = sqlx::query_as(
        "select fire_at, outcome, task_id from sked.schedule_runs where schedule_id = $1 order by id",
    )
    .bind(id)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!(
        (r[0].0, r[0].1.as_str(), r[0].2),
        (at("2026-06-01T11:00:00Z"), "manual", Some(manual))
    );
    assert_eq!(
        (r[1].0, r[1].1.as_str()),
        (at("2026-06-01T11:00:00Z"), "fired")
    );
    assert!(r[1].2.is_some_and(|t| t != manual));
}

#[tokio::test]
async fn a_schedule_may_fire_a_sharded_task() {
    let db = TestDb::new().await;
    let id: Uuid = sqlx::query_scalar(
        r#"select sked.schedule_create(name => 'reindex', cron => '0 * * * *',
             task => '{"kind": "noop", "shards": 3}', p_now => '2026-06-01T10:20:00Z')"#,
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(fire(&db.pool, "2026-06-01T11:00:00Z").await, 1);
    let occ = occurrences(&db.pool, id).await;
    assert_eq!(occ.len(), 1);
    let shards: Vec<i32> = sqlx::query_scalar(
        "select shard_index from sked.tasks where shard_of = $1 order by shard_index",
    )
    .bind(occ[0].0)
    .fetch_all(&db.pool)
    .await
    .unwrap();
    assert_eq!(shards, [0, 1, 2], "the occurrence runs as its shards");
}

#[tokio::test]
async fn a_scheduled_run_gets_its_tick_in_the_schedules_zone_and_in_utc() {
    let db = TestDb::new().await;
    // 03:30 in Berlin on the day its clocks go forward (02:00 -> 03:00): 01:30 UTC.
    let wf_schedule: Uuid = sqlx::query_scalar(
        r#"select sked.schedule_create(name => 'etl', cron => '30 3 * * *',
             time_zone => 'Europe/Berlin',
             workflow => '{"name": "etl", "params": {"mode": "full", "tick": "not this"},
                           "tasks": [{"name": "load", "command": ["load",
                             "--day={{ params.tick_date }}", "{{ params.tick }}",
                             "{{ params.tick_utc }}", "{{ params.mode }}"]}]}',
             p_now => '2026-03-28T12:00:00Z')"#,
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    let task_schedule: Uuid = sqlx::query_scalar(
        r#"select sked.schedule_create(name => 'one', cron => '30 3 * * *',
             time_zone => 'Europe/Berlin', task => '{"command": ["true"], "env": {"A": "b"}}',
             p_now => '2026-03-28T12:00:00Z')"#,
    )
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(fire(&db.pool, "2026-03-29T01:30:00Z").await, 2);

    let (params, command): (Value, Vec<String>) = sqlx::query_as(
        "select w.params, t.command from sked.schedule_runs r
           join sked.workflows w on w.id = r.workflow_id
           join sked.tasks t on t.workflow_id = w.id
          where r.schedule_id = $1",
    )
    .bind(wf_schedule)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        params,
        json!({"mode": "full", "tick": "2026-03-29T03:30:00+02:00",
               "tick_utc": "2026-03-29T01:30:00Z", "tick_date": "2026-03-29"}),
        "the tick's parameters over the template's own"
    );
    assert_eq!(
        command,
        [
            "load",
            "--day=2026-03-29",
            "2026-03-29T03:30:00+02:00",
            "2026-03-29T01:30:00Z",
            "full"
        ]
    );
    let env: Value = sqlx::query_scalar(
        "select t.env from sked.schedule_runs r join sked.tasks t on t.id = r.task_id
          where r.schedule_id = $1",
    )
    .bind(task_schedule)
    .fetch_one(&db.pool)
    .await
    .unwrap();
    assert_eq!(
        env,
        json!({"A": "b", "SKED_TICK": "2026-03-29T03:30:00+02:00",
               "SKED_TICK_UTC": "2026-03-29T01:30:00Z", "SKED_TICK_DATE": "2026-03-29"}),
        "a task occurrence finds its tick in its environment"
    );
    let err = sqlx::query(
        r#"select sked.schedule_create(name => 'bad', cron => '@daily',
             workflow => '{"tasks": [{"name": "a", "command": ["echo", "{{ params.tik }}"]}]}')"#,
    )
    .execute(&db.pool)
    .await
    .expect_err("a placeholder naming no parameter is refused when the schedule is written");
    let err = err.as_database_error().unwrap();
    assert_eq!(
        err.constraint(),
        Some("schedules_workflow_template_must_be_valid")
    );
    assert!(
        err.message()
            .contains("uses {{ params.tik }}, but the workflow has no parameter 'tik' (its parameters: 'tick', 'tick_date', 'tick_utc')"),
        "{}",
        err.message()
    );
}

/// Starts a backfill of schedule `id` at `now`; the error when a rule refuses it.
async fn backfill(
    pool: &PgPool,
    id: Uuid,
    from: &str,
    to: &str,
    max_active: i32,
    newest_first: bool,
    now: &str,
) -> Result<Uuid, sqlx::Error> {
    sqlx::query_scalar("select sked.schedule_backfill($1, $2, $3, $4, $5, $6)")
        .bind(id)
        .bind(at(from))
        .bind(at(to))
        .bind(max_active)
        .bind(newest_first)
        .bind(at(now))
        .fetch_one(pool)
        .await
}

/// (state, fired, already, active, succeeded, failed, error) of a backfill.
type Progress = (String, i32, i32, i32, i32, i32, Option<String>);

async fn progress(pool: &PgPool, backfill: Uuid) -> Progress {
    sqlx::query_as(
        "select state, fired, already, cardinality(active), succeeded, failed, error
           from sked.schedule_backfills where id = $1",
    )
    .bind(backfill)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The ticks a backfill fired, oldest first, with the SKED_TICK each occurrence got and its
/// state.
async fn backfilled(pool: &PgPool, backfill: Uuid) -> Vec<(DateTime<Utc>, String, String)> {
    sqlx::query_as(
        "select r.fire_at, t.env ->> 'SKED_TICK', t.state from sked.schedule_runs r
           join sked.tasks t on t.id = r.task_id
          where r.backfill_id = $1 order by r.fire_at",
    )
    .bind(backfill)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// Ends every unfinished occurrence of the backfill as `state`.
async fn end_occurrences(pool: &PgPool, backfill: Uuid, state: &str) {
    sqlx::query(
        "update sked.tasks t set state = $2, attempt = 1, finished_at = now(),
                error = case when $2 = 'succeeded' then null else 'it broke' end
          from sked.schedule_runs r
         where r.backfill_id = $1 and t.id = r.task_id and t.state in ('waiting', 'running')",
    )
    .bind(backfill)
    .bind(state)
    .execute(pool)
    .await
    .unwrap();
}

#[tokio::test]
async fn a_backfill_runs_every_tick_of_a_range_over_dst_changes_at_most_n_at_once() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    // 02:30 in Berlin: on 2026-03-29 the clocks go from 02:00 to 03:00, on 2026-10-25 from
    // 03:00 back to 02:00.
    let id: Uuid = sqlx::query_scalar(
        r#"select sked.schedule_create(name => 'nightly', cron => '30 2 * * *',
             time_zone => 'Europe/Berlin', task => '{"command": ["true"]}',
             p_now => '2026-01-01T00:00:00Z')"#,
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let now = "2026-11-01T12:00:00Z";
    let spring = backfill(
        pool,
        id,
        "2026-03-27T00:00:00Z",
        "2026-03-31T00:00:00Z",
        2,
        false,
        now,
    )
    .await
    .unwrap();
    // The ticks are those the schedule fires itself.
    let expected: Vec<DateTime<Utc>> = sqlx::query_scalar(
        "select t from sked.cron_next_times('30 2 * * *', 'Europe/Berlin', $1, 4) t",
    )
    .bind(at("2026-03-27T00:00:00Z"))
    .fetch_all(pool)
    .await
    .unwrap();
    assert_eq!(expected.len(), 4);

    // Two at once: the firing duty's call starts two, and no more while they run.
    fire(pool, now).await;
    fire(pool, now).await;
    let first = backfilled(pool, spring).await;
    assert_eq!(first.len(), 2, "at most max_active at once: {first:?}");
    assert_eq!(progress(pool, spring).await.0, "running");
    end_occurrences(pool, spring, "succeeded").await;
    fire(pool, now).await;
    end_occurrences(pool, spring, "failed").await;
    fire(pool, now).await;
    let all = backfilled(pool, spring).await;
    let ticks: Vec<DateTime<Utc>> = all.iter().map(|r| r.0).collect();
    assert_eq!(ticks, expected, "every tick of the range, oldest first");
    let tick_texts: Vec<&str> = all.iter().map(|r| r.1.as_str()).collect();
    assert_eq!(
        tick_texts,
        [
            "2026-03-27T02:30:00+01:00",
            "2026-03-28T02:30:00+01:00",
            "2026-03-29T03:00:00+02:00",
            "2026-03-30T02:30:00+02:00"
        ],
        "each occurrence gets its tick in the schedule's zone"
    );
    assert_eq!(
        progress(pool, spring).await,
        ("failed".into(), 4, 0, 0, 2, 2, None),
        "two succeeded, two failed: the backfill ended failed"
    );

    // Again over a wider range: the ticks that ran are not run again.
    let again = backfill(
        pool,
        id,
        "2026-03-26T00:00:00Z",
        "2026-03-31T00:00:00Z",
        10,
        false,
        now,
    )
    .await
    .unwrap();
    fire(pool, now).await;
    let fired_again = backfilled(pool, again).await;
    assert_eq!(
        fired_again.iter().map(|r| r.0).collect::<Vec<_>>(),
        [at("2026-03-26T01:30:00Z")],
        "only the tick no run recorded"
    );
    end_occurrences(pool, again, "succeeded").await;
    fire(pool, now).await;
    assert_eq!(
        progress(pool, again).await,
        ("succeeded".into(), 1, 4, 0, 1, 0, None)
    );
    let per_tick: Vec<(DateTime<Utc>, i64)> = sqlx::query_as(
        "select fire_at, count(*) from sked.schedule_runs where schedule_id = $1
          group by fire_at having count(*) > 1",
    )
    .bind(id)
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(per_tick.is_empty(), "one run per tick: {per_tick:?}");

    // Autumn, newest first, with a tick the schedule had missed: the missed one runs.
    sqlx::query(
        "insert into sked.schedule_runs (schedule_id, fire_at, outcome, missed_ticks, detail)
         values ($1, '2026-10-24T00:30:00Z', 'missed', 2, '2 ticks missed')",
    )
    .bind(id)
    .execute(pool)
    .await
    .unwrap();
    let autumn = backfill(
        pool,
        id,
        "2026-10-23T12:00:00Z",
        "2026-10-26T12:00:00Z",
        1,
        true,
        now,
    )
    .await
    .unwrap();
    let expected: Vec<DateTime<Utc>> = sqlx::query_scalar(
        "select t from sked.cron_next_times('30 2 * * *', 'Europe/Berlin', $1, 10) t
          where t <= '2026-10-26T12:00:00Z' order by t desc",
    )
    .bind(at("2026-10-23T12:00:00Z"))
    .fetch_all(pool)
    .await
    .unwrap();
    // One at a time: each step starts the next tick once the previous occurrence ended.
    let mut ran: Vec<DateTime<Utc>> = vec![];
    for _ in 0..expected.len() + 1 {
        fire(pool, now).await;
        let started: Vec<DateTime<Utc>> = backfilled(pool, autumn)
            .await
            .into_iter()
            .map(|r| r.0)
            .filter(|t| !ran.contains(t))
            .collect();
        assert!(started.len() <= 1, "one at a time: {started:?}");
        ran.extend(started);
        end_occurrences(pool, autumn, "succeeded").await;
    }
    fire(pool, now).await;
    assert_eq!(
        ran, expected,
        "every tick of the range as the schedule fires them, the newest first"
    );
    let (outcome, detail): (String, String) = sqlx::query_as(
        "select outcome, detail from sked.schedule_runs
          where schedule_id = $1 and fire_at = '2026-10-24T00:30:00Z'",
    )
    .bind(id)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(outcome, "fired", "a missed tick is run by a backfill");
    assert_eq!(detail, "backfill; before: missed (2 ticks missed)");
    assert_eq!(progress(pool, autumn).await.0, "succeeded");
}

#[tokio::test]
async fn bad_backfills_are_refused_and_change_nothing() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    let id = schedule(
        pool,
        "0 * * * *",
        "run_once",
        "allow",
        "2026-01-01T00:00:00Z",
    )
    .await;
    let now = "2026-06-01T00:00:00Z";
    let cases: [(&str, &str, i32, &str, &str); 6] = [
        (
            "2026-02-02T00:00:00Z",
            "2026-02-01T00:00:00Z",
            1,
            "schedule_backfills_from_must_not_be_after_to",
            "is after to",
        ),
        (
            "2026-05-31T00:00:00Z",
            "2026-06-02T00:00:00Z",
            1,
            "schedule_backfills_must_end_in_the_past",
            "is in the future",
        ),
        (
            "2026-02-01T00:10:00Z",
            "2026-02-01T00:20:00Z",
            1,
            "schedule_backfills_must_cover_a_tick",
            "has no tick from",
        ),
        (
            "2025-01-01T00:00:00Z",
            "2026-05-01T00:00:00Z",
            1,
            "schedule_backfills_ticks_must_be_1_to_10000",
            "more than 10000 ticks",
        ),
        (
            "2026-02-01T00:00:00Z",
            "2026-02-02T00:00:00Z",
            0,
            "schedule_backfills_max_active_must_be_1_to_1000",
            "max_active must be 1 to 1000, not 0",
        ),
        (
            "2026-02-01T00:00:00Z",
            "2026-02-02T00:00:00Z",
            1001,
            "schedule_backfills_max_active_must_be_1_to_1000",
            "not 1001",
        ),
    ];
    for (from, to, max_active, rule, says) in cases {
        let err = backfill(pool, id, from, to, max_active, false, now)
            .await
            .expect_err("refused");
        let err = err.as_database_error().expect("a database error");
        assert_eq!(
            err.constraint(),
            Some(rule),
            "{from} {to} {max_active}: {}",
            err.message()
        );
        assert!(err.message().contains(says), "{}", err.message());
    }
    let backfills: i64 = sqlx::query_scalar("select count(*) from sked.schedule_backfills")
        .fetch_one(pool)
        .await
        .unwrap();
    assert_eq!(backfills, 0, "nothing was started");
    let none: Option<Uuid> = sqlx::query_scalar(
        "select sked.schedule_backfill(sked.uuid_v7(), now() - interval '1 day', now())",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(none, None, "no such schedule");
}

#[tokio::test]
async fn a_backfill_that_cannot_submit_fails_alone_and_a_cancelled_one_stops() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    // A broadcast needs a live worker when it is submitted: one is alive when the schedule is
    // written, and gone when the backfill runs.
    let worker: Uuid = sqlx::query_scalar(
        "insert into sked.workers (id, name, host, version, queues, concurrency, lease)
         values (sked.uuid_v7(), 'w', 'h', '0', '{default}', 4, '30 s') returning id",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    let broadcast: Uuid = sqlx::query_scalar(
        r#"select sked.schedule_create(name => 'everywhere', cron => '0 * * * *',
             task => '{"command": ["true"], "broadcast": true}')"#,
    )
    .fetch_one(pool)
    .await
    .unwrap();
    sqlx::query("delete from sked.workers where id = $1")
        .bind(worker)
        .execute(pool)
        .await
        .unwrap();
    let plain = schedule(
        pool,
        "0 * * * *",
        "run_once",
        "allow",
        "2026-01-01T00:00:00Z",
    )
    .await;
    let other = schedule(
        pool,
        "30 * * * *",
        "run_once",
        "allow",
        "2026-01-01T00:00:00Z",
    )
    .await;
    let now = "2026-06-01T00:00:00Z";
    let (from, to) = ("2026-05-01T00:00:00Z", "2026-05-01T05:00:00Z");
    let broken = backfill(pool, broadcast, from, to, 2, false, now)
        .await
        .unwrap();
    let good = backfill(pool, plain, from, to, 2, false, now)
        .await
        .unwrap();
    let cancelled = backfill(pool, other, from, to, 1, false, now)
        .await
        .unwrap();
    fire(pool, now).await;
    let (state, fired, .., error) = progress(pool, broken).await;
    assert_eq!((state.as_str(), fired), ("failed", 0));
    let error = error.expect("the reason");
    assert!(
        error.starts_with(
            "the occurrence of the tick at 2026-05-01 00:00:00+00 could not be submitted: "
        ) && error.contains("no live worker"),
        "{error}"
    );
    let runs: i64 =
        sqlx::query_scalar("select count(*) from sked.schedule_runs where schedule_id = $1")
            .bind(broadcast)
            .fetch_one(pool)
            .await
            .unwrap();
    assert_eq!(runs, 0, "the failed step recorded no run");
    assert_eq!(
        backfilled(pool, good).await.len(),
        2,
        "the other backfills went on"
    );
    assert_eq!(backfilled(pool, cancelled).await.len(), 1);

    let stopped: bool = sqlx::query_scalar("select sked.schedule_backfill_cancel($1)")
        .bind(cancelled)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(stopped);
    end_occurrences(pool, cancelled, "succeeded").await;
    fire(pool, now).await;
    assert_eq!(
        backfilled(pool, cancelled).await.len(),
        1,
        "a cancelled backfill starts no more"
    );
    assert_eq!(progress(pool, cancelled).await.0, "cancelled");
    let again: bool = sqlx::query_scalar("select sked.schedule_backfill_cancel($1)")
        .bind(cancelled)
        .fetch_one(pool)
        .await
        .unwrap();
    assert!(
        !again,
        "a backfill that is not running is not cancelled again"
    );
}
