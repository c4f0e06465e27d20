"""Command line interface: python3 -m inventory report FILE"""
import argparse

from . import store


def format_text(items):
    lines = [f"{'SKU':<8} {'NAME':<24} {'QTY':>5} {'PRICE':>9} {'VALUE':>10}"]
    for it in items:
        lines.append(f"{it.sku:<8} {it.name:<24} {it.qty:>5} {it.price:>9.2f} {it.value:>10.2f}")
    total = round(sum(it.value for it in items), 2)
    lines.append(f"TOTAL {len(items)} items, value {total:.2f}")
    return "\n".join(lines)


def cmd_report(args):
    items = sorted(store.load(args.file), key=lambda it: it.sku)
    print(format_text(items))
    return 0


def build_parser():
    parser = argparse.ArgumentParser(prog="inventory")
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="print a stock report")
    report.add_argument("file", help="stock CSV file")
    report.set_defaults(func=cmd_report)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    return args.func(args)
