"""Verifier for sales-csv-to-json (expected values computed independently with sqlite3)."""
import json
import sys

EXPECTED_REGIONS = [
    ("North", 19, 181, 2566.74, "Widget, large"),
    ("South", 14, 140, 2477.01, "Gadget"),
    ("East", 9, 125, 2306.51, "Gadget"),
    ("West", 6, 63, 662.70, "Adapter"),
]
EXPECTED_MONTHS = {"2024-01": 4209.35, "2024-02": 3803.61}
EXPECTED_TOTAL = 8012.96


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def num(x, want, what):
    if isinstance(x, bool) or not isinstance(x, (int, float)) or abs(x - want) > 0.005:
        fail(f"{what}: expected {want}, got {x!r}")


try:
    with open("/app/report.json", encoding="utf-8") as fh:
        rep = json.load(fh)
except (OSError, ValueError) as e:
    fail(f"cannot load /app/report.json: {e}")
if not isinstance(rep, dict) or set(rep) != {"total_revenue", "by_month", "regions"}:
    fail("report must be an object with keys total_revenue, by_month, regions")
num(rep["total_revenue"], EXPECTED_TOTAL, "total_revenue")
if not isinstance(rep["by_month"], dict) or set(rep["by_month"]) != set(EXPECTED_MONTHS):
    fail(f"by_month keys: expected {sorted(EXPECTED_MONTHS)}, got {rep['by_month']!r}")
for m, v in EXPECTED_MONTHS.items():
    num(rep["by_month"][m], v, f"by_month[{m}]")
regions = rep["regions"]
if not isinstance(regions, list) or len(regions) != len(EXPECTED_REGIONS):
    fail(f"regions must be a list of {len(EXPECTED_REGIONS)} objects")
for got, (name, orders, units, revenue, top) in zip(regions, EXPECTED_REGIONS):
    if not isinstance(got, dict) or set(got) != {"region", "orders", "units", "revenue", "top_product"}:
        fail(f"region entry has wrong keys: {got!r}")
    if got["region"] != name:
        fail(f"regions not in the right order: expected {name}, got {got['region']!r}")
    for key, want in (("orders", orders), ("units", units)):
        if type(got[key]) is not int or got[key] != want:
            fail(f"{name}.{key}: expected {want}, got {got[key]!r}")
    num(got["revenue"], revenue, f"{name}.revenue")
    if got["top_product"] != top:
        fail(f"{name}.top_product: expected {top!r}, got {got['top_product']!r}")
print("PASS")
