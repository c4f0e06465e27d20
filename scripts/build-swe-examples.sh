#!/usr/bin/env bash
# The SWE examples' repositories: the five toy repositories (no network) and four real
# pure-Python packages from their pinned PyPI sdists (downloaded once into
# ~/.cache/clotho/swe/sdists: the only step that needs the package index), each a git
# repository with the bug commits of examples/swe/*.jsonl. `make test` runs this first.
# Usage: scripts/build-swe-examples.sh [PYTHON]
set -euo pipefail
PY=${1:-.venv/bin/python}
CACHE=${CLOTHO_SWE_CACHE:-$HOME/.cache/clotho/swe}
SDISTS=$CACHE/sdists
mkdir -p "$SDISTS"
for spec in inflection==0.5.1 six==1.16.0 toolz==1.0.0 more-itertools==10.5.0; do
  name=${spec%%==*}; version=${spec##*==}
  if ! ls "$SDISTS/$name-$version.tar.gz" "$SDISTS/${name//-/_}-$version.tar.gz" >/dev/null 2>&1; then
    "$PY" -m pip download -q --no-deps --no-binary :all: -d "$SDISTS" "$spec"
  fi
done
"$PY" - "$SDISTS" "$CACHE" <<'PY'
import sys
from pathlib import Path

from clotho.swe.examples import build_real, build_toys

sdists, cache = Path(sys.argv[1]), Path(sys.argv[2])
print(f"{len(build_toys(cache / 'mirrors'))} toy repositories in {cache / 'mirrors'}")
print(f"{len(build_real(sdists, cache / 'pypi'))} real repositories in {cache / 'pypi'}")
PY
