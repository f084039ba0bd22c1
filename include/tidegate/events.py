"""Change events: the Debezium-compatible envelope every sink receives (DESIGN.md).

An event is built by a source, serialized once (``ChangeEvent.value``) and the same bytes go to
every sink. Everything in the envelope derives from the source log, never from the clock, so
two reads of the same range give byte-identical values, keys and ids. In particular the top
level ``ts_ms`` is the source commit time, not the processing time: a replay must produce the
same bytes, and consumers that want processing time have the broker's own timestamp.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .positions import Position

# Namespace for event ids: uuid5(namespace, idempotency_key). Fixed forever: changing it
# changes every event id and breaks consumers' dedup across versions.
EVENT_ID_NAMESPACE = uuid.UUID("6f1c2a9e-5b0d-4c1e-9d3a-7a2e8b4c0d11")

OPS = ("c", "u", "d", "r")


def encode_value(v: Any) -> Any:
    """Map a source value to its JSON-faithful form (DESIGN.md, "Change events").

    DECIMAL → string (no float rounding), bytes → base64, date/time → ISO-8601, MySQL TIME
    (a timedelta, may be negative or over 24 h) → ``[-]HH:MM:SS[.ffffff]``, sets → sorted
    lists, non-finite floats → "NaN"/"Infinity"/"-Infinity" (JSON has no such numbers).
    """
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        if math.isfinite(v):
            return v
        return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")
    if isinstance(v, decimal.Decimal):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(v)).decode("ascii")
    if isinstance(v, dt.datetime):
        return v.isoformat()
    if isinstance(v, (dt.date, dt.time)):
        return v.isoformat()
    if isinstance(v, dt.timedelta):
        return _format_timedelta(v)
    if isinstance(v, uuid.UUID):
        return str(v)
    if isinstance(v, Mapping):
        return {str(k): encode_value(x) for k, x in v.items()}
    if isinstance(v, (set, frozenset)):
        return sorted(encode_value(x) for x in v)
    if isinstance(v, (list, tuple)):
        return [encode_value(x) for x in v]
    raise TypeError(f"no JSON encoding for a value of type {type(v).__name__}")


def _format_timedelta(td: dt.timedelta) -> str:
    micros = td.days * 86_400_000_000 + td.seconds * 1_000_000 + td.microseconds
    sign = "-" if micros < 0 else ""
    micros = abs(micros)
    secs, frac = divmod(micros, 1_000_000)
    h, rem = divmod(secs, 3600)
    m, s = divmod(rem, 60)
    return f"{sign}{h:02d}:{m:02d}:{s:02d}" + (f".{frac:06d}" if frac else "")


def encode_row(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if row is None else {str(k): encode_value(v) for k, v in row.items()}


def idempotency_key(tenant: str, db: str, table: str, tx_id: str, event_id: str) -> str:
    return f"{tenant}|{db}.{table}|{tx_id}|{event_id}"


def event_uuid(key: str) -> str:
    return str(uuid.uuid5(EVENT_ID_NAMESPACE, key))


@dataclass(frozen=True)
class ChangeEvent:
    """One row change. ``before``/``after``/``key`` hold JSON-native values (see
    :func:`encode_row`); sources call :meth:`build` which encodes them.

    ``tx_end`` marks the last row of a source transaction; that row also carries
    ``end_position``, the position just after the transaction's commit (a valid checkpoint).
    """

    tenant: str
    pipeline: str
    connector: str  # "mysql" | "postgresql"
    db: str
    schema: str
    table: str
    op: str
    before: dict[str, Any] | None
    after: dict[str, Any] | None
    key: dict[str, Any] | None
    tx_id: str
    event_id: str
    position: dict[str, Any]  # JSON form of the row's own position in the source log
    ts_ms: int  # source commit time, ms since epoch
    total_order: int  # 1-based index of the row within its transaction
    data_collection_order: int  # 1-based index of the row among its table's rows in the tx
    snapshot: bool = False
    tx_end: bool = False
    end_position: Position | None = field(default=None, compare=False)

    @classmethod
    def build(cls, **kw: Any) -> ChangeEvent:
        for name in ("before", "after", "key"):
            kw[name] = encode_row(kw.get(name))
        ev = cls(**kw)
        ev.validate()
        return ev

    @classmethod
    def from_value(cls, value: bytes, *, tx_end: bool = False,
                   end_position: Position | None = None) -> ChangeEvent:
        """Rebuild an event from its serialized envelope (e.g. after a Spark task produced it);
        the original bytes are kept, so sinks send exactly what the task serialized."""
        env = json.loads(value)
        src, tx = env["source"], env["transaction"]
        tenant, _, rest = env["idempotency_key"].partition("|")
        ev = cls(tenant=tenant, pipeline=src["pipeline"], connector=src["connector"], db=src["db"],
                 schema=src["schema"], table=src["table"], op=env["op"], before=env["before"],
                 after=env["after"], key=env["key"], tx_id=src["tx_id"], event_id=rest.rsplit("|", 1)[1],
                 position=src["position"], ts_ms=src["ts_ms"], total_order=tx["total_order"],
                 data_collection_order=tx["data_collection_order"], snapshot=src["snapshot"],
                 tx_end=tx_end, end_position=end_position)
        ev.__dict__["value"] = bytes(value)  # prime the cached_property with the original bytes
        return ev

    def validate(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op {self.op!r} is not one of {OPS}")
        if self.op == "d" and self.after is not None:
            raise ValueError("a delete carries after = null")
        if self.tx_end and self.end_position is None:
            raise ValueError("the last row of a transaction must carry end_position")

    @property
    def idempotency_key(self) -> str:
        return idempotency_key(self.tenant, self.db, self.table, self.tx_id, self.event_id)

    @property
    def id(self) -> str:
        return event_uuid(self.idempotency_key)

    def envelope(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "idempotency_key": self.idempotency_key,
            "op": self.op,
            "before": self.before,
            "after": self.after,
            "key": self.key,
            "source": {
                "connector": self.connector,
                "pipeline": self.pipeline,
                "db": self.db,
                "schema": self.schema,
                "table": self.table,
                "tx_id": self.tx_id,
                "position": self.position,
                "ts_ms": self.ts_ms,
                "snapshot": self.snapshot,
            },
            "transaction": {
                "id": self.tx_id,
                "total_order": self.total_order,
                "data_collection_order": self.data_collection_order,
            },
            "ts_ms": self.ts_ms,
        }

    @functools.cached_property
    def value(self) -> bytes:
        """The envelope as compact UTF-8 JSON, computed once and shared by every sink."""
        return json.dumps(self.envelope(), ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode("utf-8")

    @functools.cached_property
    def key_bytes(self) -> bytes:
        """The message key: the JSON of the primary key (same row → same partition)."""
        return json.dumps(self.key, ensure_ascii=False, separators=(",", ":"),
                          sort_keys=True).encode("utf-8")


@dataclass(frozen=True)
class PositionMark:
    """A position the reader passed with nothing to deliver (a transaction whose rows were all
    filtered out, DDL, the run's upper bound). It lets checkpoints advance past such ranges so
    a run with nothing new stays a no-op."""

    position: Position
