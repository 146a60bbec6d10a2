//! The table of errors in `docs/sql.md` ("Errors") is the code's: every constraint of the
//! tables a submission writes and every rule the SQL functions raise is a row, with the
//! SQLSTATE it is raised with; every row names one of them, or an error that this test
//! raises and reads back.

use std::collections::{BTreeMap, BTreeSet};

use regex::Regex;
use serde_json::json;
use sked_db::testing::TestDb;
use sqlx::PgPool;

use crate::trust_roles::Login;

/// The SQLSTATE of a condition name the SQL files use in `errcode = '…'`.
fn sqlstate(code: &str) -> String {
    match code {
        "check_violation" => "23514",
        "unique_violation" => "23505",
        "exclusion_violation" => "23P01",
        "invalid_parameter_value" => "22023",
        "insufficient_privilege" => "42501",
        "no_data_found" => "P0002",
        other => other,
    }
    .to_owned()
}

/// The rows of the table: name → SQLSTATE.
fn documented() -> BTreeMap<String, String> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/sql.md"))
        .expect("docs/sql.md");
    let section = doc
        .split("\n## Errors\n")
        .nth(1)
        .expect("docs/sql.md has a section \"## Errors\"");
    let section = section.split("\n## ").next().unwrap();
    let row = Regex::new(r"(?m)^\| `([0-9A-Z]{5})` \| `([^`]+)` \|").unwrap();
    let mut rows = BTreeMap::new();
    for c in row.captures_iter(section) {
        let previous = rows.insert(c[2].to_owned(), c[1].to_owned());
        assert!(previous.is_none(), "{} is in the table twice", &c[2]);
    }
    assert!(rows.len() > 50, "the table was read: {} rows", rows.len());
    rows
}

fn sql_files() -> Vec<(String, String)> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/sql");
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read_to_string(&path).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

/// Every rule the SQL files raise by name, with its SQLSTATE: a rule passed to one of the
/// `*_rule_raise` helpers (or returned by `sked.task_rule_broken`, which
/// `sked.task_rule_raise` raises) takes the helper's errcode; a rule named in a `raise`
/// statement takes that statement's.
async fn raised(pool: &PgPool) -> BTreeMap<String, String> {
    let names = Regex::new(
        r"'((?:tasks|workflows|workflow_definitions|schedules|schedule_backfills|services|task_edges)_[a-z0-9_%]+)'",
    )
    .unwrap();
    let errcode = Regex::new(r"errcode = '([a-z_0-9A-Z]+)'").unwrap();
    let statement = Regex::new(r"(?sm)raise exception .*?;$").unwrap();
    let helper_call = Regex::new(r"sked\.([a-z_]+_rule_raise)\(\s*$").unwrap();
    // Names of functions, tables, indexes and triggers are not rules.
    let objects: Vec<String> = sqlx::query_scalar(
        "select proname::text from pg_proc where pronamespace = 'sked'::regnamespace
         union select relname::text from pg_class where relnamespace = 'sked'::regnamespace
         union select tgname::text from pg_trigger t join pg_class c on c.oid = t.tgrelid
          where c.relnamespace = 'sked'::regnamespace",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let booleans: Vec<String> = sqlx::query_scalar(
        "select f from unnest(sked.task_fields()) f
          join pg_attribute a on a.attrelid = 'sked.tasks'::regclass and a.attname = f
         where a.atttypid = 'boolean'::regtype",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    // The errcode each raising helper uses, from its source.
    let helper_code = |name: &str, files: &[(String, String)]| -> String {
        let head = format!("function sked.{name}(");
        let (_, text) = files
            .iter()
            .find(|(_, t)| t.contains(&head))
            .unwrap_or_else(|| panic!("sked.{name} is defined in sql/"));
        let body = &text[text.find(&head).unwrap()..];
        let body = &body[..body.find("\n$$;").unwrap()];
        sqlstate(
            &errcode
                .captures(body)
                .expect("the helper raises with an errcode")[1],
        )
    };
    let files = sql_files();
    let mut found = BTreeMap::new();
    for (file, text) in &files {
        for m in names.captures_iter(text) {
            let name = m[1].to_owned();
            if objects.contains(&name) {
                continue;
            }
            let at = m.get(0).unwrap().start();
            let line_start = text[..at].rfind('\n').map_or(0, |i| i + 1);
            let before = &text[line_start..at];
            let code = if let Some(c) = helper_call.captures(before.trim_end()) {
                helper_code(&c[1], &files)
            } else if text[..at].contains("function sked.task_rule_broken(")
                && text[..at].rfind("create or replace function")
                    == text[..at].rfind("create or replace function sked.task_rule_broken(")
            {
                helper_code("task_rule_raise", &files)
            } else if let Some(s) = statement
                .find_iter(text)
                .find(|s| s.start() <= at && at < s.end())
            {
                match errcode.captures(s.as_str()) {
                    Some(c) => sqlstate(&c[1]),
                    None => continue,
                }
            } else {
                // Named elsewhere: in a comparison, or where a helper's rule is mapped to its
                // sentence. Its raise site is found on its own.
                continue;
            };
            let expanded = if name.contains("%s") {
                booleans.iter().map(|b| name.replace("%s", b)).collect()
            } else {
                vec![name.clone()]
            };
            for n in expanded {
                if let Some(other) = found.insert(n.clone(), code.clone()) {
                    assert_eq!(other, code, "{n} is raised with two SQLSTATEs ({file})");
                }
            }
        }
    }
    assert!(found.len() > 30, "rules were found in sql/: {found:?}");
    found
}

/// The constraints of the tables a submission writes, with the SQLSTATE of their kind.
async fn constraints(pool: &PgPool) -> BTreeMap<String, String> {
    let rows: Vec<(String, String)> = sqlx::query_as(
        "select conname::text, case contype when 'c' then '23514' when 'u' then '23505'
                                            else '23P01' end
           from pg_constraint
          where contype in ('c', 'u', 'x')
            and conrelid in ('sked.tasks'::regclass, 'sked.workflows'::regclass,
                             'sked.task_edges'::regclass, 'sked.schedules'::regclass,
                             'sked.schedule_backfills'::regclass,
                             'sked.workflow_definitions'::regclass)",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter().collect()
}

/// The errors of the table that are not rules, each raised here: (row name, SQLSTATE,
/// message).
async fn other_errors(db: &TestDb) -> BTreeMap<String, (String, String)> {
    let pool = &db.pool;
    let alice = Login::new(db, "sked_submitter").await;
    let mut seen = BTreeMap::new();
    let cases: Vec<(&str, &PgPool, String)> = vec![
        (
            "expects a JSON array of task objects",
            pool,
            "select * from sked.tasks_submit('{}')".into(),
        ),
        (
            "a task is a JSON object of its fields",
            pool,
            "select * from sked.tasks_submit('[1]')".into(),
        ),
        (
            "may not submit tasks owned by",
            &alice.pool,
            format!(
                "select * from sked.tasks_submit('{}')",
                json!([{"command": ["true"], "owner": "bob", "idempotency_key": "k"}])
            ),
        ),
        (
            "no such task",
            pool,
            "select * from sked.task_await(gen_random_uuid())".into(),
        ),
        (
            "no such workflow",
            pool,
            "select * from sked.workflow_await(gen_random_uuid())".into(),
        ),
        (
            "must be more than 0 and at most 1 day",
            pool,
            "select * from sked.task_await(gen_random_uuid(), true, '0 s')".into(),
        ),
    ];
    for (name, on, sql) in cases {
        let e = sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
            .execute(on)
            .await
            .expect_err(&sql);
        let db_error = e.as_database_error().expect("a database error");
        seen.insert(
            name.to_owned(),
            (
                db_error.code().unwrap_or_default().into_owned(),
                db_error.message().to_owned(),
            ),
        );
    }
    seen
}

#[tokio::test]
async fn the_table_of_errors_is_the_codes() {
    let db = TestDb::new().await;
    let table = documented();
    let mut code = constraints(&db.pool).await;
    for (name, state) in raised(&db.pool).await {
        if let Some(other) = code.insert(name.clone(), state.clone()) {
            assert_eq!(other, state, "{name} is a constraint and a raised rule");
        }
    }
    let others = other_errors(&db).await;

    let mut missing = Vec::new();
    for (name, state) in &code {
        match table.get(name) {
            None => missing.push(name.clone()),
            Some(doc) => assert_eq!(doc, state, "{name}: the table says {doc}, the code {state}"),
        }
    }
    assert!(
        missing.is_empty(),
        "rules missing from docs/sql.md's table: {missing:?}"
    );

    let rules: BTreeSet<&String> = code.keys().collect();
    for (name, state) in &table {
        if rules.contains(name) {
            continue;
        }
        let (raised, message) = others.get(name).unwrap_or_else(|| {
            panic!("docs/sql.md's table names {name}, which is neither a rule of the code nor an error this test raises")
        });
        assert_eq!(raised, state, "{name}: raised {raised} ({message})");
        assert!(
            message.contains(name.as_str()),
            "{name}: the message is {message:?}"
        );
    }
    for name in others.keys() {
        assert!(
            table.contains_key(name),
            "{name} is raised but not in the table"
        );
    }
}

/// The rules the issue names, each a stable SQLSTATE and constraint through every way in.
#[tokio::test]
async fn submissions_that_break_a_rule_name_it() {
    let db = TestDb::new().await;
    let pool = &db.pool;
    for (task, rule) in [
        (
            json!({"command": ["true"], "kind": "nope"}),
            "tasks_kind_is_known",
        ),
        (
            json!({"command": ["true"], "max_attempts": 0}),
            "tasks_max_attempts_must_be_at_least_1",
        ),
        (
            json!({"command": ["true"], "timeout": "-1 s"}),
            "tasks_timeout_must_be_positive",
        ),
        (json!({"command": []}), "tasks_command_must_not_be_empty"),
        (
            json!({"command": ["true"], "preemptible": 1}),
            "tasks_preemptible_must_be_a_boolean",
        ),
    ] {
        let e = sqlx::query("select * from sked.tasks_submit($1)")
            .bind(json!([task]))
            .execute(pool)
            .await
            .unwrap_err();
        let d = e.as_database_error().unwrap();
        assert_eq!(
            (d.code().as_deref(), d.constraint()),
            (Some("23514"), Some(rule)),
            "{task}: {e}"
        );
    }
    let e = sqlx::query(
        "select sked.schedule_create('s', '0 * * * *', $1, time_zone => 'Mars/Olympus')",
    )
    .bind(json!({"command": ["true"]}))
    .execute(pool)
    .await
    .unwrap_err();
    let d = e.as_database_error().unwrap();
    assert_eq!(
        (d.code().as_deref(), d.constraint()),
        (Some("23514"), Some("schedules_time_zone_must_be_known")),
        "a bad time zone is its own rule: {e}"
    );
    let e = sqlx::query("select sked.schedule_create('s', '0 24 * * *', $1)")
        .bind(json!({"command": ["true"]}))
        .execute(pool)
        .await
        .unwrap_err();
    assert_eq!(
        e.as_database_error().unwrap().constraint(),
        Some("schedules_cron_must_be_valid"),
        "{e}"
    );
}
