"""What a block of code reads of a folder, from Python's audit events (``open``, ``os.scandir``,
``os.listdir``): tests observe the files the engine opens without replacing any of its code.
Also the specs of a folder of many pipelines (tests/unit/test_many_pipelines.py,
tests/dags/test_many_pipelines_parse.py)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

_EVENTS = ("open", "os.scandir", "os.listdir")
_recording: list[tuple[str, str]] | None = None


def _audit(event: str, args: tuple) -> None:
    if _recording is not None and event in _EVENTS and isinstance(args[0], (str, bytes, Path)):
        _recording.append((event, str(args[0])))


sys.addaudithook(_audit)  # once per process (an audit hook cannot be removed); records only in reads_of


@contextlib.contextmanager
def reads_of(folder: Path) -> Iterator[dict[str, list[str]]]:
    """``{"opened": [file names opened in folder], "listed": [events listing folder]}`` of the block."""
    global _recording
    seen: dict[str, list[str]] = {"opened": [], "listed": []}
    _recording = []
    try:
        yield seen
    finally:
        events, _recording = _recording, None
        for event, path in events:
            p = Path(path)
            if event == "open" and p.parent == folder:
                seen["opened"].append(p.name)
            elif event != "open" and p == folder:
                seen["listed"].append(event)


def many_spec(i: int) -> dict:
    """Spec ``p_<i>``: even i MariaDB (each its own server_id), odd i PostgreSQL (each its own
    slot), one connection per source kind: every pair of specs of a kind shares a server."""
    source = ({"kind": "mysql", "conn_id": "cdc_mysql", "server_id": 50000 + i, "tables": ["shop.orders"]}
              if i % 2 == 0 else {"kind": "postgres", "conn_id": "cdc_postgres", "tables": ["public.orders"]})
    return {"pipeline": f"p_{i:03d}", "source": source,
            "sinks": [{"id": "events", "kind": "kafka", "conn_id": "cdc_kafka",
                       "topic": "{pipeline}.{table}"}]}


def write_many(folder: Path, n: int) -> list[str]:
    """``p_000.yaml`` .. into ``folder`` (created); the pipelines' names."""
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        (folder / f"p_{i:03d}.yaml").write_text(yaml.safe_dump(many_spec(i)))
    return [f"p_{i:03d}" for i in range(n)]
