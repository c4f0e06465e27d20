#!/bin/bash
# Reference solution: rewrite cli.py with the two new options.
set -euo pipefail
cat > /app/inventory/cli.py <<'PY'
"""Command line interface: python3 -m inventory report FILE"""
import argparse
import json

from . import store


def format_text(items):
    lines = [f"{'SKU':<8} {'NAME':<24} {'QTY':>5} {'PRICE':>9} {'VALUE':>10}"]
    for it in items:
        lines.append(f"{it.sku:<8} {it.name:<24} {it.qty:>5} {it.price:>9.2f} {it.value:>10.2f}")
    total = round(sum(it.value for it in items), 2)
    lines.append(f"TOTAL {len(items)} items, value {total:.2f}")
    return "\n".join(lines)


def format_json(items):
    return json.dumps({
        "items": [
            {"sku": it.sku, "name": it.name, "qty": it.qty,
             "price": round(it.price, 2), "value": it.value}
            for it in items
        ],
        "total_items": len(items),
        "total_value": round(sum(it.value for it in items), 2),
    }, indent=2)


def non_negative_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {value}")
    return value


def cmd_report(args):
    items = sorted(store.load(args.file), key=lambda it: it.sku)
    if args.min_qty is not None:
        items = [it for it in items if it.qty >= args.min_qty]
    print(format_json(items) if args.format == "json" else format_text(items))
    return 0


def build_parser():
    parser = argparse.ArgumentParser(prog="inventory")
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="print a stock report")
    report.add_argument("file", help="stock CSV file")
    report.add_argument("--min-qty", type=non_negative_int, default=None,
                        help="only include items with at least this quantity")
    report.add_argument("--format", choices=("text", "json"), default="text",
                        help="output format (default: text)")
    report.set_defaults(func=cmd_report)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)
PY
