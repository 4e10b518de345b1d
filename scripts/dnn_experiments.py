#!/usr/bin/env python3
"""Neural networks on MNIST (issue 7; docs/experiments.md):
  (a) strong scaling: time to test accuracy for downpour, sync, model-avg and lbfgs with 1, 2
      and 4 workers (2 servers), the MLP (784-256-128-10), every run under `downpour launch`;
      one plot per worker count (test accuracy against training wall-clock seconds);
  (b) stragglers: sync with 4 workers, worker 3 four times slower: plain, 1 backup worker,
      gradient coding frac:1 and cyclic:1;
  (c) bytes per gradient computation, from the same runs.
Needs a release build and the MNIST files (default ../shared/data/mnist). Writes into $OUT
(default /tmp/dnn-exp): results.json, results.md, accuracy-w{1,2,4}.svg.
"""
import json, os, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from svgplot import line_plot  # noqa: E402

BIN = os.environ.get("DOWNPOUR", "target/release/downpour")
DATA = os.environ.get("DATA", "../shared/data/mnist")
OUT = os.environ.get("OUT", "/tmp/dnn-exp")
EPOCHS = int(os.environ.get("EPOCHS", "10"))
LBFGS_ITERS = int(os.environ.get("LBFGS_ITERS", "60"))
os.makedirs(OUT, exist_ok=True)


def train(name, workers, extra):
    out = f"{OUT}/{name}.json"
    cmd = [BIN, "--log", "warn", "launch", "--servers", "2", "--workers", str(workers), "--",
           "train", "dnn", "--data", DATA, "--model", "mlp", "--quiet", "--out", out, *extra]
    print(" ".join(cmd), file=sys.stderr, flush=True)
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    m = json.load(open(out))
    m["name"] = name
    m["command"] = " ".join(["downpour"] + cmd[1:])
    return m


def time_to(m, target):
    for e in m["epochs"]:
        if e["test_accuracy"] >= target:
            return e["wall_s"]
    return None


def svg(curves, path, title):
    """Test accuracy (90 % to 99 %) against time, one line per algorithm, each from (0, 90 %)."""
    lo, hi = 0.90, 0.99
    curves = {k: [(0, lo)] + c for k, c in curves.items()}
    line_plot(curves, path, title, "training wall-clock seconds", lo, hi, lambda v: f"{v:.0%}", legend="bottom")


def main():
    results = {"scaling": [], "stragglers": []}
    for w in (1, 2, 4):
        curves = {}
        for alg in ("downpour", "sync", "model-avg", "lbfgs"):
            extra = ["--algorithm", alg, "--epochs", str(LBFGS_ITERS if alg == "lbfgs" else EPOCHS)]
            if alg == "lbfgs":
                extra += ["--piece", "1000"]
            m = train(f"{alg}-w{w}", w, extra)
            results["scaling"].append(m)
            curves[alg] = [(e["wall_s"], e["test_accuracy"]) for e in m["epochs"]]
        svg(curves, f"{OUT}/accuracy-w{w}.svg", f"MNIST MLP, {w} worker(s), 2 servers: test accuracy against time")
    for name, extra in [("plain", []), ("backup-1", ["--backup-workers", "1"]),
                        ("frac-1", ["--gradient-coding", "frac:1"]), ("cyclic-1", ["--gradient-coding", "cyclic:1"])]:
        m = train(f"straggler-{name}", 4, ["--algorithm", "sync", "--epochs", "2", "--straggler", "3:4", *extra])
        results["stragglers"].append(m)
    json.dump(results, open(f"{OUT}/results.json", "w"), indent=1)
    rows = ["| algorithm | workers | test accuracy | s to 97% | s to 98% | wall s | examples/s | MB per gradient |",
            "|---|---|---|---|---|---|---|---|"]
    for m in results["scaling"]:
        f = lambda v: "–" if v is None else f"{v:.1f}"
        rows.append(f"| {m['algorithm']} | {m['workers']} | {m['test_accuracy']*100:.2f}% | {f(time_to(m, 0.97))} | {f(time_to(m, 0.98))} | "
                    f"{m['wall_s']:.1f} | {m['examples_per_s']:.0f} | {m['bytes_per_step']/1e6:.2f} |")
    rows += ["", "| sync, 4 workers, worker 3 ×4 slower | test accuracy after 2 epochs | wall s | examples/s | gradients computed |",
             "|---|---|---|---|---|"]
    for m in results["stragglers"]:
        rows.append(f"| {m['name'][len('straggler-'):]} | {m['test_accuracy']*100:.2f}% | {m['wall_s']:.1f} | {m['examples_per_s']:.0f} | {m['gradient_computations']} |")
    open(f"{OUT}/results.md", "w").write("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
