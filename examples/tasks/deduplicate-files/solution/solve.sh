#!/bin/bash
# Reference solution: keep the byte-wise smallest path of each content group.
set -euo pipefail
cd /app/library
export LC_ALL=C
find . -type f -printf '%P\0' | sort -z | xargs -0 sha256sum -- \
  | awk '{ h=$1; p=substr($0, 67); if (h in seen) print p; else seen[h]=1 }' \
  | sort > /app/removed.txt
while IFS= read -r p; do rm -f -- "$p"; done < /app/removed.txt
find . -mindepth 1 -type d -empty -delete
