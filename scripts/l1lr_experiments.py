#!/usr/bin/env python3
"""L1 logistic regression by BPG (issue 5; docs/experiments.md): reproduces
  (a) the objective reached against liblinear's L1-regularised logistic regression
      (`liblinear-train -s 6 -c 1/lambda`, objective recomputed here from its weights);
  (b) the training traffic (worker 0's, and every worker's) with each filter switched on in turn;
  (c) time to a fixed objective and idle fraction for TAU in {0, 1, 2, 4, 8, 16}, with a plot
      (objective against wall-clock time, one line per TAU) written as SVG.
Runs `downpour launch --servers 2 --workers 2 -- train l1lr ...` on
  - the SpamAssassin features (featurized from data/spamassassin, --hash-bits 24), lambda 1;
  - a synth-ctr set (50,000 x 40, 2^20 keys), lambda 4.
Needs: apt-get install liblinear-tools; a release build. Writes into $OUT (default /tmp/l1lr-exp).
"""
import json, math, os, subprocess, sys, time

BIN = os.environ.get("DOWNPOUR", "target/release/downpour")
OUT = os.environ.get("OUT", "/tmp/l1lr-exp")
os.makedirs(OUT, exist_ok=True)


def run(*a):
    return subprocess.run(a, check=True, capture_output=True, text=True)


def l1lr(train, lam, extra=(), name="m"):
    out = f"{OUT}/{name}.json"
    run(BIN, "--log", "warn", "launch", "--servers", "2", "--workers", "2", "--", "train", "l1lr", "--algorithm", "bpg",
        "--train", train, "--lambda", str(lam), "--quiet", "--out", out, *extra)
    return json.load(open(out))


def objective(path, w, lam):
    obj = 0.0
    for line in open(path):
        p = line.split()
        y = 1.0 if p[0] in ("1", "+1") else -1.0
        m = 0.0
        for f in p[1:]:
            k, _, v = f.partition(":")
            m += w.get(int(k), 0.0) * (float(v) if v else 1.0)
        z = y * m
        obj += math.log1p(math.exp(-z)) if z > -30 else -z
    return obj + lam * sum(abs(x) for x in w.values())


def liblinear(path, lam):
    model = f"{OUT}/ll.model"
    t = time.time()
    run("liblinear-train", "-s", "6", "-c", str(1.0 / lam), "-e", "0.0001", path, model)
    secs = time.time() - t
    lines = open(model).read().split("\n")
    labels = [l for l in lines if l.startswith("label")][0].split()[1:]
    sign = 1.0 if labels[0] in ("1", "+1") else -1.0
    i = lines.index("w")
    w = {k + 1: sign * float(x) for k, x in enumerate(l for l in lines[i + 1:] if l.strip()) if float(x) != 0.0}
    return objective(path, w, lam), len(w), secs


def datasets():
    spam = f"{OUT}/spam.svm"
    if not os.path.exists(spam):
        run(BIN, "data", "featurize", "--format", "text-jsonl", "--hash-bits", "24", "--in", "data/spamassassin/train.jsonl.gz", "--out", spam)
    syn = f"{OUT}/synth.svm"
    if not os.path.exists(syn):
        # liblinear wants id:value pairs and ids from 1: featurize rewrites the generator's file
        run(BIN, "data", "synth-ctr", "--examples", "50000", "--nnz", "40", "--key-space", "1048576", "--zipf", "1.1", "--seed", "5", "--out", f"{OUT}/synth-raw.svm")
        run(BIN, "data", "featurize", "--in", f"{OUT}/synth-raw.svm", "--out", syn)
    return [("spam", spam, 1.0), ("synth-ctr", syn, 4.0)]


def svg(curves, path, title):
    """Objective against time, one line per curve; the y axis stops at the 90th percentile."""
    ys = sorted(p[1] for c in curves.values() for p in c)
    line_plot(curves, path, title, "wall-clock seconds", ys[0], ys[int(len(ys) * 0.9)], lambda v: f"{v:.1f}")


results = {}
for name, path, lam in datasets():
    r = results.setdefault(name, {"lambda": lam})
    # (a) objective against liblinear
    ll_obj, ll_nnz, ll_secs = liblinear(path, lam)
    m = l1lr(path, lam, name=f"{name}-default")
    r["liblinear"] = {"objective": ll_obj, "nnz": ll_nnz, "train_s": round(ll_secs, 2)}
    r["bpg"] = {"objective": m["objective"], "nnz": m["nnz"], "passes": len(m["passes"]), "wall_s": round(m["wall_s"], 2),
                "relative_gap": (m["objective"] - ll_obj) / ll_obj}
    print(json.dumps({"dataset": name, "liblinear": r["liblinear"], "bpg": r["bpg"]}), flush=True)
    # (b) traffic with each filter on in turn (training bytes, both directions)
    r["traffic"] = []
    for label, extra in [("none (KKT off)", ["--kkt", "off"]), ("KKT", []), ("KKT + key caching", ["--filters", "keycache"]),
                         ("KKT + LZ4", ["--filters", "lz4"]), ("KKT + key caching + Zstandard", ["--filters", "keycache,zstd"])]:
        m = l1lr(path, lam, extra, name=f"{name}-traffic")
        row = {"filters": label, "training_bytes": m["training_bytes"], "training_bytes_all_workers": m["training_bytes_all_workers"],
               "objective": m["objective"], "passes": len(m["passes"])}
        r["traffic"].append(row)
        print(json.dumps({"dataset": name, **row}), flush=True)
    # (c) bounded delay
    best = r["bpg"]["objective"]
    target = best * 1.001
    curves = {}
    r["tau"] = []
    for tau in [0, 1, 2, 4, 8, 16]:
        m = l1lr(path, lam, ["--tau", str(tau), "--filters", "keycache,lz4"], name=f"{name}-tau{tau}")
        curve = [(p["wall_s"], p["objective"]) for p in m["passes"]]
        curves[f"TAU={tau}"] = curve
        hit = next((t for t, o in curve if o <= target), None)
        row = {"tau": tau, "time_to_target_s": hit, "final_objective": m["objective"], "passes": len(m["passes"]), "idle_fraction": m["idle_fraction"],
               "idle_fraction_mean": m["idle_fraction_mean"], "wall_s": m["wall_s"]}
        r["tau"].append(row)
        print(json.dumps({"dataset": name, **row}), flush=True)
    svg(curves, f"{OUT}/{name}-tau.svg", f"{name}: objective against time, one line per TAU (target {target:.2f})")
json.dump(results, open(f"{OUT}/results.json", "w"), indent=1)
print(f"results in {OUT}/results.json and {OUT}/*-tau.svg")
