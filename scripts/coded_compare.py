"""Coded partitioning against the uncoded split and gradient coding, same data and delays.

    python3 scripts/coded_compare.py [--rounds 3] [--workers 4] [--k 3] [--synthetic 20000:200]
        [--iterations 60] [--tail 0.2:10] [--compute-ns 2] [--loss squared] [--out DIR]

Runs `downpour train lsq` (or, with --loss logistic, the same job on the logistic loss)
on an embedded cluster of W workers, interleaved over rounds: `--coded none`, `mds:W,K`,
`gradient:frac:W-K` (when W-K+1 divides W) and `gradient:cyclic:W-K`, every run with the
same seed, so the same data and the same straggler draws (`--straggler-tail P:F`: each
iteration, each worker independently with probability P is F times slower) and the same
emulated computation time (`--compute-ns`: nanoseconds per multiply-add; a worker sleeps
the rest of it, an emulated machine per worker). The target objective is the uncoded run's
objective after half the iterations. Writes results.json and results.md (medians over
rounds: seconds per iteration, time to the target, ratio to uncoded, final objective and its
relative difference to uncoded, decoding error, results dropped).
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = REPO / "target" / "release" / "downpour"


def run(args, out):
    out.unlink(missing_ok=True)
    cmd = [str(BIN), "--log", "warn", "train", "lsq", *args, "--quiet", "--out", str(out)]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if p.returncode != 0 or not out.exists():
        sys.exit(f"failed ({p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}")
    return json.loads(out.read_text())


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--k", type=int, default=3)
    p.add_argument("--synthetic", default="20000:200")
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--tail", default="0.2:10")
    p.add_argument("--compute-ns", default="2")
    p.add_argument("--loss", default="squared", choices=["squared", "logistic"])
    p.add_argument("--seed", default="1")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/coded-compare"))
    a = p.parse_args()
    if not BIN.exists():
        sys.exit(f"{BIN} is missing: cargo build --release first")
    a.out.mkdir(parents=True, exist_ok=True)
    w, k = a.workers, a.k
    s = w - k
    codes = ["none", f"mds:{w},{k}"]
    if s > 0 and w % (s + 1) == 0:
        codes.append(f"gradient:frac:{s}")
    if s > 0:
        codes.append(f"gradient:cyclic:{s}")
    common = ["--workers", str(w), "--synthetic", a.synthetic, "--iterations", str(a.iterations), "--loss", a.loss]
    common += ["--seed", a.seed]
    # the target: the uncoded objective after half the iterations
    probe = run(common + ["--coded", "none"], a.out / "probe.json")
    common += ["--straggler-tail", a.tail, "--compute-ns", a.compute_ns]
    target = probe["trace"][max(a.iterations // 2 - 1, 0)][2]
    results = {c: [] for c in codes}
    for r in range(a.rounds):
        for c in codes:
            m = run(common + ["--coded", c, "--target", repr(target)], a.out / f"run-{r}-{c.replace(':', '_')}.json")
            m.pop("trace", None)
            results[c].append(m)
            print(f"round {r + 1} {c}: {m['s_per_iteration'] * 1e3:.2f} ms/iteration, objective {m['objective']:.10g}", flush=True)
    (a.out / "results.json").write_text(json.dumps({"args": vars(a) | {"out": str(a.out)}, "target": target, "results": results}, indent=1))
    med = lambda c, key: statistics.median(m[key] for m in results[c])
    base = med("none", "s_per_iteration")
    base_obj = med("none", "objective")
    lines = [
        f"`python3 scripts/coded_compare.py --rounds {a.rounds} --workers {w} --k {k} --synthetic {a.synthetic} "
        f"--iterations {a.iterations} --tail {a.tail} --compute-ns {a.compute_ns} --loss {a.loss}` "
        f"(medians of {a.rounds} interleaved rounds; target objective {target:.8g})",
        "",
        "| split | results needed | ms per iteration | × uncoded | time to target, s | objective | rel. diff. to uncoded | decode error | results dropped |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for c in codes:
        spi = med(c, "s_per_iteration")
        ttt = [m["time_to_target_s"] for m in results[c] if m["time_to_target_s"] is not None]
        obj = med(c, "objective")
        lines.append(
            f"| {c} | {results[c][0]['results_needed']} of {w} | {spi * 1e3:.2f} | {spi / base:.2f} | "
            f"{statistics.median(ttt) if ttt else float('nan'):.3f} | {obj:.10g} | {abs(obj - base_obj) / abs(base_obj):.1e} | "
            f"{max(m['decode_error'] for m in results[c]):.1e} | {statistics.median(sum(m['results_dropped']) for m in results[c]):.0f} |"
        )
    (a.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
