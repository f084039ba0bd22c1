"""Runs: the batch journal (what each journaled run delivered to each sink) and run records
(what a run decided, kept as JSON so a later step or a rerun of the same run id reads it back)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ..positions import Position
from .records import JournalEntry, JournalSink, now_iso, pos_text, pos_value, ts_text
from .tx import Role, Tx


class Runs(Role):
    # ------------------------------------------------------------------ batch journal

    def begin(self, pipeline: str, run_id: str, *, interval_start: Any = None,
              interval_end: Any = None, mode: str = "incremental") -> int:
        with self._tx(write=True) as tx:
            return tx.one("INSERT INTO tidegate_journal (pipeline, run_id, mode, interval_start, "
                          "interval_end, status, started_at) VALUES (?, ?, ?, ?, ?, ?, ?) RETURNING id",
                          (pipeline, run_id, mode, ts_text(interval_start), ts_text(interval_end),
                           "running", now_iso()))[0]

    def sink(self, journal_id: int, sink_id: str, *, start: Position | None,
             end: Position | None, events: int, bytes: int, status: str,
             error: str | None = None, dlq: int = 0) -> None:
        """Record (or update) what one sink received in a journaled run."""
        with self._tx(write=True) as tx:
            tx.exec("INSERT INTO tidegate_journal_sinks (journal_id, sink_id, from_position, to_position, "
                    "events, bytes, status, error, dlq) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) "
                    "ON CONFLICT (journal_id, sink_id) DO UPDATE SET from_position = excluded.from_position, "
                    "to_position = excluded.to_position, events = excluded.events, "
                    "bytes = excluded.bytes, status = excluded.status, error = excluded.error, "
                    "dlq = excluded.dlq",
                    (journal_id, sink_id, pos_text(start), pos_text(end), events, bytes, status, error, dlq))

    def last_attempt(self, pipeline: str, sink_id: str, *, before: int | None = None
                     ) -> tuple[int, str, Position | None] | None:
        """(journal id, run id, where it left the sink) of the newest journaled attempt of a run
        (not a replay) that journaled ``sink_id``, older than journal id ``before``."""
        with self._tx() as tx:
            row = tx.one("SELECT j.id, j.run_id, s.to_position FROM tidegate_journal j JOIN "
                         "tidegate_journal_sinks s ON s.journal_id = j.id WHERE j.pipeline = ? AND "
                         "j.mode = 'incremental' AND s.sink_id = ? AND j.id < ? ORDER BY j.id DESC LIMIT 1",
                         (pipeline, sink_id, before if before is not None else 2**62))
        return None if row is None else (row[0], row[1], pos_value(row[2]))

    @staticmethod
    def progress(tx: Tx, journal_id: int, sink_id: str, start: Position | None, end: Position) -> None:
        """Inside the caller's transaction (a checkpoint write): the journaled run has given the
        sink (``start``, ``end``] so far. Written with every checkpoint move, so an attempt that
        never reaches its end (SIGKILL) is journaled as far as the store moved for it; the run's
        end writes the whole entry (:meth:`sink`). An existing entry keeps its start: an adopted
        stretch credited to an earlier attempt only moves that attempt's end."""
        tx.exec("INSERT INTO tidegate_journal_sinks (journal_id, sink_id, from_position, to_position, "
                "events, bytes, status, error, dlq) VALUES (?, ?, ?, ?, 0, 0, 'running', NULL, 0) "
                "ON CONFLICT (journal_id, sink_id) DO UPDATE SET to_position = excluded.to_position",
                (journal_id, sink_id, pos_text(start), pos_text(end)))

    def finish(self, journal_id: int, status: str) -> None:
        with self._tx(write=True) as tx:
            tx.exec("UPDATE tidegate_journal SET status = ?, finished_at = ? WHERE id = ?",
                    (status, now_iso(), journal_id))

    def entries(self, pipeline: str, run_id: str | None = None) -> list[JournalEntry]:
        """Journal entries of a pipeline (of one run id: every attempt), oldest first."""
        sql = ("SELECT id, pipeline, run_id, mode, interval_start, interval_end, status, started_at, "
               "finished_at FROM tidegate_journal WHERE pipeline = ?")
        params: tuple = (pipeline,)
        if run_id is not None:
            sql, params = sql + " AND run_id = ?", (pipeline, run_id)
        with self._tx() as tx:
            rows = tx.all(sql + " ORDER BY id", params)
            sinks = {r[0]: _journal_sinks(tx, r[0]) for r in rows}
        return [JournalEntry(r[0], r[1], r[2], r[3], r[4], r[5], r[6], ts_text(r[7]), ts_text(r[8]),
                             sinks[r[0]]) for r in rows]

    # ------------------------------------------------------------------ run records

    def put_record(self, pipeline: str, run_id: str, record: Mapping[str, Any]) -> None:
        """Keep ``record`` (JSON-serializable) as the record of a run, replacing the one the
        run id had: a retried or rerun run id writes what it decided this time."""
        with self._tx(write=True) as tx:
            tx.exec("INSERT INTO tidegate_run_records (pipeline, run_id, record, written_at) "
                    "VALUES (?, ?, ?, ?) ON CONFLICT (pipeline, run_id) DO UPDATE SET "
                    "record = excluded.record, written_at = excluded.written_at",
                    (pipeline, run_id, json.dumps(dict(record), sort_keys=True), now_iso()))

    def record(self, pipeline: str, run_id: str) -> dict[str, Any] | None:
        """The record of a run; None when the run id wrote none."""
        with self._tx() as tx:
            row = tx.one("SELECT record FROM tidegate_run_records WHERE pipeline = ? AND run_id = ?",
                         (pipeline, run_id))
        return None if row is None else json.loads(row[0])

    def records(self, pipeline: str, limit: int = 50) -> list[tuple[str, dict[str, Any]]]:
        """``(run_id, record)`` of a pipeline's last ``limit`` records, newest first."""
        with self._tx() as tx:
            rows = tx.all("SELECT run_id, record FROM tidegate_run_records WHERE pipeline = ? "
                          "ORDER BY written_at DESC, run_id DESC LIMIT ?", (pipeline, int(limit)))
        return [(r[0], json.loads(r[1])) for r in rows]


def _journal_sinks(tx: Tx, journal_id: int) -> dict[str, JournalSink]:
    rows = tx.all("SELECT sink_id, from_position, to_position, events, bytes, status, error, dlq "
                  "FROM tidegate_journal_sinks WHERE journal_id = ? ORDER BY sink_id", (journal_id,))
    return {r[0]: JournalSink(r[0], pos_value(r[1]), pos_value(r[2]), r[3], r[4], r[5], r[6], r[7])
            for r in rows}
