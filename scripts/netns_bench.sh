#!/usr/bin/env bash
# Push/pull throughput with replication K=1 and K=2 on an emulated cluster network: every
# node (coordinator, 3 servers, 2 workers) runs in its own network namespace, a "host"
# with one full-duplex link of RATE to a shared bridge (a veth pair shaped by tbf in both
# directions). With links slower than what this machine's CPUs can move, the network
# bounds the push, as on the paper's 10 GbE cluster, instead of the two vCPUs that every
# co-located process shares (the `downpour bench` numbers).
#
# Usage (root; a release build first): scripts/netns_bench.sh [RATE] [SIZE] [ITERS] [OPS]
#   RATE   link rate as tc writes it (default 1gbit)
#   SIZE   dense push size (default 16MiB)
#   ITERS  timed iterations per worker and case (default 20)
#   OPS    bench operations (default push,pull)
# Prints one line per K and operation: aggregate GB/s of the workers (payload bytes over
# the slowest worker's time), then the K=2/K=1 ratio. Everything it creates is named dp*
# and removed on exit. Environment: DOWNPOUR_BIN (default target/release/downpour),
# KS (default "1 2"), COORD_ARGS (extra coordinator flags, e.g. "--vnodes 64"), BURST and
# QLAT (the shaper's burst and queue, default 2mb and 50ms); DOWNPOUR_* settings reach
# every node. (No link delay: this machine's kernel has no netem.)
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${1:-1gbit}
SIZE=${2:-16MiB}
ITERS=${3:-20}
OPS=${4:-push,pull}
BIN=$(realpath "${DOWNPOUR_BIN:-target/release/downpour}")
KS=${KS:-"1 2"}
[ "$(id -u)" = 0 ] || { echo "netns_bench.sh: needs root (network namespaces)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "netns_bench.sh: no $BIN (cargo build --release first)" >&2; exit 2; }

case "$SIZE" in
    *MiB) BYTES=$(( ${SIZE%MiB} << 20 )) ;;
    *KiB) BYTES=$(( ${SIZE%KiB} << 10 )) ;;
    *) BYTES=$SIZE ;;
esac

NODES=(dpc dps0 dps1 dps2 dpw0 dpw1)
declare -A IP=([dpc]=10.77.0.1 [dps0]=10.77.0.10 [dps1]=10.77.0.11 [dps2]=10.77.0.12 [dpw0]=10.77.0.20 [dpw1]=10.77.0.21)
WORK=""

cleanup() {
    for ns in "${NODES[@]}"; do
        ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
        ip link del "v-$ns" 2>/dev/null || true
    done
    ip link del dpbr0 2>/dev/null || true
    [ -z "$WORK" ] || rm -rf "$WORK"
}
trap cleanup EXIT
cleanup 2>/dev/null || true
WORK=$(mktemp -d)

# shapes egress of DEV (in namespace NS, or the root one) to RATE
shape() {
    local ns=$1 dev=$2 run=()
    [ -n "$ns" ] && run=(ip netns exec "$ns")
    "${run[@]}" tc qdisc add dev "$dev" root tbf rate "$RATE" burst ${BURST:-2mb} latency ${QLAT:-50ms}
}

ip link add dpbr0 type bridge
ip link set dpbr0 up
for ns in "${NODES[@]}"; do
    ip netns add "$ns"
    ip link add "v-$ns" type veth peer name eth0 netns "$ns"
    ip link set "v-$ns" master dpbr0 up
    ip -n "$ns" addr add "${IP[$ns]}/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    shape "" "v-$ns"   # into the host
    shape "$ns" eth0   # out of the host
done

in_ns() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

declare -A RESULT
for K in $KS; do
    out="$WORK/k$K"
    mkdir -p "$out"
    in_ns dpc "$BIN" coordinator --listen "${IP[dpc]}:7070" --servers 3 --workers 2 --replication "$K" ${COORD_ARGS:-} --log warn >"$out/coord.log" 2>&1 &
    sleep 0.3
    for i in 0 1 2; do
        in_ns "dps$i" "$BIN" server --coordinator "${IP[dpc]}:7070" --listen "${IP[dps$i]}:0" --log warn >"$out/server$i.log" 2>&1 &
    done
    wpids=()
    for j in 0 1; do
        in_ns "dpw$j" "$BIN" worker --coordinator "${IP[dpc]}:7070" --log warn bench-job --sizes "$BYTES" \
            --iters "$ITERS" --latency-iters 0 --sparse-keys 0 --ops "$OPS" >"$out/worker$j.out" 2>"$out/worker$j.log" &
        wpids+=($!)
    done
    ok=1
    for p in "${wpids[@]}"; do wait "$p" || ok=0; done
    if [ "$ok" != 1 ]; then
        echo "K=$K: a worker failed; its log:" >&2
        tail -5 "$out"/worker*.log >&2
        exit 1
    fi
    # the servers and the coordinator end with the job
    for ns in dpc dps0 dps1 dps2; do
        for _ in $(seq 50); do [ -z "$(ip netns pids "$ns")" ] && break; sleep 0.1; done
        ip netns pids "$ns" | xargs -r kill -9 2>/dev/null || true
    done
    while read -r op gbps; do
        RESULT[$K,$op]=$gbps
        printf 'K=%s %-15s %6.3f GB/s  (%s links, %s per push, %s iterations per worker)\n' "$K" "$op" "$gbps" "$RATE" "$SIZE" "$ITERS"
    done < <(python3 - "$out"/worker*.out <<'EOF'
import json, sys, collections
pay = collections.defaultdict(int); secs = collections.defaultdict(float)
for f in sys.argv[1:]:
    for line in open(f):
        if line.startswith("BENCH "):
            s = json.loads(line[6:])
            if s["case"] == "dense":
                pay[s["op"]] += s["payload"]; secs[s["op"]] = max(secs[s["op"]], s["secs"])
for op in pay:
    print(op, pay[op] / secs[op] / 1e9)
EOF
)
done
if [[ " $KS " == *" 1 "* && " $KS " == *" 2 "* ]]; then
    for op in ${OPS//,/ }; do
        [ -n "${RESULT[1,$op]:-}" ] && [ -n "${RESULT[2,$op]:-}" ] &&
            python3 -c "print(f'ratio K=2/K=1 $op: {${RESULT[2,$op]} / ${RESULT[1,$op]}:.2f}')"
    done
fi
