#!/usr/bin/env python3
"""Two talos-sso binaries timed alternately against one running server.

Separate clientbench runs each start their own server and provider, and
their spread is as large as small differences between two builds. This
runs both builds in turn, in one environment: the quick start's.

    cargo run -p talos-sso-tests --bin quickstart            # keep it running
    source target/quickstart/bob.env
    python3 tests/cli-interleave.py OLD/talos-sso NEW/talos-sso

It prints the median and minimum wall time of: silent `login` (8 each,
2.2 s apart, under the quick start's rate limit), `status` (no network)
and `version` (one request), 30 each.
"""

import statistics
import subprocess
import sys
import time


def timed(binary, args):
    started = time.perf_counter()
    done = subprocess.run([binary, *args], capture_output=True)
    elapsed = (time.perf_counter() - started) * 1000
    if args[0] == "login" and done.returncode != 0:
        sys.exit(f"{binary} login failed: {done.stderr.decode(errors='replace')}")
    return elapsed


def compare(binaries, args, rounds, pause):
    times = {b: [] for b in binaries}
    for _ in range(rounds):
        for binary in binaries:
            time.sleep(pause)
            times[binary].append(timed(binary, args))
    for binary, samples in times.items():
        print(f"{' '.join(args):<22} {binary}: median {statistics.median(samples):.1f} ms, "
              f"min {min(samples):.1f} ms ({rounds} runs)")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    binaries = sys.argv[1:]
    compare(binaries, ["login", "--no-browser"], 8, 2.2)
    compare(binaries, ["status"], 30, 0)
    compare(binaries, ["version"], 30, 0)


main()
