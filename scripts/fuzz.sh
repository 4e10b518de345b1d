#!/usr/bin/env bash
# Runs every fuzz target (fuzz/fuzz_targets, libFuzzer through cargo-fuzz) for SECONDS each
# (default 60; the security issue's bar is 600). Needs the nightly toolchain and cargo-fuzz,
# installed here when missing. A crash or hang stops the script with the input saved under
# fuzz/artifacts/TARGET/; reproduce it with `cargo +nightly fuzz run TARGET FILE` in fuzz/.
# Usage: scripts/fuzz.sh [SECONDS] [TARGET...]
set -euo pipefail
secs=${1:-60}
shift || true
cd "$(dirname "$0")/../fuzz"
rustup toolchain list | grep -q '^nightly' || rustup toolchain install nightly --profile minimal
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  mapfile -t targets < <(cargo +nightly fuzz list)
fi
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  extra=()
  [ -d "seeds/$t" ] && extra=("seeds/$t")
  echo "== $t: ${secs}s"
  log="corpus/$t.log"
  status=0
  cargo +nightly fuzz run -O "$t" "corpus/$t" "${extra[@]}" -- \
    -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 </dev/null >"$log" 2>&1 || status=$?
  # the progress lines stay in the log; the summary, and any crash, are shown
  grep -E '^(INFO: seed|stat::number_of_executed_units|stat::peak_rss_mb)|ERROR|SUMMARY|panicked|Test unit written' "$log" || true
  if [ "$status" -ne 0 ]; then
    echo "$t: the fuzzer found a crash or hang (full log: fuzz/$log; input under fuzz/artifacts/$t)"
    exit 1
  fi
done
echo "every target ran ${secs}s without a crash"
