#!/bin/bash
# Verifier: runs with cwd /app after the agent finished. Always leaves exactly
# one number in /logs/verifier/reward.txt: 1 if every check passes, else 0.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
if timeout 100 python3 -B /tests/check.py; then
  echo 1 > /logs/verifier/reward.txt
fi
