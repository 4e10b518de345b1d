#!/bin/bash
# The ssp read cache over a shaped link: train linear --consistency ssp:4 as local processes
# (launch: 1 server + 2 workers) inside a network namespace whose loopback is shaped to RATE
# (tc tbf: every byte between the nodes crosses it), without the cache, with it kept fresh by
# refetching only, and with the servers' update feeds; ROUNDS interleaved rounds per rate.
# Prints per configuration the medians of the wall time, the time to a target test log loss
# (the first epoch whose test log loss is at most TARGET), the cache's row hit rate, the
# reads answered wholly locally, the largest staleness seen and worker 0's bytes
# (docs/experiments.md). The runs' metrics stay in DIR as link-RATE-CACHE-ROUND.json.
#
#   sudo bash scripts/ssp_cache_link.sh [DIR] [ROUNDS] [RATES]
#
# DIR (default out/ssp-cache) holds the SpamAssassin split of scripts/ssp_cache_compare.sh
# (made by it when missing); RATES (default "200mbit unshaped"); TARGET (env, default 0.06);
# EVAL_EVERY (env, default 0): worker 0 also scores the test set every N minibatches
# (train linear --eval-every), and the time to target is read from those scores instead of
# the epoch ends (an epoch's loss straddling the target moves it by a whole epoch); EXTRA
# (env): more train linear flags for every run (e.g. "--lr 0.2"); EPOCHS (env, default 5).
# Needs root (ip netns, tc); the namespace is removed at the end.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dp="$repo/target/release/downpour"
dir=${1:-out/ssp-cache}
rounds=${2:-5}
rates=${3:-"200mbit unshaped"}
target=${TARGET:-0.06}
eval_every=${EVAL_EVERY:-0}
extra=${EXTRA:-}
epochs=${EPOCHS:-5}
if [ ! -f "$dir/sp_train.svm" ]; then
  bash "$repo/scripts/ssp_cache_compare.sh" "$dir" 0 > /dev/null
fi
cd "$dir"
ns=dp-ssp-link
ip netns del $ns 2>/dev/null || true
ip netns add $ns
trap 'ip netns del $ns 2>/dev/null || true' EXIT
ip netns exec $ns ip link set lo up
d="--train sp_train.svm --test sp_test.svm --epochs $epochs --batch 20 --optimizer sgd --normalize false --consistency ssp:4 --eval-every $eval_every $extra"
for rate in $rates; do
  if [ "$rate" = unshaped ]; then
    ip netns exec $ns tc qdisc del dev lo root 2>/dev/null || true
  else
    ip netns exec $ns tc qdisc replace dev lo root tbf rate "$rate" burst 256kb latency 100ms
  fi
  for r in $(seq 1 "$rounds"); do
    for c in off refetch feed; do
      case $c in
        off) cache="--ssp-cache 0" ;;
        refetch) cache="--ssp-cache 1000000" ;;
        feed) cache="--ssp-cache 1000000 --ssp-cache-feed true" ;;
      esac
      ip netns exec $ns "$dp" --log warn launch --servers 1 --workers 2 -- train linear $d $cache \
        --out "link-$rate-$c-$r.json" --quiet > "link-$rate-$c-$r.log" 2>&1 ||
        { echo "error: the run $rate $c round $r failed; its output: $dir/link-$rate-$c-$r.log" >&2; exit 1; }
    done
  done
done
python3 - "$target" $rates <<'PY'
import json, glob, statistics, sys
target = float(sys.argv[1])
print(f"target: test log loss <= {target}; bytes: worker 0's, sent and received")
print(f"{'link':>9} {'cache':>8} {'wall s':>7} {'to target s':>11} {'rows hit':>8} {'reads local':>11} {'staleness max':>13} {'bytes MB':>8} {'final loss':>10}")
for rate in sys.argv[2:]:
    for c in ['off', 'refetch', 'feed']:
        ms = [json.load(open(f)) for f in sorted(glob.glob(f'link-{rate}-{c}-*.json'))]
        if not ms:
            continue
        # the test loss along the run: every --eval-every minibatches when asked, else at epoch ends
        tt = [next((e['wall_s'] for e in (m.get('evals') or m['epochs']) if e['test_logloss'] <= target), float('inf')) for m in ms]
        hit = [m['ssp_cache']['hit_rate'] if m.get('ssp_cache') else 0.0 for m in ms]
        loc = [m['ssp_cache']['reads_local'] / max(m['ssp_cache']['reads'], 1) if m.get('ssp_cache') else 0.0 for m in ms]
        med = statistics.median
        print(f"{rate:>9} {c:>8} {med(m['wall_s'] for m in ms):7.2f} {med(tt):11.2f} {med(hit):8.2f} {med(loc):11.2f} "
              f"{max(m['staleness_max'] for m in ms):13d} {med(m['bytes_sent'] + m['bytes_received'] for m in ms) / 1e6:8.1f} "
              f"{med(m['test_logloss'] for m in ms):10.4f}")
PY
