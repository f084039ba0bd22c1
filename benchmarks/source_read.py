"""Source read throughput: events/s for N row changes per source.

    eval "$(scripts/services env)"
    .venv/bin/python benchmarks/source_read.py [--rows 200000] [--files 4] [--only mysql|postgres]

MySQL/MariaDB: N rows inserted in transactions of 10k rows, spread over ``--files`` binlog
files, then read (a) sequentially with ``read`` and (b) as per-file slices with
``read_slice`` in parallel processes. Postgres: the same N rows through one ``read`` (one
``pg_logical_slot_peek_changes`` via a named cursor). Every event is built and serialized to
its JSON value (``ChangeEvent.value``), as a run does before delivery. Uses the admin
connections for the workload and the CDC connections for reading; cleans up after itself.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "include"))

from tidegate.connections import get_connection  # noqa: E402
from tidegate.events import ChangeEvent  # noqa: E402
from tidegate.spec import PipelineSpec, SourceSpec  # noqa: E402

TX_ROWS = 10_000


def _consume(items) -> tuple[int, int]:
    n = size = 0
    for it in items:
        if isinstance(it, ChangeEvent):
            n += 1
            size += len(it.value)
    return n, size


def _mysql_spec(db: str) -> PipelineSpec:
    return PipelineSpec(pipeline="bench", sinks=(),
                        source=SourceSpec(kind="mysql", conn_id="cdc_mysql", tables=(f"{db}.bench",),
                                          server_id=random.randint(100_000, 2_000_000_000)))


def _slice_worker(args) -> tuple[int, int]:
    from tidegate.positions import BinlogPosition
    from tidegate.sources.mysql import MySqlSource

    db, k, frm, to = args
    src = MySqlSource(_mysql_spec(db), get_connection("cdc_mysql"))
    try:
        return _consume(src.read_slice(BinlogPosition.from_json(frm), BinlogPosition.from_json(to), reader=k))
    finally:
        src.close()


def bench_mysql(rows: int, files: int) -> None:
    import pymysql
    from tidegate.sources.mysql import MySqlSource

    a = get_connection("cdc_mysql_admin")
    admin = pymysql.connect(host=a.host, port=a.port, user=a.login, password=a.password, database=a.schema,
                            autocommit=True, charset="utf8mb4")
    db = "bench_" + uuid.uuid4().hex[:8]
    cur = admin.cursor()
    cur.execute(f"CREATE DATABASE {db}")
    try:
        cur.execute(f"CREATE TABLE {db}.bench (id BIGINT PRIMARY KEY, status VARCHAR(20), "
                    f"total DECIMAL(12,2), note VARCHAR(100), created DATETIME(6))")
        src = MySqlSource(_mysql_spec(db), get_connection("cdc_mysql"))
        start = src.head()
        t0 = time.perf_counter()
        per_file = max(1, rows // files)
        done = 0
        while done < rows:
            n = min(TX_ROWS, rows - done)
            cur.execute(f"INSERT INTO {db}.bench SELECT {done} + seq, 'new', seq / 100, "
                        f"CONCAT('row ', seq), NOW(6) FROM seq_1_to_{n}")
            done += n
            if done % per_file < TX_ROWS and done < rows:
                cur.execute("FLUSH BINARY LOGS")
        upto = src.head()
        print(f"mysql: wrote {rows} rows in {time.perf_counter() - t0:.1f}s "
              f"({start.file} .. {upto.file})")

        t0 = time.perf_counter()
        n, size = _consume(src.read(start, upto))
        dt = time.perf_counter() - t0
        assert n == rows, (n, rows)
        print(f"mysql sequential: {n} events, {size / 1e6:.1f} MB JSON in {dt:.2f}s = {n / dt:,.0f} events/s")

        slices = src.slices(start, upto)
        procs = min(len(slices), os.cpu_count() or 1)
        t0 = time.perf_counter()
        with mp.get_context("spawn").Pool(procs) as pool:
            parts = pool.map(_slice_worker, [(db, k, f.to_json(), t.to_json())
                                             for k, (f, t) in enumerate(slices)])
        dt = time.perf_counter() - t0
        n = sum(p[0] for p in parts)
        assert n == rows, (n, rows)
        print(f"mysql parallel slices: {len(slices)} slices on {procs} processes: {n} events in "
              f"{dt:.2f}s = {n / dt:,.0f} events/s (includes process start-up)")
        src.close()
    finally:
        cur.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.close()


def bench_postgres(rows: int) -> None:
    import psycopg2
    from tidegate.sources.postgres import PostgresSource

    a = get_connection("cdc_postgres_admin")
    admin = psycopg2.connect(host=a.host, port=a.port, dbname=a.schema, user=a.login, password=a.password)
    admin.autocommit = True
    schema = "bench_" + uuid.uuid4().hex[:8]
    cur = admin.cursor()
    cur.execute(f"CREATE SCHEMA {schema}")
    spec = PipelineSpec(pipeline="bench", sinks=(),
                        source=SourceSpec(kind="postgres", conn_id="cdc_postgres",
                                          tables=(f"{schema}.bench",), slot=f"{schema}_slot"))
    src = PostgresSource(spec, get_connection("cdc_postgres"))
    try:
        cur.execute(f"CREATE TABLE {schema}.bench (id bigint PRIMARY KEY, status text, "
                    f"total numeric(12,2), note text, created timestamptz)")
        src.ensure_slot()
        start = src.head()
        t0 = time.perf_counter()
        done = 0
        while done < rows:
            n = min(TX_ROWS, rows - done)
            cur.execute(f"INSERT INTO {schema}.bench SELECT {done} + g, 'new', g / 100.0, 'row ' || g, "
                        f"now() FROM generate_series(1, {n}) g")
            done += n
        upto = src.head()
        print(f"postgres: wrote {rows} rows in {time.perf_counter() - t0:.1f}s")
        t0 = time.perf_counter()
        n, size = _consume(src.read(start, upto))
        dt = time.perf_counter() - t0
        assert n == rows, (n, rows)
        print(f"postgres: {n} events, {size / 1e6:.1f} MB JSON in {dt:.2f}s = {n / dt:,.0f} events/s")
    finally:
        try:
            src.drop_slot()
        finally:
            src.close()
            cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
            admin.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--files", type=int, default=4, help="MySQL: binlog files the rows span")
    ap.add_argument("--only", choices=("mysql", "postgres"))
    args = ap.parse_args()
    print(f"{args.rows} row changes per source, {os.cpu_count()} CPUs")
    if args.only in (None, "mysql"):
        bench_mysql(args.rows, args.files)
    if args.only in (None, "postgres"):
        bench_postgres(args.rows)


if __name__ == "__main__":
    main()
