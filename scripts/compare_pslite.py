"""Downpour side by side with ps-lite, in one go, written into docs/benchmarks.md.

    python3 scripts/compare_pslite.py [--pslite GIT_OR_SOURCE_DIR] [--rounds 3] [--no-write]

Runs `../shared/tools/pslite/run.sh` (ROUNDS interleaved rounds of ps-lite and `downpour bench`
on this machine, 1 server + 1 worker and 2 + 2, plus one iperf3 loopback stream; then iperf3
with 2 and 4 parallel streams, ROUNDS times each: what loopback TCP carried in all, one way;
a reference for the 2 + 2 row, not its ceiling: that row's traffic goes both ways, and
iperf3 before 3.16 drives all its streams from one thread) after building
ps-lite with `../shared/tools/pslite/build.sh` when `/tmp/pslite-build/pslite_bench` is missing
(`--pslite` names ps-lite's source: a bare git directory or a source tree of dmlc/ps-lite).
Needs `cargo build --release` first, and `apt-get install -y libzmq3-dev protobuf-compiler
libprotobuf-dev build-essential iperf3`. The printed table becomes the section "Side by side
with ps-lite (latest run)" of docs/benchmarks.md (replaced on every run), with the date, the
commit and the raw samples copied under docs/bench-data/.

Then, co-located (every process on this host, each system in its best mode for that): ps-lite
over ZeroMQ's ipc:// sockets (`DMLC_LOCAL=1`) against `downpour --transport shm` (shared-memory
rings), ROUNDS interleaved rounds of 1 + 1 (4 KiB and 16 MiB dense, 4 KiB latency, 1M sparse
keys) and 2 + 2 (16 MiB push-then-pull): a second table in the same section
(`--no-colocated` skips it).
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
    p.add_argument("--no-colocated", action="store_true", help="skip the co-located table (ipc vs shm)")
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
    streams = parallel_streams(a.rounds)
    print(streams)
    co_rows, co_raw = ([], {}) if a.no_colocated else colocated(a.rounds, dp)
    for l in co_rows:
        print(l)
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
    for f, rows in co_raw.items():
        (raw / f).write_text("".join(json.dumps(r) + "\n" for r in rows))
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
            f"{streams}.",
            f"Machine load before the run: `{load}`.",
            "",
            *md,
            "",
            *(
                [
                    "Co-located, every process on this host, each system in its fastest mode for that: ps-lite over "
                    "ZeroMQ's `ipc://` sockets (`DMLC_LOCAL=1`), Downpour with `--transport shm` (shared-memory rings; "
                    f"same run, {a.rounds} interleaved rounds, medians; raw: `colocated-*.jsonl` beside the above):",
                    "",
                    "| setup | case | size | metric | ps-lite ipc | Downpour shm | Downpour / ps-lite | ranges (ps-lite \\| Downpour) |",
                    "|---|---|---|---|---|---|---|---|",
                    *co_rows,
                    "",
                ]
                if co_rows
                else []
            ),
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


def freeport():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pslite_local(servers, workers, extra):
    """One ps-lite run over ipc:// (DMLC_LOCAL=1): its BENCH json lines, or SystemExit."""
    psb = "/tmp/pslite-build/pslite_bench"
    env = dict(
        os.environ,
        DMLC_PS_ROOT_URI="127.0.0.1",
        DMLC_PS_ROOT_PORT=str(freeport()),
        DMLC_NUM_SERVER=str(servers),
        DMLC_NUM_WORKER=str(workers),
        DMLC_LOCAL="1",
        **extra,
    )
    roles = ["scheduler"] + ["server"] * servers + ["worker"] * workers
    procs = [
        subprocess.Popen(["timeout", "300", psb], env=dict(env, DMLC_ROLE=r), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        for r in roles
    ]
    out = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        sys.exit(f"error: ps-lite over ipc:// failed ({[p.returncode for p in procs]})")
    return [json.loads(l[len("BENCH ") :]) for o in out for l in o.splitlines() if l.startswith("BENCH ")]


def downpour_shm(dp, args):
    r = subprocess.run([str(dp), "--log", "warn", "--transport", "shm", "bench", "--json", *args], capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit(f"error: downpour --transport shm bench failed:\n{r.stderr}")
    return [json.loads(l) for l in r.stdout.splitlines() if l.startswith("{")]


def colocated(rounds, dp):
    """ps-lite over ipc:// against Downpour over shared memory, `rounds` interleaved rounds:
    the table's markdown rows, and the raw samples by file name."""
    import statistics as st
    from collections import defaultdict

    small = dict(PSB_SIZES="4096,16777216")
    big = dict(PSB_SIZES="16777216", PSB_OPS="push_then_pull", PSB_LAT_ITERS="0", PSB_SPARSE_KEYS="0")
    pl_raw, dp_raw = [], []
    for r in range(1, rounds + 1):
        print(f"co-located round {r}/{rounds}", file=sys.stderr)
        order = ["pl", "dp"] if r % 2 else ["dp", "pl"]
        for who in order:
            if who == "pl":
                pl_raw += [dict(x, round=r, servers=1) for x in pslite_local(1, 1, small)]
                pl_raw += [dict(x, round=r, servers=2) for x in pslite_local(2, 2, big)]
            else:
                one = ["--servers", "1", "--workers", "1", "--sizes", "4KiB,16MiB", "--ops", "push,pull,push_then_pull"]
                two = ["--servers", "2", "--workers", "2", "--sizes", "16MiB", "--ops", "push_then_pull", "--latency-iters", "0", "--sparse-keys", "0"]
                dp_raw += [dict(x, round=r) for x in downpour_shm(dp, one) + downpour_shm(dp, two)]
    # ps-lite: every worker's payload over the slowest worker's time, as run.sh does
    agg = defaultdict(list)
    for x in pl_raw:
        agg[(x["round"], x["servers"], x["case"], x["bytes"], x["op"])].append(x)
    pl, dq = defaultdict(list), defaultdict(list)
    for (_, s, case, b, op), xs in agg.items():
        secs = max(x["secs"] for x in xs)
        if case == "latency":
            pl[(s, "latency", b, "push p50 µs")].append(max(x["p50_us"] for x in xs))
            pl[(s, "latency", b, "push p99 µs")].append(max(x["p99_us"] for x in xs))
        elif case == "sparse":
            pl[(s, case, b, op + " Mkeys/s")].append(sum(x["keys"] for x in xs) / secs / 1e6)
        else:
            pl[(s, case, b, op + " GB/s")].append(sum(x["payload"] for x in xs) / secs / 1e9)
    for x in dp_raw:
        s, b = x["servers"], x["bytes"]
        if x["latency"]:
            dq[(s, "latency", b, "push p50 µs")].append(x["p50_us"])
            dq[(s, "latency", b, "push p99 µs")].append(x["p99_us"])
        elif x["case"] == "sparse":
            dq[(s, "sparse", b, x["op"] + " Mkeys/s")].append(x["keys_per_s"] / 1e6)
        else:
            dq[(s, "dense", b, x["op"] + " GB/s")].append(x["gbps"])

    def size(case, b):
        return f"{b // 4000}k keys" if case == "sparse" else (f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB")

    rows = []
    for k in sorted(set(pl) & set(dq), key=lambda k: (k[0], ["dense", "latency", "sparse"].index(k[1]), k[2], k[3])):
        s, case, b, m = k
        a, d = pl[k], dq[k]
        ma, md = st.median(a), st.median(d)
        rows.append(
            f"| {s}s+{s}w | {case} | {size(case, b)} | {m} | {ma:.2f} | {md:.2f} | {md / ma:.2f} | "
            f"{min(a):.2f}-{max(a):.2f} \\| {min(d):.2f}-{max(d):.2f} |"
        )
    return rows, {"colocated-pl.jsonl": pl_raw, "colocated-dp.jsonl": dp_raw}


def parallel_streams(rounds):
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
        f"iperf3 loopback with parallel streams, in all: 2 streams {med[2]:.2f} GB/s ({min(seen[2]):.2f}-{max(seen[2]):.2f}), "
        f"4 streams {med[4]:.2f} GB/s ({min(seen[4]):.2f}-{max(seen[4]):.2f}) (medians of {rounds}; one way, and iperf3 before 3.16 "
        "drives all its streams from one thread: a reference for the 2s+2w row, whose traffic goes both ways, not its ceiling)"
    )


if __name__ == "__main__":
    main()
