#!/usr/bin/env bash
# Build the local base image `clotho/base:bookworm` when no container registry is reachable:
# debootstrap a Debian rootfs from the mirror apt already uses, then `docker import` it.
# The rootfs tarball is cached, so a later run only re-imports it (seconds).
set -euo pipefail

IMAGE="${CLOTHO_BASE_IMAGE:-clotho/base:bookworm}"
SUITE="${CLOTHO_BASE_SUITE:-bookworm}"
CACHE="${CLOTHO_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/clotho}"
TARBALL="$CACHE/base-$SUITE.tar"
PACKAGES="bash,coreutils,python3,git,jq,sqlite3,procps,bubblewrap,ca-certificates"

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
  exit 0
fi

mirror() {
  # The first Debian mirror in apt's configuration (deb822 or one-line format).
  local uri
  uri=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/*.sources 2>/dev/null | grep -v security || true)
  if [ -z "$uri" ] && [ -f /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" && $0 !~ /security/ {print $2; exit}' /etc/apt/sources.list)
  fi
  [ -n "$uri" ] || { echo "no Debian mirror found in apt's sources" >&2; exit 1; }
  echo "$uri"
}

if [ ! -s "$TARBALL" ]; then
  command -v debootstrap >/dev/null || { echo "debootstrap is missing: apt-get install debootstrap" >&2; exit 1; }
  mkdir -p "$CACHE"
  root=$(mktemp -d "$CACHE/rootfs.XXXXXX")
  trap 'rm -rf "$root"' EXIT
  echo "debootstrapping $SUITE (a few minutes, once) ..." >&2
  debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$root" "$(mirror)" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log" >&2; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  mkdir -p "$root/app"
  tar -C "$root" -cf "$TARBALL.tmp" .
  mv "$TARBALL.tmp" "$TARBALL"
fi
docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'WORKDIR /app' \
  --change 'CMD ["bash"]' \
  "$TARBALL" "$IMAGE" >/dev/null
echo "built $IMAGE" >&2
