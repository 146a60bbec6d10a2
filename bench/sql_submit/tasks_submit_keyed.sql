select count(*) from sked.tasks_submit((select jsonb_agg(jsonb_build_object('kind','noop','idempotency_key', 'k' || g)) from generate_series(1,1000) g), 'bench');
truncate sked.tasks cascade;
