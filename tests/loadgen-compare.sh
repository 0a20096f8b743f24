#!/usr/bin/env bash
# Issuances per second of two commits, measured alternately so that both
# see the same machine (docs/performance.md): builds `loadgen` in release
# mode from BEFORE and from AFTER (each in a fresh clone with its own target
# directory), then runs them in turn, RUNS times each, Postgres at
# concurrency 64 with 4,000 requests, and prints each run's row.
#   tests/loadgen-compare.sh BEFORE AFTER [RUNS]
# Needs Postgres as the tests do (DATABASE_URL, default 127.0.0.1:5432).
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
before=$1 after=$2 runs=${3:-5}
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
    row=$("$work/$name/target/release/loadgen" --requests 4000 --concurrency 64 --store postgres 2>/dev/null \
      | grep -E '^\| Postgres \| (File \| )?64 \|')
    echo "$name $run $row"
  done
done
echo "clones in $work"
