"""Release the source log up to the lowest committed checkpoint (DESIGN.md, "One run" step 4)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context

from .._engine import engine
from .base import TidegateBaseOperator


class TidegateReleaseOperator(TidegateBaseOperator):
    """Advance the Postgres slot to the lowest committed sink checkpoint, so the server can
    recycle WAL (a sink that is behind holds what it still needs); a no-op for binlog sources.
    Only an incremental run releases: a replay or a dry run moves no checkpoint.

    :param pipeline: the pipeline name.
    :param source_conn_id: override the spec's source connection.
    :return: (XCom) ``{"pipeline", "released_to": position | None}``.
    """

    ui_color = "#e5f5e0"

    def execute(self, context: Context) -> dict[str, Any]:
        spec = self.load_spec()
        plan = self.run_plan(context, spec)
        if plan.mode != "incremental":
            self.log.info("pipeline %s: mode=%s moves no checkpoint; nothing to release",
                          spec.pipeline, plan.mode)
            return {"pipeline": spec.pipeline, "released_to": None, "skipped": plan.mode}
        out = engine("runner").release(spec, resolve=self.resolver(spec))
        self.log.info("pipeline %s: source released up to %s", spec.pipeline, out.get("released_to"))
        return out
