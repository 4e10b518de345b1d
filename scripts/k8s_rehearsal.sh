#!/usr/bin/env bash
# Rehearses the Kubernetes base (deploy/k8s) on this machine: every pod a network namespace
# (a "host" on a shared bridge), names resolved as the headless Service would resolve them
# (each namespace's /etc/hosts), and each pod running the command its manifest gives, with
# the ConfigMap's variables and the token in its environment. The workers run the counter
# job in place of the manifest's training job (it checks that every update arrived exactly
# once). While they run, the script does to the servers what Kubernetes does to pods: server
# 1's pod dies and is replaced (same name and address: it registers as a new server and joins
# the ring), the StatefulSet is scaled up (server 2 joins) and back down (server 2's pod runs
# its preStop hook: it drains itself, exits, and the pod goes). Passes when both workers'
# counters are exact and the coordinator served the four routing epochs.
#
# Usage (root; a release build first): scripts/k8s_rehearsal.sh [ROUNDS]
# Everything it creates is named dpk* (namespaces, links, /etc/netns/dpk-*) and removed on
# exit. Environment: DOWNPOUR_BIN (default target/release/downpour).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${1:-20000}
BIN=$(realpath "${DOWNPOUR_BIN:-target/release/downpour}")
[ "$(id -u)" = 0 ] || { echo "k8s_rehearsal.sh: needs root (network namespaces)" >&2; exit 2; }
[ -x "$BIN" ] || { echo "k8s_rehearsal.sh: no $BIN (cargo build --release first)" >&2; exit 2; }

NS=ml
PODS=(dpk-c dpk-s0 dpk-s1 dpk-s2 dpk-w0 dpk-w1)
declare -A IP=([dpk-c]=10.78.0.2 [dpk-s0]=10.78.0.10 [dpk-s1]=10.78.0.11 [dpk-s2]=10.78.0.12 [dpk-w0]=10.78.0.20 [dpk-w1]=10.78.0.21)
WORK=""

cleanup() {
    for p in "${PODS[@]}"; do
        ip netns pids "$p" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$p" 2>/dev/null || true
        ip link del "v-$p" 2>/dev/null || true
        rm -rf "/etc/netns/$p"
    done
    ip link del dpkbr0 2>/dev/null || true
    [ -z "$WORK" ] || rm -rf "$WORK"
}
trap cleanup EXIT
cleanup 2>/dev/null || true
WORK=$(mktemp -d)

# the names the Services give: the coordinator's, and each server pod's under the headless one
HOSTS="127.0.0.1 localhost
${IP[dpk-c]} downpour-coordinator downpour-coordinator.$NS.svc
${IP[dpk-s0]} downpour-server-0.downpour-server.$NS.svc
${IP[dpk-s1]} downpour-server-1.downpour-server.$NS.svc
${IP[dpk-s2]} downpour-server-2.downpour-server.$NS.svc"

ip link add dpkbr0 type bridge
ip link set dpkbr0 up
pod_up() { # a pod's "host": its namespace, its link to the bridge, its /etc/hosts
    local p=$1
    mkdir -p "/etc/netns/$p"
    echo "$HOSTS" > "/etc/netns/$p/hosts"
    ip netns add "$p"
    ip link add "v-$p" type veth peer name eth0 netns "$p"
    ip link set "v-$p" master dpkbr0 up
    ip -n "$p" addr add "${IP[$p]}/24" dev eth0
    ip -n "$p" link set eth0 up
    ip -n "$p" link set lo up
}
pod_down() { # the pod deleted: its processes killed, its host gone
    local p=$1
    ip netns pids "$p" | xargs -r kill -9 2>/dev/null || true
    ip netns del "$p"
    ip link del "v-$p" 2>/dev/null || true
}
for p in "${PODS[@]}"; do pod_up "$p"; done

# each manifest's container command, its variables expanded as Kubernetes expands them
commands=$(python3 - "$NS" <<'PY'
import pathlib, re, sys, yaml
k8s = pathlib.Path("deploy/k8s")
docs = [d for f in yaml.safe_load((k8s / "kustomization.yaml").read_text())["resources"] for d in yaml.safe_load_all((k8s / f).read_text()) if d]
config = next(d["data"] for d in docs if d["kind"] == "ConfigMap")
for d in docs:
    if d["kind"] in ("StatefulSet", "Job"):
        c = d["spec"]["template"]["spec"]["containers"][0]
        env = dict(config, POD_NAME="@POD@", POD_NAMESPACE=sys.argv[1])
        print(c["name"], " ".join(re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]))
        hook = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
        if hook:
            print("prestop-" + c["name"], hook[-1])
for k, v in config.items():
    print("env", f"{k}={v}")
PY
)
cmd_of() { echo "$commands" | awk -v r="$1" '$1 == r { $1 = ""; print substr($0, 2) }'; }
ENV=($(echo "$commands" | awk '$1 == "env" { print $2 }') "DOWNPOUR_AUTH_TOKEN=rehearsal-token-0123456789abcdef")
run_pod() { # POD NAME LOG COMMAND...: runs COMMAND in POD's namespace with the pod's environment
    local p=$1 name=$2 log=$3; shift 3
    ip netns exec "$p" env "${ENV[@]}" "$BIN" "$@" >"$log" 2>&1 &
}

# a preStop hook runs `downpour` from the image's PATH
mkdir -p "$WORK/bin" && ln -s "$BIN" "$WORK/bin/downpour"
prestop=$(cmd_of prestop-server)
coord=$(cmd_of coordinator)
server=$(cmd_of server)
worker=$(cmd_of worker)
echo "coordinator: downpour ${coord}"
echo "server:      downpour ${server}"
echo "worker:      downpour ${worker%% train *} counter --keys 2000 --rounds $ROUNDS"
# (the coordinator's state volume is a directory here)
run_pod dpk-c coordinator "$WORK/coordinator.log" ${coord//\/state/$WORK/state}
sleep 0.3
start_server() { run_pod "dpk-s$1" "server-$1" "$WORK/server-$1.log" ${server//@POD@/downpour-server-$1}; }
start_server 0
start_server 1
wpids=()
for j in 0 1; do
    run_pod "dpk-w$j" "worker-$j" "$WORK/worker-$j.log" ${worker%% train *} counter --keys 2000 --rounds "$ROUNDS"
    wpids+=($!)
done
running() { # the workers must still be at work when a pod goes or comes
    for p in "${wpids[@]}"; do kill -0 "$p" 2>/dev/null || { echo "k8s_rehearsal.sh: the job ended before: $1 (give more ROUNDS)" >&2; exit 1; }; done
}
sleep 1.5
running "the replacement of server 1"
echo "[rehearsal] server 1's pod dies; its replacement (same name) starts"
pod_down dpk-s1; pod_up dpk-s1; start_server 1
sleep 1.5
running "the scale-up"
echo "[rehearsal] the StatefulSet scales up: server 2 starts"
start_server 2
sleep 1.5
running "the scale-down"
echo "[rehearsal] the StatefulSet scales down: server 2's pod runs its preStop hook (a drain), then goes"
ip netns exec dpk-s2 env "${ENV[@]}" POD_NAME=downpour-server-2 POD_NAMESPACE="$NS" PATH="$WORK/bin:$PATH" \
    timeout 60 sh -c "$prestop" >"$WORK/prestop-2.log" 2>&1 || { echo "k8s_rehearsal.sh: the preStop hook failed" >&2; cat "$WORK/prestop-2.log" >&2; exit 1; }
grep -q "being drained" "$WORK/prestop-2.log" || { echo "k8s_rehearsal.sh: the preStop hook did not drain" >&2; cat "$WORK/prestop-2.log" >&2; exit 1; }
# (its endpoint closes as it stops; the process ends a moment later)
for _ in $(seq 50); do [ -z "$(ip netns pids dpk-s2)" ] && break; sleep 0.1; done
[ -z "$(ip netns pids dpk-s2)" ] || { echo "k8s_rehearsal.sh: server 2 still runs 5 s after its preStop hook" >&2; cat "$WORK/prestop-2.log" >&2; exit 1; }
pod_down dpk-s2
ok=1
for p in "${wpids[@]}"; do
    timeout 120 tail --pid="$p" -f /dev/null || ok=0
    wait "$p" || ok=0
done
grep -h "counter:" "$WORK"/worker-*.log || true
grep -h "routing epoch .* served" "$WORK/coordinator.log" | sed 's/^.*INFO //' || true
exact=$(grep -h "counter: OK" "$WORK"/worker-*.log | wc -l)
# epochs 2..5: the loss, the replacement's join, the scale-up's join, the scale-down's drain
served=$(grep -c "routing epoch .* served" "$WORK/coordinator.log" || true)
if [ "$ok" != 1 ] || [ "$exact" != 2 ] || [ "$served" -lt 4 ]; then
    echo "k8s_rehearsal.sh: FAILED ($exact of 2 workers exact, $served routing epochs served of 4); the logs:" >&2
    tail -n 5 "$WORK"/*.log >&2
    exit 1
fi
echo "k8s_rehearsal.sh: OK: both workers' counters exact through a pod replacement, a scale-up and a scale-down (drained)"
