"""A scripted source for the operator tests: the operators run the engine's real guards, bounds
and release against it (through the ``parts`` of the task) and a SQLite store, so the tests
replace no engine function."""

from __future__ import annotations

from typing import Any

from tidegate.errors import SnapshotError
from tidegate.parts import Parts, chosen_sinks
from tidegate.positions import position_from_json
from tidegate.sinks.base import Sink
from tidegate.sources.base import SnapshotReads, Source, snapshot_tables_of
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.sources.preflight import WARNING, Problem

MYSQL_UPTO = {"kind": "mysql", "file": "mysql-bin.000004", "pos": 900, "gtid_set": None, "server_id": 1,
              "server_uuid": None}
MYSQL_OLD = {"kind": "mysql", "file": "mysql-bin.000004", "pos": 400, "gtid_set": None, "server_id": 1,
             "server_uuid": None}
IDENTITY = {"kind": "mysql", "server_id": 1, "server_uuid": None}


class ScriptedSource(Source):
    """A MySQL-like source whose head is ``MYSQL_UPTO``, whose range always holds changes unless
    ``idle``, and whose guard answers are scripted; every call a guard or a step makes is in
    ``calls`` (``identity``, ``retention``, ``preflight``, ``earliest``, ``release``)."""

    kind = connector = "mysql"

    def __init__(self, *, idle: bool = False, retention: BaseException | None = None,
                 preflight: Any = (), kind: str = "mysql"):
        self.kind = kind
        self.idle, self.retention, self.problems = idle, retention, preflight
        self.calls: list[str] = []

    def identity(self) -> dict[str, Any]:
        self.calls.append("identity")
        return {**IDENTITY, "kind": self.kind}

    def head(self) -> BinlogPosition:
        return position_from_json(MYSQL_UPTO)

    def earliest(self) -> BinlogPosition:
        self.calls.append("earliest")
        return position_from_json(MYSQL_OLD)

    def read(self, start, upto):
        return iter(())

    def has_changes(self, start, upto) -> bool:
        return not self.idle

    def check_retention(self, checkpoint, *, first_run):
        self.calls.append("retention")
        if self.retention is not None:
            raise self.retention
        return {"status": "ok"}

    def restart_stream(self):
        return self.head()

    def preflight(self, checkpoint=None):
        self.calls.append("preflight")
        if isinstance(self.problems, BaseException):
            raise self.problems
        return [Problem("retention", "binlog_expire_logs_seconds", p, WARNING) if isinstance(p, str) else p
                for p in self.problems]

    def release(self, position) -> None:
        self.calls.append("release")

    def snapshots(self):
        return ScriptedSnapshots(self)


class ScriptedSnapshots(SnapshotReads):
    """The captured tables exist, each keyed by ``id`` (a test stops before any chunk)."""

    def tables(self, tables=None):
        spec = self.source.spec
        captured = list(spec.source.tables)
        return snapshot_tables_of(spec.pipeline, captured, set(captured), tables,
                                  lambda schema, table: ["id"], "")

    def chunk_plan(self, table, chunk_rows):
        raise SnapshotError("the scripted source has no rows to cut into chunks")

    def open_chunk(self, table, lo, hi):
        raise SnapshotError("the scripted source has no rows to read")


class ListSink(Sink):
    """A sink that keeps what it is sent (the delivery of a run that reads the scripted source)."""

    kind = "redis"

    def __init__(self, sink_id: str, pipeline: str):
        super().__init__(sink_id=sink_id, pipeline=pipeline, required=True)
        self.delivered: list[str] = []

    def committed_checkpoint(self):
        return None

    def deliver(self, batch, extends=None):
        self.delivered += [e.idempotency_key for e in batch.events]
        return batch.end_position


class ScriptedParts(Parts):
    """Hands every task its scripted source, and the run's sinks as :class:`ListSink` (the tasks
    but deliver contact none)."""

    def __init__(self, source: ScriptedSource):
        super().__init__()
        self._source = source

    def source(self, spec, **_kw):
        self._source.spec = spec
        return self._source

    def sinks(self, spec, only=None):
        return [ListSink(sid, spec.pipeline) for sid in sorted(chosen_sinks(spec, only))]


def wire(source: ScriptedSource, *operators) -> ScriptedSource:
    """Give ``operators`` the scripted source (the ``parts`` every tidegate task is built with)."""
    for op in operators:
        op.parts = ScriptedParts(source)
    return source
