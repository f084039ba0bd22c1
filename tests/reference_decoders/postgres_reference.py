"""The reference PostgreSQL read path: the reader the fast one replaced (a test oracle, not
shipped).

:class:`ReferenceReader` reads the slot with one peek through a named cursor, parses each wal2json
message with the stdlib ``json`` module (non-integer numbers as ``Decimal``), converts every
value through :func:`~tidegate.sources.postgres.values.converter`, and builds events with
``ChangeEvent.build`` (which encodes and validates them). It applies the same transaction rules
as :class:`~tidegate.sources.postgres.wal2json.Wal2JsonDecoder` and is kept to prove, on real WAL,
that the fast path gives the same items byte for byte (``tests/integration/test_postgres_reader.py``):
``PostgresSource(spec, conn, decoder=ReferenceReader)``.
"""

from __future__ import annotations

import decimal
import json
from collections.abc import Iterator
from typing import Any

from tidegate.events import ChangeEvent, ControlMessage, PositionMark, split_key_change
from tidegate.sources.base import SourceItem
from tidegate.sources.postgres.position import Lsn, PgPosition
from tidegate.sources.postgres.values import commit_time, complete_after, converter
from tidegate.sources.postgres.wal2json import ReadHost, old_key, peek_messages


def _row(cols: list[dict] | None) -> dict[str, Any] | None:
    if cols is None:
        return None
    return {c["name"]: converter(c["type"])(c["value"]) for c in cols}


def _signature(cols: list[dict] | None) -> tuple[tuple[str, str], ...] | None:
    return None if cols is None else tuple((c["name"], c["type"]) for c in cols)


def _built(pending: dict[str, Any] | ChangeEvent | ControlMessage) -> ChangeEvent | ControlMessage:
    return ChangeEvent.build(**pending) if type(pending) is dict else pending


class ReferenceReader:
    """One bounded pass: the transactions that end in (``start_lsn``, ``upto``]."""

    @staticmethod
    def messages(source: Any, upto: PgPosition) -> Iterator[str]:
        """One peek through a named cursor (``source.itersize`` rows a fetch)."""
        return peek_messages(source.server, source.replication_slot, upto, source.tables, source.itersize)

    def __init__(self, host: ReadHost, start_lsn: Lsn, upto: PgPosition):
        self.host = host
        self.start_lsn = start_lsn
        self.upto = upto

    def run(self, messages: Iterator[str | bytes]) -> Iterator[SourceItem]:
        host = self.host
        spec = host.spec
        upto, start_lsn = self.upto, self.start_lsn
        sysid, tl = host.server.system_and_timeline()
        tracker = host.column_tracker(PgPosition(start_lsn, sysid, tl))

        def columns_of(schema: str, table: str) -> list[str]:
            """What an UPDATE that left out unchanged TOAST values really holds."""
            return tracker.names(schema, table) or host.table_columns(schema, table)

        seen: dict[tuple[str, str], tuple] = {}  # per table: the last new tuple's signature
        loads = json.JSONDecoder(parse_float=decimal.Decimal).decode
        last_end: Lsn | None = None
        pending: dict[str, Any] | ChangeEvent | ControlMessage | None = None
        skip = True
        tx_id = ""
        xid = commit = None
        ts_ms, ts_us = 0, None
        total = 0
        per_table: dict[tuple[str, str], int] = {}
        same_lsn: dict[str, int] = {}
        end = None
        for data in messages:
            d = loads(data)
            a = d["action"]
            if a == "B":
                end = Lsn.parse(d["nextlsn"])
                if end > upto.lsn:
                    break  # commits after the bound (peek may return one such tx)
                skip = end <= start_lsn
                xid, commit = d["xid"], d["lsn"]
                tx_id = f"{xid}:{commit}"
                ts_ms, ts_us = commit_time(d.get("timestamp"))
                total = 0
                per_table = {}
                same_lsn = {}
                pending = None
                continue
            if skip:
                continue
            if a == "C":
                end_pos = PgPosition(end, sysid, tl)
                if pending is not None:  # an empty transaction yields nothing
                    last_end = end
                    item, pending = pending, None
                    yield (ChangeEvent.build(**item, tx_end=True, end_position=end_pos) if type(item) is dict
                           else item.ending(end_pos))
                continue
            schema, table = d.get("schema"), d.get("table")
            if host.tables and (schema, table) not in host.tables:
                continue
            if a == "T":
                if pending is not None:
                    yield _built(pending)
                pending = tracker.truncate_message(
                    schema, table, lsn=d["lsn"], position={"lsn": d["lsn"], "commit_lsn": commit, "xid": xid},
                    ts_ms=ts_ms, tx_id=tx_id, end=PgPosition(end, sysid, tl), commit_us=ts_us)
                continue
            if a not in ("I", "U", "D"):
                continue  # M (logical messages)
            lsn = d["lsn"]
            n = same_lsn.get(lsn, 0)
            same_lsn[lsn] = n + 1
            before = _row(d.get("identity"))
            after = _row(d.get("columns")) if a != "D" else None
            sig = _signature(d.get("columns")) if a != "D" else None
            if sig is not None and seen.get((schema, table)) != sig:
                seen[(schema, table)] = sig
                change = tracker.observe(schema, table, "c" if a == "I" else "u", sig,
                                         _signature(d.get("identity")), PgPosition(end, sysid, tl))
                if change is not None:
                    if pending is not None:
                        yield _built(pending)
                    pending = tracker.columns_message(
                        schema, table, change, event_id=f"{lsn}:{n}:columns",
                        position={"lsn": lsn, "commit_lsn": commit, "xid": xid}, ts_ms=ts_ms, tx_id=tx_id,
                        end=PgPosition(end, sysid, tl))
            if a == "U":
                after = complete_after(after, before, lambda s=schema, t=table: columns_of(s, t))
            image = after if after is not None else before
            pk = d.get("pk")
            key = {c["name"]: image.get(c["name"]) for c in pk} if pk and image else None
            total += 1
            k = per_table.get((schema, table), 0) + 1
            per_table[(schema, table)] = k
            if pending is not None:
                yield _built(pending)
            pending = dict(
                tenant=spec.tenant, pipeline=spec.pipeline, connector="postgresql",
                db=schema, schema=schema, table=table,
                op={"I": "c", "U": "u", "D": "d"}[a], before=before, after=after, key=key,
                tx_id=tx_id, event_id=f"{lsn}:{n}",
                position={"lsn": lsn, "commit_lsn": commit, "xid": xid},
                ts_ms=ts_ms, total_order=total, data_collection_order=k, commit_us=ts_us,
            )
            if a == "U" and key is not None and before:
                update = ChangeEvent.build(**pending)
                if (old := old_key(update.before, update.key)) is not None:  # delete, then create
                    gone, pending = split_key_change(update, old)
                    total += 1
                    per_table[(schema, table)] = k + 1
                    yield gone
        if last_end is None or last_end < upto.lsn:
            yield PositionMark(upto)
