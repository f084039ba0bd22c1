"""Continuity guards and the settings preflight (DESIGN.md, "One run" step 1, "Continuity")."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow.sdk import Context

from .._engine import engine
from ..exceptions import ContinuityHaltError, PreflightError
from .base import TidegateBaseOperator

CHECKS = ("halted", "failover", "slot", "binlog_purge", "preflight")


class TidegateGuardOperator(TidegateBaseOperator):
    """Run the continuity guards of a pipeline; halt it when changes may have been lost.

    A halt (an incident with the exact missing range is recorded by the engine) fails the task
    with :class:`~tidegate_airflow.exceptions.ContinuityHaltError`, an ``AirflowFailException``:
    no retry, and every later run halts at ``halted`` until the incident is resolved. When the
    run's params carry ``resolve`` and ``reason``, the open incidents are resolved first (the
    reason and the triggering user are kept). A source setting that CDC needs and that is wrong
    fails with :class:`~tidegate_airflow.exceptions.PreflightError`. Other errors (a server
    briefly unreachable) are retried as usual.

    :param pipeline: the pipeline name.
    :param checks: which guards to run, in order: ``halted`` (an open incident),
        ``failover`` (source identity vs. the identity stored with the checkpoints; a MySQL/MariaDB
        failover whose GTIDs are all on the new server continues by itself), ``slot`` (Postgres
        slot missing or invalidated), ``binlog_purge`` (the checkpoint's binlog purged),
        ``preflight`` (settings, privileges, retention headroom warnings). Guards that do not
        apply to the source kind do nothing.
    :param resolve_incidents: honour ``resolve``/``reason`` from the run's params.
    :param source_conn_id: override the spec's source connection.
    :return: (XCom) ``{"pipeline", "plan", "checks": {name: result}, "warnings", "resolved"}``.
    """

    ui_color = "#f5e6c8"

    def __init__(self, *, pipeline: str, checks: Sequence[str] = CHECKS, resolve_incidents: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(pipeline=pipeline, **kwargs)
        unknown = [c for c in checks if c not in CHECKS]
        if unknown:
            raise ValueError(f"unknown guard check(s) {unknown}; allowed: {', '.join(CHECKS)}")
        self.checks = tuple(checks)
        self.resolve_incidents = resolve_incidents

    def execute(self, context: Context) -> dict[str, Any]:
        spec = self.load_spec()
        plan = self.run_plan(context, spec)
        run_id = self.run_id_of(context)
        resolver = self.resolver(spec)
        guards, errors = engine("guards"), engine("errors")
        result: dict[str, Any] = {"pipeline": spec.pipeline, "plan": plan.to_json(), "checks": {},
                                  "warnings": [], "resolved": []}
        try:
            if plan.resolve and self.resolve_incidents:
                result["resolved"] = self._resolve(guards, errors, spec, plan, run_id, resolver)
            for check in self.checks:
                result["checks"][check] = self._run_check(guards, check, spec, run_id, resolver, result)
        except guards.ContinuityHalt as exc:
            raise ContinuityHaltError(halt_message(exc), incident=getattr(exc, "incident", None)) from None
        except errors.SourceSettingError as exc:
            raise PreflightError(f"pipeline {spec.pipeline!r}: {exc}") from None
        self.log.info("pipeline %s: guards passed (%s)", spec.pipeline, ", ".join(self.checks) or "none")
        return result

    def _resolve(self, guards: Any, errors: Any, spec: Any, plan: Any, run_id: str, resolver: Any) -> list:
        try:
            done = guards.resolve_incidents(spec, resolution=plan.resolve, reason=plan.reason,
                                            who=plan.who, run_id=run_id, resolve=resolver)
        except (errors.SourceError, errors.ConnectionConfigError):
            raise  # the server or a connection: worth a retry
        except guards.ContinuityHalt:
            raise
        except errors.TidegateError as exc:
            raise ContinuityHaltError(
                f"pipeline {spec.pipeline!r}: resolve={plan.resolve} failed: {exc}") from None
        for inc in done or []:
            self.log.warning("pipeline %s: incident resolved by %s with %s (reason: %s): %s",
                             spec.pipeline, plan.who, plan.resolve, plan.reason, inc)
        if not done:
            self.log.info("pipeline %s: resolve=%s requested, but no incident was open",
                          spec.pipeline, plan.resolve)
        return list(done or [])

    def _run_check(self, guards: Any, check: str, spec: Any, run_id: str, resolver: Any,
                   result: dict[str, Any]) -> Any:
        if check == "halted":
            guards.check_halted(spec)
            return {"status": "ok"}
        if check == "preflight":
            warnings = list(guards.preflight(spec, resolve=resolver) or [])
            for w in warnings:
                self.log.warning("pipeline %s: preflight: %s", spec.pipeline, w)
            result["warnings"].extend(warnings)
            return {"status": "ok" if not warnings else "warnings", "warnings": warnings}
        fn = getattr(guards, f"guard_{check}")
        out = fn(spec, run_id=run_id, resolve=resolver)
        self.log.info("pipeline %s: %s guard: %s", spec.pipeline, check, out)
        return out


def halt_message(exc: BaseException) -> str:
    """The engine's message, led by the incident's kind, id and missing range."""
    inc = getattr(exc, "incident", None)
    if inc is None:
        return f"CONTINUITY HALT: {exc}"
    frm, to = getattr(inc, "from_position", None), getattr(inc, "to_position", None)
    head = (f"CONTINUITY HALT: incident #{getattr(inc, 'id', '?')} ({getattr(inc, 'kind', '?')}), "
            f"missing range from {'the beginning' if frm is None else frm} to "
            f"{'unknown' if to is None else to}")
    return f"{head}. {exc}"


class FailoverGuardOperator(TidegateGuardOperator):
    """Source identity against the identity stored with the checkpoints (see
    :class:`TidegateGuardOperator`); also halts on an open incident."""

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        kwargs.setdefault("checks", ("halted", "failover"))
        super().__init__(pipeline=pipeline, **kwargs)


class SlotGuardOperator(TidegateGuardOperator):
    """PostgreSQL: the replication slot exists and is not invalidated; also halts on an open
    incident."""

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        kwargs.setdefault("checks", ("halted", "slot"))
        super().__init__(pipeline=pipeline, **kwargs)


class BinlogPurgeGuardOperator(TidegateGuardOperator):
    """MySQL/MariaDB: the checkpoint's binlog file/GTIDs are still on the server; also halts on
    an open incident."""

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        kwargs.setdefault("checks", ("halted", "binlog_purge"))
        super().__init__(pipeline=pipeline, **kwargs)


class PreflightOperator(TidegateGuardOperator):
    """Source settings (binlog_format=ROW, binlog_row_image=FULL, binlog_row_metadata=FULL;
    wal_level=logical), privileges, and retention headroom warnings."""

    def __init__(self, *, pipeline: str, **kwargs: Any) -> None:
        kwargs.setdefault("checks", ("preflight",))
        kwargs.setdefault("resolve_incidents", False)
        super().__init__(pipeline=pipeline, **kwargs)
