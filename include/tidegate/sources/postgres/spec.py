"""The ``source:`` section of a spec with ``kind: postgres`` (README.md, "Pipelines"): the fields
only this kind reads (``slot``, ``replay_retention``, ``stall_timeout``, ``plugin``,
``publication``) and their checks. Light: no client library (DAG parsing loads specs)."""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from ...datasets import Dataset, host_port, on_server
from ...spec import PipelineSpec, Problems, SourceSpec, str_field

SLOT_RE = re.compile(r"^[a-z0-9_]+$")
# pgoutput's publication_names folds unquoted names to lower case: lower-case names only
PUBLICATION_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
PLUGINS = ("wal2json", "pgoutput")  # the logical decoding output plugins the source reads
DURATION_RE = re.compile(r"^(\d+)\s*([smhd])$")
DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
FIELDS = ("slot", "replay_retention", "stall_timeout", "plugin", "publication")
STALL_TIMEOUT_S = 120


def parse(d: dict, probs: Problems) -> dict[str, Any]:
    plugin = _plugin(d, probs)
    publication = str_field(d, "publication", "source.publication", probs, pattern=PUBLICATION_RE,
                            allowed="an existing publication's name: [a-z_][a-z0-9_]*, at most 63 characters")
    if publication is not None and plugin == "wal2json":
        probs.add("source.publication", "only read with plugin: pgoutput (source.plugin is wal2json)",
                  "omit it, or set source.plugin: pgoutput")
    return {"slot": str_field(d, "slot", "source.slot", probs, pattern=SLOT_RE, allowed="[a-z0-9_]+"),
            "replay_retention_s": _replay_retention(d, probs), "plugin": plugin, "publication": publication,
            "stall_timeout_s": _stall_timeout(d, probs)}


def _plugin(d: dict, probs: Problems) -> str | None:
    """``source.plugin``: the slot's output plugin; None (left out): the existing slot's, or for
    a new slot the first the server takes of ``source.new_slot_plugins`` (sources/postgres/slot.py)."""
    v = d.get("plugin")
    if v is None or v in PLUGINS:
        return v
    probs.add("source.plugin", f"unknown value {v!r}", " | ".join(PLUGINS) + " (leave it out: the slot's "
              "plugin, or for a new slot what the server offers)")
    return None


def _replay_retention(d: dict, probs: Problems) -> int:
    """``source.replay_retention``: how long release keeps the slot behind the checkpoints, as a
    duration (``24h``, ``90m``, ``3600s``, ``7d``; ``0``: not at all)."""
    return _duration(d, "replay_retention", 0, probs, "a duration such as 24h, 90m, 3600s or 7d, or 0 (no "
                     "replay window: release moves the slot to the checkpoints)")


def _stall_timeout(d: dict, probs: Problems) -> int:
    """``source.stall_timeout``: how long the server keeps sending to a reader that takes nothing
    (its run stopped, frozen or cut off) before it drops the replication connection, which frees
    the slot for the next run (the WAL sender's ``tcp_user_timeout``); a duration (``2m``,
    ``30s``), default 2m; ``0``: never (a stalled run then holds the slot until it is killed)."""
    return _duration(d, "stall_timeout", STALL_TIMEOUT_S, probs, "a duration such as 2m or 30s, or 0 "
                     "(never: a stalled run holds the slot until it is killed)")


def _duration(d: dict, field: str, default: int, probs: Problems, fix: str) -> int:
    """``source.<field>`` in seconds: left out, ``default``; ``0`` or ``"0"``, 0; a bad value is a
    problem naming the field (and ``default`` stands in)."""
    v = d.get(field)
    if v is None:
        return default
    if (v == 0 and not isinstance(v, bool)) or (isinstance(v, str) and v.strip() == "0"):
        return 0
    m = DURATION_RE.match(v.strip()) if isinstance(v, str) else None
    if m is None:
        hint = " (a number needs a unit)" if type(v) in (int, float) else ""
        probs.add(f"source.{field}", f"bad value {v!r}{hint}", fix)
        return default
    return int(m.group(1)) * DURATION_UNITS[m.group(2)]


def complete(source: SourceSpec, pipeline: str) -> SourceSpec:
    """The slot defaults to ``tidegate_<pipeline>``."""
    return source if source.slot is not None else dataclasses.replace(source, slot=f"tidegate_{pipeline}")


def may_read_in_child(source: SourceSpec) -> bool:
    """A pgoutput slot's rows, compiled, cost less in the run's process than shipped from a
    reader process (``source.light_log_reads``): a spec that names pgoutput (or a
    publication, which only pgoutput reads) needs no reader process started early."""
    return source.plugin != "pgoutput" and source.publication is None


def replication_client(spec: PipelineSpec) -> tuple[str, str | None]:
    """The pipeline's replication slot."""
    return "slot", spec.source.slot


def dataset(conn: Any, table: Any) -> Dataset:
    """OpenLineage's PostgreSQL naming: ``postgres://<host>:<port>``, ``<database>.<schema>.<table>``."""
    return on_server(f"postgres://{host_port(conn, 5432)}", f"{table.database}.{table.name}")
