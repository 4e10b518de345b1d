#!/usr/bin/env python3
"""Same-run cost of scraping the servers' metrics (issue 28's target: no measurable cost).

Runs `downpour bench` (1 server + 1 worker) ROUNDS times interleaved: plain, and with
`--metrics-port PORT` and a scraper that GETs http://127.0.0.1:PORT/metrics every second for
the whole run (`--iters 60 --latency-iters 20000`: 5-10 s a run, so several scrapes each). Prints the median of each bench line's figure (GB/s, M keys/s, p50 µs) per
variant and their ratio.

    python3 scripts/metrics_cost.py [--rounds 5] [--every 1.0] [--bin target/release/downpour]
"""
import argparse
import re
import statistics
import subprocess
import sys
import threading
import urllib.request

PORT = 19400
# long enough (5-10 s a run here) for several scrapes per run
ARGS = ["bench", "--sizes", "4KiB,16MiB", "--ops", "push,push_then_pull", "--iters", "60", "--latency-iters", "20000"]


def scraper(stop, scrapes, every):
    while not stop.wait(every):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/metrics", timeout=2) as r:
                if b"downpour_table_keys_total" in r.read():
                    scrapes[0] += 1
        except OSError:
            pass  # the server is not up yet, or gone


def run(binary, scraped, every):
    stop, scrapes = threading.Event(), [0]
    extra = ["--metrics-port", str(PORT)] if scraped else []
    t = threading.Thread(target=scraper, args=(stop, scrapes, every)) if scraped else None
    if t:
        t.start()
    try:
        out = subprocess.run([binary, *ARGS, *extra], capture_output=True, text=True, check=True).stdout
    finally:
        stop.set()
        if t:
            t.join()
    figures = {}
    for line in out.splitlines():
        m = re.match(r"^(\w+)\s+(\S+ \S+) (\w+)\s+([\d.]+|-)\s+([\d.]+|-)\s+([\d.]+|-)", line)
        if m:
            case, size, op, gbs, mk, p50 = m.groups()
            for name, v in (("GB/s", gbs), ("M keys/s", mk), ("p50 µs", p50)):
                if v != "-":
                    figures[f"{case} {size} {op} {name}"] = float(v)
    return figures, scrapes[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--bin", default="target/release/downpour")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between scrapes")
    a = ap.parse_args()
    got = {False: {}, True: {}}
    total_scrapes = 0
    for r in range(a.rounds):
        for scraped in (False, True):
            figures, n = run(a.bin, scraped, a.every)
            total_scrapes += n
            for k, v in figures.items():
                got[scraped].setdefault(k, []).append(v)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)
    print(f"({total_scrapes} scrapes answered over the scraped runs)")
    print(f"| figure | plain | scraped every {a.every:g} s | ratio |")
    print("|---|---|---|---|")
    for k in got[False]:
        p, s = got[False][k], got[True].get(k, [float("nan")])
        mp, ms = statistics.median(p), statistics.median(s)
        print(f"| {k} | {mp:.2f} ({min(p):.2f}–{max(p):.2f}) | {ms:.2f} ({min(s):.2f}–{max(s):.2f}) | {ms / mp:.2f} |")


if __name__ == "__main__":
    main()
