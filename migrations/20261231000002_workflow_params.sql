-- Workflow parameters (docs/workflows.md, "Parameters"): the values a workflow was submitted
-- with, kept on its row so that a run says which it used.
alter table sked.workflows add column params jsonb;
