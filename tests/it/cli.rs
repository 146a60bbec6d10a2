//! Tests of the cli.
