"""The source and sink kinds, and where each kind's code lives (docs/architecture.md, "Adding a
source or a sink").

A kind is one package, ``sources/<kind>/`` or ``sinks/<kind>/``, registered here by name. The
package's ``__init__`` imports no client library (DAG parsing validates specs through it) and
defines ``KIND``, a :class:`SourceKind` or :class:`SinkKind`: everything the core asks of the
kind (its spec section, its position type, how to build it). The core never compares kind
names; it looks the kind up here. The packages are imported when a kind is first asked for,
and the code that needs a client library (the Source or Sink class) only when one is made.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# This module is a leaf of the import graph (the spec, positions and the kind packages import it):
# the types it hands around (specs, Problems, Sink, Source) are named in words only.

# kind name -> the kind's package (imported lazily); the order is the order messages list them in
SOURCES: Mapping[str, str] = {"mysql": "tidegate.sources.mysql", "postgres": "tidegate.sources.postgres"}
SINKS: Mapping[str, str] = {"kafka": "tidegate.sinks.kafka", "nats": "tidegate.sinks.nats",
                            "redis": "tidegate.sinks.redis", "delta": "tidegate.sinks.delta"}


def _load(ref: str) -> Any:
    """``"package.module:Name"`` -> the object, importing the module."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class SinkKind:
    """What the core needs of a sink kind. Everything but ``sink`` is light."""

    name: str
    spec_type: type  # the kind's SinkSpec subclass
    fields: tuple[str, ...]  # the YAML fields of a sink entry of this kind, beyond the common ones
    # (entry, field path "sinks[i]", problems) -> the kind's own keyword arguments of spec_type;
    # a kind with envelope_fields is handed the entry's envelope fields too, as a fourth argument
    parse: Callable[..., dict[str, Any]]
    channel_chars: re.Pattern  # what a DLQ or control channel name may hold (as its data names)
    channel_what: str  # what messages call such a name: "topic", "subject", "stream key"
    sink: str  # "module:Class" of the Sink, imported when a sink is made (client library)
    # False: ``conn_id`` is optional (a Delta table on a local path needs no connection)
    needs_connection: bool = True
    # "module:function" () -> the Spark settings a session needs for this kind's sinks (jars,
    # extensions), merged into the deliver job's settings; "" when the kind needs none
    spark_conf: str = ""
    # "module:function" (connection or None, target name) -> the target's ``datasets.Dataset``
    # (its namespace, name and URI: where an asset event or lineage says the run wrote)
    dataset_of: str = ""
    # "module:function" (pipeline spec, sink spec, source info) -> the record encoder the sink's
    # envelope asks for (None: the tidegate envelope); "" when the kind has one envelope only
    envelope: str = ""
    # "module:function" (entry, field path, problems) -> the entry's envelope fields (``envelope``
    # and its options) as keyword arguments of spec_type; "" with ``envelope``. Light: DAG
    # parsing loads specs. The envelope's owner parses them, so the sink's spec imports none of it.
    envelope_fields: str = ""

    def parse_entry(self, d: dict, fp: str, probs: Any) -> dict[str, Any]:
        """The keyword arguments of ``spec_type`` a sink entry ``d`` (at ``fp``) gives."""
        if self.envelope_fields:
            return self.parse(d, fp, probs, _load(self.envelope_fields)(d, fp, probs))
        return self.parse(d, fp, probs)

    def make(self, pipeline_spec: Any, sink_spec: Any, conn: Any) -> Any:
        """The Sink for ``sink_spec`` of ``pipeline_spec`` through the connection ``conn``."""
        if self.envelope:
            return _load(self.sink)(pipeline_spec, sink_spec, conn, envelope=_load(self.envelope))
        return _load(self.sink)(pipeline_spec, sink_spec, conn)

    def spark_settings(self) -> dict[str, str]:
        """The Spark settings the deliver job needs for a sink of this kind (empty: none)."""
        return _load(self.spark_conf)() if self.spark_conf else {}

    def dataset(self, conn: Any, target: str) -> Any:
        """The dataset of target ``target`` of a sink of this kind on the connection ``conn``."""
        return _load(self.dataset_of)(conn, target)


@dataclass(frozen=True)
class SourceKind:
    """What the core needs of a source kind. Everything but ``source`` is light."""

    name: str
    fields: tuple[str, ...]  # the YAML fields of ``source:`` only this kind reads
    # (source mapping, problems) -> the kind's own keyword arguments of SourceSpec
    parse: Callable[[dict, Any], dict[str, Any]]
    # (pipeline spec) -> what the pipeline holds on its server that no other reader may share
    replication_client: Callable[[Any], tuple[str, Any]]
    position: str  # "module:Class" of the kind's log position type (light)
    source: str  # "module:Class" of the Source, imported when a source is made (client library)
    # (source spec, pipeline name) -> the source spec with the kind's defaults that depend on the
    # pipeline's name filled in
    complete: Callable[[Any, str], Any] = field(default=lambda source, pipeline: source)
    # "module:function" (connection, lineage.SourceTable) -> the table's ``datasets.Dataset``
    dataset_of: str = ""
    # (source spec) -> whether a run may read this source's log in a reader process (False: its
    # reads cost less in the run's process, so `tidegate run` starts no reader process early)
    may_read_in_child: Callable[[Any], bool] = field(default=lambda source: True)
    # "module:function" (Source) -> whether its log is read in the run's process rather than in
    # a reader process (decoding costs no more there than shipping); "" when never
    reads_in_process: str = ""
    # whether reading the log holds what a newer run takes over from a stalled reader by its lease
    # epoch (a PostgreSQL slot): such a log is read only where the run holds its lease, never by a
    # Spark task of its own, whose session could name no epoch (spark/gathered.py)
    log_read_under_lease: bool = False

    def position_type(self) -> Any:
        return _load(self.position)

    def make(self, spec: Any, conn: Any, **kw: Any) -> Any:
        """The Source of the pipeline ``spec`` through the connection ``conn``."""
        return _load(self.source)(spec, conn, **kw)

    def light_reads(self, source: Any) -> bool:
        """Whether ``source`` (a Source of this kind) reads its log in the run's process."""
        return bool(self.reads_in_process) and _load(self.reads_in_process)(source)

    def dataset(self, conn: Any, table: Any) -> Any:
        """The dataset of a table (a ``lineage.SourceTable``) read through the connection ``conn``."""
        return _load(self.dataset_of)(conn, table)


def spark_settings(spec: Any) -> dict[str, str]:
    """The Spark settings the sinks of pipeline ``spec`` need of the deliver job's session (empty
    when its sink kinds need none): only a spec with such a sink starts Spark with them."""
    out: dict[str, str] = {}
    for name in dict.fromkeys(s.kind for s in spec.sinks):
        out.update(sink_kind(name).spark_settings())
    return out


def sink_kind(name: str) -> SinkKind:
    """The registered sink kind ``name``; ValueError naming the known ones otherwise."""
    return _kind(SINKS, name, "sink")


def source_kind(name: str) -> SourceKind:
    """The registered source kind ``name``; ValueError naming the known ones otherwise."""
    return _kind(SOURCES, name, "source")


def _kind(registry: Mapping[str, str], name: str, what: str) -> Any:
    if name not in registry:
        raise ValueError(f"unknown kind {name!r}; allowed: {', '.join(registry)} (the {what} kinds)")
    return importlib.import_module(registry[name]).KIND
