"""What the binlog reader's GTID bookkeeping costs per transaction, without a server: CPU
microseconds to add one transaction's GTID to the executed set and take the set (as the end of
every transaction does, for the position its last event carries), by how many server UUIDs
(MySQL) or replication domains (MariaDB) the set holds.

    .venv/bin/python benchmarks/gtid_state.py [--transactions 50000]

A MySQL server that has been failed over to and from keeps one UUID per server it ever had as
primary in ``gtid_executed``; each transaction's cost grows with that number.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "include"))

from tidegate.sources.mysql.position import GtidSet  # noqa: E402
from tidegate.sources.mysql.transactions import GtidState  # noqa: E402


def per_transaction_us(flavor: str, members: int, transactions: int) -> float:
    if flavor == "mysql":
        uuids = [str(uuid.UUID(int=i + 1)) for i in range(members)]
        state = GtidState(GtidSet.parse(",".join(f"{u}:1-1000:1002-5000" for u in uuids)), "mysql")
        add = [f"{uuids[0]}:{5001 + k}" for k in range(transactions)]
        t0 = time.process_time()
        for gtid in add:
            state.add_mysql(gtid)
            state.current()
    else:
        state = GtidState(GtidSet.parse(",".join(f"{d}-1-1000" for d in range(members))), "mariadb")
        t0 = time.process_time()
        for k in range(transactions):
            state.add_mariadb(0, 1, 1001 + k)
            state.current()
    return (time.process_time() - t0) / transactions * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--transactions", type=int, default=50_000)
    args = ap.parse_args()
    print(f"{'flavor':8} {'UUIDs / domains':>16} {'µs per transaction':>19}")
    for flavor in ("mysql", "mariadb"):
        for members in (1, 5, 20):
            print(f"{flavor:8} {members:>16} {per_transaction_us(flavor, members, args.transactions):>19.2f}")


if __name__ == "__main__":
    main()
