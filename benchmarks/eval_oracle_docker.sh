#!/usr/bin/env bash
# End-to-end: the oracle on 12 Dockerfile tasks at concurrency 4 with the docker backend,
# once rebuilding every task image (--force-build), then twice reusing the built images.
# Prints one line per run: its name, its wall time in seconds and how many tasks passed.
#
# Usage: benchmarks/eval_oracle_docker.sh [--tasks N] [--reused K]
#   --tasks N   the first N bundled tasks (default 12)
#   --reused K  runs that reuse the built images after the rebuilding one (default 2)
# The smoke test runs `--tasks 1 --reused 1`.
set -euo pipefail
cd "$(dirname "$0")/.."
CLOTHO="${CLOTHO:-.venv/bin/clotho}"
n_tasks=12
n_reused=2
while [ $# -gt 0 ]; do
  case "$1" in
    --tasks) n_tasks=$2; shift 2 ;;
    --reused) n_reused=$2; shift 2 ;;
    *) echo "usage: $0 [--tasks N] [--reused K]" >&2; exit 2 ;;
  esac
done
TASKS=$(ls examples/tasks | grep -v README | awk -v n="$n_tasks" 'NR <= n' | paste -sd, -)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

run() {
  local name=$1; shift
  local start end passed
  start=$(date +%s.%N)
  "$CLOTHO" eval examples/tasks --agent oracle --sandbox docker --concurrency 4 \
    --filter "$TASKS" --out "$out/run" "$@" >/dev/null 2>"$out/run.log" \
    || { cat "$out/run.log" >&2; exit 1; }
  end=$(date +%s.%N)
  passed=$(python3 -c "import json;print(json.load(open('$out/run/metrics.json'))['n_passed'])")
  rm -rf "$out/run"
  printf '%-34s %6.2f s   %s/%s passed\n' "$name" "$(python3 -c "print($end - $start)")" \
    "$passed" "$n_tasks"
}

run "images rebuilt (--force-build)" --force-build
for i in $(seq 1 "$n_reused"); do
  run "images reused (run $i)"
done
