"""Source preflight: what the guard operators check before a run reads the change log.

Each source's ``preflight(...)`` returns a list of :class:`Problem`, one per problem, each with
one clear message naming the server setting, privilege or figure involved and how to fix it.
``severity`` is ``"error"`` (a run must not start: it would fail or lose data), ``"warning"``
(the run works, but something needs attention, e.g. shrinking retention headroom or tables
without REPLICA IDENTITY FULL) or ``"info"`` (a figure worth knowing, e.g. the WAL a slot
holds). :func:`raise_for_problems` turns the errors into one
:class:`~tidegate.errors.SourceSettingError`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..errors import SourceSettingError

ERROR = "error"
WARNING = "warning"
INFO = "info"


@dataclass(frozen=True)
class Problem:
    """One preflight finding.

    ``code`` is stable and machine-readable (``setting``, ``privilege``, ``retention``,
    ``replica_identity``, ``slot``, ``connection``); ``subject`` names the setting, privilege,
    slot or table it is about; ``message`` is the sentence shown to the operator; ``detail``
    carries figures (e.g. ``{"headroom_s": 3600}``).
    """

    code: str
    subject: str
    message: str
    severity: str = ERROR
    detail: dict[str, Any] = field(default_factory=dict, compare=False)

    def __str__(self) -> str:
        return f"[{self.severity}] {self.message}"


def errors(problems: Iterable[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == ERROR]


def raise_for_problems(problems: Iterable[Problem]) -> None:
    """Raise :class:`SourceSettingError` listing every error (warnings are not raised)."""
    errs = errors(problems)
    if errs:
        raise SourceSettingError("\n".join(p.message for p in errs))


def setting_problem(setting: str, actual: Any, wanted: str, fix: str) -> Problem:
    return Problem(
        "setting", setting,
        f"server setting {setting} is {actual!r}, CDC needs {wanted}: {fix}",
        detail={"actual": actual, "wanted": wanted},
    )


def human_bytes(n: int | None) -> str:
    if n is None:
        return "unlimited"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


def human_seconds(s: float | None) -> str:
    if s is None:
        return "unlimited"
    s = float(s)
    if abs(s) >= 86400:
        return f"{s / 86400:.1f} days"
    if abs(s) >= 3600:
        return f"{s / 3600:.1f} hours"
    if abs(s) >= 60:
        return f"{s / 60:.1f} minutes"
    return f"{s:.0f} seconds"
