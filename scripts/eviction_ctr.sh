#!/usr/bin/env bash
# Issue 28's memory target: a 20M-example synth-ctr run (Zipf 1.1 over 2^32 ids, 40 features
# per example), 2 servers + 2 workers as separate processes, one epoch, unbounded and under
# admission + eviction; prints each run's test AUC and every server's table size, peak table
# bytes and peak RSS (the servers' end-of-job lines). About 9 GB of data in DIR (kept for
# reruns) and ~70 s per run on 2 vCPUs.
#
#   bash scripts/eviction_ctr.sh [DIR] [--admit A --evict E ...]...
#   e.g. bash scripts/eviction_ctr.sh /tmp/ctr "" "--admit count:2:64 --evict memory:448"
set -euo pipefail
BIN=${BIN:-target/release/downpour}
DIR=${1:-/tmp/ctr20m}
shift || true
mkdir -p "$DIR"
if [ ! -s "$DIR/train.svm" ]; then
  "$BIN" data synth-ctr --examples 20000000 --nnz 40 --key-space 4294967296 --zipf 1.1 --seed 1 --out "$DIR/train.svm"
  "$BIN" data synth-ctr --examples 1000000 --nnz 40 --key-space 4294967296 --zipf 1.1 --seed 1 --start 20000000 --out "$DIR/test.svm"
fi
[ $# -gt 0 ] || set -- "" "--admit count:2:64 --evict memory:757" "--admit count:2:64 --evict memory:448"
for flags in "$@"; do
  echo "== train linear ${flags:-(unbounded)}"
  # shellcheck disable=SC2086
  DOWNPOUR_LOG=info "$BIN" launch --servers 2 --workers 2 -- train linear --train "$DIR/train.svm" --test "$DIR/test.svm" \
    --epochs 1 --out "$DIR/metrics.json" $flags 2>&1 |
    grep -E "train linear:|server [01]: table 10" | sed -E 's/^.*(server [01]): table 10 "linear": /\1: /; s/; table 11[^;]*//'
done
