"""Fakes for engine unit tests: a scripted stream of transactions and recording sinks."""

from __future__ import annotations

import threading

from tidegate.errors import NonRetryableSinkError
from tidegate.events import ChangeEvent, PositionMark
from tidegate.parts import Parts, chosen_sinks
from tidegate.sink_checkpoints import SinkCheckpoint
from tidegate.sinks.base import RetryPolicy, Sink
from tidegate.sources.base import Source
from tidegate.sources.mysql.position import BinlogPosition

FILE = "mysql-bin.000001"


def pos(n: int, server_id: int | None = None) -> BinlogPosition:
    """The boundary after transaction ``n`` (positions 1000, 2000, ...), on server
    ``server_id`` (None: a position without lineage)."""
    return BinlogPosition(FILE, n * 1000, server_id=server_id)


def event(tx: int, i: int, *, last: bool, table: str = "orders", pad: str = "") -> ChangeEvent:
    return ChangeEvent.build(
        tenant="t", pipeline="p", connector="mysql", db="shop", schema="shop", table=table, op="c",
        before=None, after={"id": tx * 100 + i, "pad": pad}, key={"id": tx * 100 + i},
        tx_id=f"0-1-{tx}", event_id=f"{FILE}:{tx * 1000 - 900 + i}:0",
        position={"file": FILE, "pos": tx * 1000 - 900 + i}, ts_ms=1_700_000_000_000 + tx,
        total_order=i + 1, data_collection_order=i + 1, tx_end=last,
        end_position=pos(tx) if last else None)


def tx_events(tx: int, size: int, **kw) -> list[ChangeEvent]:
    return [event(tx, i, last=i == size - 1, **kw) for i in range(size)]


def stream(sizes: list[int]) -> list:
    """Transactions 1..n with the given row counts; size 0 = a position mark."""
    out: list = []
    for n, size in enumerate(sizes, start=1):
        out += tx_events(n, size) if size else [PositionMark(pos(n))]
    return out


class FakeSink(Sink):
    """Records every delivered event and the store version each delivery extends; fails per a
    script. ``committed``: its sink-side record (a SinkCheckpoint, or a position that extends
    version 0)."""

    kind = "redis"
    retry_policy = RetryPolicy(0.0, 0.0, 3)

    def __init__(self, sink_id: str, *, required: bool = True, fail_from_call: int | None = None,
                 error: Exception | None = None, committed=None, fail_times: int | None = None):
        super().__init__(sink_id=sink_id, pipeline="p", required=required)
        self.fail_from_call = fail_from_call  # 1-based deliver call from which it fails
        self.fail_times = fail_times  # fail only this many attempts, then succeed
        self.error = error or NonRetryableSinkError(f"{sink_id} is down")
        self.committed = committed if committed is None or isinstance(committed, SinkCheckpoint) \
            else SinkCheckpoint(committed, 0)
        self.extends: list[int | None] = []
        self.calls = 0
        self.attempts = 0
        self.delivered: list[str] = []
        self.batches: list = []
        self.opened = self.closed = False
        self._lock = threading.Lock()

    def open(self) -> None:
        self.opened = True

    def committed_checkpoint(self):
        return self.committed

    def deliver(self, batch, extends=None):
        with self._lock:
            self.attempts += 1
            if self.fail_from_call is not None and self.calls + 1 >= self.fail_from_call:
                if self.fail_times is None or self.fail_times > 0:
                    if self.fail_times is not None:
                        self.fail_times -= 1
                    raise self.error
            self.calls += 1
            self.batches.append(batch)
            self.extends.append(extends)
            self.delivered += [e.idempotency_key for e in batch.events]
            return batch.end_position

    def close(self) -> None:
        self.closed = True


class QuietSource(Source):
    """A source whose log is always whole and whose settings are right: tests override the
    reading and identity they script."""

    kind = "mysql"

    def earliest(self):
        return pos(0)

    def check_retention(self, checkpoint, *, first_run):
        return {"status": "ok"}

    def restart_stream(self):
        return self.head()

    def preflight(self, checkpoint=None):
        return []


TWO_SINKS = """
sinks:
  - {id: a, kind: redis, conn_id: r, stream: "{pipeline}:{table}"}
  - {id: b, kind: redis, conn_id: r, stream: "{pipeline}:{table}", required: false}
"""


class FakeParts(Parts):
    """Parts that hand a run the test's source and sinks (by sink id) instead of building them."""

    def __init__(self, source, sinks=()):
        super().__init__()
        self._source = source
        self._sinks = sinks if isinstance(sinks, dict) else {s.sink_id: s for s in sinks}

    def source(self, spec, **_kw):
        return self._source

    def sinks(self, spec, only=None):
        chosen = chosen_sinks(spec, only)
        return [self._sinks[s.id] for s in spec.sinks if s.id in chosen]


def wire_fakes(tmp_path, spec_head: str, source):
    """A spec (``spec_head`` plus sinks a, required, and b, optional) whose runs read ``source``
    and deliver to two :class:`FakeSink`, with a SQLite store: (spec, sinks by id, store, parts)."""
    import textwrap

    from tidegate.spec import load_spec
    from tidegate.store import open_store

    spec_file = tmp_path / "p.yaml"
    spec_file.write_text(textwrap.dedent(spec_head) + TWO_SINKS)
    spec = load_spec(str(spec_file))
    sinks = {"a": FakeSink("a"), "b": FakeSink("b", required=False)}
    return spec, sinks, open_store(f"sqlite:///{tmp_path / 'store.sqlite'}"), FakeParts(source, sinks)
