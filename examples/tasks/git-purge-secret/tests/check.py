"""Verifier for git-purge-secret."""
import os
import subprocess
import sys

REPO = "/app/vault"
SECRET_PATH = "config/secrets.env"
SECRET_BLOBS = [
    "dea01ee604c839ea5aee0d6a709a05d0963312e5",
    "ae72ace41834a67c58f5f59f57277df4161875b0",
    "8920cb5080a944378fba4e247307d6f27468f356",
]
SECRET_STRINGS = ["sk_live_51HcTQ2eZvKYlo2C9x0Rk", "sk_live_77QpLm3nBvXc8Z1aR4Ty"]
# (tree, author name, author email, author date, subject) of main, oldest first
EXPECTED = [
    ("9674d38c2e3314edb652f87ca3c5544acfa6eac3", "Fay Olsen", "fay@example.com",
     "2024-04-01T14:30:00+02:00", "Initial vault client"),
    ("cebe71d465cdd2becf63037a5e64f0a648d1cd31", "Fay Olsen", "fay@example.com",
     "2024-04-03T14:30:00+02:00", "Print API endpoint"),
    ("4d55d6bc15e35884c67a197e4b00a61163e31777", "Gus Mendes", "gus@example.com",
     "2024-04-05T14:30:00+02:00", "Document main and add retry setting"),
    ("ee232ea53f6f35bc7488a0f8e679c7eb3f73e3a5", "Fay Olsen", "fay@example.com",
     "2024-04-06T14:30:00+02:00", "Read API token from the environment"),
    ("ef838b6c8cd6266cd48501dc7841cc3dd148b870", "Fay Olsen", "fay@example.com",
     "2024-04-07T14:30:00+02:00", "README: explain configuration"),
]
TAG_INDEX = 2  # v1.0 pointed at "Document main and add retry setting"


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def git(*args, check=True):
    r = subprocess.run(["git", "-c", "safe.directory=*", "-C", REPO, *args],
                       capture_output=True, text=True)
    if check and r.returncode != 0:
        fail(f"git {' '.join(args)} failed: {r.stderr.strip()}")
    return r


if not os.path.isdir(os.path.join(REPO, ".git")):
    fail(f"{REPO} is not a git clone")

refs = sorted(git("for-each-ref", "--format=%(refname)").stdout.split())
if refs != ["refs/heads/main", "refs/tags/v1.0"]:
    fail(f"expected exactly refs/heads/main and refs/tags/v1.0, found {refs}")
if git("symbolic-ref", "--short", "HEAD").stdout.strip() != "main":
    fail("main must be checked out")
if git("status", "--porcelain").stdout.strip():
    fail("working tree is not clean")

log = git("log", "--reverse", "--format=%H%x00%T%x00%an%x00%ae%x00%aI%x00%s%x00%P", "refs/heads/main").stdout
commits = [line.split("\x00") for line in log.splitlines()]
if len(commits) != len(EXPECTED):
    fail(f"main should have {len(EXPECTED)} commits, it has {len(commits)}: {[c[5] for c in commits]}")
prev = ""
for i, (got, want) in enumerate(zip(commits, EXPECTED)):
    sha, tree, an, ae, ad, subject, parents = got
    if parents != prev:
        fail(f"history of main must be linear; commit {sha} has parents {parents!r}")
    prev = sha
    if (an, ae, ad, subject) != want[1:]:
        fail(f"commit #{i + 1}: expected {want[1:]}, got {(an, ae, ad, subject)}")
    if tree != want[0]:
        files = git("ls-tree", "-r", "--name-only", sha).stdout.split()
        fail(f"commit #{i + 1} ({subject!r}) has different file contents than expected; files: {files}")

tag = git("rev-parse", "refs/tags/v1.0^{commit}").stdout.strip()
if tag != commits[TAG_INDEX][0]:
    fail("tag v1.0 does not point at the rewritten 'Document main and add retry setting' commit")

# No reachable object is, or contains, a secret.
objects = git("rev-list", "--objects", "--all").stdout.splitlines()
for line in objects:
    parts = line.split(" ", 1)
    if parts[0] in SECRET_BLOBS or (len(parts) == 2 and parts[1] == SECRET_PATH):
        fail(f"secret still reachable: {line}")
for rev in git("rev-list", "--all").stdout.split():
    r = git("grep", "-I", "-l", "-F", "-e", SECRET_STRINGS[0], "-e", SECRET_STRINGS[1], rev, check=False)
    if r.stdout.strip():
        fail(f"secret token found in commit {rev}: {r.stdout.strip()}")

# The old blobs must be gone from the object database.
for blob in SECRET_BLOBS:
    if git("cat-file", "-e", blob, check=False).returncode == 0:
        fail(f"secret blob {blob} still exists in the object database (reflog/prune)")
print("PASS")
