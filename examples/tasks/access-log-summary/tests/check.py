"""Verifier for access-log-summary (expected values computed from the shipped log)."""
import json
import sys

EXPECTED = {
    "total_requests": 240,
    "unique_ips": 9,
    "status_counts": {"200": 177, "201": 8, "302": 10, "304": 14, "404": 19, "500": 7, "503": 5},
    "total_bytes": 5457357,
    "error_rate": 0.05,
    "top_ips": [
        {"ip": "192.168.1.10", "requests": 75},
        {"ip": "10.0.0.5", "requests": 44},
        {"ip": "192.168.1.11", "requests": 29},
    ],
    "top_paths": [
        {"path": "/api/items", "requests": 59},
        {"path": "/static/app.js", "requests": 47},
        {"path": "/index.html", "requests": 26},
        {"path": "/", "requests": 23},
        {"path": "/static/style.css", "requests": 21},
    ],
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


try:
    with open("/app/summary.json", encoding="utf-8") as fh:
        got = json.load(fh)
except (OSError, ValueError) as e:
    fail(f"cannot load /app/summary.json: {e}")
if not isinstance(got, dict):
    fail("top-level JSON value must be an object")
if set(got) != set(EXPECTED):
    fail(f"keys differ: expected {sorted(EXPECTED)}, got {sorted(got)}")
for key in ("total_requests", "unique_ips", "total_bytes"):
    if type(got[key]) is not int or got[key] != EXPECTED[key]:
        fail(f"{key}: expected {EXPECTED[key]}, got {got[key]!r}")
if got["status_counts"] != EXPECTED["status_counts"]:
    fail(f"status_counts: expected {EXPECTED['status_counts']}, got {got['status_counts']!r}")
rate = got["error_rate"]
if isinstance(rate, bool) or not isinstance(rate, (int, float)) or abs(rate - EXPECTED["error_rate"]) > 1e-9:
    fail(f"error_rate: expected {EXPECTED['error_rate']}, got {rate!r}")
for key in ("top_ips", "top_paths"):
    if got[key] != EXPECTED[key]:
        fail(f"{key}: expected {EXPECTED[key]}, got {got[key]!r}")
print("PASS")
