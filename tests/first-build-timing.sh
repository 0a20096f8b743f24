#!/usr/bin/env bash
# What a newcomer waits for (docs/evidence/performance.md, "The first build"):
# clones COMMIT (default HEAD) of this repository into a fresh folder with an
# empty target directory, then times, with every output line stamped in
# seconds from the start:
#   1. the quick start, cold (`cargo run -p talos-sso-tests --bin quickstart -- --once`);
#   2. the same command again, warm;
#   3. `cargo test --workspace --locked --no-run` right after, and which crates it compiled.
# Run it on a quiet machine: anything else building skews every figure.
#   tests/first-build-timing.sh [COMMIT]
set -euo pipefail
repo=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
commit=${1:-HEAD}
work=$(mktemp -d)
git clone -q "$repo" "$work/clone"
cd "$work/clone"
git checkout -q "$commit"
unset CARGO_TARGET_DIR
start=$(date +%s.%N)
stamp() { while IFS= read -r line; do printf '%6.1f %s\n' "$(echo "$(date +%s.%N) - $start" | bc)" "$line"; done; }
cargo run -p talos-sso-tests --bin quickstart -- --once 2>&1 | stamp > "$work/cold.log"
first=$(grep -m1 -E '^ *[0-9.]+ 1\. ' "$work/cold.log" | awk '{print $1}')
built=$(grep -m1 'Finished' "$work/cold.log" | awk '{print $1}')
s=$(date +%s.%N); cargo run -p talos-sso-tests --bin quickstart -- --once > "$work/warm.log" 2>&1; e=$(date +%s.%N)
t=$(date +%s.%N); cargo test --workspace --locked --no-run > "$work/test.log" 2>&1; u=$(date +%s.%N)
echo "quick start built:        ${built} s"
echo "first demo output:        ${first} s"
echo "warm rerun:               $(echo "$e - $s" | bc) s"
echo "cargo test --no-run after: $(echo "$u - $t" | bc) s, compiled: $(grep Compiling "$work/test.log" | awk '{print $2}' | tr '\n' ' ')"
echo "logs in $work"
