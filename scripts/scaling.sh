#!/usr/bin/env bash
# Strong and weak scaling of `train linear` (or `train dnn`, JOB=dnn) on an emulated cluster
# (issue 29, item 2): every
# node (coordinator, S servers, W workers) runs in its own network namespace, a "machine"
# with one full-duplex link of RATE to a shared bridge (tbf both ways; this kernel has no
# netem, so no added delay) and a CPU quota of CPU cores (a cgroup-v1 cpu controller group
# per node), so that W + S + 1 machines of one fixed speed fit on this machine's 2 cores.
#
#   strong: EXAMPLES examples in all, W = each of WS workers;
#   weak:   PER_WORKER examples per worker (a file of W × PER_WORKER examples).
# One epoch of async SGD (`--algorithm sgd`), S servers; with JOB=dnn, DNN_EPOCHS of Downpour
# SGD (`train dnn --algorithm downpour`, the MLP) on the MNIST files of DNN_DATA, strong: all of
# its training examples, weak: DNN_PER_WORKER per worker. Prints one line per run: examples/s,
# speed-up and efficiency against W = 1, worker 0's idle fraction, bytes on the wire per
# example, test AUC; and writes them as JSON lines to DIR/scaling.jsonl, the per-example
# costs (workers' from the first run, servers' from the run that loaded them most) to
# DIR/calibration-S<SERVERS>.json, and the planner's prediction of every run (from every
# calibration in DIR) to DIR/validation.jsonl.
#
# Usage (root; a release build first): scripts/scaling.sh [DIR]
# Environment: RATE (10gbit), CPU (0.1), WS ("1 2 4 8 16"), SERVERS (2), EXAMPLES (400000),
# PER_WORKER (100000), MODES ("strong weak"), PERIOD_US (the quotas' period, 10000: the
# kernel's smallest quota is 1 ms a period, so CPU below 0.1 needs a longer one),
# DOWNPOUR_BIN, JOB (linear), DNN_DATA (../shared/data/mnist, else data/mnist-sample),
# DNN_EPOCHS (1), DNN_PER_WORKER (3750). Everything it creates is named dps* (namespaces, links, cgroups) and removed
# on exit; the data stays in DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=$(realpath -m "${1:-/tmp/downpour-scaling}")
RATE=${RATE:-10gbit}
CPU=${CPU:-0.1}
WS=${WS:-"1 2 4 8 16"}
S=${SERVERS:-2}
EXAMPLES=${EXAMPLES:-400000}
PER_WORKER=${PER_WORKER:-100000}
MODES=${MODES:-"strong weak"}
JOB=${JOB:-linear}
DNN_DATA=${DNN_DATA:-$( [ -d ../shared/data/mnist ] && echo ../shared/data/mnist || echo data/mnist-sample )}
DNN_DATA=$(realpath -m "$DNN_DATA")
DNN_EPOCHS=${DNN_EPOCHS:-1}
DNN_PER_WORKER=${DNN_PER_WORKER:-3750}
case "$JOB" in linear|dnn) ;; *) echo "scaling.sh: JOB is linear or dnn, not $JOB" >&2; exit 2 ;; esac
BIN=$(realpath "${DOWNPOUR_BIN:-target/release/downpour}")
CG=/sys/fs/cgroup/cpu
ACCT=/sys/fs/cgroup/cpuacct
[ "$(id -u)" = 0 ] || { echo "scaling.sh: needs root (network namespaces, cgroups)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "scaling.sh: no $BIN (cargo build --release first)" >&2; exit 2; }
[ -d "$CG" ] || { echo "scaling.sh: no cgroup-v1 cpu controller at $CG" >&2; exit 2; }
mkdir -p "$DIR"
# (a 10 ms period by default: a throttled node waits at most that long, not the kernel's
# default 100 ms)
PERIOD_US=${PERIOD_US:-10000}
QUOTA=$(python3 -c "print(int($CPU * $PERIOD_US))")
[ "$QUOTA" -ge 1000 ] || { echo "scaling.sh: CPU $CPU is below the smallest quota, 1 ms a period of $PERIOD_US µs" >&2; exit 2; }

NODES=()
cleanup() {
    for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^dps-/ { print $1 }'); do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
        ip link del "v-$ns" 2>/dev/null || true
    done
    for g in "$CG"/dps-* "$ACCT"/dps-*; do [ -d "$g" ] && rmdir "$g" 2>/dev/null || true; done
    ip link del dpsbr0 2>/dev/null || true
}
trap cleanup EXIT
cleanup

data() { # FILE N [START]: N synth-ctr examples from index START (made once)
    [ -s "$1" ] || "$BIN" --log warn data synth-ctr --examples "$2" --start "${3:-0}" --nnz 20 --key-space 10000000 --zipf 1.1 --seed 7 --out "$1" >/dev/null 2>&1
}
# held-out examples past any training file (runs before 2026-11-27 tested on the first 10,000
# training examples: partly in-sample, the more so the smaller the training file)
data "$DIR/test-heldout.svm" 10000 100000000

machines() { # coordinator, S servers, W workers: namespaces on the bridge, shaped, with a CPU group
    local w=$1 i ns
    ip link add dpsbr0 type bridge && ip link set dpsbr0 up
    NODES=(dps-c)
    for ((i = 0; i < S; i++)); do NODES+=("dps-s$i"); done
    for ((i = 0; i < w; i++)); do NODES+=("dps-w$i"); done
    i=2
    for ns in "${NODES[@]}"; do
        ip netns add "$ns"
        ip link add "v-$ns" type veth peer name eth0 netns "$ns"
        ip link set "v-$ns" master dpsbr0 up
        ip -n "$ns" addr add "10.79.0.$i/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        tc qdisc add dev "v-$ns" root tbf rate "$RATE" burst 4mb latency 50ms
        ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 4mb latency 50ms
        mkdir -p "$CG/$ns" "$ACCT/$ns"
        echo "$PERIOD_US" > "$CG/$ns/cpu.cfs_period_us"
        echo "$QUOTA" > "$CG/$ns/cpu.cfs_quota_us"
        i=$((i + 1))
    done
}
on() { # NS LOG COMMAND...: runs COMMAND on machine NS (its namespace and CPU group)
    local ns=$1 log=$2; shift 2
    sh -c 'echo $$ > "$0/cgroup.procs"; echo $$ > "$1/cgroup.procs"; ns=$2; shift 2; exec ip netns exec "$ns" "$@"' "$CG/$ns" "$ACCT/$ns" "$ns" "$@" >"$log" 2>&1 &
}
cpu_s() { # the CPU seconds the machines matching GLOB used
    local t=0 f
    for f in $ACCT/$1/cpuacct.usage; do t=$((t + $(cat "$f"))); done
    python3 -c "print($t / 1e9)"
}

: > "$DIR/scaling.jsonl"
for mode in $MODES; do
    base=""
    for w in $WS; do
        if [ "$JOB" = linear ]; then
            if [ "$mode" = strong ]; then n=$EXAMPLES; else n=$((w * PER_WORKER)); fi
            train="$DIR/train-$n.svm"
            data "$train" "$n"
            job=(train linear --train "$train" --test "$DIR/test-heldout.svm" --epochs 1 --algorithm sgd)
        else
            limit=0
            [ "$mode" = strong ] || limit=$((w * DNN_PER_WORKER))
            job=(train dnn --data "$DNN_DATA" --algorithm downpour --epochs "$DNN_EPOCHS" --train-limit "$limit" --test-limit 2000)
        fi
        cleanup
        machines "$w"
        run="$DIR/run-$mode-$w"
        rm -rf "$run" && mkdir -p "$run"
        on dps-c "$run/coordinator.log" "$BIN" --log warn coordinator --listen 10.79.0.2:7070 --servers "$S" --workers "$w"
        sleep 0.3
        for ((i = 0; i < S; i++)); do on "dps-s$i" "$run/server-$i.log" "$BIN" --log warn server --coordinator 10.79.0.2:7070 --listen "10.79.0.$((3 + i)):0"; done
        pids=()
        for ((i = 0; i < w; i++)); do
            on "dps-w$i" "$run/worker-$i.log" "$BIN" --log warn worker --coordinator 10.79.0.2:7070 "${job[@]}" --quiet --out "$run/metrics-$i.json"
            pids+=($!)
        done
        ok=1
        for p in "${pids[@]}"; do wait "$p" || ok=0; done
        [ "$ok" = 1 ] || { echo "scaling.sh: $mode W=$w failed:" >&2; tail -n 3 "$run"/*.log >&2; exit 1; }
        # (the servers end with the job: give them a moment, then read their CPU)
        for ns in dps-c $(for ((i = 0; i < S; i++)); do echo "dps-s$i"; done); do
            for _ in $(seq 50); do [ -z "$(ip netns pids "$ns")" ] && break; sleep 0.1; done
        done
        wcpu=$(cpu_s 'dps-w*'); scpu=$(cpu_s 'dps-s*')
        line=$(python3 - "$mode" "$w" "$S" "$RATE" "$CPU" "$base" "$wcpu" "$scpu" "$JOB" "$run"/metrics-*.json <<'PY'
import json, sys
mode, w, s, rate, cpu, base, wcpu, scpu, job = sys.argv[1:10]
m = [json.load(open(f)) for f in sys.argv[10:]]
first = m[0]
eps = first["examples_per_s"]
# (train linear: worker 0 writes the metrics, its bytes taken as every worker's; train dnn's
# bytes and examples are all workers')
per_ex = (first["bytes_sent"] + first["bytes_received"]) * (int(w) if job == "linear" else 1) / max(first["train_examples"], 1)
out = {"job": job, "mode": mode, "workers": int(w), "servers": int(s), "rate": rate, "cpu_per_node": float(cpu),
       "examples": first["train_examples"], "examples_per_s": eps, "wall_s": first["wall_s"],
       "idle_fraction_worker0": first.get("idle_fraction", 0.0), "wire_bytes_per_example": per_ex,
       "test_auc": first.get("test_auc"), "test_accuracy": first.get("test_accuracy"),
       "worker_cpu_s_per_example": float(wcpu) / max(first["train_examples"], 1),
       "server_cpu_s_per_example": float(scpu) / max(first["train_examples"], 1)}
if base:
    b = float(base)
    out["speedup"] = eps / b
    out["efficiency"] = eps / b / int(w) if mode == "strong" else eps / (b * int(w))
print(json.dumps(out))
PY
)
        echo "$line" >> "$DIR/scaling.jsonl"
        [ -n "$base" ] || base=$(python3 -c "import json,sys; print(json.loads(sys.argv[1])['examples_per_s'])" "$line")
        python3 -c "
import json, sys
r = json.loads(sys.argv[1])
q = f\"AUC {r['test_auc']:.4f}\" if r['test_auc'] is not None else f\"accuracy {r['test_accuracy']:.4f}\"
print(f\"{r['mode']:6} W={r['workers']:2} S={r['servers']}: {r['examples_per_s']:10.0f} ex/s  speed-up {r.get('speedup', 1.0):5.2f}  efficiency {r.get('efficiency', 1.0):4.2f}  idle {r['idle_fraction_worker0']:.2f}  {r['wire_bytes_per_example']:6.0f} B/ex  {q}\")" "$line"
    done
done
cleanup

# the planner's costs at these servers, from the first mode's runs (the workers' from W = 1,
# the servers' from the run that loaded them most: scripts/plan_validate.py says why), then
# the planner against every run (from every calibration in DIR: at two server counts each cost
# is a line in the servers)
DOWNPOUR_BIN="$BIN" python3 scripts/plan_validate.py calibrate "$DIR/scaling.jsonl" "$DIR/calibration-S$S.json"
cals=()
for f in "$DIR"/calibration-S*.json; do cals+=(--calibration "$f"); done
echo "planner (calibrations: ${cals[*]})"
DOWNPOUR_BIN="$BIN" python3 scripts/plan_validate.py validate "$DIR/validation.jsonl" "$DIR/scaling.jsonl" "${cals[@]}"
for w in 100 1000; do
    "$BIN" --log warn plan --job "$JOB" --workers "$w" --cpu "$CPU" --link "$RATE" "${cals[@]}" > "$DIR/plan-$w.txt"
    head -n 1 "$DIR/plan-$w.txt"
done
