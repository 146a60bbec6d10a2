select count(*) from sked.tasks_submit((select jsonb_agg(jsonb_build_object('kind','noop')) from generate_series(1,1000)), 'bench');
truncate sked.tasks cascade;
