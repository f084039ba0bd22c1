"""Bounds against real servers: when the head moved only for changes the pipeline does not
carry (another table, WAL housekeeping), the run has nothing to do and the checkpoints move to
the head; a change of a captured table is work."""

from __future__ import annotations

import textwrap
import uuid

import psycopg2
import pymysql
import pytest
from tidegate import bounds_step
from tidegate.parts import Parts
from tidegate.run import RunContext
from tidegate.spec import load_spec
from tidegate.store import open_store

pytestmark = pytest.mark.integration


def spec_file(tmp_path, body: str):
    path = tmp_path / "b.yaml"
    path.write_text(textwrap.dedent(body))
    return load_spec(str(path))


def test_postgres_head_moved_by_other_tables_is_nothing_to_do(postgres, tmp_path):
    tag = uuid.uuid4().hex[:8]
    mine, other = f"bmine_{tag}", f"bother_{tag}"
    spec = spec_file(tmp_path, f"""
        pipeline: b_{tag}
        source: {{kind: postgres, conn_id: src, slot: b_{tag}, tables: [public.{mine}], start: head}}
        sinks: [{{id: a, kind: redis, conn_id: r, stream: s}}]
    """)
    lookup = {"src": postgres.cdc}.__getitem__
    store = open_store(f"sqlite:///{tmp_path / 's.sqlite'}")
    admin = psycopg2.connect(postgres.admin_dsn)
    admin.autocommit = True
    with admin.cursor() as c:
        c.execute(f"CREATE TABLE {mine} (id int PRIMARY KEY)")
        c.execute(f"CREATE TABLE {other} (id int PRIMARY KEY)")
        c.execute("SELECT pg_create_logical_replication_slot(%s, 'wal2json')", (f"b_{tag}",))
    try:
        first = bounds_step.prepare_bounds(RunContext(spec, parts=Parts(lookup), store=store)).bounds
        assert first.nothing_to_do()
        with admin.cursor() as c:
            c.execute(f"INSERT INTO {other} VALUES (1), (2)")
            c.execute("SELECT pg_switch_wal()")  # housekeeping WAL too
        quiet = bounds_step.prepare_bounds(RunContext(spec, parts=Parts(lookup), store=store)).bounds
        assert quiet.nothing_to_do() and quiet.upto != first.upto
        assert store.checkpoints.get(spec.pipeline, "a").position == quiet.upto
        with admin.cursor() as c:
            c.execute(f"INSERT INTO {mine} VALUES (1)")
        assert not bounds_step.prepare_bounds(RunContext(spec, parts=Parts(lookup),
                                                    store=store)).bounds.nothing_to_do()
    finally:
        with admin.cursor() as c:
            c.execute("SELECT pg_drop_replication_slot(%s)", (f"b_{tag}",))
            c.execute(f"DROP TABLE {mine}, {other}")
        admin.close()
        store.close()


def test_mysql_head_moved_by_other_databases_is_nothing_to_do(mysql, tmp_path):
    tag = uuid.uuid4().hex[:8]
    spec = spec_file(tmp_path, f"""
        pipeline: b_{tag}
        source: {{kind: mysql, conn_id: src, server_id: 47021, tables: [bm_{tag}.t], start: head}}
        sinks: [{{id: a, kind: redis, conn_id: r, stream: s}}]
    """)
    lookup = {"src": mysql.cdc}.__getitem__
    store = open_store(f"sqlite:///{tmp_path / 's.sqlite'}")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    try:
        with admin.cursor() as c:
            for d in (f"bm_{tag}", f"bo_{tag}"):
                c.execute(f"CREATE DATABASE {d}")
                c.execute(f"CREATE TABLE {d}.t (id INT PRIMARY KEY)")
        assert bounds_step.prepare_bounds(RunContext(spec, parts=Parts(lookup),
                                                store=store)).bounds.nothing_to_do()
        with admin.cursor() as c:
            c.execute(f"INSERT INTO bo_{tag}.t VALUES (1), (2)")
            # Statement-logged DML of a database the pipeline does not capture is not its concern.
            c.execute("SET SESSION binlog_format = 'STATEMENT'")
            c.execute(f"INSERT INTO bo_{tag}.t VALUES (3)")
            c.execute("SET SESSION binlog_format = 'ROW'")
        quiet = bounds_step.prepare_bounds(RunContext(spec, parts=Parts(lookup), store=store)).bounds
        assert quiet.nothing_to_do()
        assert store.checkpoints.get(spec.pipeline, "a").position.pos == quiet.upto.pos
        with admin.cursor() as c:
            c.execute(f"INSERT INTO bm_{tag}.t VALUES (1)")
        assert not bounds_step.prepare_bounds(RunContext(spec, parts=Parts(lookup),
                                                    store=store)).bounds.nothing_to_do()
    finally:
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS bm_{tag}")
            c.execute(f"DROP DATABASE IF EXISTS bo_{tag}")
        admin.close()
        store.close()
