"""What column filters cost per event, without a server: CPU microseconds to build and serialize
an event of an 11-column row (as a reader does before delivery), without filters and with four
rules on the table (exclude, mask, hash, truncate: filters.py).

    .venv/bin/python benchmarks/filters.py [--events 100000]

The no-filter figure is what every pipeline without ``source.columns`` pays; the source's read
path does not touch its events then (``Source.filtered`` returns the decoder's items as they
are). ``benchmarks/source_read.py`` measures the whole read path against the servers.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "include"))

from tidegate.events import ChangeEvent  # noqa: E402
from tidegate.filters import ColumnFilters, ColumnRules, filter_items  # noqa: E402


def events(n: int):
    for i in range(n):
        row = {"id": i, "customer": i % 977, "status": "paid", "total": "123.45", "qty": 3,
               "price": 41.5, "note": "a note of some length for the row",
               "created": "2026-01-02T03:04:05.123456", "updated": "2026-01-02T03:04:05.123+00:00",
               "flag": 1, "code": "ABCDEFGH"}
        yield ChangeEvent.native("t", "p", "mysql", "shop", "shop", "orders", "c", None, row, {"id": i},
                                 "0-1-1", f"f:{i}:0", {"file": "f", "pos": i, "row": 0}, 1_700_000_000_000,
                                 1, 1, "false", False, None, True)


def measure(n: int, filtered: bool) -> float:
    rules = (ColumnRules("shop.orders", exclude=("note",), mask=(("status", "***"),),
                         hash=("customer",), truncate=(("code", 3),)),)
    items = events(n)
    if filtered:
        items = filter_items(items, ColumnFilters(rules, b"a-salt"))
    t0 = time.process_time()
    for ev in items:
        ev.value  # noqa: B018 - serialize, as a reader does
    return (time.process_time() - t0) / n * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=100_000)
    n = ap.parse_args().events
    plain = min(measure(n, False) for _ in range(3))
    rules = min(measure(n, True) for _ in range(3))
    print(f"{n} events: {plain:.2f} us/event without filters, {rules:.2f} us/event with 4 column rules "
          f"(+{rules - plain:.2f} us)")


if __name__ == "__main__":
    main()
