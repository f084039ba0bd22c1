"""Airflow DAGs of tidegate: one DAG ``cdc_<pipeline>`` per pipeline spec.

Specs are read from ``include/pipelines/`` or the folder named by ``TIDEGATE_PIPELINES_DIR``.
Every task is a tidegate operator from ``plugins/tidegate_airflow``; this file only wires them.
An invalid spec does not stop the valid ones: it is reported as an import error by
``tidegate_spec_errors.py``, next to this file.
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
    except ImportError:  # not installed / plugins folder elsewhere: use this checkout
        sys.path.insert(0, str(_ROOT / _sub))

from tidegate_airflow.factory import build_dags  # noqa: E402

globals().update(build_dags())
