#!/usr/bin/env python3
"""Single-process reference for biased matrix factorisation on MovieLens 100k.

`downpour train mf` is compared against this.  Two modes:

split: a fixed 90/10 split.  The rating lines are permuted with
numpy.random.default_rng(seed); test is the first 10% of the permutation.
Both outputs keep the input's header line and its lines verbatim.

    python3 scripts/mf_reference.py split \
        --in ../shared/data/movielens-100k/ml-100k.inter \
        --train-out /tmp/mf/ml100k-train.inter \
        --test-out /tmp/mf/ml100k-test.inter [--test-fraction 0.1 --seed 1]

reference: biased MF, r^ = mu + b_u + b_i + p_u.q_i, trained by plain SGD
as scikit-surprise's SVD does it: for each rating, err = r - r^;
b_u += lr (err - reg b_u); b_i += lr (err - reg b_i); p_u and q_i updated
simultaneously, p_u += lr (err q_i - reg p_u), q_i += lr (err p_u - reg q_i).
Factors ~ N(0, init_std) drawn as Surprise does (np.random.RandomState(seed),
P then Q), biases 0, mu = training mean, float64.  Order:
`--order surprise` (default) visits ratings as Surprise's
trainset.all_ratings() does, grouped by user (users in order of first
appearance, each user's ratings in file order), the same every epoch, no
shuffle; `--order shuffle` reshuffles all ratings each epoch.  Test
predictions are clipped to [1, 5]; an unknown user or item gets mu plus
the biases that are known (no dot product), as in Surprise.  Prints one
JSON line per epoch and a final {"learner": "numpy-svd", ...} line.  With
the defaults and --order surprise it reproduces surprise.SVD(random_state=
seed) to the printed digits (seed 1: test RMSE 0.936504 on both).

    python3 scripts/mf_reference.py reference \
        --train /tmp/mf/ml100k-train.inter --test /tmp/mf/ml100k-test.inter \
        [--factors 100 --epochs 20 --lr 0.005 --reg 0.02 --init-std 0.1 \
         --seed 1 --order surprise]

If scikit-surprise imports, `reference` also fits surprise.SVD() with its
defaults (random_state=seed) on the same files and prints a
{"learner": "surprise-svd", ...} line; otherwise that line says skipped.

Install: pip install numpy scikit-surprise pandas (scikit-surprise 1.1.5
and pandas are needed only for the surprise-svd line).  The SGD loop is
plain Python with NumPy vector ops per rating: about 2 s an epoch.
"""
import argparse
import json
import os
import time

import numpy as np


def read_inter(path):
    with open(path) as f:
        header = f.readline()
        lines = [ln for ln in f if ln.strip()]
    return header, lines


def cmd_split(a):
    header, lines = read_inter(a.inp)
    perm = np.random.default_rng(a.seed).permutation(len(lines))
    n_test = int(round(a.test_fraction * len(lines)))
    parts = ((a.test_out, perm[:n_test]), (a.train_out, perm[n_test:]))
    for path, idx in parts:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "w") as f:
            f.write(header)
            f.writelines(lines[k] for k in idx)
    print(json.dumps({"train": len(lines) - n_test, "test": n_test}))


def triples(path):
    _, lines = read_inter(path)
    rows = [ln.rstrip("\n").split("\t") for ln in lines]
    return [(r[0], r[1], float(r[2])) for r in rows]


def sgd_epoch(us, its, rs, order, mu, bu, bi, P, Q, lr, reg):
    for k in order.tolist():
        u, i = us[k], its[k]
        pu, qi = P[u].copy(), Q[i].copy()
        err = rs[k] - (mu + bu[u] + bi[i] + np.sum(pu * qi))
        bu[u] += lr * (err - reg * bu[u])
        bi[i] += lr * (err - reg * bi[i])
        P[u] += lr * (err * qi - reg * pu)
        Q[i] += lr * (err * pu - reg * qi)


def cmd_reference(a):
    train, test = triples(a.train), triples(a.test)
    uid, iid = {}, {}  # raw id -> inner id, in order of first appearance
    us = np.array([uid.setdefault(u, len(uid)) for u, _, _ in train])
    its = np.array([iid.setdefault(i, len(iid)) for _, i, _ in train])
    rs = np.array([r for _, _, r in train])
    mu = rs.mean()
    rng = np.random.RandomState(a.seed)  # as Surprise's SVD draws them
    P = rng.normal(0.0, a.init_std, (len(uid), a.factors))
    Q = rng.normal(0.0, a.init_std, (len(iid), a.factors))
    bu, bi = np.zeros(len(uid)), np.zeros(len(iid))
    order = np.argsort(us, kind="stable")  # Surprise's all_ratings() order
    test_r = np.array([r for _, _, r in test])

    def test_rmse():
        pred = np.full(len(test), mu)
        for k, (u, i, _) in enumerate(test):
            ku, ki = uid.get(u), iid.get(i)
            pred[k] += (bu[ku] if ku is not None else 0.0) + (
                bi[ki] if ki is not None else 0.0)
            if ku is not None and ki is not None:
                pred[k] += P[ku] @ Q[ki]
        err = np.clip(pred, 1.0, 5.0) - test_r
        return float(np.sqrt(np.mean(err * err)))

    total = 0.0
    for epoch in range(1, a.epochs + 1):
        if a.order == "shuffle":
            order = rng.permutation(len(rs))
        t0 = time.perf_counter()
        sgd_epoch(us, its, rs, order, mu, bu, bi, P, Q, a.lr, a.reg)
        dt = time.perf_counter() - t0
        total += dt
        rmse = test_rmse()
        print(json.dumps({"epoch": epoch, "test_rmse": round(rmse, 6),
                          "train_s": round(dt, 3)}), flush=True)
    print(json.dumps({
        "learner": "numpy-svd", "test_rmse": round(rmse, 6),
        "train_s": round(total, 3), "order": a.order,
        "factors": a.factors, "epochs": a.epochs,
        "lr": a.lr, "reg": a.reg, "init_std": a.init_std, "seed": a.seed,
        "n_train": len(train), "n_test": len(test)}), flush=True)
    run_surprise(train, test, a.seed)


def run_surprise(train, test, seed):
    try:
        import pandas as pd
        from surprise import SVD, Dataset, Reader, accuracy
    except ImportError as e:
        print(json.dumps({"learner": "surprise-svd", "skipped": str(e)}))
        return
    df = pd.DataFrame(train, columns=["user", "item", "rating"])
    data = Dataset.load_from_df(df, Reader(rating_scale=(1, 5)))
    trainset = data.build_full_trainset()
    algo = SVD(random_state=seed)
    t0 = time.perf_counter()
    algo.fit(trainset)
    dt = time.perf_counter() - t0
    rmse = accuracy.rmse(algo.test(test), verbose=False)
    print(json.dumps({"learner": "surprise-svd", "test_rmse": round(rmse, 6),
                      "train_s": round(dt, 3)}), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="mode", required=True)
    s = sub.add_parser("split")
    s.add_argument("--in", dest="inp", required=True)
    s.add_argument("--train-out", required=True)
    s.add_argument("--test-out", required=True)
    s.add_argument("--test-fraction", type=float, default=0.1)
    s.add_argument("--seed", type=int, default=1)
    r = sub.add_parser("reference")
    r.add_argument("--train", required=True)
    r.add_argument("--test", required=True)
    r.add_argument("--factors", type=int, default=100)
    r.add_argument("--epochs", type=int, default=20)
    r.add_argument("--lr", type=float, default=0.005)
    r.add_argument("--reg", type=float, default=0.02)
    r.add_argument("--init-std", type=float, default=0.1)
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--order", choices=["surprise", "shuffle"],
                   default="surprise")
    a = p.parse_args()
    cmd_split(a) if a.mode == "split" else cmd_reference(a)


if __name__ == "__main__":
    main()
