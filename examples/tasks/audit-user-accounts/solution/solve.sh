#!/bin/bash
# Reference solution in Python (stdlib only).
set -euo pipefail
python3 - <<'PY'
import json

def read(path):
    with open(path) as fh:
        return [line.rstrip("\n").split(":") for line in fh if line.strip()]

passwd = read("/app/etc/passwd")
groups = read("/app/etc/group")
shadow = read("/app/etc/shadow")
users = {p[0] for p in passwd}
gid_name = {g[2]: g[0] for g in groups}
members = {g[0]: {m for m in g[3].split(",") if m} for g in groups}

def groups_of(p):
    names = {n for n, mem in members.items() if p[0] in mem}
    if p[3] in gid_name:
        names.add(gid_name[p[3]])
    return sorted(names)

NOLOGIN = {"/usr/sbin/nologin", "/sbin/nologin", "/bin/false", "/usr/bin/false"}
human = [
    {"user": p[0], "uid": int(p[2]), "home": p[5], "shell": p[6], "groups": groups_of(p)}
    for p in sorted(passwd, key=lambda p: int(p[2]))
    if 1000 <= int(p[2]) <= 59999 and p[6] not in NOLOGIN
]
report = {
    "human_users": human,
    "uid0_accounts": sorted(p[0] for p in passwd if int(p[2]) == 0),
    "empty_password": sorted(s[0] for s in shadow if s[1] == ""),
    "admin_users": sorted(p[0] for p in passwd if {"sudo", "wheel"} & set(groups_of(p))),
}
with open("/app/audit.json", "w") as fh:
    json.dump(report, fh, indent=2)
PY
