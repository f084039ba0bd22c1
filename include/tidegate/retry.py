"""Retries with exponential backoff and full jitter, per sink (docs/architecture.md): each Sink
class carries its ``retry_policy``.

Full jitter (sleep uniform(0, min(max, base * 2**n)) before retry n+1) spreads the retries of
many workers hitting one broker, instead of having them retry in lock-step.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from .errors import ErrorClass
from .sinks.base import RetryPolicy, Sink

T = TypeVar("T")



class RetryFailure(Exception):
    """The call failed for good: ``cause`` is the last error, ``error_class`` its class."""

    def __init__(self, cause: BaseException, error_class: ErrorClass, attempts: int):
        super().__init__(f"{type(cause).__name__}: {cause} ({error_class.value}, "
                         f"{attempts} attempt{'s' if attempts != 1 else ''})")
        self.cause = cause
        self.error_class = error_class
        self.attempts = attempts


def policy_for(sink: Sink) -> RetryPolicy:
    """The sink class's ``retry_policy`` (:class:`Sink`'s default unless the kind sets its own)."""
    return type(sink).retry_policy


def backoff_delay(policy: RetryPolicy, retry_no: int, rng: random.Random | None = None) -> float:
    """Delay before retry ``retry_no`` (0-based): uniform(0, min(max, base * 2**retry_no))."""
    cap = min(policy.max_s, policy.base_s * (2 ** retry_no))
    return (rng or random).uniform(0.0, cap)


def call_with_retry(fn: Callable[[], T], policy: RetryPolicy,
                    classify: Callable[[BaseException], ErrorClass], *,
                    sleep: Callable[[float], object] = time.sleep,
                    rng: random.Random | None = None,
                    should_stop: Callable[[], bool] = lambda: False) -> T:
    """Call ``fn``; retry RETRYABLE errors up to ``policy.attempts`` calls in total. Raises
    :class:`RetryFailure` at once for NON_RETRYABLE and FATAL errors, when attempts run out,
    or when ``should_stop()`` turns true between attempts (another sink failed fatally)."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn()
        except Exception as exc:  # noqa: BLE001 - classify decides what an error means
            cls = _safe_classify(classify, exc)
            if cls is not ErrorClass.RETRYABLE or attempt >= policy.attempts or should_stop():
                raise RetryFailure(exc, cls, attempt) from exc
            sleep(backoff_delay(policy, attempt - 1, rng))
            if should_stop():
                raise RetryFailure(exc, cls, attempt) from exc


def _safe_classify(classify: Callable[[BaseException], ErrorClass], exc: BaseException) -> ErrorClass:
    # A broken classifier must not turn a sink error into a crash of the coordinator.
    try:
        cls = classify(exc)
    except Exception:  # noqa: BLE001
        return ErrorClass.NON_RETRYABLE
    return cls if isinstance(cls, ErrorClass) else ErrorClass.NON_RETRYABLE
