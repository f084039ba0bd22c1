"""The project's scripts without a .py suffix (scripts/services, scripts/demo) as modules."""

from __future__ import annotations

import importlib.machinery
import importlib.util
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def script_module(name: str) -> ModuleType:
    """``scripts/<name>`` loaded as the module ``tidegate_<name>``."""
    loader = importlib.machinery.SourceFileLoader(f"tidegate_{name}", str(ROOT / "scripts" / name))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module
