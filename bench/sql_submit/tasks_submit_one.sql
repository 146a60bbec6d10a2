select * from sked.tasks_submit('[{"command": ["true"]}]', 'bench');
truncate sked.tasks cascade;
