#!/usr/bin/env bash
# Issuances per second of two commits, measured alternately so that both
# see the same machine (docs/evidence/performance.md): builds `loadgen` in release
# mode from BEFORE and from AFTER (each in a fresh clone with its own target
# directory), then runs them in turn, RUNS times each, with 4,000 requests
# per level, and prints each level's row and the run's crypto floor, after
# the load average of the minute before the run (anything above the runs'
# own load is another program taking the cores).
#   tests/loadgen-compare.sh BEFORE AFTER [RUNS] [STORES] [CONCURRENCY]
# STORES: postgres (the default), sqlite, or both (postgres,sqlite);
# CONCURRENCY: 64 (the default), or a list such as 1,16,64.
# Needs Postgres as the tests do (DATABASE_URL, default 127.0.0.1:5432).
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
before=$1 after=$2 runs=${3:-5} stores=${4:-postgres} concurrency=${5:-64}
work=$(mktemp -d)
unset CARGO_TARGET_DIR
for name in before after; do
  commit=${!name}
  git clone -q "$repo" "$work/$name"
  git -C "$work/$name" checkout -q "$commit"
  (cd "$work/$name" && cargo build -q --release --locked -p talos-sso-tests --bin loadgen)
done
for run in $(seq "$runs"); do
  for name in before after; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    "$work/$name/target/release/loadgen" --requests 4000 --concurrency "$concurrency" --store "$stores" 2>/dev/null \
      | grep -E '^\| (Postgres|Sqlite) \| (File \| )?([0-9]+|crypto floor) \|' \
      | sed "s/^/$name $run load $load /"
  done
done
echo "clones in $work"
