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
replay or rewind writes nothing a table holds. A snapshot's chunks are judged instead by the
snapshot marks of the table's commits (ledger.needs_chunk): a resnapshot hands off at the
checkpoint, before what the tables cover, and must still be written. A table a ``RESTORE
TABLE`` took back behind the sink's commits (ledger.restore_loss) fails the sub-batch naming the
rewinds to choose from, unless this run's range starts at or before what it still holds (it is
then written all it lacks) or an operator chose to go on without the changes (docs/architecture.md,
"A Delta table restored behind the sink"). After the tables, the
sub-batch's record (:class:`~tidegate.sink_checkpoints.SinkCheckpoint`: position and version
extended) is committed to the sink's checkpoint table; that is the sink-side checkpoint, read
back on open and adopted under the rule of every other sink.

Fencing. On open a run claims the checkpoint table (a row carrying the last record forward, at its
epoch's lowest txnVersion); before a sub-batch's first commit and after its record the sink reads
that table's newest commit, and a newer epoch's fences it (a fatal error). Delta itself skips, with
the commit, every commit of an older epoch to a table a newer run has committed to. Left open: a
zombie resumed between that check and its commits can commit to a table the newer run has not
written (the newer run then writes that table only what follows).

Types. Columns are typed from the JSON values (integer → bigint, float → double, boolean, and
string for text, decimals, times, binary as base64, and arrays/objects as their JSON); a table
keeps the types it was created with (a ``bigint`` column widens to ``decimal(38,0)`` for an
integer past its range; any other value that does not fit fails the sub-batch:
tables.learn_types), and a column added at the source is added to the table
(``ALTER TABLE ADD COLUMNS`` in merge mode, ``mergeSchema`` in changelog mode). A dropped column
stays, null in new rows.

Control messages: a ``gap`` or ``failover`` is recorded in the ``userMetadata`` of the sub-batch's
commits (every table's and the checkpoint table's); a ``schema_change`` evolves the schema with the
next row; a ``snapshot_started`` empties a merged table (above). Poison events: none of its own (a
value that does not fit its column's type fails the sub-batch before any commit, which
``from_json`` would write as null); a commit Delta refuses fails the whole sub-batch.

The sink's parts: ``session.py`` (its Spark session), ``tables.py`` (the tables: types, history,
appends and MERGEs), ``ledger.py`` (the commits' identifiers and what a table holds), ``jars.py``
(Delta's Spark settings).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from typing import Any

import pyarrow as pa
from pyspark.sql import functions as F

from ...batching import SubBatch
from ...connections import Connection
from ...errors import ErrorClass, OperatorSinkError, SinkError
from ...positions import Position, SnapshotPosition
from ...sink_checkpoints import SinkCheckpoint, rewind_command
from ...spec import PipelineSpec, render_template
from ..base import RetryPolicy, Sink, is_control
from . import ledger, session
from .spec import DeltaSinkSpec
from .tables import Tables, json_type, learn_types

log = logging.getLogger(__name__)

META_TYPES = ("gap", "failover", "schema_change", "snapshot_started", "snapshot_completed")
CHANGELOG_COLUMNS = ("idempotency_key", "op", "before", "after", "key", "tx_id", "total_order", "position",
                     "source_ts_ms", "snapshot", "date")


class DeltaSink(Sink):
    kind = "delta"
    label = "Delta"
    reads_run_start = True  # a table restored behind the sink is told with the rewinds to run
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
        self.tables = Tables(self.mode, self.app_id, self.where)
        self._own: Any = None  # a Spark Connect session this sink opened
        self._remote: Any = None  # the run's Spark Connect session (use_run), None: classic Spark
        self._committed: SinkCheckpoint | None = None
        # path -> up to where the table holds this sink's changes (its commits' ``covers``), read
        # from its history at the first sub-batch that touches it in this run
        self._covers: dict[str, Position | None] = {}
        # path -> the (snapshot id, chunk) the table holds (ledger.held_snapshot), read from its
        # whole history at the first snapshot transaction for it in this run
        self._snapshots: dict[str, tuple[str, int] | None] = {}
        # path -> the ranges a table a RESTORE took back holds past what it holds without a break
        # (ledger.Loss.written), when this run writes it all it lacks: what it holds is its own
        # alone, not raised to the sink's record (_holds)
        self._restored: dict[str, tuple[tuple[Position, Position], ...]] = {}
        # path -> the ``since`` of this run's commits to a table a RESTORE took back whose loss an
        # operator chose to go on without (delivers_again)
        self._since: dict[str, Position | None] = {}
        # path -> this run's commits to the table since its lineage was read (told_if_restored)
        self._unchecked: dict[str, int] = {}
        self._claimed = False  # the checkpoint table claimed for self.epoch (open)
        self._just_read = False

    def whereabouts(self) -> str:
        return f"{self.mode} mode"

    # ------------------------------------------------------------------ session

    def use_run(self, *, column_types: Any, spark: Any) -> None:
        """The run's Spark Connect session, when a Connect client delivers the run: this sink
        opens a session of its own beside it (session.py)."""
        self._remote = spark

    def open(self) -> None:
        if self.tables.spark is None:
            self.tables.spark, self._own = session.open_session(
                self._remote, f"tidegate-{self.pipeline}-{self.sink_id}", f"tidegate-{self.pipeline}",
                self.where)
        if self.epoch is not None and not self._claimed:
            self._claimed = True
            try:
                self._claim()
            except Exception as exc:  # noqa: BLE001 - mapped to a SinkError without secrets
                self._claimed = False
                raise self.error(exc, "claiming the checkpoint table") from None

    def close(self) -> None:
        if self._own is not None:  # a Connect session of this sink's: released on the server
            self._own.stop()
            self._own = None
        self.tables.spark = None  # a classic session belongs to the job; it stops it

    def target_of(self, table: Any) -> str:
        return self.table_path(table)

    def table_path(self, ev: Any) -> str:
        return render_template(self.path_template, pipeline=self.pipeline, db=ev.db, schema=ev.schema,
                               table=ev.table)

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
        chunk = last_chunk(batch)

        def user_meta(**since: Any) -> str:  # a table's commit says since (ledger.commit_metadata)
            return ledger.commit_metadata(app=self.app_id, pipeline=self.pipeline, sink=self.sink_id,
                                          epoch=self.epoch, extends=extends, covers=batch.end_position,
                                          controls=controls, snapshot=chunk, **since)

        by_path, resets = self._parts(batch, done)
        for path, evs in by_path.items():
            first = evs[0][1]
            cut = max(resets.get(f"{first.db}.{first.table}", 0),
                      resets.get(f"{first.schema}.{first.table}", 0))
            meta = user_meta(since=self._since.get(path, self._holds(path, done)))
            if self.mode == "merge":
                self.tables.merge(path, [(s, e) for s, e in evs if s > cut], txn, meta, reset=cut > 0)
            else:
                self.tables.append(path, evs, txn, meta)
            self._committed_to(path, batch.end_position, chunk)
        for name in resets:  # a snapshot of a table with no row in this sub-batch
            path = self._path_of(name)
            if self.mode == "merge" and path not in by_path:
                meta = user_meta(since=self._since.get(path, self._holds(path, done)))
                self.tables.merge(path, [], txn, meta, reset=True)
                self._committed_to(path, batch.end_position, chunk)
        # The record never moves back (after a rewind the tables still hold what they held), but
        # into a snapshot the sink had not entered (ledger.record_after).
        end = ledger.record_after(batch.end_position, done, self._entered)
        self._write_checkpoint(SinkCheckpoint(end, extends), txn, user_meta())
        if chunk is not None:
            self._snapshots[self.checkpoint_path] = (chunk.snapshot_id, chunk.chunk)
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
                    if self._needs(path, tx, done):
                        by_path[path].append((seq, ev))
                elif ev.type == "snapshot_started":
                    for name in ev.fields.get("tables") or []:
                        if self._needs(self._path_of(name), tx, done):
                            resets[name] = seq
        return by_path, resets

    def _needs(self, path: str, tx: Any, done: Position | None) -> bool:
        """Whether the table at ``path`` lacks transaction ``tx``: a snapshot's by the snapshot
        marks of its commits, the log's by what its commits cover (ledger.py)."""
        if isinstance(tx.end_position, SnapshotPosition):
            return ledger.needs_chunk(tx.end_position, tx.partial, self._held(path), self._holds(path, done))
        return (ledger.needs(tx.end_position, tx.partial, self._holds(path, done))
                and not ledger.held_in(tx.end_position, tx.partial, self._restored.get(path, ())))

    def _held(self, path: str) -> tuple[str, int] | None:
        """The snapshot the table at ``path`` holds, and to which chunk: read from its whole
        history once per run (at its first snapshot transaction), then kept by the commits made."""
        if path not in self._snapshots:
            self._snapshots[path] = ledger.held_snapshot(self.tables.history(path, None), self.app_id)
        return self._snapshots[path]

    def _entered(self, snapshot_id: str) -> bool:
        """Whether this sink's commits hold chunks of the snapshot ``snapshot_id`` or of a newer
        one: its checkpoint table takes every commit's snapshot mark, whichever tables it wrote."""
        held = self._held(self.checkpoint_path)
        return held is not None and held[0] >= snapshot_id

    def _committed_to(self, path: str, end: Position, chunk: SnapshotPosition | None) -> None:
        """What the table holds after this run's commit to it (no need to read its history again)."""
        self._covers[path] = end
        self._unchecked[path] = self._unchecked.get(path, 0) + 1
        if chunk is not None:
            self._snapshots[path] = (chunk.snapshot_id, chunk.chunk)

    def _path_of(self, name: str) -> str:
        # (the table's name gives its schema, not a PostgreSQL database: docs/operations.md)
        db, _, table = name.partition(".")
        return render_template(self.path_template, pipeline=self.pipeline, db=db, schema=db, table=table)

    def _holds(self, path: str, done: Position | None) -> Position | None:
        """Up to where the table at ``path`` holds this sink's changes: read from its lineage once
        per run (this run is its one writer afterwards), then kept by the commits made; raised to
        the sink's record, which every table of a sub-batch took, but for a table a RESTORE took
        back that this run writes all it lacks (:func:`delivers_again`)."""
        if self._unchecked.get(path, 0) >= ledger.RECHECK_COMMITS:
            self._unchecked[path] = 0
            if path not in self._restored and path not in self._since:  # it knows of a RESTORE
                told_if_restored(self, path)
        if path not in self._covers:
            kept, undone = self.tables.lineage(path)
            self._covers[path] = ledger.covered_position([c.meta for c in kept], self.app_id)
            loss = ledger.restore_loss(kept, undone, self.app_id)
            if loss is not None and delivers_again(self, path, loss):
                self._covers[path] = loss.held
                # A merged table is written again what commits after the RESTORE hold too: they
                # were MERGEd over the restored rows, before the changes the RESTORE took back,
                # which would otherwise land last (a row the source deleted there came back:
                # campaign seed 9805). A changelog skips them: each change once.
                self._restored[path] = loss.written if self.mode == "changelog" else ()
            elif loss is not None:  # gone on without them: its commits say so (since)
                self._since[path] = loss.held
        if path in self._restored:
            return self._covers[path]
        return ledger.table_covers(self._covers[path], done)

    # ------------------------------------------------------------------ fencing

    def _claim(self) -> None:
        """Claim the checkpoint table for this run's lease epoch: a row carrying the last record
        forward (or none), committed with the epoch's lowest txnVersion. From then on Delta skips
        every commit of an older epoch to it; a newer epoch's claim found here fences this run."""
        rec = self.committed_checkpoint()
        self._just_read = True  # the coordinator's committed_checkpoint() right after open: this one
        meta = ledger.commit_metadata(app=self.app_id, pipeline=self.pipeline, sink=self.sink_id,
                                      epoch=self.epoch, extends=-1, covers=None, claim=True)
        extends = rec.extends if rec is not None and rec.extends is not None else -1
        self._write_record(rec, extends, ledger.txn_version(self.epoch, -1), meta)
        self._check_fence("claiming the checkpoint table")

    def _newer_epoch(self) -> int | None:
        """The lease epoch of a newer run that has committed to the checkpoint table, or None."""
        if self.epoch is None:
            return None
        txn = ledger.newest_txn(self.tables.history(self.checkpoint_path, 5), self.app_id)
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

    # ------------------------------------------------------------------ sink-side checkpoint

    def _write_record(self, record: SinkCheckpoint | None, extends: int | None, txn: int,
                      user_meta: str) -> None:
        """One row of the checkpoint table (the record, or None for a claim with none to carry)."""
        t = pa.table({"record": pa.array([record.dumps() if record else None], pa.string()),
                      "extends": pa.array([extends], pa.int64())})
        self.tables.write_rows(self.checkpoint_path, t, txn, user_meta)

    def _write_checkpoint(self, record: SinkCheckpoint, txn: int, user_meta: str) -> None:
        self._write_record(record, record.extends, txn, user_meta)
        self._committed = record

    def committed_checkpoint(self) -> SinkCheckpoint | None:
        """The record of the last sub-batch committed to the checkpoint table (the row written in
        the commit that carries the highest txnVersion of this app), or None."""
        self.open()
        if self._just_read:  # read by the claim in open(), just now; nothing else writes it
            self._just_read = False
            return self._committed
        try:
            if not self.tables.exists(self.checkpoint_path):
                return None
            row = (self.tables.spark.read.format("delta").load(self.checkpoint_path)
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


def delivers_again(sink: DeltaSink, path: str, loss: ledger.Loss) -> bool:
    """Whether this run writes the table at ``path``, which a RESTORE took back from holding the
    sink's changes up to ``loss.lost`` to ``loss.held``, all it lacks: when its range starts at or
    before ``held`` (an operator rewound the sink). False when an operator chose to go on without
    them (the table gets what follows the sink's record). Otherwise the sink fails with an
    :class:`OperatorSinkError` naming the two rewinds, and nothing is written."""
    start, held = sink.run_start, loss.held
    lacks = f"table {path} holds this sink's changes up to {held} only, not up to {loss.lost}"
    if start is not None and start.delivers_after(held):
        log.warning("%s: %s (restored): this run delivers them again", sink.where, lacks)
        return True
    if start is not None and start.going_on:
        log.warning("%s: %s (restored): an operator chose to go on without them", sink.where, lacks)
        return False
    again, on = (start.rewinds(sink.pipeline, sink.sink_id, held) if start is not None
                 else (rewind_command(sink.pipeline, sink.sink_id, None),) * 2)
    # The commands first: a sink's error is cut short in the run's report and one-line error.
    raise OperatorSinkError(
        f"{sink.where}: a RESTORE took a table back, so the sink lost changes it had acknowledged; "
        f"nothing is delivered to it until an operator runs `{again}` (delivers them again) or `{on}` "
        f"(goes on without them): {lacks}")


def told_if_restored(sink: DeltaSink, path: str) -> None:
    """Read again the lineage of a table this run has committed to ``RECHECK_COMMITS`` times, and
    fail if a RESTORE made while the run wrote it took changes back: told before the newest 50
    commits, which the next run reads first, have passed it (a run of many sub-batches could
    otherwise bury it: found by a generated history of 108 commits). The next run names the
    rewinds, as for a RESTORE between two runs."""
    loss = ledger.restore_loss(*sink.tables.lineage(path), sink.app_id)
    if loss is not None:
        raise OperatorSinkError(
            f"{sink.where}: a RESTORE took table {path} back while this run wrote it, so the sink "
            f"lost changes it had acknowledged: it holds this sink's changes up to {loss.held} only, "
            f"not up to {loss.lost}. Nothing more is delivered to it; the next run names the "
            f"rewinds to choose from (deliver them again, or go on without them)")


def last_chunk(batch: SubBatch) -> SnapshotPosition | None:
    """The highest snapshot position a transaction of the sub-batch ends at (the snapshot mark of
    its commits), or None when it holds no snapshot transaction."""
    chunks = [tx.end_position for tx in batch.transactions if isinstance(tx.end_position, SnapshotPosition)]
    return max(chunks) if chunks else None


__all__ = ["CHANGELOG_COLUMNS", "DeltaSink", "delivers_again", "json_type", "learn_types", "last_chunk",
           "told_if_restored"]

