"""Verifier for audit-user-accounts."""
import json
import sys

EXPECTED = {
    "human_users": [
        {"user": "alice", "uid": 1000, "home": "/home/alice", "shell": "/bin/bash",
         "groups": ["adm", "alice", "developers", "sudo"]},
        {"user": "bob", "uid": 1001, "home": "/home/bob", "shell": "/usr/bin/zsh",
         "groups": ["bob", "developers", "docker"]},
        {"user": "carol", "uid": 1002, "home": "/home/carol", "shell": "/bin/bash",
         "groups": ["developers", "sudo"]},
        {"user": "dave", "uid": 1004, "home": "/home/dave", "shell": "/bin/bash",
         "groups": ["docker", "sudo"]},
        {"user": "grace", "uid": 59999, "home": "/home/grace", "shell": "/bin/sh",
         "groups": ["developers", "docker", "wheel"]},
    ],
    "uid0_accounts": ["root", "toor"],
    "empty_password": ["carol", "erin", "toor"],
    "admin_users": ["alice", "carol", "dave", "grace"],
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


try:
    with open("/app/audit.json", encoding="utf-8") as fh:
        got = json.load(fh)
except (OSError, ValueError) as e:
    fail(f"cannot load /app/audit.json: {e}")
if not isinstance(got, dict) or set(got) != set(EXPECTED):
    fail(f"audit.json must be an object with keys {sorted(EXPECTED)}")
for key in ("uid0_accounts", "empty_password", "admin_users"):
    if got[key] != EXPECTED[key]:
        fail(f"{key}: expected {EXPECTED[key]}, got {got[key]!r}")
users = got["human_users"]
if not isinstance(users, list):
    fail("human_users must be a list")
names = [u.get("user") if isinstance(u, dict) else u for u in users]
want_names = [u["user"] for u in EXPECTED["human_users"]]
if names != want_names:
    fail(f"human_users: expected users {want_names} (in UID order), got {names}")
for g, w in zip(users, EXPECTED["human_users"]):
    if set(g) != set(w):
        fail(f"entry for {w['user']} must have exactly the keys {sorted(w)}, got {sorted(g)}")
    if type(g["uid"]) is not int:
        fail(f"uid of {w['user']} must be an integer")
    for key in w:
        if g[key] != w[key]:
            fail(f"{w['user']}.{key}: expected {w[key]!r}, got {g[key]!r}")
print("PASS")
