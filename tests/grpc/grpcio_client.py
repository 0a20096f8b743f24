#!/usr/bin/env python3
"""A gRPC client on gRPC's C core (Python's grpcio), for the gateway tests.

The same flags, modes and JSON line as tests/go/talos-grpc (see its
comment); messages are raw bytes both ways (no generated code). grpcio's
TLS (BoringSSL in the C core) offers no Ed25519 signature: its client
certificate has an ECDSA P-256 key.

    grpcio_client.py --endpoint HOST:PORT [--server-name N] --ca F --crt F --key F
        --method /pkg.Service/Method [--md key=value]... [--timeout S]
        --mode unary|server-stream|client-stream|bidi
        [--request BASE64] [--count N] [--bytes K] [--send BASE64]...
"""

import argparse
import base64
import hashlib
import json
import sys

import grpc

CHUNK = 64 * 1024
KEEP_MESSAGES = 1024 * 1024
MAX_MESSAGE = 64 * 1024 * 1024


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def chunk_message(offset, n):
    """The stand-in's Chunk{data}: byte i of the data is (offset+i) mod 251."""
    data = bytes((offset + i) % 251 for i in range(n))
    return b"\x0a" + varint(n) + data


def requests(args):
    if args.mode in ("unary", "server-stream"):
        return [base64.b64decode(args.request)]
    if args.mode == "client-stream":
        return [chunk_message(offset, min(CHUNK, args.bytes - offset))
                for offset in range(0, args.bytes, CHUNK)]
    if args.mode == "bidi":
        return [base64.b64decode(send) for send in args.send]
    raise SystemExit(f"unknown mode {args.mode!r}")


class Outcome:
    def __init__(self):
        self.code = 0
        self.message = ""
        self.headers = []
        self.trailers = []
        self.sizes = []
        self.messages = []
        self.digest = hashlib.sha256()
        self.error = None

    def receive(self, message):
        self.sizes.append(len(message))
        self.digest.update(message)
        self.messages.append(base64.b64encode(message).decode())

    def settle(self, call):
        """Code, message and metadata of a finished call (or RpcError)."""
        self.code = call.code().value[0]
        self.message = call.details() or ""
        self.headers = pairs(call.initial_metadata())
        self.trailers = pairs(call.trailing_metadata())
        if call.code() == grpc.StatusCode.UNAVAILABLE:
            self.error = self.message

    def line(self):
        return json.dumps({
            "code": self.code,
            "message": self.message,
            "message_raw": None,
            "headers": self.headers,
            "trailers": self.trailers,
            "sizes": self.sizes,
            "messages": self.messages if sum(self.sizes) <= KEEP_MESSAGES else [],
            "sha256": self.digest.hexdigest(),
            "error": self.error,
        })


def pairs(metadata):
    out = []
    for key, value in metadata or ():
        if key in ("grpc-status", "grpc-message"):
            continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        out.append([key, value])
    return out


def call(args, channel, out):
    metadata = []
    for pair in args.md:
        key, _, value = pair.partition("=")
        metadata.append((key, value))
    messages = requests(args)
    if args.mode == "unary":
        method = channel.unary_unary(args.method)
        response, done = method.with_call(messages[0], metadata=metadata, timeout=args.timeout)
        out.receive(response)
        out.settle(done)
    elif args.mode == "client-stream":
        method = channel.stream_unary(args.method)
        response, done = method.with_call(iter(messages), metadata=metadata, timeout=args.timeout)
        out.receive(response)
        out.settle(done)
    else:
        if args.mode == "server-stream":
            stream = channel.unary_stream(args.method)(messages[0], metadata=metadata, timeout=args.timeout)
        else:
            stream = channel.stream_stream(args.method)(iter(messages), metadata=metadata, timeout=args.timeout)
        for message in stream:
            out.receive(message)
            if args.mode == "server-stream" and args.count and len(out.sizes) >= args.count:
                stream.cancel()
                break
        out.settle(stream)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--server-name", default="")
    parser.add_argument("--ca", required=True)
    parser.add_argument("--crt", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--method", required=True)
    parser.add_argument("--mode", default="unary")
    parser.add_argument("--request", default="")
    parser.add_argument("--md", action="append", default=[])
    parser.add_argument("--send", action="append", default=[])
    parser.add_argument("--count", type=int, default=0)
    parser.add_argument("--bytes", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=50.0)
    args = parser.parse_args()

    def read(path):
        with open(path, "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read(args.ca),
        private_key=read(args.key),
        certificate_chain=read(args.crt),
    )
    options = [
        ("grpc.max_receive_message_length", MAX_MESSAGE),
        ("grpc.max_send_message_length", MAX_MESSAGE),
    ]
    if args.server_name and args.server_name != args.endpoint.rsplit(":", 1)[0]:
        options.append(("grpc.ssl_target_name_override", args.server_name))
    out = Outcome()
    with grpc.secure_channel(args.endpoint, credentials, options) as channel:
        try:
            call(args, channel, out)
        except grpc.RpcError as error:
            out.settle(error)
    print(out.line())
    sys.stdout.flush()


if __name__ == "__main__":
    main()
