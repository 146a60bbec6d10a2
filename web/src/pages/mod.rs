//! One module per page of the dashboard.

pub mod history;
pub mod overview;
pub mod queues;
pub mod schedules;
pub mod service;
pub mod services;
pub mod signin;
pub mod submit;
pub mod submit_workflow;
pub mod task;
pub mod tasks;
pub mod workers;
pub mod workflows;
