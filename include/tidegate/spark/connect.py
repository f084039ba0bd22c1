"""A run delivered as a Spark Connect client (docs/architecture.md, "Processes").

With a Spark Connect server (Spark 4's client/server protocol) a run needs no ``spark-submit``:
the process that runs it (the Airflow deliver task) opens a session on the long-lived server
and runs the same run as the spark-submit driver does (``runner.run_pipeline`` with the
:class:`~tidegate.spark.job.SparkReader`): the Python Data Sources are registered through the
session and read by the server's Python workers, the coordinator, the sinks and the checkpoints
stay in this process. A Connect session has no SparkContext and no RDDs, so the log's slices
are read through a data source too (slices.py), one data frame per slice in the same window.

What the tasks need (the spec, the source connection, the salt, the segment) travels inside the
data source's class, pickled, which the server receives as bytes of the registration
(:func:`register_task_source`): never as an option string, which a Connect server shows, in
part, as the text of the operation in its UI.

The session is opened on first use: a run whose log is one slice is read in this process
(streaming, as the spark-submit driver does) and never contacts the server.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..run import RunContext

log = logging.getLogger(__name__)


def register_task_source(spark: Any, payload: Any, task: Callable[[Any, int], Iterator[Any]],
                         schema: str) -> str:
    """Register a Python Data Source under a new name whose data frames (one per index, the
    ``index`` option) have one partition: ``task(payload, index)`` run by a Spark task, yielding
    Arrow record batches of ``schema``. ``payload`` and ``task`` reach the server inside the
    pickled class; returns the name."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    name = f"tidegate_{uuid.uuid4().hex[:12]}"

    class TaskReader(DataSourceReader):
        def __init__(self, options: Mapping[str, str]):
            self.index = int(options["index"])

        def partitions(self) -> Sequence[InputPartition]:
            return [InputPartition(self.index)]

        def read(self, partition: InputPartition) -> Iterator[Any]:
            yield from task(payload, partition.value)

    class TaskSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return schema

        def reader(self, schema: Any) -> TaskReader:
            return TaskReader(self.options)

    spark.dataSource.register(TaskSource)
    return name


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
        from pyspark.sql import SparkSession

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
    import hashlib
    import os

    digest = hashlib.sha256("\0".join([name, *(os.path.basename(p) for p in py_files)]).encode()).digest()
    return str(uuid.UUID(bytes=digest[:16], version=4))


def _server_value(spark: Any, key: str) -> str | None:
    try:
        return spark.conf.get(key, None)
    except Exception:  # noqa: BLE001 - a setting the server does not show
        return None


# The Connect session of the run this process delivers or submits (deliver_remote): for the sinks
# that write through Spark themselves (the Delta sink), and for interrupt_run; None outside a run.
_ACTIVE: LazySession | None = None


def active_session() -> LazySession | None:
    """The run's :class:`LazySession` while this process delivers a run as a Connect client."""
    return _ACTIVE


def interrupt_run() -> int:
    """Interrupt the Spark operations of the run this process has under way (the deliver task
    killed: Airflow's on_kill, on SIGTERM or its execution timeout): a run delivered by a Spark
    task stops where it delivers instead of running on without its task. Returns how many
    operations the server interrupted."""
    session = _ACTIVE
    return session.interrupt() if session is not None else 0


CONNECT_CONN_TYPE = "spark_connect"  # Airflow's Spark Connect connection type


def connect_url(conn: Any) -> str:
    """The ``sc://`` URL of a Spark Connect connection, built as Airflow's SparkConnectHook
    builds it (host, port; login as ``user_id``, password as ``token``, extra ``use_ssl``; a
    twin test holds them equal). It may hold a token: never log it."""
    from urllib.parse import quote, urlparse, urlunparse

    host = conn.host or ""
    url = host if "://" in host else f"sc://{host}"
    if conn.port:
        url = f"{url}:{conn.port}"
    params = []
    if conn.login:
        params.append(f"user_id={quote(conn.login)}")
    if conn.password:
        params.append(f"token={quote(conn.password)}")
    if conn.extra.get("use_ssl") is not None:
        params.append(f"use_ssl={quote(str(conn.extra['use_ssl']))}")
    return urlunparse(("sc", urlparse(url).netloc, "/", ";".join(params), "", ""))


def spec_connect_url(spec: Any, connection: Callable[[str], Any]) -> str | None:
    """The Spark Connect server a run outside Airflow (``tidegate run``) delivers through: the
    spec's ``spark.conn_id`` when that connection is defined and of type ``spark_connect``, as
    the deliver task decides; None otherwise (the run reads in its own process, and a Delta sink
    starts a local Spark)."""
    from ..errors import ConnectionConfigError

    try:
        conn = connection(spec.spark.conn_id)
    except ConnectionConfigError:
        return None
    return connect_url(conn) if conn.conn_type == CONNECT_CONN_TYPE else None


def _deliver_as_client(session: LazySession, run: RunContext, store_url: str) -> dict[str, Any]:
    """The run in this process; Spark tasks read its parallel parts."""
    from ..runner import run_pipeline
    from .job import SparkReader

    reader = SparkReader(session, run.parts.connection(run.spec.source.conn_id), store_url)
    try:
        return run_pipeline(run, reader=reader)
    finally:
        reader.close()


def deliver_remote(url: str, run: RunContext, *, conf: Mapping[str, str] | None = None,
                   py_files: Sequence[str] = ()) -> dict[str, Any]:
    """One bounded run read through a Spark Connect server at ``url`` (``sc://host:port/;...``,
    which may hold a token: it is never logged) and delivered by one Spark task or by this
    process (delivery.py says which); returns the run report, with ``connect_timings`` (seconds:
    opening the session, shipping the package, the run)."""
    from ..store import default_url
    from .delivery import deliver_on_executor, on_executor

    t0 = time.monotonic()
    if on_executor(run, {**run.spec.spark.conf, **(conf or {})}):
        session = LazySession(url, f"tidegate-{run.pipeline}", conf, py_files, kept=run.pipeline)
        def deliver(lazy: LazySession, run: RunContext, store_url: str) -> dict[str, Any]:
            return deliver_on_executor(lazy.get(), run, store_url, conf)
    else:
        session, deliver = LazySession(url, f"tidegate-{run.pipeline}", conf, py_files), _deliver_as_client
    global _ACTIVE
    _ACTIVE = session
    try:
        report = deliver(session, run, default_url())
    except BaseException:
        # e.g. the task's execution timeout raised here: a kept session outlives this client, and
        # the run's Spark task would go on delivering without it
        session.interrupt()
        raise
    finally:
        _ACTIVE = None
        session.stop()
    timings = dict(session.timings)
    timings["run_s"] = time.monotonic() - t0
    report["connect_timings"] = {k: round(v, 3) for k, v in timings.items()}
    report["spark_session_opened"] = "session_connect_s" in timings
    return report


__all__ = ["LazySession", "active_session", "connect_url", "deliver_remote", "interrupt_run",
           "register_task_source", "spec_connect_url"]
