#!/usr/bin/env bash
# Runs every libFuzzer harness of BUILD_DIR/bin (fuzz_*) for SECONDS each on BUILD_DIR/seeds/<name>,
# keeping each corpus in BUILD_DIR/corpus/<name>; prints executions per harness and fails on the
# first crash, leak, timeout or out-of-memory (the reproducer is left in BUILD_DIR/crashes/).
#   tools/run_fuzzers.sh build-fuzz 20 [name ...]
set -euo pipefail
build=${1:?build dir}
seconds=${2:-20}
shift 2 || true
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for b in "$build"/bin/fuzz_*; do names+=("$(basename "$b" | sed 's/^fuzz_//')"); done
fi
mkdir -p "$build/crashes"
status=0
printf '%-12s %12s %10s %s\n' harness executions exec/s result
for n in "${names[@]}"; do
  mkdir -p "$build/corpus/$n" "$build/seeds/$n"
  log="$build/fuzz_$n.log"
  set +e
  "$build/bin/fuzz_$n" -max_total_time="$seconds" -timeout=20 -rss_limit_mb=2560 -max_len=1048576 \
    -print_final_stats=1 -artifact_prefix="$build/crashes/${n}-" \
    "$build/corpus/$n" "$build/seeds/$n" >"$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  rate=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
  if [ $rc -eq 0 ]; then result=ok; else result="FAILED (rc $rc, see $log)"; status=1; fi
  printf '%-12s %12s %10s %s\n' "$n" "${execs:-0}" "${rate:-0}" "$result"
  if [ $rc -ne 0 ]; then grep -m5 -E 'ERROR|SUMMARY|Test unit written' "$log" || true; fi
done
exit $status
