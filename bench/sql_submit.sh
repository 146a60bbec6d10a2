#!/bin/bash
# The database's cost of submitting, old build against new: each build's `sked migrate` makes
# its own database, then pgbench runs every script of bench/sql_submit/ against both,
# alternated (the order swapped each round), and prints the median latency of each script's
# first statement (the submission; the second empties the table).
#
#   bench/sql_submit.sh OLD_DIR NEW_DIR [ROUNDS] [SECONDS]
#
# OLD_DIR and NEW_DIR hold each build's `sked` (`cargo build --release --bin sked`).
# PostgreSQL is reached as in the tests (PGHOST, PGPORT, PGUSER; default 127.0.0.1:5432,
# postgres). Defaults: 5 rounds of 6 seconds per script and build.
set -euo pipefail
old=$1 new=$2 rounds=${3:-5} secs=${4:-6}
export PGHOST=${PGHOST:-127.0.0.1} PGPORT=${PGPORT:-5432} PGUSER=${PGUSER:-postgres}
export PGOPTIONS="${PGOPTIONS:-} -c client_min_messages=warning"
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp)
for b in old new; do
  psql -qc "drop database if exists sked_sql_submit_$b" -c "create database sked_sql_submit_$b" postgres
done
"$old/sked" migrate --database-url "postgres://$PGUSER@$PGHOST:$PGPORT/sked_sql_submit_old" >/dev/null
"$new/sked" migrate --database-url "postgres://$PGUSER@$PGHOST:$PGPORT/sked_sql_submit_new" >/dev/null
for script in "$here"/sql_submit/*.sql; do
  for r in $(seq "$rounds"); do
    if (( r % 2 )); then order="old new"; else order="new old"; fi
    for b in $order; do
      ms=$(pgbench -n -r -f "$script" -T "$secs" "sked_sql_submit_$b" 2>&1 |
           awk '/statement latencies/ {getline; print $1}')
      [ -n "$ms" ] || { echo "pgbench failed: $script on the $b build" >&2; exit 1; }
      echo "$(basename "$script" .sql) $b $ms" >> "$out"
    done
  done
done
python3 - "$out" <<'P'
import collections, statistics, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    script, build, ms = line.split()
    runs[(script, build)].append(float(ms))
for script in sorted({s for s, _ in runs}):
    old, new = statistics.median(runs[(script, "old")]), statistics.median(runs[(script, "new")])
    print(f"{script}: old {old:.2f} ms, new {new:.2f} ms ({(new / old - 1) * 100:+.1f} %)")
P
for b in old new; do psql -qc "drop database sked_sql_submit_$b" postgres; done
rm -f "$out"
