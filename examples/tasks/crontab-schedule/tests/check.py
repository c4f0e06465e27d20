"""Verifier for crontab-schedule: parses the crontab and compares schedules semantically."""
import datetime
import os
import re
import sys

EXPECTED_ENV = {"SHELL": "/bin/bash", "MAILTO": "ops@example.com", "PATH": "/usr/local/bin:/usr/bin:/bin"}
EXPECTED_JOBS = {
    "backup": "30 2 * * *",
    "rotate-logs": "0,15,30,45 * * * *",
    "report": "0 8 * * 1,2,3,4,5",
    "cleanup": "0 3 1 * *",
    "healthcheck": "0-59/5 9,10,11,12,13,14,15,16,17 * * 1-5",
}
SCRIPTS = list(EXPECTED_JOBS)
MONTHS = {m: i for i, m in enumerate(
    ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"], 1)}
DAYS = {d: i for i, d in enumerate(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])}
MACROS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
          "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *", "@hourly": "0 * * * *"}


class CronError(Exception):
    pass


def parse_field(text, lo, hi, names=None):
    values = set()
    for part in text.lower().split(","):
        m = re.fullmatch(r"(\*|[a-z0-9]+(?:-[a-z0-9]+)?)(?:/(\d+))?", part)
        if not m:
            raise CronError(f"bad field {text!r}")
        rng, step = m.group(1), int(m.group(2) or 1)
        if step < 1:
            raise CronError(f"bad step in {text!r}")

        def val(tok):
            if names and tok in names:
                return names[tok]
            if not tok.isdigit():
                raise CronError(f"bad value {tok!r} in {text!r}")
            return int(tok)
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            a, b = (val(t) for t in rng.split("-"))
        else:
            a = b = val(rng)
            if m.group(2):
                b = hi
        if not (lo <= a <= hi and lo <= b <= hi and a <= b):
            raise CronError(f"value out of range in {text!r}")
        values.update(range(a, b + 1, step))
    return values


def schedule(spec):
    """Return (set of (hour, minute), set of matching dates in 2024-2025)."""
    fields = spec.split()
    if len(fields) != 5:
        raise CronError(f"need 5 fields: {spec!r}")
    minute = parse_field(fields[0], 0, 59)
    hour = parse_field(fields[1], 0, 23)
    dom = parse_field(fields[2], 1, 31)
    month = parse_field(fields[3], 1, 12, MONTHS)
    dow = {d % 7 for d in parse_field(fields[4], 0, 7, DAYS)}
    dom_star, dow_star = fields[2].startswith("*"), fields[4].startswith("*")
    days = set()
    day = datetime.date(2024, 1, 1)
    while day.year < 2026:
        cron_dow = (day.weekday() + 1) % 7
        if day.month in month:
            d_ok, w_ok = day.day in dom, cron_dow in dow
            if (d_ok and w_ok) if (dom_star or dow_star) else (d_ok or w_ok):
                days.add(day)
        day += datetime.timedelta(days=1)
    return {(h, m) for h in hour for m in minute}, days


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


try:
    with open("/app/crontab", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
except OSError as e:
    fail(f"cannot read /app/crontab: {e}")

env, jobs = {}, {}
for raw in lines:
    line = raw.strip()
    if not line or line.startswith("#"):
        continue
    m = re.fullmatch(r"([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)", line)
    if m:
        value = m.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        env[m.group(1)] = value
        continue
    if line.startswith("@"):
        macro, _, command = line.partition(" ")
        if macro not in MACROS:
            fail(f"unknown macro in line {raw!r}")
        spec = MACROS[macro]
    else:
        parts = line.split(None, 5)
        if len(parts) < 6:
            fail(f"cannot parse crontab line {raw!r}")
        spec, command = " ".join(parts[:5]), parts[5]
    words = command.split()
    m = re.fullmatch(r"/app/bin/([a-z-]+)\.sh", words[0]) if words else None
    if not m or m.group(1) not in EXPECTED_JOBS:
        fail(f"unexpected job: {raw!r}")
    name = m.group(1)
    if name in jobs:
        fail(f"more than one entry for {name}.sh")
    want_cmd = f"/app/bin/{name}.sh >> /app/logs/{name}.log 2>&1"
    if " ".join(words) != want_cmd and " ".join(words).replace(">> ", ">>") != want_cmd.replace(">> ", ">>"):
        fail(f"command for {name}.sh should be {want_cmd!r}, got {command.strip()!r}")
    try:
        jobs[name] = schedule(spec)
    except CronError as e:
        fail(f"invalid schedule for {name}.sh: {e}")

for key, value in EXPECTED_ENV.items():
    if env.get(key) != value:
        fail(f"environment setting {key} should be {value!r}, got {env.get(key)!r}")
for name, spec in EXPECTED_JOBS.items():
    if name not in jobs:
        fail(f"no entry for /app/bin/{name}.sh")
    want_times, want_days = schedule(spec)
    got_times, got_days = jobs[name]
    if got_times != want_times:
        fail(f"{name}.sh runs at the wrong times of day")
    if got_days != want_days:
        fail(f"{name}.sh runs on the wrong days")

for name in SCRIPTS:
    path = f"/app/bin/{name}.sh"
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        fail(f"{path} is not executable")
print("PASS")
