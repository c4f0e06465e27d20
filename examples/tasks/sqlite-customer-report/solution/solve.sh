#!/bin/bash
# Reference solution with the sqlite3 command line tool.
set -euo pipefail
cd /app
sqlite3 -header -csv shop.db > top_customers.csv <<'SQL'
SELECT c.id AS customer_id,
       c.name,
       c.country,
       COUNT(DISTINCT o.id) AS orders,
       printf('%.2f', SUM(oi.qty * oi.unit_price)) AS revenue
FROM customers c
JOIN orders o ON o.customer_id = c.id
JOIN order_items oi ON oi.order_id = o.id
WHERE o.status = 'completed'
  AND o.ordered_at >= '2023-01-01' AND o.ordered_at < '2024-01-01'
GROUP BY c.id
ORDER BY SUM(oi.qty * oi.unit_price) DESC, c.id
LIMIT 5;
SQL
sqlite3 shop.db <<'SQL'
DROP VIEW IF EXISTS monthly_revenue;
CREATE VIEW monthly_revenue AS
SELECT substr(o.ordered_at, 1, 7) AS month,
       round(SUM(oi.qty * oi.unit_price), 2) AS revenue
FROM orders o
JOIN order_items oi ON oi.order_id = o.id
WHERE o.status = 'completed'
GROUP BY substr(o.ordered_at, 1, 7);
SQL
