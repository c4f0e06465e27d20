#!/bin/bash
# Reference solution: what the page's script does, in Python (it needs no browser, so it
# runs on every backend): decode the parcel list, pick the heaviest parcel for Oslo, and
# compute the confirmation code the page shows for it with the Express service.
set -euo pipefail
python3 - <<'PY'
import base64, json, re

html = open("/app/site/index.html", encoding="utf-8").read()
data = re.search(r'const DATA = "([^"]+)"', html).group(1)
parcels = json.loads(base64.b64decode(data))
heaviest = max((p for p in parcels if p["to"] == "Oslo"), key=lambda p: p["kg"])

def fnv1a(text):
    h = 0x811C9DC5
    for byte in text.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return "%08x" % h

code = "PCL-" + fnv1a(heaviest["id"] + "|express|parcel-desk").upper()
with open("/app/confirmation.txt", "w") as fh:
    fh.write(code + "\n")
PY
