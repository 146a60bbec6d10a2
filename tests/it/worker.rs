//! Tests of the worker.
