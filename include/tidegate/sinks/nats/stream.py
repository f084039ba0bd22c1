"""The sink's JetStream stream: created when missing (the subjects derived from the template,
the pipeline's channels, ``duplicate_window`` from the spec); an existing one must capture the
sink's subjects, and gains the pipeline's channels if it was made before them."""

from __future__ import annotations

import logging
from collections.abc import Callable

import nats.js.errors as jerr
from nats.js.api import StreamConfig

from ...errors import NonRetryableSinkError
from .client import Client
from .subjects import fewest_filters, subject_covers

log = logging.getLogger("tidegate.sinks.nats.sink")


async def ensure_stream(client: Client, sink_id: str, stream: str, subjects: str, channels: tuple[str, ...],
                        window_s: float, before_create: Callable[[], None]) -> float:
    """The stream's duplicate window (s), the stream created or completed first.
    ``before_create`` runs before a stream is created (the preflight: never create a stream it
    would refuse)."""
    js = client.js
    try:
        info = await js.stream_info(stream)
    except jerr.NotFoundError:
        before_create()
        try:
            info = await js.add_stream(StreamConfig(name=stream, subjects=fewest_filters(subjects, channels),
                                                    duplicate_window=window_s))
            log.info("NATS sink %r: created stream %r (subjects %r, duplicate_window %gs)",
                     sink_id, stream, subjects, window_s)
        except jerr.BadRequestError:  # created concurrently by another run
            info = await js.stream_info(stream)
    have = list(info.config.subjects or [])
    if not any(subject_covers(p, subjects) for p in have):
        raise NonRetryableSinkError(
            f"NATS sink {sink_id!r}: stream {stream!r} does not capture the sink's subjects "
            f"{subjects!r} (its subjects: {have}); add them to the stream or change the sink's "
            f"subject template")
    missing = [c for c in channels if not any(subject_covers(p, c) for p in have)]
    if missing:  # a stream made before the control channel existed: add the pipeline's channels
        info.config.subjects = have + missing
        info = await js.update_stream(info.config)
        log.info("NATS sink %r: stream %r now also captures %s", sink_id, stream, missing)
    return float(info.config.duplicate_window or 0.0)


__all__ = ["ensure_stream"]
