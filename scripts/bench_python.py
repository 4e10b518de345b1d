"""The Python client against the Rust client, in one run (issue 25's targets).

    python3 scripts/bench_python.py [--rounds 3] [--keys 1000000] [--size-mib 16] [--out F.json]

Each round runs, one after the other on a fresh cluster of 1 server and 1 worker (framed TCP
on 127.0.0.1): `python -m downpour.launch ... scripts/bench_python.py --worker`, the Python
client pushing and pulling `--keys` random sorted uint64 keys (one float each) and a dense
`--size-mib` MiB table (push, pull, push then pull), then `python -m downpour bench`, the
Rust client doing the same cases. Medians over the rounds, and the Python / Rust ratios.
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np


def worker(a):
    import downpour

    s = downpour.connect()
    rng = np.random.default_rng(0x9E3779B97F4A7C15 ^ (s.rank + 1))
    keys = np.unique(rng.integers(0, np.iinfo(np.uint64).max, size=a.keys, dtype=np.uint64, endpoint=True))
    out = {}
    t = s.table(200, "bench-sparse")
    vals = np.ones(len(keys), dtype=np.float32)
    pulled = np.zeros(len(keys), dtype=np.float32)
    t.push(keys, vals)  # creates the keys
    for op in ("push", "pull"):
        s.barrier(f"py-sparse-{op}")
        t0 = time.perf_counter()
        for _ in range(a.iters):
            if op == "push":
                t.push(keys, vals)
            else:
                t.pull(keys, out=pulled)
        out[f"sparse_{op}_mkeys_s"] = len(keys) * a.iters / (time.perf_counter() - t0) / 1e6
    n = a.size_mib << 18  # floats
    d = s.table(100, "bench-dense", dense=n)
    dv = np.full(n, 0.5, dtype=np.float32)
    do = np.zeros(n, dtype=np.float32)
    d.push_range(0, dv)
    d.pull_range(0, out=do)
    iters = max(5, min(2000, (1 << 30) // (n * 4)))
    for op in ("push", "pull", "push_then_pull"):
        s.barrier(f"py-dense-{op}")
        t0 = time.perf_counter()
        for _ in range(iters):
            if op != "pull":
                d.push_range(0, dv)
            if op != "push":
                d.pull_range(0, out=do)
        dirs = 2 if op == "push_then_pull" else 1
        out[f"dense_{op}_gb_s"] = n * 4 * dirs * iters / (time.perf_counter() - t0) / 1e9
    s.finish()
    print("BENCH " + json.dumps(out), flush=True)


def run_python(a):
    cmd = [sys.executable, "-m", "downpour.launch", "--servers", "1", "--workers", "1", "--log", "warn", __file__, "--worker"]
    cmd += ["--keys", str(a.keys), "--size-mib", str(a.size_mib), "--iters", str(a.iters)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    for line in p.stdout.splitlines():
        if "BENCH " in line:
            return json.loads(line.split("BENCH ", 1)[1])
    sys.exit(f"the Python client's run failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")


def run_rust(a):
    cmd = [sys.executable, "-m", "downpour", "--log", "warn", "bench", "--servers", "1", "--workers", "1", "--json"]
    cmd += ["--sizes", f"{a.size_mib}MiB", "--sparse-keys", str(a.keys), "--latency-iters", "0"]
    cmd += ["--ops", "push,pull,push_then_pull"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"downpour bench failed ({p.returncode}):\n{p.stderr[-2000:]}")
    out = {}
    for line in p.stdout.splitlines():
        if not line.startswith("{"):
            continue
        x = json.loads(line)
        if x.get("case") == "sparse":
            out[f"sparse_{x['op']}_mkeys_s"] = x["keys_per_s"] / 1e6
        elif x.get("case") == "dense":
            out[f"dense_{x['op']}_gb_s"] = x["gbps"]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--size-mib", type=int, default=16)
    p.add_argument("--iters", type=int, default=10, help="timed iterations of the Python sparse cases (downpour bench's default)")
    p.add_argument("--out", help="write the rounds and medians as JSON here")
    a = p.parse_args()
    if a.worker:
        return worker(a)
    rounds = []
    for r in range(a.rounds):
        py, rs = run_python(a), run_rust(a)
        rounds.append({"python": py, "rust": rs})
        print(f"round {r + 1}/{a.rounds}: python {json.dumps(py)}\n             rust   {json.dumps(rs)}", flush=True)
    med = {}
    print(f"\n{'case':<28}{'Rust':>10}{'Python':>10}{'ratio':>8}")
    for k in rounds[0]["python"]:
        py = statistics.median(x["python"][k] for x in rounds)
        rs = statistics.median(x["rust"].get(k, float("nan")) for x in rounds)
        med[k] = {"rust": rs, "python": py, "ratio": py / rs}
        print(f"{k:<28}{rs:>10.2f}{py:>10.2f}{py / rs:>8.2f}")
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"rounds": rounds, "median": med, "keys": a.keys, "size_mib": a.size_mib}, f, indent=1)


if __name__ == "__main__":
    main()
