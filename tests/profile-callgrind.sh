#!/usr/bin/env bash
# Instruction counts of the server's request path under load, which do not
# depend on what else the machine runs (docs/evidence/performance.md, "Where the
# time goes"): the release `loadgen` runs under callgrind with
# instrumentation off, and it is on only while one level's requests are
# sent and answered (not while tokens and CSRs are made, nor for the
# floors). Prints the functions with the most instructions, inclusive and
# self, and leaves callgrind.out for callgrind_annotate or KCachegrind.
#   tests/profile-callgrind.sh [STORE] [CONCURRENCY] [REQUESTS]
# Needs valgrind; Postgres as the tests do (DATABASE_URL).
set -euo pipefail
store=${1:-postgres} concurrency=${2:-64} requests=${3:-2000}
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$(mktemp -d)
(cd "$repo" && cargo build -q --release --locked -p talos-sso-tests --bin loadgen)
valgrind --tool=callgrind --instr-atstart=no --callgrind-out-file="$out/callgrind.out" \
  "$repo/target/release/loadgen" --requests "$requests" --concurrency "$concurrency" --store "$store" \
  >"$out/loadgen.txt" 2>"$out/stderr.txt" &
pid=$!
state=off
while kill -0 "$pid" 2>/dev/null; do
  if [ "$state" = off ] && grep -q ': sending$' "$out/stderr.txt"; then
    callgrind_control -i on "$pid" >/dev/null && state=on
  elif [ "$state" = on ] && grep -q ': answered$' "$out/stderr.txt"; then
    callgrind_control -i off "$pid" >/dev/null && state=done
  fi
  sleep 0.2
done
wait "$pid"
cat "$out/loadgen.txt"
echo
callgrind_annotate --inclusive=yes "$out/callgrind.out" >"$out/inclusive.txt"
callgrind_annotate "$out/callgrind.out" >"$out/self.txt"
sed -n 1,70p "$out/inclusive.txt"
echo
sed -n 20,70p "$out/self.txt"
echo "callgrind output: $out/callgrind.out"
