#!/usr/bin/env python3
"""Time to a target loss on the emulated cluster, measured and as the planner predicts it
(issue 29; docs/experiments.md, "Scaling on an emulated cluster").

Time to target = examples to target / examples per second. The rate is the emulated runs' own
(`scripts/scaling.sh`'s RUNS.jsonl); the examples to target, which depend on the algorithm and
on the workers' staleness but not on the machines' speed, are measured here on unconstrained
local runs (`train linear --workers W --eval-every K`, same data, same servers), one per W: the
examples trained when worker 0's test log loss first reached TARGET (its evaluation times, as
a share of the run, times the examples). The planner's prediction takes the examples to target
of W = 1 (`plan --examples-to-target`), so the gap between the two shows what staleness costs
on top of the rate.

    python3 scripts/time_to_target.py RUNS.jsonl VALIDATION.jsonl TRAIN.svm TEST.svm [MODE]

Environment: TARGET (a test log loss; default the W = 1 run's final loss × 1.02), EVAL_EVERY
(worker 0's minibatches between evaluations, 20), DOWNPOUR_BIN. Prints a table and one JSON
line per run.
"""
import json, os, subprocess, sys, tempfile

BIN = os.environ.get("DOWNPOUR_BIN", "target/release/downpour")


def examples_curve(train, test, workers, servers, every):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "m.json")
        subprocess.run([BIN, "--log", "warn", "train", "linear", "--train", train, "--test", test, "--epochs", "1", "--algorithm", "sgd",
                        "--workers", str(workers), "--servers", str(servers), "--eval-every", str(every), "--quiet", "--out", out],
                       check=True, capture_output=True)
        m = json.load(open(out))
    wall, n = m["wall_s"], m["train_examples"]
    # (evaluations as they came, the share of the run's time at each, as examples)
    return [(min(e["wall_s"] / wall, 1.0) * n, e["test_logloss"]) for e in m["evals"]], m["test_logloss"]


def main(a):
    if len(a) < 5:
        sys.exit(__doc__)
    runs_path, val_path, train, test = a[1:5]
    mode = a[5] if len(a) > 5 else "strong"
    runs = [r for r in (json.loads(l) for l in open(runs_path) if l.strip()) if r["mode"] == mode]
    val = {(v["mode"], v["workers"], v["servers"]): v for v in (json.loads(l) for l in open(val_path) if l.strip())}
    every = int(os.environ.get("EVAL_EVERY", "20"))
    curves = {r["workers"]: examples_curve(train, test, r["workers"], r["servers"], every) for r in runs}
    w1 = min(curves)
    target = float(os.environ.get("TARGET", curves[w1][1] * 1.02))
    reached = {w: next((x for x, l in c if l <= target), None) for w, (c, _) in curves.items()}
    base = reached[w1]
    if base is None:
        sys.exit(f"the W = {w1} run never reached the target {target:.4f}: give a TARGET above its final loss {curves[w1][1]:.4f}")
    print(f"target test log loss {target:.4f}; examples to target at W = {w1}: {base:.0f}")
    print("| W | examples to target | emulated examples/s | time to target, s | predicted, s | error |")
    print("|---|---|---|---|---|---|")
    for r in runs:
        w = r["workers"]
        n = reached[w]
        v = val.get((r["mode"], w, r["servers"]))
        measured = n / r["examples_per_s"] if n is not None else None
        predicted = base / v["predicted"] if v else None
        err = predicted / measured - 1 if measured and predicted else None
        fmt = lambda x, f: f.format(x) if x is not None else "–"
        print(f"| {w} | {fmt(n, '{:,.0f}')} | {r['examples_per_s']:,.0f} | {fmt(measured, '{:.2f}')} | {fmt(predicted, '{:.2f}')} | "
              f"{fmt(err * 100 if err is not None else None, '{:+.1f} %')} |")
        print(json.dumps({"mode": r["mode"], "workers": w, "servers": r["servers"], "target_logloss": target, "examples_to_target": n,
                          "time_to_target_s": measured, "predicted_s": predicted, "error": err}), file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv)
