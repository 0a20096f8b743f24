#!/usr/bin/env python3
"""Verify a talos-sso audit export and its signed checkpoints, written from
the specification in docs/audit.md ("The hash chain", "Signed checkpoints")
alone: RFC 8785 canonical JSON, SHA-256, Ed25519 (checked by the openssl
command). It shares no code with talos-sso, so that the specification, the
server and the CLI cannot drift apart unnoticed.

    audit-verify.py EXPORT [--from SEQ] [--checkpoints FILE ... --public-key PEM ...]

The export must start at record 1 (prev_hash 64 zeros) unless --from names
its first record; then the records before it are not checked.

Every line must be exactly the text the server writes for its record or
checkpoint (docs/audit.md, "Verifying without the server"): the line is
read with repeated keys refused, its fields checked against the list of the
record type, and it is written again in the server's form; the two must be
the same bytes. JSON allows many texts of one value and readers disagree on
some of them (a repeated key is the last one to json.loads and the first one
to others), so any other text is refused rather than interpreted.

Prints "intact: ..." and exits 0, or "broken at record N: ..." and exits 1.
Only the Python standard library and the openssl command are needed.
"""

import argparse
import base64
import datetime
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile

GENESIS = "0" * 64
MAX_SAFE = 2**53 - 1
CHECKPOINT_TYPE = "talos-sso.audit.checkpoint.v1"


class Broken(Exception):
    def __init__(self, seq, reason):
        super().__init__(f"broken at record {seq}: {reason}")


def utf16_units(key):
    return key.encode("utf-16-be")


def jcs(value, order=utf16_units):
    """RFC 8785 for the values an audit record or a checkpoint holds: object
    keys sorted by their UTF-16 code units. With order=None, keys sorted by
    code point (as Rust's BTreeMap sorts them): the server's form of a value
    in a line."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        if abs(value) > MAX_SAFE:
            raise ValueError(f"integer {value} is beyond 2^53: not an I-JSON number")
        return str(value)
    if isinstance(value, float):
        # The server writes integers only; RFC 8785's number form for other
        # doubles (ECMAScript's Number.prototype.toString) is not needed.
        if value.is_integer() and abs(value) <= MAX_SAFE:
            return str(int(value))
        raise ValueError(f"number {value!r}: the server writes integers only")
    if isinstance(value, str):
        out = ['"']
        for ch in value:
            code = ord(ch)
            if ch == '"':
                out.append('\\"')
            elif ch == "\\":
                out.append("\\\\")
            elif ch == "\b":
                out.append("\\b")
            elif ch == "\t":
                out.append("\\t")
            elif ch == "\n":
                out.append("\\n")
            elif ch == "\f":
                out.append("\\f")
            elif ch == "\r":
                out.append("\\r")
            elif code < 0x20:
                out.append(f"\\u{code:04x}")
            else:
                out.append(ch)
        out.append('"')
        return "".join(out)
    if isinstance(value, list):
        return "[" + ",".join(jcs(v, order) for v in value) + "]"
    if isinstance(value, dict):
        keys = sorted(value, key=order)
        return "{" + ",".join(jcs(k) + ":" + jcs(value[k], order) for k in keys) + "}"
    raise ValueError(f"{type(value).__name__} is not JSON")


# The line form (docs/audit.md, "Verifying without the server"): the fields
# in this order, each of this kind. "time" is a string in the one time form.
RECORD_FIELDS = [
    ("seq", "int"),
    ("occurred_at", "time"),
    ("request_id", "str"),
    ("event", "str"),
    ("outcome", "str"),
    ("reason_code", "str?"),
    ("cluster", "str?"),
    ("issuer", "str?"),
    ("tenant", "str?"),
    ("subject", "str?"),
    ("username", "str?"),
    ("identity_verified", "bool"),
    ("groups_evaluated", "[str]"),
    ("roles_requested", "[str]"),
    ("roles_granted", "[str]"),
    ("serial", "str?"),
    ("certificate_sha256", "str?"),
    ("public_key_sha256", "str?"),
    ("not_before", "time?"),
    ("not_after", "time?"),
    ("client_ip", "str?"),
    ("user_agent", "str?"),
    ("client_version", "str?"),
    ("token_id", "str?"),
    ("token_issued_at", "time?"),
    ("details", "json"),
    ("prev_hash", "str"),
    ("hash", "str"),
]
CHECKPOINT_FIELDS = [
    ("type", "str"),
    ("server", "str"),
    ("seq", "int"),
    ("hash", "str"),
    ("signed_at", "time"),
    ("trigger", "str"),
    ("key_id", "str"),
    ("signature", "str"),
]


KINDS = {
    "int": "an integer",
    "str": "a string",
    "str?": "a string or null",
    "bool": "true or false",
    "time": "a time in the one form",
    "time?": "a time in the one form or null",
    "[str]": "a list of strings",
    "json": "JSON",
}


class NotServerForm(ValueError):
    pass


def bounded(text):
    """Text of a line as an error quotes it: at most 128 characters (the
    line is anyone's until it is checked)."""
    return text if len(text) <= 128 else text[:128] + "..."


def unique_keys(pairs):
    """An object from json.loads, refusing a key given twice."""
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise NotServerForm(f"the key {bounded(repr(key))} is given twice")
        obj[key] = value
    return obj


def no_fraction(text):
    raise NotServerForm(f"the number {bounded(text)} is not an integer")


# The one time form, character by character: strptime alone also reads a
# lowercase "t" or "z" and a day or hour padded with a space, which the
# server never writes and talos-sso refuses.
TIME_FORM = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z", re.ASCII)


def is_time(value):
    """The one time form: UTC, six fractional digits, a real date."""
    if not isinstance(value, str) or not TIME_FORM.fullmatch(value):
        return False
    try:
        datetime.datetime.strptime(value, "%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError:
        return False
    return True


def of_kind(value, kind):
    if kind.endswith("?") and value is None:
        return True
    kind = kind.rstrip("?")
    if kind == "int":
        return is_int(value)
    if kind == "str":
        return isinstance(value, str)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "time":
        return is_time(value)
    if kind == "[str]":
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    return kind == "json"


def read_line(line, fields, what):
    """The object of one line (bytes, newline included) if it is exactly the
    text the server writes; None for an empty line. Raises NotServerForm."""
    if line.endswith(b"\n"):
        line = line[:-1]
    if not line:
        return None
    try:
        text = line.decode("utf-8")
        obj = json.loads(text, object_pairs_hook=unique_keys, parse_float=no_fraction, parse_constant=no_fraction)
    except NotServerForm as error:
        raise NotServerForm(f"not {what}: {error}") from None
    except (ValueError, RecursionError) as error:
        raise NotServerForm(f"not {what} ({error})") from None
    names = [name for name, _ in fields]
    if not isinstance(obj, dict) or list(obj) != names:
        raise NotServerForm(f"not {what}: its keys are not those of the server's lines, in their order")
    for name, kind in fields:
        if not of_kind(obj[name], kind):
            raise NotServerForm(f"not {what}: {name} is not {KINDS[kind]}")
    try:
        # The fields in their order; within a value, keys by code point.
        again = ("{" + ",".join(jcs(name) + ":" + jcs(obj[name], order=None) for name in names) + "}").encode("utf-8")
    except ValueError as error:
        raise NotServerForm(f"not {what} ({error})") from None
    if again != line:
        raise NotServerForm(f"not {what} in the form the server writes (whitespace, an escape or a number written otherwise)")
    return obj


def sha256_hex(data):
    return hashlib.sha256(data).hexdigest()


# SubjectPublicKeyInfo of an Ed25519 key (RFC 8410): this prefix, then 32 bytes.
ED25519_SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")


def public_key(path):
    """(key_id, path) of a PEM Ed25519 public key: key_id is the SHA-256 of its DER."""
    with open(path, encoding="ascii") as f:
        lines = f.read().split("\n")
    start = lines.index("-----BEGIN PUBLIC KEY-----")
    end = lines.index("-----END PUBLIC KEY-----")
    der = base64.b64decode("".join(lines[start + 1 : end]))
    if len(der) != 44 or not der.startswith(ED25519_SPKI_PREFIX):
        raise ValueError(f"{path} is not an Ed25519 public key")
    return sha256_hex(der), path


def is_int(value):
    return isinstance(value, int) and not isinstance(value, bool)


def is_hex(value, length):
    return isinstance(value, str) and len(value) == length and all(c in "0123456789abcdef" for c in value)


def signature_verifies(pem_path, message, signature_hex):
    with tempfile.TemporaryDirectory() as tmp:
        msg, sig = os.path.join(tmp, "msg"), os.path.join(tmp, "sig")
        with open(msg, "wb") as f:
            f.write(message)
        with open(sig, "wb") as f:
            f.write(bytes.fromhex(signature_hex))
        result = subprocess.run(
            ["openssl", "pkeyutl", "-verify", "-pubin", "-inkey", pem_path, "-rawin", "-in", msg, "-sigfile", sig],
            capture_output=True,
        )
        return result.returncode == 0


def read_checkpoints(paths, keys):
    checkpoints = []
    for path in paths:
        # Bytes, so that no line end is translated: a CR is not the server's.
        with open(path, "rb") as f:
            for number, line in enumerate(f, 1):
                try:
                    checkpoint = read_line(line, CHECKPOINT_FIELDS, "a checkpoint")
                except NotServerForm as error:
                    raise Broken(0, f"{path}, line {number}: {error}") from None
                if checkpoint is None:
                    continue
                if (
                    checkpoint["type"] != CHECKPOINT_TYPE
                    or not is_hex(checkpoint["hash"], 64)
                    or not is_hex(checkpoint["signature"], 128)
                ):
                    raise Broken(0, f"{path}, line {number}: not a checkpoint")
                key = keys.get(checkpoint["key_id"])
                if key is None:
                    raise Broken(checkpoint["seq"], f"{path}, line {number}: signed by an unknown key")
                signed = {k: v for k, v in checkpoint.items() if k != "signature"}
                if not signature_verifies(key, jcs(signed).encode("utf-8"), checkpoint["signature"]):
                    raise Broken(checkpoint["seq"], f"{path}, line {number}: the signature does not verify")
                checkpoints.append(checkpoint)
    return sorted(checkpoints, key=lambda c: c["seq"])


def verify(export, first, checkpoint_paths, key_paths):
    keys = dict(public_key(p) for p in key_paths)
    checkpoints = read_checkpoints(checkpoint_paths, keys)
    by_seq = {}
    for checkpoint in checkpoints:
        by_seq.setdefault(checkpoint["seq"], []).append(checkpoint)
    last_seq, last_hash, count, matched, last_matched = None, None, 0, 0, None
    with open(export, "rb") as f:
        for number, line in enumerate(f, 1):
            try:
                record = read_line(line, RECORD_FIELDS, "an audit record")
            except NotServerForm as error:
                raise Broken(0, f"line {number}: {error}") from None
            if record is None:
                continue
            if not is_hex(record["hash"], 64):
                raise Broken(record["seq"], f"line {number}: its hash is not 64 hex digits")
            seq = record["seq"]
            if last_seq is None:
                if seq != first:
                    raise Broken(seq, f"the export starts at record {seq}, not {first} (see --from)")
                # From record 1, the chain starts at 64 zeros; from --from,
                # the first prev_hash is taken as given.
                last_seq, last_hash = seq - 1, GENESIS if first == 1 else record["prev_hash"]
                for checkpoint in by_seq.get(last_seq, []):
                    if checkpoint["hash"] != last_hash:
                        raise Broken(last_seq, "does not match its signed checkpoint")
                    matched, last_matched = matched + 1, last_seq
            if seq != last_seq + 1:
                raise Broken(seq, f"expected record {last_seq + 1}: records are missing")
            if record["prev_hash"] != last_hash:
                raise Broken(seq, "its prev_hash is not the hash of the record before it")
            content = {k: v for k, v in record.items() if k != "hash"}
            if sha256_hex(jcs(content).encode("utf-8")) != record["hash"]:
                raise Broken(seq, "its content does not match its hash")
            for checkpoint in by_seq.get(seq, []):
                if checkpoint["hash"] != record["hash"]:
                    raise Broken(seq, "does not have the hash its signed checkpoint gives it")
                matched += 1
                last_matched = seq
            last_seq, last_hash, count = seq, record["hash"], count + 1
    if last_seq is None:
        raise Broken(0, "the export holds no records")
    beyond = [c["seq"] for c in checkpoints if c["seq"] > last_seq]
    if beyond:
        raise Broken(last_seq + 1, f"records {last_seq + 1} to {max(beyond)} are missing (signed in a checkpoint)")
    return count, last_seq, matched, last_matched


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export")
    parser.add_argument("--from", dest="first", type=int, default=1)
    parser.add_argument("--checkpoints", action="append", default=[])
    parser.add_argument("--public-key", action="append", default=[])
    args = parser.parse_args()
    if args.checkpoints and not args.public_key:
        parser.error("--checkpoints needs --public-key")
    try:
        count, last_seq, matched, last_matched = verify(args.export, args.first, args.checkpoints, args.public_key)
    except Broken as broken:
        print(broken)
        return 1
    except (ValueError, KeyError, TypeError, OSError) as error:
        # A file that is not what it should be is a failed verification.
        print(f"broken at record 0: {error}")
        return 1
    print(f"intact: {count} records (last seq {last_seq}), {matched} checkpoints matched, last at record {last_matched}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
