"""The pipeline catalogue: the spec files of the pipelines folder, read one file at a time.

Every face of tidegate finds pipelines here (the DAG factory, the operators, the CLI, the
Spark job), so they agree on what a folder holds: one invalid file costs only its own
pipeline, and a file that reuses an earlier file's pipeline name is a problem of the later one.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import SpecError, TidegateError
from .spec import PipelineSpec, load_spec, pipelines_dir, spec_files


class PipelineNotFoundError(TidegateError):
    """No valid spec in the pipelines folder defines the pipeline."""

    fatal = True


@dataclass(frozen=True)
class Catalog:
    folder: Path
    specs: list[PipelineSpec] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # one line per problem: file, field, what

    def by_name(self) -> dict[str, PipelineSpec]:
        return {s.pipeline: s for s in self.specs}


def scan(directory: str | os.PathLike | None = None) -> Catalog:
    """Every valid spec of the folder (sorted by file name) and the problems of the others.
    Each file is read once, and the folder's cost grows with its number of files only: each
    spec's replication client is looked up once in an index of the earlier ones."""
    folder = Path(directory) if directory is not None else pipelines_dir()
    specs: list[PipelineSpec] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    clients: dict[tuple, PipelineSpec] = {}  # (connection, "server_id" | "slot", value) -> its holder
    for path in spec_files(folder):
        try:
            spec = load_spec(path)
        except SpecError as exc:
            problems.extend(exc.problems)
            continue
        if spec.pipeline in seen:
            problems.append(f"{path}: pipeline: {spec.pipeline!r} is already defined in "
                            f"{seen[spec.pipeline]}; allowed: one file per pipeline")
            continue
        client = (spec.source.conn_id, *spec.replication_client())
        if (holder := clients.get(client)) is not None:
            problems.append(f"{path}: {_shared_replication_client(spec, client, holder)}")
            continue
        seen[spec.pipeline] = str(path)
        clients[client] = spec
        specs.append(spec)
    return Catalog(folder, specs, problems)


def _shared_replication_client(spec: PipelineSpec, client: tuple, holder: PipelineSpec) -> str:
    """Why ``spec`` may not run beside ``holder``: it would read the same server (the same
    connection) with the same MySQL server_id (the server drops one of two replicas with one
    id, so each run cuts the other off) or the same Postgres slot (each pipeline would release,
    and so lose, the changes the other has not read yet)."""
    _, what, mine = client
    how = ("the server drops one of two replication clients with one server_id"
           if what == "server_id" else "each pipeline would release changes the other has not read")
    return (f"source.{what}: {mine!r} on connection {spec.source.conn_id!r} is already used by "
            f"pipeline {holder.pipeline!r} ({holder.path}); {how}. Set a distinct source.{what}")


def find(pipeline: str, directory: str | os.PathLike | None = None) -> PipelineSpec:
    """The valid spec that defines ``pipeline`` (``<pipeline>.yaml`` is read first, so a broken
    neighbour costs nothing), or the spec file ``pipeline`` names."""
    if pipeline.endswith((".yaml", ".yml")):
        return load_spec(pipeline)
    folder = Path(directory) if directory is not None else pipelines_dir()
    spec, broken = lookup(pipeline, folder)
    if spec is not None:
        return spec
    detail = (": " + "; ".join(broken)) if broken else ""
    raise PipelineNotFoundError(
        f"no valid spec defines pipeline {pipeline!r} in {folder} (set TIDEGATE_PIPELINES_DIR or add "
        f"{folder / (pipeline + '.yaml')}){detail}")


def lookup(pipeline: str, folder: Path) -> tuple[PipelineSpec | None, list[str]]:
    """(the valid spec that defines ``pipeline`` or None, the problems of ``<pipeline>.yaml``).
    The folder is listed and its other files read only when ``<pipeline>.yaml`` does not define
    the pipeline: a run, a task's parse or one pipeline's status costs the same whatever the
    number of pipelines beside it."""
    named = [folder / f"{pipeline}{ext}" for ext in (".yaml", ".yml")]
    broken: list[str] = []
    for path in _candidates(folder, named):
        try:
            spec = load_spec(path)
        except SpecError as exc:
            if path in named:
                broken.extend(exc.problems)
            continue
        if spec.pipeline == pipeline:
            return spec, broken
    return None, broken


def _candidates(folder: Path, named: list[Path]) -> Iterator[Path]:
    """The named files that exist, then (lazily: only when asked) the folder's other spec files."""
    yield from (p for p in named if p.is_file())
    yield from (p for p in spec_files(folder) if p not in named)
