#!/usr/bin/env python3
"""Same-run cost of admission and eviction on the sparse path (issue 28's target: >= 0.9x).

Runs `downpour bench` on the sparse case (1 server + 1 worker, 1M random keys) with each
configuration in turn, ROUNDS times interleaved, and prints the median M keys/s of push and
pull per configuration and its ratio to the first (plain) one.

    python3 scripts/eviction_cost.py [--rounds 5] [--bin target/release/downpour]
"""
import argparse
import re
import statistics
import subprocess
import sys

CONFIGS = [
    ("plain", "always", "never"),
    ("count:2", "count:2", "never"),
    ("count:2 + lru:4000000", "count:2", "lru:4000000"),
    ("lru:4000000", "always", "lru:4000000"),
    ("ttl:1h", "always", "ttl:1h"),
    ("lfu:4000000", "always", "lfu:4000000"),
]


def run(binary, admit, evict, iters):
    out = subprocess.run(
        [binary, "bench", "--sizes", "4096", "--ops", "push", "--latency-iters", "0", "--iters", str(iters),
         "--sparse-admit", admit, "--sparse-evict", evict],
        capture_output=True, text=True, check=True).stdout
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
    a = ap.parse_args()
    got = {name: {"push": [], "pull": []} for name, _, _ in CONFIGS}
    for r in range(a.rounds):
        for name, admit, evict in CONFIGS:
            rates = run(a.bin, admit, evict, a.iters)
            for op in rates:
                got[name][op].append(rates[op])
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    base = {op: statistics.median(got["plain"][op]) for op in ("push", "pull")}
    print("| table | sparse push M keys/s | ratio | sparse pull M keys/s | ratio |")
    print("|---|---|---|---|---|")
    for name, _, _ in CONFIGS:
        cells = []
        for op in ("push", "pull"):
            v = got[name][op]
            med = statistics.median(v)
            cells += [f"{med:.1f} ({min(v):.1f}–{max(v):.1f})", f"{med / base[op]:.2f}"]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
