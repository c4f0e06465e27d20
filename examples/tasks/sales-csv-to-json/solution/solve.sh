#!/bin/bash
# Reference solution using Python's csv and json modules.
set -euo pipefail
python3 - <<'PY'
import csv, json
from collections import defaultdict

regions = defaultdict(lambda: {"orders": 0, "units": 0, "revenue": 0.0, "products": defaultdict(float)})
months = defaultdict(float)
total = 0.0
with open("/app/sales.csv", newline="") as fh:
    for row in csv.DictReader(fh):
        units = int(row["units"])
        revenue = units * float(row["unit_price"])
        r = regions[row["region"]]
        r["orders"] += 1
        r["units"] += units
        r["revenue"] += revenue
        r["products"][row["product"]] += revenue
        months[row["date"][:7]] += revenue
        total += revenue

report = {
    "total_revenue": round(total, 2),
    "by_month": {m: round(v, 2) for m, v in sorted(months.items())},
    "regions": [
        {
            "region": name,
            "orders": r["orders"],
            "units": r["units"],
            "revenue": round(r["revenue"], 2),
            "top_product": max(r["products"].items(), key=lambda kv: kv[1])[0],
        }
        for name, r in sorted(regions.items(), key=lambda kv: -kv[1]["revenue"])
    ],
}
with open("/app/report.json", "w") as fh:
    json.dump(report, fh, indent=2)
PY
