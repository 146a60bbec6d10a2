-- Live events: the servers whose websocket clients want to hear of changes. The event
-- triggers (sql/events.sql) notify `sked_events` only while a row here has not expired, so
-- that claims, finishes and inserts pay for building and sending notifications only while
-- someone watches. A server keeps its row fresh while it has clients and deletes it when
-- they are gone; the row of a server that died expires.

create table sked.event_listeners (
  id         uuid primary key,
  expires_at timestamptz not null
);

-- The triggers ask "is any row unexpired?" from within the hot-path functions, which plan
-- with enable_seqscan = off: this index keeps that question an index probe.
create index event_listeners_expires_at on sked.event_listeners (expires_at);
