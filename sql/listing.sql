-- The task listing's helpers (docs/api.md, "Listing tasks"; db/src/listing.rs).

-- How many tasks the planner expects to hold a text in what the listing's text filter
-- searches (`pattern` is the filter's ILIKE pattern), from the statistics of the trigram
-- index's expression. The listing asks the trigram index only for a text this rare; a
-- common one is found sooner by walking an index in id order. Runs as the owner: the
-- planner uses those statistics only for a role that may read every row, which row-level
-- security denies the server's role.
create or replace function sked.task_search_estimate(pattern text) returns double precision
  language plpgsql volatile as $$
declare
  plan json;
begin
  execute 'explain (format json) select 1 from sked.tasks t '
          'where sked.task_search_text(t.artifact_url, t.command, t.args, t.name) ilike $1'
     into plan using pattern;
  return (plan -> 0 -> 'Plan' ->> 'Plan Rows')::double precision;
end
$$;

comment on function sked.task_search_estimate(text) is
  'The tasks the planner expects to match the task listing''s text filter (an ILIKE pattern); see docs/api.md.';
