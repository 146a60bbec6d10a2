//! Errors of the database layer, classified so callers can react without parsing text.

use thiserror::Error;

pub type Result<T, E = DbError> = std::result::Result<T, E>;

#[derive(Debug, Error)]
pub enum DbError {
    /// A row was rejected by a constraint of the schema (bad input). `constraint` is the
    /// constraint's name, which reads as the rule that was broken; `message` is PostgreSQL's
    /// primary message. Its DETAIL, which for the schema's owner holds the failing row's
    /// values (secrets in `env` included), is never read into a `DbError`.
    #[error("rejected by the schema: {constraint}")]
    Rejected { constraint: String, message: String },
    /// A unique constraint (such as an idempotency key) holds another row.
    #[error("conflicts with an existing row: {constraint}")]
    Conflict { constraint: String },
    /// The input is malformed in a way Postgres reported as invalid text or parameter.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    #[error("the database schema is version {found}, this binary needs {expected}: {}", hint(*.found, *.expected))]
    SchemaMismatch { found: i64, expected: i64 },
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(transparent)]
    Sqlx(sqlx::Error),
}

fn hint(found: i64, expected: i64) -> &'static str {
    if found < expected {
        "run `sked migrate` to upgrade it"
    } else {
        "it was migrated by a newer sked; upgrade this binary"
    }
}

impl From<sqlx::Error> for DbError {
    fn from(err: sqlx::Error) -> Self {
        if let sqlx::Error::Database(db) = &err {
            let constraint = db.constraint().unwrap_or_default().to_owned();
            match db.code().as_deref() {
                // check_violation, not_null_violation, foreign_key_violation (a name that
                // names nothing, such as an alert target); a rule that refuses a value to
                // this role (insufficient_privilege with the rule as its constraint)
                Some("23514") | Some("23502") | Some("23503") => {
                    return DbError::Rejected {
                        constraint,
                        message: db.message().to_owned(),
                    };
                }
                Some("42501") if !constraint.is_empty() => {
                    return DbError::Rejected {
                        constraint,
                        message: db.message().to_owned(),
                    };
                }
                Some("23505") => return DbError::Conflict { constraint },
                // invalid_text_representation, invalid_parameter_value, datetime/interval
                // overflow, numeric out of range, invalid datetime format
                Some("22P02") | Some("22023") | Some("22008") | Some("22003") | Some("22007")
                | Some("22015") => return DbError::InvalidInput(db.message().to_owned()),
                _ => {}
            }
        }
        DbError::Sqlx(err)
    }
}

impl DbError {
    /// True for errors that a retry may cure (connection loss, serialization failure).
    pub fn is_transient(&self) -> bool {
        match self {
            DbError::Sqlx(sqlx::Error::Io(_))
            | DbError::Sqlx(sqlx::Error::PoolTimedOut)
            | DbError::Sqlx(sqlx::Error::PoolClosed)
            | DbError::Sqlx(sqlx::Error::Protocol(_)) => true,
            DbError::Sqlx(sqlx::Error::Database(db)) => matches!(
                db.code().as_deref(),
                Some("40001") | Some("40P01") | Some("57P01") | Some("57P02") | Some("57P03")
            ),
            _ => false,
        }
    }
}
