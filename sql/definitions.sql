-- Stored workflow definitions (docs/workflows.md, "Stored definitions"): a workflow spec
-- kept under a name in numbered versions that never change (sked.workflow_definitions). A
-- new version is added only when the spec differs from the latest one; a run submits one
-- version (the latest unless named) with parameters over the spec's own, and the workflow
-- it makes names its definition (sked.workflows.definition_id). Both functions run with the
-- caller's rights: a submitter defines and runs its own definitions only.

-- Raises check_violation for a broken definition rule, naming it as the constraint.
create or replace function sked.definition_rule_raise(rule text, says text) returns void
language plpgsql as $$
begin
  raise exception 'workflow definition: %', says
    using errcode = 'check_violation', constraint = rule, table = 'workflow_definitions',
          schema = 'sked';
end
$$;

-- Adds a version of the definition `p_name` of `p_owner` holding `p_spec` (a spec as
-- sked.workflow_submit takes it), after checking it by submitting it in a subtransaction that
-- is always rolled back, so that it is held to exactly the rules of a workflow. Returns the
-- new version, or the latest one when its spec is the same (nothing is added).
create or replace function sked.workflow_define(
  p_name text, p_spec jsonb, p_owner text default current_user, p_now timestamptz default now())
returns integer
language plpgsql as $$
declare
  latest sked.workflow_definitions;
  v integer;
begin
  if p_name is null or p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$' then
    perform sked.definition_rule_raise('workflow_definitions_name_must_be_a_name',
      format('the name %L is not a letter or digit followed by up to 127 letters, digits, _, . and -',
             p_name));
  end if;
  begin
    perform sked.workflow_submit(p_spec, p_owner, p_now);
    raise exception using errcode = 'SKD00';
  exception
    when sqlstate 'SKD00' then
      null; -- the spec is valid; its trial workflow is rolled back
  end;
  -- One writer per name at a time, so that versions are numbered without gaps.
  perform pg_advisory_xact_lock(hashtextextended('sked.workflow_definitions:' || p_owner || ':' || p_name, 0));
  select * into latest from sked.workflow_definitions d
   where d.owner = p_owner and d.name = p_name
   order by d.version desc limit 1;
  if found and latest.spec = p_spec then
    return latest.version;
  end if;
  insert into sked.workflow_definitions (owner, name, version, spec, created_at)
  values (p_owner, p_name, coalesce(latest.version, 0) + 1, p_spec, p_now)
  returning version into v;
  return v;
end
$$;

-- Runs version `p_version` (the latest when null) of the definition `p_name` of `p_owner`:
-- submits its spec (named after the definition unless the spec names itself) with `p_params`
-- over the spec's own `params`, as sked.workflow_submit does, and returns the workflow's id.
create or replace function sked.workflow_run(
  p_name text, p_version integer default null, p_params jsonb default null,
  p_owner text default current_user, p_now timestamptz default now())
returns uuid
language plpgsql as $$
declare
  d sked.workflow_definitions;
  spec jsonb;
begin
  select * into d from sked.workflow_definitions x
   where x.owner = p_owner and x.name = p_name and (p_version is null or x.version = p_version)
   order by x.version desc limit 1;
  if not found then
    perform sked.definition_rule_raise('workflow_definitions_must_exist',
      format('%s has no workflow definition %L%s', p_owner, p_name,
             case when p_version is not null then format(' of version %s', p_version) else '' end));
  end if;
  if p_params is not null and jsonb_typeof(p_params) <> 'object' then
    perform sked.workflow_rule_raise('workflows_params_must_be_an_object',
      format('the workflow''s params must be an object of names and values, not %s',
             left(p_params::text, 200)));
  end if;
  spec := d.spec || jsonb_build_object('name', coalesce(nullif(d.spec ->> 'name', ''), d.name));
  if p_params is not null then
    spec := spec || jsonb_build_object('params',
      case when jsonb_typeof(d.spec -> 'params') = 'object' then d.spec -> 'params' else '{}' end
      || p_params);
  end if;
  return sked.workflow_submit_from(spec, p_owner, d.id, p_now);
end
$$;
