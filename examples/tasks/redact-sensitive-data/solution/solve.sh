#!/bin/bash
# Reference solution: three Perl regex substitutions per file.
set -euo pipefail
mkdir -p /app/redacted
for f in /app/tickets/*.txt; do
  perl -pe '
    s/[A-Za-z0-9._%+-]+@(?:[A-Za-z0-9-]+\.)+[A-Za-z]{2,}(?![A-Za-z0-9-])/[EMAIL]/g;
    s/(?<![\d.])(?:(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)\.){3}(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)(?!\d|\.\d)/[IP]/g;
    s/(?<!\d)(?:\d{16}|\d{4}( )\d{4}\1\d{4}\1\d{4}|\d{4}-\d{4}-\d{4}-\d{4})(?!\d)/[CARD]/g;
  ' "$f" > "/app/redacted/$(basename "$f")"
done
