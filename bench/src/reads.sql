-- W8's data set: $1 tasks over the last $2 hours (W8: 24, W16: fewer, so that more of them
-- finished in the last hour), newest last, with time-ordered ids made from their creation
-- times. Queues: default 45 %, emails 20 %, reports 15 %, etl 12 %,
-- gpu 7 %, ml-rare 1 %; owners: ops 45 %, web 30 %, etl 15 %, ml 9 %, intern 1 %. Most
-- tasks succeeded (about 90 %); about 6 % failed, 1 % were cancelled, a few ended
-- upstream_failed or skipped. Unfinished: the newest 2,500 tasks (40 % running on ten
-- workers, the rest waiting), a backlog of `reports` from the last 3 hours (waiting, due),
-- 0.4 % delayed (due within 24 hours), retries from the last 30 minutes and blocked tasks
-- from the last 2 hours. Those three ages are for a span of 24 hours and shrink with it
-- (× $2 / 24), so that the same seed gives every task the same state whatever the span:
-- a shorter span only packs the same tasks into fewer hours. Commands look like a real installation's, with account, customer,
-- table and user numbers; `etl` tasks carry secrets in their environment.
insert into sked.tasks (id, owner, queue, priority, kind, command, args, env, labels, state, attempt,
                        max_attempts, next_run_at, worker_id, lease_expires_at, created_at,
                        started_at, finished_at, exit_code, error, stdout_tail, stderr_tail,
                        name, parents, parents_pending)
select encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid())
         placing substring(int8send((extract(epoch from g.created_at) * 1000)::bigint) from 3)
         from 1 for 6), 52, 1), 53, 1), 'hex')::uuid,
       g.owner, g.queue, 0, 'command', g.command, '{}', g.env, '{}', g.state,
       case when g.state in ('waiting', 'blocked', 'upstream_failed', 'skipped') then 0
            when g.state = 'failed' then 3 else 1 end,
       3,
       case when g.delayed then now() + g.u2 * interval '24 hours' else g.created_at end,
       case when g.ran then g.worker end,
       case when g.state = 'running' then now() + interval '30 seconds' end,
       g.created_at,
       case when g.ran then g.started_at end,
       case when g.final then least(now(), g.started_at + g.u2 * interval '60 seconds') end,
       case g.state when 'succeeded' then 0 when 'failed' then 1 end,
       case g.state when 'failed' then 'exit code 1' when 'cancelled' then 'cancelled before it ran'
                    when 'upstream_failed' then 'a task it depends on failed' end,
       case when g.state = 'succeeded' then 'done: ' || (g.i % 1000) || ' rows in ' || round((g.u2 * 60)::numeric, 2) || 's' || chr(10) end,
       case when g.state = 'failed' then 'Traceback (most recent call last):' || chr(10) || 'ConnectionError: connection refused' || chr(10) end,
       case when g.queue = 'etl' then 'nightly-etl.load-' || (g.i % 97) end,
       case when g.state = 'blocked' then 1 else 0 end,
       case when g.state = 'blocked' then 1 else 0 end
  from (
    select s.*,
           s.state in ('succeeded', 'failed', 'cancelled', 'upstream_failed', 'skipped') as final,
           s.state in ('succeeded', 'failed', 'running', 'retry') as ran,
           s.created_at + (0.05 + s.u2 * 2) * interval '1 second' as started_at
      from (
        select q.*,
               case
                 when q.i > $1 - 2500 then case when q.u < 0.4 then 'running' else 'waiting' end
                 when q.queue = 'reports' and q.age < interval '3 hours' * q.scale then 'waiting'
                 when q.u < 0.004 then 'waiting'
                 when q.age < interval '30 minutes' * q.scale and q.u < 0.024 then 'retry'
                 when q.age < interval '2 hours' * q.scale and q.u < 0.034 then 'blocked'
                 when q.u < 0.064 then 'failed'
                 when q.u < 0.074 then 'cancelled'
                 when q.u < 0.077 then 'upstream_failed'
                 when q.u < 0.079 then 'skipped'
                 else 'succeeded'
               end as state,
               q.u < 0.004 and not (q.i > $1 - 2500) and not (q.queue = 'reports' and q.age < interval '3 hours' * q.scale) as delayed
          from (
            select p.*,
                   case p.queue
                     when 'default' then array['/usr/bin/python3', '/opt/jobs/sync_account.py', '--account', 'acct-' || (p.i % 50000)]
                     when 'emails' then array['/usr/local/bin/send-email', '--template',
                                             (array['welcome', 'invoice', 'password-reset', 'digest'])[1 + p.i % 4],
                                             '--to', 'user' || (p.i % 200000) || '@example.com']
                     when 'reports' then array['/opt/reports/bin/render', '--report', 'monthly-revenue', '--customer', 'c-' || (p.i % 9973)]
                     when 'etl' then array['sh', '-c', 'pg_dump -t orders_' || (p.i % 97) || ' shop | gzip > /backups/orders_' || (p.i % 97) || '.sql.gz']
                     when 'gpu' then array['/opt/ml/train', '--model', 'resnet50', '--epochs', '3', '--shard', (p.i % 64)::text]
                     else array['/opt/ml/evaluate', '--checkpoint', 'ckpt-' || p.i]
                   end as command,
                   case when p.queue = 'etl'
                        then jsonb_build_object('LOG_LEVEL', 'info', 'DATABASE_URL', 'postgres://etl:hunter2@db/shop', 'S3_SECRET_KEY', 'k' || p.i)
                        else jsonb_build_object('LOG_LEVEL', 'info') end as env,
                   ('00000000-0000-4000-8000-0000000000' || lpad((1 + p.i % 10)::text, 2, '0'))::uuid as worker,
                   now() - p.created_at as age,
                   $2::float8 / 24 as scale
              from (
                select i, random() as u, random() as u2,
                       now() - interval '24 hours' * ($2::float8 / 24) * (($1 - i)::float8 / $1) as created_at,
                       case when r1 < 0.45 then 'default' when r1 < 0.65 then 'emails' when r1 < 0.80 then 'reports'
                            when r1 < 0.92 then 'etl' when r1 < 0.99 then 'gpu' else 'ml-rare' end as queue,
                       case when r2 < 0.45 then 'ops' when r2 < 0.75 then 'web' when r2 < 0.90 then 'etl'
                            when r2 < 0.99 then 'ml' else 'intern' end as owner
                  from (select i, random() as r1, random() as r2 from generate_series(1, $1) i) s0
              ) p
          ) q
      ) s
  ) g
