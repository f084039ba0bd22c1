"""The ``kind: delta`` sink entry of a spec (docs/operations.md, "Delta Lake sink"): its fields and
their checks. Light: no Spark, no delta-spark (DAG parsing loads specs)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ...datasets import Dataset
from ...spec import Problems, SinkSpec, _choice, data_dir, template_field

# A table path: a local folder or any Hadoop-compatible URI (file:, s3a:, abfss:, hdfs:, ...).
PATH_CHARS = re.compile(r"^[A-Za-z0-9._/:@=+-]*$")
# The control channel and DLQ are Delta tables too, named like a table's path.
CHANNEL_CHARS = PATH_CHARS
FIELDS = ("path", "mode", "checkpoint_path")
MODES = ("merge", "changelog")
# Under the data dir: one folder per pipeline and sink, then one table per captured table.
DEFAULT_PATH = "{pipeline}/{sink}/{schema}/{table}"


@dataclass(frozen=True)
class DeltaSinkSpec(SinkSpec):
    path: str = ""  # the table path template; "" = the default under the data dir
    mode: str = "merge"  # merge: the current rows; changelog: every change as a row
    checkpoint_path: str = ""  # the sink's checkpoint table; "" = beside the tables

    @property
    def guarantee(self) -> str:
        return ("exactly-once per table (Delta idempotent writes: txnAppId, txnVersion with the lease epoch; "
                "each table's commits record what they cover; checkpoint in the Delta log; fenced)")

    def table_path(self, pipeline: str) -> str:
        """The path template with {pipeline} filled in and the default resolved (run time: the
        data dir is read from the environment of the process that writes)."""
        if self.path:
            return self.path.replace("{pipeline}", pipeline)
        base = data_dir()
        rest = DEFAULT_PATH.replace("{pipeline}", pipeline).replace("{sink}", self.id)
        return base.rstrip("/") + "/" + rest

    def checkpoint_table_path(self, pipeline: str) -> str:
        if self.checkpoint_path:
            return self.checkpoint_path.replace("{pipeline}", pipeline)
        tables = self.table_path(pipeline)
        return (tables.replace("{db}", "_tidegate").replace("{schema}", "_tidegate")
                .replace("{table}", f"checkpoint_{self.id}"))


def parse(d: dict, fp: str, probs: Problems) -> dict[str, Any]:
    path = template_field(d, "path", f"{fp}.path", probs, PATH_CHARS, "table path", required=False)
    if path is not None and "{table}" not in path:
        probs.add(f"{fp}.path", f"{path!r} has no {{table}}: every captured table needs a path of its own",
                  "a path template with {table} (and {schema} or {db} when tables of several schemas "
                  "are captured), e.g. s3a://lake/{pipeline}/{schema}/{table}")
        path = None
    ckpt = template_field(d, "checkpoint_path", f"{fp}.checkpoint_path", probs, PATH_CHARS, "table path",
                          required=False)
    if ckpt is not None and any(f"{{{p}}}" in ckpt for p in ("db", "schema", "table")):
        probs.add(f"{fp}.checkpoint_path", f"{ckpt!r} names a table placeholder; the checkpoint table is "
                  f"one per sink", "a path with at most {pipeline}")
        ckpt = None
    mode = _choice(d, "mode", f"{fp}.mode", probs, MODES, default="merge")
    return dict(path=path or "", mode=mode or "merge", checkpoint_path=ckpt or "")


def dataset(conn: Any, path: str) -> Dataset:
    """A table by its path: a local folder is ``file:///path`` (Airflow's common.io scheme,
    OpenLineage's ``file`` namespace); ``s3a://``/``s3n://`` are ``s3://`` (the Amazon provider's
    scheme, OpenLineage's S3 namespace); any other Hadoop URI (``abfss://``, ``hdfs://``,
    ``gs://``) stays as written."""
    parts = urlsplit(path)
    if not parts.scheme or parts.scheme == "file":
        local = os.path.abspath(parts.path if parts.scheme else path)
        return Dataset("file", local, f"file://{local}")
    scheme = "s3" if parts.scheme in ("s3a", "s3n") else parts.scheme
    return Dataset(f"{scheme}://{parts.netloc}", parts.path, f"{scheme}://{parts.netloc}{parts.path}")
