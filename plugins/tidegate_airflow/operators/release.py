"""Release the source log up to the lowest checkpoint (docs/architecture.md, "One run")."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Context

from .base import TaskRun, TidegateBaseOperator


class TidegateReleaseOperator(TidegateBaseOperator):
    """Advance the Postgres slot to the lowest sink checkpoint, so the server can recycle WAL (a
    sink that is behind holds what it still needs); a no-op for binlog sources. Only an
    incremental run releases: a replay or a dry run moves no checkpoint.

    :param pipeline: the pipeline name.
    :param source_conn_id: override the spec's source connection.
    :return: (XCom) ``{"pipeline", "released_to": position | None}``.
    """

    ui_color = "#e5f5e0"

    def run(self, task: TaskRun, context: Context) -> dict[str, Any]:
        from tidegate import runner
        from tidegate.positions import position_to_json

        if task.plan.mode != "incremental":
            self.log.info("pipeline %s: mode=%s moves no checkpoint; nothing to release",
                          task.spec.pipeline, task.plan.mode)
            return {"pipeline": task.spec.pipeline, "released_to": None, "skipped": task.plan.mode}
        low = runner.release(task.spec, parts=task.parts)
        self.log.info("pipeline %s: source released up to %s", task.spec.pipeline, low)
        return {"pipeline": task.spec.pipeline, "released_to": position_to_json(low)}
