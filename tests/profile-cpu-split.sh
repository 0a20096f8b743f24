#!/usr/bin/env bash
# Where the whole machine's CPU goes at one concurrency level, every process
# counted (docs/evidence/performance.md, "Before and after, and the whole
# machine's CPU by process"): the release `loadgen` runs one level, and
# while its requests are being sent and answered `perf record -a` samples
# both cores for SECONDS, whatever
# runs on them: the server's request workers and the load generator
# (`tokio-rt-worker`), the group-commit writer's thread (`audit-writer`;
# SQLite's own work runs on sqlx's thread beside it, `sqlx-sqlite-worker`,
# which perf shows cut to 15 characters, as the kernel keeps them),
# the Postgres server's processes (`postgres`) and the idle time
# (`swapper`). Each share is then turned into microseconds of one core per
# issuance, at the throughput `loadgen` measured: what each part costs an
# issuance, to set against the budget a target gives (two cores at 6,000/s
# leave 333 µs per issuance, in all). tests/profile-perf.sh splits the
# server's own process by part of the request path, with call stacks, but
# sees no other process.
#   tests/profile-cpu-split.sh [STORE] [CONCURRENCY] [REQUESTS] [SECONDS]
# Needs perf (Debian's linux-perf) and, for Postgres, the database as the
# tests do (DATABASE_URL, default 127.0.0.1:5432).
set -euo pipefail
store=${1:-postgres} concurrency=${2:-64} requests=${3:-20000} seconds=${4:-2.5}
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
out=$(mktemp -d)
(cd "$repo" && cargo build -q --release --locked -p talos-sso-tests --bin loadgen)
"$repo/target/release/loadgen" --requests "$requests" --concurrency "$concurrency" --store "$store" \
  >"$out/loadgen.txt" 2>"$out/stderr.txt" &
pid=$!
until grep -q ': sending$' "$out/stderr.txt" 2>/dev/null; do
  kill -0 "$pid" 2>/dev/null || { cat "$out/stderr.txt" >&2; exit 1; }
  sleep 0.1
done
# Past the clients' first requests, which all connect at once.
sleep 0.5
perf record -q -a -F 999 -o "$out/perf.data" -- sleep "$seconds" 2>/dev/null
ended_early=no
grep -q ': answered$' "$out/stderr.txt" && ended_early=yes
wait "$pid"
cat "$out/loadgen.txt"
echo
if [ "$ended_early" = yes ]; then
  echo "the level ended before the sampling did: run more requests" >&2
  exit 1
fi
throughput=$(grep -E "^\| [A-Za-z]+ \| File \| $concurrency \|" "$out/loadgen.txt" | cut -d'|' -f5 | tr -d ' ')
if [ -z "$throughput" ]; then
  echo "loadgen printed no row for concurrency $concurrency (its output: $out/loadgen.txt)" >&2
  exit 1
fi
perf report -q -i "$out/perf.data" --sort comm --stdio 2>/dev/null \
  | python3 -c '
import sys
throughput, cores = float(sys.argv[1]), int(sys.argv[2])
print(f"| process (command name) | share of both cores | µs of one core per issuance at {throughput:,.0f}/s |")
print("|---|---:|---:|")
for line in sys.stdin:
    parts = line.split()
    if len(parts) < 2 or not parts[0].endswith("%"):
        continue
    share = float(parts[0].rstrip("%"))
    if share < 0.5:
        continue
    name = " ".join(parts[1:])
    note = " (idle)" if name == "swapper" else ""
    print(f"| {name}{note} | {share:.1f}% | {share / 100 * cores * 1e6 / throughput:.0f} |")
' "$throughput" "$(nproc)"
echo "perf output: $out/perf.data (perf report -i ... --sort comm,sym)"
