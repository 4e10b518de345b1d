#!/bin/bash
# The fail-over checks: 20 seeded runs of the counter job with K=2 (3 servers, 2 workers).
#   scripts/failover_runs.sh          each run SIGKILLs one server (chosen by the seed) at a
#                                     time chosen by the seed; prints the recovery times
#   scripts/failover_runs.sh elastic  each run starts a fourth server (it joins) and drains
#                                     one server (chosen by the seed, the new one included)
#                                     at times chosen by the seed; prints the switch times
#   scripts/failover_runs.sh roles    each run SIGKILLs a worker (restarted: it goes on from
#                                     its last progress record), the coordinator (restarted
#                                     from its state directory) and a server, in an order and
#                                     at times chosen by the seed
#   scripts/failover_runs.sh double   each run SIGKILLs two servers (chosen by the seed) 0-300
#                                     ms apart (chosen by the seed): needs K >= 3, so it runs
#                                     4 servers with K=3 unless SERVERS/K say otherwise
# Each line also gives the slowest counter round of either worker (what the job felt; an
# undisturbed run's slowest round is 30-100 ms here).
# Usage: after cargo build --release (DOWNPOUR=path overrides the binary; COUNTER_ARGS adds
# counter flags, e.g. COUNTER_ARGS=--sync for synchronous rounds whose sums are replicated;
# ROUNDS sets the counter's rounds, default 300: raise it when faults land after the job ended;
# SERVERS and K set the servers and copies, default 3 and 2)
mode=${1:-kill}
if [ "$mode" = double ]; then servers=${SERVERS:-4}; k=${K:-3}; else servers=${SERVERS:-3}; k=${K:-2}; fi
if [ "$mode" = double ] && { [ "$servers" -lt 2 ] || [ "$k" -lt 3 ]; }; then
  echo "failover_runs.sh double: needs SERVERS >= 2 and K >= 3 (two servers lost at once), got SERVERS=$servers K=$k" >&2
  exit 2
fi
fails=0
for seed in $(seq 1 20); do
  if [ "$mode" = elastic ]; then
    join=$(( 300 + (seed * 7919) % 2000 ))
    srv=$(( (seed * 104729) % 4 ))
    drain=$(( join + 500 + (seed * 15485863) % 2000 ))
    faults=(--fault "start server at ${join}ms" --fault "drain server:$srv at ${drain}ms")
    what="join at ${join}ms, drain server $srv at ${drain}ms"
  elif [ "$mode" = roles ]; then
    w=$(( seed % 2 ))
    srv=$(( (seed * 7919) % 3 ))
    tw=$(( 300 + (seed * 104729) % 3000 ))
    tc=$(( 300 + (seed * 15485863) % 3000 ))
    ts=$(( 300 + (seed * 32452843) % 3000 ))
    faults=(--fault "kill worker:$w at ${tw}ms" --fault "kill coordinator at ${tc}ms" --fault "kill server:$srv at ${ts}ms")
    what="kill worker $w at ${tw}ms, the coordinator at ${tc}ms, server $srv at ${ts}ms"
  elif [ "$mode" = double ]; then
    a=$(( (seed * 7919) % servers ))
    b=$(( (a + 1 + (seed * 104729) % (servers - 1)) % servers ))
    ta=$(( 300 + (seed * 15485863) % 3000 ))
    tb=$(( ta + (seed * 32452843) % 301 ))
    faults=(--fault "kill server:$a at ${ta}ms" --fault "kill server:$b at ${tb}ms")
    what="kill server $a at ${ta}ms, server $b at ${tb}ms"
  else
    srv=$(( (seed * 7919) % servers ))
    ms=$(( 300 + (seed * 104729) % 3000 ))
    faults=(--fault "kill server:$srv at ${ms}ms")
    what="kill server $srv at ${ms}ms"
  fi
  out=$(timeout 120 ${DOWNPOUR:-target/release/downpour} launch --servers $servers --workers 2 --replication $k "${faults[@]}" -- counter --keys 100000 --rounds ${ROUNDS:-300} ${COUNTER_ARGS} 2>&1)
  rc=$?
  oks=$(echo "$out" | grep -c "counter: OK")
  took=$(echo "$out" | grep -o "\(recovery\|reconfiguration\) took [0-9.]* ms" | sed 's/.* took //' | tr '\n' ' ')
  # the longest round either worker took: how long the faults held the job up
  slowest=$(echo "$out" | grep -o "slowest_round_ms=[0-9.]*" | cut -d= -f2 | sort -g | tail -1)
  [ -n "$took" ] || took="(nothing: the job ended before the fault) "
  echo "seed=$seed $what: rc=$rc oks=$oks served after: $took slowest round: ${slowest} ms"
  if [ $rc -ne 0 ] || [ $oks -ne 2 ]; then fails=$((fails+1)); echo "$out" | grep -v "counter: round" | tail -8; fi
done
echo "failures: $fails"
