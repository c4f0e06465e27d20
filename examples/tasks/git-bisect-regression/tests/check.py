"""Verifier for git-bisect-regression."""
import os
import subprocess
import sys
import tempfile

FIRST_BAD = "a2136130cdb155e15e5ace9cd7a006642a54e561"
ORIGINAL_TIP = "a294b03b4ecd8018edc31dc1dbc9d1acb24cb73f"
REPO = "/app/calc"


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def git(*args):
    r = subprocess.run(["git", "-c", "safe.directory=*", "-C", REPO, *args],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"git {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


# 1. the answer file
try:
    with open("/app/first_bad_commit.txt", encoding="utf-8") as fh:
        answer = fh.read().strip()
except OSError as e:
    fail(f"cannot read /app/first_bad_commit.txt: {e}")
if answer != FIRST_BAD:
    fail(f"/app/first_bad_commit.txt contains {answer!r}, which is not the first bad commit")

# 2. the revert commit
if not os.path.isdir(os.path.join(REPO, ".git")):
    fail(f"{REPO} is not a git clone")
parents = git("rev-list", "--parents", "-n", "1", "refs/heads/main").split()
if len(parents) != 2 or parents[1] != ORIGINAL_TIP:
    fail("main must have exactly one new (non-merge) commit on top of the original tip "
         f"{ORIGINAL_TIP}; got parents {parents[1:]}")
changed = git("diff", "--name-only", ORIGINAL_TIP, "refs/heads/main").split()
if changed != ["calc.py"]:
    fail(f"the new commit should only change calc.py, it changes {changed}")
with open("/tests/expected_calc.py", encoding="utf-8") as fh:
    expected = fh.read()
if git("show", "refs/heads/main:calc.py") != expected:
    fail("calc.py on main is not the tip version with the bad commit reverted")
if git("symbolic-ref", "--short", "HEAD").strip() != "main":
    fail("main should be checked out")
status = git("status", "--porcelain", "--untracked-files=no")
if status.strip():
    fail(f"working tree has uncommitted changes:\n{status}")

# 3. the tests pass against the committed code
with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "calc.py"), "w", encoding="utf-8") as fh:
        fh.write(git("show", "refs/heads/main:calc.py"))
    with open("/tests/test_calc.py", encoding="utf-8") as src, \
            open(os.path.join(tmp, "test_calc.py"), "w", encoding="utf-8") as dst:
        dst.write(src.read())
    r = subprocess.run([sys.executable, "-B", "-m", "unittest", "-q", "test_calc"],
                       cwd=tmp, capture_output=True, text=True)
    if r.returncode != 0:
        fail("unit tests fail on the new main:\n" + r.stderr)
print("PASS")
