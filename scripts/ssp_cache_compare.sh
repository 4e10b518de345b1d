#!/bin/bash
# The ssp read cache, same run: train linear --consistency ssp:4 without --ssp-cache, with it
# kept fresh by refetching only (the default) and with the servers' update feeds too
# (--ssp-cache-feed true), on a text job and a tabular job, ROUNDS interleaved rounds
# (docs/experiments.md).
#
#   bash scripts/ssp_cache_compare.sh [DIR] [ROUNDS]
#
# DIR (default out/ssp-cache) gets the data: the SpamAssassin messages featurized and split
# 4,873 / 1,173 at random (from ../shared/data, or data/spamassassin when that is missing),
# and 40,000 + 5,000 examples of 30 dense features. Prints the medians per configuration.
# ROUNDS 0: only the data (as scripts/ssp_cache_link.sh uses it).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dp="$repo/target/release/downpour"
dir=${1:-out/ssp-cache}
rounds=${2:-5}
mkdir -p "$dir"
cd "$dir"
if [ ! -f sp_train.svm ]; then
  src="$repo/../shared/data/spamassassin/spamassassin.jsonl.gz"
  [ -f "$src" ] || src="$repo/data/spamassassin/train.jsonl.gz"
  "$dp" data featurize --format text-jsonl --hash-bits 24 --in "$src" --out sp > /dev/null
  python3 - <<'PY'
import random
l = open('sp').read().splitlines(); random.Random(1).shuffle(l)
n = len(l) * 4873 // 6046
open('sp_train.svm', 'w').write('\n'.join(l[:n]) + '\n'); open('sp_test.svm', 'w').write('\n'.join(l[n:]) + '\n')
PY
fi
if [ ! -f tab_train.svm ]; then
  python3 - <<'PY'
import random
r = random.Random(3)
w = [r.gauss(0, 1) for _ in range(30)]
def ex():
    x = [r.gauss(0, 1) for _ in range(30)]
    z = sum(a * b for a, b in zip(w, x)) + r.gauss(0, 1)
    return ('+1' if z > 0 else '-1') + ' ' + ' '.join(f'{i+1}:{v:.3f}' for i, v in enumerate(x))
open('tab_train.svm', 'w').write('\n'.join(ex() for _ in range(40000)) + '\n')
open('tab_test.svm', 'w').write('\n'.join(ex() for _ in range(5000)) + '\n')
PY
fi
[ "$rounds" -gt 0 ] || exit 0
for r in $(seq 1 "$rounds"); do
  for job in spam tab; do
    for c in 0 1000000 feed; do
      if [ $job = spam ]; then d="--train sp_train.svm --test sp_test.svm --epochs 5 --batch 20 --optimizer sgd --normalize false"
      else d="--train tab_train.svm --test tab_test.svm --epochs 3 --batch 20 --optimizer sgd --normalize false --lr 0.05"; fi
      if [ $c = feed ]; then cache="--ssp-cache 1000000 --ssp-cache-feed true"; else cache="--ssp-cache $c"; fi
      # the CPU of the whole run (workers, server, coordinator: one process), user + system
      TIMEFORMAT='%U %S'
      { time "$dp" --log warn train linear $d --workers 2 --consistency ssp:4 $cache --out cache-$job-$c-$r.json --quiet > /dev/null 2>&1; } 2> cache-$job-$c-$r.cpu
    done
  done
done
python3 - <<'PY'
import json, glob, statistics
for job in ['spam', 'tab']:
    for c in ['0', '1000000', 'feed']:
        ms = [json.load(open(f)) for f in sorted(glob.glob(f'cache-{job}-{c}-*.json'))]
        for m, f in zip(ms, sorted(glob.glob(f'cache-{job}-{c}-*.cpu'))):
            m['cpu_s'] = sum(map(float, open(f).read().split()))
        med = lambda f: statistics.median(f(m) for m in ms)
        on = ms[0]['ssp_cache'] is not None
        print(job, ('cache, feed' if ms[0]['ssp_cache']['feed'] else 'cache, refetch only') if on else 'no cache', f"wall {med(lambda m: m['wall_s']):.3f}s", f"logloss {med(lambda m: m['test_logloss']):.4f}",
              f"auc {med(lambda m: m['test_auc']):.4f}", f"rows hit {med(lambda m: m['ssp_cache']['hit_rate']):.3f}" if on else '',
              f"reads local {med(lambda m: m['ssp_cache']['reads_local'] / m['ssp_cache']['reads']):.3f}" if on else '',
              f"staleness max {max(m['staleness_max'] for m in ms)} mean {med(lambda m: m['staleness_mean']):.2f}",
              f"CPU {med(lambda m: m['cpu_s']):.2f}s",
              f"bytes {med(lambda m: m['bytes_sent'] + m['bytes_received']):.0f}")
PY
