"""A run delivered as a Spark Connect client (docs/architecture.md, "Processes").

With a Spark Connect server (Spark 4's client/server protocol) a run needs no ``spark-submit``:
the process that runs it (the Airflow deliver task) opens a session on the long-lived server
and runs the same run as the spark-submit driver does (``runner.run_pipeline`` with the
:class:`~tidegate.spark.job.SparkReader`): the Python Data Sources are registered through the
session and read by the server's Python workers, the coordinator, the sinks and the checkpoints
stay in this process. A Connect session has no SparkContext and no RDDs, so the log's slices
are read through a data source too (slices.py), one data frame per slice in the same window.

The session is session.py's; the data sources the tasks read through, task_source.py's.

The session is opened on first use: a run whose log is one slice is read in this process
(streaming, as the spark-submit driver does) and never contacts the server.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlparse, urlunparse

from ..errors import ConnectionConfigError
from .session import LazySession, activated

if TYPE_CHECKING:
    from ..run import PlannedRun



CONNECT_CONN_TYPE = "spark_connect"  # Airflow's Spark Connect connection type


def connect_url(conn: Any) -> str:
    """The ``sc://`` URL of a Spark Connect connection, built as Airflow's SparkConnectHook
    builds it (host, port; login as ``user_id``, password as ``token``, extra ``use_ssl``; a
    twin test holds them equal). It may hold a token: never log it."""
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
    try:
        conn = connection(spec.spark.conn_id)
    except ConnectionConfigError:
        return None
    return connect_url(conn) if conn.conn_type == CONNECT_CONN_TYPE else None


def _deliver_as_client(session: LazySession, run: PlannedRun, store_url: str) -> dict[str, Any]:
    """The run in this process; Spark tasks read its parallel parts."""
    # The CLI imports this module at every start; the Spark reader's modules load for a Connect
    # run only (about 20 ms of every `tidegate run` otherwise).
    from ..runner import run_pipeline
    from .job import SparkReader

    reader = SparkReader(session, run.parts.connection(run.spec.source.conn_id), store_url)
    try:
        return run_pipeline(dataclasses.replace(run, spark=session), reader=reader)
    finally:
        reader.close()


def deliver_remote(url: str, run: PlannedRun, *, conf: Mapping[str, str] | None = None,
                   py_files: Sequence[str] = ()) -> dict[str, Any]:
    """One bounded run read through a Spark Connect server at ``url`` (``sc://host:port/;...``,
    which may hold a token: it is never logged) and delivered by one Spark task or by this
    process (delivery.py says which); returns the run report, with ``connect_timings`` (seconds:
    opening the session, shipping the package, the run)."""
    # as above: loaded for a Connect run only
    from ..store import default_url
    from .delivery import deliver_on_executor, on_executor

    t0 = time.monotonic()
    if on_executor(run, {**run.spec.spark.conf, **(conf or {})}):
        session = LazySession(url, f"tidegate-{run.pipeline}", conf, py_files, kept=run.pipeline)
        def deliver(lazy: LazySession, run: PlannedRun, store_url: str) -> dict[str, Any]:
            return deliver_on_executor(lazy.get(), run, store_url, conf)
    else:
        session, deliver = LazySession(url, f"tidegate-{run.pipeline}", conf, py_files), _deliver_as_client
    try:
        with activated(session):
            report = deliver(session, run, default_url())
    except BaseException:
        # e.g. the task's execution timeout raised here: a kept session outlives this client, and
        # the run's Spark task would go on delivering without it
        session.interrupt()
        raise
    finally:
        session.stop()
    timings = dict(session.timings)
    timings["run_s"] = time.monotonic() - t0
    report["connect_timings"] = {k: round(v, 3) for k, v in timings.items()}
    report["spark_session_opened"] = "session_connect_s" in timings
    return report


__all__ = ["connect_url", "deliver_remote", "spec_connect_url"]
