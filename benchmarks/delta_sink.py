"""(Not benchmarks/delta.py: run as a script, that name would shadow the delta-spark package.)

Delta sink throughput: 1M changes over a 200k-row table delivered in one run (one sub-batch) on
local[2], in ``mode: merge`` and ``mode: changelog``.

    python benchmarks/delta_sink.py [--rows 200000] [--changes 1000000] [--mode merge|changelog|both]
    python benchmarks/delta_sink.py --sub-batches 10 [--changes 40] [--rows 2000]  # the fixed cost

First a snapshot of ``--rows`` rows (op r) is delivered, then ``--changes`` changes (creates, updates,
a few key changes and deletes over random keys) in one sub-batch. Printed per mode: the wall time
of the change run, the time building the events (Python, not part of a run: a run's events come
from the source), the time inside Spark stages (the union of the stages' submit-to-complete
intervals, from Spark's status REST API) and its share of the run.

With ``--sub-batches N`` the changes go instead as N sub-batches of ``--changes`` each (what a
continuous pipeline or a small ``max_events`` makes), by a sink holding a lease epoch (so it
checks its fence as a run's sink does), and it prints the cost of one sub-batch: wall time,
Spark jobs, and its split into the fence checks, the table's MERGE or append and the checkpoint
table's commit (timed around the sink's own methods). Run it under
``flock /tmp/tidegate-bench.lock``; the machine may be shared, so compare figures of one run.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "include"))

from tidegate.batching import SubBatch, Transaction  # noqa: E402
from tidegate.events import ChangeEvent  # noqa: E402
from tidegate.sinks.delta.jars import spark_conf  # noqa: E402
from tidegate.sinks.delta.sink import DeltaSink  # noqa: E402
from tidegate.sinks.delta.spec import DeltaSinkSpec  # noqa: E402
from tidegate.sources.mysql.position import BinlogPosition  # noqa: E402
from tidegate.spec import BatchSpec, PipelineSpec, SourceSpec  # noqa: E402

FILE = "mysql-bin.000001"
TX_ROWS = 100  # rows per source transaction


def row(k: int, v: int) -> dict:
    return {"id": k, "name": f"customer {k}", "status": ("new", "paid", "shipped")[v % 3], "qty": v,
            "total": f"{k % 500}.99", "ratio": v / 7, "flag": v % 2 == 0, "at": "2026-01-02T03:04:05"}


def events(pipeline: str, changes: list[tuple[str, int, int, int | None]], tx0: int) -> SubBatch:
    """One sub-batch of transactions of TX_ROWS events each."""
    txs, evs = [], []
    for i, (op, k, v, old) in enumerate(changes):
        tx = tx0 + i // TX_ROWS
        before = row(old if old is not None else k, v - 1) if op in ("u", "d") else None
        after = row(k, v) if op != "d" else None
        key = {"id": old if op == "d" and old is not None else k}
        last = (i + 1) % TX_ROWS == 0 or i == len(changes) - 1
        end = BinlogPosition(FILE, 4 + tx * 10_000, server_id=1)
        evs.append(ChangeEvent.native("bench", pipeline, "mysql", "shop", "shop", "orders", op, before, after,
                                      key, f"0-1-{tx}", f"{FILE}:{tx * 10_000 + i % TX_ROWS}:0",
                                      {"file": FILE, "pos": tx * 10_000 + i % TX_ROWS},
                                      1_764_000_000_000 + tx,
                                      i % TX_ROWS + 1, i % TX_ROWS + 1, "true" if op == "r" else "false",
                                      last, end if last else None))
        if last:
            txs.append(Transaction(f"0-1-{tx}", end, tuple(evs)))
            evs = []
    return SubBatch(1, tuple(txs))


def workload(rows: int, changes: int, seed: int = 3) -> tuple[list, list]:
    rnd = random.Random(seed)
    snap = [("r", k, 0, None) for k in range(1, rows + 1)]
    live = list(range(1, rows + 1))
    next_k, out = rows + 1, []
    for v in range(1, changes + 1):
        p = rnd.random()
        if p < 0.15:
            out.append(("c", next_k, v, None))
            live.append(next_k)
            next_k += 1
        elif p < 0.9:
            out.append(("u", rnd.choice(live), v, None))
        else:  # delete (as the first half of a key change, half the time)
            i = rnd.randrange(len(live))
            old = live[i]
            out.append(("d", old, v, old))
            if p < 0.95:
                out.append(("c", next_k, v, None))
                live[i] = next_k
                next_k += 1
            else:
                live[i] = live[-1]
                live.pop()
    return snap, out[:changes]


def stage_seconds(ui: str, since_ms: float) -> float:
    """Seconds covered by Spark stages that started after ``since_ms`` (union of intervals)."""
    apps = json.load(urllib.request.urlopen(f"{ui}/api/v1/applications"))
    url = f"{ui}/api/v1/applications/{apps[0]['id']}/stages?status=complete"
    stages = json.load(urllib.request.urlopen(url))
    spans = []
    for s in stages:
        if not s.get("submissionTime") or not s.get("completionTime"):
            continue
        a, b = (_ms(s["submissionTime"]), _ms(s["completionTime"]))
        if a >= since_ms:
            spans.append((a, b))
    total, end = 0.0, 0.0
    for a, b in sorted(spans):
        if b > end:
            total += b - max(a, end)
            end = b
    return total / 1000


def _ms(text: str) -> float:
    import datetime as dt

    return dt.datetime.strptime(text.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp() * 1000


class Phases:
    """Seconds spent in named methods of an object, timed around its own bound methods."""

    def __init__(self, obj: object, names: tuple[str, ...]):
        self.seconds = dict.fromkeys(names, 0.0)
        for name in names:
            setattr(obj, name, self._timed(name, getattr(obj, name)))

    def _timed(self, name, fn):
        def timed(*args, **kw):
            t = time.monotonic()
            try:
                return fn(*args, **kw)
            finally:
                self.seconds[name] += time.monotonic() - t
        return timed


def spark_jobs(ui: str) -> int:
    apps = json.load(urllib.request.urlopen(f"{ui}/api/v1/applications"))
    return len(json.load(urllib.request.urlopen(f"{ui}/api/v1/applications/{apps[0]['id']}/jobs")))


def opened_sink(lake: str, mode: str, max_events: int, epoch: int | None) -> DeltaSink:
    """The mode's sink, open; ``epoch``: as under a run's lease (the sink claims its checkpoint
    table and checks its fence at every sub-batch), None: no lease."""
    spec = DeltaSinkSpec(id=mode, kind="delta", conn_id="", mode=mode,
                         path=lake + "/{pipeline}/" + mode + "/{schema}/{table}")
    pipeline = PipelineSpec(pipeline="bench", source=SourceSpec("mysql", "x"), sinks=(spec,),
                            batch=BatchSpec(max_events=max_events), tenant="bench")
    sink = DeltaSink(pipeline, spec, None)
    sink.epoch = epoch
    sink.open()
    return sink


def one_run_cost(spark, ui: str, lake: str, sink: DeltaSink, mode: str, snap_rows: int,
                 changes: list) -> None:
    """Every change in one sub-batch: wall time, time in Spark stages, the table's rows after."""
    t = time.monotonic()
    batch = events("bench", changes, 1 + snap_rows // TX_ROWS + 1)
    build = time.monotonic() - t
    t0_ms = time.time() * 1000
    t = time.monotonic()
    sink.deliver(batch, 2)
    wall = time.monotonic() - t
    in_stages = stage_seconds(ui, t0_ms)
    n = spark.read.format("delta").load(f"{lake}/bench/{mode}/shop/orders").count()
    print(f"mode {mode}: {len(changes)} changes in one run: {wall:.1f}s wall "
          f"({len(changes) / wall:,.0f} changes/s), {in_stages:.1f}s in Spark stages "
          f"({100 * in_stages / wall:.0f}%), events built in {build:.1f}s (not part of the run); "
          f"table rows after: {n}")


def sub_batch_cost(ui: str, sink: DeltaSink, mode: str, snap_rows: int, changes: list, n: int,
                   size: int) -> None:
    """``n`` sub-batches of ``size`` changes, one deliver each: the cost of one, and its parts."""
    phases = Phases(sink, ("_check_fence", "_write_checkpoint"))
    table_phase = Phases(sink.tables, ("merge", "append"))
    tx0 = 1 + snap_rows // TX_ROWS + 1
    jobs0, t = spark_jobs(ui), time.monotonic()
    for i in range(n):
        sink.deliver(events("bench", changes[i * size:(i + 1) * size], tx0 + i), 2 + i)
    wall = time.monotonic() - t
    split = {**phases.seconds, **table_phase.seconds}
    table = split["merge" if mode == "merge" else "append"]
    print(f"mode {mode}: {n} sub-batches of {size} changes: {wall / n:.2f}s per sub-batch, "
          f"{(spark_jobs(ui) - jobs0) / n:.0f} Spark jobs per sub-batch; per sub-batch: fence checks "
          f"(two) {split['_check_fence'] / n:.2f}s, table {table / n:.2f}s, "
          f"checkpoint table {split['_write_checkpoint'] / n:.2f}s")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, help="default 200000; 2000 with --sub-batches")
    p.add_argument("--changes", type=int, help="default 1000000; 40 (per sub-batch) with --sub-batches")
    p.add_argument("--mode", choices=("merge", "changelog", "both"), default="both")
    p.add_argument("--sub-batches", type=int, default=0,
                   help="deliver --changes per sub-batch this many times")
    args = p.parse_args()
    small = args.sub_batches > 0
    args.rows = args.rows or (2000 if small else 200_000)
    args.changes = args.changes or (40 if small else 1_000_000)
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master("local[2]").appName("tidegate-bench-delta")
         .config("spark.ui.port", "4077"))
    for k, v in {**spark_conf(), "spark.driver.memory": "3g"}.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    ui = spark.sparkContext.uiWebUrl
    t = time.monotonic()
    snap, changes = workload(args.rows, args.changes * max(args.sub_batches, 1))
    print(f"workload: {len(snap)} snapshot rows, {len(changes)} changes "
          f"({time.monotonic() - t:.1f}s to plan)")
    modes = ("merge", "changelog") if args.mode == "both" else (args.mode,)
    with tempfile.TemporaryDirectory(prefix="tidegate-bench-delta-") as lake:
        for mode in modes:
            sink = opened_sink(lake, mode, args.changes, epoch=1 if small else None)
            sink.deliver(events("bench", snap, 1), 1)
            if small:
                sub_batch_cost(ui, sink, mode, len(snap), changes, args.sub_batches, args.changes)
            else:
                one_run_cost(spark, ui, lake, sink, mode, len(snap), changes)
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
