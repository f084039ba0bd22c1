"""Versioned schema of the checkpoint store. Append new migrations; never edit applied ones.

One list for the tables of every role (checkpoints, leases, incidents, runs, snapshots,
columns): a store is migrated as a whole, and its schema version names all of its tables.

DDL is written once with a few type slots filled per backend, so both backends always have
the same tables. ``tidegate_schema_version`` records every applied migration.
"""

from __future__ import annotations

TYPES = {
    "sqlite": {"serial": "INTEGER PRIMARY KEY AUTOINCREMENT", "ts": "TEXT", "bool": "INTEGER",
               "big": "INTEGER", "blob": "BLOB"},
    "postgres": {"serial": "BIGSERIAL PRIMARY KEY", "ts": "TIMESTAMPTZ", "bool": "BOOLEAN",
                 "big": "BIGINT", "blob": "BYTEA"},
}

VERSION_TABLE = """CREATE TABLE IF NOT EXISTS tidegate_schema_version (
    version INTEGER PRIMARY KEY, description TEXT NOT NULL, applied_at {ts} NOT NULL)"""

# (version, description, statements)
MIGRATIONS: list[tuple[int, str, list[str]]] = [
    (1, "leases, versioned checkpoints, source identity, incidents, batch journal", [
        """CREATE TABLE tidegate_leases (
            pipeline TEXT PRIMARY KEY, epoch {big} NOT NULL, run_id TEXT, acquired_at {ts} NOT NULL)""",
        """CREATE TABLE tidegate_checkpoints (
            ckpt_key TEXT NOT NULL, version INTEGER NOT NULL, pipeline TEXT NOT NULL,
            sink_id TEXT NOT NULL, position TEXT NOT NULL, run_id TEXT, epoch {big},
            written_at {ts} NOT NULL, kind TEXT NOT NULL, reason TEXT, who TEXT,
            source_version INTEGER, PRIMARY KEY (ckpt_key, version))""",
        "CREATE INDEX tidegate_checkpoints_pipeline ON tidegate_checkpoints (pipeline, sink_id, version)",
        """CREATE TABLE tidegate_source_identity (
            pipeline TEXT PRIMARY KEY, identity TEXT NOT NULL, updated_at {ts} NOT NULL)""",
        """CREATE TABLE tidegate_incidents (
            id {serial}, pipeline TEXT NOT NULL, kind TEXT NOT NULL, from_position TEXT,
            to_position TEXT, detail TEXT, run_id TEXT, detected_at {ts} NOT NULL,
            resolved {bool} NOT NULL, resolution TEXT, resolved_by TEXT, reason TEXT,
            resolved_at {ts})""",
        "CREATE INDEX tidegate_incidents_pipeline ON tidegate_incidents (pipeline, resolved)",
        """CREATE TABLE tidegate_journal (
            id {serial}, pipeline TEXT NOT NULL, run_id TEXT NOT NULL, mode TEXT NOT NULL,
            interval_start TEXT, interval_end TEXT, status TEXT NOT NULL,
            started_at {ts} NOT NULL, finished_at {ts})""",
        "CREATE INDEX tidegate_journal_run ON tidegate_journal (pipeline, run_id)",
        """CREATE TABLE tidegate_journal_sinks (
            journal_id {big} NOT NULL, sink_id TEXT NOT NULL, from_position TEXT, to_position TEXT,
            events {big} NOT NULL, bytes {big} NOT NULL, status TEXT NOT NULL, error TEXT,
            PRIMARY KEY (journal_id, sink_id))""",
    ]),
]

MIGRATIONS.append(
    (2, "control messages a checkpoint version owes its sink; dead-lettered events per journaled sink", [
        "ALTER TABLE tidegate_checkpoints ADD COLUMN control TEXT",
        "ALTER TABLE tidegate_journal_sinks ADD COLUMN dlq {big} NOT NULL DEFAULT 0",
    ]))

MIGRATIONS.append(
    (3, "snapshots: the handoff, tables and chunk plan of each snapshot, rows read per chunk", [
        """CREATE TABLE tidegate_snapshots (
            pipeline TEXT NOT NULL, snapshot_id TEXT NOT NULL, kind TEXT NOT NULL,
            handoff TEXT NOT NULL, tables TEXT NOT NULL, chunks TEXT NOT NULL, ts_ms {big} NOT NULL,
            status TEXT NOT NULL, rows {big}, reason TEXT, who TEXT, run_id TEXT,
            started_at {ts} NOT NULL, finished_at {ts}, PRIMARY KEY (pipeline, snapshot_id))""",
        """CREATE TABLE tidegate_snapshot_chunks (
            pipeline TEXT NOT NULL, snapshot_id TEXT NOT NULL, chunk INTEGER NOT NULL,
            rows {big} NOT NULL, read_at {ts} NOT NULL, PRIMARY KEY (pipeline, snapshot_id, chunk))""",
    ]))

# 4: what a source remembers of its log between runs: a table's column set as of a position
# (PostgreSQL's wal2json carries no DDL; a column change is noticed by comparing a row's
# columns with the last set seen, also when that set was seen by an earlier run).
MIGRATIONS.append(
    (4, "column sets of captured tables as of a log position", [
        """CREATE TABLE tidegate_table_columns (
            pipeline TEXT NOT NULL, schema_name TEXT NOT NULL, table_name TEXT NOT NULL,
            position TEXT NOT NULL, columns TEXT NOT NULL, seen_at {ts} NOT NULL,
            PRIMARY KEY (pipeline, schema_name, table_name, position))""",
    ]))

# 5: what each run decided (its bounds, each sink's start, ...), one JSON document per run id,
# read back by the later steps of the run and by a rerun of it (store.runs.put_record).
MIGRATIONS.append(
    (5, "run records: one JSON document per pipeline and run id", [
        """CREATE TABLE tidegate_run_records (
            pipeline TEXT NOT NULL, run_id TEXT NOT NULL, record TEXT NOT NULL,
            written_at {ts} NOT NULL, PRIMARY KEY (pipeline, run_id))""",
    ]))

# 6: a snapshot chunk's first read, kept until every sink holds the chunk, so that a rerun gives
# the sinks behind the rows the others got (tidegate.snapshot.kept).
MIGRATIONS.append(
    (6, "snapshots: a chunk's first read, kept while a sink lacks the chunk", [
        """CREATE TABLE tidegate_snapshot_chunk_reads (
            pipeline TEXT NOT NULL, snapshot_id TEXT NOT NULL, chunk INTEGER NOT NULL,
            upper TEXT NOT NULL, items {blob} NOT NULL, read_at {ts} NOT NULL,
            PRIMARY KEY (pipeline, snapshot_id, chunk))""",
    ]))

LATEST = max(version for version, _, _ in MIGRATIONS)


def render(sql: str, dialect: str) -> str:
    return sql.format(**TYPES[dialect])
