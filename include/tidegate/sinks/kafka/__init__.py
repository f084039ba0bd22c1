"""The Kafka sink kind: ``spec.py`` (the spec entry, light) and ``sink.py`` (:class:`KafkaSink`,
confluent-kafka; its module docstring tells the modes, the errors and the connection)."""

from ...kinds import SinkKind
from . import spec

KIND = SinkKind(name="kafka", spec_type=spec.KafkaSinkSpec, fields=spec.FIELDS, parse=spec.parse,
                channel_chars=spec.TOPIC_CHARS, channel_what="topic",
                dataset_of="tidegate.sinks.kafka.spec:dataset",
                sink="tidegate.sinks.kafka.sink:KafkaSink",
                envelope="tidegate.debezium.envelope:encoder_for",
                envelope_fields="tidegate.debezium.spec:parse")
