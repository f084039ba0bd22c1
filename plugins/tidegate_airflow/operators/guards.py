"""Continuity guards and the settings preflight (docs/architecture.md, "One run" and "Continuity")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tidegate.plan import GUARD_ORDER

from ..metrics import emit_headroom
from .base import TidegateBaseOperator, without_resolution


class TidegateGuardOperator(TidegateBaseOperator):
    """Run the continuity guards of a pipeline; halt it when changes may have been lost.

    A halt (the engine records an incident with the exact missing range) fails the task with
    :class:`~tidegate_airflow.exceptions.ContinuityHaltError`, an ``AirflowFailException``: no
    retry, and every later run halts at ``halted`` until the incident is resolved. When the
    run's params carry ``resolve`` and ``reason``, the open incidents are resolved first (the
    reason and the triggering user are kept). A source setting that CDC needs and that is wrong
    fails with :class:`~tidegate_airflow.exceptions.PreflightError`. Other errors (a server
    briefly unreachable) are retried as usual.

    :param pipeline: the pipeline name.
    :param checks: which guards to run (always in the engine's order): ``halted`` (an open
        incident), ``failover`` (the server behind the connection vs. the one the checkpoints
        belong to; a MySQL/MariaDB failover whose GTIDs are all on the new server continues by
        itself), ``retention`` (the log still holds the checkpoints: a purged binlog, a dropped or
        invalidated Postgres slot), ``preflight`` (settings, privileges, retention headroom).
    :param resolve_incidents: honour ``resolve``/``reason`` from the run's params.
    :param source_conn_id: override the spec's source connection.
    """

    ui_color = "#f5e6c8"

    def __init__(self, *, pipeline: str, checks: Sequence[str] = GUARD_ORDER, resolve_incidents: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(pipeline=pipeline, **kwargs)
        unknown = [c for c in checks if c not in GUARD_ORDER]
        if unknown:
            raise ValueError(f"unknown guard check(s) {unknown}; allowed: {', '.join(GUARD_ORDER)}")
        self.checks = tuple(checks)
        self.resolve_incidents = resolve_incidents

    def run(self, run: Any, context: Any) -> None:
        from tidegate import guards

        run = run if self.resolve_incidents else without_resolution(run)
        plan, pipeline = run.plan, run.pipeline
        out = guards.run_guards(run, self.checks)
        for inc in out["resolved"]:
            self.log.warning("pipeline %s: incident resolved by %s with %s (reason: %s): %s",
                             pipeline, plan.who, plan.resolve, plan.reason, inc)
        if plan.resolve and not out["resolved"]:
            self.log.info("pipeline %s: resolve=%s requested, but no incident was open", pipeline,
                          plan.resolve)
        for w in out["warnings"]:
            self.log.warning("pipeline %s: preflight: %s", pipeline, w)
        emit_headroom(pipeline, out["headroom"])
        self.log.info("pipeline %s: guards passed (%s)", pipeline, ", ".join(self.checks))


class FailoverGuardOperator(TidegateGuardOperator):
    """The server behind the connection against the one the checkpoints belong to (see
    :class:`TidegateGuardOperator`); also halts on an open incident."""

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        kwargs.setdefault("checks", ("halted", "failover"))
        super().__init__(pipeline=pipeline, **kwargs)


class RetentionGuardOperator(TidegateGuardOperator):
    """The source's log still holds everything after the lowest checkpoint (MySQL/MariaDB: the
    binlog file was not purged; Postgres: the slot exists and lost no WAL); also halts on an
    open incident."""

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        kwargs.setdefault("checks", ("halted", "retention"))
        super().__init__(pipeline=pipeline, **kwargs)


# What the retention guard checks for each source kind, under the names users know.
SlotGuardOperator = RetentionGuardOperator
BinlogPurgeGuardOperator = RetentionGuardOperator


class PreflightOperator(TidegateGuardOperator):
    """Source settings (binlog_format=ROW, binlog_row_image=FULL, binlog_row_metadata=FULL;
    wal_level=logical), privileges, and retention headroom warnings."""

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        kwargs.setdefault("checks", ("preflight",))
        kwargs.setdefault("resolve_incidents", False)
        super().__init__(pipeline=pipeline, **kwargs)
