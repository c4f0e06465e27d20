#!/bin/bash
# Reference solution: parse the log with a regex in Python and write JSON.
set -euo pipefail
python3 - <<'PY'
import collections, json, re
LINE = re.compile(r'^(\S+) \S+ \S+ \[[^\]]+\] "(\S+) (\S+) (\S+)" (\d{3}) (\d+|-) "[^"]*" "[^"]*"$')
ips, paths, statuses = collections.Counter(), collections.Counter(), collections.Counter()
total = nbytes = errors = 0
with open("/app/logs/access.log") as fh:
    for line in fh:
        m = LINE.match(line.rstrip("\n"))
        if not m:
            continue
        ip, _method, target, _proto, status, size = m.groups()
        total += 1
        ips[ip] += 1
        paths[target.split("?", 1)[0]] += 1
        statuses[status] += 1
        nbytes += 0 if size == "-" else int(size)
        errors += int(status) >= 500
def top(counter, n, key):
    items = sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [{key: k, "requests": v} for k, v in items]
summary = {
    "total_requests": total,
    "unique_ips": len(ips),
    "status_counts": dict(sorted(statuses.items())),
    "total_bytes": nbytes,
    "error_rate": round(errors / total, 4),
    "top_ips": top(ips, 3, "ip"),
    "top_paths": top(paths, 5, "path"),
}
with open("/app/summary.json", "w") as fh:
    json.dump(summary, fh, indent=2)
    fh.write("\n")
PY
