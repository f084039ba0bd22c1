"""A whole run in one call, as `tidegate run` makes it: the bounds step writes the run's record,
then the delivery reads it (docs/architecture.md, "One run")."""

from __future__ import annotations

from typing import Any

from tidegate import bounds_step, runner
from tidegate.run import RunContext


def whole_run(run: RunContext, **kw: Any) -> dict[str, Any]:
    """``runner.run_pipeline`` after the run's bounds step; ``kw`` goes to the delivery."""
    return runner.run_pipeline(bounds_step.prepare_bounds(run), **kw)
