"""Verifier for harden-sshd-config."""
import hashlib
import re
import sys

ORIGINAL_PATH = "/tests/sshd_config.original"
REQUIRED = {
    "port": ["2222"],
    "permitrootlogin": ["no"],
    "passwordauthentication": ["no"],
    "permitemptypasswords": ["no"],
    "maxauthtries": ["3"],
    "x11forwarding": ["no"],
}
MULTI = {"hostkey", "listenaddress", "acceptenv", "port", "setenv", "include"}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def split(text):
    """Return (global directive list [(keyword, value)], match-section text)."""
    lines = text.splitlines(True)
    directives = []
    for i, line in enumerate(lines):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = re.match(r"([A-Za-z0-9]+)(?:\s*=\s*|\s+)(.*)$", s)
        if not m:
            m = re.match(r"([A-Za-z0-9]+)()$", s)
        if not m:
            fail(f"unparseable line: {line!r}")
        kw, value = m.group(1).lower(), " ".join(m.group(2).split())
        if kw == "match":
            return directives, "".join(lines[i:])
        directives.append((kw, value))
    return directives, ""


def effective(directives):
    eff = {}
    for kw, value in directives:
        if kw in MULTI:
            eff.setdefault(kw, []).append(value)
        elif kw not in eff:
            eff[kw] = [value]
    return eff


with open(ORIGINAL_PATH, encoding="utf-8") as fh:
    original = fh.read()
for path in ("/app/etc/ssh/sshd_config.orig", "/app/etc/ssh/sshd_config"):
    try:
        open(path, encoding="utf-8").close()
    except OSError as e:
        fail(f"cannot read {path}: {e}")
with open("/app/etc/ssh/sshd_config.orig", encoding="utf-8") as fh:
    if fh.read() != original:
        fail("sshd_config.orig is not an unmodified copy of the original file")
with open("/app/etc/ssh/sshd_config", encoding="utf-8") as fh:
    new = fh.read()

orig_dirs, orig_match = split(original)
new_dirs, new_match = split(new)
if new_match != orig_match:
    fail("the Match blocks were changed (or settings were added after the first Match line)")

new_eff = effective(new_dirs)
for kw, want in REQUIRED.items():
    got = new_eff.get(kw)
    if got is None or [v.lower() for v in got] != want:
        fail(f"effective global {kw} should be {want}, got {got}")
allow = new_eff.get("allowusers")
if allow is None or sorted(allow[0].split()) != ["admin", "deploy"]:
    fail(f"effective AllowUsers should be 'deploy admin', got {allow}")
for kw in list(REQUIRED) + ["allowusers"]:
    n = sum(1 for k, _ in new_dirs if k == kw)
    if n != 1:
        fail(f"{kw} appears {n} times as an active directive in the global section (must be exactly once)")

orig_eff = effective(orig_dirs)
for kw, value in orig_eff.items():
    if kw in REQUIRED or kw == "allowusers":
        continue
    if new_eff.get(kw) != value:
        fail(f"setting {kw} changed from {value} to {new_eff.get(kw)}")
extra = set(new_eff) - set(orig_eff) - set(REQUIRED) - {"allowusers"}
if extra:
    fail(f"unexpected new settings: {sorted(extra)}")
print("PASS")
