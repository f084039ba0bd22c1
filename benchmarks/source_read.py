"""Source read throughput: events/s, CPU seconds and peak RSS per source and decoder.

    eval "$(scripts/services env)"
    .venv/bin/python benchmarks/source_read.py [--rows 200000] [--tx-rows 10] [--only mysql|postgres]
        [--files 4] [--slice-mb 8] [--plugin wal2json|pgoutput|both] [--no-floor]

Workload: ``--rows`` row changes of an 11-column table (BIGINT key, INT, VARCHAR, DECIMAL,
SMALLINT, DOUBLE, VARCHAR(100), DATETIME(6), TIMESTAMP(3), TINYINT, CHAR(8)) in transactions
of ``--tx-rows`` rows: of every 10 transactions 6 insert new rows, 3 update rows (before and
after images) and 1 deletes rows. The MariaDB backlog spans ``--files`` binlog files.

Each measurement runs in a fresh child process, which reads the whole range, builds every
event and serializes it to its JSON value (``ChangeEvent.value``) as a run does before
delivery. It reports wall-clock events/s, the child's CPU seconds (the server's work is not in
them; ev/CPU-s is events per second of the reader's own CPU, the figure that does not depend on
what else the two shared cores run) and the child's peak RSS. MariaDB is read with each reader
``MySqlSource`` can take (``library`` = python-mysql-replication, the reference in
tests/reference_decoders; ``fast`` = sources/mysql/decoder.py) and, for the fast decoder,
also in parallel processes (``read_slice``, a pool of one process per CPU): as per-file slices,
and as slices of at most ``--slice-mb`` cut inside the files at transaction boundaries
(``MySqlSource.slices``; the time it takes to find the cuts is part of the figure and is also
shown alone). With ``--files 1`` the backlog is one binlog file: per-file slices leave one
reader, finer slices give every CPU one. Postgres is read with each reader ``PostgresSource``
can take: ``reference`` (tests/reference_decoders: one ``pg_logical_slot_peek_changes`` through
a named cursor, stdlib json, a converter per value) and ``fast`` (the streaming replication
protocol, msgspec, generated row plans), plus the fast reader over the reference's peek
transport, which shows what the transport alone is worth; those are wal2json slots. With
``--plugin pgoutput`` or ``both`` (the default) a pgoutput slot, created with the wal2json one
before the workload (and a publication for the table before both), is read by the pgoutput
reader (sources/postgres/pgoutput.py, streaming): the same backlog, the same events. The
**floor** rows are the server streaming the same range to a C client that keeps nothing and
decodes nothing (``--floor``, on by default): ``mariadb-binlog --read-from-remote-server --raw``
into a tmpfs folder, ``pg_recvlogical`` into /dev/null (through a slot of each plugin made with
the others, with tidegate's own plugin options), and for PostgreSQL also the server decoding the
range alone, sending nothing (a binary peek counted in the server); "server CPU s" is the CPU the server's
processes used meanwhile (MariaDB: the server process; PostgreSQL: the WAL sender, counted when
the postmaster reaps it), the client's CPU is in "CPU s". Ratios
are of figures measured in this one run. The workload uses the admin connections, the reads the
CDC ones; everything created is dropped at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "include"))
sys.path.insert(1, str(ROOT))  # the reference decoders are in tests/reference_decoders

from tidegate.connections import get_connection  # noqa: E402
from tidegate.events import ChangeEvent  # noqa: E402
from tidegate.spec import PipelineSpec, SourceSpec  # noqa: E402

COLUMNS_MYSQL = ("id BIGINT PRIMARY KEY, customer INT NOT NULL, status VARCHAR(20), total DECIMAL(12,2), "
                 "qty SMALLINT, price DOUBLE, note VARCHAR(100), created DATETIME(6), "
                 "updated TIMESTAMP(3) NULL, flag TINYINT, code CHAR(8)")
COLUMNS_PG = ("id bigint PRIMARY KEY, customer int NOT NULL, status varchar(20), total numeric(12,2), "
              "qty smallint, price double precision, note varchar(100), created timestamp(6), "
              "updated timestamptz(3), flag smallint, code char(8)")


# --------------------------------------------------------------------------- measuring child


def _decoder_for(source: str, decoder: str):
    """The decoder a decoder name stands for (the sources take it as ``decoder=``)."""
    if source == "mysql":
        from tidegate.sources.mysql.source import fast_decoder

        from tests.reference_decoders.mysql_library import library_reader
        return {"fast": fast_decoder, "library": library_reader}[decoder]
    from tidegate.sources.postgres.pgoutput import PgOutputDecoder
    from tidegate.sources.postgres.wal2json import Wal2JsonDecoder

    from tests.reference_decoders.postgres_reference import ReferenceReader

    class FastPeek(Wal2JsonDecoder):  # the fast reader over the reference's transport
        messages = ReferenceReader.messages

    return {"fast": Wal2JsonDecoder, "reference": ReferenceReader, "fast-peek": FastPeek,
            "pgoutput": PgOutputDecoder}[decoder]


def _consume(items) -> tuple[int, int]:
    n = size = 0
    for it in items:
        if isinstance(it, ChangeEvent):
            n += 1
            size += len(it.value)
    return n, size


def _measure(fn) -> dict:
    wall0, cpu0 = time.perf_counter(), time.process_time()
    n, size = fn()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"events": n, "bytes": size, "wall": wall, "cpu": cpu + children.ru_utime + children.ru_stime,
            "rss_mb": max(rss_mb, children.ru_maxrss / 1024)}


def _proc_cpu(pid: int, reaped: bool = False) -> float:
    """CPU seconds of process ``pid`` (all its threads), plus with ``reaped`` its children that
    exited and were waited for (``/proc/<pid>/stat`` utime, stime, cutime, cstime)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    ticks = int(fields[11]) + int(fields[12]) + (int(fields[13]) + int(fields[14]) if reaped else 0)
    return ticks / os.sysconf("SC_CLK_TCK")


def _floor(cmd: list[str], env: dict, server_cpu) -> dict:
    """Run the streaming client ``cmd`` once: its wall time and CPU, and the server's CPU."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    server0 = server_cpu()
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed (exit {r.returncode}): {r.stderr.strip()[-500:]}")
    time.sleep(0.3)  # the WAL sender exits after its client: let the postmaster reap it
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"events": 0, "bytes": 0, "wall": wall, "rss_mb": after.ru_maxrss / 1024,
            "cpu": after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
            "server_cpu": server_cpu() - server0}


def floor_mysql(cur, start, upto) -> dict:
    """``mariadb-binlog`` fetching the range's binlog files raw (no decoding) into a tmpfs folder."""
    import tempfile

    c = get_connection("cdc_mysql")
    cur.execute("SELECT @@pid_file")
    with open(cur.fetchone()[0]) as f:
        pid = int(f.read().split()[0])
    with tempfile.TemporaryDirectory(dir="/dev/shm") as out, \
            tempfile.NamedTemporaryFile("w", suffix=".cnf") as cnf:
        os.chmod(cnf.name, 0o600)  # the password goes in a defaults file, never in argv
        cnf.write(f"[client]\nuser={c.login}\npassword={c.password}\nhost={c.host}\nport={c.port}\n")
        cnf.flush()
        res = _floor(["mariadb-binlog", f"--defaults-extra-file={cnf.name}", "--read-from-remote-server",
                      "--raw", f"--result-file={out}/", f"--start-position={start.pos}", "--to-last-log",
                      start.file], dict(os.environ), lambda: _proc_cpu(pid))
        res["bytes"] = sum(p.stat().st_size for p in Path(out).iterdir())
    return res


def floor_postgres(admin_cur, slot: str, plugin: str, publication: str, table: str, upto) -> dict:
    """``pg_recvlogical`` streaming slot ``slot`` up to ``upto`` into /dev/null, with the options
    tidegate's reader asks for."""
    from tidegate.sources.postgres.wal2json import WAL2JSON

    c = get_connection("cdc_postgres")
    admin_cur.execute("SELECT pg_backend_pid()")
    with open(f"/proc/{admin_cur.fetchone()[0]}/stat") as f:
        postmaster = int(f.read().rpartition(")")[2].split()[1])
    opts = ({**WAL2JSON, "add-tables": table} if plugin == "wal2json"
            else {"proto_version": "1", "publication_names": publication})
    cmd = ["pg_recvlogical", "-h", c.host, "-p", str(c.port), "-U", c.login, "-d", c.schema, "--slot", slot,
           "--start", "-E", str(upto.lsn), "-f", "/dev/null", "--no-loop", "-F", "0"]
    for k, v in opts.items():
        cmd += ["-o", f"{k}={v}"]
    return _floor(cmd, {**os.environ, "PGPASSWORD": c.password}, lambda: _proc_cpu(postmaster, reaped=True))


def decode_only_postgres(admin_cur, slot: str, plugin: str, publication: str, table: str, upto) -> dict:
    """The server decoding the range through ``plugin`` and sending nothing: a peek counted in
    the server (``pg_logical_slot_peek_binary_changes``, which leaves the slot where it is)."""
    from tidegate.sources.postgres.wal2json import WAL2JSON

    opts = ({**WAL2JSON, "add-tables": table} if plugin == "wal2json"
            else {"proto_version": "1", "publication_names": publication})
    args = [x for kv in opts.items() for x in kv]
    admin_cur.execute("SELECT pg_backend_pid()")
    (pid,) = admin_cur.fetchone()
    cpu0, t0 = _proc_cpu(pid), time.perf_counter()
    admin_cur.execute("SELECT count(*), sum(length(data)) FROM pg_logical_slot_peek_binary_changes("
                      "%s, %s::pg_lsn, NULL" + ", %s" * len(args) + ")", [slot, str(upto.lsn), *args])
    n, size = admin_cur.fetchone()
    wall = time.perf_counter() - t0
    return {"events": n, "bytes": int(size or 0), "wall": wall, "cpu": 0.0, "rss_mb": 0,
            "server_cpu": _proc_cpu(pid) - cpu0}


def _mysql_spec(db: str) -> PipelineSpec:
    return PipelineSpec(pipeline="bench", sinks=(),
                        source=SourceSpec(kind="mysql", conn_id="cdc_mysql", tables=(f"{db}.bench",),
                                          server_id=random.randint(100_000, 2_000_000_000)))


def _slice_worker(args) -> tuple[int, int]:
    from tidegate.sources.mysql.position import BinlogPosition
    from tidegate.sources.mysql.source import MySqlSource

    db, decoder, k, frm, to = args
    src = MySqlSource(_mysql_spec(db), get_connection("cdc_mysql"), decoder=_decoder_for("mysql", decoder))
    try:
        return _consume(src.read_slice(BinlogPosition.from_json(frm), BinlogPosition.from_json(to), index=k))
    finally:
        src.close()


def child(args: dict) -> dict:
    """Runs in a fresh process: one measurement, printed as JSON."""
    if args["source"] == "postgres":
        from tidegate.sources.postgres.position import PgPosition
        from tidegate.sources.postgres.source import PostgresSource

        spec = PipelineSpec(pipeline="bench", sinks=(),
                            source=SourceSpec(kind="postgres", conn_id="cdc_postgres",
                                              tables=(f"{args['schema']}.bench",), slot=args["slot"],
                                              plugin=args.get("plugin"),
                                              publication=args.get("publication")))
        src = PostgresSource(spec, get_connection("cdc_postgres"),
                             decoder=_decoder_for("postgres", args["decoder"]))
        start, upto = PgPosition.from_json(args["start"]), PgPosition.from_json(args["upto"])
        try:
            return _measure(lambda: _consume(src.read(start, upto)))
        finally:
            src.close()
    from tidegate.sources.mysql.position import BinlogPosition
    from tidegate.sources.mysql.source import MySqlSource

    db, decoder = args["db"], args["decoder"]
    src = MySqlSource(_mysql_spec(db), get_connection("cdc_mysql"), decoder=_decoder_for("mysql", decoder),
                      slice_bytes=args.get("slice_bytes") or 1 << 62)
    start, upto = BinlogPosition.from_json(args["start"]), BinlogPosition.from_json(args["upto"])
    try:
        if not args.get("parallel"):
            return _measure(lambda: _consume(src.read(start, upto)))
        import multiprocessing as mp

        cutting: dict[str, float] = {}

        def parallel() -> tuple[int, int]:
            t0 = time.perf_counter()
            slices = src.slices(start, upto)
            cutting.update(seconds=time.perf_counter() - t0, slices=len(slices))
            with mp.get_context("spawn").Pool(min(len(slices), os.cpu_count() or 1)) as pool:
                parts = pool.map(_slice_worker, [(db, decoder, k, f.to_json(), t.to_json())
                                                 for k, (f, t) in enumerate(slices)])
            return sum(p[0] for p in parts), sum(p[1] for p in parts)

        return {**_measure(parallel), "slicing_s": cutting["seconds"], "slices": cutting["slices"]}
    finally:
        src.close()


def run_child(args: dict, expected: int) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", json.dumps(args)], capture_output=True,
                       text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
    if r.returncode != 0:
        raise SystemExit(f"measurement {args} failed:\n{r.stderr[-3000:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["events"] == expected, (res, expected)
    return res


# --------------------------------------------------------------------------- workloads


def _mix(k: int) -> str:
    """Of every 10 transactions: 6 inserts, 3 updates, 1 delete."""
    return ("c", "c", "u", "c", "c", "u", "c", "d", "c", "u")[k % 10]


def mysql_workload(cur, db: str, rows: int, tx_rows: int, files: int, flush) -> None:
    next_id, live = 0, []  # live: first ids of inserted, not yet deleted blocks
    done = k = 0
    per_file = max(1, rows // files)
    while done < rows:
        n = min(tx_rows, rows - done)
        op = _mix(k) if live else "c"
        if op == "c" or n < tx_rows:
            cur.execute(f"INSERT INTO {db}.bench SELECT {next_id} + seq, seq % 1000, 'new', seq / 100, "
                        f"seq % 7, seq * 1.25, CONCAT('row note ', seq), NOW(6), NOW(3), seq % 2, "
                        f"'ABCD' FROM seq_1_to_{n}")
            live.append(next_id)
            next_id += n
        elif op == "u":
            first = live[(k * 7919) % len(live)]
            cur.execute(f"UPDATE {db}.bench SET status = 'paid', total = total + 1, qty = qty + 1, "
                        f"updated = NOW(3) WHERE id BETWEEN {first + 1} AND {first + tx_rows}")
        else:
            first = live.pop(0)
            cur.execute(f"DELETE FROM {db}.bench WHERE id BETWEEN {first + 1} AND {first + tx_rows}")
        done += n
        k += 1
        if done % per_file < tx_rows and done < rows:
            flush()


def bench_mysql(rows: int, tx_rows: int, files: int, decoders: list[str], slice_mb: float,
                out: list, floor: bool = True) -> None:
    import pymysql
    from tidegate.sources.mysql.source import MySqlSource

    a = get_connection("cdc_mysql_admin")
    admin = pymysql.connect(host=a.host, port=a.port, user=a.login, password=a.password, database=a.schema,
                            autocommit=True, charset="utf8mb4")
    db = "bench_" + uuid.uuid4().hex[:8]
    cur = admin.cursor()
    cur.execute(f"CREATE DATABASE {db}")
    try:
        cur.execute(f"CREATE TABLE {db}.bench ({COLUMNS_MYSQL})")
        src = MySqlSource(_mysql_spec(db), get_connection("cdc_mysql"))
        start = src.head()
        t0 = time.perf_counter()
        mysql_workload(cur, db, rows, tx_rows, files, lambda: cur.execute("FLUSH BINARY LOGS"))
        upto = src.head()
        src.close()
        print(f"mariadb: wrote {rows} row changes in {time.perf_counter() - t0:.1f}s "
              f"({start.file} .. {upto.file})", flush=True)
        base = {"source": "mysql", "db": db, "start": start.to_json(), "upto": upto.to_json()}
        if floor:
            res = floor_mysql(cur, start, upto)
            out.append(("mariadb floor (mariadb-binlog --raw)", res))
            print(f"  floor: {rows / res['wall']:,.0f} events/s", flush=True)
        for decoder in decoders:
            res = run_child({**base, "decoder": decoder}, rows)
            out.append((f"mariadb {decoder}", res))
            print(f"  {decoder}: {rows / res['wall']:,.0f} events/s", flush=True)
        if "fast" in decoders:
            res = run_child({**base, "decoder": "fast", "parallel": True}, rows)
            out.append((f"mariadb fast, per-file slices ({res['slices']}) in parallel", res))
            res = run_child({**base, "decoder": "fast", "parallel": True,
                             "slice_bytes": int(slice_mb * 1024 * 1024)}, rows)
            out.append((f"mariadb fast, {slice_mb:g} MiB slices ({res['slices']}) in parallel", res))
            print(f"  cutting the range into {res['slices']} slices of at most {slice_mb:g} MiB took "
                  f"{res['slicing_s']:.2f}s", flush=True)
    finally:
        cur.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.close()


def postgres_workload(cur, schema: str, rows: int, tx_rows: int = 10) -> None:
    """``rows`` row changes of {schema}.bench in transactions of ``tx_rows`` rows (the mix of
    :func:`_mix`: inserts, updates of live rows, deletes of the oldest)."""
    next_id, live, done, k = 0, [], 0, 0
    while done < rows:
        n = min(tx_rows, rows - done)
        op = _mix(k) if live else "c"
        if op == "c" or n < tx_rows:
            cur.execute(f"INSERT INTO {schema}.bench SELECT {next_id} + g, g % 1000, 'new', g / 100.0, "
                        f"g % 7, g * 1.25, 'row note ' || g, now(), now(), g % 2, 'ABCD' "
                        f"FROM generate_series(1, {n}) g")
            live.append(next_id)
            next_id += n
        elif op == "u":
            first = live[(k * 7919) % len(live)]
            cur.execute(f"UPDATE {schema}.bench SET status = 'paid', total = total + 1, qty = qty + 1, "
                        f"updated = now() WHERE id BETWEEN {first + 1} AND {first + tx_rows}")
        else:
            first = live.pop(0)
            cur.execute(f"DELETE FROM {schema}.bench WHERE id BETWEEN {first + 1} AND {first + tx_rows}")
        done += n
        k += 1


POSTGRES_DECODERS = {  # plugin -> (decoder, name) measured
    "wal2json": (("reference", "postgres reference (peek, json)"),
                 ("fast-peek", "postgres fast reader over peek"), ("fast", "postgres fast (streaming)")),
    "pgoutput": (("pgoutput", "postgres pgoutput (streaming)"),),
}


def bench_postgres(rows: int, tx_rows: int, plugins: list[str], out: list, floor: bool = True) -> None:
    import psycopg2
    from tidegate.sources.postgres.source import PostgresSource

    a = get_connection("cdc_postgres_admin")
    admin = psycopg2.connect(host=a.host, port=a.port, dbname=a.schema, user=a.login, password=a.password)
    admin.autocommit = True
    schema = "bench_" + uuid.uuid4().hex[:8]
    cur = admin.cursor()
    cur.execute(f"CREATE SCHEMA {schema}")
    publication = f"{schema}_pub"  # made by the admin role: the CDC role does not own the table
    srcs = {plugin: PostgresSource(PipelineSpec(pipeline="bench", sinks=(), source=SourceSpec(
        kind="postgres", conn_id="cdc_postgres", tables=(f"{schema}.bench",), slot=f"{schema}_{plugin}",
        plugin=plugin, publication=publication if plugin == "pgoutput" else None)),
        get_connection("cdc_postgres")) for plugin in plugins}
    floors = [f"{schema}_floor_{plugin}" for plugin in plugins] if floor else []
    try:
        cur.execute(f"CREATE TABLE {schema}.bench ({COLUMNS_PG})")
        cur.execute(f"ALTER TABLE {schema}.bench REPLICA IDENTITY FULL")
        cur.execute(f"CREATE PUBLICATION {publication} FOR TABLE {schema}.bench")
        for src in srcs.values():
            src.replication_slot.ensure()
        for slot, plugin in zip(floors, plugins, strict=False):  # streamed, and so moved, by the floor client
            cur.execute("SELECT pg_create_logical_replication_slot(%s, %s)", (slot, plugin))
        start = next(iter(srcs.values())).head()
        t0 = time.perf_counter()
        postgres_workload(cur, schema, rows, tx_rows)
        upto = next(iter(srcs.values())).head()
        print(f"postgres: wrote {rows} row changes in {time.perf_counter() - t0:.1f}s", flush=True)
        base = {"source": "postgres", "schema": schema, "start": start.to_json(), "upto": upto.to_json()}
        for plugin in plugins:
            for decoder, name in POSTGRES_DECODERS[plugin]:
                res = run_child({**base, "decoder": decoder, "slot": srcs[plugin].slot, "plugin": plugin,
                                 "publication": publication if plugin == "pgoutput" else None}, rows)
                out.append((name, res))
                print(f"  {plugin} {decoder}: {rows / res['wall']:,.0f} events/s", flush=True)
        for slot, plugin in zip(floors, plugins, strict=False):  # after the reads, as warm as theirs
            res = decode_only_postgres(cur, slot, plugin, publication, f"{schema}.bench", upto)
            out.append((f"postgres floor {plugin} (decoding alone, in the server)", res))
            print(f"  decoding alone {plugin}: {rows / res['wall']:,.0f} events/s", flush=True)
            res = floor_postgres(cur, slot, plugin, publication, f"{schema}.bench", upto)
            out.append((f"postgres floor {plugin} (pg_recvlogical)", res))
            print(f"  floor {plugin}: {rows / res['wall']:,.0f} events/s", flush=True)
    finally:
        for src in srcs.values():
            try:
                src.replication_slot.drop()
            finally:
                src.close()
        for slot in floors:
            cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                        "WHERE slot_name = %s", (slot,))
        cur.execute(f"DROP PUBLICATION IF EXISTS {publication}")
        cur.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
        admin.close()


def print_table(rows: int, results: list) -> None:
    print()
    print(f"{'source / decoder':<56} {'events/s':>10} {'ev/CPU-s':>10} {'wall s':>8} {'CPU s':>8} "
          f"{'peak RSS MB':>12} {'JSON MB':>8} {'server CPU s':>13}")
    for name, r in results:
        server = f"{r['server_cpu']:.2f}" if "server_cpu" in r else "-"
        per_cpu = f"{rows / r['cpu']:,.0f}" if r["cpu"] else "-"  # the in-server floor has no client
        print(f"{name:<56} {rows / r['wall']:>10,.0f} {per_cpu:>10} {r['wall']:>8.2f} "
              f"{r['cpu']:>8.2f} {r['rss_mb']:>12.0f} {r['bytes'] / 1e6:>8.1f} {server:>13}")
    by = dict(results)
    for new, old, label in (("mariadb fast", "mariadb library", "mariadb fast / library"),
                            ("postgres fast (streaming)", "postgres reference (peek, json)",
                             "postgres fast / reference"),
                            ("postgres pgoutput (streaming)", "postgres fast (streaming)",
                             "postgres pgoutput / wal2json fast")):
        if new in by and old in by:
            f, ref = by[new], by[old]
            print(f"{label}: {ref['wall'] / f['wall']:.2f}x events/s, {ref['cpu'] / f['cpu']:.2f}x less CPU")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--tx-rows", type=int, default=10)
    ap.add_argument("--files", type=int, default=4, help="MariaDB: binlog files the changes span")
    ap.add_argument("--only", choices=("mysql", "postgres"))
    ap.add_argument("--decoders", default="library,fast", help="MariaDB decoders to measure")
    ap.add_argument("--slice-mb", type=float, default=8.0,
                    help="MariaDB: the slice size of the in-file slices measurement")
    ap.add_argument("--plugin", choices=("wal2json", "pgoutput", "both"), default="both",
                    help="Postgres: the slots' output plugin(s) measured on the same backlog")
    ap.add_argument("--no-floor", action="store_true",
                    help="leave out the floor rows (the server streaming the range to a C client)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    print(f"{args.rows} row changes per source in transactions of {args.tx_rows} rows "
          f"(60% inserts, 30% updates, 10% deletes), 11 columns, {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    results: list = []
    if args.only in (None, "mysql"):
        bench_mysql(args.rows, args.tx_rows, args.files, args.decoders.split(","), args.slice_mb, results,
                    not args.no_floor)
    if args.only in (None, "postgres"):
        plugins = ["wal2json", "pgoutput"] if args.plugin == "both" else [args.plugin]
        bench_postgres(args.rows, args.tx_rows, plugins, results, not args.no_floor)
    print_table(args.rows, results)


if __name__ == "__main__":
    main()
