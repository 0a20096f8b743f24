#!/usr/bin/env bash
# Where the CPU time of the request path goes, kernel included
# (docs/evidence/performance.md, "Where the time goes"): the release `loadgen` runs
# under `perf record` (software clock, DWARF call stacks) with sampling off,
# and it is on only while one level's requests are sent and answered, as in
# tests/profile-callgrind.sh. Callgrind counts instructions in user space
# only; this also sees system calls (SQLite writing and syncing its WAL,
# sockets, futexes) and the time the cores sat idle. Prints the share of
# the samples by part of the request path (tests/profile-perf-summary.py)
# and how busy the two cores were.
#   tests/profile-perf.sh [STORE] [CONCURRENCY] [REQUESTS]
# Needs perf (Debian's linux-perf); Postgres as the tests do (DATABASE_URL).
# With Postgres, the database server's own CPU is in another process: this
# profile does not see it.
set -euo pipefail
store=${1:-sqlite} concurrency=${2:-64} requests=${3:-12000}
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$(mktemp -d)
hz=1000
(cd "$repo" && cargo build -q --release --locked -p talos-sso-tests --bin loadgen)
mkfifo "$out/ctl" "$out/ack"
perf record -e cpu-clock -F "$hz" --call-graph dwarf,65528 -D -1 --control "fifo:$out/ctl,$out/ack" \
  -o "$out/perf.data" "$repo/target/release/loadgen" --requests "$requests" --concurrency "$concurrency" \
  --store "$store" >"$out/loadgen.txt" 2>"$out/stderr.txt" &
pid=$!
exec 3>"$out/ctl" 4<"$out/ack"
state=off started=0 ended=0
while kill -0 "$pid" 2>/dev/null; do
  if [ "$state" = off ] && grep -q ': sending$' "$out/stderr.txt"; then
    echo enable >&3 && read -r -t 5 <&4 || true
    state=on started=$(date +%s.%N)
  elif [ "$state" = on ] && grep -q ': answered$' "$out/stderr.txt"; then
    echo disable >&3 && read -r -t 5 <&4 || true
    state=done ended=$(date +%s.%N)
  fi
  sleep 0.2
done
wait "$pid"
cat "$out/loadgen.txt"
echo
perf script -i "$out/perf.data" -F comm,ip,sym 2>/dev/null >"$out/stacks.txt"
python3 "$repo/tests/profile-perf-summary.py" "$out/stacks.txt" \
  --seconds "$(python3 -c "print($ended - $started)")" --hz "$hz" --cores "$(nproc)"
echo "perf output: $out/perf.data (perf report -i ...), stacks: $out/stacks.txt"
