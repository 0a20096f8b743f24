#!/usr/bin/env python3
"""Workload tokens signed by PyJWT, a JWT implementation talos-sso does not
share, in the shapes Kubernetes, GitHub Actions and GitLab CI issue them.

  mint.py keygen ALG KEY.pem       a new RS256 (RSA 2048) or ES256 (P-256) key
  mint.py jwks KEY.pem KID         the JWKS publishing its public key as KID
  mint.py sign KEY.pem KID ALG     the claims on stdin (JSON), signed

Used by the workload tests (tests/src/workload_tokens.rs).
"""
import json
import sys

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa


def keygen(alg, path):
    if alg == "RS256":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif alg == "ES256":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        sys.exit(f"unknown algorithm {alg}")
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    with open(path, "wb") as out:
        out.write(pem)


def load(path):
    with open(path, "rb") as f:
        return serialization.load_pem_private_key(f.read(), password=None)


def jwks(path, kid):
    key = load(path)
    if isinstance(key, rsa.RSAPrivateKey):
        jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
        jwk["alg"] = "RS256"
    else:
        jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(key.public_key()))
        jwk["alg"] = "ES256"
    jwk["kid"] = kid
    jwk["use"] = "sig"
    print(json.dumps({"keys": [jwk]}))


def sign(path, kid, alg):
    claims = json.load(sys.stdin)
    print(jwt.encode(claims, load(path), algorithm=alg, headers={"kid": kid}))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"keygen": keygen, "jwks": jwks, "sign": sign}[command](*args)
