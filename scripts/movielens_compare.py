"""The MovieLens example on Downpour against plain PyTorch, over seeds (docs/experiments.md).

    python3 scripts/movielens_compare.py [--seeds 1,2,3] [--out DIR] [-- EXAMPLE ARGS]

For every seed, interleaved: `examples/movielens_dlrm.py --reference` (one plain PyTorch
process), then through `python -m downpour.launch --servers 2`: 1 worker, 2 workers, and 2
workers with `--replication 2` and server 1 SIGKILLed at `--kill-at` seconds. Writes
results.json (every run's result line) and results.md (a table: test AUC and RMSE per seed,
their mean, the difference to the reference, examples/s and where a worker's time goes).
"""

import argparse
import json
import pathlib
import statistics
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "movielens_dlrm.py"


def run(cmd, out_file):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO, timeout=1200)
    if p.returncode != 0 or not out_file.exists():
        sys.exit(f"failed ({p.returncode}): {' '.join(map(str, cmd))}\n{p.stdout[-3000:]}")
    killed = "killed server 1" in p.stdout
    return json.loads(out_file.read_text()), killed


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--kill-at", default="5s")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("out/movielens-compare"))
    p.add_argument("example_args", nargs="*", help="arguments for the example (after --)")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    configs = {
        "plain PyTorch (1 process)": [],
        "Downpour, 1 worker": ["--servers", "2", "--workers", "1"],
        "Downpour, 2 workers": ["--servers", "2", "--workers", "2"],
        "Downpour, 2 workers, server killed": ["--servers", "2", "--workers", "2", "--replication", "2", "--fault", f"kill server:1 at {a.kill_at}"],
    }
    results = []
    for seed in [int(x) for x in a.seeds.split(",")]:
        for name, launch in configs.items():
            f = a.out / f"run-{seed}-{len(results)}.json"
            f.unlink(missing_ok=True)
            args = [str(EXAMPLE), "--seed", str(seed), "--out", str(f), *a.example_args]
            if launch:
                cmd = [sys.executable, "-m", "downpour.launch", "--log", "warn", *launch, *args]
            else:
                cmd = [sys.executable, *args, "--reference"]
            r, killed = run(cmd, f)
            r.update(config=name, seed=seed, server_killed=killed)
            results.append(r)
            print(f"seed {seed} {name}: auc {r['test_auc']:.4f} rmse {r['test_rmse']:.4f} {r['examples_per_s']:.0f} examples/s", flush=True)
    (a.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    ref = {r["seed"]: r for r in results if r["config"].startswith("plain")}
    lines = [
        "| configuration | test AUC per seed | mean AUC | mean AUC − plain | mean RMSE | examples/s (all workers) | data / forward / step s per worker |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in configs:
        rs = [r for r in results if r["config"] == name]
        aucs = [r["test_auc"] for r in rs]
        diff = statistics.mean(r["test_auc"] - ref[r["seed"]]["test_auc"] for r in rs)
        rate = statistics.mean(r["examples_per_s"] * r["workers"] for r in rs)
        split = "-"
        if "forward_s" in rs[0]:
            split = " / ".join(f"{statistics.mean(r[k] for r in rs):.2f}" for k in ("data_s", "forward_s", "step_s"))
        lines.append(
            f"| {name} | {', '.join(f'{x:.4f}' for x in aucs)} | {statistics.mean(aucs):.4f} | {diff:+.4f} | "
            f"{statistics.mean(r['test_rmse'] for r in rs):.4f} | {rate:,.0f} | {split} |"
        )
    (a.out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
