#!/usr/bin/env bash
# End-to-end: the oracle on 12 Dockerfile tasks at concurrency 4 with the docker backend,
# once rebuilding every task image (--force-build), then twice reusing the built images.
# Reference point from the issue tracker: Harbor 0.24 takes 53-56 s for such a run on the
# same kind of machine (10.7 s of each 14.3 s trial waits out `docker compose down`).
set -euo pipefail
cd "$(dirname "$0")/.."
CLOTHO="${CLOTHO:-.venv/bin/clotho}"
TASKS=$(ls examples/tasks | grep -v README | head -12 | paste -sd, -)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {
  local name=$1; shift
  local start end
  start=$(date +%s.%N)
  "$CLOTHO" eval examples/tasks --agent oracle --sandbox docker --concurrency 4 \
    --filter "$TASKS" --out "$out/$name" "$@" >/dev/null 2>"$out/$name.log" \
    || { cat "$out/$name.log" >&2; exit 1; }
  end=$(date +%s.%N)
  passed=$(python3 -c "import json;print(json.load(open('$out/$name/metrics.json'))['n_passed'])")
  printf '%-34s %6.2f s   %s/12 passed\n' "$name" "$(python3 -c "print($end - $start)")" "$passed"
}

run "images rebuilt (--force-build)" --force-build
run "images reused (first)"
run "images reused (second)"
