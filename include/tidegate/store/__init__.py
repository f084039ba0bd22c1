"""The checkpoint store (docs/architecture.md, "Checkpoints: the store is the authority").

``open_store()`` picks the backend from ``TIDEGATE_CHECKPOINT_STORE``:

* ``sqlite:///relative/path`` or ``sqlite:////absolute/path`` (SQLAlchemy's spelling);
  default ``<repo>/.state/checkpoints.sqlite``;
* ``postgresql://user:pass@host:5432/db`` (or ``postgres://``), via psycopg2.

The store is migrated to the current schema when opened.
"""

from __future__ import annotations

import os

from ..spec import repo_dir
from .base import CheckpointStore, StoreError
from .records import CheckpointRecord, Incident, JournalEntry, JournalSink, SnapshotRecord, checkpoint_key

ENV_VAR = "TIDEGATE_CHECKPOINT_STORE"

__all__ = ["CheckpointStore", "StoreError", "CheckpointRecord", "Incident", "JournalEntry",
           "JournalSink", "SnapshotRecord", "checkpoint_key", "open_store", "default_url", "ENV_VAR"]


def default_url() -> str:
    return os.environ.get(ENV_VAR) or "sqlite:///" + str(repo_dir() / ".state" / "checkpoints.sqlite")


def open_store(url: str | None = None) -> CheckpointStore:
    """Open (and migrate) the checkpoint store named by ``url``, the env var, or the default."""
    url = url or default_url()
    store = _backend(url)
    try:
        store.migrate()
    except BaseException:
        store.close()
        raise
    return store


def _backend(url: str) -> CheckpointStore:
    if url.startswith("sqlite:///"):
        from .sqlite import SqliteStore  # the backend the URL names, and only it

        return SqliteStore(url[len("sqlite:///"):])
    if url.startswith(("postgresql://", "postgres://")) or "dbname=" in url:
        from .postgres import PostgresStore  # the backend the URL names, and only it

        return PostgresStore(url)
    scheme = url.split("://", 1)[0] if "://" in url else "(none)"
    raise StoreError(f"{ENV_VAR}: unsupported checkpoint store scheme {scheme!r}; "
                     f"allowed: sqlite:///path, postgresql://user@host/db")
