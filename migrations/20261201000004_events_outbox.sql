-- Live events: what each statement changed, kept for the servers with live-event clients to
-- read, instead of a NOTIFY. A NOTIFY holds a cluster-wide lock from before its transaction's
-- commit record is flushed until the commit ends, so transactions that notify commit one
-- after the other: with a dashboard watching, a drain of small claims and finishes lost a
-- third of its throughput. Here a statement takes the first counter of sked.event_changes that
-- no other transaction holds (SKIP LOCKED: writers never wait for each other) and adds a row
-- numbered by it. A counter is held until its transaction ends, so the rows of one slot commit
-- in the order of their numbers, and a reader that has seen number k of a slot finds every
-- later row of it, committed, up to the counter it reads in the same snapshot.
--
-- Unlogged: the rows are hints, kept for a minute. After a crash they are gone while the
-- counters are not, and readers see the gap and refetch everything.

create unlogged table sked.event_outbox (
  slot integer not null,
  n    bigint not null,
  at   timestamptz not null default now(),
  -- t tasks, l tasks with new logs, f workflows, s schedules, w workers.
  kind text not null,
  -- The ids the statement changed; null when it changed more than 150 rows or deleted rows.
  ids  uuid[],
  primary key (slot, n)
);

create index event_outbox_at on sked.event_outbox (at);
