//! Tests of the api.
