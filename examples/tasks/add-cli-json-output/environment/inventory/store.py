"""Loading stock data."""
import csv
from dataclasses import dataclass


@dataclass
class Item:
    sku: str
    name: str
    qty: int
    price: float

    @property
    def value(self):
        return round(self.qty * self.price, 2)


def load(path):
    """Read a stock CSV file (columns: sku,name,qty,price) into a list of Items."""
    with open(path, newline="", encoding="utf-8") as fh:
        return [
            Item(row["sku"], row["name"], int(row["qty"]), float(row["price"]))
            for row in csv.DictReader(fh)
        ]
