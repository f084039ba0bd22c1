"""Pipeline specs (``include/pipelines/<pipeline>.yaml``) as typed, validated objects.

The YAML format is the contract of README.md ("Pipelines"). Unknown fields are errors. Loading
and validation live in this module; every problem is reported as one line naming the file,
the field path and what is allowed.
"""

from __future__ import annotations

import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import filters, kinds
from .errors import SpecError

SOURCE_KINDS = tuple(kinds.SOURCES)
SINK_KINDS = tuple(kinds.SINKS)
COMMIT_POLICIES = ("required", "all", "quorum")
START_MODES = ("head", "earliest", "snapshot")
SCHEMA_CHANGE_POLICIES = ("continue", "halt")
POISON_POLICIES = ("halt", "dlq")
PLACEHOLDERS = ("pipeline", "db", "schema", "table")


@dataclass(frozen=True)
class SourceSpec:
    kind: str
    conn_id: str
    # "db.table" (MySQL) or "schema.table" (Postgres), fnmatch patterns, "!" excludes; () = all
    tables: tuple[str, ...] = ()
    # The kinds' own settings (their package's spec.py checks them; the others leave them unset):
    server_id: int | None = None  # mysql: replication client id
    slot: str | None = None  # postgres: logical replication slot
    plugin: str | None = None  # postgres: wal2json | pgoutput; None: the slot's, or what the server has
    publication: str | None = None  # postgres, pgoutput: the publication read; None: the pipeline's own
    start: str = "head"
    on_schema_change: str = "continue"  # continue | halt (a DDL on a captured table)
    # postgres: seconds release keeps the slot behind the checkpoints (replays, backfills, rewinds)
    replay_retention_s: int = 0
    # postgres: seconds the server keeps sending to a reader that takes nothing (a stopped, frozen
    # or cut-off run) before it drops the connection and frees the slot (0: never)
    stall_timeout_s: int = 120
    # column rules (exclude, mask, hash, truncate) per table or pattern (filters.py)
    columns: tuple[filters.ColumnRules, ...] = ()
    # where the salt of hashed columns comes from: ("conn_id", id) or ("variable", name)
    hash_salt: tuple[str, str] | None = None


@dataclass(frozen=True)
class BatchSpec:
    max_events: int = 50_000
    max_bytes: int = 64 * 1024 * 1024
    respect_source_tx: bool = True
    commit_policy: str = "required"
    quorum: int | None = None


@dataclass(frozen=True)
class SinkSpec:
    """What every sink has; the kind-specific settings live on the subclasses."""

    id: str
    kind: str
    conn_id: str
    required: bool = True
    on_poison: str = "halt"  # halt | dlq: an event this sink alone rejects
    dlq: str | None = None  # the DLQ destination (topic / subject / stream); default {pipeline}.__dlq
    control: str | None = None  # the control channel; default {pipeline}.__control ({pipeline}:__control)

    @property
    def guarantee(self) -> str:
        """What a consumer of this sink can rely on (a kind may promise more)."""
        return "at-least-once (dedup by idempotency_key)"

    @property
    def heartbeat_interval_ms(self) -> int:
        """How often the sink wants a heartbeat, idle source or not (0: never; a kind may)."""
        return 0


@dataclass(frozen=True)
class SnapshotSpec:
    """How snapshots read the tables (docs/architecture.md, "Snapshots"): primary-key chunks of
    at most ``chunk_rows`` rows, ``parallelism`` chunks read at once by Spark tasks."""

    chunk_rows: int = 50_000
    parallelism: int = 4


@dataclass(frozen=True)
class SparkSpec:
    conn_id: str = "spark_default"
    conf: dict[str, str] = field(default_factory=dict)
    packages: tuple[str, ...] = ()


@dataclass(frozen=True)
class PipelineSpec:
    pipeline: str
    source: SourceSpec
    sinks: tuple[SinkSpec, ...]
    batch: BatchSpec = BatchSpec()
    tenant: str = "default"
    schedule: str | None = None
    spark: SparkSpec = SparkSpec()
    snapshot: SnapshotSpec = SnapshotSpec()
    path: str | None = None  # the file it came from
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)
    text: str = field(default="", compare=False, repr=False)  # the YAML as written (Spark jobs get it)

    @property
    def dag_id(self) -> str:
        return f"cdc_{self.pipeline}"

    def replication_client(self) -> tuple[str, int | str | None]:
        """What this pipeline holds on its source server that no other reader may share: the
        MySQL replication client id (``server_id``, derived from the pipeline name when unset),
        or the PostgreSQL replication slot."""
        return kinds.source_kind(self.source.kind).replication_client(self)

    def sink(self, sink_id: str) -> SinkSpec:
        for s in self.sinks:
            if s.id == sink_id:
                return s
        raise KeyError(f"pipeline {self.pipeline!r} has no sink {sink_id!r}")


def render_template(template: str, *, pipeline: str, db: str, schema: str, table: str) -> str:
    """Fill a topic/subject/stream template ({pipeline}, {db}, {schema}, {table})."""
    return template.format(pipeline=pipeline, db=db, schema=schema, table=table)


# =========================================================================== loading

PIPELINE_RE = re.compile(r"^[a-z0-9_]+$")
SINK_ID_RE = re.compile(r"^[a-z0-9_-]+$")
TENANT_RE = re.compile(r"^[A-Za-z0-9_-]+$")
CONN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
# Tables are identifiers only: they reach SQL through the source, never by pasting.
TABLE_RE = re.compile(r"^[A-Za-z0-9_$]+\.[A-Za-z0-9_$]+$")  # (source.tables may hold patterns: filters.py)
CRON_FIELD = re.compile(r"^[A-Za-z0-9*/,?#LW-]+$")
SCHEDULE_PRESETS = ("@once", "@continuous", "@hourly", "@daily", "@weekly", "@monthly",
                    "@quarterly", "@yearly", "@annually")

TOP_FIELDS = ("pipeline", "tenant", "schedule", "source", "batch", "sinks", "spark", "snapshot")
# + the kind's own fields
SOURCE_COMMON = ("kind", "conn_id", "tables", "columns", "hash_salt", "start", "on_schema_change")
BATCH_FIELDS = ("max_events", "max_bytes", "respect_source_tx", "commit_policy", "quorum")
SPARK_FIELDS = ("conn_id", "conf", "packages")
SNAPSHOT_FIELDS = ("chunk_rows", "parallelism")
SINK_COMMON = ("id", "kind", "conn_id", "required", "on_poison", "dlq", "control")


def repo_dir() -> Path:
    """The project root: the folder holding include/, found from this file (editable and
    source checkouts); falls back to the working directory for an installed wheel."""
    here = Path(__file__).resolve().parent
    for cand in (here.parent.parent, *here.parents):
        if (cand / "include" / "tidegate").is_dir():
            return cand
    return Path.cwd()


DATA_DIR_ENV = "TIDEGATE_DATA_DIR"


def data_dir() -> str:
    """Where sinks that write files put them by default (a Delta sink's tables):
    ``$TIDEGATE_DATA_DIR``, else ``.state/data`` of the project. A spark-submit driver imports
    tidegate from the shipped zip, where no project folder can be found (:func:`repo_dir` falls
    back to the working directory): the deliver task hands it this folder, as the task sees it,
    in ``TIDEGATE_DATA_DIR``."""
    return os.environ.get(DATA_DIR_ENV) or str(repo_dir() / ".state" / "data")


def pipelines_dir() -> Path:
    env = os.environ.get("TIDEGATE_PIPELINES_DIR")
    return Path(env) if env else repo_dir() / "include" / "pipelines"


def spec_files(directory: str | os.PathLike | None = None) -> list[Path]:
    d = Path(directory) if directory is not None else pipelines_dir()
    return sorted(p for p in d.glob("*.y*ml") if p.suffix in (".yaml", ".yml"))


class Problems:
    """Collects problem lines "FILE: field.path: problem; allowed: ..."."""

    def __init__(self, path: str):
        self.path = path
        self.lines: list[str] = []

    def add(self, field_path: str, problem: str, allowed: str | None = None) -> None:
        line = f"{self.path}: {field_path}: {problem}"
        self.lines.append(line + (f"; allowed: {allowed}" if allowed else ""))


# libyaml's parser when PyYAML was built with it: the pure-Python one was 90% of reading a spec
# (2.5 ms of CPU each), and the DAG files read every spec of the folder at each parse.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _UniqueKeyLoader(_SafeLoader):
    """SafeLoader that refuses duplicate keys (YAML would silently keep the last one)."""


def _construct_mapping(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False):
    seen: set = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_text(path: Path, probs: Problems) -> str | None:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        probs.add("(file)", f"cannot read: {exc.strerror}")
        return None


def _read_yaml(text: str, probs: Problems) -> Any:
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(yaml)"
        what = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        probs.add(where, f"not valid YAML: {what}")
        return None


# --------------------------------------------------------------------------- field checks


def _unknown(d: dict, allowed: tuple[str, ...], prefix: str, probs: Problems) -> None:
    for k in d:
        if k not in allowed:
            probs.add(f"{prefix}{k}", "unknown field", ", ".join(allowed))


def _mapping(v: Any, fp: str, probs: Problems) -> dict | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        probs.add(fp, f"must be a mapping, got {type(v).__name__}")
        return None
    return v


def str_field(d: dict, key: str, fp: str, probs: Problems, *, required=False, pattern=None,
         allowed: str | None = None) -> str | None:
    v = d.get(key)
    if v is None:
        if required:
            probs.add(fp, "missing", allowed)
        return None
    if not isinstance(v, str) or not v:
        probs.add(fp, f"must be a non-empty string, got {v!r}", allowed)
        return None
    if pattern is not None and not pattern.match(v):
        probs.add(fp, f"malformed value {v!r}", allowed)
        return None
    return v


def int_field(d: dict, key: str, fp: str, probs: Problems, *, lo: int, hi: int | None = None,
         default: int | None = None) -> int | None:
    v = d.get(key)
    if v is None:
        return default
    rng = f"an integer >= {lo}" if hi is None else f"an integer in {lo}..{hi}"
    if isinstance(v, bool) or not isinstance(v, int) or v < lo or (hi is not None and v > hi):
        probs.add(fp, f"bad value {v!r}", rng)
        return default
    return v


def float_field(d: dict, key: str, fp: str, probs: Problems, *, default: float) -> float:
    v = d.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
        probs.add(fp, f"bad value {v!r}", "a positive number of seconds")
        return default
    return float(v)


def bool_field(d: dict, key: str, fp: str, probs: Problems, *, default: bool) -> bool:
    v = d.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        probs.add(fp, f"must be true or false, got {v!r}", "true, false")
        return default
    return v


def _choice(d: dict, key: str, fp: str, probs: Problems, choices: tuple[str, ...], *,
            default: str | None = None, required: bool = False) -> str | None:
    v = d.get(key)
    if v is None:
        if required:
            probs.add(fp, "missing", " | ".join(choices))
        return default
    if v not in choices:
        probs.add(fp, f"unknown value {v!r}", " | ".join(choices))
        return default
    return v


def template_field(d: dict, key: str, fp: str, probs: Problems, chars: re.Pattern, what: str,
              *, required: bool) -> str | None:
    """A sink name template: only the allowed placeholders, and legal literal characters."""
    v = str_field(d, key, fp, probs, required=required, allowed=f"a {what} template")
    if v is None:
        return None
    allowed = ", ".join("{" + p + "}" for p in PLACEHOLDERS)
    try:
        parts = list(string.Formatter().parse(v))
    except ValueError as exc:
        probs.add(fp, f"malformed template {v!r} ({exc})", allowed)
        return None
    for literal, name, spec_, conv in parts:
        if name is not None and (name not in PLACEHOLDERS or spec_ or conv):
            probs.add(fp, f"unknown placeholder {{{name}}} in {v!r}", allowed)
            return None
        if not chars.match(literal):
            probs.add(fp, f"illegal characters in {what} {v!r}",
                      f"letters, digits, '.', '_', '-' and {allowed}")
            return None
    return v


# --------------------------------------------------------------------------- sections


def _schedule(raw: dict, probs: Problems) -> str | None:
    v = raw.get("schedule")
    if v is None:
        return None
    allowed = "a 5-field cron expression, null, or one of " + ", ".join(SCHEDULE_PRESETS)
    if not isinstance(v, str):
        probs.add("schedule", f"bad value {v!r}", allowed)
        return None
    fields = v.split()
    if v.startswith("@"):
        ok = v in SCHEDULE_PRESETS
    else:
        ok = len(fields) in (5, 6) and all(CRON_FIELD.match(f) for f in fields)
    if not ok:
        probs.add("schedule", f"bad value {v!r}", allowed)
        return None
    return v


def _source(raw: Any, probs: Problems) -> SourceSpec | None:
    if raw is None:
        probs.add("source", "missing", "a mapping with kind, conn_id, ...")
        return None
    d = _mapping(raw, "source", probs)
    if d is None:
        return None
    kind_fields = {k: kinds.source_kind(k).fields for k in SOURCE_KINDS}
    _unknown(d, tuple(dict.fromkeys(SOURCE_COMMON + sum(kind_fields.values(), ()))), "source.", probs)
    kind = _choice(d, "kind", "source.kind", probs, SOURCE_KINDS, required=True)
    conn_id = str_field(d, "conn_id", "source.conn_id", probs, required=True, pattern=CONN_ID_RE,
                        allowed="an Airflow connection id")
    tables = filters.parse_tables(d.get("tables"), probs)
    columns = filters.parse_columns(d.get("columns"), tables, probs)
    hash_salt = filters.parse_salt(d.get("hash_salt"), d.get("columns"), probs)
    own: dict[str, Any] = {}
    if kind is not None:
        for f in dict.fromkeys(sum(kind_fields.values(), ())):  # another kind's setting
            if d.get(f) is not None and f not in kind_fields[kind]:
                owners = " and ".join(k for k, fs in kind_fields.items() if f in fs)
                probs.add(f"source.{f}", f"only for {owners} sources", f"omit it for {kind}")
        own = kinds.source_kind(kind).parse(d, probs)
    start = _choice(d, "start", "source.start", probs, START_MODES, default="head")
    if kind is None or conn_id is None:
        return None
    on_ddl = _choice(d, "on_schema_change", "source.on_schema_change", probs, SCHEMA_CHANGE_POLICIES,
                     default="continue")
    return SourceSpec(kind, conn_id, tables, start=start or "head", on_schema_change=on_ddl or "continue",
                      columns=columns, hash_salt=hash_salt, **own)


def _batch(raw: Any, n_sinks: int, any_required: bool, probs: Problems) -> BatchSpec:
    d = _mapping(raw, "batch", probs) or {}
    _unknown(d, BATCH_FIELDS, "batch.", probs)
    dflt = BatchSpec()
    policy = _choice(d, "commit_policy", "batch.commit_policy", probs, COMMIT_POLICIES,
                     default=dflt.commit_policy)
    quorum = int_field(d, "quorum", "batch.quorum", probs, lo=-(2**63))
    if quorum is not None and not 1 <= quorum <= max(n_sinks, 1):
        probs.add("batch.quorum", f"{quorum} is outside 1..{n_sinks}",
                  f"an integer in 1..{n_sinks} (the number of sinks)")
    if policy == "quorum" and d.get("quorum") is None:
        probs.add("batch.quorum", "missing for commit_policy quorum", f"an integer in 1..{n_sinks}")
    if policy == "required" and n_sinks and not any_required:
        probs.add("batch.commit_policy", "'required' but no sink has required: true",
                  "mark a sink required, or use commit_policy all | quorum")
    return BatchSpec(
        max_events=int_field(d, "max_events", "batch.max_events", probs, lo=1, default=dflt.max_events),
        max_bytes=int_field(d, "max_bytes", "batch.max_bytes", probs, lo=1, default=dflt.max_bytes),
        respect_source_tx=bool_field(d, "respect_source_tx", "batch.respect_source_tx", probs,
                                default=True),
        commit_policy=policy,
        quorum=quorum,
    )


def _sinks(raw: Any, probs: Problems) -> tuple[tuple[SinkSpec, ...], int]:
    """The parsed sinks, and how many entries the file lists (for the quorum range)."""
    if raw is None:
        probs.add("sinks", "missing", "a non-empty list of sinks")
        return (), 0
    if not isinstance(raw, list) or not raw:
        probs.add("sinks", "must be a non-empty list", "a list of {id, kind, conn_id, ...}")
        return (), 0
    out: list[SinkSpec] = []
    seen: set[str] = set()
    for i, item in enumerate(raw):
        s = _sink(item, f"sinks[{i}]", probs)
        if s is None:
            continue
        if s.id in seen:
            probs.add(f"sinks[{i}].id", f"duplicate sink id {s.id!r}", "ids unique within the pipeline")
            continue
        seen.add(s.id)
        out.append(s)
    return tuple(out), len(raw)


def _any_required(raw: Any) -> bool:
    """From the raw entries, so one malformed sink does not add a second, derived problem."""
    items = raw if isinstance(raw, list) else []
    return any(not isinstance(i, dict) or i.get("required", True) is not False for i in items)


def _sink(raw: Any, fp: str, probs: Problems) -> SinkSpec | None:
    d = _mapping(raw, fp, probs)
    if d is None:
        if raw is None:
            probs.add(fp, "empty sink entry", "a mapping with id, kind, conn_id")
        return None
    kind = _choice(d, "kind", f"{fp}.kind", probs, SINK_KINDS, required=True)
    sink_kind = kinds.sink_kind(kind) if kind is not None else None
    # With an unknown kind, only fields no kind knows are reported (the kind is the problem).
    own = sink_kind.fields if sink_kind else tuple(f for k in SINK_KINDS for f in kinds.sink_kind(k).fields)
    _unknown(d, tuple(dict.fromkeys(SINK_COMMON + own)), f"{fp}.", probs)
    sid = str_field(d, "id", f"{fp}.id", probs, required=True, pattern=SINK_ID_RE, allowed="[a-z0-9_-]+")
    needs_conn = sink_kind.needs_connection if sink_kind else True
    conn_id = str_field(d, "conn_id", f"{fp}.conn_id", probs, required=needs_conn, pattern=CONN_ID_RE,
                   allowed="an Airflow connection id")
    required = bool_field(d, "required", f"{fp}.required", probs, default=True)
    if sink_kind is None or sid is None or (conn_id is None and needs_conn):
        return None
    on_poison = _choice(d, "on_poison", f"{fp}.on_poison", probs, POISON_POLICIES, default="halt")
    # a DLQ or control channel name may hold what the kind's data names may hold
    chars, what = sink_kind.channel_chars, sink_kind.channel_what
    dlq = _channel(d, "dlq", f"{fp}.dlq", probs, chars, what)
    control = _channel(d, "control", f"{fp}.control", probs, chars, what)
    if d.get("dlq") is not None and on_poison != "dlq":
        probs.add(f"{fp}.dlq", "set but on_poison is not dlq", "on_poison: dlq, or omit dlq")
    return sink_kind.spec_type(id=sid, kind=sink_kind.name, conn_id=conn_id or "", required=required,
                               on_poison=on_poison or "halt", dlq=dlq, control=control,
                               **sink_kind.parse_entry(d, fp, probs))


def _channel(d: dict, key: str, fp: str, probs: Problems, chars: re.Pattern, what: str) -> str | None:
    """A per-pipeline channel name (DLQ, control): only ``{pipeline}`` may vary in it."""
    v = template_field(d, key, fp, probs, chars, what, required=False)
    if v is not None and any(f"{{{p}}}" in v for p in PLACEHOLDERS if p != "pipeline"):
        probs.add(fp, f"{v!r} names a table part; one {key} channel serves the whole pipeline",
                  "a name with at most {pipeline}")
        return None
    return v


# Where a run of a Spark Connect connection delivers (spark/delivery.py): a key of spark.conf,
# read there, checked here so a bad value fails the spec's load.
DELIVERY_CONF = "spark.tidegate.delivery"
DELIVERY_MODES = ("auto", "gathered", "executor", "client")


def _spark(raw: Any, probs: Problems) -> SparkSpec:
    d = _mapping(raw, "spark", probs) or {}
    _unknown(d, SPARK_FIELDS, "spark.", probs)
    conn_id = str_field(d, "conn_id", "spark.conn_id", probs, pattern=CONN_ID_RE,
                   allowed="an Airflow connection id") or "spark_default"
    conf = d.get("conf") or {}
    if not isinstance(conf, dict) or not all(isinstance(k, str) for k in conf):
        probs.add("spark.conf", "must be a mapping of Spark settings", "{spark.key: value}")
        conf = {}
    delivery = str(conf.get(DELIVERY_CONF, "auto"))
    if delivery not in DELIVERY_MODES:
        probs.add(f"spark.conf.{DELIVERY_CONF}", f"{delivery!r} is not a delivery mode",
                  ", ".join(DELIVERY_MODES) + " (where a Spark Connect run delivers: docs/operations.md)")
    packages = d.get("packages") or []
    if not isinstance(packages, list) or not all(isinstance(p, str) and p for p in packages):
        probs.add("spark.packages", "must be a list of Maven coordinates", "[group:artifact:version]")
        packages = []
    return SparkSpec(conn_id, {k: str(v) for k, v in conf.items()}, tuple(packages))


def _snapshot(raw: Any, probs: Problems) -> SnapshotSpec:
    d = _mapping(raw, "snapshot", probs) or {}
    _unknown(d, SNAPSHOT_FIELDS, "snapshot.", probs)
    dflt = SnapshotSpec()
    return SnapshotSpec(
        chunk_rows=int_field(d, "chunk_rows", "snapshot.chunk_rows", probs, lo=1, default=dflt.chunk_rows),
        parallelism=int_field(d, "parallelism", "snapshot.parallelism", probs, lo=1, hi=1024,
                         default=dflt.parallelism))


# --------------------------------------------------------------------------- public API


def _parse(raw: Any, path: str | None, text: str, probs: Problems) -> PipelineSpec | None:
    if not isinstance(raw, dict):
        probs.add("(top)", "the file must be a YAML mapping", "pipeline, source, sinks, ...")
        return None
    _unknown(raw, TOP_FIELDS, "", probs)
    name = str_field(raw, "pipeline", "pipeline", probs, required=True, pattern=PIPELINE_RE,
                allowed="[a-z0-9_]+")
    tenant = str_field(raw, "tenant", "tenant", probs, pattern=TENANT_RE, allowed="[A-Za-z0-9_-]+")
    schedule = _schedule(raw, probs)
    source = _source(raw.get("source"), probs)
    sinks, n_listed = _sinks(raw.get("sinks"), probs)
    batch = _batch(raw.get("batch"), n_listed, _any_required(raw.get("sinks")), probs)
    spark = _spark(raw.get("spark"), probs)
    snapshot = _snapshot(raw.get("snapshot"), probs)
    if probs.lines or name is None or source is None:
        return None
    source = kinds.source_kind(source.kind).complete(source, name)
    return PipelineSpec(pipeline=name, source=source, sinks=sinks, batch=batch,
                        tenant=tenant or "default", schedule=schedule, spark=spark,
                        snapshot=snapshot, path=path, raw=raw, text=text)


def _check(path: str | os.PathLike) -> tuple[PipelineSpec | None, list[str]]:
    probs = Problems(str(path))
    text = _read_text(Path(path), probs)
    if text is None:
        return None, probs.lines
    return _check_text(text, str(path), str(path), probs)


def _check_text(text: str, origin: str, path: str | None, probs: Problems
                ) -> tuple[PipelineSpec | None, list[str]]:
    raw = _read_yaml(text, probs)
    if probs.lines:
        return None, probs.lines
    return _parse(raw, path, text, probs), probs.lines


def validate_file(path: str | os.PathLike) -> list[str]:
    """Every problem of one spec file, one line each; [] when valid."""
    return _check(path)[1]


def load_spec(path: str | os.PathLike) -> PipelineSpec:
    """Load one spec; raises :class:`SpecError` listing every problem."""
    spec, problems = _check(path)
    if problems or spec is None:
        raise SpecError(problems or [f"{path}: (file): invalid spec"])
    return spec


def load_spec_text(text: str, origin: str = "<spec>") -> PipelineSpec:
    """A spec from its YAML text (a Spark job receives the spec this way); problems name
    ``origin`` instead of a file."""
    spec, problems = _check_text(text, origin, None, Problems(origin))
    if problems or spec is None:
        raise SpecError(problems or [f"{origin}: invalid spec"])
    return spec
