"""tidegate operators for Airflow DAGs (also usable in your own DAGs)."""

from __future__ import annotations

from .bounds import TidegateBoundsOperator
from .deliver import TidegateDeliverOperator
from .guards import (
    BinlogPurgeGuardOperator,
    FailoverGuardOperator,
    PreflightOperator,
    SlotGuardOperator,
    TidegateGuardOperator,
)
from .release import TidegateReleaseOperator
from .report import TidegateReportOperator

__all__ = [
    "BinlogPurgeGuardOperator",
    "FailoverGuardOperator",
    "PreflightOperator",
    "SlotGuardOperator",
    "TidegateBoundsOperator",
    "TidegateDeliverOperator",
    "TidegateGuardOperator",
    "TidegateReleaseOperator",
    "TidegateReportOperator",
]
