#!/usr/bin/env python3
"""`train linear` with its defaults against liblinear and Vowpal Wabbit with theirs, on the same
files and splits (issue 26; docs/experiments.md "Linear models with their defaults").

Data sets (SETS=comma list to pick; default all but a9a):
  breast-cancer  scikit-learn's bundled set: 569 examples, 30 dense features from ~0.001 to ~4,000
                 (nobody normalised them); split 70/30, stratified, seed SPLIT (default 1).
  spam           the committed SpamAssassin subset (data/spamassassin), featurized with
                 `downpour data featurize --hash-bits 24`; its train/test split.
  mnist          MNIST raw pixels 0..255, digit DIGIT (default 3) against the rest; the standard
                 split; MNIST from $MNIST (default ../shared/data/mnist, else data/mnist-sample).
  synth-ctr      `downpour data synth-ctr` (40 features a row over 2^20 keys, Zipf 1.1): $CTR
                 training examples (default 400,000: a file above 256 MiB, so the defaults
                 stream it with sgd) and 100,000 test examples of the same hidden model.
  wine, digits   scikit-learn's bundled wine (13 dense columns, class 0 against the rest) and 8x8
                 digits (64 pixels 0..16, DIGIT against the rest), split as breast-cancer: sets
                 the defaults were not tuned on.
  a9a            LIBSVM's a9a / a9a.t (adult census, 123 one-hot features) from the folder $A9A.
Learners, each with its defaults:
  downpour       what the issue's check runs: `downpour launch --servers 2 --workers 2 -- train
                 linear --train T --test E --format libsvm --out m.json`;
  liblinear      `-s 0` (L2 logistic regression, C = 1, -e 0.01, no bias), PyPI liblinear-official;
                 and `-s 0 -B 1` (an intercept, as Downpour's default `--bias`) for the objective;
  vw             logistic loss, one pass, its default -b 18 and adaptive/normalised/invariant
                 updates, PyPI vowpalwabbit (`python -m vowpalwabbit`).
Prints one JSON line per (set, learner): test AUC, test log loss, train seconds; and per set the
objective `½‖w‖² + C Σ log(1 + e^(−y wᵀx))` that `--algorithm lbfgs` and liblinear reach
with an intercept (liblinear -B 1, also at -e 0.0001, nearly the optimum), with their wall times;
(`--scale none`: the values as liblinear sees them), and the L1 objective `‖w‖₁ + C Σ log(1 + e^(−y wᵀx))` of `--algorithm owlqn` against liblinear
`-s 6 -B 1` (L=0 skips the L1 rows).
Needs: pip install scikit-learn scipy liblinear-official vowpalwabbit; a release build (DOWNPOUR
overrides the binary's path).
"""
import gzip, json, os, struct, subprocess, sys, tempfile, time

BIN = os.environ.get("DOWNPOUR", "target/release/downpour")
D = os.environ.get("DIR") or tempfile.mkdtemp()
os.makedirs(D, exist_ok=True)


def run(*a):
    r = subprocess.run(a, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"baselines.py: {' '.join(map(str, a))} failed:\n{r.stderr[-3000:]}")
    return r


def write_svm(path, rows, labels):
    with open(path, "w") as f:
        for row, t in zip(rows, labels):
            f.write(("1 " if t else "0 ") + " ".join(f"{j}:{v:.6g}" for j, v in row) + "\n")


def sklearn_split(name, X, y):
    """A bundled scikit-learn set split 70/30, stratified, seed SPLIT, zeros left out."""
    from sklearn.model_selection import train_test_split
    Xtr, Xte, ytr, yte = train_test_split(X.tolist(), [bool(t) for t in y], test_size=0.3, random_state=int(os.environ.get("SPLIT", "1")), stratify=y)
    tr, te = f"{D}/{name}-train.svm", f"{D}/{name}-test.svm"
    write_svm(tr, [[(j + 1, v) for j, v in enumerate(r) if v != 0] for r in Xtr], ytr)
    write_svm(te, [[(j + 1, v) for j, v in enumerate(r) if v != 0] for r in Xte], yte)
    return tr, te


def breast_cancer():
    from sklearn.datasets import load_breast_cancer
    return sklearn_split("bc", *load_breast_cancer(return_X_y=True))


def wine():
    from sklearn.datasets import load_wine
    X, y = load_wine(return_X_y=True)
    return sklearn_split("wine", X, y == 0)


def digits():
    from sklearn.datasets import load_digits
    X, y = load_digits(return_X_y=True)
    return sklearn_split("digits", X, y == int(os.environ.get("DIGIT", "3")))


def a9a():
    src = os.environ.get("A9A")
    if not src:
        sys.exit("baselines.py: set A9A to a folder holding LIBSVM's a9a and a9a.t (www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/binary.html)")
    return f"{src}/a9a", f"{src}/a9a.t"


def spam():
    tr, te = f"{D}/spam-train.svm", f"{D}/spam-test.svm"
    for src, dst in (("data/spamassassin/train.jsonl.gz", tr), ("data/spamassassin/test.jsonl.gz", te)):
        if not os.path.exists(dst):
            run(BIN, "data", "featurize", "--format", "text-jsonl", "--hash-bits", "24", "--in", src, "--out", dst)
    return tr, te


def mnist():
    src = os.environ.get("MNIST") or ("../shared/data/mnist" if os.path.isdir("../shared/data/mnist") else "data/mnist-sample")
    digit = int(os.environ.get("DIGIT", "3"))
    out = []
    for split, prefix in (("train", "train"), ("test", "t10k")):
        img = gzip.open(f"{src}/{prefix}-images-idx3-ubyte.gz").read()
        lab = gzip.open(f"{src}/{prefix}-labels-idx1-ubyte.gz").read()[8:]
        n, r, c = struct.unpack(">III", img[4:16])
        px, sz = img[16:], r * c
        path = f"{D}/mnist{digit}-{split}.svm"
        write_svm(path, [[(j + 1, v) for j, v in enumerate(px[i * sz:(i + 1) * sz]) if v] for i in range(n)], [lab[i] == digit for i in range(n)])
        out.append(path)
    return tuple(out)


def synth_ctr():
    n = int(os.environ.get("CTR", "400000"))
    tr, te = f"{D}/ctr{n}-train.svm", f"{D}/ctr{n}-test.svm"
    gen = ("data", "synth-ctr", "--nnz", "40", "--key-space", str(1 << 20), "--zipf", "1.1", "--seed", "7")
    if not os.path.exists(tr):
        # synth-ctr writes binary features as bare 0-based ids: standard `id:1` with 1-based
        # ids for every learner
        for dst, extra in ((tr, ("--examples", str(n))), (te, ("--examples", "100000", "--start", str(n)))):
            run(BIN, *gen, *extra, "--out", dst + ".raw")
            with open(dst + ".raw") as f, open(dst, "w") as g:
                for l in f:
                    p = l.split()
                    g.write(p[0] + "".join(f" {int(k) + 1}:1" for k in p[1:]) + "\n")
            os.remove(dst + ".raw")
    return tr, te


SETS = {"breast-cancer": breast_cancer, "spam": spam, "mnist": mnist, "synth-ctr": synth_ctr, "wine": wine, "digits": digits, "a9a": a9a}
# what runs without SETS (a9a needs its files)
DEFAULT_SETS = "breast-cancer,spam,mnist,synth-ctr,wine,digits"


def downpour(tr, te, *extra):
    out = f"{D}/m.json"
    t = time.time()
    run(BIN, "--log", "warn", "launch", "--servers", "2", "--workers", "2", "--", "train", "linear", "--train", tr, "--test", te,
        "--format", "libsvm", "--quiet", "--out", out, *extra)
    secs = time.time() - t
    return json.load(open(out)), secs


def objective(w, b, X, y, c=1.0, l1=False):
    import numpy as np
    z = X @ w + b
    s = np.where(y, 1.0, -1.0)
    reg = float(np.abs(w).sum()) + abs(b) if l1 else 0.5 * (float(w @ w) + b * b)
    return reg + c * float(np.logaddexp(0, -s * z).sum())


def run_liblinear(tr, te, eps="0.01", bias=False, solver="0"):
    import numpy as np
    from sklearn.datasets import load_svmlight_file
    from liblinear.liblinearutil import train
    from evalmetrics import auc, logloss
    Xtr, ytr = load_svmlight_file(tr, zero_based=False)
    Xte, yte = load_svmlight_file(te, zero_based=False, n_features=Xtr.shape[1])
    ytr, yte = ytr > 0, yte > 0
    t = time.time()
    m = train(np.where(ytr, 1, -1), Xtr, f"-s {solver} -c 1 -e {eps} -q" + (" -B 1" if bias else ""))
    secs = time.time() - t
    w, b = m.get_decfun()
    sign = 1 if m.get_labels()[0] == 1 else -1
    w, b = np.array(w[:Xtr.shape[1]]) * sign, (b * sign if bias else 0.0)
    p = 1 / (1 + np.exp(-(Xte @ w + b)))
    return {"test_auc": auc(list(p), list(yte)), "test_logloss": logloss(list(p), list(yte)), "objective": objective(w, b, Xtr, ytr, l1=solver == "6"),
            "nonzero_weights": int((w != 0).sum() + (b != 0))}, secs


def run_vw(tr, te):
    from evalmetrics import auc, logloss
    for src in (tr, te):
        with open(src) as f, open(src + ".vw", "w") as g:
            for l in f:
                p = l.split()
                g.write(("1" if p[0] in ("1", "+1") else "-1") + " |f " + " ".join(p[1:]) + "\n")
    t = time.time()
    run(sys.executable, "-m", "vowpalwabbit", "-d", tr + ".vw", "--loss_function", "logistic", "-f", f"{D}/vw.model", "--quiet")
    secs = time.time() - t
    run(sys.executable, "-m", "vowpalwabbit", "-d", te + ".vw", "-t", "-i", f"{D}/vw.model", "--link", "logistic", "-p", f"{D}/vw.pred", "--quiet")
    p = [float(l.split()[0]) for l in open(f"{D}/vw.pred")]
    y = [l.startswith("1") for l in open(te + ".vw")]
    return {"test_auc": auc(p, y), "test_logloss": logloss(p, y)}, secs


def main():
    try:
        import sklearn, scipy, liblinear.liblinearutil, vowpalwabbit  # noqa: F401 (checked here, used below)
    except ImportError as e:
        sys.exit(f"baselines.py: {e}: pip install scikit-learn scipy liblinear-official vowpalwabbit")
    if not os.path.exists(BIN):
        sys.exit(f"baselines.py: no {BIN}: cargo build --release (or set DOWNPOUR)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    names = os.environ.get("SETS", DEFAULT_SETS).split(",")
    for name in names:
        if name not in SETS:
            sys.exit(f"baselines.py: unknown set {name!r} (sets: {', '.join(SETS)})")
        tr, te = SETS[name]()
        line = lambda learner, m, secs, **kw: print(json.dumps({"set": name, "learner": learner, "test_auc": round(m["test_auc"], 5),
                                                                "test_logloss": round(m["test_logloss"], 5), "train_s": round(secs, 2), **kw}), flush=True)
        m, secs = downpour(tr, te)
        line("downpour defaults", m, secs, algorithm=m.get("algorithm", "sgd"), objective=m.get("objective"))
        ll, secs = run_liblinear(tr, te)
        line("liblinear -s 0", ll, secs, objective=round(ll["objective"], 6))
        v, secs = run_vw(tr, te)
        line("vw defaults", v, secs)
        # the same objective (intercept as a regularised constant feature, the values as they
        # are) by both solvers
        m, secs = downpour(tr, te, "--algorithm", "lbfgs", "--scale", "none")
        line("downpour --algorithm lbfgs --scale none", m, secs, objective=m.get("objective"))
        for eps in ("0.01", "0.0001"):
            b, secs = run_liblinear(tr, te, eps, bias=True)
            line(f"liblinear -s 0 -B 1 -e {eps}", b, secs, objective=round(b["objective"], 6))
        # L1: OWL-QN against liblinear -s 6, the same objective
        if os.environ.get("L1", "1") == "1":
            m, secs = downpour(tr, te, "--algorithm", "owlqn", "--scale", "none")
            line("downpour --algorithm owlqn --scale none", m, secs, objective=m.get("objective"), nonzero_weights=m.get("nonzero_weights"),
                 iterations=m.get("iterations"), converged=m.get("converged"))
            for eps in ("0.01", "0.0001"):
                b, secs = run_liblinear(tr, te, eps, bias=True, solver="6")
                line(f"liblinear -s 6 -B 1 -e {eps}", b, secs, objective=round(b["objective"], 6), nonzero_weights=b["nonzero_weights"])


if __name__ == "__main__":
    main()
