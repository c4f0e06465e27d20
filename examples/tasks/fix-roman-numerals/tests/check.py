"""Verifier for fix-roman-numerals: visible + hidden unittest suites."""
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

VISIBLE_TESTS_SHA256 = "30b5abc629fcb1584833d791cd6bcb058ec0090a2fe5407e7923b410248b3bd6"


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


if not os.path.isfile("/app/roman.py"):
    fail("/app/roman.py is missing")
try:
    with open("/app/test_roman.py", "rb") as fh:
        if hashlib.sha256(fh.read()).hexdigest() != VISIBLE_TESTS_SHA256:
            fail("/app/test_roman.py was modified")
except OSError:
    fail("/app/test_roman.py is missing")

with tempfile.TemporaryDirectory() as tmp:
    shutil.copy("/app/roman.py", tmp)
    shutil.copy("/app/test_roman.py", tmp)
    shutil.copy("/tests/hidden_test_roman.py", tmp)
    for mod in ("test_roman", "hidden_test_roman"):
        r = subprocess.run([sys.executable, "-B", "-m", "unittest", "-q", mod],
                           cwd=tmp, capture_output=True, text=True, timeout=40)
        if r.returncode != 0:
            fail(f"{mod} failed:\n{r.stderr[-3000:]}")
print("PASS")
