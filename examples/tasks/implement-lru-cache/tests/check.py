"""Verifier for implement-lru-cache: runs the hidden unittest suite."""
import os
import shutil
import subprocess
import sys
import tempfile


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


if not os.path.isfile("/app/lru.py"):
    fail("/app/lru.py is missing")
with tempfile.TemporaryDirectory() as tmp:
    shutil.copy("/app/lru.py", tmp)
    shutil.copy("/tests/hidden_test_lru.py", tmp)
    try:
        r = subprocess.run([sys.executable, "-B", "-m", "unittest", "-v", "hidden_test_lru"],
                           cwd=tmp, capture_output=True, text=True, timeout=40)
    except subprocess.TimeoutExpired:
        fail("hidden tests timed out (operations are probably not O(1))")
    if r.returncode != 0:
        fail("hidden tests failed:\n" + r.stderr[-4000:])
print("PASS")
