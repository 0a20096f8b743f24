#!/usr/bin/env python3
"""Summarise `perf script -F comm,ip,sym` output of tests/profile-perf.sh:
the share of the samples by part of the request path, each sample counted
once, in the first part whose rule its call stack matches (crypto first,
then SQLite's own thread, then the task the stack belongs to), split by
what the sample was doing at its leaf (a system call, the allocator).
With --seconds, --hz and --cores: how busy the cores were (samples against
the samples a fully busy machine gives), the rest being idle time.
Python's standard library only.

  tests/profile-perf-summary.py STACKS [--seconds S --hz N --cores C]
"""
import argparse
import collections
import re

ALLOCATOR = re.compile(
    r"^(malloc|_int_|cfree|free|realloc|calloc|malloc_consolidate|unlink_chunk|__GI___libc_|sysmalloc"
    r"|_mi_|mi_|__memmove|__memcpy|__memset)")
SYSCALL = re.compile(r"__x64_sys_(\w+)")

# (part, any frame of the stack contains one of these)
CRYPTO = [
    ("crypto: token signature (RS256)", ["ring::rsa", "ring_core_0_17_14__bn_"]),
    ("crypto: CSR signature (Ed25519)", ["verify_csr"]),
    ("crypto: signing the certificate (Ed25519)", ["sign_leaf", "sign_certificate"]),
]
TASKS = [
    ("load generator's HTTP client", ["loadgen::fire", "reqwest::", "hyper_util::client",
                                      "hyper::proto::h1::role::Client"]),
    ("audit writer task", ["AuditWriter", "audit::store", "audit::writer"]),
    ("issuance handler, besides crypto", ["issue_certificate"]),
    ("server HTTP (hyper, axum, middleware)", ["hyper::proto::h1", "http::serve::", "axum"]),
    ("tokio (scheduler, I/O driver)", ["tokio::runtime"]),
]


def read(path):
    samples, current = [], None
    for line in open(path, errors="replace"):
        if not line.strip():
            if current:
                samples.append(current)
            current = None
        elif not line[0].isspace():
            current = (line.split()[0], [])
        elif current is not None:
            parts = line.strip().split(None, 1)
            current[1].append(parts[1] if len(parts) > 1 else "?")
    if current:
        samples.append(current)
    return samples


def part(thread, stack):
    for name, needles in CRYPTO:
        if any(n in frame for frame in stack for n in needles):
            return name
    syscall = next((m.group(1) for m in map(SYSCALL.search, stack) if m), None)
    allocating = bool(stack) and ALLOCATOR.match(stack[0])
    if thread.startswith("sqlx-sqlite"):
        where = "SQLite's thread"
        if syscall:
            return f"{where}: system call {syscall}"
        if allocating:
            return f"{where}: allocator"
        return f"{where}: SQLite and sqlx"
    where = next((name for name, needles in TASKS
                  if any(n in frame for frame in stack for n in needles)), "other")
    if syscall:
        return f"{where}: system call {syscall}"
    if allocating:
        return f"{where}: allocator"
    return where


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("stacks")
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--hz", type=float)
    parser.add_argument("--cores", type=int)
    parser.add_argument("--most", type=int, default=25)
    args = parser.parse_args()
    samples = read(args.stacks)
    total = len(samples)
    if not total:
        raise SystemExit("no samples")
    parts = collections.Counter(part(thread, stack) for thread, stack in samples)
    groups = collections.Counter()
    for name, count in parts.items():
        groups[name.split(":")[0]] += count
    print(f"{total} samples")
    if args.seconds and args.hz and args.cores:
        busy = total / (args.seconds * args.hz * args.cores)
        print(f"cores busy: {busy:.0%} of {args.seconds:.2f} s on {args.cores} cores (the rest idle)")
    print("\n| part | share of samples |\n|---|---:|")
    for name, count in groups.most_common():
        print(f"| {name} | {count / total:.1%} |")
    print("\n| part, by what the leaf was doing | share of samples |\n|---|---:|")
    for name, count in parts.most_common(args.most):
        print(f"| {name} | {count / total:.1%} |")
    allocator = sum(c for n, c in parts.items() if n.endswith("allocator"))
    print(f"\nallocator (malloc, free, memcpy) outside crypto: {allocator / total:.1%}")


if __name__ == "__main__":
    main()
