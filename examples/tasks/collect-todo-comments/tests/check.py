"""Verifier for collect-todo-comments."""
import sys


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


with open("/tests/expected.tsv", encoding="utf-8") as fh:
    want = fh.read()
try:
    with open("/app/todos.tsv", "rb") as fh:
        got = fh.read().decode("utf-8", "replace")
except OSError as e:
    fail(f"cannot read /app/todos.tsv: {e}")
if got != want:
    print("expected:\n" + want)
    print("got:\n" + got)
    fail("/app/todos.tsv does not match the expected report")
print("PASS")
