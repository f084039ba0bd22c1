"""``PostgresSource``: the Source interface over the roles of this package.

It composes the server (``connection.py``: sessions, identity, timeline, head), the slot
(``slot.py``) and, for a pgoutput slot, the publication (``publication.py``), a decoder per read
chosen by the slot's plugin (``wal2json.py``: wal2json, ``pgoutput.py``: pgoutput, both over the
streaming replication protocol; the constructor takes another, such as the reference decoder in
tests/reference_decoders) and the preflight (``preflight.py``), and owns what belongs to a
pipeline: the slot name, the table filter and the schema changes met while reading. The
contract it keeps is in ``sources/postgres/__init__.py``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from ...connections import Connection
from ...errors import PositionPurgedError
from ...filters import TableFilter, captured
from ...spec import PipelineSpec
from ...store.base import CheckpointStore
from ...store.records import CheckpointRecord
from ..base import Source, SourceItem
from ..preflight import Problem, human_seconds
from . import pgoutput, wal2json
from . import preflight as server_checks
from .columns import ColumnTracker, LocalMemory, Memory, StoreMemory
from .connection import PgServer
from .pgoutput import PgOutputDecoder
from .position import Lsn, PgPosition
from .publication import Publication, publication_tables
from .slot import PGOUTPUT, WAL2JSON, Slot, SlotBusyError
from .snapshot import PostgresCatalog, PostgresSnapshotReads
from .wal2json import Wal2JsonDecoder

log = logging.getLogger(__name__)

DECODERS = {WAL2JSON: Wal2JsonDecoder, PGOUTPUT: PgOutputDecoder}  # the read path of a slot's plugin
FIRST_LOOK = 100  # rows the first look of has_changes decodes


def light_log_reads(source: PostgresSource) -> bool:
    """Whether ``source``'s reads stay in the run's process (``SourceKind.reads_in_process``): a
    pgoutput slot read through the compiled rows (``rowcodec.PgOutputRows``), whose decoding
    costs about what packing, piping and unpacking the items would, so a reader process only
    adds its own start-up and the copies (docs/performance.md, "Compiled pgoutput rows, the
    read in the run's process, the floor"); wal2json's JSON is still worth a core of its own."""
    return wal2json.compiled_applies(source) and source.replication_slot.plugin_in_use() == PGOUTPUT


def new_slot_plugins(publication: str | None, tables: frozenset[tuple[str, str]] | TableFilter
                     ) -> tuple[str, ...]:
    """The plugins a new slot without ``source.plugin`` tries, in order (docs/operations.md,
    "Which plugin a pipeline uses"). pgoutput, the faster (docs/performance.md), comes first
    where its publication reaches no further than the captured tables: one ``source.publication``
    names (only pgoutput reads it), or the pipeline's own FOR TABLE a list of names. wal2json comes
    first for every table (``FOR ALL TABLES`` would make each table without a replica identity
    refuse UPDATE and DELETE, for every application) and for patterns (a FOR TABLE publication
    does not take the tables created later that they match)."""
    if publication is not None:
        return (PGOUTPUT,)
    if isinstance(tables, frozenset) and tables:
        return (PGOUTPUT, WAL2JSON)
    return (WAL2JSON, PGOUTPUT)


class PostgresSource(PostgresCatalog, Source):  # the catalog and snapshot reads: snapshot.py
    """Bounded reads of a logical replication slot (wal2json or pgoutput). See
    ``sources/postgres/__init__.py`` for the contract."""

    kind = "postgres"

    def __init__(self, spec: PipelineSpec, conn: Connection, *, slot: str | None = None,
                 itersize: int = 5000, connect_timeout: float = 10.0, decoder: Any = None,
                 hash_salt: bytes | None = None):
        self.spec = spec
        self.conn = conn
        self.server = PgServer(conn, connect_timeout=connect_timeout)
        src = spec.source
        self.publication = Publication(self.server, src.publication or f"tidegate_{spec.pipeline}",
                                       owned=src.publication is None)
        # source.tables: a set of names (empty: all), or a TableFilter for patterns and excludes
        self.tables: frozenset[tuple[str, str]] | TableFilter = captured(spec.source.tables)
        self.replication_slot = Slot(self.server, slot or src.slot or f"tidegate_{spec.pipeline}",
                                     plugin=src.plugin, prepare=self._before_slot, pipeline=spec.pipeline,
                                     choices=new_slot_plugins(src.publication, self.tables))
        self.replication_slot.stall_timeout_s = src.stall_timeout_s
        self.itersize = itersize
        # The decoder class of each read: ``decoder.messages(source, upto)`` gets the slot's
        # messages, ``decoder(source, start_lsn, upto).run(messages)`` the items. None: the one of
        # the slot's plugin (DECODERS: streaming replication and generated row plans).
        self.decoder = decoder
        self.use_filters(hash_salt)
        self._columns: dict[tuple[str, str], list[str]] = {}
        self._memory: Memory = LocalMemory()

    @property
    def slot(self) -> str:
        """The name of the pipeline's replication slot."""
        return self.replication_slot.name

    def close(self) -> None:
        self.server.close()

    def snapshots(self) -> PostgresSnapshotReads:
        return PostgresSnapshotReads(self)

    # ------------------------------------------------------------------ identity and positions

    def identity(self) -> dict[str, Any]:
        return self.server.identity()

    def head(self) -> PgPosition:
        """The end of the flushed WAL, never inside a commit record (:meth:`PgServer.head`)."""
        return self.server.head()

    def earliest(self) -> PgPosition:
        """Where the slot can be read from (its confirmed position); the head without a slot."""
        return self.replication_slot.earliest()

    # ------------------------------------------------------------------ slot

    def use_lease(self, epoch: int) -> None:
        """Reads from now on are the run's of lease ``epoch``: its replication sessions are named
        for it, and a WAL sender of an older epoch still holding the slot is taken over
        (``Slot.take_over``)."""
        super().use_lease(epoch)
        self.replication_slot.epoch = epoch

    def _before_slot(self, plugin: str) -> None:
        """A pgoutput slot is read with a publication that must exist before it (publication.py)."""
        if plugin == PGOUTPUT:
            self.publication.ensure(publication_tables(self.server, self.tables))

    # ------------------------------------------------------------------ continuity

    def describe_change(self, old_identity: dict[str, Any]) -> str:
        new = self.identity()
        if old_identity.get("system_id") != new.get("system_id"):
            return (f"the connection now reaches another PostgreSQL cluster (system identifier "
                    f"{old_identity.get('system_id')} -> {new.get('system_id')}); its WAL is not the one "
                    f"the checkpoints point into and the replication slot is not there")
        return (f"the server moved from timeline {old_identity.get('timeline')} to {new.get('timeline')}: "
                f"a standby was promoted, and a logical replication slot does not survive a promotion")

    def check_retention(self, checkpoint: PgPosition | None, *, first_run: bool) -> dict[str, Any]:
        """The slot exists and has not lost WAL. A pipeline's first run creates it (logged);
        afterwards a missing slot means changes may be lost."""
        return self.replication_slot.check_retention(checkpoint, first_run=first_run)

    def restart_stream(self) -> PgPosition:
        """Replace the slot (an invalidated one, or one whose position means nothing to the
        checkpoints): changes are delivered from the new slot's start."""
        return self.replication_slot.restart()

    def release(self, position: PgPosition) -> None:
        """Advance the slot to ``position`` (never further, never backwards), so the server
        can recycle the WAL before it."""
        self.replication_slot.release(position)

    def log_held(self) -> dict[str, Any] | None:
        """The slot, where it restarts and the WAL it holds (pg_wal_lsn_diff of the current WAL
        LSN and its restart_lsn); None without a slot."""
        info = self.replication_slot.info()
        if info is None:
            return None
        return {"slot": self.slot, "restart_lsn": info["restart_lsn"],
                "confirmed_flush_lsn": info["confirmed_flush_lsn"], "bytes": info["held_bytes"],
                "replay_retention_s": self.spec.source.replay_retention_s}

    def log_gone_before(self, start: PgPosition) -> str | None:
        """A slot decodes only what commits after its confirmed_flush_lsn: a range starting
        before it is gone (a missing slot is the retention guard's business)."""
        info = self.replication_slot.info()
        confirmed = info["confirmed_flush_lsn"] if info is not None else None
        if not confirmed or start.lsn >= Lsn.parse(confirmed):
            return None
        window = self.spec.source.replay_retention_s
        return (f"replication slot {self.slot!r} now starts at {confirmed} (its confirmed_flush_lsn; "
                f"it no longer holds the WAL from {start.lsn}; source.replay_retention is "
                f"{human_seconds(window) if window else '0'}). To keep a window for replays, backfills "
                f"and rewinds, set source.replay_retention in {self.spec.path or 'the pipeline spec'} "
                f"(e.g. 24h, longer than the oldest run you may replay): release then keeps the slot "
                f"where the checkpoints were that long ago, at the cost of the WAL it holds (`tidegate "
                f"status`)")

    # ------------------------------------------------------------------ reading

    def read(self, start: PgPosition | None, upto: PgPosition) -> Iterator[SourceItem]:
        """Rows of the transactions whose commit ends in (start, upto], in commit order."""
        if upto is None:
            raise ValueError("read needs an upper bound (head() at the start of the run)")
        start_lsn, plugin = self._start_lsn(start)
        if upto.lsn <= start_lsn:
            return
        read_with = self.decoder or DECODERS[plugin]
        messages = read_with.messages(self, upto)
        try:
            yield from self.filtered(read_with(self, start_lsn, upto).run(messages))
        finally:
            messages.close()  # a read that stops at the bound frees its session (and the slot) now

    def _start_lsn(self, start: PgPosition | None) -> tuple[Lsn, str]:
        """Where a read from ``start`` begins (the slot's confirmed position without a start; an
        error when ``start`` is before it: the changes in between are gone), and the slot's plugin."""
        info = self.replication_slot.check(start)
        confirmed = Lsn.parse(info["confirmed_flush_lsn"])
        start_lsn = confirmed if start is None else start.lsn
        if start_lsn < confirmed:
            raise PositionPurgedError(
                f"position {start} is before the start of slot {self.slot!r} ({confirmed}): the "
                f"slot was advanced past it (or re-created), the changes in between are no longer "
                f"available", requested=start, earliest_available=self.server.position(confirmed))
        return start_lsn, info["plugin"]

    def has_changes(self, start: PgPosition | None, upto: PgPosition, limit: int = 10_000) -> bool:
        """A bounded look: peek at most ``limit`` decoded rows (whole transactions) of the slot
        for a row change of the pipeline's tables committed in (start, upto]. When the look is
        cut off by ``limit`` the answer is True (there may be work), so the run goes ahead.

        A first look takes :data:`FIRST_LOOK` rows: a backlog's first transactions answer it,
        where decoding ``limit`` rows (a peek returns only once it has them all) took 60 ms of
        a run's start (10,000 wal2json rows). Only a look that first meets no change, and is
        cut off, looks again up to ``limit``."""
        info = self.replication_slot.check(start)
        start_lsn = Lsn.parse(info["confirmed_flush_lsn"]) if start is None else start.lsn
        if upto.lsn <= start_lsn:
            return False
        if info["active_pid"] is not None:
            # A look needs the slot; a run that holds it (a stalled one, taken over by the read
            # under the next lease) leaves the answer open: there may be work.
            log.info("slot %r is held by PID %s: the look for changes is left to the read",
                     self.slot, info["active_pid"])
            return True
        for n in dict.fromkeys((min(FIRST_LOOK, limit), limit)):
            found = self._look(info["plugin"], start_lsn, upto, n)
            if found is not None:
                return found
        return True

    def _look(self, plugin: str, start_lsn: Lsn, upto: PgPosition, n: int) -> bool | None:
        server, slot, tables = self.server, self.replication_slot, self.tables
        try:
            if plugin == PGOUTPUT:
                return pgoutput.has_changes(server, slot, self.publication.name, tables, start_lsn, upto, n)
            return wal2json.has_changes(server, slot, tables, start_lsn, upto, n)
        except SlotBusyError:
            return True  # taken a moment ago (see has_changes): there may be work

    def table_columns(self, schema: str, table: str) -> list[str]:
        """The table's columns (catalog, remembered for the source's life): what an UPDATE's
        new tuple lacks is an unchanged TOAST value (decoders' :class:`~.wal2json.ReadHost`)."""
        key = (schema, table)
        if key not in self._columns:
            self._columns[key] = self.server.table_columns(schema, table)
        return self._columns[key]

    def use_store(self, store: CheckpointStore) -> None:
        """Column sets are remembered in the checkpoint store between runs (``columns.py``)."""
        self._memory = StoreMemory(store, self.spec.pipeline)

    def column_tracker(self, start: PgPosition) -> ColumnTracker:
        """The column sets of a read from ``start`` (decoders' :class:`~.wal2json.ReadHost`)."""
        return ColumnTracker(self._memory, start, self.spec.tenant, self.spec.pipeline)

    # ------------------------------------------------------------------ preflight

    def preflight(self, checkpoint: CheckpointRecord | None = None) -> list[Problem]:
        """Settings, privileges, slot health and retention headroom (the slot's safe_wal_size),
        replica identity; one :class:`Problem` per problem."""
        return self.check_server(checkpoint.position if checkpoint is not None else None) + \
            self.filter_problems()

    def check_server(self, checkpoint: PgPosition | None = None,
                     headroom_warn_bytes: int = server_checks.DEFAULT_HEADROOM_WARN_BYTES) -> list[Problem]:
        """:meth:`preflight` for a checkpoint position."""
        probs = server_checks.check_server(self.server, self.replication_slot, self.tables, checkpoint,
                                           headroom_warn_bytes, self.spec.source.replay_retention_s)
        if any(p.code == "connection" for p in probs):
            return probs
        slot = self.replication_slot.info()
        if (slot["plugin"] if slot is not None else self.spec.source.plugin) == PGOUTPUT:
            wanted = publication_tables(self.server, self.tables)
            probs += self.publication.problems(wanted, slot is not None)
        return probs
