"""Where every pipeline stands: halted or not, open incidents and how to resolve them, each sink's
checkpoint, version, age and lag, and what the last runs delivered per sink.

One function, :func:`pipelines_status`, feeds the tidegate page in the Airflow UI, the metrics
emitted by the DAG tasks (also when a run fails) and, later, ``tidegate status``. Its output is a
superset of the ``status --json`` document of docs (``pipeline``, ``halted``, ``incidents`` with
``kind/from/to/detected_at/resolved``, ``sinks`` with ``id/position/version/updated_at``).

Lag is measured against the source head read now (one cheap query per pipeline, bounded by
``head_timeout_s``; a source that does not answer leaves the lag unknown and says why):

* ``lag_bytes``: source log bytes from the sink's checkpoint to the head (PostgreSQL: LSN
  difference; MySQL/MariaDB: binlog bytes, across files from ``SHOW BINARY LOGS``).
* ``lag_seconds``: 0 when the checkpoint is at the head; otherwise the seconds since the sink's
  checkpoint last moved (the sink holds nothing newer than that), a lower bound of how old the
  oldest change it misses is.
* ``checkpoint_age_seconds``: seconds since the checkpoint's current version was written.

Positions come as JSON and, beside it, as people read them (``*_text``: MariaDB/MySQL
``file:pos [gtid set]``, PostgreSQL ``X/Y``). ``history`` is the run journal per run (oldest first):
events delivered and the lag each run found (:func:`run_history`), for the page's charts.

With the head, the pipeline's ``log_held`` says what the server keeps of its log for the
pipeline (PostgreSQL: the slot, its ``restart_lsn`` and the WAL ``bytes`` from there to the
current WAL LSN, the cost of ``source.replay_retention``; None for a binlog, kept for the
server's own expiry).

No Airflow import here: callers hand in the :class:`~tidegate.parts.Parts` sources are made by
(default: connections from ``AIRFLOW_CONN_*``).
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from .catalog import lookup, scan
from .errors import TidegateError
from .parts import Parts
from .positions import Position, position_from_json, position_text, position_to_json, same_lineage
from .spec import PIPELINE_RE, PipelineSpec, pipelines_dir
from .store import CheckpointStore, open_store

log = logging.getLogger(__name__)

RUNS_SHOWN = 5
HISTORY_RUNS = 20  # runs the page charts


def resolve_params(incident_kind: str) -> list[dict[str, Any]]:
    """The trigger params (``dag_run.conf``) that resolve an open incident, one dict per way."""
    if incident_kind == "schema_change":
        return [{"resolve": "continue", "reason": "<why consumers can take the new schema>"}]
    return [{"resolve": "accept_gap", "reason": "<why losing the changes in this range is acceptable>"},
            {"resolve": "resnapshot", "reason": "<why the tables are re-loaded over the lost range>"}]


def pipelines_status(*, store: CheckpointStore | None = None, pipelines: Iterable[str] | None = None,
                     parts: Parts | None = None, with_lag: bool = True, runs: int = RUNS_SHOWN,
                     head_timeout_s: float = 5.0, now: dt.datetime | None = None,
                     include: Callable[[str], bool] | None = None) -> dict[str, Any]:
    """The status document of every pipeline (spec files and pipelines the store knows), or of
    the named ones, of those ``include`` accepts (e.g. what a user may see; decided before any
    source is asked for its head). Never raises for one pipeline's trouble (a broken spec, an
    unreachable source): it is reported in that pipeline's entry. ``spec_errors``: the problems
    of the whole folder; with named pipelines, only their specs are read (a failed task's
    metrics cost the same beside 10 or 500 pipelines) and it holds their own files' problems."""
    now = now or dt.datetime.now(dt.UTC)
    own = store is None
    store = store or open_store()
    try:
        if pipelines is None:
            catalog = scan()
            specs, spec_errors = catalog.by_name(), catalog.problems
            names = sorted(set(specs) | set(store.checkpoints.pipelines()))
        else:
            names = [n for n in pipelines if include is None or include(n)]
            specs, spec_errors = _named_specs(names)
        names = [n for n in names if include is None or include(n)]
        shown = [specs[n] for n in names if n in specs]
        heads = _heads(shown, parts or Parts(), head_timeout_s) if with_lag else {}
        return {"generated_at": now.isoformat(timespec="seconds"), "store": store.url,
                "spec_errors": spec_errors,
                "pipelines": [pipeline_status(store, n, specs.get(n), heads.get(n), runs=runs, now=now)
                              for n in names]}
    finally:
        if own:
            store.close()


def _named_specs(names: list[str]) -> tuple[dict[str, PipelineSpec], list[str]]:
    """The valid specs of the named pipelines, and the problems of their files."""
    folder = pipelines_dir()
    specs: dict[str, PipelineSpec] = {}
    problems: list[str] = []
    for name in dict.fromkeys(names):
        if not PIPELINE_RE.match(name):  # no spec can define it (nor may it name a path)
            continue
        spec, broken = lookup(name, folder)
        problems.extend(broken)
        if spec is not None:
            specs[name] = spec
    return specs, problems


def pipeline_status(store: CheckpointStore, name: str, spec: PipelineSpec | None,
                    head: tuple[Any, ...] | None = None, *, runs: int = RUNS_SHOWN,
                    now: dt.datetime | None = None) -> dict[str, Any]:
    """One pipeline's entry. ``head`` is ``(position, log_files, error)`` from the source, and
    optionally the log it holds for the pipeline (``Source.log_held``), or None when the lag is
    not wanted."""
    now = now or dt.datetime.now(dt.UTC)
    head_pos, files, head_error, log_held = (*(head or (None, None, None)), None)[:4]
    incidents = store.incidents.all(name)
    ckpts = store.checkpoints.current(name)
    sink_specs = {s.id: s for s in spec.sinks} if spec else {}
    sink_ids = list(sink_specs) + [sid for sid in ckpts if sid not in sink_specs]
    journal = store.runs.entries(name)
    dead = {sid: sum(e.sinks[sid].dlq for e in journal if sid in e.sinks) for sid in sink_ids}
    sinks = []
    for sid in sink_ids:
        rec = ckpts.get(sid)
        s = sink_specs.get(sid)
        entry = {"id": sid, "kind": getattr(s, "kind", None), "required": getattr(s, "required", None),
                 "position": position_to_json(rec.position) if rec else None,
                 "position_text": position_text(rec.position) if rec else None,
                 "version": rec.version if rec else None, "updated_at": rec.written_at if rec else None,
                 "checkpoint_age_seconds": _age(rec.written_at, now) if rec else None,
                 "at_head": None, "lag_bytes": None, "lag_seconds": None, "dlq": dead[sid]}
        if rec is not None and head_pos is not None:
            entry.update(_lag(rec, head_pos, files, now))
        sinks.append(entry)
    open_incidents = [i for i in incidents if not i.resolved]
    return {
        "pipeline": name,
        "tenant": spec.tenant if spec else None,
        "identity": store.checkpoints.source_identity(name),
        "failovers": [{"incident": i.id, "detected_at": i.detected_at, "detail": i.detail,
                       "from": position_to_json(i.from_position), "to": position_to_json(i.to_position),
                       "resolution": i.resolution} for i in incidents if i.kind == "failover"],
        "dag_id": f"cdc_{name}",
        "source_kind": spec.source.kind if spec else None,
        "schedule": spec.schedule if spec else None,
        "has_spec": spec is not None,
        "halted": bool(open_incidents),
        "head": position_to_json(head_pos) if head_pos is not None else None,
        "head_text": position_text(head_pos),
        "head_error": head_error,
        "log_held": log_held,
        "incidents": [{**i.to_json(), "from_text": position_text(i.from_position),
                       "to_text": position_text(i.to_position), "resolved_at": i.resolved_at,
                       "resolve_with": [] if i.resolved else resolve_params(i.kind)}
                      for i in incidents],
        "incidents_open": len(open_incidents),
        "sinks": sinks,
        "runs": recent_runs(store, name, runs),
        "history": run_history(journal),
        "snapshots": [s.to_json() for s in store.snapshots.all(name)[-runs:]],  # snapshots (newest last)
    }


def recent_runs(store: CheckpointStore, pipeline: str, limit: int = RUNS_SHOWN) -> list[dict[str, Any]]:
    """The last journaled runs, newest first, with what each sink received."""
    entries = store.runs.entries(pipeline)[-limit:] if limit else []
    return [{"run_id": e.run_id, "mode": e.mode, "status": e.status, "started_at": e.started_at,
             "finished_at": e.finished_at,
             "sinks": {sid: {"events": js.events, "bytes": js.bytes, "status": js.status,
                             "start": position_to_json(js.start),
                             "end": position_to_json(js.end), "error": js.error, "dlq": js.dlq}
                       for sid, js in e.sinks.items()}}
            for e in reversed(entries)]


def run_history(journal: list[Any], limit: int = HISTORY_RUNS) -> list[dict[str, Any]]:
    """Per journaled run, oldest first (the last ``limit``), what the page charts. Per sink:

    * ``events``: the events it received;
    * ``lag_bytes``: source log bytes from its checkpoint at the run's start to where the run
      took it (how far behind it was when the run read its bound; None when unknown: no
      checkpoint yet, a failed delivery, or a MariaDB range across binlog files, whose sizes
      the journal does not keep);
    * ``lag_seconds``: from the previous journaled run's start to this run's end, an upper
      bound of how long a change this run delivered waited (it was written after the previous
      run read its bound). None for the first run journaled.

    ``events``, ``lag_bytes`` and ``lag_seconds`` of the run itself are the largest over its
    sinks (the sink furthest behind)."""
    shown = journal[-(limit + 1):] if limit else []
    out = []
    previous = [None, *shown[:-1]] if shown else []
    for prev, e in zip(previous, shown, strict=True):
        if len(shown) > limit and prev is None:
            continue  # the entry before the window: only the previous run of the first shown
        waited = _seconds_between(prev.started_at, e.finished_at) if prev is not None else None
        sinks = {sid: {"events": js.events, "lag_seconds": waited,
                       "lag_bytes": js.start.bytes_to(js.end) if js.start and js.end else None}
                 for sid, js in e.sinks.items()}
        out.append({"run_id": e.run_id, "mode": e.mode, "status": e.status, "started_at": e.started_at,
                    "finished_at": e.finished_at, "sinks": sinks,
                    "events": _largest(s["events"] for s in sinks.values()),
                    "lag_bytes": _largest(s["lag_bytes"] for s in sinks.values()),
                    "lag_seconds": waited})
    return out


def _largest(values: Iterable[Any]) -> Any:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def _seconds_between(a: str | None, b: str | None) -> float | None:
    if not a or not b:
        return None
    try:
        ta, tb = (dt.datetime.fromisoformat(t) for t in (a, b))
    except ValueError:
        return None
    ta, tb = (t if t.tzinfo else t.replace(tzinfo=dt.UTC) for t in (ta, tb))
    return round(max(0.0, (tb - ta).total_seconds()), 3)


# --------------------------------------------------------------------------- helpers


def _heads(specs: list[PipelineSpec], parts: Parts, timeout_s: float
           ) -> dict[str, tuple[Any, ...]]:
    """Each source's head (and the log it holds), read in parallel threads; a source slower than
    ``timeout_s`` is reported as such and left behind (daemon thread), so a page never hangs on a
    dead server."""
    out: dict[str, tuple[Any, ...]] = {}
    threads = []
    for spec in specs:
        t = threading.Thread(target=_read_head, args=(spec, parts, out), daemon=True,
                             name=f"tidegate-head-{spec.pipeline}")
        t.start()
        threads.append((spec, t))
    deadline = _monotonic() + timeout_s
    for spec, t in threads:
        t.join(max(0.0, deadline - _monotonic()))
        if t.is_alive():
            out.setdefault(spec.pipeline, (None, None, f"the source did not answer within {timeout_s:g}s"))
    return out


def _monotonic() -> float:
    return time.monotonic()


def _read_head(spec: PipelineSpec, parts: Parts, out: dict) -> None:
    try:
        source = parts.source(spec, reads_rows=False)
        try:
            head, sizes, held = source.head(), source.log_sizes(), source.log_held()
        finally:
            source.close()
        out[spec.pipeline] = (head, sizes, None, held)
    except (TidegateError, OSError, ValueError) as exc:
        out[spec.pipeline] = (None, None, f"{type(exc).__name__}: {exc}")
    except Exception as exc:  # noqa: BLE001 - a driver's own error class: report it, never raise
        out[spec.pipeline] = (None, None, f"{type(exc).__name__}: {exc}")


def _lag(rec: Any, head: Position, sizes: dict[str, int] | None, now: dt.datetime) -> dict[str, Any]:
    if not same_lineage(rec.position, head):
        return {"at_head": None, "lag_bytes": None, "lag_seconds": None}  # another server's checkpoint
    lag = rec.position.bytes_to(head, sizes)
    at_head = not head > rec.position
    return {"at_head": at_head, "lag_bytes": lag,
            "lag_seconds": 0.0 if at_head else _age(rec.written_at, now)}


def log_bytes_between(frm: Any, to: Any, files: list[tuple[str, int]] | None = None) -> int | None:
    """Source log bytes from ``frm`` to ``to`` (positions or their JSON), see ``bytes_to``."""
    a, b = (position_from_json(p) if isinstance(p, dict) else p for p in (frm, to))
    return a.bytes_to(b, dict(files or [])) if a is not None and b is not None else None


def _age(iso: str | None, now: dt.datetime) -> float | None:
    if not iso:
        return None
    try:
        t = dt.datetime.fromisoformat(iso)
    except ValueError:
        return None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return round(max(0.0, (now - t).total_seconds()), 3)
