"""Debezium's side of the comparison: its connectors (tests/compat/debezium-capture, built by
`make compat-build`) capture a backlog into JSON lines; its ExtractNewRecordState runs over any
records in that form. Also the comparison itself: the join by source position and the diff.

`python -m tests.compat.harness OUT_DIR` writes Debezium's own output for both backlogs to
OUT_DIR/{mariadb,postgres}/ (ground truth for the envelope's own tests), on the shared servers.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.compat import backlogs

CAPTURE_DIR = Path(__file__).resolve().parent / "debezium-capture"
MAIN_CLASS = "tidegate.compat.DebeziumCapture"
# Which Maven profile (and Debezium release) serves each source: Maven Central has the MariaDB
# connector only up to 3.5.0.Final.
BUILDS = {"mariadb": "mariadb", "postgres": "postgres"}
DEBEZIUM_SLOT = "tidegate_compat_dbz"
DEBEZIUM_PUBLICATION = "tidegate_compat_dbz"
MARIADB_SERVER_ID = 48777
# The modes variant: a second Debezium capture of the same backlog, run alongside the first,
# with connector settings other than the defaults, compared with a second pair of tidegate
# sinks with the same settings over the tables that exercise them (the other tables are
# compared once, with the default settings). TRUNCATE is skipped there, as Debezium's default.
VARIANT_SLOT = "tidegate_compat_dbz_modes"
EXTRA_SLOTS = "tidegate_compat_dbz_x"  # and a suffix: the extra captures' slots
VARIANT_SERVER_ID = 48779
EXTRA_SERVER_IDS = 48790  # and up: the extra captures of generated backlogs, one per value-mode set
VARIANTS: dict[str, dict[str, Any]] = {
    "mariadb": {"properties": {"decimal.handling.mode": "string", "time.precision.mode": "connect"},
                "options": "decimal_handling_mode: string, time_precision_mode: connect",
                "tables": ("t_modes", "t_trunc")},
    "postgres": {"properties": {"decimal.handling.mode": "double"},
                 "options": "decimal_handling_mode: double",
                 "tables": ("t_floats", "t_trunc")},
}

# Fields removed from both sides before comparing, and why (docs/compat.md has the same list).
# A path names a field of a change event's value (the schemas-off form); in the schemas-on form
# the same field of "payload" is removed, and its entry in "schema" is kept (the schema is the
# same on both sides).
IGNORED_FIELDS: dict[str, str] = {
    "ts_ms": "processing time: when the connector handled the event, not when it happened",
    "ts_us": "processing time (microseconds), as ts_ms",
    "ts_ns": "processing time (nanoseconds), as ts_ms",
    "source.version": "the connector's release string (Debezium's is 3.6.1.Final / 3.5.0.Final)",
    "source.connector": "the connector's kind name for tidegate equals Debezium's;"
                        " kept only if tidegate writes it",
}
IGNORED_FIELDS.pop("source.connector")  # written by both: compared after all
# Values that differ by nature (docs/compat.md, "Values that differ"): per source and table, the
# columns, the values Debezium writes there and the one tidegate writes instead. Only that exact
# pair is forgiven, in before and after; any other difference of the column is still reported.
DECLARED_VALUES: list[dict[str, Any]] = [
    {"source": "postgres", "table": "t_floats", "columns": ("r", "dp", "dn"),
     "debezium": ("NaN", "Infinity", "-Infinity"), "tidegate": None,
     # what ExtractNewRecordState's JSON converter reads back from those strings in a double field
     "extracted": (0.0,),
     "why": "real/double NaN and infinities (and NUMERIC NaN in double mode): the PostgreSQL source's"
            " values are null for them (wal2json writes null; pgoutput is read to the same events)"},
    {"source": "postgres", "table": "t_floats", "columns": ("dp",), "debezium": (-0.0,), "tidegate": 0.0,
     "extracted": (),
     "why": "double -0: the PostgreSQL source's value is 0.0 (wal2json writes the integer -0)"},
]
# Headers left out of the comparison, and why. Headers are compared as Kafka Connect's default
# header converter writes them (SimpleHeaderConverter: a struct as its JSON text).
IGNORED_HEADERS: dict[str, str] = {
    "__debezium.context.runId": "a new UUID each time a Debezium connector starts",
    "idempotency_key": "tidegate's exactly-once key, on every record it writes; Debezium has none",
}


def build_dir(source: str) -> Path:
    d = CAPTURE_DIR / "target" / BUILDS[source]
    if not (d / "classes").is_dir() or not (d / "lib").is_dir():
        raise RuntimeError(f"Debezium's capture program for {source} is not built ({d} is missing): "
                           f"run `make compat-build` (part of `make install`) first")
    return d


def java_command(source: str, *args: str, log_level: str = "info") -> list[str]:
    d = build_dir(source)
    return ["java", "-Xmx512m", "-XX:TieredStopAtLevel=1",
            f"-Dorg.slf4j.simpleLogger.defaultLogLevel={log_level}",
            "-cp", f"{d / 'classes'}:{d / 'lib'}/*", MAIN_CLASS, *args]


def variant_properties(source: str, properties: dict[str, str]) -> dict[str, str]:
    """The modes variant's connector settings: the variant's modes, TRUNCATE skipped (the
    default), and only the variant's tables (with the stop and probe tables) captured, their
    DDL alone kept: the second connector then starts faster (MariaDB's reads the schema of
    every database otherwise)."""
    out = {k: v for k, v in properties.items() if k != "skipped.operations"}
    out.update(VARIANTS[source]["properties"])
    tables = [*VARIANTS[source]["tables"], backlogs.STOP_TABLE]
    if source == "mariadb":
        out["database.server.id"] = str(VARIANT_SERVER_ID)
        tables.append(backlogs.PROBE_TABLE)
        out["schema.history.internal.store.only.captured.tables.ddl"] = "true"
    else:
        out["slot.name"] = VARIANT_SLOT
    out["table.include.list"] = ",".join(_table_of(source, t) for t in tables)
    return out


def mariadb_properties(conn, prefix: str) -> dict[str, str]:
    """Debezium's MariaDB connector, default settings except where the harness needs another."""
    return {
        "name": prefix, "connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
        "topic.prefix": prefix,
        "database.hostname": conn.host, "database.port": str(conn.port),
        "database.user": conn.login, "database.password": conn.password or "",
        "database.server.id": str(MARIADB_SERVER_ID),
        "database.include.list": backlogs.MARIADB_DB,
        # the backlog is written after the connector reads the binlog: no data snapshot
        "snapshot.mode": "no_data",
        # Debezium skips TRUNCATE by default; the issue wants op "t" compared
        "skipped.operations": "none",
        "schema.history.internal": "io.debezium.relational.history.MemorySchemaHistory",
        "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
        "offset.flush.interval.ms": "60000",
    }


def postgres_properties(conn, prefix: str) -> dict[str, str]:
    """Debezium's PostgreSQL connector (pgoutput, its default plugin) on a slot and publication
    the harness made before the backlog, so it reads the backlog from the slot."""
    return {
        "name": prefix, "connector.class": "io.debezium.connector.postgresql.PostgresConnector",
        "topic.prefix": prefix,
        "database.hostname": conn.host, "database.port": str(conn.port),
        "database.user": conn.login, "database.password": conn.password or "",
        "database.dbname": conn.schema,
        "plugin.name": "pgoutput",
        "slot.name": DEBEZIUM_SLOT, "publication.name": DEBEZIUM_PUBLICATION,
        "publication.autocreate.mode": "disabled",
        "schema.include.list": backlogs.POSTGRES_SCHEMA,
        # no data snapshot; with no stored offset the connector streams from the slot's position
        "snapshot.mode": "no_data",
        "skipped.operations": "none",
        "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
        "offset.flush.interval.ms": "60000",
    }


class Capture:
    """One run of Debezium's embedded engine, from start to the stop table's row."""

    def __init__(self, source: str, properties: dict[str, str], out: Path, *, probe: bool,
                 timeout_s: int = 120):
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        props = out / "connector.properties"
        # a properties file, not argv: it holds the database password
        props.write_text("".join(f"{k}={_escape(v)}\n" for k, v in properties.items()))
        props.chmod(0o600)
        args = ["capture", "--properties", str(props), "--out", str(out),
                "--stop-table", _table_of(source, backlogs.STOP_TABLE), "--timeout-seconds", str(timeout_s)]
        if probe:
            args += ["--probe-table", _table_of(source, backlogs.PROBE_TABLE)]
        self.log_path = out / "debezium.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(java_command(source, *args), stdout=subprocess.PIPE,
                                     stderr=self._log, text=True)
        self.lines: list[str] = []
        self._capturing = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.strip())
            if line.startswith("CAPTURING"):
                self._capturing.set()

    def wait_capturing(self, write_probe: Callable[[], None], timeout_s: float = 90) -> None:
        """Write probe rows until Debezium has read one: from then on it reads the log."""
        deadline = time.monotonic() + timeout_s
        while not self._capturing.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.fail("did not start reading the log")
            write_probe()

    def finish(self) -> Path:
        try:
            rc = self.proc.wait(timeout=180)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.fail("did not finish within 180 s")
        self._reader.join(5)
        self._log.close()
        if rc != 0:
            self.fail(f"exited with {rc}")
        return self.out / "records"

    def fail(self, what: str) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        log = self.log_path.read_text(errors="replace")[-6000:]
        raise RuntimeError(f"Debezium's capture {what}; stdout {self.lines}; its log "
                           f"({self.log_path}), last lines:\n{log}")


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n")


def _table_of(source: str, table: str) -> str:
    return f"{backlogs.MARIADB_DB if source == 'mariadb' else backlogs.POSTGRES_SCHEMA}.{table}"


def extract(source: str, records_on: Path, out_prefix: Path) -> Path:
    """ExtractNewRecordState (Debezium's, default settings) over records in the schemas-on form."""
    args = ["extract", "--in", str(records_on), "--out-prefix", str(out_prefix)]
    # warnings only: a failure's message then ends with the exception, not the converters' settings
    r = subprocess.run(java_command(source, *args, log_level="warn"), capture_output=True, text=True,
                       timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"ExtractNewRecordState over {records_on} failed ({r.returncode}):\n"
                           f"{r.stdout[-2000:]}\n{r.stderr[-6000:]}")
    return out_prefix


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_jsonl(path: Path, records: Iterable[dict]) -> None:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


# --------------------------------------------------------------------------- the comparison


def payload(value: Any) -> Any:
    """A value's payload: the value itself (schemas off) or its "payload" (schemas on)."""
    if isinstance(value, dict) and set(value) == {"schema", "payload"}:
        return value["payload"]
    return value


def position_of(source: str, value: Any) -> tuple | None:
    """Where a change event's row sits in the source log: MariaDB binlog file, position and row
    in the event; PostgreSQL LSN and Debezium's sequence ([last commit LSN, LSN])."""
    p = payload(value)
    if not isinstance(p, dict) or not isinstance(p.get("source"), dict):
        return None
    s = p["source"]
    if source == "mariadb":
        return (s.get("file"), s.get("pos"), s.get("row"))
    return (s.get("lsn"), s.get("sequence"))


def keyed(source: str, records: list[dict]) -> tuple[dict[tuple, dict], list[str]]:
    """Records by join key (topic's table, position, op); a tombstone joins as its delete's
    ("tombstone") twin. Returns the map and the problems (records with no position, twins)."""
    out: dict[tuple, dict] = {}
    problems = []
    last: tuple | None = None
    for i, r in enumerate(records):
        table = table_of_topic(r["topic"])
        if r.get("value") is None:
            if last is None:
                problems.append(f"record {i} (topic {r['topic']}) is a tombstone with no delete before it")
                continue
            k = (table, *last[1:-1], "tombstone")
        else:
            pos = position_of(source, r["value"])
            if pos is None:
                problems.append(f"record {i} (topic {r['topic']}) has no source position: "
                                f"{json.dumps(r['value'])[:300]}")
                continue
            k = (table, *pos, payload(r["value"]).get("op"))
            last = k
        if k in out:
            problems.append(f"record {i}: two records join as {k}")
        out[k] = r
    return out, problems


def table_of_topic(topic: str) -> str:
    """The db.table (schema.table) part of a change topic: its last two dot-separated parts."""
    return ".".join(topic.split(".")[-2:])


def strip_ignored(value: Any) -> Any:
    """A copy of a change event's value without the ignored fields (in its payload)."""
    value = json.loads(json.dumps(value))
    p = payload(value)
    if not isinstance(p, dict):
        return value
    for path in IGNORED_FIELDS:
        node = p
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return value


# A MariaDB zero TIMESTAMP ('0000-00-00 00:00:00'): Debezium writes the epoch, tidegate null
# (declared in docs/compat.md). No TIMESTAMP holds the epoch itself (they start at 00:00:01 UTC).
_ZERO_TIMESTAMP = re.compile(r"1970-01-01T00:00:00(\.0+)?Z")


def _declared(source: str, table: str, column: str, d: Any, t: Any, side: str = "debezium") -> bool:
    """Whether Debezium's ``d`` and tidegate's ``t`` in a column are a declared difference
    (``side``: "debezium" for the records, "extracted" for ExtractNewRecordState's rows)."""
    if source == "mariadb" and t is None and isinstance(d, str) and _ZERO_TIMESTAMP.fullmatch(d):
        return True
    for rule in DECLARED_VALUES:
        if rule["source"] == source and rule["table"] == table.rsplit(".", 1)[-1] \
                and column in rule["columns"] and t == rule["tidegate"] \
                and type(t) is type(rule["tidegate"]) \
                and any(d == x and type(d) is type(x) and _same_sign(d, x) for x in rule[side]):
            return True
    return False


def forgive_declared_rows(source: str, debezium: list[tuple], tidegate: list[tuple],
                          history: SchemaHistory | None = None) -> tuple[list[tuple], list[tuple]]:
    """tidegate's ExtractNewRecordState rows with each declared difference set to Debezium's
    row's value (rows paired by index, table and key); with a ``history``, both sides' rows
    without the columns an ALTER touched (a row has no position to tell before from after)."""
    if history is not None:
        debezium, tidegate = ([_without(row, history.ever_touched(row[0])) for row in rows]
                              for rows in (debezium, tidegate))
    out = []
    for i, row in enumerate(tidegate):
        other = debezium[i] if i < len(debezium) else None
        if other is not None and other[:2] == row[:2]:
            d, t = json.loads(other[2]), json.loads(row[2])
            if isinstance(d, dict) and isinstance(t, dict):
                for column, value in d.items():
                    if column in t and _declared(source, row[0], column, value, t[column], "extracted"):
                        t[column] = value
                row = (row[0], row[1], json.dumps(t, sort_keys=True))
        out.append(row)
    return debezium, out


def _without(row: tuple, columns: set[str]) -> tuple:
    value = json.loads(row[2])
    if not columns or not isinstance(value, dict):
        return row
    return (row[0], row[1], json.dumps({k: v for k, v in value.items() if k not in columns}, sort_keys=True))


def _same_sign(a: Any, b: Any) -> bool:
    return not isinstance(a, float) or not isinstance(b, float) or math.copysign(1, a) == math.copysign(1, b)


def forgive_declared(source: str, table: str, debezium: Any, tidegate: Any) -> None:
    """Sets, in tidegate's value (a stripped copy), every declared difference of its before and
    after to Debezium's value, so that only the others are reported."""
    d, t = payload(debezium), payload(tidegate)
    if not isinstance(d, dict) or not isinstance(t, dict):
        return
    for part in ("before", "after"):
        d_row, t_row = d.get(part), t.get(part)
        if isinstance(d_row, dict) and isinstance(t_row, dict):
            for column, value in d_row.items():
                if column in t_row and _declared(source, table, column, value, t_row[column]):
                    t_row[column] = value


def differences(expected: Any, actual: Any, path: str = "") -> list[str]:
    """Every field where two JSON values differ, as 'path: debezium X, tidegate Y' lines."""
    if isinstance(expected, dict) and isinstance(actual, dict):
        out = []
        for k in list(expected) + [k for k in actual if k not in expected]:
            sub = f"{path}.{k}" if path else k
            if k not in actual:
                out.append(f"{sub}: debezium {_short(expected[k])}, tidegate has no such field")
            elif k not in expected:
                out.append(f"{sub}: debezium has no such field, tidegate {_short(actual[k])}")
            else:
                out += differences(expected[k], actual[k], sub)
        return out
    if isinstance(expected, list) and isinstance(actual, list) and len(expected) == len(actual):
        out = []
        for i, (e, a) in enumerate(zip(expected, actual, strict=True)):
            out += differences(e, a, f"{path}[{i}]")
        return out
    if expected != actual or type(expected) is not type(actual) or not _same_sign(expected, actual):
        return [f"{path or '(whole)'}: debezium {_short(expected)}, tidegate {_short(actual)}"]
    return []


def _short(v: Any) -> str:
    text = json.dumps(v, ensure_ascii=False)
    return text if len(text) <= 200 else text[:200] + "..."


_JAVA_DOUBLE = re.compile(r"-?\d+\.\d+E-?\d+")


def _same_doubles(debezium: dict[str, Any], tidegate: dict[str, Any], difference: str) -> bool:
    """A declared difference (docs/compat.md): a key-change header whose texts differ only in a
    double's digits that read back to the same double (Java 17's Double.toString writes more
    digits than the shortest at times: 1.70155593535018701E18; tidegate writes the shortest)."""
    name = difference.split(":", 1)[0]
    d, t = debezium.get(name), tidegate.get(name)
    if not isinstance(d, str) or not isinstance(t, str):
        return False
    if _JAVA_DOUBLE.sub("#", d) != _JAVA_DOUBLE.sub("#", t):
        return False
    return [float(x) for x in _JAVA_DOUBLE.findall(d)] == [float(x) for x in _JAVA_DOUBLE.findall(t)]


def headers_of(record: dict) -> dict[str, Any]:
    return {h["key"]: h.get("text") for h in record.get("headers") or [] if h["key"] not in IGNORED_HEADERS}


def data_records(records: list[dict], tables: Iterable[str] | None = None) -> list[dict]:
    """The change events: records of the table topics (prefix.db.table), not of the schema
    change topic (the prefix alone); of the named tables only when ``tables`` is given."""
    wanted = None if tables is None else set(tables)
    return [r for r in records if r["topic"].count(".") >= 2
            and (wanted is None or r["topic"].rsplit(".", 1)[-1] in wanted)]


@dataclass
class SchemaHistory:
    """Where the backlog's ALTER TABLE statements landed in the source log, and the columns each
    names (added, dropped, renamed, retyped). tidegate types a run's rows by the
    catalog at the run, not by the table's definition when the row was written (declared in
    docs/compat.md): in a row written before such a statement those columns are not compared."""

    source: str
    # table, the columns it names, where it ended, the statement
    marks: list[tuple[str, frozenset[str], Any, str]] = field(default_factory=list)

    def touched(self, table: str, position: tuple) -> set[str]:
        """The columns of ``table`` (db.table) that a later statement touched, for a row at
        ``position`` (a join key's position part)."""
        at = position[:2] if self.source == "mariadb" else position[0]
        name = table.rsplit(".", 1)[-1]
        return {c for t, columns, where, _ in self.marks if t == name and at < where for c in columns}

    def touched_after(self, statement: str) -> set[str]:
        """The columns that statements after ``statement`` on its table named: a schema change
        record of it is compared without them (the catalog at the run, declared)."""
        mine = [(t, where) for t, _, where, s in self.marks if s == statement]
        if not mine:
            return set()
        table, at = mine[0]
        return {c for t, columns, where, _ in self.marks if t == table and where > at for c in columns}

    def ever_touched(self, table: str) -> set[str]:
        name = table.rsplit(".", 1)[-1]
        return {c for t, columns, _, _ in self.marks if t == name for c in columns}


def strip_columns(value: Any, columns: set[str]) -> None:
    """Removes ``columns`` from a change value's before/after and from their schemas, in place."""
    p = payload(value)
    if not columns or not isinstance(p, dict):
        return
    for part in ("before", "after"):
        if isinstance(p.get(part), dict):
            for c in columns:
                p[part].pop(c, None)
    schema = value.get("schema") if isinstance(value, dict) and "payload" in value else None
    for f in (schema or {}).get("fields", []):
        if f.get("field") in ("before", "after") and isinstance(f.get("fields"), list):
            f["fields"] = [x for x in f["fields"] if x.get("field") not in columns]


def compare(source: str, debezium: list[dict], tidegate: list[dict],
            history: SchemaHistory | None = None) -> list[str]:
    """Every difference between two captures of the same backlog: events one side lacks, and
    per joined event each differing field of key, value and headers."""
    want, problems_d = keyed(source, debezium)
    got, problems_t = keyed(source, tidegate)
    report = [f"debezium: {p}" for p in problems_d] + [f"tidegate: {p}" for p in problems_t]
    for k in want:
        if k not in got:
            report.append(f"{k}: debezium's event is missing from tidegate's output: "
                          f"{_short(payload(want[k]['value']))}")
            continue
        d, t = want[k], got[k]
        diffs = [f"key.{x}" for x in differences(d.get("key"), t.get("key"))]
        d_value, t_value = strip_ignored(d.get("value")), strip_ignored(t.get("value"))
        if history is not None and k[-1] != "tombstone":
            for v in (d_value, t_value):
                strip_columns(v, history.touched(k[0], k[1:-1]))
        forgive_declared(source, k[0], d_value, t_value)
        values = differences(d_value, t_value)
        diffs += [f"value.{x}" for x in values]
        diffs += [f"headers.{x}" for x in differences(headers_of(d), headers_of(t))
                  if not _same_doubles(headers_of(d), headers_of(t), x)]
        if diffs:
            report.append(f"{k}: {len(diffs)} differing field(s)\n    " + "\n    ".join(diffs))
    for k in got:
        if k not in want:
            report.append(f"{k}: tidegate's event has no Debezium counterpart: "
                          f"{_short(payload(got[k]['value']))}")
    return report


# A snapshot row's source block says where the snapshot stood, not where the row was written: the
# fields below differ by nature between two snapshots taken at different moments (docs/compat.md).
SNAPSHOT_IGNORED_SOURCE = ("file", "pos", "row", "gtid", "server_id", "thread", "lsn", "sequence", "txId",
                           "xmin", "ts_ms", "ts_us", "ts_ns",
                           # declared (docs/compat.md): tidegate marks "true" and a table's "last"
                           # row; Debezium also "first", "first_in_data_collection" and
                           # "last_in_data_collection", in its own row order
                           "snapshot")


def _snapshot_float(source: str, debezium: Any, tidegate: Any) -> bool:
    """Declared (docs/compat.md): a MariaDB FLOAT in Debezium's snapshot is the server's text
    of it, 6 significant digits (171935.0 for 171935.02); tidegate writes the float exactly, as
    both write it in log events."""
    if source != "mariadb" or not isinstance(debezium, float) or not isinstance(tidegate, float):
        return False
    single = struct.unpack("f", struct.pack("f", tidegate))[0]  # the float the server rounds
    return debezium in (float(f"{tidegate:.6g}"), float(f"{single:.6g}"))


def _forgive_snapshot_floats(source: str, debezium: Any, tidegate: Any) -> None:
    d, t = payload(debezium), payload(tidegate)
    d_row = d.get("after") if isinstance(d, dict) else None
    t_row = t.get("after") if isinstance(t, dict) else None
    if isinstance(d_row, dict) and isinstance(t_row, dict):
        for column, value in d_row.items():
            if _snapshot_float(source, value, t_row.get(column)):
                t_row[column] = value


def snapshot_rows(source: str, records: list[dict]) -> tuple[dict[tuple, dict], list[str]]:
    """The snapshot's read records ("op": "r") by (table, key); a table without a key joins its
    rows by their content. Returns the map and the problems (twins)."""
    out: dict[tuple, dict] = {}
    problems = []
    for r in data_records(records):
        p = payload(r.get("value"))
        if not isinstance(p, dict) or p.get("op") != "r":
            continue
        key = payload(r.get("key"))
        joined = key if key is not None else p.get("after")
        k = (table_of_topic(r["topic"]), json.dumps(joined, sort_keys=True))
        if k in out:
            problems.append(f"{k}: two snapshot records")
        out[k] = r
    return out, problems


def compare_snapshot(source: str, debezium: list[dict], tidegate: list[dict]) -> tuple[list[str], int]:
    """Every difference between two snapshots of the same tables (rows one side lacks; per row,
    each differing field but the snapshot's own position, SNAPSHOT_IGNORED_SOURCE); and how
    many of Debezium's rows were compared."""
    want, problems_d = snapshot_rows(source, debezium)
    got, problems_t = snapshot_rows(source, tidegate)
    report = [f"debezium: {p}" for p in problems_d] + [f"tidegate: {p}" for p in problems_t]
    for k, d in want.items():
        t = got.get(k)
        if t is None:
            report.append(f"{k}: debezium's snapshot row is missing from tidegate's: "
                          f"{_short(payload(d['value']))}")
            continue
        d_value, t_value = (_without_snapshot_position(strip_ignored(r.get("value"))) for r in (d, t))
        forgive_declared(source, k[0], d_value, t_value)
        _forgive_snapshot_floats(source, d_value, t_value)
        diffs = [f"key.{x}" for x in differences(d.get("key"), t.get("key"))]
        diffs += [f"value.{x}" for x in differences(d_value, t_value)]
        if diffs:
            report.append(f"{k}: {len(diffs)} differing field(s)\n    " + "\n    ".join(diffs))
    report += [f"{k}: tidegate's snapshot row has no Debezium counterpart" for k in got if k not in want]
    return report, len(want)


def _without_snapshot_position(value: Any) -> Any:
    p = payload(value)
    if isinstance(p, dict) and isinstance(p.get("source"), dict):
        for field_name in SNAPSHOT_IGNORED_SOURCE:
            p["source"].pop(field_name, None)
    return value


def rows_of(extracted: list[dict]) -> list[tuple[str, str, str]]:
    """ExtractNewRecordState's output of the change topics as (table, key, row) triples, the
    payload only, table by table in each table's order (Kafka orders per topic only)."""
    rows = [(table_of_topic(r["topic"]), json.dumps(payload(r.get("key")), sort_keys=True),
             json.dumps(payload(r.get("value")), sort_keys=True)) for r in data_records(extracted)]
    return sorted(rows, key=lambda row: row[0])


def row_differences(expected: list[tuple], actual: list[tuple]) -> str:
    """Where two lists of (table, key, row) differ, row by row."""
    out = [f"debezium {len(expected)} rows, tidegate {len(actual)} rows"]
    for i in range(max(len(expected), len(actual))):
        e = expected[i] if i < len(expected) else None
        a = actual[i] if i < len(actual) else None
        if e != a:
            out.append(f"  row {i}:\n    debezium {e}\n    tidegate {a}")
    return "\n".join(out)


# --------------------------------------------------------------------------- the sources


def run_statements(execute: Callable[[str], None], statements: Iterable[str]) -> None:
    for s in statements:
        execute(s)


def mariadb_backlog(admin_kwargs: dict, before_backlog: Callable[[], None], out: Path,
                    prefix: str, backlog: Any = backlogs, variant: bool = True,
                    extra: dict[str, dict[str, str]] | None = None) -> tuple[Path, Path | None]:
    """Debezium's MariaDB captures of the backlog (``backlog``: tests.compat.backlogs or a
    generated one), with the default settings and, when ``variant``, the modes variant's (two
    connectors at once); ``extra``: more captures of the whole backlog, each with these
    settings over the defaults, written to out/NAME/records. before_backlog runs once they all
    read the binlog (the tidegate pipeline takes its start there). Returns the records' path
    prefixes (None: no variant)."""
    import pymysql

    admin = pymysql.connect(**admin_kwargs, autocommit=True)
    try:
        with admin.cursor() as c:
            c.execute("SET time_zone = '+00:00'")
            run_statements(c.execute, backlog.MARIADB_SETUP)
        conn = _connection_of(admin_kwargs)
        properties = mariadb_properties(conn, prefix)
        captures = [Capture("mariadb", properties, out, probe=True)]
        if variant:
            captures.append(Capture("mariadb", variant_properties("mariadb", properties), out / "modes",
                                    probe=True))
        for i, (name, settings) in enumerate((extra or {}).items()):
            own = {**properties, **settings, "database.server.id": str(EXTRA_SERVER_IDS + i)}
            captures.append(Capture("mariadb", own, out / name, probe=True))
        try:
            with admin.cursor() as c:
                for capture in captures:
                    capture.wait_capturing(lambda: c.execute(
                        f"INSERT INTO {backlogs.MARIADB_DB}.{backlogs.PROBE_TABLE} VALUES ()"))
            before_backlog()
            admin.autocommit(False)
            with admin.cursor() as c:
                for tx in backlog.MARIADB_BACKLOG:
                    run_statements(c.execute, tx)
                    admin.commit()
                    _mark_ddl(backlog, tx, c, "SHOW MASTER STATUS", lambda row: (row[0], row[1]))
                run_statements(c.execute, backlog.MARIADB_END)
                admin.commit()
            finished = [capture.finish() for capture in captures]
            return finished[0], (finished[1] if variant else None)
        except BaseException:
            for capture in captures:
                if capture.proc.poll() is None:
                    capture.proc.kill()
            raise
    finally:
        admin.close()


def _mark_ddl(backlog: Any, tx: list[str], cursor: Any, query: str, position: Callable[[tuple], Any]) -> None:
    """Notes where an ALTER TABLE of a generated backlog ended in the log (``ddl_marks``)."""
    marks = getattr(backlog, "ddl_marks", None)
    if marks is not None and any(s.startswith("ALTER TABLE") for s in tx):
        cursor.execute(query)
        marks.append((tx, position(cursor.fetchone())))


def lsn_of(text: str) -> int:
    high, low = text.split("/")
    return (int(high, 16) << 32) + int(low, 16)


def mariadb_teardown(admin_kwargs: dict) -> None:
    import pymysql

    admin = pymysql.connect(**admin_kwargs, autocommit=True)
    try:
        with admin.cursor() as c:
            run_statements(c.execute, backlogs.MARIADB_TEARDOWN)
    finally:
        admin.close()


def postgres_setup(admin_dsn: str, backlog: Any = backlogs, extra_slots: Iterable[str] = ()) -> None:
    import psycopg2

    admin = psycopg2.connect(admin_dsn)
    admin.autocommit = True
    try:
        with admin.cursor() as c:
            _drop_postgres_debezium(c)
            run_statements(c.execute, backlog.POSTGRES_SETUP)
            tables = ", ".join(f"{backlogs.POSTGRES_SCHEMA}.{t}" for t in backlog.POSTGRES_PUBLISHED)
            c.execute(f"CREATE PUBLICATION {DEBEZIUM_PUBLICATION} FOR TABLE {tables}")
            for slot in (DEBEZIUM_SLOT, VARIANT_SLOT, *extra_slots):
                c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (slot,))
    finally:
        admin.close()


def postgres_backlog(admin_dsn: str, backlog: Any = backlogs) -> None:
    import psycopg2

    admin = psycopg2.connect(admin_dsn)
    try:
        with admin.cursor() as c:
            for tx in [*backlog.POSTGRES_BACKLOG, backlog.POSTGRES_END]:
                run_statements(c.execute, tx)
                admin.commit()
                _mark_ddl(backlog, tx, c, "SELECT pg_current_wal_lsn()::text", lambda row: lsn_of(row[0]))
    finally:
        admin.close()


def postgres_capture(conn, out: Path, prefix: str) -> Path:
    capture = Capture("postgres", postgres_properties(conn, prefix), out, probe=False)
    return capture.finish()


def _drop_postgres_debezium(c) -> None:
    c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name IN %s"
              " OR slot_name LIKE %s", ((DEBEZIUM_SLOT, VARIANT_SLOT), EXTRA_SLOTS + "%"))
    c.execute(f"DROP PUBLICATION IF EXISTS {DEBEZIUM_PUBLICATION}")


def postgres_teardown(admin_dsn: str) -> None:
    import psycopg2

    admin = psycopg2.connect(admin_dsn)
    admin.autocommit = True
    try:
        with admin.cursor() as c:
            _drop_postgres_debezium(c)
            run_statements(c.execute, backlogs.POSTGRES_TEARDOWN)
    finally:
        admin.close()


def _connection_of(kwargs: dict):
    class Conn:
        host, port, login, password = kwargs["host"], kwargs["port"], kwargs["user"], kwargs["password"]
        schema = kwargs.get("database")
    return Conn


def keep_own_schema_changes(path: Path) -> None:
    """Drops the schema change records of other databases: the connector's schema snapshot
    reads every database on the shared server, the backlog's are the only ones of interest."""
    own = (backlogs.MARIADB_DB, backlogs.POSTGRES_SCHEMA)
    kept = [r for r in read_jsonl(path)
            if not (isinstance(r.get("key"), dict) and "databaseName" in payload(r["key"])
                    and payload(r["key"])["databaseName"] not in own)]
    write_jsonl(path, kept)


def main(out_root: str) -> None:
    """Debezium's own output for both backlogs, and ExtractNewRecordState over it."""
    from tests.conftest import Service, _service, services_env

    env = services_env()
    os.environ.update(env)
    mysql: Service = _service("mysql", "cdc_mysql", "cdc_mysql_admin", env)
    postgres: Service = _service("postgres", "cdc_postgres", "cdc_postgres_admin", env)
    root = Path(out_root)
    kwargs = mysql.mysql_kwargs(admin=True)
    kwargs.pop("database", None)
    try:
        prefix, _ = mariadb_backlog(kwargs, lambda: None, root / "mariadb", "compat")
    finally:
        mariadb_teardown(kwargs)
    extract("mariadb", Path(f"{prefix}.schemas-on.jsonl"), root / "mariadb" / "extracted")
    postgres_setup(postgres.admin_dsn)
    try:
        postgres_backlog(postgres.admin_dsn)
        prefix = postgres_capture(postgres.admin, root / "postgres", "compat")
    finally:
        postgres_teardown(postgres.admin_dsn)
    extract("postgres", Path(f"{prefix}.schemas-on.jsonl"), root / "postgres" / "extracted")
    for f in sorted(root.glob("*/*.jsonl")):
        keep_own_schema_changes(f)
        print(f, len(f.read_text().splitlines()))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "/tmp/compat-out")
