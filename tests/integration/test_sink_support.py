"""Synthetic transactions for the sink tests (and a check of the helper itself).

Imported by test_sink_kafka/nats/redis and by their child processes as ``test_sink_support``
(pytest puts this folder on sys.path; the children do it themselves).
"""

from __future__ import annotations

import base64
import json
import random
import uuid
from collections.abc import Iterator

from tidegate.batching import SubBatch, Transaction
from tidegate.events import ChangeEvent
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.sources.postgres.position import Lsn, PgPosition
from tidegate.spec import BatchSpec, PipelineSpec, SinkSpec, SourceSpec

FILE = "mysql-bin.000007"


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def end_pos(tx_no: int, pg: bool = False):
    return PgPosition(Lsn(0x1000000 + tx_no * 0x100), "7300000000000000001", 1) if pg \
        else BinlogPosition(FILE, 4 + tx_no * 1000, server_id=1)


def make_tx(pipeline: str, tx_no: int, rows: int, *, keys: int = 7, table: str = "orders",
            schema: str = "shop", pad: int = 0, noise: bool = False, pg: bool = False,
            tenant: str = "acme") -> Transaction:
    """Transaction ``tx_no`` with ``rows`` rows; row keys cycle over ``keys`` ids and every row
    carries ``seq`` (increasing in source order) so per-key order can be checked. ``pad`` adds
    that many characters per row (incompressible with ``noise``)."""
    evs = []
    for i in range(rows):
        seq = tx_no * 10_000 + i
        k = seq % keys
        last = i == rows - 1
        evs.append(ChangeEvent.build(
            tenant=tenant, pipeline=pipeline, connector="postgresql" if pg else "mysql", db=schema,
            schema=schema, table=table, op="u" if i % 3 else "c", before=None if i % 3 == 0 else {"id": k},
            after={"id": k, "seq": seq, "pad": _pad(pad, noise, seq)}, key={"id": k}, tx_id=f"0-1-{tx_no}",
            event_id=f"{FILE}:{tx_no * 1000 + i}:0", position={"file": FILE, "pos": tx_no * 1000 + i},
            ts_ms=1_764_000_000_000 + tx_no, total_order=i + 1, data_collection_order=i + 1,
            tx_end=last, end_position=end_pos(tx_no, pg) if last else None))
    return Transaction(f"0-1-{tx_no}", end_pos(tx_no, pg), tuple(evs))


def _pad(n: int, noise: bool, seed: int) -> str:
    if not noise:
        return "x" * n
    return base64.b64encode(random.Random(seed).randbytes(n * 3 // 4 + 3)).decode()[:n]


def make_batches(pipeline: str, n_tx: int, rows: int, tx_per_batch: int, *, first_tx: int = 1,
                 **kw) -> list[SubBatch]:
    txs = [make_tx(pipeline, first_tx + n, rows, **kw) for n in range(n_tx)]
    return [SubBatch(i // tx_per_batch + 1, tuple(txs[i:i + tx_per_batch]))
            for i in range(0, len(txs), tx_per_batch)]


def source_items(batches: list[SubBatch], start=None) -> Iterator[ChangeEvent]:
    """The events of ``batches`` as a source would yield them, from after ``start``."""
    for b in batches:
        for tx in b.transactions:
            if start is None or tx.end_position > start:
                yield from tx.events


def all_events(batches: list[SubBatch]) -> list[ChangeEvent]:
    return [ev for b in batches for ev in b.events]


def pipeline_spec(name: str, sink: SinkSpec, schedule: str | None = None) -> PipelineSpec:
    return PipelineSpec(pipeline=name, source=SourceSpec("mysql", "cdc_mysql"), sinks=(sink,),
                        batch=BatchSpec(max_events=20), tenant="acme", schedule=schedule)


def seq_of(value: bytes) -> tuple[int, int]:
    """(key id, seq) of an envelope."""
    env = json.loads(value)
    return env["after"]["id"], env["after"]["seq"]


def test_synthetic_batches_end_at_transaction_boundaries_in_order():
    bs = make_batches("p", 5, 3, 2)
    assert [b.event_count for b in bs] == [6, 6, 3]
    ends = [b.end_position for b in bs]
    assert ends == sorted(ends) and len(set(ends)) == 3
    evs = all_events(bs)
    assert len({e.idempotency_key for e in evs}) == 15
    assert [e.tx_end for e in evs[:3]] == [False, False, True]
    assert list(source_items(bs, start=bs[0].end_position)) == evs[6:]
    assert make_batches("p", 1, 1, 1, pg=True)[0].end_position > make_batches("p", 1, 1, 1, pg=True,
                                                                              first_tx=0)[0].end_position
