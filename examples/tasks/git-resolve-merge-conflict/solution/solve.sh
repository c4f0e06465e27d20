#!/bin/bash
# Reference solution: merge, then write the resolved versions of the three files.
set -euo pipefail
git clone -q /app/slugs.bundle /app/slugs
cd /app/slugs
git config user.name "Oracle"
git config user.email "oracle@example.com"
git merge --no-ff origin/feature/strip-punctuation >/dev/null 2>&1 || true

python3 - <<'PY'
import re

def resolve(path, pick):
    """Replace each conflict block with pick(ours, theirs)."""
    text = open(path).read()
    pattern = re.compile(r"<<<<<<< [^\n]*\n(.*?)=======\n(.*?)>>>>>>> [^\n]*\n", re.S)
    text = pattern.sub(lambda m: pick(m.group(1), m.group(2)), text)
    open(path, "w").write(text)

# CHANGELOG and tests: keep both sides, main (ours) first.
resolve("CHANGELOG.md", lambda ours, theirs: ours + theirs)
resolve("test_slug.py", lambda ours, theirs: ours + "\n" + theirs)
# slugify: strip unsafe characters, then collapse whitespace.
resolve("slug.py", lambda ours, theirs:
        '    title = _UNSAFE.sub("", title.lower())\n'
        '    return "-".join(title.split())\n')
PY
python3 -B -m unittest -q test_slug
git add CHANGELOG.md test_slug.py slug.py
git commit -q --no-edit
