#!/bin/bash
# Reference solution: sort /app/inbox into /app/sorted.
set -euo pipefail
cd /app
mkdir -p sorted/other
shopt -s nullglob
for path in inbox/*; do
  name=$(basename "$path")
  if [[ $name =~ ^(IMG|VID)_([0-9]{4})([0-9]{2})([0-9]{2})_([0-9]{2})([0-9]{2})([0-9]{2})\.([A-Za-z0-9]+)$ ]]; then
    ext=${BASH_REMATCH[8],,}
    case $ext in
      jpg|jpeg|png|mp4)
        y=${BASH_REMATCH[2]} m=${BASH_REMATCH[3]} d=${BASH_REMATCH[4]}
        mkdir -p "sorted/$y/$m"
        mv -- "$path" "sorted/$y/$m/$y-$m-${d}_${BASH_REMATCH[5]}-${BASH_REMATCH[6]}-${BASH_REMATCH[7]}.$ext"
        continue ;;
    esac
  fi
  mv -- "$path" "sorted/other/$name"
done
