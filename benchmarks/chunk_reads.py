"""What keeping a snapshot chunk's first read costs (tidegate.chunk_reads: a pipeline with two
sinks or more writes every chunk's events to the checkpoint store before delivering them).

    eval "$(scripts/services env)"
    .venv/bin/python benchmarks/kept.py [--chunks 10] [--chunk-rows 50000] [--store URL]

Builds ``--chunk-rows`` snapshot row events of an 11-column row (the columns of
benchmarks/snapshot.py's table) as a chunk read does, with their envelopes, keys and idempotency
keys serialized (a delivery computes and keeps them anyway), then per chunk: encodes them and writes
them to the store and decodes them again (``keep``: what a run adds before delivering a chunk,
which it delivers from the kept bytes), reads them back and decodes them (``reuse``: a rerun
that reaches a kept chunk), and lets them go. Prints rows/s of each (best of the chunks, and
the median), the kept bytes per row and the events' own. The store is ``--store`` (default:
``TIDEGATE_CHECKPOINT_STORE``, else the services' PostgreSQL as its admin connection), in a
pipeline named ``bench_chunk_reads_<random>``, cleaned after.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
import os
import secrets
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "include"))

from tidegate import snapshot  # noqa: E402
from tidegate.run import RunContext  # noqa: E402
from tidegate.snapshot import kept  # noqa: E402
from tidegate.sources.base import SnapshotTable  # noqa: E402
from tidegate.sources.mysql.position import BinlogPosition  # noqa: E402
from tidegate.spec import load_spec_text  # noqa: E402
from tidegate.store import open_store  # noqa: E402
from tidegate.store.records import SnapshotRecord  # noqa: E402


def row(i: int) -> dict:
    return {"id": i, "customer_id": i % 1000, "status": ("new", "paid", "shipped")[i % 3],
            "amount": decimal.Decimal(i) / 7, "qty": i % 50, "weight": i / 3.0,
            "note": f"order {i} for customer {i % 1000}", "created": dt.datetime(2026, 1, 1, 12, 0, i % 60),
            "updated": dt.datetime(2026, 1, 2, 8, 30, i % 60), "flag": i % 2, "code": f"C{i % 9999:07d}"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=10)
    ap.add_argument("--chunk-rows", type=int, default=50_000)
    admin = os.environ.get("AIRFLOW_CONN_CDC_POSTGRES_ADMIN", "")
    ap.add_argument("--store", default=os.environ.get("TIDEGATE_CHECKPOINT_STORE")
                    or admin.replace("postgres://", "postgresql://", 1) or None)
    a = ap.parse_args(argv)
    if not a.store:
        ap.error("no --store and no TIDEGATE_CHECKPOINT_STORE (eval \"$(scripts/services env)\")")
    pipeline = f"bench_chunk_reads_{secrets.token_hex(3)}"
    spec = load_spec_text(f"pipeline: {pipeline}\nsource: {{kind: mysql, conn_id: c}}\n"
                          "sinks: [{id: a, kind: kafka, conn_id: k, topic: t},\n"
                          "        {id: b, kind: redis, conn_id: r, stream: s}]\n")
    table = SnapshotTable("shop", "shop", "orders", ("id",))
    rec = SnapshotRecord(pipeline, "s1", "start", BinlogPosition("bin.000001", 4), [table.to_json()],
                         [{"table": 0, "lo": None, "hi": None}] * a.chunks, 0)
    build = snapshot.RowEvents(spec, rec, table, 1, "mysql")
    events = [build(row(i), "true") for i in range(1, a.chunk_rows + 1)]
    for e in events:  # what delivering them computes anyway (and keeps): not a cost of keeping
        e.value, e.key_bytes, e.idempotency_key  # noqa: B018
    own = sum(len(e.value) + len(e.key_bytes) for e in events)
    store = open_store(a.store)
    keep, reuse, size = [], [], 0
    run = RunContext(spec, store=store)
    try:
        for chunk in range(1, a.chunks + 1):
            upper = BinlogPosition("bin.000001", 99)
            t0 = time.perf_counter()
            first = list(kept.first_read(run, rec, chunk, upper, iter(events))[1])
            t1 = time.perf_counter()
            back = list(kept.first_read(run, rec, chunk, upper, iter(()))[1])
            t2 = time.perf_counter()
            assert len(first) == len(back) == len(events) and back[-1].value == events[-1].value
            size = len(store.snapshots.kept_read(pipeline, "s1", chunk)[1])
            keep.append(a.chunk_rows / (t1 - t0))
            reuse.append(a.chunk_rows / (t2 - t1))
        store.snapshots.forget_reads(pipeline, "s1", a.chunks)
    finally:
        store.close()
    print(f"{a.chunks} chunks of {a.chunk_rows} rows, store {a.store.split(':', 1)[0]}")  # no secret
    print(f"keep (encode + write + decode, every chunk):       {max(keep):>10,.0f} rows/s (best), "
          f"{sorted(keep)[len(keep) // 2]:,.0f} median")
    print(f"reuse (read + decode, a rerun's kept chunk):        {max(reuse):>10,.0f} rows/s (best), "
          f"{sorted(reuse)[len(reuse) // 2]:,.0f} median")
    print(f"kept bytes per row: {size / a.chunk_rows:.0f} (the events' own: {own / a.chunk_rows:.0f}; "
          f"{own / size:.1f}x compressed)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
