"""The Delta tables a Delta sink writes, through its Spark session: their schemas and column
types (from the JSON values: the sink module's docstring, "Types"), their histories, and the
commits: an append (changelog mode) or one ``MERGE`` (merge mode) per table and sub-batch, each
with Delta's idempotent-write identifiers."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import pyarrow as pa
from pyspark.errors import AnalysisException
from pyspark.sql import Window
from pyspark.sql import functions as F

from ...errors import NonRetryableSinkError
from . import ledger

log = logging.getLogger(__name__)

# What a read of a path that holds no Delta table fails with.
NO_TABLE = ("PATH_NOT_FOUND", "DELTA_TABLE_NOT_FOUND", "DELTA_MISSING_DELTA_TABLE")
_TXN_SETTINGS = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion",
                 "spark.databricks.delta.commitInfo.userMetadata")


def json_type(v: Any) -> str | None:
    """The Spark SQL type of a column from one of its JSON values (None: no type yet)."""
    if v is None:
        return None
    if v is True or v is False:
        return "boolean"
    if isinstance(v, int):
        return "bigint" if -(2**63) <= v < 2**63 else "decimal(38,0)"
    if isinstance(v, float):
        return "double"
    return "string"  # text, decimals, times, base64; arrays and objects as their JSON


WIDE_INTEGER = "decimal(38,0)"
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1
# A string Spark's JSON parser reads into a double column (the envelope's non-finite doubles).
_DOUBLE_WORDS = frozenset(("NaN", "Infinity", "-Infinity"))


def fits(t: str, v: Any) -> bool:
    """Whether Spark's ``from_json`` reads the JSON value ``v`` into a column of type ``t`` (not
    null). Types this sink never makes (a table created by hand) are not judged."""
    if v is None or t == "string":
        return True
    if t == "bigint":
        return v.__class__ is int and _LONG_MIN <= v <= _LONG_MAX
    if t == "double":
        return (v.__class__ in (int, float)) or v in _DOUBLE_WORDS
    if t == "boolean":
        return v is True or v is False
    if t == WIDE_INTEGER:
        return v.__class__ is int and abs(v) < 10**38
    return True


def learn_types(types: dict[str, str | None], row: dict[str, Any] | None, widen: set[str] | None = None,
                where: str = "") -> None:
    """Extend ``types`` (column -> type, in order) with what ``row`` tells of columns not typed yet,
    and check that the others take the row's values: Spark's JSON parser writes a value that does
    not fit its column's type as null, which would lose it. An integer past a ``bigint`` column's
    range widens it to ``decimal(38,0)`` (added to ``widen``, when given: the table's column must
    be altered); any other misfit is an error that names the column (``where``: the table)."""
    if not row:
        return
    for k, v in row.items():
        t = types.get(k)
        if t is None:
            types[k] = json_type(v)
        elif v is None or t == "string" or (v.__class__ is int and t == "bigint"
                                            and _LONG_MIN <= v <= _LONG_MAX):
            continue  # the common cases without a call: this runs for every value of every row
        elif not fits(t, v):
            if t == "bigint" and fits(WIDE_INTEGER, v):
                types[k] = WIDE_INTEGER
                if widen is not None:
                    widen.add(k)
                continue
            raise NonRetryableSinkError(
                f"{where}column {k!r} is {t} and a change holds {type(v).__name__} {str(v)[:40]!r}, which "
                f"Spark would write as null. The column's type changed at the source, or its first "
                f"value typed it ({t}); change the Delta column's type (ALTER TABLE ... ALTER COLUMN, "
                f"with delta.enableTypeWidening, or a new table) and run again: nothing was written")


def struct_ddl(types: dict[str, str | None]) -> str:
    return ", ".join(f"`{c.replace('`', '``')}`: {t or 'string'}" for c, t in types.items())


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class Tables:
    """``spark``: the sink's own session (set when it opens); ``app_id``: the commits' txnAppId;
    ``where``: how errors name the sink."""

    def __init__(self, mode: str, app_id: str, where: str):
        self.mode = mode
        self.app_id = app_id
        self.where = where
        self.spark: Any = None
        self._types: dict[str, dict[str, dict[str, str | None]]] = {}  # path -> {"row"/"key": types}
        # path -> the columns the table has (None: no table yet), read with its types and kept up to
        # date by this sink, the table's one writer: a MERGE then needs no second read of its log
        self._columns: dict[str, set[str] | None] = {}

    def schema(self, path: str) -> Any:
        """The schema of the Delta table at ``path``, None when there is none. Asked through a read,
        which works over Spark Connect (delta's DeltaTable API needs a classic session)."""
        try:
            return self.spark.read.format("delta").load(path).schema
        except AnalysisException as exc:
            if exc.getCondition() in NO_TABLE:
                return None
            raise

    def exists(self, path: str) -> bool:
        return self.schema(path) is not None

    def history(self, path: str, limit: int | None = 50) -> list[str | None]:
        """The userMetadata of the commits the table's current state descends from, newest first
        ([] when there is no table): :meth:`lineage`'s first part."""
        return [c.meta for c in self.lineage(path, limit)[0]]

    def lineage(self, path: str, limit: int | None = 50) -> tuple[list[ledger.Commit], list[ledger.Commit]]:
        """The table's commits, newest first, split as :func:`ledger.lineage` does: those its
        current state descends from, and those a RESTORE undid. The newest ``limit``, or the whole
        history when they do not tell (:func:`ledger.read_lineage`)."""
        return ledger.read_lineage(lambda n: self._history_rows(path, n), self.app_id, limit)

    def _history_rows(self, path: str, limit: int | None) -> list[Any] | None:
        """The newest ``limit`` rows of the table's history (None: all of them); None: no table."""
        stmt = f"DESCRIBE HISTORY delta.{quote(path)}" + (f" LIMIT {limit}" if limit else "")
        try:
            return self.spark.sql(stmt).select("version", "timestamp", "operation", "operationParameters",
                                               "userMetadata").collect()
        except AnalysisException:
            if not self.exists(path):  # no table (yet): no history
                return None
            raise

    def _known_types(self, path: str, key: dict[str, Any] | None) -> dict[str, dict[str, str | None]]:
        """The column types of the table at ``path``: the table's own when it exists."""
        t = self._types.get(path)
        if t is not None:
            return t
        t = {"row": {}, "key": {}}
        schema = self.schema(path)
        self._columns[path] = set(schema.names) if schema is not None else None
        if schema is not None:
            if self.mode == "merge":
                t["row"] = {f.name: f.dataType.simpleString() for f in schema.fields}
            else:
                for part in ("after", "before"):
                    if part in schema.names:
                        for f in schema[part].dataType.fields:
                            t["row"].setdefault(f.name, f.dataType.simpleString())
        for k in key or {}:
            t["key"][k] = t["row"].get(k)
        self._types[path] = t
        return t

    def _frame(self, path: str, evs: list[tuple[int, Any]]) -> tuple[Any, dict[str, dict[str, str | None]]]:
        """The events as a DataFrame parsed by Spark: ``seq`` and the envelope ``e`` (typed)."""
        types = self._known_types(path, evs[0][1].key)
        row_t, key_t = types["row"], types["key"]
        widen: set[str] = set()
        where = f"{self.where}: Delta table {path}: "
        for _, ev in evs:
            learn_types(row_t, ev.after, widen, where)
            learn_types(row_t, ev.before, widen, where)
            learn_types(key_t, ev.key, None, where)
        self._widen(path, widen)
        for k in key_t:
            if key_t[k] is None or row_t.get(k) is not None:
                key_t[k] = row_t.get(k) or key_t[k]
        table = pa.table({"seq": pa.array([s for s, _ in evs], pa.int64()),
                          "value": pa.array([bytes(ev.value).decode("utf-8") for _, ev in evs], pa.string())})
        envelope = (f"idempotency_key string, op string, before struct<{struct_ddl(row_t)}>, "
                    f"after struct<{struct_ddl(row_t)}>, key struct<{struct_ddl(key_t)}>, "
                    f"source struct<tx_id: string, position: string, ts_ms: bigint, snapshot: string>, "
                    f"transaction struct<total_order: bigint>")
        opts = {"allowNonNumericNumbers": "true"}
        df = self.spark.createDataFrame(table).select(
            "seq", F.from_json("value", envelope, opts).alias("e"), F.col("value").alias("raw"))
        return df, types

    def append(self, path: str, evs: list[tuple[int, Any]], txn: int, user_meta: str) -> None:
        """Every envelope as a row of the changelog table (partitioned by the commit's date)."""
        df, _ = self._frame(path, evs)
        key_json = F.get_json_object("raw", "$.key")
        out = df.select(
            F.col("e.idempotency_key").alias("idempotency_key"), F.col("e.op").alias("op"),
            F.col("e.before").alias("before"), F.col("e.after").alias("after"), key_json.alias("key"),
            F.col("e.source.tx_id").alias("tx_id"), F.col("e.transaction.total_order").alias("total_order"),
            F.col("e.source.position").alias("position"), F.col("e.source.ts_ms").alias("source_ts_ms"),
            F.col("e.source.snapshot").alias("snapshot"),
            F.to_date(F.timestamp_millis(F.col("e.source.ts_ms"))).alias("date"))
        (out.write.format("delta").mode("append").partitionBy("date")
         .option("txnAppId", self.app_id).option("txnVersion", txn)
         .option("mergeSchema", "true").option("userMetadata", user_meta).save(path))

    def merge(self, path: str, evs: list[tuple[int, Any]], txn: int, user_meta: str, *, reset: bool) -> None:
        """One ``MERGE`` (Spark SQL, so the same over Spark Connect) of the last change per key;
        ``reset``: rows the changes do not name are deleted (a snapshot starts the table afresh)."""
        table = f"delta.{quote(path)}"
        if not evs:  # only a snapshot's start: empty the table (none yet: nothing to empty)
            if self.exists(path):
                self._commit(txn, user_meta, f"DELETE FROM {table}")
            return
        df, types = self._frame(path, evs)
        row_t, key_t = types["row"], types["key"]
        self._create_or_evolve(path, row_t)
        keys = list(key_t)
        if not keys:
            raise NonRetryableSinkError(f"{self.where}: the events of {path} carry no primary key; "
                                        f"mode: merge needs one (use mode: changelog)")
        latest = Window.partitionBy(*[F.col("e.key")[k] for k in keys]).orderBy(F.col("seq").desc())
        # Deletes carry the old row in before; everything else the new row in after.
        row = F.when(F.col("e.op") == "d", F.col("e.before")).otherwise(F.col("e.after"))
        src = (df.withColumn("_rn", F.row_number().over(latest)).where("_rn = 1")
               .select(F.col("e.op").alias("_tg_op"),
                       *[F.col("e.key")[k].alias(f"_tg_k{i}") for i, k in enumerate(keys)],
                       *[row[c].alias(c) for c in row_t]))
        view = f"_tg_src_{uuid.uuid4().hex[:12]}"  # the session is this sink's: no other sees it
        src.createOrReplaceTempView(view)
        on = " AND ".join(f"t.{quote(k)} = s._tg_k{i}" for i, k in enumerate(keys))
        cols = [quote(c) for c in row_t]
        stmt = (f"MERGE INTO {table} AS t USING {view} AS s ON {on} "
                f"WHEN MATCHED AND s._tg_op = 'd' THEN DELETE "
                f"WHEN MATCHED THEN UPDATE SET {', '.join(f'{c} = s.{c}' for c in cols)} "
                f"WHEN NOT MATCHED AND s._tg_op <> 'd' THEN INSERT ({', '.join(cols)}) "
                f"VALUES ({', '.join(f's.{c}' for c in cols)})"
                + (" WHEN NOT MATCHED BY SOURCE THEN DELETE" if reset else ""))
        try:
            self._commit(txn, user_meta, stmt)
        finally:
            self.spark.catalog.dropTempView(view)

    def _commit(self, txn: int, user_meta: str, stmt: str) -> None:
        """Run the DML ``stmt`` with the commit's identifiers in the session's settings (the
        session is this sink's alone), which Delta reads for SQL commands."""
        c = self.spark.conf
        for key, value in zip(_TXN_SETTINGS, (self.app_id, str(txn), user_meta), strict=True):
            c.set(key, value)
        try:
            self.spark.sql(stmt)
        finally:
            for key in _TXN_SETTINGS:
                c.unset(key)

    def _widen(self, path: str, columns: set[str]) -> None:
        """Widen the table's ``bigint`` columns in ``columns`` to ``decimal(38,0)`` (Delta's type
        widening, enabled on the table first), which keeps their values: a MariaDB BIGINT UNSIGNED
        first seen below 2^63 and later above it. Columns the table does not have yet are created
        with the wider type. Idempotent: a retried sub-batch finds them wide."""
        # read (rarely needed), not the column cache, which a changelog table does not keep
        schema = self.schema(path) if columns else None
        if schema is None:
            return
        if self.mode == "merge":
            have = {(quote(f.name), f.dataType.simpleString()) for f in schema.fields}
        else:  # the changelog's row images are structs
            have = {(f"{part}.{quote(f.name)}", f.dataType.simpleString()) for part in ("before", "after")
                    if part in schema.names for f in schema[part].dataType.fields}
        wanted = {quote(c) for c in columns}
        fields = sorted(f for f, t in have if t == "bigint" and f.rsplit(".", 1)[-1] in wanted)
        if not fields:
            return
        table = f"delta.{quote(path)}"
        self.spark.sql(f"ALTER TABLE {table} SET TBLPROPERTIES ('delta.enableTypeWidening' = 'true')")
        for f in fields:
            self.spark.sql(f"ALTER TABLE {table} ALTER COLUMN {f} TYPE {WIDE_INTEGER}")
        log.warning("%s: Delta table %s: widened %s to %s (a value past bigint's range)", self.where, path,
                    ", ".join(fields), WIDE_INTEGER)

    def _create_or_evolve(self, path: str, row_t: dict[str, str | None]) -> None:
        """Create the merged table, or add the columns the source gained (before the MERGE, which
        then writes them). The table's columns are those :meth:`_known_types` read."""
        have = self._columns.get(path)
        if have is None:
            self.spark.sql(f"CREATE TABLE IF NOT EXISTS delta.{quote(path)} ("
                           + ", ".join(f"{quote(c)} {t or 'string'}" for c, t in row_t.items())
                           + ") USING delta")
            self._columns[path] = set(row_t)
            return
        new = [c for c in row_t if c not in have]
        if new:
            self.spark.sql(f"ALTER TABLE delta.{quote(path)} ADD COLUMNS ("
                           + ", ".join(f"{quote(c)} {row_t[c] or 'string'}" for c in new) + ")")
            have.update(new)

    def write_rows(self, path: str, table: Any, txn: int, user_meta: str) -> None:
        """Append an Arrow table's rows (the checkpoint table's records) in one commit."""
        (self.spark.createDataFrame(table).write.format("delta").mode("append")
         .option("txnAppId", self.app_id).option("txnVersion", txn)
         .option("userMetadata", user_meta).save(path))


__all__ = ["NO_TABLE", "Tables", "json_type", "learn_types", "quote", "struct_ddl"]
