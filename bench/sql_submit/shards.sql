select sked.task_submit(command => array['true'], shards => 1000, owner => 'bench');
truncate sked.tasks cascade;
