"""PostgreSQL logical decoding source (wal2json format-version 2, psycopg2).

Positions, ids and boundaries (the contract other code relies on):

* A position is an LSN. A transaction's ``end_position`` is the **end of its commit record**
  (wal2json's ``nextlsn``, logical decoding's ``end_lsn``). That is exactly what the server's
  own bookkeeping uses: a slot whose ``confirmed_flush_lsn`` is X no longer returns a
  transaction whose end is at or before X, and :meth:`PostgresSource.release` advances the
  slot to such an end. ``read(start, upto)`` yields the transactions with
  ``start < end <= upto``; comparing ends is exact because a transaction's commit record
  ends after every record of it, and commit order is LSN order.
* ``head()`` is ``pg_current_wal_lsn()``: every transaction committed before the call ends at
  or before it, so it is a valid upper bound; a transaction still committing when head() was
  taken ends after it and goes to the next run. ``pg_logical_slot_peek_changes(upto_lsn)``
  stops once it has read the record that reaches ``upto_lsn``, so it can return one
  transaction whose commit record straddles the bound: the reader drops it (it checks
  ``nextlsn`` on the ``B`` record before emitting any row).
* ``tx_id`` is ``"{xid}:{commit_lsn}"`` (commit_lsn = start of the commit record, wal2json's
  ``lsn`` on B/C); ``event_id`` is ``"{change_lsn}:{n}"``, n counting the rows of the
  transaction that share the change's LSN (a multi-insert logs several rows in one record).
* A read is one ``pg_logical_slot_peek_changes`` call consumed through a named server-side
  cursor (decoding cost linear in the range, client memory bounded by ``itersize``). Empty
  transactions (DDL, no row changes, or every row filtered out) yield nothing; the final
  ``PositionMark(upto)`` moves checkpoints past them.
* Unchanged TOAST values (wal2json leaves them out of an UPDATE's new tuple) are taken from the
  old tuple when the table has REPLICA IDENTITY FULL, and are otherwise emitted as the
  Debezium placeholder ``"__debezium_unavailable_value"``: never as null.
* ``TRUNCATE`` is not a row change: it is recorded in :attr:`PostgresSource.schema_changes`.

Values (JSON-faithful): integers as numbers, numeric as string (exact, scale kept; wal2json
turns numeric NaN/Infinity into null), real/double as numbers, text as string, bytea as
base64, boolean as true/false, date as ``YYYY-MM-DD``, time as ``HH:MM:SS[.ffffff]``,
timestamp as ISO-8601 ``YYYY-MM-DDTHH:MM:SS[.ffffff]``, timestamptz as ISO-8601 in UTC with
``+00:00``, uuid as string, json/jsonb as their JSON text, arrays as JSON arrays of the
converted elements. Other types keep PostgreSQL's text output.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg2
import psycopg2.errors

from ..connections import Connection
from ..errors import (
    PositionPurgedError,
    SlotInvalidatedError,
    SlotMissingError,
    SourceError,
    SourceSettingError,
)
from ..events import ChangeEvent, PositionMark
from ..positions import Lsn, PgPosition
from ..spec import PipelineSpec
from ..store.records import CheckpointRecord
from .base import Source, SourceItem
from .preflight import ERROR, WARNING, Problem, human_bytes, setting_problem
from .snapshot_postgres import PostgresSnapshot

log = logging.getLogger(__name__)

PLUGIN = "wal2json"
UNAVAILABLE = "__debezium_unavailable_value"
SESSION_OPTIONS = "-c TimeZone=UTC -c DateStyle=ISO,YMD -c IntervalStyle=postgres -c extra_float_digits=1"
WAL2JSON_OPTIONS = ("'format-version', '2', 'include-lsn', '1', 'include-xids', '1', "
                    "'include-timestamp', '1', 'include-pk', '1'")
DEFAULT_HEADROOM_WARN_BYTES = 1 << 30
_TZ_SUFFIX = re.compile(r"([+-]\d\d)(?::?(\d\d))?(?::?(\d\d))?$")


@dataclass(frozen=True)
class PgSchemaChange:
    """A non-row change read in the range (TRUNCATE), at the change's LSN."""

    lsn: Lsn
    end_position: PgPosition
    tx_id: str
    schema: str
    table: str
    kind: str

    def to_json(self) -> dict[str, Any]:
        return {"lsn": str(self.lsn), "end_position": self.end_position.to_json(),
                "tx_id": self.tx_id, "schema": self.schema, "table": self.table, "kind": self.kind}


# ---------------------------------------------------------------------- value conversion


def _ts(v: str) -> str:
    """PostgreSQL ISO output ``2024-01-02 03:04:05.5[+00]`` → ISO-8601 ``2024-01-02T03:04:05.5[+00:00]``."""
    if not isinstance(v, str) or len(v) < 11 or v[10] != " ":
        return v  # infinity, -infinity, BC dates: keep PostgreSQL's text
    s = v[:10] + "T" + v[11:]
    m = _TZ_SUFFIX.search(s[19:])
    if m:
        off = f"{m.group(1)}:{m.group(2) or '00'}" + (f":{m.group(3)}" if m.group(3) else "")
        s = s[: 19 + m.start()] + off
    return s


def _bytea(v: Any) -> Any:
    if not isinstance(v, str):
        return v
    h = v[2:] if v.startswith("\\x") else v
    return bytes.fromhex(h)


def _numeric(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, float):  # NaN / Infinity (json constants)
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return str(v)


def _float(v: Any) -> Any:
    return float(v) if isinstance(v, (decimal.Decimal, int)) and not isinstance(v, bool) else v


def _identity(v: Any) -> Any:
    return v


def _array_literal(s: str) -> Any:
    """Parse PostgreSQL's array text output (``{1,NULL,"a b",{2,3}}``) into nested lists of
    element strings (None for NULL)."""
    if not isinstance(s, str) or not s.startswith("{"):
        return s

    def parse(i: int) -> tuple[list, int]:
        out: list = []
        i += 1
        if s[i] == "}":
            return out, i + 1
        while True:
            c = s[i]
            if c == "{":
                v, i = parse(i)
                out.append(v)
            elif c == '"':
                j = i + 1
                buf = []
                while s[j] != '"':
                    if s[j] == "\\":
                        j += 1
                    buf.append(s[j])
                    j += 1
                out.append("".join(buf))
                i = j + 1
            else:
                j = i
                while s[j] not in ",}":
                    j += 1
                tok = s[i:j].strip()
                out.append(None if tok == "NULL" else tok)
                i = j
            if s[i] == ",":
                i += 1
                continue
            return out, i + 1

    try:
        return parse(0)[0]
    except (IndexError, ValueError):
        return s


def _element(base: str) -> Callable[[str], Any]:
    conv = _converter(base)
    if base in ("smallint", "integer", "bigint", "oid"):
        return int
    if base == "boolean":
        return lambda t: t == "t"
    if base in ("real", "double precision"):
        return float
    if base.startswith(("numeric", "decimal")):
        return str
    return conv


def _map_nested(v: Any, fn: Callable[[str], Any]) -> Any:
    if isinstance(v, list):
        return [_map_nested(x, fn) for x in v]
    return None if v is None else fn(v)


_CONVERTERS: dict[str, Callable[[Any], Any]] = {}


def _converter(typ: str) -> Callable[[Any], Any]:
    """The value converter for a wal2json ``type`` string (cached)."""
    fn = _CONVERTERS.get(typ)
    if fn is not None:
        return fn
    if typ.endswith("[]"):
        elem = _element(typ[:-2])

        def fn(v: Any, _e=elem) -> Any:
            parsed = _array_literal(v)
            return _map_nested(parsed, _e) if isinstance(parsed, list) else parsed
    elif typ.startswith(("numeric", "decimal")):
        fn = _numeric
    elif typ in ("real", "double precision"):
        fn = _float
    elif typ == "bytea":
        fn = _bytea
    elif typ.startswith("timestamp"):
        fn = _ts
    else:
        fn = _identity
    _CONVERTERS[typ] = fn
    return fn


def _row(cols: list[dict] | None) -> dict[str, Any] | None:
    if cols is None:
        return None
    return {c["name"]: _converter(c["type"])(c["value"]) for c in cols}


def _commit_ms(ts: str | None) -> int:
    if not ts:
        return 0
    try:
        return int(dt.datetime.fromisoformat(_ts(ts)).timestamp() * 1000)
    except ValueError:
        return 0


# ---------------------------------------------------------------------- the source


class PostgresSource(PostgresSnapshot, Source):  # snapshots: snapshot_postgres.py
    """Bounded reads of a logical replication slot (wal2json). See the module docstring."""

    kind = "postgres"

    def __init__(self, spec: PipelineSpec, conn: Connection, *, slot: str | None = None,
                 itersize: int = 5000, connect_timeout: float = 10.0):
        self.spec = spec
        self.conn = conn
        self.slot = slot or spec.source.slot or f"tidegate_{spec.pipeline}"
        self.itersize = itersize
        self.connect_timeout = connect_timeout
        self.tables: frozenset[tuple[str, str]] = frozenset(
            tuple(t.split(".", 1)) for t in (spec.source.tables or ()))
        self.schema_changes: list[PgSchemaChange] = []
        self._ctl = None
        self._ident: tuple[str, int] | None = None
        self._columns: dict[tuple[str, str], list[str]] = {}

    # ------------------------------------------------------------------ connections

    def _connect(self):
        c = self.conn
        try:
            return psycopg2.connect(host=c.host or "127.0.0.1", port=int(c.port or 5432),
                                    dbname=c.schema or "postgres", user=c.login, password=c.password,
                                    connect_timeout=int(self.connect_timeout),
                                    application_name="tidegate", options=SESSION_OPTIONS)
        except psycopg2.OperationalError as exc:
            msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise SourceError(f"cannot connect to {self.conn}: {msg}") from None

    def _q(self, sql: str, args: Any = None) -> list[tuple]:
        if self._ctl is None or self._ctl.closed:
            self._ctl = self._connect()
            self._ctl.autocommit = True
        with self._ctl.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchall() if cur.description else []

    def close(self) -> None:
        try:
            if self._ctl is not None:
                self._ctl.close()
        except Exception:  # noqa: BLE001 - close must not raise
            pass
        self._ctl = None

    # ------------------------------------------------------------------ identity / head

    def _identity(self) -> tuple[str, int]:
        if self._ident is None:
            (sysid,) = self._q("SELECT system_identifier::text FROM pg_control_system()")[0]
            self._ident = (sysid, self._timeline())
        return self._ident

    def _timeline(self) -> int:
        # On a primary the current WAL file name carries the timeline at once; the control
        # file's checkpoint timeline only changes at the next checkpoint after a promotion.
        (tl,) = self._q("SELECT CASE WHEN pg_is_in_recovery() "
                        "THEN (SELECT timeline_id FROM pg_control_checkpoint()) "
                        "ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int "
                        "END")[0]
        return int(tl)

    def _pos(self, lsn: Lsn | str) -> PgPosition:
        sysid, tl = self._identity()
        return PgPosition(Lsn.parse(lsn), sysid, tl)

    def head(self) -> PgPosition:
        """``pg_current_wal_lsn()``: every transaction committed before the call ends at or
        before it."""
        (lsn,) = self._q("SELECT pg_current_wal_lsn()::text")[0]
        return self._pos(lsn)

    def identity(self) -> dict[str, Any]:
        self._ident = None  # re-read: the failover guard wants the current timeline
        sysid, tl = self._identity()
        (version,) = self._q("SHOW server_version")[0]
        return {"kind": "postgres", "system_id": sysid, "timeline": tl, "version": version}

    # ------------------------------------------------------------------ slot

    def slot_info(self) -> dict[str, Any] | None:
        rows = self._q(
            "SELECT slot_name, plugin, slot_type, database, wal_status, safe_wal_size, "
            "restart_lsn::text, confirmed_flush_lsn::text, active_pid, "
            "pg_current_wal_lsn() - confirmed_flush_lsn "
            "FROM pg_replication_slots WHERE slot_name = %s", (self.slot,))
        if not rows:
            return None
        r = rows[0]
        return {"slot": r[0], "plugin": r[1], "slot_type": r[2], "database": r[3],
                "wal_status": r[4], "safe_wal_size": None if r[5] is None else int(r[5]),
                "restart_lsn": r[6], "confirmed_flush_lsn": r[7], "active_pid": r[8],
                "lag_bytes": None if r[9] is None else int(r[9])}

    def ensure_slot(self) -> PgPosition | None:
        """Create the pipeline's slot if it does not exist (logged). Returns the position it was
        created at, or None when it already existed."""
        if self.slot_info() is not None:
            return None
        try:
            (lsn,) = self._q("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s)",
                             (self.slot, PLUGIN))[0]
        except psycopg2.errors.DuplicateObject:
            return None
        except psycopg2.Error as exc:
            msg = (exc.pgerror or str(exc)).strip()
            if PLUGIN in msg and ("could not access file" in msg or "not exist" in msg):
                raise SourceSettingError(f"the {PLUGIN} output plugin is not installed on {self.conn} "
                                         f"(Debian: postgresql-<version>-wal2json): {msg}") from None
            raise SourceError(f"cannot create replication slot {self.slot!r} on {self.conn}: {msg}") from None
        pos = self._pos(lsn)
        log.warning("created logical replication slot %r (plugin %s) on %s at %s",
                    self.slot, PLUGIN, self.conn, pos)
        return pos

    def drop_slot(self) -> None:
        self._q("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                "WHERE slot_name = %s", (self.slot,))

    def check_slot(self, requested: PgPosition | None = None) -> dict[str, Any]:
        """The slot's health, or a typed error: :class:`SlotMissingError` (dropped, never
        created) or :class:`SlotInvalidatedError` (``wal_status = lost``). Both carry
        ``slot``, ``requested`` (the position the caller needs) and ``earliest_available``."""
        info = self.slot_info()
        if info is None:
            err: SourceError = SlotMissingError(
                f"replication slot {self.slot!r} does not exist on {self.conn}: changes after "
                f"{requested or 'the last checkpoint'} may be lost (was the slot dropped?)")
            _attach(err, self.slot, requested, self.head(), None)
            raise err
        if info["wal_status"] == "lost":
            err = SlotInvalidatedError(
                f"replication slot {self.slot!r} on {self.conn} is invalidated (wal_status=lost): "
                f"the server removed WAL it still needed (max_slot_wal_keep_size); changes after "
                f"{requested or info['confirmed_flush_lsn']} are lost")
            _attach(err, self.slot, requested, self.head(), info["confirmed_flush_lsn"])
            raise err
        if info["plugin"] != PLUGIN or info["slot_type"] != "logical":
            raise SourceSettingError(f"replication slot {self.slot!r} uses plugin {info['plugin']!r} "
                                     f"({info['slot_type']}); tidegate needs a logical slot with {PLUGIN}")
        return info

    # ------------------------------------------------------------------ continuity

    def describe_change(self, old_identity: dict[str, Any]) -> str:
        new = self.identity()
        if old_identity.get("system_id") != new.get("system_id"):
            return (f"the connection now reaches another PostgreSQL cluster (system identifier "
                    f"{old_identity.get('system_id')} -> {new.get('system_id')}); its WAL is not the one "
                    f"the checkpoints point into and the replication slot is not there")
        return (f"the server moved from timeline {old_identity.get('timeline')} to {new.get('timeline')}: "
                f"a standby was promoted, and a logical replication slot does not survive a promotion")

    def earliest(self) -> PgPosition:
        """Where the slot can be read from (its confirmed position); the head without a slot."""
        info = self.slot_info()
        if info is None or not info["confirmed_flush_lsn"]:
            return self.head()
        return self._pos(info["confirmed_flush_lsn"])

    def check_retention(self, checkpoint: PgPosition | None, *, first_run: bool) -> dict[str, Any]:
        """The slot exists and has not lost WAL. A pipeline's first run creates it (logged);
        afterwards a missing slot means changes may be lost."""
        try:
            return {"status": "ok", **self.check_slot(checkpoint)}
        except SlotMissingError:
            if not first_run:
                raise
        created = self.ensure_slot()
        return {"status": "created", "slot": self.slot,
                "at": created.to_json() if created is not None else None}

    def restart_stream(self) -> PgPosition:
        """Replace the slot (an invalidated one, or one whose position means nothing to the
        checkpoints): changes are delivered from the new slot's start."""
        self.drop_slot()
        return self.ensure_slot() or self.head()

    def release(self, position: PgPosition) -> None:
        """Advance the slot to ``position`` (never further, never backwards), so the server
        can recycle the WAL before it."""
        info = self.check_slot(position)
        lsn = position.lsn if isinstance(position, PgPosition) else Lsn.parse(position)
        if info["confirmed_flush_lsn"] and lsn <= Lsn.parse(info["confirmed_flush_lsn"]):
            return
        self._q("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.slot, str(lsn)))
        log.info("advanced slot %r to %s", self.slot, lsn)

    # ------------------------------------------------------------------ reading

    def read(self, start: PgPosition | None, upto: PgPosition) -> Iterator[SourceItem]:
        """Rows of the transactions whose commit ends in (start, upto], in commit order."""
        if upto is None:
            raise ValueError("read needs an upper bound (head() at the start of the run)")
        self.schema_changes = []
        info = self.check_slot(start)
        confirmed = Lsn.parse(info["confirmed_flush_lsn"])
        start_lsn = confirmed if start is None else start.lsn
        if start_lsn < confirmed:
            raise PositionPurgedError(
                f"position {start} is before the start of slot {self.slot!r} ({confirmed}): the "
                f"slot was advanced past it (or re-created), the changes in between are no longer "
                f"available", requested=start, earliest_available=self._pos(confirmed))
        if upto.lsn <= start_lsn:
            return
        yield from self._read(start_lsn, upto)

    def has_changes(self, start: PgPosition | None, upto: PgPosition, limit: int = 10_000) -> bool:
        """A bounded look: peek at most ``limit`` decoded rows (whole transactions) of the slot
        for a row change of the pipeline's tables committed in (start, upto]. When the look is
        cut off by ``limit`` the answer is True (there may be work), so the run goes ahead."""
        info = self.check_slot(start)
        start_lsn = Lsn.parse(info["confirmed_flush_lsn"]) if start is None else start.lsn
        if upto.lsn <= start_lsn:
            return False
        args: list[Any] = [self.slot, str(upto.lsn), limit]
        if self.tables:
            args.append(",".join(f"{s}.{t}" for s, t in sorted(self.tables)))
        try:
            rows = self._q(self._peek_sql().replace("%s::pg_lsn, NULL,", "%s::pg_lsn, %s,"), tuple(args))
        except psycopg2.Error as exc:
            raise self._peek_error(exc) from None
        counts = end = None
        for (data,) in rows:
            d = json.loads(data)
            if d["action"] == "B":
                end = Lsn.parse(d["nextlsn"])
                counts = start_lsn < end <= upto.lsn
            elif counts and d["action"] in ("I", "U", "D", "T"):
                return True
        return len(rows) >= limit

    def _peek_sql(self) -> str:
        opts = WAL2JSON_OPTIONS
        if self.tables:
            opts += ", 'add-tables', %s"
        return ("SELECT data FROM pg_logical_slot_peek_changes(%s, %s::pg_lsn, NULL, " + opts + ")")

    def _read(self, start_lsn: Lsn, upto: PgPosition) -> Iterator[SourceItem]:
        conn = self._connect()
        spec = self.spec
        sysid, tl = self._identity()
        loads = json.JSONDecoder(parse_float=decimal.Decimal).decode
        args: list[Any] = [self.slot, str(upto.lsn)]
        if self.tables:
            args.append(",".join(f"{s}.{t}" for s, t in sorted(self.tables)))
        last_end: Lsn | None = None
        pending: dict[str, Any] | None = None
        try:
            cur = conn.cursor(name=f"tidegate_peek_{self.slot}")
            cur.itersize = self.itersize
            try:
                cur.execute(self._peek_sql(), args)
            except psycopg2.Error as exc:
                raise self._peek_error(exc) from None
            skip = True
            tx_id = ""
            xid = commit = None
            ts_ms = 0
            total = 0
            per_table: dict[tuple[str, str], int] = {}
            same_lsn: dict[str, int] = {}
            end = None
            try:
                for (data,) in cur:
                    d = loads(data)
                    a = d["action"]
                    if a == "B":
                        end = Lsn.parse(d["nextlsn"])
                        if end > upto.lsn:
                            break  # commits after the bound (peek may return one such tx)
                        skip = end <= start_lsn
                        xid, commit = d["xid"], d["lsn"]
                        tx_id = f"{xid}:{commit}"
                        ts_ms = _commit_ms(d.get("timestamp"))
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
                            kw, pending = pending, None
                            yield ChangeEvent.build(**kw, tx_end=True, end_position=end_pos)
                        continue
                    schema, table = d.get("schema"), d.get("table")
                    if self.tables and (schema, table) not in self.tables:
                        continue
                    if a == "T":
                        self.schema_changes.append(PgSchemaChange(
                            Lsn.parse(d["lsn"]), PgPosition(end, sysid, tl), tx_id, schema, table,
                            "truncate"))
                        continue
                    if a not in ("I", "U", "D"):
                        continue  # M (logical messages)
                    lsn = d["lsn"]
                    n = same_lsn.get(lsn, 0)
                    same_lsn[lsn] = n + 1
                    before = _row(d.get("identity"))
                    after = _row(d.get("columns")) if a != "D" else None
                    if a == "U":
                        after = self._complete_after(schema, table, after, before)
                    image = after if after is not None else before
                    pk = d.get("pk")
                    key = {c["name"]: image.get(c["name"]) for c in pk} if pk and image else None
                    total += 1
                    k = per_table.get((schema, table), 0) + 1
                    per_table[(schema, table)] = k
                    if pending is not None:
                        yield ChangeEvent.build(**pending)
                    pending = dict(
                        tenant=spec.tenant, pipeline=spec.pipeline, connector="postgresql",
                        db=schema, schema=schema, table=table,
                        op={"I": "c", "U": "u", "D": "d"}[a], before=before, after=after, key=key,
                        tx_id=tx_id, event_id=f"{lsn}:{n}",
                        position={"lsn": lsn, "commit_lsn": commit, "xid": xid},
                        ts_ms=ts_ms, total_order=total, data_collection_order=k,
                    )
            except psycopg2.Error as exc:
                raise self._peek_error(exc) from None
            finally:
                try:
                    cur.close()
                except psycopg2.Error:
                    pass
        finally:
            try:
                conn.rollback()
                conn.close()
            except Exception:  # noqa: BLE001
                pass
        if last_end is None or last_end < upto.lsn:
            yield PositionMark(upto)

    def _peek_error(self, exc: psycopg2.Error) -> SourceError:
        msg = (getattr(exc, "pgerror", None) or str(exc)).strip()
        if "does not exist" in msg and "replication slot" in msg:
            err = SlotMissingError(f"replication slot {self.slot!r} disappeared during the read: {msg}")
            _attach(err, self.slot, None, None, None)
            return err
        if "can no longer get changes" in msg or "invalidated" in msg or "has already been removed" in msg:
            err2 = SlotInvalidatedError(f"replication slot {self.slot!r} lost WAL it needs: {msg}")
            _attach(err2, self.slot, None, None, None)
            return err2
        return SourceError(f"reading slot {self.slot!r} on {self.conn} failed: {msg}")

    def _complete_after(self, schema: str, table: str, after: dict[str, Any] | None,
                        before: dict[str, Any] | None) -> dict[str, Any] | None:
        """Fill the columns wal2json left out of an UPDATE's new tuple (unchanged TOAST)."""
        if after is None:
            return None
        if before is not None and len(before) > len(after) and all(k in before for k in after):
            return {k: (after[k] if k in after else before[k]) for k in before}
        cols = self._table_columns(schema, table)
        if len(cols) <= len(after):
            return after
        out = {}
        for c in cols:
            if c in after:
                out[c] = after[c]
            elif before is not None and c in before:
                out[c] = before[c]
            else:
                out[c] = UNAVAILABLE
        for k, v in after.items():
            out.setdefault(k, v)
        return out

    def _table_columns(self, schema: str, table: str) -> list[str]:
        key = (schema, table)
        if key not in self._columns:
            rows = self._q("SELECT a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid "
                           "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND "
                           "c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
                           (schema, table))
            self._columns[key] = [r[0] for r in rows]
        return self._columns[key]

    # ------------------------------------------------------------------ preflight

    def preflight(self, checkpoint: CheckpointRecord | None = None) -> list[Problem]:
        """Settings, privileges, slot health and retention headroom (the slot's safe_wal_size),
        replica identity; one :class:`Problem` per problem."""
        return self.check_server(checkpoint.position if checkpoint is not None else None)

    def check_server(self, checkpoint: PgPosition | None = None,
                     headroom_warn_bytes: int = DEFAULT_HEADROOM_WARN_BYTES) -> list[Problem]:
        """:meth:`preflight` for a checkpoint position."""
        try:
            settings = dict(self._q("SELECT name, setting FROM pg_settings WHERE name IN "
                                    "('wal_level', 'max_replication_slots', 'max_wal_senders', "
                                    "'max_slot_wal_keep_size')"))
        except (SourceError, psycopg2.Error) as exc:
            return [Problem("connection", str(self.conn), f"cannot query {self.conn}: {exc}")]
        probs: list[Problem] = []
        if settings.get("wal_level") != "logical":
            probs.append(setting_problem("wal_level", settings.get("wal_level"), "logical",
                                         "ALTER SYSTEM SET wal_level = logical, then restart the server"))
        if int(settings.get("max_replication_slots") or 0) < 1:
            probs.append(setting_problem("max_replication_slots", settings.get("max_replication_slots"),
                                         "at least 1", "ALTER SYSTEM SET max_replication_slots = 10, "
                                         "then restart the server"))
        (repl, superuser, role) = self._q("SELECT rolreplication, rolsuper, rolname FROM pg_roles "
                                          "WHERE rolname = current_user")[0]
        if not (repl or superuser):
            probs.append(Problem("privilege", "REPLICATION",
                                 f"the CDC role {role!r} lacks the REPLICATION attribute: "
                                 f"ALTER ROLE {role} REPLICATION"))
        info = self.slot_info()
        if info is None:
            if checkpoint is not None:
                probs.append(Problem("slot", self.slot,
                                     f"replication slot {self.slot!r} does not exist but the pipeline "
                                     f"has a checkpoint at {checkpoint}: the slot was dropped, changes "
                                     f"after the checkpoint may be lost"))
            else:
                probs.append(Problem("slot", self.slot,
                                     f"replication slot {self.slot!r} does not exist yet: it is created "
                                     f"on the pipeline's first run", WARNING))
        else:
            if info["wal_status"] == "lost":
                probs.append(Problem("slot", self.slot,
                                     f"replication slot {self.slot!r} is invalidated (wal_status=lost): "
                                     f"WAL it needed was removed (max_slot_wal_keep_size)"))
            elif info["plugin"] != PLUGIN:
                probs.append(Problem("slot", self.slot,
                                     f"replication slot {self.slot!r} uses plugin {info['plugin']!r}, "
                                     f"tidegate needs {PLUGIN}"))
            if checkpoint is not None and info["confirmed_flush_lsn"] and \
                    checkpoint.lsn < Lsn.parse(info["confirmed_flush_lsn"]):
                probs.append(Problem("retention", self.slot,
                                     f"checkpoint {checkpoint} is before slot {self.slot!r}'s start "
                                     f"{info['confirmed_flush_lsn']}: the changes in between are gone"))
            safe = info["safe_wal_size"]
            detail = {"safe_wal_size": safe, "lag_bytes": info["lag_bytes"], "wal_status": info["wal_status"]}
            if safe is not None and info["wal_status"] != "lost":
                if safe <= 0:
                    probs.append(Problem("retention", "max_slot_wal_keep_size",
                                         f"slot {self.slot!r} has no WAL headroom left (safe_wal_size "
                                         f"{human_bytes(safe)}): it will be invalidated at the next "
                                         f"checkpoint; run the pipeline or raise max_slot_wal_keep_size",
                                         ERROR, detail))
                elif safe < headroom_warn_bytes:
                    probs.append(Problem("retention", "max_slot_wal_keep_size",
                                         f"slot {self.slot!r} has {human_bytes(safe)} of WAL headroom "
                                         f"(safe_wal_size) before the server invalidates it; it is "
                                         f"{human_bytes(info['lag_bytes'])} behind",
                                         WARNING, detail))
        probs += self._replica_identity_problems()
        return probs

    def _replica_identity_problems(self) -> list[Problem]:
        sql = ("SELECT n.nspname, c.relname, c.relreplident, "
               "EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary) "
               "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
               "WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
               "AND n.nspname NOT LIKE 'pg_toast%%' AND n.nspname NOT LIKE 'pg_temp%%'")
        rows = self._q(sql + " ORDER BY 1, 2")
        if self.tables:
            rows = [r for r in rows if (r[0], r[1]) in self.tables]
        not_full = [f"{s}.{t}" for s, t, ident, _ in rows if ident != "f"]
        no_key = [f"{s}.{t}" for s, t, ident, pk in rows
                  if ident == "n" or (ident == "d" and not pk)]
        out = []
        if not_full:
            out.append(Problem("replica_identity", ",".join(not_full),
                               f"{len(not_full)} table(s) without REPLICA IDENTITY FULL: updates and "
                               f"deletes carry only the key columns as before-image, and unchanged "
                               f"TOAST values come as {UNAVAILABLE!r}: {', '.join(not_full)} "
                               f"(ALTER TABLE ... REPLICA IDENTITY FULL)", WARNING,
                               {"tables": not_full}))
        if no_key:
            out.append(Problem("replica_identity", ",".join(no_key),
                               f"{len(no_key)} table(s) have no replica identity (no primary key and "
                               f"not FULL): their updates and deletes cannot be captured: "
                               f"{', '.join(no_key)} (add a primary key or ALTER TABLE ... REPLICA "
                               f"IDENTITY FULL)", ERROR, {"tables": no_key}))
        return out


def _attach(err: Exception, slot: str, requested: Any, earliest: Any, last_confirmed: Any) -> None:
    err.slot = slot  # type: ignore[attr-defined]
    err.requested = requested  # type: ignore[attr-defined]
    err.earliest_available = earliest  # type: ignore[attr-defined]
    err.last_confirmed = last_confirmed  # type: ignore[attr-defined]
