"""The pipeline catalogue: the spec files of the pipelines folder, read one file at a time.

Every face of tidegate finds pipelines here (the DAG factory, the operators, the CLI, the
Spark job), so they agree on what a folder holds: one invalid file costs only its own
pipeline, and a file that reuses an earlier file's pipeline name is a problem of the later one.
"""

from __future__ import annotations

import os
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
    """Every valid spec of the folder (sorted by file name) and the problems of the others."""
    folder = Path(directory) if directory is not None else pipelines_dir()
    specs: list[PipelineSpec] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
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
        if clash := _shared_replication_client(spec, specs):
            problems.append(f"{path}: {clash}")
            continue
        seen[spec.pipeline] = str(path)
        specs.append(spec)
    return Catalog(folder, specs, problems)


def _shared_replication_client(spec: PipelineSpec, earlier: list[PipelineSpec]) -> str | None:
    """Why ``spec`` may not run beside the ``earlier`` specs: it would read the same server
    (the same connection) as one of them with the same MySQL server_id (the server drops one of
    two replicas with one id, so each run cuts the other off) or the same Postgres slot (each
    pipeline would release, and so lose, the changes the other has not read yet)."""
    what, mine = spec.replication_client()
    for other in earlier:
        if other.source.conn_id == spec.source.conn_id and other.replication_client() == (what, mine):
            how = ("the server drops one of two replication clients with one server_id"
                   if what == "server_id" else "each pipeline would release changes the other has not read")
            return (f"source.{what}: {mine!r} on connection {spec.source.conn_id!r} is already used by "
                    f"pipeline {other.pipeline!r} ({other.path}); {how}. Set a distinct source.{what}")
    return None


def find(pipeline: str, directory: str | os.PathLike | None = None) -> PipelineSpec:
    """The valid spec that defines ``pipeline`` (``<pipeline>.yaml`` is read first, so a broken
    neighbour costs nothing), or the spec file ``pipeline`` names."""
    if pipeline.endswith((".yaml", ".yml")):
        return load_spec(pipeline)
    folder = Path(directory) if directory is not None else pipelines_dir()
    named = [folder / f"{pipeline}{ext}" for ext in (".yaml", ".yml")]
    candidates = [p for p in named if p.is_file()] + [p for p in spec_files(folder) if p not in named]
    broken: list[str] = []
    for path in candidates:
        try:
            spec = load_spec(path)
        except SpecError as exc:
            if path in named:
                broken.extend(exc.problems)
            continue
        if spec.pipeline == pipeline:
            return spec
    detail = (": " + "; ".join(broken)) if broken else ""
    raise PipelineNotFoundError(
        f"no valid spec defines pipeline {pipeline!r} in {folder} (set TIDEGATE_PIPELINES_DIR or add "
        f"{folder / (pipeline + '.yaml')}){detail}")
