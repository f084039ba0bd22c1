"""The ``tidegate`` package as a zip for ``spark-submit --py-files`` and a Spark Connect session's
artifacts: executors on a cluster (and a Connect server's Python workers) get the same engine code
as the process that starts the run, without installing anything. The compiled hot path travels in
it too (``tidegate/native``: Python cannot import an extension module from a zip, so the worker
writes it out and loads it from there; tidegate.native)."""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path


def package_zip(folder: Path | None = None) -> Path:
    """A zip of the importable ``tidegate`` package, rebuilt only when its files change."""
    pkg = Path(__file__).resolve().parents[1]
    files = sorted(p for p in pkg.rglob("*.py") if "__pycache__" not in p.parts)
    files += sorted({p for suffix in EXTENSION_SUFFIXES for p in (pkg / "native").glob(f"*{suffix}")})
    digest = hashlib.sha1()
    for p in files:
        st = p.stat()
        digest.update(f"{p.relative_to(pkg)}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    out = (folder or Path(tempfile.gettempdir())) / f"tidegate-{digest.hexdigest()[:12]}.zip"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for p in files:
                z.write(p, Path("tidegate") / p.relative_to(pkg))
        tmp.replace(out)  # atomic: a concurrent task sees the whole zip or none
    return out
