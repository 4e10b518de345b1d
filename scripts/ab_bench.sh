#!/bin/bash
# Before/after benchmark in one run: two downpour binaries alternated (A B A B ...), each
# running the 1+1 benchmark (every dense size and operation, latency, sparse) and the 3+2
# K=2 replicated one; prints per case the medians and their ratio after/before.
# Usage: scripts/ab_bench.sh BEFORE_BINARY AFTER_BINARY [ROUNDS]   (default 3 rounds)
# e.g. git worktree add /tmp/before 65d2862 && (cd /tmp/before && cargo build --release -p downpour)
#      scripts/ab_bench.sh /tmp/before/target/release/downpour target/release/downpour
set -euo pipefail
before=${1:?usage: ab_bench.sh BEFORE AFTER [ROUNDS]}; after=${2:?usage: ab_bench.sh BEFORE AFTER [ROUNDS]}; rounds=${3:-3}
out=$(mktemp)
for round in $(seq 1 "$rounds"); do
  for v in before after; do
    bin=$before; [ "$v" = after ] && bin=$after
    "$bin" --log warn bench --servers 1 --workers 1 --json | sed "s/^/{\"v\":\"$v\",\"cfg\":\"1+1\",\"r\":/; s/$/}/" >> "$out"
    "$bin" --log warn bench --servers 3 --workers 2 --replication 2 --sizes 1MiB,16MiB --latency-iters 0 --sparse-keys 0 --json \
      | sed "s/^/{\"v\":\"$v\",\"cfg\":\"3+2 K=2\",\"r\":/; s/$/}/" >> "$out"
  done
done
python3 - "$out" <<'PY'
import json, statistics, collections, sys
g = collections.defaultdict(lambda: collections.defaultdict(list))
for l in open(sys.argv[1]):
    r = json.loads(l); x = r['r']
    key = (r['cfg'], x['case'] + (' latency' if x.get('latency') else ''), x['bytes'], x['op'])
    val, unit = ((x['keys_per_s'] / 1e6, 'Mkeys/s') if x['case'] == 'sparse' else (x['p50_us'], 'p50 us') if x.get('latency') else (x['gbps'], 'GB/s'))
    g[key][r['v']].append((val, unit))
print(f"{'config':8} {'case':14} {'bytes':>9} {'op':15} {'unit':8} {'before':>7} {'after':>7} {'ratio':>6}")
for k in sorted(g):
    b = [v for v, _ in g[k]['before']]; a = [v for v, _ in g[k]['after']]
    if a and b:
        mb, ma = statistics.median(b), statistics.median(a)
        print(f"{k[0]:8} {k[1]:14} {k[2]:>9} {k[3]:15} {g[k]['before'][0][1]:8} {mb:7.2f} {ma:7.2f} {ma / mb:6.2f}")
PY
rm -f "$out"
