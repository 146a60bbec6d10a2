//! The subcommands of the `sked` binary that are not the server, the worker or `sked dev`
//! (those are in the library, [`sked::app`]): database administration and the REST API
//! client's commands, one module per group of subcommands. The modules depend on [`args`]
//! and [`format`] and on no other subcommand's module but the task commands', which submit
//! workflows and services too.

pub mod args;
pub mod commands;
pub mod format;
pub mod queues;
pub mod schedules;
pub mod services;
pub mod units;
pub mod wait;
pub mod when;
pub mod workflows;
