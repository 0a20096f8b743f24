#!/usr/bin/env python3
"""talosctl as the workload examples' tests need it (tests/tests/workload_examples.rs).

The examples' scripts call `talosctl`; this stands in for it on PATH and
makes the gRPC call the real command makes, through the Go client
(tests/go/talos-grpc, whose path is in $TALOS_GRPC), with the current
context of the talosconfig `talos-sso login` wrote ($TALOSCONFIG, else
~/.talos/config): its first endpoint, `ca`, `crt` and `key`. Against the
apid stand-in (tests/src/standin_apid.rs):

    talosctl [-n|--nodes NODE] version            MachineService/Version
    talosctl [-n|--nodes NODE] etcd snapshot PATH MachineService/EtcdSnapshot;
                                                  the Chunks' data written to PATH
    talosctl [-n|--nodes NODE] reboot [--wait=B]  MachineService/Reboot

NODE goes as the `node` metadata, as talosctl sends one node. Each call's
outcome (the Go client's JSON line) is appended to $TALOSCTL_CALLS when
set. Any other command fails, naming itself: an example that starts using
one must be mapped here first.
"""

import base64
import json
import os
import subprocess
import sys
import tempfile


def scalar(text):
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


def read_yaml(text):
    """Block mappings, block lists of scalars and scalars: what
    talos-sso writes a talosconfig as (serde_yaml), and nothing more."""
    root = {}
    # (indent of its lines, container), from the outermost.
    stack = [(0, root)]
    pending = None  # (parent, key): a key whose value is on the next lines
    for raw in text.splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        indent = len(raw) - len(raw.lstrip(" "))
        line = raw.strip()
        item = line.startswith("- ")
        if pending is not None:
            parent, key = pending
            pending = None
            parent[key] = [] if item else {}
            stack.append((indent, parent[key]))
        # A list written at its key's indent ends at the next key there.
        while stack[-1][0] > indent or (isinstance(stack[-1][1], list) and not item):
            stack.pop()
        container = stack[-1][1]
        if item:
            if not isinstance(container, list):
                raise SystemExit(f"talosctl stand-in: unexpected list item: {raw!r}")
            container.append(scalar(line[2:]))
            continue
        key, _, value = line.partition(":")
        key = scalar(key)
        if value.strip():
            container[key] = scalar(value)
        else:
            container[key] = None
            pending = (container, key)
    return root


def context():
    path = os.environ.get("TALOSCONFIG") or os.path.expanduser("~/.talos/config")
    with open(path, encoding="utf-8") as f:
        config = read_yaml(f.read())
    entry = config["contexts"][config["context"]]
    return entry["endpoints"][0], {name: base64.b64decode(entry[name]) for name in ("ca", "crt", "key")}


def call(method, mode, node):
    endpoint, pem = context()
    with tempfile.TemporaryDirectory() as scratch:
        files = {}
        for name, data in pem.items():
            files[name] = os.path.join(scratch, name)
            with open(files[name], "wb") as f:
                f.write(data)
        args = [os.environ["TALOS_GRPC"], "--endpoint", endpoint, "--ca", files["ca"],
                "--crt", files["crt"], "--key", files["key"], "--method", method, "--mode", mode]
        if node:
            args += ["--md", f"node={node}"]
        line = subprocess.run(args, check=True, capture_output=True, text=True).stdout
    calls = os.environ.get("TALOSCTL_CALLS")
    if calls:
        with open(calls, "a", encoding="utf-8") as f:
            f.write(line)
    outcome = json.loads(line)
    if outcome["code"] != 0:
        raise SystemExit(f"rpc error: code = {outcome['code']} desc = {outcome['message']}")
    return [base64.b64decode(m) for m in outcome["messages"]]


def chunk_data(message):
    """The stand-in's Chunk{bytes data = 1}: one length-delimited field."""
    if not message:
        return b""
    if message[0] != 0x0A:
        raise SystemExit("talosctl stand-in: not a Chunk")
    length, shift, i = 0, 0, 1
    while True:
        byte = message[i]
        length |= (byte & 0x7F) << shift
        shift += 7
        i += 1
        if not byte & 0x80:
            break
    return message[i:i + length]


def main(argv):
    node = None
    words = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word in ("-n", "--nodes"):
            node = argv[i + 1]
            i += 2
            continue
        if word.startswith("--nodes="):
            node = word.split("=", 1)[1]
        elif word.startswith("--wait"):
            pass
        else:
            words.append(word)
        i += 1
    if words == ["version"]:
        call("/machine.MachineService/Version", "unary", node)
        print(f"Server:\n\tNODE: {node or ''}\n\tTag: (apid stand-in)")
    elif words[:2] == ["etcd", "snapshot"] and len(words) == 3:
        messages = call("/machine.MachineService/EtcdSnapshot", "server-stream", node)
        data = b"".join(chunk_data(m) for m in messages)
        with open(words[2], "wb") as f:
            f.write(data)
        print(f"etcd snapshot saved to {words[2]!r} ({len(data)} bytes)")
    elif words == ["reboot"]:
        call("/machine.MachineService/Reboot", "unary", node)
    else:
        raise SystemExit(f"talosctl stand-in: `{' '.join(argv)}` is not mapped to a call")


if __name__ == "__main__":
    main(sys.argv[1:])
