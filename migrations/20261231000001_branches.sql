-- Branches (docs/workflows.md, "Branches"): a workflow task whose output chooses which of its
-- direct children run; the others end skipped. And the trigger rule a join after a branch
-- needs: none_failed runs once every parent finished and none failed, skipped ones included.

alter table sked.tasks add column branch boolean not null default false;

-- Checked on the rows already there without holding off writers for the scan.
alter table sked.tasks drop constraint tasks_trigger_rule_is_known,
  add constraint tasks_trigger_rule_is_known
    check (trigger_rule in ('all_success', 'all_done', 'one_failed', 'none_failed', 'shards'))
    not valid;
alter table sked.tasks validate constraint tasks_trigger_rule_is_known;

-- The finish looks up whether a finishing task is a branch (its output must then name its
-- children) on this index: one probe of an index that holds the branch tasks only, so that
-- the finish of other tasks pays almost nothing and the insert of other tasks nothing.
create index tasks_branches on sked.tasks (id) where branch;
