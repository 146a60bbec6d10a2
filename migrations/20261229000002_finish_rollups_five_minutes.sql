-- The rollups of finishes get a third grain, '5min': the history's 24-hour view reads 288
-- rows of five minutes per final state instead of 1,440 minute rows, whose histograms cost
-- 150 ms to add up per request at a million tasks a day (bench/README.md, W8).
alter table sked.finish_rollups drop constraint finish_rollups_grain_is_minute_or_hour;
alter table sked.finish_rollups
  add constraint finish_rollups_grain_is_minute_5min_or_hour
  check (grain in ('minute', '5min', 'hour'));
