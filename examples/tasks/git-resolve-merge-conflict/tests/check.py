"""Verifier for git-resolve-merge-conflict."""
import os
import subprocess
import sys
import tempfile

MAIN_TIP = "5c1f83d727a5aee563f646681f8d75aa313c81a1"
FEATURE_TIP = "2fcf37586452ae5069fd8a33eb98f4dbcfd3ed31"
REPO = "/app/slugs"
CHANGELOG = """# Changelog

## Unreleased
- slugify collapses runs of whitespace.
- slugify drops punctuation.

## 0.1.0
- First release.
"""


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def git(*args):
    r = subprocess.run(["git", "-c", "safe.directory=*", "-C", REPO, *args],
                       capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"git {' '.join(args)} failed: {r.stderr.strip()}")
    return r.stdout


if not os.path.isdir(os.path.join(REPO, ".git")):
    fail(f"{REPO} is not a git clone")
if git("symbolic-ref", "--short", "HEAD").strip() != "main":
    fail("branch main must be checked out")
parents = git("rev-list", "--parents", "-n", "1", "refs/heads/main").split()[1:]
if parents != [MAIN_TIP, FEATURE_TIP]:
    fail(f"main's tip must be a merge commit with parents [{MAIN_TIP}, {FEATURE_TIP}], got {parents}")
if git("status", "--porcelain").strip():
    fail("working tree is not clean:\n" + git("status", "--porcelain"))

files = {}
for name in git("ls-tree", "--name-only", "refs/heads/main").split():
    files[name] = git("show", f"refs/heads/main:{name}")
    for marker in ("<<<<<<<", ">>>>>>>", "\n=======\n"):
        if marker in files[name]:
            fail(f"conflict marker {marker.strip()!r} left in {name}")
if sorted(files) != ["CHANGELOG.md", "README.md", "slug.py", "test_slug.py"]:
    fail(f"unexpected set of files on main: {sorted(files)}")
if files["CHANGELOG.md"] != CHANGELOG:
    fail("CHANGELOG.md is not resolved as required:\n" + files["CHANGELOG.md"])
if files["README.md"] != git("show", f"{MAIN_TIP}:README.md"):
    fail("README.md (which had no conflict) was changed")
for test_name in ("def test_basic", "def test_whitespace", "def test_punctuation"):
    if test_name not in files["test_slug.py"]:
        fail(f"test_slug.py lost {test_name}()")

with tempfile.TemporaryDirectory() as tmp:
    for name in ("slug.py", "test_slug.py"):
        with open(os.path.join(tmp, name), "w", encoding="utf-8") as fh:
            fh.write(files[name])
    with open("/tests/hidden_test_slug.py", encoding="utf-8") as src, \
            open(os.path.join(tmp, "hidden_test_slug.py"), "w", encoding="utf-8") as dst:
        dst.write(src.read())
    for mod in ("test_slug", "hidden_test_slug"):
        r = subprocess.run([sys.executable, "-B", "-m", "unittest", "-q", mod],
                           cwd=tmp, capture_output=True, text=True)
        if r.returncode != 0:
            fail(f"{mod} fails on the merged code:\n{r.stderr}")
        if "Ran 0 tests" in r.stderr:
            fail(f"{mod} ran no tests")
print("PASS")
