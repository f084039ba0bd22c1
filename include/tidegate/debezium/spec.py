"""A sink entry's ``envelope`` and ``debezium:`` fields and their checks. Light: no client
library, nothing beyond the standard library and the spec helpers (DAG parsing loads specs)."""

from __future__ import annotations

import re
from typing import Any

from ..spec import Problems, bool_field, int_field, str_field
from .envelope import CONNECTORS, DebeziumOptions
from .values import BIGINT_UNSIGNED_MODES, BINARY_MODES, DECIMAL_MODES, TIME_MODES

ENVELOPES = ("tidegate", "debezium")
OPTION_FIELDS = ("topic_prefix", "schemas", "tombstones_on_delete", "skipped_operations",
                 "transaction_metadata", "schema_change_topic", "heartbeat_interval_ms", "connector",
                 "decimal_handling_mode", "time_precision_mode", "binary_handling_mode",
                 "bigint_unsigned_handling_mode")
_PREFIX = re.compile(r"^[A-Za-z0-9._-]+$")
_CHOICES = {"connector": CONNECTORS, "decimal_handling_mode": DECIMAL_MODES,
            "time_precision_mode": TIME_MODES, "binary_handling_mode": BINARY_MODES,
            "bigint_unsigned_handling_mode": BIGINT_UNSIGNED_MODES}
_OPERATIONS = ("c", "u", "d", "t", "none")


def parse(d: dict, fp: str, probs: Problems) -> dict[str, Any]:
    """``envelope`` (tidegate | debezium) and ``debezium`` (a DebeziumOptions or None) of a
    sink entry; ``debezium:`` options without ``envelope: debezium`` are an error."""
    envelope = d.get("envelope", "tidegate")
    if envelope not in ENVELOPES:
        probs.add(f"{fp}.envelope", f"unknown value {envelope!r}", " | ".join(ENVELOPES))
        envelope = "tidegate"
    raw = d.get("debezium")
    if raw is not None and not isinstance(raw, dict):
        probs.add(f"{fp}.debezium", f"must be a mapping, got {type(raw).__name__}")
        raw = None
    if raw is not None and envelope != "debezium":
        probs.add(f"{fp}.debezium", "debezium options need envelope: debezium", "envelope: debezium")
    if envelope != "debezium":
        return {"envelope": envelope, "debezium": None}
    return {"envelope": envelope, "debezium": options(raw or {}, f"{fp}.debezium", probs)}


def options(d: dict, fp: str, probs: Problems) -> DebeziumOptions:
    for k in d:
        if k not in OPTION_FIELDS:
            probs.add(f"{fp}.{k}", "unknown field", ", ".join(OPTION_FIELDS))
    dflt = DebeziumOptions()
    kw: dict[str, Any] = {}
    for name, choices in _CHOICES.items():
        v = d.get(name)
        if v is None:
            continue
        if v not in choices:
            probs.add(f"{fp}.{name}", f"unknown value {v!r}", " | ".join(choices))
            continue
        kw[name] = v
    skipped = d.get("skipped_operations")
    if skipped is not None:
        items = [s.strip() for s in skipped.split(",")] if isinstance(skipped, str) else skipped
        if not isinstance(items, list) or any(i not in _OPERATIONS for i in items):
            probs.add(f"{fp}.skipped_operations", f"bad value {skipped!r}",
                      "a list of c, u, d, t (or [] / none: skip nothing)")
        else:
            kw["skipped_operations"] = tuple(i for i in items if i != "none")
    return DebeziumOptions(
        topic_prefix=str_field(d, "topic_prefix", f"{fp}.topic_prefix", probs, pattern=_PREFIX,
                               allowed="letters, digits, '.', '_', '-'") or "",
        schemas=bool_field(d, "schemas", f"{fp}.schemas", probs, default=dflt.schemas),
        tombstones_on_delete=bool_field(d, "tombstones_on_delete", f"{fp}.tombstones_on_delete", probs,
                                        default=dflt.tombstones_on_delete),
        transaction_metadata=bool_field(d, "transaction_metadata", f"{fp}.transaction_metadata", probs,
                                        default=dflt.transaction_metadata),
        schema_change_topic=bool_field(d, "schema_change_topic", f"{fp}.schema_change_topic", probs,
                                       default=dflt.schema_change_topic),
        heartbeat_interval_ms=int_field(d, "heartbeat_interval_ms", f"{fp}.heartbeat_interval_ms", probs,
                                        lo=0, default=dflt.heartbeat_interval_ms) or 0,
        **kw)
