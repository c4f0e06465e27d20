"""Verifier for deduplicate-files."""
import os
import sys

EXPECTED_KEPT = {
    "README": "My library\n",
    "docs/notes.md": "# Notes\n\nnothing to see\n",
    "docs/old/q1-copy.txt": "Quarterly report Q1\nRevenue up 4%\n",
    "docs/old/q3 (1).txt": "Quarterly report Q3\nRevenue up 6%\n",
    "docs/reports/q2.txt": "Quarterly report Q2\nRevenue up 5%\n",
    "music/best of/track 01.mp3": "ID3 fake audio data 0001\n",
    "music/best of/track 02.mp3": "ID3 fake audio data 0002\n",
    "photos/2021/beach.jpg": "JFIF fake beach picture\n",
    "photos/2021/empty.log": "",
    "photos/2022/beach.jpg": "JFIF fake beach picture, edited\n",
}
EXPECTED_REMOVED = sorted([
    "docs/reports/q1.txt",
    "docs/reports/q3.txt",
    "music/track01.mp3",
    "photos/2022/Beach-copy.jpg",
    "tmp/cache/blob.bin",
    "tmp/cache/q3.txt",
    "tmp/cache/readme-old",
    "tmp/empty.log",
])
EXPECTED_DIRS = {"docs", "docs/old", "docs/reports", "music", "music/best of",
                 "photos", "photos/2021", "photos/2022"}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


root = "/app/library"
if not os.path.isdir(root):
    fail("/app/library is missing")
files, dirs = {}, set()
for cur, dnames, fnames in os.walk(root):
    for d in dnames:
        dirs.add(os.path.relpath(os.path.join(cur, d), root))
    for f in fnames:
        p = os.path.join(cur, f)
        with open(p, "rb") as fh:
            files[os.path.relpath(p, root)] = fh.read().decode("utf-8", "replace")

if set(files) != set(EXPECTED_KEPT):
    fail(f"kept files differ: missing={sorted(set(EXPECTED_KEPT) - set(files))} "
         f"unexpected={sorted(set(files) - set(EXPECTED_KEPT))}")
for rel, content in EXPECTED_KEPT.items():
    if files[rel] != content:
        fail(f"content of {rel} was modified")
if dirs != EXPECTED_DIRS:
    fail(f"directories differ: missing={sorted(EXPECTED_DIRS - dirs)} "
         f"unexpected (should have been removed)={sorted(dirs - EXPECTED_DIRS)}")

try:
    with open("/app/removed.txt", encoding="utf-8") as fh:
        removed = fh.read()
except OSError as e:
    fail(f"cannot read /app/removed.txt: {e}")
if removed != "".join(p + "\n" for p in EXPECTED_REMOVED):
    fail("/app/removed.txt content is wrong; got:\n" + removed)
print("PASS")
