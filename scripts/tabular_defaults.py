#!/usr/bin/env python3
"""`train linear` with its default flags on raw tabular data against liblinear and Vowpal Wabbit
with theirs (issue 26; docs/experiments.md "Linear defaults on raw tabular data").

Data: scikit-learn's bundled breast-cancer set (569 examples, 30 dense features from ~0.001 to
~4,000: nobody normalised them), split 70/30 (stratified; SPLIT=S picks the split's seed, default 1), written as LIBSVM.
Runs what the issue's check runs, `downpour launch --servers 2 --workers 2 -- train linear
--train T --test E --format libsvm`, with the defaults, `--scale per-feature` (also with more
passes) and `--scale none`; liblinear L2-LR
with its defaults (`-s 0 -c 1`, PyPI liblinear-official); VW logistic with its defaults (one
pass, adaptive/normalised/invariant updates, PyPI vowpalwabbit). Prints one JSON line per
learner: test AUC and log loss. Needs: pip install scikit-learn liblinear-official vowpalwabbit;
a release build (DOWNPOUR overrides the binary's path).
"""
import json, math, os, subprocess, sys, tempfile
from evalmetrics import auc, logloss

BIN = os.environ.get("DOWNPOUR", "target/release/downpour")
D = tempfile.mkdtemp()


def write_svm(path, X, y):
    with open(path, "w") as f:
        for row, t in zip(X, y):
            f.write(("1 " if t else "0 ") + " ".join(f"{j + 1}:{v:.6g}" for j, v in enumerate(row) if v != 0) + "\n")


def downpour(tr, te, *extra):
    out = f"{D}/m.json"
    subprocess.run([BIN, "--log", "warn", "launch", "--servers", "2", "--workers", "2", "--", "train", "linear", "--train", tr,
                    "--test", te, "--format", "libsvm", "--quiet", "--out", out, *extra], check=True, capture_output=True, text=True)
    m = json.load(open(out))
    return m["test_auc"], m["test_logloss"]


def liblinear(Xtr, ytr, Xte, yte):
    from liblinear.liblinearutil import train, predict
    m = train([1 if t else -1 for t in ytr], [dict(enumerate(r, 1)) for r in Xtr], "-s 0 -c 1 -q")
    _, _, probs = predict([1 if t else -1 for t in yte], [dict(enumerate(r, 1)) for r in Xte], m, "-b 1 -q")
    col = m.get_labels().index(1)
    p = [pr[col] for pr in probs]
    return auc(p, yte), logloss(p, yte)


def vw(Xtr, ytr, Xte, yte):
    from vowpalwabbit import Workspace
    w = Workspace("--loss_function logistic --link logistic --quiet")
    line = lambda r, t: ("1" if t else "-1") + " | " + " ".join(f"f{j}:{v:.6g}" for j, v in enumerate(r) if v != 0)
    for r, t in zip(Xtr, ytr):
        w.learn(line(r, t))
    p = [w.predict(line(r, t).split(" ", 1)[1]) for r, t in zip(Xte, yte)]
    w.finish()
    return auc(p, yte), logloss(p, yte)


def main():
    try:
        from sklearn.datasets import load_breast_cancer
        from sklearn.model_selection import train_test_split
        import liblinear.liblinearutil as _ll, vowpalwabbit as _vw  # noqa: F401 (checked here, used below)
    except ImportError as e:
        sys.exit(f"tabular_defaults.py: {e}: pip install scikit-learn liblinear-official vowpalwabbit")
    if not os.path.exists(BIN):
        sys.exit(f"tabular_defaults.py: no {BIN}: cargo build --release (or set DOWNPOUR)")
    X, y = load_breast_cancer(return_X_y=True)
    y = [bool(t) for t in y]
    split = int(os.environ.get("SPLIT", "1"))
    Xtr, Xte, ytr, yte = train_test_split(X.tolist(), y, test_size=0.3, random_state=split, stratify=y)
    tr, te = f"{D}/bc-train.svm", f"{D}/bc-test.svm"
    write_svm(tr, Xtr, ytr)
    write_svm(te, Xte, yte)
    rows = [("downpour defaults", *downpour(tr, te)), ("downpour --scale per-feature", *downpour(tr, te, "--scale", "per-feature")),
            ("downpour --scale per-feature --epochs 50 --batch 10", *downpour(tr, te, "--scale", "per-feature", "--epochs", "50", "--batch", "10")),
            ("downpour --scale none", *downpour(tr, te, "--scale", "none")),
            ("liblinear -s 0 -c 1", *liblinear(Xtr, ytr, Xte, yte)), ("vw logistic, defaults", *vw(Xtr, ytr, Xte, yte))]
    for name, a, l in rows:
        print(json.dumps({"data": "breast-cancer", "split": split, "learner": name, "test_auc": round(a, 5), "test_logloss": round(l, 5)}), flush=True)


if __name__ == "__main__":
    main()
