#!/usr/bin/env python3
"""The planner's costs from emulated runs, and the planner against every run (issue 29;
docs/experiments.md, "Scaling on an emulated cluster"). `scripts/scaling.sh` calls it; run it
again on recorded runs to recompute both.

    python3 scripts/plan_validate.py calibrate RUNS.jsonl CALIBRATION.json
    python3 scripts/plan_validate.py validate VALIDATION.jsonl RUNS.jsonl... --calibration C.json...

calibrate: from the runs of RUNS.jsonl's first mode, the workers' CPU and the wire bytes per
example of its first run (W = 1: the workers are the bound), the servers' CPU per example of its
run whose servers used the largest share of their CPU (they are the bound there: a server's
capacity is what it does saturated; a lightly loaded one pays per-request wake-ups that a
loaded one does not, and per-example costs at low load say little about its capacity).

validate: `downpour plan` (DOWNPOUR_BIN, default target/release/downpour) for every run, from
the calibrations given (each run's job, workers, servers, CPU and link); prints a line per run
and writes one JSON line each to VALIDATION.jsonl.
"""
import json, os, subprocess, sys

BIN = os.environ.get("DOWNPOUR_BIN", "target/release/downpour")


def calibrate(runs_path, out_path):
    runs = [json.loads(l) for l in open(runs_path) if l.strip()]
    runs = [r for r in runs if r["mode"] == runs[0]["mode"]]
    first = runs[0]
    # (servers and cores are the same in every run of a file: the share used is ∝ rate × cost)
    loaded = max(runs, key=lambda r: r["examples_per_s"] * r["server_cpu_s_per_example"])
    util = loaded["examples_per_s"] * loaded["server_cpu_s_per_example"] / (loaded["servers"] * loaded["cpu_per_node"])
    cal = {"worker_cpu_s": first["worker_cpu_s_per_example"], "server_cpu_s": loaded["server_cpu_s_per_example"],
           "wire_bytes": first["wire_bytes_per_example"], "servers": first["servers"], "job": first.get("job", "linear"),
           "from": {"workers_and_wire": f"{first['mode']} W={first['workers']}",
                    "servers": f"{loaded['mode']} W={loaded['workers']} (servers at {util:.0%} of their CPU)"}}
    json.dump(cal, open(out_path, "w"))
    print(f"calibration {out_path}: workers {cal['worker_cpu_s'] * 1e6:.2f} µs/example (W={first['workers']}), "
          f"servers {cal['server_cpu_s'] * 1e6:.2f} µs/example (W={loaded['workers']}, {util:.0%} of their CPU), "
          f"{cal['wire_bytes']:.0f} bytes/example")


def validate(out_path, files, cals):
    flags = [x for c in cals for x in ("--calibration", c)]
    errors = []
    with open(out_path, "w") as out:
        for f in files:
            for r in (json.loads(l) for l in open(f) if l.strip()):
                job = r.get("job", "linear")
                p = subprocess.run([BIN, "--log", "warn", "plan", "--job", job, "--workers", str(r["workers"]), "--servers", str(r["servers"]),
                                    "--cpu", str(r["cpu_per_node"]), "--link", r["rate"], "--json"] + flags,
                                   check=True, capture_output=True, text=True)
                p = json.loads(p.stdout)
                err = p["examples_per_s"] / r["examples_per_s"] - 1
                errors.append(err)
                v = {"job": job, "mode": r["mode"], "workers": r["workers"], "servers": r["servers"], "measured": r["examples_per_s"],
                     "predicted": p["examples_per_s"], "error": err, "bottleneck": p["bottleneck"],
                     "server_cpu_util": p["server_cpu_util"], "worker_cpu_util": p["worker_cpu_util"]}
                out.write(json.dumps(v) + "\n")
                print(f"{r['mode']:6} W={r['workers']:2} S={r['servers']}: measured {r['examples_per_s']:9.0f}  "
                      f"predicted {p['examples_per_s']:9.0f}  error {err * 100:+6.1f} %  bound by the {p['bottleneck']}")
    inside = sum(abs(e) <= 0.2 for e in errors)
    print(f"within 20 %: {inside} of {len(errors)}; largest error {max(map(abs, errors)) * 100:.1f} %")


def main(a):
    if len(a) >= 4 and a[1] == "calibrate":
        calibrate(a[2], a[3])
    elif len(a) >= 4 and a[1] == "validate" and "--calibration" in a:
        i = a.index("--calibration")
        validate(a[2], a[3:i], [c for c in a[i + 1:] if c != "--calibration"])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
