#!/bin/bash
# Reference solution: git bisect with the unit tests as the oracle, then revert.
set -euo pipefail
git clone -q /app/calc.bundle /app/calc
cd /app/calc
git config user.name "Oracle"
git config user.email "oracle@example.com"
git bisect start main v1.0 >/dev/null
git bisect run sh -c 'python3 -B -m unittest -q test_calc >/dev/null 2>&1' >/tmp/bisect.log
bad=$(git rev-parse refs/bisect/bad)
git bisect reset >/dev/null 2>&1
echo "$bad" > /app/first_bad_commit.txt
git checkout -q main
git revert --no-edit "$bad" >/dev/null
