"""Downpour side by side with ps-lite, in one go, written into docs/benchmarks.md.

    python3 scripts/compare_pslite.py [--pslite GIT_OR_SOURCE_DIR] [--rounds 3] [--no-write]

Runs `../shared/tools/pslite/run.sh` (ROUNDS interleaved rounds of ps-lite and `downpour bench`
on this machine, 1 server + 1 worker and 2 + 2, plus one iperf3 loopback stream; then iperf3
with 2 and 4 parallel streams, ROUNDS times each: what loopback TCP carries in all on this
machine, the ceiling of the 2 + 2 row, whose four processes share its cores) after building
ps-lite with `../shared/tools/pslite/build.sh` when `/tmp/pslite-build/pslite_bench` is missing
(`--pslite` names ps-lite's source: a bare git directory or a source tree of dmlc/ps-lite).
Needs `cargo build --release` first, and `apt-get install -y libzmq3-dev protobuf-compiler
libprotobuf-dev build-essential iperf3`. The printed table becomes the section "Side by side
with ps-lite (latest run)" of docs/benchmarks.md (replaced on every run), with the date, the
commit and the raw samples copied under docs/bench-data/.
"""

import argparse
import datetime
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
TOOLS = REPO.parent / "shared" / "tools" / "pslite"
SECTION = "## Side by side with ps-lite (latest run)"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pslite", help="ps-lite's source (bare git dir or tree), to build it")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-write", action="store_true", help="print the table, leave the docs alone")
    a = p.parse_args()
    if not (TOOLS / "run.sh").exists():
        sys.exit(f"error: {TOOLS}/run.sh not found: the ps-lite harness lives in ../shared/tools/pslite")
    dp = REPO / "target" / "release" / "downpour"
    if not dp.exists():
        sys.exit("error: target/release/downpour not found: run cargo build --release first")
    if not pathlib.Path("/tmp/pslite-build/pslite_bench").exists():
        if not a.pslite:
            sys.exit("error: ps-lite is not built: give --pslite DIR (dmlc/ps-lite's source or bare git dir)")
        subprocess.run(["bash", str(TOOLS / "build.sh"), a.pslite], check=True)
    out_dir = pathlib.Path("/tmp/pslite-run")
    env = dict(os.environ, ROUNDS=str(a.rounds), OUTDIR=str(out_dir), DP=str(dp))
    run = subprocess.run(["bash", str(TOOLS / "run.sh")], cwd=REPO, env=env, capture_output=True, text=True)
    sys.stderr.write(run.stderr)
    if run.returncode != 0:
        sys.exit(f"error: run.sh failed ({run.returncode})")
    print(run.stdout)
    ceiling = streams_ceiling(a.rounds)
    print(ceiling)
    lines = [l for l in run.stdout.splitlines() if l.strip()]
    table = [l for l in lines if re.match(r"^\ds\+\dw ", l)]
    iperf = next((l for l in lines if l.startswith("iperf3")), "")
    load = next((l.strip() for l in lines if "load average" in l), "")
    if not table:
        sys.exit("error: run.sh printed no table")
    if a.no_write:
        return
    day = datetime.date.today().isoformat()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    raw = REPO / "docs" / "bench-data" / f"{day}-pslite"
    raw.mkdir(parents=True, exist_ok=True)
    for f in ("pl.jsonl", "dp.jsonl", "iperf.jsonl"):
        if (out_dir / f).exists():
            shutil.copy(out_dir / f, raw / f)
    md = [
        "| setup | case | size | metric | ps-lite | Downpour | Downpour / ps-lite | ranges (ps-lite \\| Downpour) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for l in table:
        f = l.split()
        # setup case size(2 words) metric(2-3 words) pl dp ratio ranges...
        setup, case = f[0], f[1]
        size = " ".join(f[2:4])
        rest = f[4:]
        bar = rest.index("|") if "|" in rest else len(rest)
        nums = rest[: bar - 1]
        metric = " ".join(nums[:-3])
        pl, dpv, ratio = nums[-3:]
        ranges = " ".join(rest[bar - 1 :]).replace("|", "\\|")
        md.append(f"| {setup} | {case} | {size} | {metric} | {pl} | {dpv} | {ratio} | {ranges} |")
    section = "\n".join(
        [
            SECTION,
            "",
            f"Written by `python3 scripts/compare_pslite.py --rounds {a.rounds}` on {day} at commit {commit}: "
            f"{a.rounds} interleaved rounds, medians (raw samples: `docs/bench-data/{day}-pslite/`). {iperf}.",
            f"{ceiling}.",
            f"Machine load before the run: `{load}`.",
            "",
            *md,
            "",
            "",
        ]
    )
    doc = REPO / "docs" / "benchmarks.md"
    text = doc.read_text()
    if SECTION in text:
        start = text.index(SECTION)
        nxt = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + (text[nxt + 1 :] if nxt >= 0 else "")
    else:
        at = text.index("## Reproduce")
        text = text[:at] + section + text[at:]
    doc.write_text(text)
    print(f"wrote the table into {doc}")


def streams_ceiling(rounds):
    """iperf3 over loopback with 2 and 4 parallel streams, `rounds` times each (interleaved):
    a sentence with the medians in GB/s, or why it could not run."""
    if shutil.which("iperf3") is None:
        return "iperf3 with parallel streams: not run (iperf3 is not installed)"
    seen = {2: [], 4: []}
    for _ in range(rounds):
        for n in seen:
            server = subprocess.Popen(["iperf3", "-s", "-1", "-p", "5299"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                time.sleep(0.3)
                r = subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", "5299", "-t", "5", "-P", str(n), "-J"], capture_output=True, text=True, timeout=60)
                seen[n].append(json.loads(r.stdout)["end"]["sum_received"]["bits_per_second"] / 8e9)
            except (subprocess.SubprocessError, ValueError, KeyError) as e:
                return f"iperf3 with parallel streams: failed ({e})"
            finally:
                server.kill()
                server.wait()
    med = {n: sorted(v)[len(v) // 2] for n, v in seen.items()}
    return (
        f"iperf3 loopback with parallel streams, in all: 2 streams {med[2]:.2f} GB/s, 4 streams {med[4]:.2f} GB/s "
        f"(medians of {rounds}; the most loopback TCP carries on these cores, the 2s+2w row's ceiling)"
    )


if __name__ == "__main__":
    main()
