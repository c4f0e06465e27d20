#!/bin/bash
# Reference solution.
set -euo pipefail
cd /app/project
export LC_ALL=C
find . -type d -name vendor -prune -o -type f \( -name '*.py' -o -name '*.js' -o -name '*.sh' \) -printf '%P\n' \
  | sort \
  | while IFS= read -r f; do
      perl -ne '
        if (/(?<![A-Za-z0-9_])(TODO|FIXME)(?![A-Za-z0-9_])(.*)$/) {
          my ($tag, $t) = ($1, $2);
          $t =~ s/^\([^)]*\)//;
          $t =~ s/^[ :-]+//;
          $t =~ s/\*\/\s*$//;
          $t =~ s/^\s+|\s+$//g;
          print "$ARGV\t$.\t$tag\t$t\n";
        }' -- "$f"
    done > /app/todos.tsv
