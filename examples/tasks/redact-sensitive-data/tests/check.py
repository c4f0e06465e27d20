"""Verifier for redact-sensitive-data: exact byte comparison with expected outputs."""
import hashlib
import os
import sys

ORIGINAL_SHA256 = {
    "ticket-1041.txt": "22e4a020b65c6ee7c77de9198a3d1559fe2727433287b3003a2eadeed1877e9c",
    "ticket-1042.txt": "5965644e85614b9f5623ed9abc1920f77e04f19e8a9115c26d97adaa0488f247",
    "ticket-1043.txt": "f84e32e85fba73246ac0df1db7bd09bb64bdaac2ada988f528987c8d70e59572",
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


for name, digest in ORIGINAL_SHA256.items():
    path = os.path.join("/app/tickets", name)
    try:
        with open(path, "rb") as fh:
            if hashlib.sha256(fh.read()).hexdigest() != digest:
                fail(f"original {path} was modified")
    except OSError as e:
        fail(f"original {path} missing: {e}")

if not os.path.isdir("/app/redacted"):
    fail("/app/redacted does not exist")
got_names = sorted(os.listdir("/app/redacted"))
if got_names != sorted(ORIGINAL_SHA256):
    fail(f"/app/redacted should contain exactly {sorted(ORIGINAL_SHA256)}, got {got_names}")

ok = True
for name in sorted(ORIGINAL_SHA256):
    with open(os.path.join("/tests/expected", name), "rb") as fh:
        want = fh.read().decode()
    with open(os.path.join("/app/redacted", name), "rb") as fh:
        got = fh.read().decode("utf-8", "replace")
    if got != want:
        ok = False
        print(f"FAIL: /app/redacted/{name} differs from the expected redaction")
        wl, gl = want.splitlines(True), got.splitlines(True)
        for i in range(max(len(wl), len(gl))):
            w = wl[i] if i < len(wl) else "<missing>"
            g = gl[i] if i < len(gl) else "<missing>"
            if w != g:
                print(f"  line {i + 1}: expected {w!r}\n           got      {g!r}")
if not ok:
    sys.exit(1)
print("PASS")
