"""Access to the engine, imported when a task runs (never at DAG parse time)."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

from .exceptions import PipelineNotFoundError


def engine(name: str) -> ModuleType:
    """``tidegate.<name>`` (looked up in sys.modules each call, so tests can substitute it)."""
    return importlib.import_module(f"tidegate.{name}")


def find_spec(pipeline: str) -> Any:
    """The valid spec of ``pipeline``. Other, broken spec files do not matter: each file is
    loaded on its own (``<pipeline>.yaml`` first)."""
    from tidegate.errors import SpecError
    from tidegate.spec import load_spec, pipelines_dir, spec_files

    if pipeline.endswith((".yaml", ".yml")):
        return load_spec(pipeline)
    folder = pipelines_dir()
    named = [folder / f"{pipeline}{ext}" for ext in (".yaml", ".yml")]
    candidates = [p for p in named if p.is_file()] + [p for p in spec_files(folder) if p not in named]
    broken: list[str] = []
    for path in candidates:
        try:
            spec = load_spec(path)
        except SpecError as exc:
            if Path(path) in named:
                broken.extend(exc.problems)
            continue
        if spec.pipeline == pipeline:
            return spec
    detail = (": " + "; ".join(broken)) if broken else ""
    raise PipelineNotFoundError(
        f"no valid spec defines pipeline {pipeline!r} in {folder} (TIDEGATE_PIPELINES_DIR){detail}")
