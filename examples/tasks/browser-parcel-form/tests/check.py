"""The confirmation code the page shows for the right request (parcel P-4410, Express)."""

import sys

EXPECTED = "PCL-4FD8EBEA"

try:
    with open("/app/confirmation.txt", encoding="utf-8") as fh:
        text = fh.read()
except OSError as exc:
    print(f"FAIL: /app/confirmation.txt cannot be read: {exc}")
    sys.exit(1)
if text.strip() != EXPECTED:
    print(f"FAIL: /app/confirmation.txt holds {text.strip()[:80]!r}, not the page's code")
    sys.exit(1)
if text not in (EXPECTED, EXPECTED + "\n"):
    print("FAIL: /app/confirmation.txt must hold the code alone")
    sys.exit(1)
print("ok")
