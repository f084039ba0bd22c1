"""Child of test_store_crash: writes checkpoints in a loop until it is SIGKILLed.

Each iteration writes two sinks' checkpoints in one store transaction, then prints the
acknowledged step number (flushed), so the parent knows what the store promised.
"""

import sys

from tidegate.sources.mysql.position import BinlogPosition
from tidegate.store import open_store


def main(url: str, run_id: str) -> None:
    store = open_store(url)
    epoch = store.leases.acquire("crash", run_id)
    rec = store.checkpoints.get("crash", "a")
    step = rec.position.pos if rec else 0
    print(f"start {step}", flush=True)
    while True:
        step += 1
        pos = BinlogPosition("mysql-bin.000001", step)
        store.checkpoints.write_many("crash", {"a": pos, "b": pos}, run_id=run_id, epoch=epoch)
        print(step, flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
