"""Snapshot read throughput: rows/s of Spark tasks reading primary-key chunks in parallel,
against one sequential reader, in the same run; with ``--peers``, Debezium's initial snapshot of
the same table beside them.

    eval "$(scripts/services env)"
    PATH="$PWD/.venv/bin:$PATH" SPARK_LOCAL_IP=127.0.0.1 .venv/bin/python benchmarks/snapshot.py \\
        [--rows 1000000] [--chunk-rows 50000] [--parallelism 2] [--master local[2]] \\
        [--source mysql|postgres] [--peers [--repeats 1]]

Table: ``--rows`` rows of an 11-column table (BIGINT key, INT, VARCHAR, DECIMAL, SMALLINT,
DOUBLE, VARCHAR(100), DATETIME(6), TIMESTAMP(3), TINYINT, CHAR(8)), filled by the server
itself. Its snapshot is planned once (``tables`` + ``chunk_plan`` and the handoff, timed
apart; PostgreSQL: after the pipeline's slot is created, as a first run does) and
then read twice, each time in a fresh child process that consumes every row's serialized
envelope in chunk order, as a run's coordinator does:

* ``sequential``: ``snapshot.read_chunk``, one chunk after the other with one connection, rows
  turned into envelopes in that process (``tidegate run`` reads this way);
* ``spark``: ``tidegate.spark.chunks.read_chunks`` on a ``--master`` session, ``--parallelism``
  chunks read at once by Spark tasks that also build the envelopes; the driver gets the bytes.

Both hand the chunks over as a run does: each chunk's upper bound extends the scan of the log
from the handoff, and rows of keys the log changes are left to it (``snapshot.ChangedKeys``).

Each reports rows/s over the read (the Spark session's start-up, about 15 s here, is reported
apart and not in rows/s), CPU seconds of the child and its descendants (for Spark: the driver,
the JVM and its Python workers; not the database server's), and peak RSS: the
reading process (for Spark the Python driver) and, for Spark, the driver JVM, sampled every
0.2 s. The speed-up is spark rows/s over sequential rows/s of this one run. The workload uses
the admin connection, the reads the CDC one; the table is dropped at the end.

``--peers`` adds a third read of the same table, right after the sequential one (the Spark read
comes last; ``--repeats N`` reads sequentially and with Debezium N times each, alternating which
goes first, and tables the best of each): Debezium's own connector
(MariaDB 3.5.0.Final / PostgreSQL 3.6.1.Final) with ``snapshot.mode=initial``, in the compat
capture program's ``count`` command (tests/compat/debezium-capture, built by ``make
compat-build``): Debezium's embedded engine with its JSON format and a batch consumer, engine and
JVM defaults (no -Xmx; G1; C2), schemas off and ``decimal.handling.mode=string`` (the form of
tidegate's envelope). Every record's value is taken as a string and its UTF-8 bytes counted;
nothing is kept or written. Its rows/s is N over the first record's hand-over to the N-th's (the
JVM start, the engine and connector start, the lock and the snapshot query's start are reported
apart: ``jvm``, ``connector start``); its CPU seconds are the JVM's process CPU time over the
same span (every thread, GC and JIT included; not the database server's), its peak RSS the
JVM's VmHWM. It connects as the admin connection (MariaDB: its global read lock needs RELOAD;
PostgreSQL: it creates its publication and slot, dropped at the end). The ratio printed is
tidegate sequential rows/s over Debezium's.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import pickle
import secrets
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "include"))

COLUMNS_MYSQL = ("id BIGINT PRIMARY KEY, customer INT NOT NULL, status VARCHAR(20), total DECIMAL(12,2), "
                 "qty SMALLINT, price DOUBLE, note VARCHAR(100), created DATETIME(6), "
                 "updated TIMESTAMP(3) NULL, flag TINYINT, code CHAR(8)")
FILL_MYSQL = ("INSERT INTO {t} SELECT seq, seq % 1000, ELT(1 + seq % 3, 'new', 'paid', 'shipped'), "
              "seq / 7, seq % 100, seq / 3, CONCAT('note ', seq), '2024-01-02 03:04:05.123456' + "
              "INTERVAL seq SECOND, '2024-01-02 03:04:05.678' + INTERVAL seq SECOND, seq % 2, "
              "LPAD(seq, 8, '0') FROM {db}.seq_{lo}_to_{hi}")
COLUMNS_PG = ("id bigint PRIMARY KEY, customer int NOT NULL, status varchar(20), total numeric(12,2), "
              "qty smallint, price double precision, note varchar(100), created timestamp(6), "
              "updated timestamptz(3), flag smallint, code char(8)")
FILL_PG = ("INSERT INTO {t} SELECT g, g % 1000, (ARRAY['new','paid','shipped'])[1 + g % 3], g / 7.0, "
           "g % 100, g / 3.0, 'note ' || g, "
           "'2024-01-02 03:04:05.123456'::timestamp + g * interval '1 second', "
           "'2024-01-02 03:04:05.678+00'::timestamptz + g * interval '1 second', g % 2, "
           "lpad(g::text, 8, '0') FROM generate_series({lo}, {hi}) g")


# --------------------------------------------------------------------------- the table


def spec_for(source: str, table: str, chunk_rows: int, parallelism: int):
    from tidegate.spec import load_spec_text

    kind = "mysql" if source == "mysql" else "postgres"
    text = (f"pipeline: bench_snapshot\nsource: {{kind: {kind}, conn_id: cdc_{source}, tables: [{table}]}}\n"
            f"snapshot: {{chunk_rows: {chunk_rows}, parallelism: {parallelism}}}\n"
            f"sinks: [{{id: k, kind: kafka, conn_id: cdc_kafka, topic: t}}]\n")
    return load_spec_text(text, origin="<benchmark>")


def create_table(source: str, name: str, rows: int) -> str:
    from tidegate.connections import get_connection

    admin = get_connection(f"cdc_{source}_admin")
    step = 250_000
    if source == "mysql":
        import pymysql

        conn = pymysql.connect(host=admin.host, port=admin.port, user=admin.login, password=admin.password,
                               autocommit=True)
        with conn.cursor() as c:
            c.execute(f"CREATE DATABASE {name}")
            c.execute(f"CREATE TABLE {name}.bench ({COLUMNS_MYSQL})")
            for lo in range(1, rows + 1, step):
                c.execute(FILL_MYSQL.format(t=f"{name}.bench", db=name, lo=lo, hi=min(rows, lo + step - 1)))
        conn.close()
        return f"{name}.bench"
    import psycopg2

    conn = psycopg2.connect(host=admin.host, port=admin.port, user=admin.login, password=admin.password,
                            dbname=admin.schema)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute(f"CREATE SCHEMA {name}")
        c.execute(f"CREATE TABLE {name}.bench ({COLUMNS_PG})")
        for lo in range(1, rows + 1, step):
            c.execute(FILL_PG.format(t=f"{name}.bench", lo=lo, hi=min(rows, lo + step - 1)))
        c.execute(f"GRANT USAGE ON SCHEMA {name} TO PUBLIC")
        c.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA {name} TO PUBLIC")
        c.execute(f"ANALYZE {name}.bench")
    conn.close()
    return f"{name}.bench"


def drop_table(source: str, name: str) -> None:
    from tidegate.connections import get_connection

    admin = get_connection(f"cdc_{source}_admin")
    if source == "mysql":
        import pymysql

        conn = pymysql.connect(host=admin.host, port=admin.port, user=admin.login, password=admin.password,
                               autocommit=True)
        with conn.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.close()
        return
    import psycopg2

    conn = psycopg2.connect(host=admin.host, port=admin.port, user=admin.login, password=admin.password,
                            dbname=admin.schema)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")
    conn.close()


def plan(spec) -> tuple[str, float]:
    """The snapshot record (pickled, base64, for the child's argv) and the planning seconds."""
    from tidegate.connections import get_connection
    from tidegate.snapshot import plan_snapshot
    from tidegate.sources import make_source

    source = make_source(spec, get_connection(spec.source.conn_id))
    try:
        if spec.source.kind == "postgres":  # as a pipeline's first run: the slot holds the log from here
            source.replication_slot.ensure()
        t0 = time.perf_counter()
        rec = plan_snapshot(spec, source, handoff=source.snapshots().handoff(source.head()), kind="start")
        return base64.b64encode(pickle.dumps(rec)).decode("ascii"), time.perf_counter() - t0
    finally:
        source.close()


def drop_slot(spec) -> None:
    from tidegate.connections import get_connection
    from tidegate.sources import make_source

    if spec.source.kind == "postgres":
        source = make_source(spec, get_connection(spec.source.conn_id))
        try:
            source.replication_slot.drop()
        finally:
            source.close()


# --------------------------------------------------------------------------- Debezium


CAPTURE_DIR = ROOT / "tests" / "compat" / "debezium-capture"
# Maven Central has the MariaDB connector only up to 3.5.0.Final (tests/compat/debezium-capture/pom.xml)
DEBEZIUM_BUILDS = {"mysql": "mariadb", "postgres": "postgres"}


def debezium_properties(source: str, name: str) -> tuple[dict[str, str], str]:
    """Debezium's initial snapshot of ``name``.bench, its defaults but where its output would
    differ in form from tidegate's envelope (schemas off, DECIMAL as a string); and the table
    as Debezium names it after the topic prefix."""
    from tidegate.connections import get_connection

    admin = get_connection(f"cdc_{source}_admin")
    props = {
        "name": f"bench-{name}", "topic.prefix": "bench",
        "database.hostname": admin.host, "database.port": str(admin.port),
        "database.user": admin.login, "database.password": admin.password or "",
        "snapshot.mode": "initial", "table.include.list": f"{name}.bench",
        "offset.storage": "org.apache.kafka.connect.storage.MemoryOffsetBackingStore",
        "offset.flush.interval.ms": "60000",
        "converter.schemas.enable": "false", "key.converter.schemas.enable": "false",
        "value.converter.schemas.enable": "false",
        "decimal.handling.mode": "string", "tombstones.on.delete": "false",
    }
    if source == "mysql":
        props.update({"connector.class": "io.debezium.connector.mariadb.MariaDbConnector",
                      "database.server.id": str(48000 + secrets.randbelow(1000)),
                      "database.include.list": name, "include.schema.changes": "false",
                      "schema.history.internal": "io.debezium.relational.history.MemorySchemaHistory"})
    else:
        props.update({"connector.class": "io.debezium.connector.postgresql.PostgresConnector",
                      "database.dbname": admin.schema, "plugin.name": "pgoutput",
                      "slot.name": name, "slot.drop.on.stop": "true",
                      "publication.name": name, "publication.autocreate.mode": "filtered"})
    return props, f"{name}.bench"


def drop_debezium_leftovers(source: str, name: str) -> None:
    """The slot and publication Debezium made (the slot is dropped on stop; not after a crash)."""
    if source != "postgres":
        return
    import psycopg2
    from tidegate.connections import get_connection

    admin = get_connection("cdc_postgres_admin")
    conn = psycopg2.connect(host=admin.host, port=admin.port, user=admin.login, password=admin.password,
                            dbname=admin.schema)
    conn.autocommit = True
    with conn.cursor() as c:
        c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                  "WHERE slot_name = %s AND NOT active", (name,))
        c.execute(f"DROP PUBLICATION IF EXISTS {name}")
    conn.close()


def run_debezium(source: str, name: str, rows: int, workdir: Path) -> dict:
    """Debezium's initial snapshot of the table in its own JVM; the compat program's ``count``."""
    build = CAPTURE_DIR / "target" / DEBEZIUM_BUILDS[source]
    if not (build / "classes").is_dir() or not (build / "lib").is_dir():
        raise SystemExit(f"--peers: Debezium's capture program is not built ({build} is missing): "
                         f"run `make compat-build` first")
    props, table = debezium_properties(source, name)
    path = workdir / "debezium.properties"
    # a properties file, not argv: it holds the password
    path.write_text("".join(f"{k}={v}\n".replace("\\", "\\\\") for k, v in props.items()))
    path.chmod(0o600)
    log = workdir / "debezium.log"
    t0 = time.perf_counter()
    with open(workdir / "debezium.out", "w") as out, open(log, "w") as err:
        proc = subprocess.Popen(["java", "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                                 "-cp", f"{build / 'classes'}:{build / 'lib'}/*",
                                 "tidegate.compat.DebeziumCapture", "count", "--properties", str(path),
                                 "--table", table, "--rows", str(rows)],
                                stdout=out, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - t0
    lines = (workdir / "debezium.out").read_text().splitlines()
    counted = [ln for ln in lines if ln.startswith("COUNTED ")]
    if proc.returncode != 0 or not counted:
        tail = log.read_text(errors="replace")[-3000:]
        raise SystemExit(f"debezium exited with {proc.returncode}:\n{tail}")
    r = json.loads(counted[-1][len("COUNTED "):])
    shutil.rmtree(workdir)  # kept when the run fails: its log
    return {"mode": "debezium", "rows": r["rows"], "bytes": r["bytes"],
            "last_snapshot_mark": r["last_snapshot_mark"], "other_records": r["other_records"],
            "wall_s": round(r["snapshot_s"], 2),
            "rows_per_s": round(r["rows"] / r["snapshot_s"]), "cpu_s": round(r["snapshot_cpu_s"], 1),
            "peak_rss_mb": round(r["peak_rss_mb"]), "jvm_start_s": round(r["jvm_start_s"], 2),
            "connector_start_s": round(r["connector_start_s"], 2),
            "start_cpu_s": round(r["start_cpu_s"], 1), "process_wall_s": round(wall, 1),
            "process_cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "process_peak_rss_mb": round(usage.ru_maxrss / 1024), "max_heap_mb": round(r["max_heap_mb"])}


def load_average() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


# --------------------------------------------------------------------------- measuring child


def tree_cpu() -> float:
    """CPU seconds of this process and every live descendant (the Spark JVM, its Python
    workers), with what their finished children used."""
    import psutil

    total = 0.0
    me = psutil.Process()
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


class PeakRss:
    """Peak RSS (MB) of this process and of its JVM child, sampled every 0.2 s."""

    def __init__(self):
        import psutil

        self.me = psutil.Process()
        self.peak = {"reader_mb": 0.0, "jvm_mb": 0.0}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(0.2)

    def sample(self) -> None:
        try:
            self.peak["reader_mb"] = max(self.peak["reader_mb"], self.me.memory_info().rss / 2**20)
            jvm = [p for p in self.me.children(recursive=True) if "java" in p.name()]
            if jvm:
                self.peak["jvm_mb"] = max(self.peak["jvm_mb"], sum(p.memory_info().rss for p in jvm) / 2**20)
        except Exception:  # noqa: BLE001, S110 - a process that just ended
            pass

    def __enter__(self) -> PeakRss:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sample()
        self._stop.set()
        self._thread.join()


def child(mode: str, spec_args: list, record_json: str, master: str) -> dict:
    import resource

    from tidegate.connections import get_connection
    from tidegate.positions import SnapshotPosition
    from tidegate.reading import SegmentRead
    from tidegate.segments import Chunk
    from tidegate.shipped import ShippedEvent
    from tidegate.snapshot import ChangedKeys, chunk_table, read_chunk
    from tidegate.sources import make_source
    from tidegate.spark.chunks import read_chunks

    spec = spec_for(*spec_args)
    rec = pickle.loads(base64.b64decode(record_json))
    connection = get_connection(spec.source.conn_id)
    source = make_source(spec, connection)
    chunks = [Chunk(SnapshotPosition(rec.snapshot_id, n, rec.handoff)) for n in range(1, len(rec.chunks) + 1)]

    def sequential():
        for seg in chunks:
            read = read_chunk(spec, source, rec, seg.number)
            yield SegmentRead(seg, read.events, read.upper)

    out: dict = {"mode": mode}
    spark = None
    with PeakRss() as rss:
        if mode == "spark":
            from pyspark.sql import SparkSession

            t0 = time.perf_counter()
            spark = (SparkSession.builder.master(master).appName("tidegate-bench-snapshot")
                     .config("spark.ui.enabled", "false").getOrCreate())
            out["session_start_s"] = round(time.perf_counter() - t0, 1)
            reads = read_chunks(spark, spec, connection, rec, chunks)
        else:
            reads = sequential()
        cpu0 = tree_cpu()
        t0 = time.perf_counter()
        rows = size = compiled = 0
        changed = ChangedKeys(rec, source)  # the consistent handoff's scan of the log, as a run does
        for seg, items, upper in reads:
            changed.scan_to(upper)
            for ev in changed.drop_changed(chunk_table(rec, seg.number), items, upper):
                rows += 1
                size += len(ev.value)
                compiled += type(ev) is ShippedEvent
        wall = time.perf_counter() - t0
        cpu = tree_cpu() - cpu0
    if spark is not None:
        spark.stop()
    source.close()
    peak = max(rss.peak["reader_mb"], resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    # rows the compiled path wrote (sources/snapshot_rows.py; a Spark read's rows all arrive shipped)
    out.update(rows=rows, compiled_rows=compiled if mode == "sequential" else None,
               bytes=size, wall_s=round(wall, 2), rows_per_s=round(rows / wall),
               cpu_s=round(cpu, 1), peak_rss_mb=round(peak),
               peak_jvm_rss_mb=round(rss.peak["jvm_mb"]) if mode == "spark" else None)
    return out


def run_child(mode: str, spec_args: list, record_json: str, master: str) -> dict:
    r = subprocess.run([sys.executable, __file__, "--child", mode, "--child-args",
                        json.dumps([spec_args, record_json, master])],
                       capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT / "include")})
    if r.returncode != 0:
        raise SystemExit(f"{mode} child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--chunk-rows", type=int, default=50_000)
    p.add_argument("--parallelism", type=int, default=2, help="chunks read at once by Spark tasks")
    p.add_argument("--master", default="local[2]")
    p.add_argument("--source", choices=("mysql", "postgres"), default="mysql")
    p.add_argument("--peers", action="store_true",
                   help="also Debezium's initial snapshot of the same table (make compat-build first)")
    p.add_argument("--repeats", type=int, default=1,
                   help="sequential and Debezium reads this many times each, alternating; the best is tabled")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-args", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        spec_args, record_json, master = json.loads(args.child_args)
        print(json.dumps(child(args.child, spec_args, record_json, master)))
        return 0
    name = "bench_snap_" + uuid.uuid4().hex[:8]
    t0 = time.perf_counter()
    table = create_table(args.source, name, args.rows)
    print(f"{args.source}: {args.rows} rows in {table} filled in {time.perf_counter() - t0:.1f}s", flush=True)
    try:
        spec_args = [args.source, table, args.chunk_rows, args.parallelism]
        record_json, plan_s = plan(spec_for(*spec_args))
        chunks = len(pickle.loads(base64.b64decode(record_json)).chunks)
        print(f"plan: {chunks} chunks of at most {args.chunk_rows} rows in {plan_s:.2f}s", flush=True)
        runs: dict[str, list[dict]] = {}
        for mode in measurement_order(args.peers, args.repeats):
            print(f"{mode}: starting, {load_average()}", flush=True)
            if mode == "debezium":
                workdir = Path(os.environ.get("TMPDIR", "/tmp")) / name
                workdir.mkdir(parents=True, exist_ok=True)
                result = run_debezium(args.source, name, args.rows, workdir)
            else:
                result = run_child(mode, spec_args, record_json, args.master)
            result["load_1min"] = round(os.getloadavg()[0], 2)
            runs.setdefault(mode, []).append(result)
            print(json.dumps(result), flush=True)
        print(f"end: {load_average()}", flush=True)
        report(args, chunks, runs)
    finally:
        drop_slot(spec_for(args.source, table, args.chunk_rows, args.parallelism))
        if args.peers:
            drop_debezium_leftovers(args.source, name)
        drop_table(args.source, name)
    return 0


def measurement_order(peers: bool, repeats: int) -> list[str]:
    """The sequential read and Debezium's next to each other (the two the ratio compares, on a
    machine whose load moves), their order swapped on every repeat; the Spark path once, last."""
    pairs = [("sequential", "debezium") if i % 2 == 0 else ("debezium", "sequential") for i in range(repeats)]
    return [m for pair in pairs for m in pair if peers or m != "debezium"] + ["spark"]


def report(args, chunks: int, runs: dict[str, list[dict]]) -> None:
    counts = [r["rows"] for rs in runs.values() for r in rs]
    assert counts == [args.rows] * len(counts), counts
    # the best of each mode's repeats: the one least slowed by the rest of the machine
    results = {mode: max(rs, key=lambda r: r["rows_per_s"]) for mode, rs in runs.items()}
    seq, spk, dbz = results["sequential"], results["spark"], results.get("debezium")
    if args.repeats > 1:
        for mode, rs in runs.items():
            each = ", ".join(f"{r['rows_per_s']:,} (load {r['load_1min']})" for r in rs)
            print(f"  {mode}: rows/s {each}")
    print(f"\nsnapshot of {args.rows} rows ({args.source}, {chunks} chunks of {args.chunk_rows}):")
    print(f"  {'':<28} {'rows/s':>9}  {'read s':>7}  {'cpu s':>6}  peak RSS")
    print(f"  {'tidegate sequential (1 proc)':<28} {seq['rows_per_s']:>9,}  {seq['wall_s']:>7.1f}  "
          f"{seq['cpu_s']:>6.1f}  {seq['peak_rss_mb']} MB")
    print(f"  {'tidegate spark ' + args.master + ' x' + str(args.parallelism):<28} {spk['rows_per_s']:>9,}  "
          f"{spk['wall_s']:>7.1f}  {spk['cpu_s']:>6.1f}  {spk['peak_rss_mb']} MB driver (python) + "
          f"{spk['peak_jvm_rss_mb']} MB (JVM); session start {spk['session_start_s']} s apart")
    if dbz:
        print(f"  {'debezium initial snapshot':<28} {dbz['rows_per_s']:>9,}  {dbz['wall_s']:>7.1f}  "
              f"{dbz['cpu_s']:>6.1f}  {dbz['peak_rss_mb']} MB (JVM); jvm {dbz['jvm_start_s']} s + "
              f"connector start {dbz['connector_start_s']} s apart")
    print(f"  speed-up (spark / sequential): {spk['rows_per_s'] / seq['rows_per_s']:.2f}x")
    if dbz:
        print(f"  tidegate sequential / debezium: {seq['rows_per_s'] / dbz['rows_per_s']:.2f}x; "
              f"spark / debezium: {spk['rows_per_s'] / dbz['rows_per_s']:.2f}x")


if __name__ == "__main__":
    sys.exit(main())
