-- Live events: statements that change more rows than a notification names (bulk claims and
-- finishes, COPY) or delete rows record here that they did, instead of notifying. A NOTIFY
-- holds a cluster-wide lock from before its transaction's commit record is flushed until the
-- commit ends, so concurrent notifying commits wait for each other's WAL flush; on a busy
-- queue that cost a drain a quarter of its throughput while a dashboard watched. A statement
-- bumps the counter of the first row it can lock at once (SKIP LOCKED), so writers never wait
-- for each other here; servers with live-event clients read the sum every batch window and
-- tell their clients to refetch when it moved.

create table sked.event_changes (
  slot integer primary key,
  n    bigint not null default 0
);

insert into sked.event_changes (slot) select generate_series(0, 63);
