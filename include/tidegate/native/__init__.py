"""Compiled parts of tidegate (docs/architecture.md, "The compiled hot path").

``rowcodec`` (``rowcodec.pyx``, Cython, with the ``.pxi`` file of each role beside its Python
twin) turns the rows of a binlog ROWS event, of a wal2json or pgoutput message and of a
snapshot chunk into the bytes a run sends. It is built from this repository by
``make install`` (``scripts/build_native.py``); where it is not built, or ``TIDEGATE_NATIVE=0``
is set, :data:`rowcodec` is None and the readers use the pure-Python path, which gives the same
bytes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
from types import ModuleType

log = logging.getLogger(__name__)

NATIVE_ENV = "TIDEGATE_NATIVE"  # "0": use the pure-Python path even where the extension is built


def _load() -> ModuleType | None:
    if os.environ.get(NATIVE_ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        from . import rowcodec as module  # optional: not built, the pure-Python path runs
    except ImportError:
        module = _from_zip("rowcodec")
        if module is not None:
            return module
        # In a checkout it means `make native` was not run, which costs speed; in a zip built
        # where it was not built either, the same.
        in_checkout = os.path.isdir(os.path.dirname(__file__))
        (log.warning if in_checkout else log.debug)(
            "tidegate.native.rowcodec is not built: the pure-Python row path is used (same bytes, "
            "more CPU per event); build it with `make native`")
        return None
    return module


def _from_zip(name: str) -> ModuleType | None:
    """The extension module ``name`` when this package was imported from a zip (a Spark task's
    ``--py-files`` or a Connect session's artifact, spark/package.py, which carries it): Python
    cannot import an extension from a zip, so it is written to a folder named for its content,
    once per machine, and loaded from there. None when the zip has none for this interpreter, or
    it does not load here (another platform)."""
    # only a Spark task loading the module from a zip needs these
    import importlib.machinery
    import importlib.util
    import tempfile

    loader = globals().get("__loader__")
    if not hasattr(loader, "get_data") or os.path.isdir(os.path.dirname(__file__)):
        return None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        try:
            data = loader.get_data(os.path.join(os.path.dirname(__file__), name + suffix))
        except OSError:
            continue
        folder = os.path.join(tempfile.gettempdir(), f"tidegate-native-{hashlib.sha1(data).hexdigest()[:16]}")
        path = os.path.join(folder, name + suffix)
        try:
            if not os.path.exists(path):
                os.makedirs(folder, exist_ok=True)
                tmp = f"{path}.{os.getpid()}.tmp"
                with open(tmp, "wb") as f:
                    f.write(data)
                os.replace(tmp, path)  # atomic: a concurrent worker loads the whole file or writes its own
            spec = importlib.util.spec_from_file_location(f"{__name__}.{name}", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[spec.name] = module
        except (OSError, ImportError) as exc:
            log.info("tidegate.native.%s from the zip did not load here (%s): the pure-Python path is used",
                     name, exc)
            return None
        return module
    return None


rowcodec: ModuleType | None = _load()

__all__ = ["NATIVE_ENV", "rowcodec"]
