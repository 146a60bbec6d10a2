//! TEXT columns that hold one of a fixed set of names (a task's `state` and `kind`, a
//! workflow's `state`), read straight into the enums of `sked-types`, which know nothing of
//! sqlx (they compile to wasm32 for the dashboard).
//!
//! [`Text<T>`] decodes a TEXT value by `T`'s `FromStr`; a name the enum does not know is a
//! decoding error naming the column, never a state made up in its place. Row structs take it
//! with `#[sqlx(try_from = "Text<TaskState>")]` on a field of type `TaskState`; tuples and
//! scalars take `Text<T>` itself. Values are written as their names (`as_str`). A test of
//! the integration suite reads every name the schema's check constraints admit through it.

use std::str::FromStr;

use sked_types::{TaskKind, TaskState, WorkflowState};
use sqlx::Postgres;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgTypeInfo, PgValueRef};

/// A TEXT value read as a `T`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Text<T>(pub T);

impl<T> sqlx::Type<Postgres> for Text<T> {
    fn type_info() -> PgTypeInfo {
        <&str as sqlx::Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <&str as sqlx::Type<Postgres>>::compatible(ty)
    }
}

impl<'r, T> sqlx::Decode<'r, Postgres> for Text<T>
where
    T: FromStr,
    T::Err: Into<BoxDynError>,
{
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        let name = <&str as sqlx::Decode<Postgres>>::decode(value)?;
        name.parse().map(Text).map_err(Into::into)
    }
}

/// `#[sqlx(try_from = "Text<…>")]` on a field of the enum's type.
macro_rules! from_text {
    ($($name:ty),*) => {$(
        impl From<Text<$name>> for $name {
            fn from(text: Text<$name>) -> Self {
                text.0
            }
        }
    )*};
}

from_text!(TaskState, TaskKind, WorkflowState);
