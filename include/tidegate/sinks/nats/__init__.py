"""The NATS JetStream sink kind: ``spec.py`` (the spec entry, light) and ``sink.py``
(:class:`NatsSink`, nats-py; its module docstring tells the dedup, the fencing and the errors)."""

from ...kinds import SinkKind
from . import spec

KIND = SinkKind(name="nats", spec_type=spec.NatsSinkSpec, fields=spec.FIELDS, parse=spec.parse,
                channel_chars=spec.SUBJECT_CHARS, channel_what="subject",
                dataset_of="tidegate.sinks.nats.spec:dataset",
                sink="tidegate.sinks.nats.sink:NatsSink")
