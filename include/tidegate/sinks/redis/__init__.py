"""The Redis Streams sink kind: ``spec.py`` (the spec entry, light) and ``sink.py``
(:class:`RedisSink`, redis-py; its module docstring tells the transactions and the fencing)."""

from ...kinds import SinkKind
from . import spec

KIND = SinkKind(name="redis", spec_type=spec.RedisSinkSpec, fields=spec.FIELDS, parse=spec.parse,
                channel_chars=spec.STREAM_KEY_CHARS, channel_what="stream key",
                dataset_of="tidegate.sinks.redis.spec:dataset",
                sink="tidegate.sinks.redis.sink:RedisSink")
