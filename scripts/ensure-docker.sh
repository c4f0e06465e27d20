#!/usr/bin/env bash
# Make a Docker engine available for the docker backend and its tests:
# install docker.io (as root, when missing), start dockerd when no daemon answers
# (no bridge network, no iptables: this machine has neither), and build the local base
# image. Exits non-zero when Docker cannot be made to work; callers decide whether that
# is fatal (CI) or only means the docker tests are skipped (a laptop without root).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

if ! command -v dockerd >/dev/null 2>&1 || ! command -v debootstrap >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "docker: not installed and not root; install docker.io and debootstrap to use the docker backend" >&2
    exit 1
  fi
  echo "installing docker.io and debootstrap ..." >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends docker.io debootstrap >/dev/null
fi

if ! docker info >/dev/null 2>&1; then
  if [ "$(id -u)" -ne 0 ]; then
    echo "docker: no daemon answers and we are not root to start one" >&2
    exit 1
  fi
  log="${TMPDIR:-/tmp}/clotho-dockerd.log"
  echo "starting dockerd (log: $log) ..." >&2
  nohup dockerd --bridge=none --iptables=false >"$log" 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 0.5
  done
  docker info >/dev/null 2>&1 || { echo "dockerd did not come up:" >&2; tail -20 "$log" >&2; exit 1; }
fi

bash "$here/build-base-image.sh"
