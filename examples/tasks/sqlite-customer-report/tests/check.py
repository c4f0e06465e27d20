"""Verifier for sqlite-customer-report."""
import csv
import hashlib
import sqlite3
import sys

EXPECTED_CSV = [
    ["customer_id", "name", "country", "orders", "revenue"],
    ["10", "Jonas Weber", "DE", "15", "2061.97"],
    ["13", "Mateo Silva", "PT", "7", "1669.61"],
    ["3", "Chloe Dubois", "FR", "9", "1436.16"],
    ["7", "Greta Lind", "SE", "9", "1363.63"],
    ["1", "Ada Byrne", "IE", "9", "1299.50"],
]
EXPECTED_MONTHS = [
    ("2022-10", 1419.78), ("2022-11", 1141.94), ("2022-12", 2506.75), ("2023-01", 922.41),
    ("2023-02", 562.05), ("2023-03", 1183.44), ("2023-04", 1151.91), ("2023-05", 1231.56),
    ("2023-06", 1660.19), ("2023-07", 375.25), ("2023-08", 2048.41), ("2023-09", 1962.78),
    ("2023-10", 991.70), ("2023-11", 1532.43), ("2023-12", 946.55), ("2024-01", 1805.22),
    ("2024-02", 539.85),
]
TABLE_DIGESTS = {
    ("customers", "id"): "52f0e53850df4d0db710ef78c89b82f7f93e33688f01689747f1f31619eb0859",
    ("products", "id"): "f2383f1f6e77e44fbecb86c9925aefc4dc06fc39553847624acd35243dd619da",
    ("orders", "id"): "e4e6c4bf2f070ba9779affc2a3fc51ca7b03aef025fa1cd2d9df16002e986c55",
    ("order_items", "order_id, product_id"): "717e980737257dbed7b4d3ee8eb068d923c0ababd5981441280df05c8a7b4ed3",
}


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


# 1. CSV report
try:
    with open("/app/top_customers.csv", newline="", encoding="utf-8") as fh:
        rows = [r for r in csv.reader(fh) if r]
except OSError as e:
    fail(f"cannot read /app/top_customers.csv: {e}")
if rows != EXPECTED_CSV:
    fail("top_customers.csv is wrong.\nexpected: %s\ngot:      %s" % (EXPECTED_CSV, rows))

# 2. view + untouched data
try:
    db = sqlite3.connect("file:/app/shop.db?mode=ro", uri=True)
    for (table, order), digest in TABLE_DIGESTS.items():
        data = db.execute(f"SELECT * FROM {table} ORDER BY {order}").fetchall()
        if hashlib.sha256(repr(data).encode()).hexdigest() != digest:
            fail(f"table {table} was modified")
    kind = db.execute("SELECT type FROM sqlite_master WHERE name = 'monthly_revenue'").fetchone()
    if not kind or kind[0] != "view":
        fail("monthly_revenue view does not exist")
    got = db.execute("SELECT month, revenue FROM monthly_revenue ORDER BY month").fetchall()
except sqlite3.Error as e:
    fail(f"database error: {e}")
if [m for m, _ in got] != [m for m, _ in EXPECTED_MONTHS]:
    fail(f"monthly_revenue months wrong: {[m for m, _ in got]}")
for (month, rev), (_, want) in zip(got, EXPECTED_MONTHS):
    if isinstance(rev, bool) or not isinstance(rev, (int, float)) or abs(rev - want) > 0.005:
        fail(f"monthly_revenue for {month}: expected {want}, got {rev!r}")
print("PASS")
