-- Stored workflow definitions (docs/workflows.md, "Stored definitions"): a workflow spec kept
-- under a name, in versions that never change; a run submits a version by name, and the
-- workflow it makes names the definition it came from.
create table sked.workflow_definitions (
  id         uuid primary key default sked.uuid_v7(),
  owner      text not null default current_user,
  name       text not null,
  version    integer not null,
  spec       jsonb not null,
  created_at timestamptz not null default now(),
  constraint workflow_definitions_version_is_unique_per_name unique (owner, name, version),
  constraint workflow_definitions_name_must_be_a_name
    check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'),
  constraint workflow_definitions_version_must_be_positive check (version >= 1),
  constraint workflow_definitions_spec_must_be_an_object check (jsonb_typeof(spec) = 'object'),
  constraint workflow_definitions_owner_must_not_be_empty check (owner <> '')
);

comment on table sked.workflow_definitions is
  'Stored workflow specs by name and version. Add a version with sked.workflow_define(), run one with sked.workflow_run(); see docs/workflows.md.';

alter table sked.workflow_definitions enable row level security;

-- The definition a workflow was run from (null: submitted as a spec).
alter table sked.workflows
  add column definition_id uuid references sked.workflow_definitions on delete set null;
create index workflows_by_definition on sked.workflows (definition_id)
  where definition_id is not null;
