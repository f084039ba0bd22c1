"""The seeded workload: random transactions on a few tables of one source (MariaDB or PostgreSQL),
mirrored in a model so the oracle knows each key's history in commit order.

Tables (each with a primary key): ``items (id)``, ``pairs (k1, k2)`` (composite) and ``notes (id)``
(a larger text column, so a run's range is more than a socket buffer). A transaction holds 1-4
statements, possibly on several tables: inserts, multi-row updates (``v = v + 1`` on a list of
keys), deletes, primary-key changes (an UPDATE of the key: the sinks see a delete of the old key
and a create of the new one); now and then one is rolled back (the sinks must see nothing of it)
and now and then a column is added to a table (DDL, outside any transaction).
"""

from __future__ import annotations

import base64
import collections
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.campaign import type_edges

KEY_COLUMNS = {"items": ("id",), "pairs": ("k1", "k2"), "notes": ("id",)}
TABLES = tuple(KEY_COLUMNS)
# With POISON=dlq, a notes row whose body is this long (over the campaign broker's
# message.max.bytes of 2 MiB and NATS's max_payload of 1 MiB): every change of it, and its
# snapshot row, is poison to Kafka and NATS, none to Redis or Delta. The body is random
# (base64 of random bytes): a repeated character would reach the broker lz4-compressed to a few
# KiB, which it takes.
HUGE_BODY = 2_200_000
# With POISON=dlq_mixed, half the huge bodies are this long instead: past the Kafka producer's own
# message.max.bytes (16 MiB), which refuses the record in produce(), before any broker sees it.
CLIENT_HUGE_BODY = 17_500_000

Key = tuple  # (table, ((column, value), ...)) with the key columns sorted


def key_of(table: str, row: dict) -> Key:
    return table, tuple((c, row[c]) for c in sorted(KEY_COLUMNS[table]))


class SourceDb:
    """The workload's admin connection (reopened after the server restarted), and the SQL that
    differs between the two sources."""

    def __init__(self, kind: str, connect: Callable[[], object], schema: str, typed: bool = False,
                 longest: int = HUGE_BODY):
        self.kind, self.schema, self.typed = kind, schema, typed
        self.longest = longest  # the longest notes body the workload writes
        self.connect = (lambda: _typed_session(kind, connect())) if typed else connect
        self.conn = self.connect()

    def reconnect(self) -> None:
        try:
            self.conn.close()
        except Exception:  # noqa: BLE001, S110 - the server it talked to may be gone
            pass
        self.conn = self.connect()

    def literal(self, value) -> str:
        """``value`` as an SQL literal, quoted by the driver (typed values: TYPES=edges)."""
        if self.kind == "mysql":
            return self.conn.escape(value)
        with self.conn.cursor() as c:
            return c.mogrify("%s", (value,)).decode()

    def execute(self, stmt: str, *, retries: int = 30) -> None:
        """One autocommit statement, retried over a reconnect while the server restarts."""
        self.transaction([stmt], retries=retries)

    def transaction(self, stmts: list[str], *, rollback: bool = False, retries: int = 30) -> None:
        """The statements in one transaction. A transaction that failed on a lost connection is
        retried only when it certainly did not commit (the failure came before COMMIT)."""
        committing = [False]

        def once() -> None:
            committing[0] = False
            with self.conn.cursor() as c:
                c.execute("BEGIN")
                for s in stmts:
                    c.execute(s)
                committing[0] = True
                c.execute("ROLLBACK" if rollback else "COMMIT")

        self._retried(once, retries, unsafe=lambda: committing[0])

    def rows(self, table: str, *, retries: int = 30) -> list[dict]:
        """The table's rows, read over a reconnect when the connection was lost (a fault of the
        server, or of the checkpoint store's, which is the same PostgreSQL)."""

        def once() -> list[dict]:
            with self.conn.cursor() as c:
                c.execute(f"SELECT * FROM {self.schema}.{table}")
                cols = [d[0] for d in c.description]
                return [dict(zip(cols, r, strict=True)) for r in c.fetchall()]

        return self._retried(once, retries)

    def _retried(self, once, retries: int, unsafe=lambda: False):
        """``once()``, again over a reconnect while the server restarts, unless ``unsafe()``
        says the failed attempt may have taken effect."""
        import time

        for attempt in range(retries + 1):
            try:
                return once()
            except Exception:
                if unsafe() or attempt == retries:
                    raise
                time.sleep(0.5)
                try:
                    self.reconnect()
                except Exception:  # noqa: BLE001, S110 - still down: the next attempt retries
                    pass
        raise AssertionError("not reached")

    def create_tables(self) -> None:
        # MariaDB: MEDIUMTEXT holds up to 16 MiB, LONGTEXT the bodies past it (POISON=dlq_mixed)
        text = "TEXT" if self.kind == "postgres" else "MEDIUMTEXT" if self.longest < 1 << 24 else "LONGTEXT"
        ddl = {"items": "id INT PRIMARY KEY, v INT NOT NULL, s VARCHAR(40)",
               "pairs": "k1 INT NOT NULL, k2 VARCHAR(8) NOT NULL, v INT NOT NULL, PRIMARY KEY (k1, k2)",
               "notes": f"id INT PRIMARY KEY, v INT NOT NULL, body {text}"}
        if self.kind == "mysql":
            self.execute(f"CREATE DATABASE {self.schema}")
        else:
            self.execute(f"CREATE SCHEMA {self.schema}")
        if self.typed:
            ddl["items"] += "".join(f", {c.name} {c.ddl}" for c in type_edges.COLUMNS[self.kind])
            if self.kind == "mysql":  # the key's edge text has four-byte characters
                ddl["pairs"] = ddl["pairs"].replace("VARCHAR(8)", "VARCHAR(8) CHARACTER SET utf8mb4")
        for t, cols in ddl.items():
            self.execute(f"CREATE TABLE {self.schema}.{t} ({cols})")
            if self.kind == "postgres":
                self.execute(f"ALTER TABLE {self.schema}.{t} REPLICA IDENTITY FULL")

    def drop(self) -> None:
        self.reconnect()
        self.execute(f"DROP {'DATABASE' if self.kind == 'mysql' else 'SCHEMA'} IF EXISTS {self.schema}"
                     + (" CASCADE" if self.kind == "postgres" else ""))


@dataclass
class Workload:
    """Random transactions, reproducible from the seed's ``random.Random``; ``expected`` is
    each key's [(op, v)] in commit order, ``changes`` the row changes committed."""

    rng: random.Random
    db: SourceDb
    model: dict[str, dict[Key, dict]] = field(default_factory=lambda: {t: {} for t in TABLES})
    expected: dict[Key, list[tuple]] = field(default_factory=lambda: collections.defaultdict(list))
    changes: int = 0
    transactions: int = 0
    ddl: list[str] = field(default_factory=list)
    next_id: int = 1
    huge_share: float = 0.0  # POISON=dlq: the share of new notes rows with a HUGE_BODY
    huge: set[Key] = field(default_factory=set)  # keys whose row has one (a rekey keeps it)
    huge_mixed: bool = False  # POISON=dlq_mixed: a huge body is CLIENT_HUGE_BODY long by a coin

    def _new_row(self, table: str) -> dict:
        i, self.next_id = self.next_id, self.next_id + 1
        v = self.rng.randrange(1_000_000)
        if table == "pairs":
            k2 = self.rng.choice("abcdefgh") * self.rng.randint(1, 3)
            if self.db.typed:  # a key of edge text, by the id: no draw, the workload's stays the same
                k2 = type_edges.EDGE_KEYS[i % len(type_edges.EDGE_KEYS)]
            return {"k1": i, "k2": k2, "v": v}
        if table == "notes":
            if self.huge_share and self.rng.random() < self.huge_share:  # no draw without POISON
                self.huge.add(key_of(table, {"id": i}))  # (a rolled-back one has no changes)
                size = CLIENT_HUGE_BODY if self.huge_mixed and self.rng.random() < 0.5 else HUGE_BODY
                body = base64.b64encode(self.rng.randbytes(size * 3 // 4)).decode()
                return {"id": i, "v": v, "body": body}
            return {"id": i, "v": v, "body": "n" * self.rng.choice((10, 500, 3000, 9000))}
        row = {"id": i, "v": v, "s": self.rng.choice(("new", "paid", "sent", None))}
        return {**row, **type_edges.draw_row(self.rng, self.db.kind)} if self.db.typed else row

    def _where(self, table: str, keys: list[Key]) -> str:
        cols = sorted(KEY_COLUMNS[table])
        lit = self.db.literal if self.db.typed else sql_value  # (edge keys: a backslash)
        tuples = ", ".join("(" + ", ".join(lit(v) for _, v in k[1]) + ")" for k in keys)
        return f"({', '.join(cols)}) IN ({tuples})"

    def _statement(self, staged: dict[str, dict[Key, dict]], log: list) -> str:
        """One random statement on ``staged`` (the model inside the transaction); appends its
        row changes to ``log``."""
        table = self.rng.choice(TABLES)
        rows = staged[table]
        kind = self.rng.choices(("insert", "update", "delete", "rekey"), (5, 4, 2, 1))[0]
        if kind == "insert" or len(rows) < 3:
            n = self.rng.randint(1, 3)
            new = [self._new_row(table) for _ in range(n)]
            for r in new:
                rows[key_of(table, r)] = r
                log.append((key_of(table, r), "c", r["v"]))
            cols = list(new[0])
            lit = self.db.literal if self.db.typed else sql_value
            values = ", ".join("(" + ", ".join(lit(r[c]) for c in cols) + ")" for r in new)
            return f"INSERT INTO {self.db.schema}.{table} ({', '.join(cols)}) VALUES {values}"
        keys = self.rng.sample(sorted(rows, key=repr), min(len(rows), self.rng.randint(1, 3)))
        if kind == "update":
            also = ""
            if self.db.typed and table == "items" and self.rng.random() < 0.6:
                col, value = type_edges.draw_change(self.rng, self.db.kind)
                also = f", {col} = {self.db.literal(value)}"
            for k in keys:
                rows[k]["v"] += 1
                if also:
                    rows[k][col] = value
                log.append((k, "u", rows[k]["v"]))
            return f"UPDATE {self.db.schema}.{table} SET v = v + 1{also} WHERE {self._where(table, keys)}"
        if kind == "delete":
            for k in keys:
                del rows[k]
                log.append((k, "d", None))
            return f"DELETE FROM {self.db.schema}.{table} WHERE {self._where(table, keys)}"
        k = keys[0]  # rekey: a new value of the (last) key column
        row = rows.pop(k)
        col = sorted(KEY_COLUMNS[table])[-1]
        i, self.next_id = self.next_id, self.next_id + 1
        row = {**row, col: i if col != "k2" else f"r{i}"}
        rows[key_of(table, row)] = row
        if k in self.huge:
            self.huge.add(key_of(table, row))
        log += [(k, "d", None), (key_of(table, row), "c", row["v"])]
        return (f"UPDATE {self.db.schema}.{table} SET {col} = {sql_value(row[col])} "
                f"WHERE {self._where(table, [k])}")

    def transaction(self) -> None:
        staged = {t: {k: dict(r) for k, r in rows.items()} for t, rows in self.model.items()}
        log: list = []
        stmts = [self._statement(staged, log) for _ in range(self.rng.randint(1, 4))]
        rollback = self.rng.random() < 0.05
        self.db.transaction(stmts, rollback=rollback)
        if rollback:
            return
        self.model = staged
        self.transactions += 1
        for k, op, v in log:
            self.expected[k].append((op, v))
        self.changes += len(log)

    def add_column(self) -> None:
        table = self.rng.choice(TABLES)
        col = f"c{len(self.ddl) + 1}"
        self.db.execute(f"ALTER TABLE {self.db.schema}.{table} ADD COLUMN {col} INT NULL")
        self.ddl.append(f"{table}.{col}")

    def wave(self, n: int) -> None:
        """n transactions, and a column added now and then (about one wave in four)."""
        ddl_at = self.rng.randrange(n * 4)
        for i in range(n):
            if i == ddl_at:
                self.add_column()
            self.transaction()

    def source_rows(self) -> dict[Key, dict]:
        return {key_of(t, r): r for t in TABLES for r in self.db.rows(t)}


def _typed_session(kind: str, conn):
    """A workload connection that reads typed values as the oracle compares them: MariaDB's
    TIMESTAMP in UTC (its literals written in UTC too), PostgreSQL's jsonb as its text."""
    if kind == "mysql":
        with conn.cursor() as c:
            c.execute("SET time_zone = '+00:00'")
    else:
        import psycopg2.extras

        psycopg2.extras.register_default_jsonb(conn, loads=lambda text: text)
    return conn


def sql_value(v) -> str:
    if v is None:
        return "NULL"
    if isinstance(v, int):
        return str(v)
    return "'" + str(v).replace("'", "''") + "'"
