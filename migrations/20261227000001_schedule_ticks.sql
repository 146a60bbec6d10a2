-- Ticks of all schedules, counted per outcome as sked.schedules_fire handles them, so that
-- Prometheus can read a counter that only grows (sked_schedule_ticks_total): the runs in
-- sked.schedule_runs are pruned to each schedule's history limit, so counting them would go
-- down. One row per outcome; sked.schedules_fire adds to them in the transaction that claims
-- the ticks. Existing runs are counted once here.
create table sked.schedule_ticks (
  outcome text primary key,
  ticks   bigint not null default 0,
  constraint schedule_ticks_outcome_is_fired_skipped_or_missed
    check (outcome in ('fired', 'skipped', 'missed')),
  constraint schedule_ticks_ticks_must_not_be_negative check (ticks >= 0)
);

comment on table sked.schedule_ticks is
  'Ticks of all schedules per outcome since the schema was created (sql/schedules.sql, sked.schedules_fire); read by the servers'' /metrics.';

insert into sked.schedule_ticks (outcome, ticks)
select o.outcome, coalesce(sum(o.n), 0)
  from (select outcome, case when outcome = 'missed' then missed_ticks else 1 end as n
          from sked.schedule_runs
         where outcome in ('fired', 'skipped', 'missed')
        union all
        -- A late run_once occurrence stands for the missed ticks it counts.
        select 'missed', missed_ticks
          from sked.schedule_runs
         where outcome in ('fired', 'skipped') and missed_ticks > 0
        union all
        select x, 0 from unnest(array['fired', 'skipped', 'missed']) x) o
 group by o.outcome;
