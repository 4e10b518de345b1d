#!/usr/bin/env bash
# Static shares against data handed out by the scheduler (`--data-assignment dynamic`) with a
# persistent straggler that is a slower machine (issue 30, item 5): the coordinator, one
# server and W workers run as processes on loopback, each in a cgroup-v1 CPU group of its own
# with a quota, so each is a machine of its own speed and none takes another's CPU: the
# workers WORKER_CPU cores each, the last one (the straggler) FACTOR times less, the server
# SERVER_CPU. (`--straggler ID:FACTOR` sleeps instead; on this 2-vCPU VM its sleeps gave
# its CPU to the other workers, and in the pipelined linear job the sleep hides the
# straggler's waits for the server, so it was slower by much less than FACTOR.)
#
# For each W in WS and each of ROUNDS rounds, a static and a dynamic run, interleaved, of
# one epoch of async SGD on the same synth-ctr file. Prints one line per run (the epoch's
# seconds, the job's: after the barrier every worker reaches at the end; the chunks worker
# 0, a fast one, trained; test AUC) and per W the median dynamic/static ratio and the
# straggler's speed against a fast worker's, from the chunks each trained in the dynamic
# runs; writes JSON lines to DIR/dynamic.jsonl.
#
# Usage (root; a release build first): scripts/dynamic_assignment.sh [DIR]
# Environment: WS ("2 4"), ROUNDS (3), EXAMPLES (200000), WORKER_CPU (0.4), SERVER_CPU
# (0.6), FACTOR (4), PERIOD_US (the quotas' period, 10000), TRAIN_ARGS (more `train linear`
# flags), DOWNPOUR_BIN. Everything it creates is named dpa-* and removed on exit; the data
# stays in DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=$(realpath -m "${1:-/tmp/downpour-dynamic}")
WS=${WS:-"2 4"}
ROUNDS=${ROUNDS:-3}
EXAMPLES=${EXAMPLES:-200000}
WORKER_CPU=${WORKER_CPU:-0.4}
SERVER_CPU=${SERVER_CPU:-0.6}
FACTOR=${FACTOR:-4}
PERIOD_US=${PERIOD_US:-10000}
BIN=$(realpath "${DOWNPOUR_BIN:-target/release/downpour}")
CG=/sys/fs/cgroup/cpu
[ "$(id -u)" = 0 ] || { echo "dynamic_assignment.sh: needs root (cgroups)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "dynamic_assignment.sh: no $BIN (cargo build --release first)" >&2; exit 2; }
[ -d "$CG" ] || { echo "dynamic_assignment.sh: no cgroup-v1 cpu controller at $CG" >&2; exit 2; }
mkdir -p "$DIR"
SLOW=$(python3 -c "print($WORKER_CPU / $FACTOR)")

cleanup() {
    for g in "$CG"/dpa-*; do
        [ -d "$g" ] || continue
        xargs -r kill -9 < "$g/cgroup.procs" 2>/dev/null || true
        for _ in $(seq 20); do [ -s "$g/cgroup.procs" ] || break; sleep 0.05; done
        rmdir "$g" 2>/dev/null || true
    done
}
trap cleanup EXIT
cleanup

group() { # NAME CORES: a CPU group with a quota of CORES a period of PERIOD_US (the
    # kernel's smallest quota is 1 ms a period; a throttled machine waits up to a period)
    local quota
    quota=$(python3 -c "print(int($2 * $PERIOD_US))")
    [ "$quota" -ge 1000 ] || { echo "dynamic_assignment.sh: $2 cores is below the smallest quota (1 ms a period)" >&2; exit 2; }
    mkdir -p "$CG/$1"
    echo "$PERIOD_US" > "$CG/$1/cpu.cfs_period_us"
    echo "$quota" > "$CG/$1/cpu.cfs_quota_us"
}
on() { # GROUP LOG COMMAND...: runs COMMAND in GROUP, in the background
    local g=$1 log=$2; shift 2
    sh -c 'echo $$ > "$0/cgroup.procs"; exec "$@"' "$CG/$g" "$@" >"$log" 2>&1 &
}
free_port() { python3 -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }

train="$DIR/train-$EXAMPLES.svm"
[ -s "$train" ] || "$BIN" --log warn data synth-ctr --examples "$EXAMPLES" --nnz 40 --key-space 1048576 --zipf 1.1 --seed 3 --out "$train" >/dev/null
[ -s "$DIR/test.svm" ] || "$BIN" --log warn data synth-ctr --examples 20000 --nnz 40 --key-space 1048576 --zipf 1.1 --seed 3 --start "$EXAMPLES" --out "$DIR/test.svm" >/dev/null

: > "$DIR/dynamic.jsonl"
for w in $WS; do
    for ((round = 1; round <= ROUNDS; round++)); do
        for mode in static dynamic; do
            cleanup
            group dpa-c 0.2
            group dpa-s "$SERVER_CPU"
            for ((i = 0; i < w; i++)); do group "dpa-w$i" "$([ "$i" = $((w - 1)) ] && echo "$SLOW" || echo "$WORKER_CPU")"; done
            run="$DIR/run-$w-$mode-$round"
            rm -rf "$run" && mkdir -p "$run"
            port=$(free_port)
            on dpa-c "$run/coordinator.log" "$BIN" --log warn coordinator --listen "127.0.0.1:$port" --servers 1 --workers "$w"
            sleep 0.3
            on dpa-s "$run/server.log" "$BIN" --log warn server --coordinator "127.0.0.1:$port" --listen 127.0.0.1:0
            pids=()
            for ((i = 0; i < w; i++)); do
                # (the straggler registers last, so it is rank W-1 and rank 0, which writes
                # the metrics, is a fast machine)
                [ "$i" = $((w - 1)) ] && sleep 0.3
                on "dpa-w$i" "$run/worker-$i.log" "$BIN" --log warn worker --coordinator "127.0.0.1:$port" train linear --train "$train" \
                    --test "$DIR/test.svm" --epochs 1 --algorithm sgd --data-assignment "$mode" ${TRAIN_ARGS:-} --quiet --out "$run/metrics-$i.json"
                pids+=($!)
            done
            ok=1
            for p in "${pids[@]}"; do wait "$p" || ok=0; done
            [ "$ok" = 1 ] || { echo "dynamic_assignment.sh: W=$w $mode failed:" >&2; tail -n 3 "$run"/*.log >&2; exit 1; }
            python3 - "$w" "$mode" "$round" "$WORKER_CPU" "$SLOW" "$run"/metrics-*.json <<'PY' | tee -a "$DIR/dynamic.jsonl"
import json, sys
w, mode, rnd, cpu, slow = sys.argv[1:6]
m = [json.load(open(f)) for f in sys.argv[6:]]
# the epoch ends when its slowest worker is done: the largest epoch time of the workers
epoch = max(x["epochs"][0]["wall_s"] for x in m)
first = next(x for x in m if x.get("test_auc") is not None)
print(json.dumps({"workers": int(w), "mode": mode, "round": int(rnd), "worker_cpu": float(cpu), "straggler_cpu": float(slow),
                  "epoch_s": epoch, "examples": sum(x["train_examples"] for x in m),
                  "chunks": first.get("chunks"), "chunks_trained_by_worker0": first.get("chunks_trained_by_worker0"),
                  "test_auc": first["test_auc"]}))
PY
        done
    done
done
cleanup
python3 - "$DIR/dynamic.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
for w in sorted({r["workers"] for r in runs}):
    t = {m: [r["epoch_s"] for r in runs if r["workers"] == w and r["mode"] == m] for m in ("static", "dynamic")}
    ratio = statistics.median(t["dynamic"]) / statistics.median(t["static"])
    # the straggler's speed against a fast worker's: the chunks each trained in the same
    # dynamic epoch (the fast workers taken as equal to worker 0)
    dyn = [r for r in runs if r["workers"] == w and r["mode"] == "dynamic"]
    c0 = statistics.median(r["chunks_trained_by_worker0"] for r in dyn)
    slow = dyn[0]["chunks"] - (w - 1) * c0
    f = c0 / slow if slow > 0 else float("inf")
    print(f"W={w}: static {' '.join(f'{x:.2f}' for x in t['static'])} s, dynamic {' '.join(f'{x:.2f}' for x in t['dynamic'])} s: "
          f"dynamic/static {ratio:.2f} (medians); the straggler trained {f:.1f}x slower than a fast worker "
          f"(worker 0: {c0:.0f} of {dyn[0]['chunks']} chunks), for which dynamic/static would be W/(f(W-1)+1) = {w / (f * (w - 1) + 1):.2f}")
PY
