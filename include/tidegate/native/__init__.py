"""Compiled parts of tidegate (docs/architecture.md, "The compiled hot path").

``rowcodec`` (``rowcodec.pyx``, Cython) turns the rows of a binlog ROWS event, and the row
messages of a wal2json slot, into the bytes a run sends. It is built from this repository by
``make install`` (``scripts/build_native.py``); where it is not built, or ``TIDEGATE_NATIVE=0``
is set, :data:`rowcodec` is None and the readers use the pure-Python path, which gives the same
bytes.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

log = logging.getLogger(__name__)

NATIVE_ENV = "TIDEGATE_NATIVE"  # "0": use the pure-Python path even where the extension is built


def _load() -> ModuleType | None:
    if os.environ.get(NATIVE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        from . import rowcodec as module
    except ImportError:
        # Spark tasks import tidegate from the shipped zip, where no extension module can load:
        # expected there. In a checkout it means `make native` was not run, which costs speed.
        in_checkout = os.path.isdir(os.path.dirname(__file__))
        (log.warning if in_checkout else log.debug)(
            "tidegate.native.rowcodec is not built: the pure-Python row path is used (same bytes, "
            "more CPU per event); build it with `make native`")
        return None
    return module


rowcodec: ModuleType | None = _load()

__all__ = ["NATIVE_ENV", "rowcodec"]
