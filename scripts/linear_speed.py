#!/usr/bin/env python3
"""Speed of `train linear` against Vowpal Wabbit on the same synth-ctr file (docs/benchmarks.md).

Generates (once, into $DIR, default /tmp/downpour-speed) a synth-ctr training file of
$EXAMPLES examples (default 2,000,000) x 40 features over a 2^24 key space and a 200,000-example
test set of the same hidden model, writes the VW-format copies, then, $RUNS times (default 3):
  - Vowpal Wabbit (PyPI vowpalwabbit, its command line via `python3 -m vowpalwabbit`):
    logistic loss, -b 24, one pass; then its test log loss;
  - Downpour embedded, 1 server + 1 worker and 1 server + 2 workers, each with the default
    minibatch (100 examples) and with --batch 300;
  - Downpour local multi-process (`launch`), 2 servers + 1 worker and 2 servers + 2 workers.
Prints one JSON line per run: examples/s (training examples / training wall seconds), test
log loss and AUC, and wall seconds including start-up and the test evaluation; then one
summary line per system: the median and the best examples/s over the runs and their ratios
to VW's (this VM slows single runs of either by up to 1.7x at random: VW ran 2.5 s
back to back and 4.2 s in two rounds of one run, so compare the best as well as the median).

What "training wall seconds" means for each:
  - Downpour: its epoch's wall time as the job measures it (after the cluster is up, before
    the test evaluation);
  - VW ("examples_per_s"): the wall time of its training process, which also holds Python's
    start-up, the vowpalwabbit import, the 2^24-weight table's allocation and the model's save
    (-f, for the test). So that the two measure the same thing, each round also times VW
    without -f on the whole file and on a one-example file (its fixed cost: 0.2-0.6 s on this
    project's VM) and reports "net" examples/s: the training examples over (the training
    process without the save - that fixed cost). The summary has a line for VW's net figure
    and gives every system's ratios to it ("..._ratio_to_vw_net"), the comparable ones.
VW's three runs come first in even rounds and after the Downpour runs in odd ones (on this
project's VMs the second of two back-to-back runs tends to be faster by itself; VW's timed
runs each follow another VW run either way, so this mostly moves Downpour's runs; with an
odd RUNS, VW goes first once more than last).
Needs: pip install vowpalwabbit; a release build (cargo build --release).
"""
import json, os, statistics, subprocess, sys, time
from collections import defaultdict
from evalmetrics import auc, logloss

BIN = os.environ.get("DOWNPOUR", "target/release/downpour")
D = os.environ.get("DIR", "/tmp/downpour-speed")
N = int(os.environ.get("EXAMPLES", "2000000"))
RUNS = int(os.environ.get("RUNS", "3"))
os.makedirs(D, exist_ok=True)
tr, te = f"{D}/train.svm", f"{D}/test.svm"


def run(*a):
    return subprocess.run(a, check=True, capture_output=True, text=True)


if not os.path.exists(tr):
    gen = ("data", "synth-ctr", "--nnz", "40", "--key-space", "16777216", "--zipf", "1.1", "--seed", "1")
    run(BIN, *gen, "--examples", str(N), "--out", tr)
    run(BIN, *gen, "--examples", "200000", "--start", str(N), "--out", te)
for src in (tr, te):
    if not os.path.exists(src + ".vw"):
        with open(src) as f, open(src + ".vw", "w") as g:
            for l in f:
                p = l.split()
                g.write(("1" if p[0] in ("1", "+1") else "-1") + " |f " + " ".join(p[1:]) + "\n")
y = [l.startswith("1") or l.startswith("+1") for l in open(te)]


SEEN = defaultdict(list)


def report(name, cmd):
    t = time.time()
    run(*cmd)
    wall = time.time() - t
    m = json.load(open(f"{D}/m.json"))
    ep = m["epochs"][0]  # training wall time of epoch 1, before its test evaluation
    SEEN[name].append(N / ep["wall_s"])
    print(json.dumps({"system": name, "examples_per_s": round(N / ep["wall_s"]), "test_logloss": round(m["test_logloss"], 5),
                      "test_auc": round(m["test_auc"], 5), "wall_s": round(wall, 2)}), flush=True)


JOB = ("train", "linear", "--train", tr, "--test", te, "--epochs", "1", "--lr", "0.1", "--quiet", "--out", f"{D}/m.json")

one = f"{D}/one.vw"
with open(tr + ".vw") as f, open(one, "w") as g:
    g.write(f.readline())
VW_TRAIN = (sys.executable, "-m", "vowpalwabbit", "--loss_function", "logistic", "-b", "24", "--quiet")


def vowpal_wabbit():
    t = time.time()
    run(*VW_TRAIN, "-d", one)
    fixed_s = time.time() - t
    t = time.time()
    run(*VW_TRAIN, "-d", tr + ".vw")
    net_s = max(time.time() - t - fixed_s, 1e-9)
    # the same training again, saving the model for the test: the figure as measured before
    t = time.time()
    run(*VW_TRAIN, "-d", tr + ".vw", "-f", f"{D}/vw.model")
    train_s = time.time() - t
    run(sys.executable, "-m", "vowpalwabbit", "-d", te + ".vw", "-t", "-i", f"{D}/vw.model", "--loss_function", "logistic",
        "--link", "logistic", "-p", f"{D}/vw.pred", "--quiet")
    wall = time.time() - t
    p = [float(l) for l in open(f"{D}/vw.pred")]
    SEEN["vowpal wabbit (1 pass)"].append(N / train_s)
    NET.append(N / net_s)
    print(json.dumps({"system": "vowpal wabbit (1 pass)", "examples_per_s": round(N / train_s), "net_examples_per_s": round(N / net_s),
                      "fixed_s": round(fixed_s, 3), "test_logloss": round(logloss(p, y), 5), "test_auc": round(auc(p, y), 5),
                      "wall_s": round(wall, 2)}), flush=True)


NET = []
for r in range(RUNS):
    if r % 2 == 0:
        vowpal_wabbit()
    for w in (1, 2):
        report(f"downpour embedded 1 server + {w} worker(s)", (BIN, "--log", "warn", *JOB, "--servers", "1", "--workers", str(w)))
        report(f"downpour embedded 1 server + {w} worker(s), --batch 300",
               (BIN, "--log", "warn", *JOB, "--servers", "1", "--workers", str(w), "--batch", "300"))
    for w in (1, 2):
        report(f"downpour launch 2 servers + {w} worker(s)", (BIN, "--log", "warn", "launch", "--servers", "2", "--workers", str(w), "--", *JOB))
    if r % 2 == 1:
        vowpal_wabbit()

vw = SEEN["vowpal wabbit (1 pass)"]
SEEN["vowpal wabbit (1 pass), net: no start-up, no model save"] = NET
for name, v in SEEN.items():
    med, best = statistics.median(v), max(v)
    print(json.dumps({"summary": name, "median_examples_per_s": round(med), "best_examples_per_s": round(best),
                      "median_ratio_to_vw": round(med / statistics.median(vw), 3), "best_ratio_to_vw": round(best / max(vw), 3),
                      "median_ratio_to_vw_net": round(med / statistics.median(NET), 3), "best_ratio_to_vw_net": round(best / max(NET), 3)}),
          flush=True)
