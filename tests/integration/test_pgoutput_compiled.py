"""pgoutput's compiled rows (tidegate.native.rowcodec.PgOutputRows) against two oracles, on
generated workloads: the same range read through a wal2json slot (the path every envelope is
compared with) and through the pgoutput Python path (``use_compiled = False``).

Each seed writes, in transactions of random sizes, rows of every compiled kind at their edges
(``test_snapshot_sources.generated_rows_pg``: NaN, the infinities, -0, numerics Decimal writes in
exponent form, BC and infinite timestamps, escapes and non-ASCII text), under REPLICA IDENTITY
FULL and DEFAULT; updates of random columns, primary key changes, deletes, updates that leave a
TOASTed value unchanged, a column added between rows. All three reads must give the same items
(bytes, ids, transaction ends, positions), and the compiled path must have written most rows,
not all (the edges go to the Python path)."""

from __future__ import annotations

import random
import uuid

import psycopg2
import pytest
from tidegate.events import ChangeEvent
from tidegate.sources.postgres.pgoutput import PgOutputDecoder
from tidegate.sources.postgres.source import PostgresSource
from tidegate.spec import PipelineSpec, SourceSpec

from tests.integration.source_items import assert_same, compiled_share
from tests.integration.test_snapshot_sources import COMPILED_DDL_PG, generated_rows_pg

pytestmark = pytest.mark.integration

COLUMNS = ("id", "i2", "i4", "o", "n2", "n", "r", "d", "b", "t", "vc", "c", "dt", "tm", "u", "j", "iv", "t0",
           "t3", "tz", "ip")


class PythonRowsReader(PgOutputDecoder):
    """The pgoutput reader with every row through the Python path."""

    use_compiled = False


def source(postgres, schema, slot, *, plugin, publication=None, reader=None) -> PostgresSource:
    spec = PipelineSpec(pipeline="pgc_test", tenant="acme", sinks=(),
                        source=SourceSpec(kind="postgres", conn_id="cdc_postgres",
                                          tables=(f"{schema}.gen", f"{schema}.dflt"), slot=slot,
                                          plugin=plugin, publication=publication))
    return PostgresSource(spec, postgres.cdc, decoder=reader)


def workload(conn, s: str, rng: random.Random) -> None:
    """Transactions of 1-40 statements on ``gen`` (FULL) and ``dflt`` (DEFAULT) from ``rng``."""
    rows = generated_rows_pg(rng, 160)
    marks = ", ".join(["%s"] * len(COLUMNS))
    ids: list[int] = []
    big = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789") for _ in range(6000))  # TOASTed

    def statement(c) -> None:
        roll = rng.random()
        if roll < 0.45 or not ids:
            row = rows[rng.randrange(len(rows))]
            key = rng.randrange(1, 10**9)
            c.execute(f"INSERT INTO {s}.gen VALUES ({marks}) ON CONFLICT DO NOTHING", (key, *row[1:]))
            c.execute(f"INSERT INTO {s}.dflt VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                      (key, row[9], big if rng.random() < 0.3 else row[5]))
            ids.append(key)
        elif roll < 0.75:
            key, src = rng.choice(ids), rows[rng.randrange(len(rows))]
            cols = rng.sample(range(1, len(COLUMNS)), rng.randint(1, 4))
            sets = ", ".join(f"{COLUMNS[k]} = %s" for k in cols)
            c.execute(f"UPDATE {s}.gen SET {sets} WHERE id = %s", [src[k] for k in cols] + [key])
            c.execute(f"UPDATE {s}.dflt SET t = %s WHERE id = %s", (src[9], key))  # leaves `big` unchanged
        elif roll < 0.82:
            old = rng.choice(ids)
            new = rng.randrange(1, 10**9)
            c.execute(f"UPDATE {s}.gen SET id = %s WHERE id = %s AND NOT EXISTS "
                      f"(SELECT 1 FROM {s}.gen WHERE id = %s)", (new, old, new))
            c.execute(f"UPDATE {s}.dflt SET id = %s WHERE id = %s AND NOT EXISTS "
                      f"(SELECT 1 FROM {s}.dflt WHERE id = %s)", (new, old, new))
            ids[ids.index(old)] = new
        else:
            key = ids.pop(rng.randrange(len(ids)))
            c.execute(f"DELETE FROM {s}.gen WHERE id = %s", (key,))
            c.execute(f"DELETE FROM {s}.dflt WHERE id = %s", (key,))

    conn.autocommit = False
    with conn.cursor() as c:
        for n in range(40):
            for _ in range(rng.randint(1, 40)):
                statement(c)
            if n == 25:  # a new column between rows: its rows go through the Python path first
                c.execute(f"ALTER TABLE {s}.dflt ADD COLUMN w int DEFAULT 7")
            conn.commit()
    conn.autocommit = True


@pytest.mark.parametrize("seed", [91, 92, 93])
def test_pgoutput_compiled_rows_are_the_python_and_the_wal2json_rows(postgres, seed):
    conn = psycopg2.connect(postgres.admin_dsn)
    conn.autocommit = True
    tag = uuid.uuid4().hex[:10]
    s = f"pgc_{tag}"
    slots = {"wal2json": f"pgc_w_{tag}", "pgoutput": f"pgc_p_{tag}"}
    try:
        with conn.cursor() as c:
            c.execute(f"CREATE SCHEMA {s}")
            c.execute(COMPILED_DDL_PG.format(s=s))
            c.execute(f"ALTER TABLE {s}.gen REPLICA IDENTITY FULL")
            c.execute(f"CREATE TABLE {s}.dflt (id bigint PRIMARY KEY, t text, big text)")
            c.execute(f"CREATE PUBLICATION {s} FOR TABLE {s}.gen, {s}.dflt")
            for plugin, slot in slots.items():
                c.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
        head = source(postgres, s, slots["wal2json"], plugin="wal2json")
        start = head.head()
        workload(conn, s, random.Random(seed))
        upto = head.head()
        head.close()

        def read(plugin, reader=None):
            src = source(postgres, s, slots[plugin], plugin=plugin, reader=reader,
                         publication=s if plugin == "pgoutput" else None)
            try:
                return list(src.read(start, upto))
            finally:
                src.close()

        compiled = read("pgoutput")
        share = compiled_share(read("pgoutput", PythonRowsReader), compiled)
        assert 0.3 <= share < 1.0, share
        assert_same(read("wal2json"), compiled)
        assert sum(isinstance(e, ChangeEvent) for e in compiled) > 1000
    finally:
        with conn.cursor() as c:
            for slot in slots.values():
                c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                          "WHERE slot_name = %s", (slot,))
            c.execute(f"DROP PUBLICATION IF EXISTS {s}")
            c.execute(f"DROP SCHEMA IF EXISTS {s} CASCADE")
        conn.close()
