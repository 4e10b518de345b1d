#!/usr/bin/env python3
"""Same-run cost of change tracking on the sparse path (issue 28, incremental export).

Runs `downpour bench` on the sparse case (1 server + 1 worker, 1M random keys) ROUNDS times,
interleaved: a BASE binary built before change tracking existed (plain table), this binary on
a plain table, and this binary on a table that tracks changes (`--sparse-changes`). Prints the
median M keys/s of push and pull per configuration and its ratio to the first.

    python3 scripts/changes_cost.py --base /tmp/base-target/release/downpour [--rounds 5]
"""
import argparse
import re
import statistics
import subprocess
import sys


def run(binary, changes, iters):
    cmd = [binary, "bench", "--sizes", "4096", "--ops", "push", "--latency-iters", "0", "--iters", str(iters)]
    if changes:
        cmd.append("--sparse-changes")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    rates = {}
    for op in ("push", "pull"):
        m = re.search(r"^sparse\s+\d+k keys " + op + r"\s+[\d.]+\s+([\d.]+)", out, re.M)
        if not m:
            sys.exit(f"no sparse {op} line in:\n{out}")
        rates[op] = float(m.group(1))
    return rates


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--bin", default="target/release/downpour")
    ap.add_argument("--base", required=True, help="a downpour binary from before change tracking")
    a = ap.parse_args()
    configs = [("before (plain)", a.base, False), ("this build (plain)", a.bin, False), ("this build, changes", a.bin, True)]
    got = {name: {"push": [], "pull": []} for name, _, _ in configs}
    for r in range(a.rounds):
        for name, binary, changes in configs:
            rates = run(binary, changes, a.iters)
            for op in rates:
                got[name][op].append(rates[op])
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    base = {op: statistics.median(got[configs[0][0]][op]) for op in ("push", "pull")}
    print("| binary, table | sparse push M keys/s | ratio | sparse pull M keys/s | ratio |")
    print("|---|---|---|---|---|")
    for name, _, _ in configs:
        cells = []
        for op in ("push", "pull"):
            v = got[name][op]
            med = statistics.median(v)
            cells += [f"{med:.1f} ({min(v):.1f}–{max(v):.1f})", f"{med / base[op]:.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
