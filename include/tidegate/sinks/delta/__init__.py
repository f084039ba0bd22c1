"""The Delta Lake sink kind: ``spec.py`` (the spec entry, light) and ``sink.py``
(:class:`DeltaSink`, delta-spark; its module docstring tells the commits, the idempotent writes and
the checkpoint kept in the Delta log). ``jars.py`` finds Delta's jars and the Spark settings a
session needs for them."""

from ...kinds import SinkKind
from . import spec

KIND = SinkKind(name="delta", spec_type=spec.DeltaSinkSpec, fields=spec.FIELDS, parse=spec.parse,
                channel_chars=spec.CHANNEL_CHARS, channel_what="table path",
                dataset_of="tidegate.sinks.delta.spec:dataset",
                sink="tidegate.sinks.delta.sink:DeltaSink", needs_connection=False,
                spark_conf="tidegate.sinks.delta.jars:spark_conf")
