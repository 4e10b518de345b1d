#!/bin/bash
# The fail-over check: 20 seeded runs of the counter job with K=2, each SIGKILLing one
# server (chosen by the seed) at a time chosen by the seed; prints the recovery times.
# Usage: scripts/failover_runs.sh (after cargo build --release)
fails=0
for seed in $(seq 1 20); do
  srv=$(( (seed * 7919) % 3 ))
  ms=$(( 300 + (seed * 104729) % 3000 ))
  out=$(timeout 120 ${DOWNPOUR:-target/release/downpour} launch --servers 3 --workers 2 --replication 2 --fault "kill server:$srv at ${ms}ms" -- counter --keys 100000 --rounds 300 2>&1)
  rc=$?
  oks=$(echo "$out" | grep -c "counter: OK")
  rec=$(echo "$out" | grep -o "recovery took [0-9.]* ms" | head -1)
  echo "seed=$seed server=$srv at=${ms}ms rc=$rc oks=$oks $rec"
  if [ $rc -ne 0 ] || [ $oks -ne 2 ]; then fails=$((fails+1)); echo "$out" | grep -v "counter: round" | tail -8; fi
done
echo "failures: $fails"
