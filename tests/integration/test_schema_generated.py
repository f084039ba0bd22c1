"""Generated schema changes between generated row changes, against a model of the table.

Per seed and source (MariaDB, PostgreSQL wal2json, pgoutput): a table whose columns change while
rows change: columns added, dropped, renamed and widened (INT to BIGINT, VARCHAR to TEXT), long
text values (past PostgreSQL's TOAST threshold, so an update that leaves them alone sends them
as unchanged), single-row inserts, updates of random columns and deletes, some of them grouped
in transactions (on PostgreSQL with schema changes inside: its DDL is transactional), with runs between
them at random, so a run's range often spans a schema change. The test keeps its own model of
the table (its columns and rows) and, per row change, the images it must produce. The oracle:
the row events a Redis stream holds, in order, equal the model's: the operation, the
``before`` image (the whole old row, as the table's columns were then) and the ``after`` image
(the whole new row).
"""

from __future__ import annotations

import random
import uuid

import orjson
import psycopg2
import pymysql
import pytest
import redis
from tidegate.guards import guard_retention
from tidegate.parts import Parts
from tidegate.run import RunContext
from tidegate.spec import load_spec
from tidegate.store import open_store

from tests.runs import whole_run
from tests.seeds import seeds_from_env

pytestmark = pytest.mark.integration

LONG = 3000  # characters: past the 2 kB at which PostgreSQL moves a value out of line (TOAST)


class Model:
    """The table as the test changes it, and the row events that must come of it."""

    def __init__(self, kind: str, rnd: random.Random, admin, table: str):
        self.kind, self.rnd, self.admin, self.table = kind, rnd, admin, table
        self.columns: dict[str, str] = {"id": "int", "a": "int", "b": "text"}  # name -> int | big | text
        self.rows: dict[int, dict] = {}
        self.events: list[tuple[str, dict | None, dict | None]] = []
        self.names = 0

    def sql(self, stmt: str, args=None) -> None:
        with self.admin.cursor() as c:
            c.execute(stmt, args)

    def sql_type(self, kind: str) -> str:
        return {"int": "INT", "big": "BIGINT", "text": "TEXT" if self.kind != "mysql" else "LONGTEXT",
                "short": "VARCHAR(40)"}[kind]

    def create(self) -> None:
        self.sql(f"CREATE TABLE {self.table} (id INT PRIMARY KEY, a INT, b VARCHAR(40))")
        self.columns["b"] = "short"
        if self.kind != "mysql":
            self.sql(f"ALTER TABLE {self.table} REPLICA IDENTITY FULL")

    def value(self, kind: str):
        if self.rnd.random() < 0.15:
            return None
        if kind in ("int", "big"):
            return self.rnd.randint(-10**6, 10**6) if kind == "int" else self.rnd.randint(-2**60, 2**60)
        n = self.rnd.randint(LONG, LONG + 500) if kind == "text" and self.rnd.random() < 0.5 else \
            self.rnd.randint(0, 30)
        return "".join(self.rnd.choice("abcdefxyzé") for _ in range(n))

    # ------------------------------------------------------------------ row changes

    def insert(self) -> None:
        i = self.rnd.randint(1, 10**6)
        if i in self.rows:
            return
        row = {c: (i if c == "id" else self.value(k)) for c, k in self.columns.items()}
        self.sql(f"INSERT INTO {self.table} ({', '.join(row)}) VALUES ({', '.join(['%s'] * len(row))})",
                 list(row.values()))
        self.rows[i] = row
        self.events.append(("c", None, dict(row)))

    def update(self) -> None:
        i = self.rnd.choice(sorted(self.rows))
        changed = self.rnd.sample([c for c in self.columns if c != "id"],
                                  self.rnd.randint(1, len(self.columns) - 1))
        new = {c: self.value(self.columns[c]) for c in changed}
        if all(self.rows[i][c] == v for c, v in new.items()):
            return  # MariaDB logs no row event for an update that changes nothing
        self.sql(f"UPDATE {self.table} SET {', '.join(f'{c} = %s' for c in new)} WHERE id = %s",
                 [*new.values(), i])
        before = dict(self.rows[i])
        self.rows[i].update(new)
        self.events.append(("u", before, dict(self.rows[i])))

    def delete(self) -> None:
        i = self.rnd.choice(sorted(self.rows))
        self.sql(f"DELETE FROM {self.table} WHERE id = %s", [i])
        self.events.append(("d", self.rows.pop(i), None))

    # ------------------------------------------------------------------ schema changes

    def add(self) -> None:
        self.names += 1
        name, kind = f"n{self.names}", self.rnd.choice(["int", "short", "text"])
        self.sql(f"ALTER TABLE {self.table} ADD COLUMN {name} {self.sql_type(kind)}")
        self.columns[name] = kind
        for row in self.rows.values():
            row[name] = None

    def drop(self) -> None:
        name = self.rnd.choice([c for c in self.columns if c != "id"])
        self.sql(f"ALTER TABLE {self.table} DROP COLUMN {name}")
        del self.columns[name]
        for row in self.rows.values():
            del row[name]

    def rename(self) -> None:
        old = self.rnd.choice([c for c in self.columns if c != "id"])
        self.names += 1
        new = f"r{self.names}"
        self.sql(f"ALTER TABLE {self.table} RENAME COLUMN {old} TO {new}")
        self.columns = {(new if c == old else c): k for c, k in self.columns.items()}
        for i, row in self.rows.items():
            self.rows[i] = {(new if c == old else c): v for c, v in row.items()}

    def widen(self) -> None:
        narrow = [c for c, k in self.columns.items() if k in ("int", "short") and c != "id"]
        if not narrow:
            return
        name = self.rnd.choice(narrow)
        kind = "big" if self.columns[name] == "int" else "text"
        if self.kind == "mysql":
            self.sql(f"ALTER TABLE {self.table} MODIFY {name} {self.sql_type(kind)}")
        else:
            self.sql(f"ALTER TABLE {self.table} ALTER COLUMN {name} TYPE {self.sql_type(kind)}")
        self.columns[name] = kind

    def step(self, ddl: bool = True) -> None:
        ops = ["insert", "insert", "update", "update", "delete", "transaction"]
        ops += ["add", "drop", "rename", "widen"] if ddl else []
        op = self.rnd.choice(ops) if self.rows else "insert"
        if op == "drop" and len(self.columns) <= 2:
            op = "add"
        if op == "transaction":
            self.transaction()
        else:
            getattr(self, op)()

    def transaction(self) -> None:
        """Two to five steps in one transaction; on PostgreSQL schema changes among them (its DDL
        is transactional), on MariaDB row changes only (a DDL statement commits)."""
        if not self.rows:
            return
        self.sql("BEGIN")
        for _ in range(self.rnd.randint(2, 5)):
            if self.rows:
                self.step(ddl=self.kind != "mysql")
        self.sql("COMMIT")


def _spec(tmp_path, name: str, kind: str, table: str, extra: dict):
    lines = [f"pipeline: {name}", "source:", f"  kind: {'postgres' if kind != 'mysql' else 'mysql'}",
             "  conn_id: src", f"  tables: [{table}]", "  start: head",
             *(f"  {k}: {v}" for k, v in extra.items()), "batch: {max_events: 5}", "sinks:",
             '  - {id: cache, kind: redis, conn_id: redis, stream: "{pipeline}:{table}"}']
    path = tmp_path / f"{name}.yaml"
    path.write_text("\n".join(lines) + "\n")
    return load_spec(str(path))


def _row_events(conn, key: str) -> list[tuple[str, dict | None, dict | None]]:
    r = redis.Redis(host="127.0.0.1", port=conn.port, username=conn.login, password=conn.password)
    try:
        out = []
        for _, fields in r.xrange(key):
            env = orjson.loads(fields[b"event"])
            if env.get("op") in ("c", "u", "d"):
                out.append((env["op"], env["before"], env["after"]))
        return out
    finally:
        r.delete(key)
        r.close()


# Three seeds per source in make test; TIDEGATE_SCHEMA_SEEDS=60 ran 180 schedules (none failed),
# TIDEGATE_SCHEMA_SEEDS=60-159 300 more (none failed).
# TIDEGATE_SCHEMA_SEEDS picks others (tests/seeds.py: N, A-B or a,b,c).
SEEDS = seeds_from_env("TIDEGATE_SCHEMA_SEEDS", [0, 1, 2])


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kind", ["mysql", "postgres", "pgoutput"])
def test_generated_schema_changes_between_row_changes(kind, seed, tmp_path, mysql, postgres, redis_service):
    rnd = random.Random(f"{kind}-{seed}")
    tag = uuid.uuid4().hex[:8]
    name, where = f"sg{tag}", f"sg_{tag}.t"
    if kind == "mysql":
        admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
        admin.cursor().execute(f"CREATE DATABASE sg_{tag}")
        src, extra = mysql.cdc, {"server_id": 48600 + int(tag, 16) % 1000}
    else:
        admin = psycopg2.connect(postgres.admin_dsn)
        admin.autocommit = True
        with admin.cursor() as c:
            c.execute(f"CREATE SCHEMA sg_{tag}")
            c.execute(f"GRANT USAGE ON SCHEMA sg_{tag} TO {postgres.cdc.login}")
            c.execute(f"ALTER DEFAULT PRIVILEGES IN SCHEMA sg_{tag} GRANT SELECT ON TABLES TO "
                      f"{postgres.cdc.login}")
        src, extra = postgres.cdc, {"slot": name, "plugin": "wal2json" if kind == "postgres" else "pgoutput"}
    model = Model(kind, rnd, admin, where)
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    try:
        model.create()
        if kind == "pgoutput":
            model.sql(f"CREATE PUBLICATION {name} FOR TABLE {where}")
            extra["publication"] = name
        spec = _spec(tmp_path, name, kind, where, extra)
        parts = Parts({"src": src, "redis": redis_service.cdc}.__getitem__)
        guard_retention(RunContext(spec, run_id="r0", parts=parts, store=store))  # a slot, on PostgreSQL
        whole_run(RunContext(spec, run_id="r0", parts=parts, store=store))
        for step in range(rnd.randint(20, 40)):
            model.step()
            if rnd.random() < 0.2:
                whole_run(RunContext(spec, run_id=f"r{step + 1}", parts=parts, store=store))
        whole_run(RunContext(spec, run_id="last", parts=parts, store=store))
        got = _row_events(redis_service.cdc, f"{name}:t")
        assert len(got) == len(model.events), (kind, seed, len(got), len(model.events))
        for i, (g, want) in enumerate(zip(got, model.events, strict=True)):
            assert g == want, (kind, seed, i)
    finally:
        store.close()
        with admin.cursor() as c:
            if kind == "mysql":
                c.execute(f"DROP DATABASE IF EXISTS sg_{tag}")
            else:
                c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE "
                          "slot_name = %s", (name,))
                c.execute(f"DROP PUBLICATION IF EXISTS {name}")
                c.execute(f"DROP SCHEMA IF EXISTS sg_{tag} CASCADE")
        admin.close()
