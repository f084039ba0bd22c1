"""What a run is built from: the pipeline's source and sinks, made from its connections.

The engine never builds a source or a sink itself: every step (bounds, guards, the run, release,
status) is handed a :class:`Parts` and asks it. By default connections come from
``AIRFLOW_CONN_<ID>`` environment variables; the Airflow operators hand one that reads
Airflow's connections, the Spark tasks one that holds the connection the driver sent them, and
tests one that returns their fakes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .connections import Connection, get_connection
from .errors import RunError
from .spec import PipelineSpec

if TYPE_CHECKING:  # the DAG files import ConnectionLookup at parse time: no source or sink code then
    from .sinks.base import Sink
    from .sources.base import Source

ConnectionLookup = Callable[[str], Connection]  # a connection id -> the connection


class Parts:
    """Makes the source and the sinks of a pipeline from the connections ``connections`` resolves."""

    def __init__(self, connections: ConnectionLookup | None = None):
        self.connection: ConnectionLookup = connections or get_connection

    def source(self, spec: PipelineSpec) -> Source:
        from .sources import make_source  # the source drivers pull in their client libraries

        return make_source(spec, self.connection(spec.source.conn_id))

    def sinks(self, spec: PipelineSpec, only: Sequence[str] | None = None) -> list[Sink]:
        """The spec's sinks (those named in ``only``, if given), in spec order."""
        from .sinks import make_sink

        chosen = chosen_sinks(spec, only)
        return [make_sink(spec, s, self.connection(s.conn_id)) for s in spec.sinks if s.id in chosen]


def fixed_connection(connection: Connection) -> Parts:
    """Parts whose every connection is ``connection`` (a Spark task or the reader process: the
    driver hands them the source's connection, they resolve nothing themselves)."""
    return Parts(lambda conn_id: connection)


def chosen_sinks(spec: PipelineSpec, only: Sequence[str] | None) -> set[str]:
    known = [s.id for s in spec.sinks]
    if not only:
        return set(known)
    unknown = sorted(set(only) - set(known))
    if unknown:
        raise RunError(f"pipeline {spec.pipeline!r} has no sink(s) {', '.join(unknown)}; "
                       f"its sinks are: {', '.join(known)}")
    return set(only)
