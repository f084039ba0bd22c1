"""Airflow DAG import errors for invalid tidegate pipeline specs.

This file defines no DAG. When a spec in the pipelines folder is invalid, importing it raises
one error naming each file, field and problem, which Airflow shows as an import error of
this file; the DAGs of the valid specs (``tidegate_dags.py``) keep loading and running.
"""

from __future__ import annotations

import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
for _sub, _pkg in (("include", "tidegate"), ("plugins", "tidegate_airflow")):
    if not (_ROOT / _sub / _pkg).is_dir():
        continue
    try:
        __import__(_pkg)
    except ImportError:
        sys.path.insert(0, str(_ROOT / _sub))

from tidegate_airflow.exceptions import InvalidPipelineSpecError  # noqa: E402
from tidegate_airflow.factory import load_specs  # noqa: E402

_problems = load_specs()[1]
if _problems:
    raise InvalidPipelineSpecError(_problems)
