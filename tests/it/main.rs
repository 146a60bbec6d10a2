//! End-to-end tests of sked against a real PostgreSQL: one integration binary, one module per
//! subject. Each test gets a fresh migrated database (`sked_db::testing::TestDb`).

mod api;
mod architecture;
mod browser;
mod cli;
mod dashboard;
mod dashboard_api;
mod delayed;
mod events;
mod isolation;
mod openapi_contract;
mod placement;
mod queues;
mod recovery;
mod requests;
mod retention;
mod schedules;
mod schedules_api;
mod services;
mod services_first;
mod shards;
mod sql;
mod states;
mod support;
mod trust_artifacts;
mod trust_bytes;
mod trust_lease;
mod trust_orphans;
mod trust_paths;
mod trust_quota;
mod trust_roles;
mod trust_rows;
mod trust_users;
mod upkeep;
mod worker;
mod workflows;
