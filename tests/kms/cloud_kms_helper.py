"""A stand-in for a cloud KMS behind SPACE's command key service protocol (no cloud KMS is
reachable from these machines), used by the tests of that protocol.

    cloud_kms_helper.py DIR wrap|unwrap   (one JSON request on stdin, one answer on stdout)

Keys are files DIR/<key id>.key (32 bytes, AES-256-GCM); DIR/<key id>.revoked disables one;
while DIR/down exists the "service" is unreachable (exit status 1).
"""
import base64
import json
import os
import sys

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM


def answer(obj):
    json.dump(obj, sys.stdout)
    sys.exit(0)


def main():
    directory, op = sys.argv[1], sys.argv[2]
    if os.path.exists(os.path.join(directory, "down")):
        print("connection refused", file=sys.stderr)
        sys.exit(1)
    request = json.load(sys.stdin)
    key_id = request["key_id"]
    if os.path.exists(os.path.join(directory, key_id + ".revoked")):
        answer({"error": {"code": "revoked", "message": f"key {key_id} is disabled"}})
    try:
        with open(os.path.join(directory, key_id + ".key"), "rb") as f:
            key = f.read()
    except FileNotFoundError:
        answer({"error": {"code": "not_found", "message": f"no key {key_id}"}})
    context = base64.b64decode(request["context"])
    if op == "wrap":
        nonce = os.urandom(12)
        sealed = AESGCM(key).encrypt(nonce, base64.b64decode(request["plaintext"]), context)
        answer({"ciphertext": base64.b64encode(nonce + sealed).decode()})
    elif op == "unwrap":
        blob = base64.b64decode(request["ciphertext"])
        try:
            plain = AESGCM(key).decrypt(blob[:12], blob[12:], context)
        except InvalidTag:
            answer({"error": {"code": "rejected", "message": "does not unwrap"}})
        answer({"plaintext": base64.b64encode(plain).decode()})
    else:
        print(f"unknown operation {op}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
