#!/usr/bin/env bash
# Upstream atroposlib in its own virtual environment, for the compatibility tests only
# (tests/test_trainers_compat.py). It pulls a heavy tree (~1 GB), so it never enters .venv;
# built once and cached. Failing to install is a warning (those tests then skip, saying why),
# except under CI=true, where it fails the run: CI must run every test.
set -uo pipefail
venv="${1:?usage: atropos-venv.sh VENV_DIR}"
version="${ATROPOSLIB_VERSION:-0.4.0}"
stamp="$venv/.clotho-atroposlib-$version"
[ -f "$stamp" ] && exit 0
echo "installing upstream atroposlib $version into $venv (once, for the compatibility tests)"
rm -rf "$venv"
quiet_pip() {  # pip's notes about absent local package folders are noise here
  "$venv/bin/pip" "$@" 2>&1 | grep -v '^WARNING: Location' >&2
  return "${PIPESTATUS[0]}"
}
if python3 -m venv "$venv" \
  && quiet_pip install -q --upgrade pip \
  && quiet_pip install -q "atroposlib==$version" pytest requests; then
  touch "$stamp"
else
  rm -rf "$venv"
  if [ "${CI:-}" = "true" ]; then
    echo "error: upstream atroposlib $version did not install into $venv; CI=true runs its compatibility tests" >&2
    exit 1
  fi
  echo "warning: upstream atroposlib did not install; its compatibility tests will skip" >&2
fi
exit 0
