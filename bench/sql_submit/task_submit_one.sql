select sked.task_submit(command => array['true'], owner => 'bench');
truncate sked.tasks cascade;
