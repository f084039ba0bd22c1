"""Change events: the Debezium-compatible envelope every sink receives (docs/architecture.md).

An event is built by a source, serialized once (``ChangeEvent.value``) and the same bytes go to
every sink. Everything in the envelope derives from the source log, never from the clock, so
two reads of the same range give byte-identical values, keys and ids. In particular the top
level ``ts_ms`` is the source commit time, not the processing time: a replay must produce the
same bytes, and consumers that want processing time have the broker's own timestamp.

Serialization uses orjson (several times faster than the stdlib ``json`` module) and produces
the same bytes the stdlib produced with ``ensure_ascii=False, separators=(",", ":")``, which
earlier versions used and which replays must keep reproducing. The two libraries agree on
strings, integers up to 64 bits, ``null``/``true``/``false``, containers and key order, and on
every float that is zero or whose magnitude lies in ``[1e-4, 1e16)``. Outside that range orjson
writes some floats differently (``0.00009999999999999999`` where the stdlib writes
``9.999999999999999e-05``), so an event holding such a float, an integer beyond 64 bits or
anything orjson refuses is serialized by the stdlib, as before. ``tests/unit/test_events.py``
checks the equivalence over random values.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
import decimal
import hashlib
import json
import math
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import orjson

from .positions import Position

T = TypeVar("T")

# Namespace for event ids: uuid5(namespace, idempotency_key). Fixed forever: changing it
# changes every event id and breaks consumers' dedup across versions.
EVENT_ID_NAMESPACE = uuid.UUID("6f1c2a9e-5b0d-4c1e-9d3a-7a2e8b4c0d11")

OPS = ("c", "u", "d", "r")
# source.snapshot, as Debezium writes it: "true" for snapshot rows, "last" for the last row of a
# table's snapshot, "false" for log events.
SNAPSHOT_MARKS = ("true", "last", "false")


def snapshot_mark(v: Any) -> str:
    """``source.snapshot`` as a string; a bool (what callers passed before the strings) maps to
    "true"/"false"."""
    if v is True or v is False:
        return "true" if v else "false"
    if v not in SNAPSHOT_MARKS:
        raise ValueError(f"source.snapshot {v!r} is not one of {SNAPSHOT_MARKS}")
    return v


_NATIVE_SCALARS = (str, int, bool, type(None))


def decimal_text(d: decimal.Decimal) -> str:
    """A DECIMAL/numeric as the source writes it: every digit and every place of its scale, never
    an exponent (``0.0000001000``, where ``str()`` gives ``1.000E-7``; a zero of scale 30 is 31
    characters, not ``0E-30``)."""
    return format(d, "f")


def encode_value(v: Any) -> Any:
    """Map a source value to its JSON-faithful form (README.md, "Pipelines"; docs/architecture.md).

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
        return decimal_text(v)
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
    if row is None:
        return None
    out = {}
    for k, v in row.items():
        # Most values (ints, strings, None) are already JSON-native: skip the type ladder.
        out[k if type(k) is str else str(k)] = v if type(v) in _NATIVE_SCALARS else encode_value(v)
    return out


def idempotency_key(tenant: str, pipeline: str, db: str, table: str, tx_id: str, event_id: str) -> str:
    """``{tenant}|{pipeline}|{db}.{table}|{tx_id}|{event_id}``. The pipeline is in it because log
    coordinates are not unique across servers: two shards provisioned alike (same server_id and
    GTID domain, same schema) log different changes at equal coordinates, and two pipelines
    capturing them into one NATS stream must not dedup each other's messages."""
    return f"{tenant}|{pipeline}|{db}.{table}|{tx_id}|{event_id}"


# uuid5 is SHA-1 over namespace bytes + name: hash the namespace once and copy the state.
_NAMESPACE_SHA1 = hashlib.sha1(EVENT_ID_NAMESPACE.bytes)
# RFC 4122 variant: the high two bits of byte 8 become 10 (hex digit 16 of the digest).
_VARIANT_DIGIT = {c: format((int(c, 16) & 0x3) | 0x8, "x") for c in "0123456789abcdef"}


def event_uuid(key: str) -> str:
    """``str(uuid.uuid5(EVENT_ID_NAMESPACE, key))``, computed without the UUID object."""
    h = _NAMESPACE_SHA1.copy()
    h.update(key.encode("utf-8"))
    x = h.hexdigest()
    return f"{x[:8]}-{x[8:12]}-5{x[13:16]}-{_VARIANT_DIGIT[x[16]]}{x[17:20]}-{x[20:32]}"


class cached:  # noqa: N801 - used like functools.cached_property
    """``functools.cached_property`` without its lock (Python 3.11 takes an RLock on every
    first access, a large share of serializing one event). A race computes the same
    deterministic value twice, which is harmless. The one way a derived value is kept on an
    instance that is otherwise never written after :func:`filled` built it."""

    def __init__(self, fn):
        self.fn = fn
        self.name = fn.__name__
        self.__doc__ = fn.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.fn(obj)
        return value


def filled(cls: type[T], fields: dict[str, Any]) -> T:
    """An instance of ``cls`` whose attributes are ``fields``, built without ``__init__``: the
    one way an event is built field by field. A frozen dataclass's generated ``__init__`` sets
    each field through ``object.__setattr__``, several times the cost of filling the instance's
    dict at once. The instance is complete when this returns; nothing writes it afterwards but
    :class:`cached` (a derived value, kept once). ``tidegate.native.rowcodec`` is its compiled
    twin, filling the events it decodes the same way. ``fields`` becomes the instance's dict
    (no copy): the caller hands over a dict it built for this instance."""
    obj = object.__new__(cls)
    object.__setattr__(obj, "__dict__", fields)  # past the frozen dataclass's __setattr__
    return obj


def orjson_formats_like_stdlib(v: Any) -> bool:
    """Whether orjson writes every float inside ``v`` as the stdlib does (see the module
    docstring); containers are searched, other values hold no float and pass."""
    t = type(v)
    if t is str or t is int or v is None or t is bool:
        return True
    if t is float:
        return v == 0.0 or 1e-4 <= abs(v) < 1e16  # also False for NaN and the infinities
    if isinstance(v, dict):
        return all(orjson_formats_like_stdlib(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return all(orjson_formats_like_stdlib(x) for x in v)
    return not isinstance(v, float)  # a float subclass: leave it to the stdlib


def _stdlib_dumps(obj: Any, **kw: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), **kw).encode("utf-8")


def key_json_bytes(key: dict[str, Any] | None, floats_ok: bool | None = None) -> bytes:
    """A primary key as a message key: its JSON with sorted names, as the stdlib writes it
    (:attr:`ChangeEvent.key_bytes`). ``floats_ok``: the caller already knows whether orjson
    writes its floats as the stdlib does (:func:`orjson_formats_like_stdlib`)."""
    if floats_ok if floats_ok is not None else orjson_formats_like_stdlib(key):
        try:
            return orjson.dumps(key, option=orjson.OPT_SORT_KEYS)
        except TypeError:
            pass
    return _stdlib_dumps(key, sort_keys=True)


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
    snapshot: str = "false"  # "true" | "last" (snapshot rows) | "false" (log events)
    tx_end: bool = False
    end_position: Position | None = field(default=None, compare=False)
    # Message headers beyond the standard ones (the two events of a primary-key change name
    # each other's key: split_key_change); given to native() when there are any.
    # The commit time in µs since the epoch, where the source log has it finer than ``ts_ms``
    # (PostgreSQL): ``envelope: debezium`` writes it as ``source.ts_us``. Not part of this
    # envelope (its bytes stay as the contract fixes them); carried between processes beside the
    # bytes (shipped.ROW_FIELDS).
    commit_us: int | None = field(default=None, compare=False)
    headers: ClassVar[dict[str, bytes] | None] = None

    @classmethod
    def build(cls, **kw: Any) -> ChangeEvent:
        for name in ("before", "after", "key"):
            kw[name] = encode_row(kw.get(name))
        kw["snapshot"] = snapshot_mark(kw.get("snapshot", "false"))
        ev = cls(**kw)
        ev.validate()
        return ev

    @classmethod
    def native(cls, tenant: str, pipeline: str, connector: str, db: str, schema: str, table: str,
               op: str, before: dict[str, Any] | None, after: dict[str, Any] | None,
               key: dict[str, Any] | None, tx_id: str, event_id: str, position: dict[str, Any],
               ts_ms: int, total_order: int, data_collection_order: int, snapshot: str | bool = "false",
               tx_end: bool = False, end_position: Position | None = None,
               floats_checked: bool = False, commit_us: int | None = None,
               headers: dict[str, bytes] | None = None) -> ChangeEvent:
        """An event from values that are already JSON-native (what :func:`encode_row` returns)
        and fields that hold the invariants of :meth:`validate` by construction: a fast source
        path that skips re-encoding and re-validation. ``floats_checked=True`` says the source
        checked that every float lies where orjson and the stdlib agree
        (:func:`orjson_formats_like_stdlib`), so :attr:`value` need not search for floats.
        ``commit_us``: the commit time in µs, when the source knows it (:attr:`commit_us`);
        ``headers``: message headers beyond the standard ones (:attr:`headers`).
        """
        fields = {
            "tenant": tenant, "pipeline": pipeline, "connector": connector, "db": db, "schema": schema,
            "table": table, "op": op, "before": before, "after": after, "key": key, "tx_id": tx_id,
            "event_id": event_id, "position": position, "ts_ms": ts_ms, "total_order": total_order,
            "data_collection_order": data_collection_order,
            "snapshot": snapshot if snapshot.__class__ is str else snapshot_mark(snapshot),
            "tx_end": tx_end, "end_position": end_position, "commit_us": commit_us}
        if floats_checked:
            fields["_floats_checked"] = True  # otherwise value searches the floats itself
        if headers:
            fields["headers"] = headers
        return filled(cls, fields)

    def ending(self, end_position: Position) -> ChangeEvent:
        """This event as the last row of its transaction, which ends at ``end_position``: a copy
        (a source holds one event back until it knows whether the next item ends the
        transaction). The copy keeps what was derived already: none of it depends on the end."""
        fields = self.__dict__.copy()
        fields["tx_end"], fields["end_position"] = True, end_position
        return filled(type(self), fields)

    def validate(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"op {self.op!r} is not one of {OPS}")
        if self.op == "d" and self.after is not None:
            raise ValueError("a delete carries after = null")
        if self.tx_end and self.end_position is None:
            raise ValueError("the last row of a transaction must carry end_position")

    @cached
    def idempotency_key(self) -> str:
        return idempotency_key(self.tenant, self.pipeline, self.db, self.table, self.tx_id, self.event_id)

    @cached
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

    @cached
    def _floats_checked(self) -> bool:
        """Whether orjson writes every float of the event as the stdlib does (``native`` may
        have been told so by the source)."""
        return (orjson_formats_like_stdlib(self.before) and orjson_formats_like_stdlib(self.after)
                and orjson_formats_like_stdlib(self.key) and orjson_formats_like_stdlib(self.position))

    @cached
    def value(self) -> bytes:
        """The envelope as compact UTF-8 JSON, computed once and shared by every sink."""
        env = self.envelope()
        if self._floats_checked:
            try:
                return orjson.dumps(env)
            except TypeError:  # > 64-bit integers, non-str keys, types neither library takes
                pass
        return _stdlib_dumps(env, allow_nan=False)

    @cached
    def key_bytes(self) -> bytes:
        """The message key: the JSON of the primary key (same row → same partition)."""
        return key_json_bytes(self.key, self._floats_checked)


# Headers of the two events of a primary-key change, as Debezium names them: the delete names
# the new key, the create the old one (JSON of the key, as the message key is).
NEW_KEY_HEADER = "__debezium.newkey"
OLD_KEY_HEADER = "__debezium.oldkey"


def split_key_change(update: ChangeEvent, old_key: dict[str, Any]) -> tuple[ChangeEvent, ChangeEvent]:
    """An UPDATE that changed the primary key, as Debezium emits it: a delete of the old key
    (the old row as ``before``), then a create of the new key (the new row as ``after``), each
    keyed (and so partitioned) by its own key and carrying a header that names the other. A
    consumer keyed by primary key (a compacted topic, a hash per row, a lake table) then drops
    the old row. The two take the update's place in the transaction (``total_order`` and
    ``data_collection_order`` of the create are one more: the caller counts two events) and
    its event id with ``:d`` / ``:c``, so both are replay-stable."""
    d = update.__dict__
    floats = d.get("_floats_checked", False)

    def event(op: str, before: Any, after: Any, key: Any, shift: int, headers: dict) -> ChangeEvent:
        return ChangeEvent.native(d["tenant"], d["pipeline"], d["connector"], d["db"], d["schema"],
                                  d["table"], op, before, after, key, d["tx_id"], f"{d['event_id']}:{op}",
                                  d["position"], d["ts_ms"], d["total_order"] + shift,
                                  d["data_collection_order"] + shift,
                                  d["snapshot"], False, None, floats, d.get("commit_us"), headers)

    new_key, old_key_bytes = key_json_bytes(update.key), key_json_bytes(old_key)
    return (event("d", update.before, None, old_key, 0, {NEW_KEY_HEADER: new_key}),
            event("c", None, update.after, update.key, 1, {OLD_KEY_HEADER: old_key_bytes}))


CONTROL_TYPES = ("schema_change", "gap", "failover", "snapshot_started", "snapshot_completed")


@dataclass(frozen=True)
class ControlMessage:
    """A message on the pipeline's control channel (docs/architecture.md, "Control messages"):
    ``{"type", "pipeline", "position", "ts_ms", "idempotency_key", ...fields}``. It travels in
    the stream like a row (in a sub-batch, under the sink's guarantee), goes to the sink's
    control destination instead of a table's, and is identical on every replay:
    ``idempotency_key`` is ``{tenant}|{pipeline}|__control|{type}|{event_id}`` and ``ts_ms`` comes from the
    source or the store, never the clock. A schema change sits where the DDL sits (``tx_id``,
    ``tx_end`` and ``end_position`` as for a row); a gap or failover message is owed by a
    checkpoint version and delivered before anything after it."""

    tenant: str
    pipeline: str
    type: str
    event_id: str
    position: dict[str, Any] | None
    ts_ms: int
    fields: dict[str, Any] = field(default_factory=dict)
    tx_id: str = ""
    tx_end: bool = False
    end_position: Position | None = field(default=None, compare=False)
    # As ChangeEvent.commit_us (a TRUNCATE's, for ``envelope: debezium``); not in the JSON.
    commit_us: int | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.type not in CONTROL_TYPES:
            raise ValueError(f"control message type {self.type!r} is not one of {CONTROL_TYPES}")

    @property
    def idempotency_key(self) -> str:
        return f"{self.tenant}|{self.pipeline}|__control|{self.type}|{self.event_id}"

    def ending(self, end_position: Position) -> ControlMessage:
        """This message as the last item of its transaction (:meth:`ChangeEvent.ending`)."""
        return dataclasses.replace(self, tx_end=True, end_position=end_position)

    @property
    def table(self) -> str | None:
        return self.fields.get("table")

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "pipeline": self.pipeline, "position": self.position, "ts_ms": self.ts_ms,
                "idempotency_key": self.idempotency_key, **self.fields}

    @classmethod
    def from_json(cls, d: Mapping[str, Any], *, tenant: str) -> ControlMessage:
        """A message recorded by the store (a gap or failover a checkpoint version owes)."""
        fields = {k: v for k, v in d.items()
                  if k not in ("type", "pipeline", "position", "ts_ms", "idempotency_key", "event_id")}
        return cls(tenant, d["pipeline"], d["type"], d["event_id"], d.get("position"), int(d["ts_ms"]),
                   fields)

    def record(self) -> dict[str, Any]:
        """What the store keeps to deliver it later (:meth:`from_json` reads it back)."""
        return {**self.to_json(), "event_id": self.event_id}

    @cached
    def value(self) -> bytes:
        return _stdlib_dumps(self.to_json(), sort_keys=False, allow_nan=False)

    @cached
    def key_bytes(self) -> bytes:
        return self.pipeline.encode("utf-8")


def is_control(item: Any) -> bool:
    return type(item) is ControlMessage


@dataclass(frozen=True)
class PositionMark:
    """A position the reader passed with nothing to deliver (a transaction whose rows were all
    filtered out, DDL, the run's upper bound). It lets checkpoints advance past such ranges so
    a run with nothing new stays a no-op."""

    position: Position
