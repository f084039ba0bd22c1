"""Delta Lake sink (delta-spark): every captured table is a Delta table, written by Spark.

Spark: a session of the sink's own, over the spark-submit driver's Spark (or a local one under
``tidegate run``), or, when the run is a Spark Connect client, on the run's Connect server. One code
path for both: DataFrame writes and Spark SQL (``MERGE INTO delta.`path```, ``CREATE TABLE``,
``ALTER TABLE``), no DeltaTable API (which needs a classic session or Delta Connect's server plugin).

Per sub-batch and table, one Delta commit (docs/operations.md, "Delta Lake sink"):

- ``mode: merge``: the table holds the source table's current rows. The sub-batch's changes of the
  table become a DataFrame (the envelopes parsed by Spark's ``from_json``), reduced by a window
  over the primary key to the last change per key in log order, and applied by one ``MERGE``:
  a delete deletes, a create, update or snapshot row upserts. An UPDATE that changes the primary
  key arrives as a delete of the old key and a create of the new one (two keys), so both land.
  A ``snapshot_started`` naming the table empties it in the same MERGE (``WHEN NOT MATCHED BY
  SOURCE THEN DELETE``): a (re)snapshot loads the table afresh.
- ``mode: changelog``: every envelope appended as a row (``idempotency_key``, ``op``, ``before``
  and ``after`` as typed structs, ``key``, ``tx_id``, ``total_order``, ``position``,
  ``source_ts_ms``, ``snapshot``), partitioned by ``date`` (the source commit's UTC date).

Exactly once (:mod:`.ledger`). Every commit carries Delta's idempotent-write identifiers:
``txnAppId`` = ``{tenant}/{pipeline}::sink::{sink_id}`` and ``txnVersion`` = the run's lease epoch
(high 32 bits) and the store version the delivery extends + 1: Delta skips a commit whose version
is not above the app's recorded one, so a retried sub-batch is written once. Its ``userMetadata``
records the source position the commit covers; at the first sub-batch that touches a table in a
run, the sink reads the table's newest such commit (``DESCRIBE HISTORY``) and writes the table only
the transactions after the later of that and the sink's record: a rerun after a crash between two
tables' commits (same store version, a longer range) writes each table exactly what it lacks, and a
replay or rewind writes nothing a table holds. After the tables, the sub-batch's record
(:class:`~tidegate.checkpoints.SinkCheckpoint`: position and version extended) is committed to the
sink's checkpoint table; that is the sink-side checkpoint, read back on open and adopted under the
rule of every other sink.

Fencing. On open a run claims the checkpoint table (a row carrying the last record forward, at its
epoch's lowest txnVersion); before a sub-batch's first commit and after its record the sink reads
that table's newest commit, and a newer epoch's fences it (a fatal error). Delta itself skips, with
the commit, every commit of an older epoch to a table a newer run has committed to. Left open: a
zombie resumed between that check and its commits can commit to a table the newer run has not
written (the newer run then writes that table only what follows).

Types. Columns are typed from the JSON values (integer → bigint, float → double, boolean, and
string for text, decimals, times, binary as base64, and arrays/objects as their JSON); a table
keeps the types it was created with, and a column added at the source is added to the table
(``ALTER TABLE ADD COLUMNS`` in merge mode, ``mergeSchema`` in changelog mode). A dropped column
stays, null in new rows.

Control messages: a ``gap`` or ``failover`` is recorded in the ``userMetadata`` of the sub-batch's
commits (every table's and the checkpoint table's); a ``schema_change`` evolves the schema with the
next row; a ``snapshot_started`` empties a merged table (above). Poison events: a value that does
not fit its column's type is written as null by ``from_json`` (never a failed commit), so this sink
has no event it refuses on its own; a commit Delta refuses fails the whole sub-batch.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections import defaultdict
from typing import Any

from ...batching import SubBatch
from ...checkpoints import SinkCheckpoint
from ...connections import Connection
from ...errors import ErrorClass, NonRetryableSinkError, SinkError
from ...positions import Position
from ...spec import PipelineSpec, render_template
from ..base import RetryPolicy, Sink, is_control
from . import jars, ledger
from .spec import DeltaSinkSpec

log = logging.getLogger(__name__)

_SESSION_LOCK = threading.Lock()
META_TYPES = ("gap", "failover", "schema_change", "snapshot_started", "snapshot_completed")
# What a read of a path that holds no Delta table fails with.
NO_TABLE = ("PATH_NOT_FOUND", "DELTA_TABLE_NOT_FOUND", "DELTA_MISSING_DELTA_TABLE")
CHANGELOG_COLUMNS = ("idempotency_key", "op", "before", "after", "key", "tx_id", "total_order", "position",
                     "source_ts_ms", "snapshot", "date")


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


def learn_types(types: dict[str, str | None], row: dict[str, Any] | None) -> None:
    """Extend ``types`` (column -> type, in order) with what ``row`` tells of columns not typed yet."""
    if not row:
        return
    for k, v in row.items():
        if types.get(k) is None:
            types[k] = json_type(v)


def struct_ddl(types: dict[str, str | None]) -> str:
    return ", ".join(f"`{c.replace('`', '``')}`: {t or 'string'}" for c, t in types.items())


def quote(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class DeltaSink(Sink):
    kind = "delta"
    label = "Delta"
    retry_policy = RetryPolicy(base_s=0.5, max_s=10.0, attempts=3)
    channel_separator = "."

    def __init__(self, pipeline: PipelineSpec, sink: DeltaSinkSpec, conn: Connection | None):
        super().__init__(sink_id=sink.id, pipeline=pipeline.pipeline, tenant=pipeline.tenant,
                         required=sink.required, conn=conn, spec=sink)
        self.spec = sink
        self.mode = sink.mode
        self.path_template = sink.table_path(pipeline.pipeline)
        self.checkpoint_path = sink.checkpoint_table_path(pipeline.pipeline)
        self.app_id = self.checkpoint_key  # {tenant}/{pipeline}::sink::{sink_id}
        self._spark: Any = None
        self._own: Any = None  # a Spark Connect session this sink opened
        self._remote: Any = None  # the run's Spark Connect session (use_run), None: classic Spark
        self._types: dict[str, dict[str, dict[str, str | None]]] = {}  # path -> {"row"/"key": types}
        # path -> the columns the table has (None: no table yet), read with its types and kept up to
        # date by this sink, the table's one writer: a MERGE then needs no second read of its log
        self._columns: dict[str, set[str] | None] = {}
        self._committed: SinkCheckpoint | None = None
        # path -> up to where the table holds this sink's changes (its commits' ``covers``), read
        # from its history at the first sub-batch that touches it in this run
        self._covers: dict[str, Position | None] = {}
        self._claimed = False  # the checkpoint table claimed for self.epoch (open)
        self._just_read = False

    @property
    def where(self) -> str:
        return f"Delta sink {self.sink_id!r} (pipeline {self.pipeline!r}, {self.mode} mode)"

    # ------------------------------------------------------------------ session

    def use_run(self, *, column_types: Any, spark: Any) -> None:
        """The run's Spark Connect session, when a Connect client delivers the run: this sink
        opens a session of its own beside it (:meth:`_session`)."""
        self._remote = spark

    def open(self) -> None:
        if self._spark is None:
            self._spark = self._session()
        if self.epoch is not None and not self._claimed:
            self._claimed = True
            try:
                self._claim()
            except Exception as exc:  # noqa: BLE001 - mapped to a SinkError without secrets
                self._claimed = False
                raise self.error(exc, "claiming the checkpoint table") from None

    def _session(self) -> Any:
        """A session of its own (its SQL settings, which carry the commits' txnAppId, are this
        sink's alone): when the run is a Spark Connect client, a new session on the run's server;
        else one over the process's Spark: the deliver job's, or a local one started with Delta's
        settings when none runs (``tidegate run``)."""
        remote = self._remote
        if remote is not None:
            spark = self._own = remote.sibling(f"tidegate-{self.pipeline}-{self.sink_id}")
            fix = ("start the Spark Connect server with the settings of tidegate.sinks.delta.jars."
                   "spark_conf() (static: they must be given when it starts; `scripts/services up "
                   "spark_connect` gives them when jars/delta holds the jars)")
        else:
            spark = self._classic_session().newSession()
            fix = ("the deliver task adds Delta's settings when the spec has a delta sink: start the job "
                   "through it, or give spark-submit the settings of tidegate.sinks.delta.jars.spark_conf()")
        ext = spark.conf.get("spark.sql.extensions", "") or ""
        if jars.EXTENSION not in ext:
            self.close()
            raise NonRetryableSinkError(
                f"{self.where}: the Spark session was started without Delta Lake "
                f"(spark.sql.extensions={ext!r}); {fix}")
        return spark

    def _classic_session(self) -> Any:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        with _SESSION_LOCK:
            if SparkContext._active_spark_context is None:
                b = SparkSession.builder.master("local[2]").appName(f"tidegate-{self.pipeline}")
                for k, v in jars.spark_conf().items():
                    b = b.config(k, v)
                return b.getOrCreate()
            return SparkSession.builder.getOrCreate()

    def close(self) -> None:
        if self._own is not None:  # a Connect session of this sink's: released on the server
            self._own.stop()
            self._own = None
        self._spark = None  # a classic session belongs to the job; it stops it

    # ------------------------------------------------------------------ paths and tables

    def target_of(self, table: Any) -> str:
        return self.table_path(table)

    def table_path(self, ev: Any) -> str:
        return render_template(self.path_template, pipeline=self.pipeline, db=ev.db, schema=ev.schema,
                               table=ev.table)

    def _schema(self, path: str) -> Any:
        """The schema of the Delta table at ``path``, None when there is none. Asked through a read,
        which works over Spark Connect (delta's DeltaTable API needs a classic session)."""
        from pyspark.errors import AnalysisException

        try:
            return self._spark.read.format("delta").load(path).schema
        except AnalysisException as exc:
            if exc.getCondition() in NO_TABLE:
                return None
            raise

    def _exists(self, path: str) -> bool:
        return self._schema(path) is not None

    def _known_types(self, path: str, key: dict[str, Any] | None) -> dict[str, dict[str, str | None]]:
        """The column types of the table at ``path``: the table's own when it exists."""
        t = self._types.get(path)
        if t is not None:
            return t
        t = {"row": {}, "key": {}}
        schema = self._schema(path)
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

    # ------------------------------------------------------------------ delivery

    def deliver(self, batch: SubBatch, extends: int | None = None) -> Position:
        self.open()
        try:
            self._deliver(batch, extends or 0)
        except Exception as exc:  # noqa: BLE001 - mapped to a SinkError without secrets
            # A commit refused because a newer run committed to the table meanwhile (Delta's
            # conflict on the app's transaction) is the fence, whatever Delta called it.
            newer = None if isinstance(exc, SinkError) else self._newer_epoch_or_none()
            if newer is not None:
                raise self.fenced_error(newer) from None
            raise self.error(exc, f"delivering sub-batch {batch.seq}") from None
        return batch.end_position

    def _deliver(self, batch: SubBatch, extends: int) -> None:
        done = self._committed_position()
        self._check_fence("before writing")
        txn = ledger.txn_version(self.epoch, extends)
        controls = [c.to_json() for c in batch.events if is_control(c) and c.type in META_TYPES]
        user_meta = ledger.commit_metadata(app=self.app_id, pipeline=self.pipeline, sink=self.sink_id,
                                           epoch=self.epoch, extends=extends, covers=batch.end_position,
                                           controls=controls)
        by_path, resets = self._parts(batch, done)
        for path, evs in by_path.items():
            first = evs[0][1]
            cut = max(resets.get(f"{first.db}.{first.table}", 0),
                      resets.get(f"{first.schema}.{first.table}", 0))
            if self.mode == "merge":
                self._merge(path, [(s, e) for s, e in evs if s > cut], txn, user_meta, reset=cut > 0)
            else:
                self._append(path, evs, txn, user_meta)
            self._covers[path] = batch.end_position
        for name in resets:  # a snapshot of a table with no row in this sub-batch
            path = self._path_of(name)
            if self.mode == "merge" and path not in by_path:
                self._merge(path, [], txn, user_meta, reset=True)
                self._covers[path] = batch.end_position
        # The record never moves back: after a rewind the tables still hold what they held.
        end = ledger.table_covers(batch.end_position, done)
        self._write_checkpoint(SinkCheckpoint(end, extends), txn, user_meta)
        self._check_fence("after writing")  # a skipped record: a newer run has the checkpoint table

    def _parts(self, batch: SubBatch, done: Position | None) -> tuple[dict[str, list[tuple[int, Any]]],
                                                                      dict[str, int]]:
        """Per table path, the ``(seq, event)`` pairs the table lacks: those of the transactions after
        what it holds (its own commits' ``covers``, or the sink's record if later); and per table
        name the seq of the last ``snapshot_started`` naming it that the table lacks. A replay or a
        rewind gets nothing the tables hold; a rerun after a crash between two tables' commits
        gets, per table, exactly the rest."""
        by_path: dict[str, list[tuple[int, Any]]] = defaultdict(list)
        resets: dict[str, int] = {}
        seq = 0
        for tx in batch.transactions:
            for ev in tx.events:
                seq += 1
                if not is_control(ev):
                    path = self.table_path(ev)
                    if ledger.needs(tx.end_position, tx.partial, self._holds(path, done)):
                        by_path[path].append((seq, ev))
                elif ev.type == "snapshot_started":
                    for name in ev.fields.get("tables") or []:
                        if ledger.needs(tx.end_position, tx.partial, self._holds(self._path_of(name), done)):
                            resets[name] = seq
        return by_path, resets

    def _path_of(self, name: str) -> str:
        # (the table's name gives its schema, not a PostgreSQL database: docs/operations.md)
        db, _, table = name.partition(".")
        return render_template(self.path_template, pipeline=self.pipeline, db=db, schema=db, table=table)

    def _holds(self, path: str, done: Position | None) -> Position | None:
        """Up to where the table at ``path`` holds this sink's changes: read from its history once
        per run (this run is its one writer afterwards), then kept by the commits made."""
        if path not in self._covers:
            self._covers[path] = ledger.covered_position(self._history(path), self.app_id)
        return ledger.table_covers(self._covers[path], done)

    def _history(self, path: str, limit: int | None = 50) -> list[str | None]:
        """The userMetadata of the table's newest commits, newest first ([] when there is no table).
        The newest ``limit`` first; the whole history only when none of them is this sink's."""
        from pyspark.errors import AnalysisException

        stmt = f"DESCRIBE HISTORY delta.{quote(path)}" + (f" LIMIT {limit}" if limit else "")
        try:
            rows = self._spark.sql(stmt).select("version", "userMetadata").collect()
        except AnalysisException:
            if not self._exists(path):  # no table (yet): no history
                return []
            raise
        metas = [r["userMetadata"] for r in sorted(rows, key=lambda r: -r["version"])]
        if limit and len(rows) >= limit and all(ledger.parse_metadata(m, self.app_id) is None for m in metas):
            return self._history(path, None)
        return metas

    # ------------------------------------------------------------------ fencing

    def _claim(self) -> None:
        """Claim the checkpoint table for this run's lease epoch: a row carrying the last record
        forward (or none), committed with the epoch's lowest txnVersion. From then on Delta skips
        every commit of an older epoch to it; a newer epoch's claim found here fences this run."""
        import pyarrow as pa

        rec = self.committed_checkpoint()
        self._just_read = True  # the coordinator's committed_checkpoint() right after open: this one
        meta = ledger.commit_metadata(app=self.app_id, pipeline=self.pipeline, sink=self.sink_id,
                                      epoch=self.epoch, extends=-1, covers=None, claim=True)
        extends = rec.extends if rec is not None and rec.extends is not None else -1
        t = pa.table({"record": pa.array([rec.dumps() if rec else None], pa.string()),
                      "extends": pa.array([extends], pa.int64())})
        (self._spark.createDataFrame(t).write.format("delta").mode("append")
         .option("txnAppId", self.app_id).option("txnVersion", ledger.txn_version(self.epoch, -1))
         .option("userMetadata", meta).save(self.checkpoint_path))
        self._check_fence("claiming the checkpoint table")

    def _newer_epoch(self) -> int | None:
        """The lease epoch of a newer run that has committed to the checkpoint table, or None."""
        if self.epoch is None:
            return None
        txn = ledger.newest_txn(self._history(self.checkpoint_path, 5), self.app_id)
        newer = ledger.txn_epoch(txn) if txn is not None else None
        return newer if newer is not None and newer > self.epoch else None

    def _newer_epoch_or_none(self) -> int | None:
        try:
            return self._newer_epoch()
        except Exception:  # noqa: BLE001 - the delivery's own error is the one to report
            return None

    def _check_fence(self, when: str) -> None:
        """Raise the fenced error when a newer run has claimed the sink. Checked before a sub-batch's
        first commit (a check, then commits: a newer run claiming in between is refused by Delta only
        on the tables it has committed to) and after its record (which Delta skipped if so)."""
        newer = self._newer_epoch()
        if newer is not None:
            log.warning("%s: a newer run (lease epoch %d) has claimed the sink (%s)", self.where, newer, when)
            raise self.fenced_error(newer)

    def _frame(self, path: str, evs: list[tuple[int, Any]]) -> tuple[Any, dict[str, dict[str, str | None]]]:
        """The events as a DataFrame parsed by Spark: ``seq`` and the envelope ``e`` (typed)."""
        import pyarrow as pa
        from pyspark.sql import functions as F

        types = self._known_types(path, evs[0][1].key)
        row_t, key_t = types["row"], types["key"]
        for _, ev in evs:
            learn_types(row_t, ev.after)
            learn_types(row_t, ev.before)
            learn_types(key_t, ev.key)
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
        df = self._spark.createDataFrame(table).select(
            "seq", F.from_json("value", envelope, opts).alias("e"), F.col("value").alias("raw"))
        return df, types

    def _append(self, path: str, evs: list[tuple[int, Any]], txn: int, user_meta: str) -> None:
        from pyspark.sql import functions as F

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

    def _merge(self, path: str, evs: list[tuple[int, Any]], txn: int, user_meta: str, *,
               reset: bool) -> None:
        """One ``MERGE`` (Spark SQL, so the same over Spark Connect) of the last change per key."""
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        table = f"delta.{quote(path)}"
        if not evs:  # only a snapshot's start: empty the table (none yet: nothing to empty)
            if self._exists(path):
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
            self._spark.catalog.dropTempView(view)

    def _commit(self, txn: int, user_meta: str, stmt: str) -> None:
        """Run the DML ``stmt`` with the commit's identifiers in the session's settings (the
        session is this sink's alone), which Delta reads for SQL commands."""
        self._set_txn(txn, user_meta)
        try:
            self._spark.sql(stmt)
        finally:
            self._clear_txn()

    def _create_or_evolve(self, path: str, row_t: dict[str, str | None]) -> None:
        """Create the merged table, or add the columns the source gained (before the MERGE, which
        then writes them). The table's columns are those :meth:`_known_types` read."""
        have = self._columns.get(path)
        if have is None:
            self._spark.sql(f"CREATE TABLE IF NOT EXISTS delta.{quote(path)} ("
                            + ", ".join(f"{quote(c)} {t or 'string'}" for c, t in row_t.items())
                            + ") USING delta")
            self._columns[path] = set(row_t)
            return
        new = [c for c in row_t if c not in have]
        if new:
            self._spark.sql(f"ALTER TABLE delta.{quote(path)} ADD COLUMNS ("
                            + ", ".join(f"{quote(c)} {row_t[c] or 'string'}" for c in new) + ")")
            have.update(new)

    def _set_txn(self, txn: int, user_meta: str) -> None:
        c = self._spark.conf
        c.set("spark.databricks.delta.write.txnAppId", self.app_id)
        c.set("spark.databricks.delta.write.txnVersion", str(txn))
        c.set("spark.databricks.delta.commitInfo.userMetadata", user_meta)

    def _clear_txn(self) -> None:
        for k in ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion",
                  "spark.databricks.delta.commitInfo.userMetadata"):
            self._spark.conf.unset(k)

    # ------------------------------------------------------------------ sink-side checkpoint

    def _write_checkpoint(self, record: SinkCheckpoint, txn: int, user_meta: str) -> None:
        import pyarrow as pa

        t = pa.table({"record": [record.dumps()], "extends": pa.array([record.extends], pa.int64())})
        (self._spark.createDataFrame(t).write.format("delta").mode("append")
         .option("txnAppId", self.app_id).option("txnVersion", txn)
         .option("userMetadata", user_meta).save(self.checkpoint_path))
        self._committed = record

    def committed_checkpoint(self) -> SinkCheckpoint | None:
        """The record of the last sub-batch committed to the checkpoint table (the row written in
        the commit that carries the highest txnVersion of this app), or None."""
        self.open()
        if self._just_read:  # read by the claim in open(), just now; nothing else writes it
            self._just_read = False
            return self._committed
        try:
            from pyspark.sql import functions as F

            if not self._exists(self.checkpoint_path):
                return None
            row = (self._spark.read.format("delta").load(self.checkpoint_path)
                   .where("record IS NOT NULL").orderBy(F.col("extends").desc()).select("record").first())
        except Exception as exc:  # noqa: BLE001
            raise self.error(exc, "reading the checkpoint table") from None
        self._committed = SinkCheckpoint.loads(row["record"]) if row else None
        return self._committed

    def _committed_position(self) -> Position | None:
        if self._committed is None:
            self.committed_checkpoint()
        return self._committed.position if self._committed is not None else None

    def classify_client_error(self, exc: BaseException) -> ErrorClass:
        name = type(exc).__name__
        text = str(exc)
        if "ConcurrentAppend" in text or "ConcurrentModification" in text or isinstance(
                exc, (ConnectionError, TimeoutError)):
            return ErrorClass.RETRYABLE
        if name in ("AnalysisException", "ParseException") or "DELTA_" in text:
            return ErrorClass.NON_RETRYABLE
        return ErrorClass.RETRYABLE if "IOException" in text else ErrorClass.NON_RETRYABLE


__all__ = ["DeltaSink", "json_type", "learn_types"]
