#!/usr/bin/env python3
"""Quality baselines on exactly the features Downpour trains on (docs/benchmarks.md).

Featurizes the committed SpamAssassin subset with `downpour data featurize` (text-jsonl,
--hash-bits 24), then trains and evaluates on the same split:
  - Downpour `train linear` (FTRL, embedded 2 servers + 2 workers) on the LIBSVM files;
  - liblinear (Debian liblinear-tools) L2-regularised logistic regression, C in {1, 10, 100};
  - Vowpal Wabbit (PyPI vowpalwabbit) logistic loss, -b 24, several passes.
Prints one JSON line per system: test AUC, test logloss, train seconds.
Needs: apt-get install liblinear-tools; pip install vowpalwabbit.
"""
import json, os, subprocess, sys, tempfile, time
from evalmetrics import auc, logloss

BIN = os.environ.get("DOWNPOUR", "target/release/downpour")
D = tempfile.mkdtemp()


def run(*a, **kw):
    return subprocess.run(a, check=True, capture_output=True, text=True, **kw)


def labels(path):
    return [l.startswith("+1") for l in open(path)]


def report(name, p, y, secs, **extra):
    print(json.dumps({"system": name, "test_auc": round(auc(p, y), 5), "test_logloss": round(logloss(p, y), 5), "train_s": round(secs, 2), **extra}))


tr, te = f"{D}/tr.svm", f"{D}/te.svm"
for src, dst in (("data/spamassassin/train.jsonl.gz", tr), ("data/spamassassin/test.jsonl.gz", te)):
    run(BIN, "data", "featurize", "--format", "text-jsonl", "--hash-bits", "24", "--in", src, "--out", dst)
y = labels(te)

# Downpour: the demo's settings, then the tuned ones (per-example FTRL steps, α = 8).
for batch, lr, epochs in ((10, 4, 10), (1, 8, 20)):
    t = time.time()
    run(BIN, "--log", "warn", "train", "linear", "--train", tr, "--test", te, "--epochs", str(epochs), "--lr", str(lr), "--batch", str(batch),
        "--quiet", "--out", f"{D}/m.json", "--model-out", f"{D}/w.safetensors")
    secs = time.time() - t
    run(BIN, "predict", "--model", f"{D}/w.safetensors", "--data", te, "--out", f"{D}/dp.pred")
    report(f"downpour ftrl batch {batch} lr {lr} (2 servers, 2 workers, embedded)", [float(l) for l in open(f"{D}/dp.pred")], y, secs, epochs=epochs)

for c in ("1", "10", "100"):
    t = time.time()
    run("liblinear-train", "-q", "-s", "0", "-c", c, tr, f"{D}/ll.model")
    secs = time.time() - t
    run("liblinear-predict", "-b", "1", te, f"{D}/ll.model", f"{D}/ll.pred")
    lines = open(f"{D}/ll.pred").read().split("\n")
    order = lines[0].split()[1:]
    pos_col = order.index("1")
    p = [float(l.split()[1 + pos_col]) for l in lines[1:] if l.strip()]
    report(f"liblinear L2-LR C={c}", p, y, secs)

from vowpalwabbit import Workspace


def to_vw(line):
    parts = line.split()
    return ("1" if parts[0] == "+1" else "-1") + " |f " + " ".join(parts[1:])


train_lines = [to_vw(l) for l in open(tr)]
test_lines = [to_vw(l) for l in open(te)]
for passes in (1, 5, 10):
    t = time.time()
    vw = Workspace("--loss_function logistic --link logistic -b 24 --quiet")
    for _ in range(passes):
        for l in train_lines:
            vw.learn(l)
    secs = time.time() - t
    p = [vw.predict(l) for l in test_lines]
    vw.finish()
    report(f"vowpal wabbit logistic, {passes} pass(es)", p, y, secs)
