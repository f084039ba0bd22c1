"""The Spark Connect session of a run: opened on first use, kept per pipeline between runs, and
known to the sinks that write through Spark (the Delta sink) while the run is under way."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

log = logging.getLogger(__name__)


class LazySession:
    """A Spark Connect session opened on first use (``get()``); records how long opening it,
    shipping the package and registering took (``timings``)."""

    def __init__(self, url: str, app_name: str, conf: Mapping[str, str] | None = None,
                 py_files: Sequence[str] = (), *, kept: str | None = None):
        # ``kept``: a name (the pipeline's) whose session outlives this object: the next run of the
        # same name and package attaches to it, so its Python workers, with the engine imported,
        # are there already (a new session gets new workers: its artifacts are its own).
        self.url, self.app_name = url, app_name
        self.conf, self.py_files = dict(conf or {}), list(py_files)
        self.session_id = kept_session_id(kept, self.py_files) if kept else None
        self.session: Any = None
        self.timings: dict[str, float] = {}

    def get(self) -> Any:
        if self.session is None:
            t0 = time.monotonic()
            spark = self._open_kept() if self.session_id else self._open(self.app_name)
            self.timings["session_connect_s"] = time.monotonic() - t0
            t1 = time.monotonic()
            if self.py_files:  # the session's tasks import this tidegate, not the server's
                spark.addArtifacts(*self.py_files, pyfile=True)
            self.timings["ship_package_s"] = time.monotonic() - t1
            self.session = spark
            log.info("Spark Connect session %s opened in %.2fs (package shipped in %.2fs)",
                     spark.session_id, self.timings["session_connect_s"], self.timings["ship_package_s"])
        return self.session

    def _open_kept(self) -> Any:
        """The kept session, or a new one when the server has let it go (expired after its idle
        timeout, or closed): the server refuses an id it has closed."""
        try:
            spark = self._open(self.app_name, self.session_id)
            spark.conf.get("spark.app.name")  # the first call reaches the server
            return spark
        except Exception as exc:  # noqa: BLE001 - SparkConnectException types vary by version
            if "SESSION_CLOSED" not in str(exc) and "SESSION_NOT_FOUND" not in str(exc):
                raise
            log.info("Spark Connect session %s is closed on the server: a new one", self.session_id)
            self.session_id = str(uuid.uuid4())
            return self._open(self.app_name, self.session_id)

    def sibling(self, app_name: str) -> Any:
        """Another session on the same server with the run's settings: its SQL settings are its
        own (a sink that carries its commits' identifiers in them needs that). No package is
        shipped: it runs no Python task. The caller stops it."""
        return self._open(app_name)

    def _open(self, app_name: str, session_id: str | None = None) -> Any:
        from pyspark.sql import SparkSession  # pyspark loads when a session opens, not at CLI start

        url = f"{self.url};session_id={session_id}" if session_id else self.url
        spark = SparkSession.builder.remote(url).appName(app_name).create()
        if session_id:
            spark.release_session_on_close = False  # stop() then only closes the channel
        for key, value in self.conf.items():
            try:
                spark.conf.set(key, value)
            except Exception as exc:  # a setting fixed when the server started
                if _server_value(spark, key) != value:  # the server has it already: nothing to say
                    log.warning("spark.conf %s: not settable in a Spark Connect session (%s); the "
                                "server's own value applies: set it where the server starts",
                                key, type(exc).__name__)
        return spark

    def conf_value(self, key: str) -> str | None:
        """A setting the run gave the session (read without opening it)."""
        return self.conf.get(key)

    def interrupt(self, wait: float = 10.0) -> int:
        """Interrupt every operation of the open session (none opened: nothing to do); returns
        how many the server interrupted. The call runs in a thread of its own, bounded by
        ``wait``: it may be made from a signal handler while this thread waits on the same
        channel (the deliver task's on_kill)."""
        spark = self.session
        if spark is None:
            return 0
        done: list[int] = []

        def call() -> None:
            try:
                done.append(len(spark.interruptAll()))
            except Exception as exc:  # noqa: BLE001 - a server gone: its operations with it
                log.warning("Spark Connect session %s: interrupting its operations failed: %s",
                            spark.session_id, type(exc).__name__)

        caller = threading.Thread(target=call, name="tidegate-interrupt", daemon=True)
        caller.start()
        caller.join(wait)
        return done[0] if done else 0

    def stop(self) -> None:
        if self.session is not None:
            self.session.stop()  # releases the server-side session and what it holds
            self.session = None


def kept_session_id(name: str, py_files: Sequence[str]) -> str:
    """The session id (a version-4 UUID, as the server wants) of ``name`` with this package: the
    same for every run of one pipeline and one build of the code shipped."""
    digest = hashlib.sha256("\0".join([name, *(os.path.basename(p) for p in py_files)]).encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


def _server_value(spark: Any, key: str) -> str | None:
    try:
        return spark.conf.get(key, None)
    except Exception:  # noqa: BLE001 - a setting the server does not show
        return None


# The Connect session of the run this process delivers or submits (connect.deliver_remote), for
# interrupt_run (the deliver task killed); None outside a run.
_ACTIVE: LazySession | None = None


@contextlib.contextmanager
def activated(session: LazySession) -> Iterator[LazySession]:
    """``session`` as the run's (what :func:`interrupt_run` interrupts) while the block runs."""
    global _ACTIVE
    _ACTIVE = session
    try:
        yield session
    finally:
        _ACTIVE = None


def interrupt_run() -> int:
    """Interrupt the Spark operations of the run this process has under way (the deliver task
    killed: Airflow's on_kill, on SIGTERM or its execution timeout): a run delivered by a Spark
    task stops where it delivers instead of running on without its task. Returns how many
    operations the server interrupted."""
    session = _ACTIVE
    return session.interrupt() if session is not None else 0


__all__ = ["LazySession", "activated", "interrupt_run", "kept_session_id"]
