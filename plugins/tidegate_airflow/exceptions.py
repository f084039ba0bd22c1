"""Named exceptions of the tidegate Airflow operators.

Every class here derives from ``AirflowFailException``: the task fails at once and Airflow does
not retry it, because a retry cannot help (lost changes, a wrong trigger form, a wrong server
setting, a fatal sink error). Errors that a retry can fix (a server briefly down, a broker
timeout) are left as they are, so the task's ``retries`` apply.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk.exceptions import AirflowFailException


class TidegateFailure(AirflowFailException):
    """Base of the tidegate failures that must not be retried."""


class ContinuityHaltError(TidegateFailure):
    """A guard found (or an earlier run recorded) an incident: changes may be missing.

    ``incident`` is the engine's incident record; the message names the missing range and how
    to resolve it (trigger the DAG with ``resolve`` and ``reason``).
    """

    def __init__(self, message: str, *, incident: Any = None):
        super().__init__(message)
        self.incident = incident


class InvalidRunParamsError(TidegateFailure):
    """The run's params (the trigger form or ``dag_run.conf``) are inconsistent."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("invalid run params: " + "; ".join(self.problems))


class PreflightError(TidegateFailure):
    """A source setting or privilege that CDC needs is wrong (the message names the fix)."""


class PipelineNotFoundError(TidegateFailure):
    """No valid spec in the pipelines folder defines the pipeline."""


class DeliverFatalError(TidegateFailure):
    """The Spark job stopped on a fatal error (fenced producer, revoked credentials, stale
    fencing epoch, halt): retrying would not help."""


class UnsafeConnectionTransportError(TidegateFailure):
    """Passing connections to the Spark driver would put secrets on a command line."""


class FatalEngineError(TidegateFailure):
    """Any other engine error that a retry cannot fix (a fenced writer, a bad spec, positions of
    two servers): the engine marks those ``fatal``."""


def fail_fast(exc: BaseException) -> None:
    """Raise the matching non-retried failure for a fatal engine error; return for the others
    (they propagate as they are, and Airflow's retries apply)."""
    if not getattr(exc, "fatal", False):
        return
    from tidegate import catalog
    from tidegate.errors import SourceSettingError
    from tidegate.guards import ContinuityHalt
    from tidegate.plan import RunParamsError

    if isinstance(exc, ContinuityHalt):
        raise ContinuityHaltError(halt_message(exc), incident=exc.incident) from None
    if isinstance(exc, SourceSettingError):
        raise PreflightError(str(exc)) from None
    if isinstance(exc, RunParamsError):
        raise InvalidRunParamsError(exc.problems) from None
    if isinstance(exc, catalog.PipelineNotFoundError):
        raise PipelineNotFoundError(str(exc)) from None
    raise FatalEngineError(f"{type(exc).__name__}: {exc}") from exc


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


class InvalidPipelineSpecError(Exception):
    """Raised at DAG parse time for pipeline specs that are invalid: Airflow shows it as an
    import error naming each file, field and problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        n = len(self.problems)
        head = (f"tidegate: {n} problem(s) in the pipeline specs; the DAG of each file named "
                f"below is not loaded, the other pipelines are not affected:")
        super().__init__("\n".join([head, *("  " + p for p in self.problems)]))
