-- A cron tick fires at most once. Re-arming a schedule (resume, a change of expression or
-- time zone) computed the next tick from the clock alone, so a tick fired a moment ahead of
-- its time (firing loops fire 100 ms early) was armed and fired again. Each schedule now
-- keeps the latest tick it has handled, and re-arming starts after it (sql/schedules.sql).
-- Existing schedules take it from their recorded runs.

alter table sked.schedules add column last_tick_at timestamptz;

update sked.schedules s
   set last_tick_at = r.fire_at
  from (select schedule_id, max(fire_at) as fire_at
          from sked.schedule_runs
         where outcome <> 'manual'
         group by schedule_id) r
 where r.schedule_id = s.id;
