#!/bin/bash
# Reference solution.
set -euo pipefail
cat > /app/crontab <<'CRON'
SHELL=/bin/bash
MAILTO=ops@example.com
PATH=/usr/local/bin:/usr/bin:/bin

# m    h     dom mon dow  command
30     2     *   *   *    /app/bin/backup.sh >> /app/logs/backup.log 2>&1
*/15   *     *   *   *    /app/bin/rotate-logs.sh >> /app/logs/rotate-logs.log 2>&1
0      8     *   *   1-5  /app/bin/report.sh >> /app/logs/report.log 2>&1
0      3     1   *   *    /app/bin/cleanup.sh >> /app/logs/cleanup.log 2>&1
*/5    9-17  *   *   mon-fri /app/bin/healthcheck.sh >> /app/logs/healthcheck.log 2>&1
CRON
chmod +x /app/bin/*.sh
