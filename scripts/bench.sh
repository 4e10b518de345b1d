#!/usr/bin/env bash
# Reproduces docs/benchmarks.md: one iperf3 loopback stream (the physical baseline), then
# `downpour bench` in local multi-process mode, 1 server + 1 worker and 2 servers + 2 workers,
# all in the same run. Needs iperf3 (apt-get install iperf3). Output: JSON lines on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q
BIN=target/release/downpour
PORT=${IPERF_PORT:-5299}
if command -v iperf3 >/dev/null; then
  iperf3 -s -1 -p "$PORT" >/dev/null 2>&1 &
  sleep 0.5
  iperf3 -c 127.0.0.1 -p "$PORT" -t 5 -J | python3 -c 'import json,sys; d=json.load(sys.stdin); print(json.dumps({"case":"iperf3","streams":1,"gbps":d["end"]["sum_received"]["bits_per_second"]/8e9}))'
else
  echo '{"case":"iperf3","error":"iperf3 not installed"}'
fi
"$BIN" --log warn bench --servers 1 --workers 1 --json "$@"
"$BIN" --log warn bench --servers 2 --workers 2 --json --sizes 16MiB --latency-iters 0 --sparse-keys 0 "$@"
