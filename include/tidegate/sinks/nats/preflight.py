"""The duplicate window's preflight: a sub-batch re-sent after JetStream's ``duplicate_window``
would be stored twice, so the window must be at least the schedule's interval plus the retry
budget (pure functions)."""

from __future__ import annotations

import re

from ...errors import NonRetryableSinkError
from ..base import RetryPolicy

_PRESETS = {"@continuous": 0.0, "@hourly": 3600.0, "@daily": 86400.0, "@weekly": 7 * 86400.0,
            "@monthly": 31 * 86400.0, "@quarterly": 92 * 86400.0, "@yearly": 366 * 86400.0,
            "@annually": 366 * 86400.0}
_NUM = re.compile(r"^\d+$")
_STEP = re.compile(r"^\*/(\d+)$")


def schedule_interval_s(schedule: str | None) -> float | None:
    """The longest gap between two runs of a schedule, for presets and simple crons
    (``*/N * * * *``, ``M */N * * *``, ``M H * * *``); None when unknown or manual."""
    if not schedule:
        return None
    if schedule.startswith("@"):
        return _PRESETS.get(schedule)
    f = schedule.split()
    if len(f) != 5 or any(x != "*" for x in f[2:]):
        return None
    minute, hour = f[0], f[1]
    if hour == "*":
        if minute == "*":
            return 60.0
        if (m := _STEP.match(minute)) and 60 % int(m.group(1)) == 0:
            return 60.0 * int(m.group(1))
        return 3600.0 if _NUM.match(minute) else None
    if _NUM.match(minute):
        if (m := _STEP.match(hour)) and 24 % int(m.group(1)) == 0:
            return 3600.0 * int(m.group(1))
        if _NUM.match(hour):
            return 86400.0
    return None


def retry_budget_s(policy: RetryPolicy, attempt_timeout_s: float) -> float:
    """The longest a sub-batch can keep being retried within one run: every attempt timing out
    plus the largest backoff before each retry."""
    sleeps = sum(min(policy.max_s, policy.base_s * 2 ** i) for i in range(max(0, policy.attempts - 1)))
    return policy.attempts * attempt_timeout_s + sleeps


def check_duplicate_window(window_s: float, interval_s: float, retry_budget: float, *,
                           stream: str = "?") -> None:
    """Raise a NonRetryableSinkError when ``window_s`` < ``interval_s`` + ``retry_budget``."""
    need = interval_s + retry_budget
    if window_s < need:
        raise NonRetryableSinkError(
            f"NATS stream {stream!r}: duplicate_window {window_s:g}s is shorter than the schedule "
            f"interval {interval_s:g}s plus the retry budget {retry_budget:g}s (= {need:g}s): a "
            f"sub-batch re-sent after the window would be stored twice. Set duplicate_window to at "
            f"least {need:g}s (the sink's duplicate_window, or the existing stream's setting).")


__all__ = ["check_duplicate_window", "retry_budget_s", "schedule_interval_s"]
