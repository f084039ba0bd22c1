"""Release the source log up to the lowest checkpoint (docs/architecture.md, "One run")."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context

from .base import TidegateBaseOperator


class TidegateReleaseOperator(TidegateBaseOperator):
    """Advance the Postgres slot to the lowest sink checkpoint, so the server can recycle WAL (a
    sink that is behind holds what it still needs); a no-op for binlog sources. Only an
    incremental run releases: a replay or a dry run moves no checkpoint.

    :param pipeline: the pipeline name.
    :param source_conn_id: override the spec's source connection.
    :return: (XCom) ``{"pipeline", "released_to": position | None}``.
    """

    ui_color = "#e5f5e0"
    reads_record = True

    def run(self, run: Any, context: Context) -> dict[str, Any]:
        from tidegate import runner
        from tidegate.positions import position_to_json

        if run.plan.mode != "incremental":
            self.log.info("pipeline %s: mode=%s moves no checkpoint; nothing to release",
                          run.pipeline, run.plan.mode)
            return {"pipeline": run.pipeline, "released_to": None, "skipped": run.plan.mode}
        low = runner.release(run)
        self.log.info("pipeline %s: source released up to %s", run.pipeline, low)
        return {"pipeline": run.pipeline, "released_to": position_to_json(low)}
