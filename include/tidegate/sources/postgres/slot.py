"""The pipeline's logical replication slot: its life, its plugin, its health, its position.

:class:`Slot` creates the slot on a pipeline's first run (logged), drops and re-creates it
when an operator accepts lost changes, reports its health from ``pg_replication_slots``,
raises typed errors when it is gone (:class:`SlotMissingError`) or invalidated
(:class:`SlotInvalidatedError`), and advances it when a run releases WAL: never further than
asked, never backwards. Reading never moves the slot; releasing is always an explicit step.

The output plugin (``wal2json`` or ``pgoutput``) is fixed when the slot is created: the one
``source.plugin`` names, or, without it, the first of the source's choices (``choices``:
``source.new_slot_plugins``) that the server can take: pgoutput where its publication exists or
can be made, wal2json where the server can load it. The server is asked by the creation itself:
a server without wal2json refuses at once with "could not access file" (it loads the plugin
before it waits for anything), and a publication the pipeline may not create is refused before
the slot is (``publication.PublicationPrivilegeError``); each refusal is logged and the next
choice tried. No extra query, no file-system privilege, and the answer is the server's own.
Once the slot exists its plugin is the one a read uses; a ``source.plugin`` that names another
is an error naming both (``Slot.check``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import psycopg2
import psycopg2.errors

from ...errors import SlotInvalidatedError, SlotMissingError, SourceError, SourceSettingError
from .connection import PgServer
from .position import Lsn, PgPosition
from .spec import PLUGINS

log = logging.getLogger(__name__)

WAL2JSON, PGOUTPUT = PLUGINS  # the order a new slot without source.plugin tries them in

# A run's WAL sender is named for its pipeline and lease epoch (its session's application_name),
# so a later run can tell a stalled one of its own pipeline from anything else holding the slot.
HOLDER_PREFIX = "tidegate/"
NAMEDATALEN = 63  # the server cuts application_name to this many bytes
TAKEOVER_WAIT_S = 30.0  # how long a takeover waits for a terminated WAL sender, beyond stall_timeout


def holder_name(pipeline: str, epoch: int | None) -> str:
    """The application_name of a run's replication session: ``tidegate/<epoch>/<pipeline>``
    (``-`` for no epoch: a read outside a run's lease), cut as the server cuts it."""
    name = f"{HOLDER_PREFIX}{'-' if epoch is None else epoch}/{pipeline}"
    return name.encode()[:NAMEDATALEN].decode(errors="ignore")


def holder_epoch(application_name: str | None, pipeline: str) -> int | None:
    """The lease epoch of a replication session of ``pipeline`` named by :func:`holder_name`;
    None for any other session (another pipeline's, a read without a lease, not tidegate's)."""
    if not application_name or not application_name.startswith(HOLDER_PREFIX):
        return None
    epoch, _, rest = application_name[len(HOLDER_PREFIX):].partition("/")
    if not epoch.isdigit() or rest != holder_name(pipeline, int(epoch)).split("/", 2)[2]:
        return None
    return int(epoch)


class SlotBusyError(SourceError):
    """The slot is held by a WAL sender this run may not take it from."""


class PluginUnavailableError(SourceSettingError):
    """A new slot cannot be created with this output plugin here (the next choice may be)."""


class PluginMissingError(PluginUnavailableError):
    """The server cannot load the output plugin a slot was to be created with."""


class Slot:
    def __init__(self, server: PgServer, name: str, plugin: str | None = None,
                 prepare: Callable[[str], None] | None = None, choices: tuple[str, ...] = PLUGINS,
                 pipeline: str = ""):
        self.server = server
        self.name = name
        self.pipeline = pipeline
        self.epoch: int | None = None  # the lease epoch of the run reading (use_lease)
        self.stall_timeout_s = 0  # source.stall_timeout: the WAL sender's tcp_user_timeout (0: none)
        self.plugin = plugin  # source.plugin; None: the server's choice (module docstring)
        self.choices = choices  # without source.plugin, the plugins a new slot tries, in order
        # called with the plugin just before a slot is created with it (pgoutput: the
        # publication must exist first, or decoding the slot fails: publication.py)
        self.prepare = prepare

    @property
    def conn(self):
        return self.server.conn

    def info(self) -> dict[str, Any] | None:
        """The slot's row of ``pg_replication_slots`` (and how far behind the head it is), or
        None when there is no such slot."""
        rows = self.server.query(
            "SELECT slot_name, plugin, slot_type, database, wal_status, safe_wal_size, "
            "restart_lsn::text, confirmed_flush_lsn::text, active_pid, "
            "pg_current_wal_lsn() - confirmed_flush_lsn, "
            "pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn) "
            "FROM pg_replication_slots WHERE slot_name = %s", (self.name,))
        if not rows:
            return None
        r = rows[0]
        return {"slot": r[0], "plugin": r[1], "slot_type": r[2], "database": r[3],
                "wal_status": r[4], "safe_wal_size": None if r[5] is None else int(r[5]),
                "restart_lsn": r[6], "confirmed_flush_lsn": r[7], "active_pid": r[8],
                "lag_bytes": None if r[9] is None else int(r[9]),
                # the WAL the server keeps for the slot: from its restart_lsn to the current LSN
                "held_bytes": None if r[10] is None else int(r[10])}

    def plugin_in_use(self) -> str | None:
        """The output plugin reads use: the slot's; before the slot exists, ``source.plugin``
        (None: decided when the slot is created)."""
        info = self.info()
        return info["plugin"] if info is not None else self.plugin

    def ensure(self) -> PgPosition | None:
        """Create the slot if it does not exist (logged), with ``source.plugin`` or what the
        server offers. Returns the position it was created at, or None when it already existed."""
        if self.info() is not None:
            return None
        tries = [self.plugin] if self.plugin else list(self.choices)
        refused: list[str] = []
        for plugin, then in zip(tries, tries[1:] + [None], strict=True):
            try:
                return self._create(plugin)
            except PluginUnavailableError as exc:
                if then is None:
                    if refused:  # every choice was refused: say why for each
                        raise type(exc)(f"{exc}; and before that: {'; '.join(refused)}") from None
                    raise
                refused.append(str(exc))
                log.warning("slot %r cannot be created with %s here (%s): creating it with %s",
                            self.name, plugin, exc, then)
        return None  # not reached: the last plugin raises

    def _create(self, plugin: str) -> PgPosition | None:
        if self.prepare is not None:
            self.prepare(plugin)
        try:
            (lsn,) = self.server.query("SELECT lsn::text FROM pg_create_logical_replication_slot(%s, %s)",
                                       (self.name, plugin), bounded=False)[0]  # waits for open txs
        except psycopg2.errors.DuplicateObject:
            return None
        except psycopg2.Error as exc:
            msg = (exc.pgerror or str(exc)).strip()
            if plugin in msg and ("could not access file" in msg or "not exist" in msg):
                hint = (" (Debian: postgresql-<version>-wal2json; or set source.plugin: pgoutput, which "
                        "every server has)" if plugin == WAL2JSON else "")
                raise PluginMissingError(f"the {plugin} output plugin is not installed on {self.conn}"
                                         f"{hint}: {msg}") from None
            raise SourceError(f"cannot create replication slot {self.name!r} on {self.conn}: {msg}") from None
        pos = self.server.position(lsn)
        log.warning("created logical replication slot %r (plugin %s) on %s at %s",
                    self.name, plugin, self.conn, pos)
        return pos

    def drop(self) -> None:
        self.server.query("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                          "WHERE slot_name = %s", (self.name,))

    def check(self, requested: PgPosition | None = None) -> dict[str, Any]:
        """The slot's health, or a typed error: :class:`SlotMissingError` (dropped, never
        created) or :class:`SlotInvalidatedError` (``wal_status = lost``). Both carry
        ``slot``, ``requested`` (the position the caller needs) and ``earliest_available``."""
        info = self.info()
        if info is None:
            err: SourceError = SlotMissingError(
                f"replication slot {self.name!r} does not exist on {self.conn}: changes after "
                f"{requested or 'the last checkpoint'} may be lost (was the slot dropped?)")
            attach(err, self.name, requested, self.server.head(), None)
            raise err
        if info["wal_status"] == "lost":
            err = SlotInvalidatedError(
                f"replication slot {self.name!r} on {self.conn} is invalidated (wal_status=lost): "
                f"the server removed WAL it still needed (max_slot_wal_keep_size); changes after "
                f"{requested or info['confirmed_flush_lsn']} are lost")
            attach(err, self.name, requested, self.server.head(), info["confirmed_flush_lsn"])
            raise err
        problem = self.plugin_problem(info)
        if problem:
            raise SourceSettingError(problem)
        return info

    def plugin_problem(self, info: dict[str, Any]) -> str | None:
        """Why the existing slot cannot be read as configured, or None."""
        if info["slot_type"] != "logical" or info["plugin"] not in PLUGINS:
            return (f"replication slot {self.name!r} on {self.conn} uses plugin {info['plugin']!r} "
                    f"({info['slot_type']}); tidegate reads a logical slot with {' or '.join(PLUGINS)}")
        if self.plugin and info["plugin"] != self.plugin:
            return (f"source.plugin is {self.plugin} but replication slot {self.name!r} on {self.conn} "
                    f"was created with {info['plugin']}: set source.plugin: {info['plugin']} (or remove "
                    f"it: the slot's plugin is used), or give the pipeline a new slot (source.slot) to "
                    f"switch plugins, which starts the stream at the new slot's creation")
        return None

    def earliest(self) -> PgPosition:
        """Where the slot can be read from (its confirmed position); the head without a slot."""
        info = self.info()
        if info is None or not info["confirmed_flush_lsn"]:
            return self.server.head()
        return self.server.position(info["confirmed_flush_lsn"])

    def check_retention(self, checkpoint: PgPosition | None, *, first_run: bool) -> dict[str, Any]:
        """The slot exists and has not lost WAL. A pipeline's first run creates it (logged);
        afterwards a missing slot means changes may be lost."""
        try:
            return {"status": "ok", **self.check(checkpoint)}
        except SlotMissingError:
            if not first_run:
                raise
        created = self.ensure()
        return {"status": "created", "slot": self.name,
                "at": created.to_json() if created is not None else None}

    def restart(self) -> PgPosition:
        """Replace the slot (an invalidated one, or one whose position means nothing to the
        checkpoints): changes are delivered from the new slot's start."""
        self.drop()
        return self.ensure() or self.server.head()

    def release(self, position: PgPosition) -> None:
        """Advance the slot to ``position`` (never further, never backwards), so the server
        can recycle the WAL before it."""
        info = self.check(position)
        lsn = position.lsn if isinstance(position, PgPosition) else Lsn.parse(position)
        if info["confirmed_flush_lsn"] and lsn <= Lsn.parse(info["confirmed_flush_lsn"]):
            return
        # Unbounded: advancing decodes the WAL in between, which takes long when far behind.
        self.server.query("SELECT pg_replication_slot_advance(%s, %s::pg_lsn)", (self.name, str(lsn)),
                          bounded=False)
        log.info("advanced slot %r to %s", self.name, lsn)

    # ------------------------------------------------------------------ who holds the slot

    @property
    def holder(self) -> str:
        """The application_name of this run's replication sessions (:func:`holder_name`)."""
        return holder_name(self.pipeline, self.epoch)

    def active_holder(self) -> tuple[int, str | None, str | None] | None:
        """(pid, application_name, role) of the WAL sender holding the slot, or None when it is
        free. A role sees the application_name of every session (pg_stat_activity)."""
        rows = self.server.query(
            "SELECT s.active_pid, a.application_name, a.usename FROM pg_replication_slots s "
            "LEFT JOIN pg_stat_activity a ON a.pid = s.active_pid "
            "WHERE s.slot_name = %s AND s.active_pid IS NOT NULL", (self.name,))
        return (int(rows[0][0]), rows[0][1], rows[0][2]) if rows else None

    def session_options(self, options: str) -> str:
        """A replication session's settings ``options`` with the stall timeout: ``tcp_user_timeout``
        makes the server's kernel drop the connection once data it sent stays unacknowledged, or
        the reader's receive window stays shut (Linux 5.11 and later), that long. A WAL sender
        blocked sending to a stopped run cannot be terminated otherwise: pg_terminate_backend
        makes it report the termination to its client, and that write blocks too."""
        if not self.stall_timeout_s:
            return options
        return f"{options} -c tcp_user_timeout={self.stall_timeout_s * 1000}"

    def take_over(self, timeout_s: float | None = None) -> None:
        """Free the slot for this run when a WAL sender of an older run of the pipeline (a lower
        lease epoch: a stalled, frozen or cut-off run the lease already moved away from) still
        holds it: terminate that backend (pg_terminate_backend: the same role, or
        pg_signal_backend) and wait until the server let go of the slot: at once when the WAL
        sender was waiting for WAL, at most ``source.stall_timeout`` (then the connection is
        dropped) when it was blocked sending to the stalled run; ``timeout_s`` (default: the
        stall timeout plus :data:`TAKEOVER_WAIT_S`) bounds the wait. Anything else holding the
        slot (not tidegate's, another pipeline's, a newer run's) is a :class:`SlotBusyError`
        naming the pid and its application."""
        if timeout_s is None:
            timeout_s = self.stall_timeout_s + TAKEOVER_WAIT_S
        held = self.active_holder()
        if held is None:
            return
        pid, app, role = held
        theirs = holder_epoch(app, self.pipeline)
        if self.epoch is None or theirs is None or theirs >= self.epoch:
            if theirs is None:
                who = "a session that is not a read of this pipeline under a lease"
            elif self.epoch is None:
                who = f"a run of this pipeline (lease epoch {theirs}), and this read holds no lease"
            else:
                who = (f"a newer run of this pipeline (lease epoch {theirs} >= {self.epoch}): "
                       f"this run is stale")
            raise SlotBusyError(
                f"replication slot {self.name!r} on {self.conn} is held by PID {pid} (application_name "
                f"{app!r}, role {role!r}), {who}. Stop that client, or terminate it: "
                f"SELECT pg_terminate_backend({pid})")
        log.warning("replication slot %r is held by PID %s (%s, role %s) of an older run of pipeline %s "
                    "(lease epoch %s < %s): terminating it", self.name, pid, app, role, self.pipeline,
                    theirs, self.epoch)
        self._terminate(pid, app, role)
        self._wait_free(pid, timeout_s)
        log.warning("took replication slot %r over from PID %s (lease epoch %s)", self.name, pid, theirs)

    def _terminate(self, pid: int, app: str | None, role: str | None) -> None:
        try:
            self.server.query("SELECT pg_terminate_backend(%s)", (pid,))
        except psycopg2.Error as exc:
            msg = (exc.pgerror or str(exc)).strip().splitlines()[0]
            raise SlotBusyError(
                f"replication slot {self.name!r} on {self.conn} is held by PID {pid} ({app!r}, role "
                f"{role!r}), a stalled run of this pipeline, and the CDC role cannot terminate it: {msg}. "
                f"Terminating another role's backend needs the pg_signal_backend privilege: GRANT "
                f"pg_signal_backend TO <the CDC role> (or run every run of the pipeline as one role)"
            ) from None

    def _wait_free(self, pid: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while (held := self.active_holder()) is not None and held[0] == pid:
            if time.monotonic() >= deadline:
                stall = (f"source.stall_timeout is {self.stall_timeout_s}s" if self.stall_timeout_s else
                         "source.stall_timeout is 0, so the server never drops it")
                raise SlotBusyError(
                    f"replication slot {self.name!r} on {self.conn} is still held by PID {pid} "
                    f"{timeout_s:.0f}s after pg_terminate_backend({pid}): the WAL sender is blocked sending "
                    f"to its stalled client ({stall}); kill that client, or set source.stall_timeout")
            time.sleep(0.05)

    def wait_released(self, pid: int, timeout_s: float = 30.0) -> None:
        """Wait until the WAL sender ``pid`` (a closed streaming session) has let go of the
        slot: it exits a moment after its client leaves, and until then the slot is busy."""
        deadline = time.monotonic() + timeout_s
        delay = 0.002
        while True:
            try:
                rows = self.server.query("SELECT 1 FROM pg_replication_slots WHERE slot_name = %s "
                                         "AND active_pid = %s", (self.name, pid))
            except (SourceError, psycopg2.Error) as exc:
                log.warning("cannot check that slot %r was released: %s", self.name, exc)
                return
            if not rows:
                return
            if time.monotonic() >= deadline:
                log.warning("slot %r is still held by WAL sender %s %.0fs after its session closed",
                            self.name, pid, timeout_s)
                return
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def read_error(self, exc: psycopg2.Error) -> SourceError:
        """The typed error for a failure while decoding the slot's changes."""
        msg = (getattr(exc, "pgerror", None) or str(exc)).strip()
        if "does not exist" in msg and "publication" in msg and "replication slot" not in msg:
            return SourceSettingError(
                f"reading slot {self.name!r} on {self.conn} failed: {msg.splitlines()[0]}. pgoutput looks "
                f"publications up as they were when each change was written, so the publication must "
                f"exist from before the slot's start (was it created or re-created later?). To start "
                f"over: drop the slot (SELECT pg_drop_replication_slot('{self.name}')); the next run halts "
                f"on the missing slot, and a run with resolve: resnapshot (or accept_gap) creates a new "
                f"slot after the publication (docs/operations.md)")
        if "is active for PID" in msg:
            return SlotBusyError(f"replication slot {self.name!r} on {self.conn} is busy: "
                                 f"{msg.splitlines()[0]}; {self._holder_text()}")
        if _connection_lost(exc, msg):
            return SourceError(
                f"lost the replication connection to slot {self.name!r} on {self.conn}: "
                f"{msg.splitlines()[0] if msg else type(exc).__name__}. Either the server went away, or "
                f"a newer run of the pipeline took the slot over from this one (a stalled run is "
                f"terminated, and fenced: it delivers nothing more)")
        if "does not exist" in msg and "replication slot" in msg:
            err = SlotMissingError(f"replication slot {self.name!r} disappeared during the read: {msg}")
            attach(err, self.name, None, None, None)
            return err
        if "can no longer get changes" in msg or "invalidated" in msg or "has already been removed" in msg:
            err2 = SlotInvalidatedError(f"replication slot {self.name!r} lost WAL it needs: {msg}")
            attach(err2, self.name, None, None, None)
            return err2
        return SourceError(f"reading slot {self.name!r} on {self.conn} failed: {msg}")

    def _holder_text(self) -> str:
        try:
            held = self.active_holder()
        except (SourceError, psycopg2.Error):
            return "its holder could not be looked up"
        if held is None:
            return "it is free now"
        return f"held by PID {held[0]} (application_name {held[1]!r}, role {held[2]!r})"


def _connection_lost(exc: psycopg2.Error, msg: str) -> bool:
    """The session died under the read: terminated by the server or the network."""
    if isinstance(exc, psycopg2.errors.AdminShutdown):
        return True
    return isinstance(exc, psycopg2.OperationalError) and any(s in msg for s in _LOST)


_LOST = ("terminating connection", "closed the connection", "connection has been closed", "SSL SYSCALL",
         "no connection to the server", "could not receive data")


def attach(err: Exception, slot: str, requested: Any, earliest: Any, last_confirmed: Any) -> None:
    """The facts an incident records, on the error the guard catches."""
    err.slot = slot  # type: ignore[attr-defined]
    err.requested = requested  # type: ignore[attr-defined]
    err.earliest_available = earliest  # type: ignore[attr-defined]
    err.last_confirmed = last_confirmed  # type: ignore[attr-defined]
