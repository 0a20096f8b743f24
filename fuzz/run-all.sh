#!/usr/bin/env bash
# Fuzz every target (or those named) for SECONDS each (default 600), two at
# a time, and print per target: executions per second, total executions,
# coverage (libFuzzer's final `cov:` and `ft:`), the corpus it ended with
# and its findings (files in fuzz/artifacts/<target>/).
#
#   fuzz/run-all.sh [SECONDS] [TARGET...]
#   fuzz/run-all.sh report [TARGET...]     # the table of the last runs again
#   fuzz/run-all.sh cmin [TARGET...]       # minimise each corpus with what the last run found
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`). The stable
# toolchain builds the sanitizer flags that cargo-fuzz passes only with
# RUSTC_BOOTSTRAP=1, which this script sets. Each target starts from its
# committed corpus and regressions (read only) and grows a working corpus
# in fuzz/target/run/<target>/corpus; `run-all.sh cmin` keeps what it
# found, minimised, in fuzz/corpus/<target>. Logs: fuzz/target/run/<target>/log.
# FUZZ_JOBS sets how many targets run at once (default 2).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-600}
shift || true
if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  targets=()
  for file in fuzz/fuzz_targets/*.rs; do
    targets+=("$(basename "$file" .rs)")
  done
fi
jobs=${FUZZ_JOBS:-2}
export RUSTC_BOOTSTRAP=1
report_only=false
if [ "$seconds" = report ]; then
  report_only=true # `fuzz/run-all.sh report [TARGET...]`: the table of the last runs
fi
if [ "$seconds" = cmin ]; then
  # `fuzz/run-all.sh cmin [TARGET...]`: what `cargo fuzz cmin` does, over the
  # committed corpus and the last run's working corpus together: the
  # smallest set of inputs with the same coverage becomes fuzz/corpus/<target>.
  for target in "${targets[@]}"; do
    merged=fuzz/target/cmin/$target
    rm -rf "$merged" && mkdir -p "$merged"
    "fuzz/target/x86_64-unknown-linux-gnu/release/$target" -merge=1 -timeout=5 -rss_limit_mb=2048 \
      -artifact_prefix="fuzz/artifacts/$target/" "$merged" "fuzz/corpus/$target" \
      "fuzz/target/run/$target/corpus" >"fuzz/target/cmin/$target.log" 2>&1
    rm -rf "fuzz/corpus/$target" && mv "$merged" "fuzz/corpus/$target"
    echo "$target: $(find "fuzz/corpus/$target" -type f | wc -l) inputs, $(du -sk "fuzz/corpus/$target" | cut -f1) KiB"
  done
  exit 0
fi

$report_only || cargo fuzz build --fuzz-dir fuzz --features libfuzzer

run_one() {
  local target=$1 dir=fuzz/target/run/$1
  rm -rf "$dir"
  mkdir -p "$dir/corpus" "fuzz/regressions/$target"
  local started=$SECONDS
  mkdir -p "fuzz/artifacts/$target"
  # The binary `cargo fuzz run` would run, with the flags it would pass
  # (artifact prefix), run directly: built once above, not per target.
  "fuzz/target/x86_64-unknown-linux-gnu/release/$target" -artifact_prefix="fuzz/artifacts/$target/" \
    -max_total_time="$seconds" -timeout=5 -rss_limit_mb=2048 -print_final_stats=1 \
    "$dir/corpus" "fuzz/corpus/$target" "fuzz/regressions/$target" \
    >"$dir/log" 2>&1 || true
  echo $((SECONDS - started)) >"$dir/wall"
}

running=0
$report_only && targets_to_run=() || targets_to_run=("${targets[@]}")
for target in "${targets_to_run[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  echo "fuzzing $target for ${seconds}s" >&2
  run_one "$target" &
  running=$((running + 1))
done
wait

printf '%-16s %8s %12s %7s %8s %8s %10s %s\n' target exec/s execs cov ft corpus seconds findings
for target in "${targets[@]}"; do
  dir=fuzz/target/run/$target
  last=$(grep -E '^#[0-9]+[[:space:]]+(DONE|INITED|pulse|NEW|REDUCE)' "$dir/log" | tail -n 1 || true)
  cov=$(sed -nE 's/.* cov: ([0-9]+).*/\1/p' <<<"$last")
  ft=$(sed -nE 's/.* ft: ([0-9]+).*/\1/p' <<<"$last")
  corpus=$(sed -nE 's/.* corp: ([0-9]+\/[0-9A-Za-z]+).*/\1/p' <<<"$last")
  execs=$(sed -nE 's/^stat::number_of_executed_units: *([0-9]+)/\1/p' "$dir/log" | tail -n 1)
  rate=$(sed -nE 's/^stat::average_exec_per_sec: *([0-9]+)/\1/p' "$dir/log" | tail -n 1)
  findings=$(find "fuzz/artifacts/$target" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) 2>/dev/null | wc -l)
  crashed=$(grep -cE '^==[0-9]+== ERROR: libFuzzer|^SUMMARY: libFuzzer|panicked at' "$dir/log" || true)
  printf '%-16s %8s %12s %7s %8s %8s %10s %s\n' "$target" "${rate:-?}" "${execs:-?}" "${cov:-?}" "${ft:-?}" \
    "${corpus:-?}" "$(cat "$dir/wall")" "$findings artifact(s)$([ "$crashed" -gt 0 ] && echo ', this run stopped on one')"
done
