"""What the NATS sink's read-back costs a recovering run: reading back the ids a killed run
stored after the sink's last commit marker, then matching the next run's messages against them,
on the same server (by id) and on the other server of a GTID pair (by transaction and place,
what the stream holds after the marker fetched whole, once).

    eval "$(scripts/services env)"
    .venv/bin/python benchmarks/nats_read_back.py               # 20,000 stored changes
    .venv/bin/python benchmarks/nats_read_back.py --stored 5000 --rows-per-tx 5

The stream is unique per run and deleted afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import nats

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "include"))

from tidegate.connections import get_connection  # noqa: E402
from tidegate.events import ChangeEvent  # noqa: E402
from tidegate.sinks.nats.read_back import Stored, stored_changes, stored_ids  # noqa: E402


def changes(n: int, rows_per_tx: int, file: str, step: int) -> list[ChangeEvent]:
    """``n`` changes in transactions of ``rows_per_tx``, at positions of one server's log."""
    return [ChangeEvent.build(
        tenant="default", pipeline="bench", connector="mysql", db="shop", schema="shop", table="t",
        op="c", before=None, after={"id": i, "v": "x" * 100}, key={"id": i}, tx_id=f"0-1-{i // rows_per_tx}",
        event_id=f"{file}:{1000 + i * step}:0", position={}, ts_ms=1_764_000_000_000,
        total_order=i % rows_per_tx + 1, data_collection_order=i % rows_per_tx + 1) for i in range(n)]


async def matched(client: SimpleNamespace, stream: str, ids: set[str], events: list[ChangeEvent]
                  ) -> tuple[float, int]:
    stored = Stored(lambda after: stored_changes(client, stream, [f"{stream.lower()}.>"], after))
    stored.add(ids, 0)
    t = time.perf_counter()
    held = sum([await stored.holds(ev.idempotency_key, ev.value) for ev in events])
    return time.perf_counter() - t, held


async def main(a: argparse.Namespace) -> None:
    conn = get_connection("cdc_nats")
    nc = await nats.connect(f"nats://{conn.host}:{conn.port}", user=conn.login, password=conn.password)
    js = nc.jetstream()
    stream = f"RB_{uuid.uuid4().hex[:8].upper()}"
    await js.add_stream(name=stream, subjects=[f"{stream.lower()}.>"])
    client = SimpleNamespace(nc=nc, js=js, publish_timeout_s=10.0)
    try:
        primary = changes(a.stored, a.rows_per_tx, "mysql-bin.000003", 90)
        replica = changes(a.stored, a.rows_per_tx, "mysql-bin.000001", 87)
        acks = [await js.publish_async(f"{stream.lower()}.t", ev.value,
                                       headers={"Nats-Msg-Id": ev.idempotency_key}) for ev in primary]
        await asyncio.gather(*acks)
        t = time.perf_counter()
        ids = await stored_ids(client, stream, [f"{stream.lower()}.>"], 0, "none.")
        read_s = time.perf_counter() - t
        same_s, same = await matched(client, stream, ids, primary)
        other_s, other = await matched(client, stream, ids, replica)
        assert len(ids) == same == other == a.stored, (len(ids), same, other)
        print(f"{a.stored:,} stored changes, {a.rows_per_tx} per transaction:")
        print(f"  read back (headers only)        {read_s:7.2f} s  {a.stored / read_s:9,.0f} ids/s")
        print(f"  matched on the same server      {same_s:7.2f} s  {a.stored / same_s:9,.0f} messages/s")
        print(f"  matched on the other server     {other_s:7.2f} s  {a.stored / other_s:9,.0f} messages/s "
              f"(the stored messages fetched whole, once)")
    finally:
        await js.delete_stream(stream)
        await nc.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stored", type=int, default=20_000)
    ap.add_argument("--rows-per-tx", type=int, default=1)
    asyncio.run(main(ap.parse_args()))
