//! Tests of the sql.
