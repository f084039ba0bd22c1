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

from .connections import Connection, get_connection, get_variable
from .errors import ConnectionConfigError, RunError
from .sinks import make_sink
from .sources import make_source
from .spec import PipelineSpec

if TYPE_CHECKING:  # the DAG files import ConnectionLookup at parse time: no source or sink code then
    from .sinks.base import Sink
    from .sources.base import Source

ConnectionLookup = Callable[[str], Connection]  # a connection id -> the connection
VariableLookup = Callable[[str], str]  # a variable name -> its value


class Parts:
    """Makes the source and the sinks of a pipeline from the connections ``connections`` resolves
    (and the variables ``variables`` resolves: a hash salt may live in one)."""

    def __init__(self, connections: ConnectionLookup | None = None, variables: VariableLookup | None = None):
        self.connection: ConnectionLookup = connections or get_connection
        self.variable: VariableLookup = variables or get_variable

    def source(self, spec: PipelineSpec, *, reads_rows: bool = True) -> Source:
        """The pipeline's source; ``reads_rows=False`` (a look at the head, the status page) leaves
        the hash salt unresolved: such a source refuses to read a table with hashed columns."""
        salt = self.hash_salt(spec) if reads_rows else None
        return make_source(spec, self.connection(spec.source.conn_id), hash_salt=salt)

    def hash_salt(self, spec: PipelineSpec) -> bytes | None:
        """The salt of the spec's hashed columns (``source.hash_salt``): a connection's password or a
        variable's value, as UTF-8 bytes; None when nothing is hashed. A secret: it is handed to the
        source (and shipped beside its connection), never logged."""
        where = spec.source.hash_salt
        if where is None:
            return None
        kind, name = where
        if kind == "conn_id":
            value = self.connection(name).password
            if not value:
                raise ConnectionConfigError(
                    f"source.hash_salt: connection {name!r} has no password; the salt of hashed columns is "
                    f"that connection's password: set one (a long random string)")
        else:
            value = self.variable(name)
        return value.encode("utf-8")

    def sinks(self, spec: PipelineSpec, only: Sequence[str] | None = None) -> list[Sink]:
        """The spec's sinks (those named in ``only``, if given), in spec order."""
        chosen = chosen_sinks(spec, only)
        # A sink without conn_id (a Delta table on a local path) talks through no connection.
        return [make_sink(spec, s, self.connection(s.conn_id) if s.conn_id else None)
                for s in spec.sinks if s.id in chosen]


class _Fixed(Parts):
    def __init__(self, connection: Connection, hash_salt: bytes | None):
        super().__init__(lambda conn_id: connection)
        self._hash_salt = hash_salt

    def hash_salt(self, spec: PipelineSpec) -> bytes | None:
        return self._hash_salt


class _Resolved(Parts):
    def __init__(self, connections: dict[str, Connection], hash_salt: bytes | None):
        super().__init__(self._lookup)
        self._connections, self._hash_salt = connections, hash_salt

    def _lookup(self, conn_id: str) -> Connection:
        try:
            return self._connections[conn_id]
        except KeyError:
            raise ConnectionConfigError(
                f"connection {conn_id!r} was not resolved for this Spark task (it has only "
                f"{', '.join(sorted(self._connections))}): the deliver task resolves the connections "
                f"the spec names") from None

    def hash_salt(self, spec: PipelineSpec) -> bytes | None:
        return self._hash_salt


def resolved_parts(connections: dict[str, Connection], hash_salt: bytes | None) -> Parts:
    """Parts over connections and a salt the deliver task resolved (a run delivered by a Spark
    task: spark/delivery.py)."""
    return _Resolved(connections, hash_salt)


def fixed_connection(connection: Connection, hash_salt: bytes | None = None) -> Parts:
    """Parts whose every connection is ``connection`` and whose hash salt is ``hash_salt`` (a Spark
    task or the reader process: the driver hands them the source's connection and salt, they
    resolve nothing themselves)."""
    return _Fixed(connection, hash_salt)


def chosen_sinks(spec: PipelineSpec, only: Sequence[str] | None) -> set[str]:
    known = [s.id for s in spec.sinks]
    if not only:
        return set(known)
    unknown = sorted(set(only) - set(known))
    if unknown:
        raise RunError(f"pipeline {spec.pipeline!r} has no sink(s) {', '.join(unknown)}; "
                       f"its sinks are: {', '.join(known)}")
    return set(only)
