"""The customer's side of a KMIP server in the tests: makes, revokes and destroys keys with
PyKMIP's own client, as a customer's key administrator would.

    python kmip_admin.py PORT CA CERT KEY create          -> prints the new key's id
    python kmip_admin.py PORT CA CERT KEY revoke ID
    python kmip_admin.py PORT CA CERT KEY destroy ID      (revokes first if it is active)
"""
import sys
import warnings

warnings.filterwarnings("ignore")

from kmip import enums  # noqa: E402
from kmip.pie.client import ProxyKmipClient  # noqa: E402


def main():
    port, ca, cert, key, op = sys.argv[1:6]
    client = ProxyKmipClient(
        hostname="127.0.0.1", port=int(port), cert=cert, key=key, ca=ca,
        config_file="/dev/null", kmip_version=enums.KMIPVersion.KMIP_1_2,
    )
    with client:
        if op == "create":
            uid = client.create(
                enums.CryptographicAlgorithm.AES, 256,
                cryptographic_usage_mask=[
                    enums.CryptographicUsageMask.ENCRYPT,
                    enums.CryptographicUsageMask.DECRYPT,
                ],
            )
            client.activate(uid)
            print(uid)
        elif op == "revoke":
            client.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, sys.argv[6])
        elif op == "destroy":
            try:
                client.revoke(enums.RevocationReasonCode.CESSATION_OF_OPERATION, sys.argv[6])
            except Exception:
                pass  # already revoked
            client.destroy(sys.argv[6])
        else:
            sys.exit(f"unknown operation {op}")


if __name__ == "__main__":
    main()
