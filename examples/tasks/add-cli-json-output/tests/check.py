"""Verifier for add-cli-json-output: drives the CLI as a subprocess."""
import json
import os
import shutil
import subprocess
import sys
import tempfile

FAILURES = []


def check(cond, msg):
    if not cond:
        FAILURES.append(msg)
        print("FAIL:", msg)


def close(a, b):
    return isinstance(a, (int, float)) and not isinstance(a, bool) and abs(a - b) < 1e-6


if not os.path.isfile("/app/inventory/cli.py"):
    print("FAIL: /app/inventory is missing")
    sys.exit(1)

tmp = tempfile.mkdtemp()
shutil.copytree("/app/inventory", os.path.join(tmp, "inventory"),
                ignore=shutil.ignore_patterns("__pycache__"))
shutil.copy("/tests/other.csv", tmp)
with open("/tests/golden_stock.txt", encoding="utf-8") as fh:
    golden = fh.read()
# The original stock file (the agent's copy in /app/data could have been edited).
os.makedirs(os.path.join(tmp, "data"))
with open(os.path.join(tmp, "data", "stock.csv"), "w", encoding="utf-8") as fh:
    fh.write('sku,name,qty,price\nB-200,"Bolt, hex M8",1200,0.15\nA-100,Anchor plate,35,4.99\n'
             'C-310,Cable tie (100 pack),0,3.50\nD-007,Drill bit set,12,24.90\n'
             'A-105,Angle bracket,250,0.89\nE-500,Extension cord 10m,7,18.25\n')


def run(*args):
    return subprocess.run([sys.executable, "-B", "-m", "inventory", "report", *args],
                          cwd=tmp, capture_output=True, text=True, timeout=60)


def run_json(*args):
    r = run(*args)
    check(r.returncode == 0, f"{args}: exit status {r.returncode}, stderr: {r.stderr[-500:]}")
    try:
        return json.loads(r.stdout)
    except ValueError:
        check(False, f"{args}: stdout is not valid JSON: {r.stdout[:300]!r}")
        return None


# 1. default text output unchanged
r = run("data/stock.csv")
check(r.returncode == 0 and r.stdout == golden, "default text output changed")
r = run("data/stock.csv", "--format", "text")
check(r.returncode == 0 and r.stdout == golden, "--format text differs from the default output")

# 2. text + --min-qty
r = run("--min-qty", "35", "data/stock.csv")
want = "\n".join(golden.splitlines()[i] for i in (0, 1, 2, 3)) + "\nTOTAL 3 items, value 577.15\n"
check(r.returncode == 0 and r.stdout == want, f"--min-qty 35 text output wrong:\n{r.stdout}")
r = run("data/stock.csv", "--min-qty", "0")
check(r.returncode == 0 and r.stdout == golden, "--min-qty 0 must keep every item")

# 3. JSON output
doc = run_json("data/stock.csv", "--format", "json")
if isinstance(doc, dict):
    items = doc.get("items")
    check(isinstance(items, list) and [i.get("sku") for i in items] ==
          ["A-100", "A-105", "B-200", "C-310", "D-007", "E-500"], "JSON items missing or not sorted by sku")
    if isinstance(items, list) and len(items) == 6:
        b = items[2]
        check(b.get("name") == "Bolt, hex M8" and b.get("qty") == 1200 and type(b.get("qty")) is int
              and close(b.get("price"), 0.15) and close(b.get("value"), 180.0),
              f"JSON item for B-200 wrong: {b}")
        check(all(set(i) == {"sku", "name", "qty", "price", "value"} for i in items),
              "JSON items must have exactly the keys sku, name, qty, price, value")
    check(doc.get("total_items") == 6 and type(doc.get("total_items")) is int, "total_items wrong")
    check(close(doc.get("total_value"), 1003.70), f"total_value wrong: {doc.get('total_value')}")
    check(set(doc) == {"items", "total_items", "total_value"}, f"unexpected top-level keys {sorted(doc)}")
elif doc is not None:
    check(False, "JSON output must be an object")

# 4. JSON + filter on other data (rounding, ordering, options first)
doc = run_json("--format", "json", "--min-qty", "10", "other.csv")
if isinstance(doc, dict):
    items = doc.get("items") or []
    check([i.get("sku") for i in items] == ["A-1", "K-55", "M-1"], f"filtered JSON skus wrong: {items}")
    if len(items) == 3:
        check(close(items[2].get("value"), 93.32) and close(items[2].get("price"), 2.33),
              f"rounding wrong for M-1: {items[2]}")
        check(close(items[1].get("value"), 5.0), f"value wrong for K-55: {items[1]}")
    check(doc.get("total_items") == 3, "filtered total_items wrong")
    check(close(doc.get("total_value"), round(10 * 1.005, 2) + 5.0 + 93.32),
          f"filtered total_value wrong: {doc.get('total_value')}")
doc = run_json("other.csv", "--format=json", "--min-qty=1000")
if isinstance(doc, dict):
    check(doc.get("items") == [] and doc.get("total_items") == 0 and close(doc.get("total_value"), 0.0),
          f"empty result wrong: {doc}")

# 5. usage errors
for bad in (["--min-qty", "-1"], ["--min-qty", "abc"], ["--min-qty", "2.5"], ["--format", "xml"]):
    r = run("data/stock.csv", *bad)
    check(r.returncode == 2 and r.stdout == "" and r.stderr.strip() != "",
          f"{bad}: expected exit status 2 with an error on stderr and empty stdout, "
          f"got {r.returncode}, stdout={r.stdout[:100]!r}")

shutil.rmtree(tmp, ignore_errors=True)
if FAILURES:
    sys.exit(1)
print("PASS")
