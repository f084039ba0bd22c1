"""The pgoutput plugin against the real PostgreSQL of scripts/services (it has wal2json too).

* The same WAL read through a wal2json slot and a pgoutput slot, both created before it: every
  item identical (envelope and key bytes, ids, transaction ends, end positions, position marks),
  in the same order. The WAL is the one ``test_postgres_reader.py`` compares its two wal2json
  readers on (every type the source converts, NULLs, unchanged TOAST values under REPLICA
  IDENTITY FULL and DEFAULT, key changes, a composite key, a table without a key, a
  multi-statement transaction, multi-row inserts, DDL between rows, deletes, TRUNCATE, empty
  and rolled-back transactions), plus what only pgoutput says differently: a table whose
  definition changes inside a transaction, a TRUNCATE of two tables at once, REPLICA IDENTITY
  USING INDEX, a type that is not built in, and a transaction larger than the reader holds in
  memory. Read whole, with and without a table filter, and cut at the heads between phases.
* End to end (``tidegate run``, in this process): a pipeline with ``plugin: pgoutput`` and the
  publication an administrator made delivers to Redis over two runs, each event once, in order.
* The plugin and the publication at the edges: a pipeline's own publication (created before its
  slot, FOR TABLE the captured tables; with too few privileges the run fails naming what to
  run), the server's choice when ``source.plugin`` is left out, a slot of the other plugin, a
  publication that does not cover a captured table, a dropped pgoutput slot.
"""

from __future__ import annotations

import json
import textwrap
import uuid

import psycopg2
import pytest
from tidegate import cli
from tidegate.errors import SlotMissingError, SourceSettingError
from tidegate.events import ChangeEvent, PositionMark
from tidegate.plan import EXIT_FATAL
from tidegate.sources.postgres.pgoutput import PgOutputDecoder
from tidegate.sources.postgres.slot import Slot
from tidegate.sources.postgres.source import PostgresSource
from tidegate.spec import PipelineSpec, SourceSpec

from tests.integration.sink_readers import redis_events
from tests.integration.source_items import assert_same
from tests.integration.test_postgres_reader import create_tables, q, tx, write_range

pytestmark = pytest.mark.integration

TABLES = ["types", "full_t", "dflt_t", "nopk", "ckey", "ddl", "ignored", "mid", "tr1", "tr2", "idx", "big"]


class SmallSpoolReader(PgOutputDecoder):
    """The pgoutput reader holding at most 64 KiB of a transaction in memory (then a file)."""

    spool_bytes = 64 << 10


def source(postgres, schema, slot, tables, *, plugin=None, publication=None, reader=None,
           conn=None) -> PostgresSource:
    spec = PipelineSpec(pipeline="rd_test", tenant="acme", sinks=(),
                        source=SourceSpec(kind="postgres", conn_id="cdc_postgres",
                                          tables=tuple(f"{schema}.{t}" for t in tables), slot=slot,
                                          plugin=plugin, publication=publication))
    return PostgresSource(spec, conn or postgres.cdc, decoder=reader)


def write_more(admin, s: str) -> None:
    """What pgoutput tells differently from wal2json: a definition changed inside a transaction
    (a second Relation message between rows), two tables truncated by one statement (one
    message), replica identity through an index, a domain, a transaction of ~300 KiB."""
    tx(admin, f"INSERT INTO {s}.mid VALUES (1, 'a')", f"ALTER TABLE {s}.mid ADD COLUMN w int",
       f"INSERT INTO {s}.mid VALUES (2, 'b', 2)", f"UPDATE {s}.mid SET w = 1 WHERE id = 1",
       f"TRUNCATE {s}.tr1, {s}.tr2", f"INSERT INTO {s}.tr1 VALUES (9)")
    q(admin, f"UPDATE {s}.idx SET v = 'changed' WHERE a = 1",  # the index columns from the new row
      f"UPDATE {s}.idx SET b = 20 WHERE a = 2",  # an index column changes: the old one's K tuple
      f"DELETE FROM {s}.idx WHERE a = 3")
    q(admin, f"INSERT INTO {s}.big SELECT g, repeat(md5(g::text), 8), g::{s}.posint "
             f"FROM generate_series(1, 1200) g")


def create_more(admin, s: str) -> None:
    q(admin, f"CREATE TABLE {s}.mid (id int PRIMARY KEY, v text)",
      f"CREATE TABLE {s}.tr1 (id int PRIMARY KEY)", f"CREATE TABLE {s}.tr2 (id int PRIMARY KEY)",
      f"INSERT INTO {s}.tr1 VALUES (1)", f"INSERT INTO {s}.tr2 VALUES (1)",
      f"CREATE TABLE {s}.idx (a int NOT NULL, b int NOT NULL, v text, PRIMARY KEY (a))",
      f"CREATE UNIQUE INDEX idx_ab ON {s}.idx (b, a)",
      f"ALTER TABLE {s}.idx REPLICA IDENTITY USING INDEX idx_ab",
      f"INSERT INTO {s}.idx VALUES (1, 1, 'x'), (2, 2, 'y'), (3, 3, 'z')",
      f"CREATE TABLE {s}.big (id int PRIMARY KEY, v text, p {s}.posint)")


@pytest.fixture(scope="module")
def admin(postgres):
    conn = psycopg2.connect(postgres.admin_dsn)
    conn.autocommit = True
    yield conn
    conn.close()


@pytest.fixture(scope="module")
def wal(postgres, admin):
    """(schema, wal2json slot, pgoutput slot, publication, heads): both slots and the
    publication made before the workload, the heads taken between its phases."""
    tag = uuid.uuid4().hex[:10]
    s, pub = f"pgo_{tag}", f"pgo_{tag}"
    slots = (f"pgo_w_{tag}", f"pgo_p_{tag}")
    q(admin, f"CREATE SCHEMA {s}")
    try:
        create_tables(admin, s)
        create_more(admin, s)
        q(admin, f"CREATE PUBLICATION {pub} FOR TABLE " + ", ".join(f"{s}.{t}" for t in TABLES))
        for slot, plugin in zip(slots, ("wal2json", "pgoutput"), strict=True):
            q(admin, f"SELECT pg_create_logical_replication_slot('{slot}', '{plugin}')")
        src = source(postgres, s, slots[0], ())
        heads = [src.head()]
        heads += [src.server.position(m) for m in write_range(admin, s)]
        write_more(admin, s)
        heads.append(src.head())
        src.close()
        yield s, slots, pub, heads
    finally:
        for slot in slots:
            q(admin, f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                     f"WHERE slot_name = '{slot}'")
        q(admin, f"DROP PUBLICATION IF EXISTS {pub}", f"DROP SCHEMA IF EXISTS {s} CASCADE")


def read(postgres, wal, tables, start, upto, plugin, reader=None) -> list:
    s, slots, pub, _ = wal
    slot = slots[0] if plugin == "wal2json" else slots[1]
    src = source(postgres, s, slot, tables, plugin=plugin, reader=reader,
                 publication=pub if plugin == "pgoutput" else None)
    try:
        return list(src.read(start, upto))
    finally:
        src.close()


def test_the_same_wal_gives_the_same_items_through_both_plugins(postgres, wal):
    heads = wal[3]
    every = TABLES
    filtered = [t for t in TABLES if t != "ignored"]
    for tables in ((), filtered):
        expected = read(postgres, wal, tables, heads[0], heads[-1], "wal2json")
        got = read(postgres, wal, tables, heads[0], heads[-1], "pgoutput")
        assert_same(expected, got)
        events = [e for e in got if isinstance(e, ChangeEvent)]
        assert len(events) > 4000
        assert {e.table for e in events} == set(filtered if tables else every) - {"tr2"}
        by_table: dict[str, list[str]] = {}
        for e in events:
            by_table.setdefault(e.table, []).append(e.op)
        assert by_table["idx"] == ["u", "u", "d"]
        assert by_table["mid"] == ["c", "c", "u"] and by_table["big"] == ["c"] * 1200
    # A transaction larger than the reader holds in memory comes back from its file the same.
    assert_same(read(postgres, wal, filtered, heads[0], heads[-1], "wal2json"),
                read(postgres, wal, filtered, heads[0], heads[-1], "pgoutput", SmallSpoolReader))
    # Cut at the heads between the phases: the same items as wal2json's, and together the whole.
    parts = []
    for a, b in zip(heads, heads[1:], strict=False):
        part = read(postgres, wal, every, a, b, "pgoutput")
        assert_same(read(postgres, wal, every, a, b, "wal2json"), part)
        assert isinstance(part[-1], PositionMark) or part[-1].end_position.lsn <= b.lsn
        parts += part
        # the quick look before a run says the same as the read (here every range has rows)
        for tables, expected in ((every, True), (["ignored"], a in (heads[1], heads[2]))):
            look = source(postgres, wal[0], wal[1][1], tables, plugin="pgoutput", publication=wal[2])
            try:
                assert look.has_changes(a, b) is expected, (tables, a, b)
            finally:
                look.close()
    whole = read(postgres, wal, every, heads[0], heads[-1], "pgoutput")
    assert [e.value for e in parts if isinstance(e, ChangeEvent)] == \
        [e.value for e in whole if isinstance(e, ChangeEvent)]


# --------------------------------------------------------------------------- end to end


@pytest.fixture()
def pipeline(tmp_path, monkeypatch, service_env, postgres, redis_service, admin):
    """(name, schema): a pipeline with plugin: pgoutput and its own publication, capturing
    orders and items of a schema of its own (specs and store under tmp_path)."""
    folder = tmp_path / "pipelines"
    folder.mkdir()
    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(folder))
    monkeypatch.setenv("TIDEGATE_CHECKPOINT_STORE", f"sqlite:///{tmp_path / 'ckpt.sqlite'}")
    name = f"pgo_{uuid.uuid4().hex[:8]}"
    q(admin, f"CREATE SCHEMA {name}",
      f"CREATE TABLE {name}.orders (id int PRIMARY KEY, status text, total numeric(10,2), note text)",
      f"CREATE TABLE {name}.items (order_id int, n int, qty int, PRIMARY KEY (order_id, n))",
      f"ALTER TABLE {name}.items REPLICA IDENTITY FULL",
      f"CREATE TABLE {name}.other (id int PRIMARY KEY)")
    (folder / f"{name}.yaml").write_text(textwrap.dedent(f"""
        pipeline: {name}
        source: {{kind: postgres, conn_id: cdc_postgres, slot: {name}, plugin: pgoutput,
                  tables: [{name}.orders, {name}.items]}}
        sinks:
          - {{id: cache, kind: redis, conn_id: cdc_redis, stream: "{{pipeline}}:{{table}}"}}
    """))
    yield name
    q(admin, f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
             f"WHERE slot_name = '{name}'",
      f"DROP PUBLICATION IF EXISTS tidegate_{name}", f"DROP SCHEMA IF EXISTS {name} CASCADE")


def tidegate(capsys, *args: str) -> tuple[int, dict | None, str]:
    """A `tidegate` command in this process: (exit code, its JSON output, stderr)."""
    rc = cli.main(list(args))
    out = capsys.readouterr()
    return rc, json.loads(out.out) if out.out.strip().startswith("{") else None, out.err


def test_a_pgoutput_pipeline_runs_end_to_end(pipeline, admin, capsys, redis_service):
    """The CDC role cannot create the pipeline's publication: the first run fails naming the
    statement an administrator runs, and creates nothing; once it is run, the pipeline creates its
    pgoutput slot and delivers two runs of changes to Redis, each event once, in commit order."""
    name = pipeline
    rc, _, err = tidegate(capsys, "run", name, "--run-id", "r0")
    assert rc == EXIT_FATAL and f"cannot create publication 'tidegate_{name}'" in err, err
    assert "CREATE privilege on the database and ownership of every table" in err, err
    assert q(admin, f"SELECT 1 FROM pg_replication_slots WHERE slot_name = '{name}'") == []
    statement = err.split("Have an administrator run: ", 1)[1].split("; the pipeline", 1)[0]
    assert statement == f'CREATE PUBLICATION "tidegate_{name}" FOR TABLE "{name}"."items", "{name}"."orders"'
    q(admin, statement)
    assert tidegate(capsys, "run", name, "--run-id", "r0")[0] == 0  # creates the slot
    assert q(admin, f"SELECT plugin FROM pg_replication_slots WHERE slot_name = '{name}'") == [("pgoutput",)]

    big = "(SELECT string_agg(md5(g::text), '') FROM generate_series(1, 300) g)"
    tx(admin, f"INSERT INTO {name}.orders VALUES (1, 'new', 10.50, {big}), (2, 'new', 3, NULL)",
       f"INSERT INTO {name}.items VALUES (1, 1, 2), (1, 2, 1), (2, 1, 5)",
       f"INSERT INTO {name}.other VALUES (1)")
    q(admin, f"UPDATE {name}.orders SET status = 'paid' WHERE id = 1")  # the note stays in TOAST
    rc, report, err = tidegate(capsys, "run", name, "--run-id", "r1")
    assert rc == 0 and report["events"] == 6, err
    tx(admin, f"UPDATE {name}.items SET qty = qty + 1 WHERE order_id = 1",
       f"DELETE FROM {name}.orders WHERE id = 2", f"DELETE FROM {name}.items WHERE order_id = 2")
    q(admin, f"INSERT INTO {name}.orders VALUES (3, 'new', 0.01, 'short')")
    rc, report, err = tidegate(capsys, "run", name, "--run-id", "r2")
    assert rc == 0 and report["events"] == 5, err

    orders = [json.loads(e) for e in redis_events(redis_service.cdc, f"{name}:orders")]
    items = [json.loads(e) for e in redis_events(redis_service.cdc, f"{name}:items")]
    assert [(e["op"], e["key"]["id"]) for e in orders] == [("c", 1), ("c", 2), ("u", 1), ("d", 2), ("c", 3)]
    note = orders[0]["after"]["note"]
    assert orders[0]["after"] == {"id": 1, "status": "new", "total": "10.50", "note": note}
    assert len(note) == 9600
    assert orders[2]["after"]["note"] == "__debezium_unavailable_value"  # unchanged TOAST, DEFAULT identity
    assert orders[2]["before"] == {"id": 1} and orders[3]["before"] == {"id": 2}
    assert [(e["op"], e["key"], e["after"] and e["after"]["qty"]) for e in items] == [
        ("c", {"order_id": 1, "n": 1}, 2), ("c", {"order_id": 1, "n": 2}, 1),
        ("c", {"order_id": 2, "n": 1}, 5), ("u", {"order_id": 1, "n": 1}, 3),
        ("u", {"order_id": 1, "n": 2}, 2), ("d", {"order_id": 2, "n": 1}, None)]
    assert items[3]["before"] == {"order_id": 1, "n": 1, "qty": 2}  # REPLICA IDENTITY FULL: the old row
    every = orders + items
    assert len({e["idempotency_key"] for e in every}) == len(every) == 11
    assert {e["source"]["tx_id"] for e in orders[:2] + items[:3]} == {orders[0]["source"]["tx_id"]}
    rc, report, _ = tidegate(capsys, "run", name, "--run-id", "r3")  # nothing new: nothing delivered
    assert rc == 0 and len(redis_events(redis_service.cdc, f"{name}:orders")) == 5


# --------------------------------------------------------------------------- plugin and publication


@pytest.fixture()
def scratch(admin):
    """A schema with table a (and its name), dropped with every slot and publication made for it."""
    s = f"pgs_{uuid.uuid4().hex[:10]}"
    q(admin, f"CREATE SCHEMA {s}", f"CREATE TABLE {s}.a (id int PRIMARY KEY, v text)",
      f"CREATE TABLE {s}.b (id int PRIMARY KEY)")
    yield s
    q(admin, f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
             f"WHERE slot_name LIKE '{s}%'")
    made = f"SELECT pubname FROM pg_publication WHERE pubname IN ('{s}_pub', 'tidegate_{s}')"
    for (pub,) in q(admin, made):
        q(admin, f"DROP PUBLICATION {pub}")
    q(admin, f"DROP SCHEMA {s} CASCADE")


def slot_plugin(admin, slot):
    return q(admin, f"SELECT plugin FROM pg_replication_slots WHERE slot_name = '{slot}'")


def test_the_pipelines_publication_comes_before_its_slot_and_is_for_the_captured_tables(
        postgres, admin, scratch):
    s = scratch
    spec = PipelineSpec(pipeline=s, tenant="acme", sinks=(), source=SourceSpec(
        kind="postgres", conn_id="x", tables=(f"{s}.a", f"{s}.gone"), slot=f"{s}_own", plugin="pgoutput"))
    src = PostgresSource(spec, postgres.admin)  # a role that may create it
    try:
        assert src.replication_slot.ensure() is not None and slot_plugin(admin, f"{s}_own") == [("pgoutput",)]
        published = f"SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = 'tidegate_{s}'"
        assert q(admin, published) == [(s, "a")]
        start = src.head()
        q(admin, f"INSERT INTO {s}.a VALUES (1, 'one')", f"INSERT INTO {s}.b VALUES (1)")
        got = [e.after for e in src.read(start, src.head()) if isinstance(e, ChangeEvent)]
        assert got == [{"id": 1, "v": "one"}]
        problems = {p.code: p for p in src.preflight()}
        assert "publication" not in problems  # it covers every captured table that exists
    finally:
        src.close()


def test_without_source_plugin_a_new_slot_takes_what_the_server_offers(postgres, admin, scratch, caplog):
    s = scratch
    # A list of tables: pgoutput first, but the CDC role may not create the publication (it owns
    # no table), so the slot gets wal2json, logged with the statement an administrator can run.
    src = source(postgres, s, f"{s}_auto", ["a"])
    try:
        assert src.replication_slot.plugin_in_use() is None  # decided when the slot is made
        src.replication_slot.ensure()
        assert slot_plugin(admin, f"{s}_auto") == [("wal2json",)]
        assert src.replication_slot.plugin_in_use() == "wal2json"
        assert 'cannot be created with pgoutput here (cannot create publication \'tidegate_rd_test\'' \
            in caplog.text and f'CREATE PUBLICATION "tidegate_rd_test" FOR TABLE "{s}"."a"' in caplog.text
        assert q(admin, "SELECT count(*) FROM pg_publication WHERE pubname = 'tidegate_rd_test'") == [(0,)]
        # A server that cannot load the first choice says so at once; the slot gets the next one.
        slot = Slot(src.server, f"{s}_next", choices=("tidegate_no_such_plugin", "pgoutput"))
        assert slot.ensure() is not None and slot_plugin(admin, f"{s}_next") == [("pgoutput",)]
        with pytest.raises(SourceSettingError, match="no_such_plugin output plugin is not installed"):
            Slot(src.server, f"{s}_none", plugin="tidegate_no_such_plugin").ensure()
    finally:
        src.close()
    q(admin, f"SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
             f"WHERE slot_name LIKE '{s}%'")
    # A role that may create it: the pipeline's own publication, FOR TABLE the list, and pgoutput.
    # Every table, or patterns: wal2json, which reaches no table the pipeline does not capture.
    # A named publication: pgoutput, the only plugin that reads it.
    for tables, publication, plugin in ((["a"], None, "pgoutput"), ([], None, "wal2json"),
                                        ([f"{s}.a*"], None, "wal2json"), ([], f"{s}_pub", "pgoutput")):
        q(admin, f"DROP PUBLICATION IF EXISTS tidegate_{s}")
        if publication:
            q(admin, f"CREATE PUBLICATION {publication} FOR TABLE {s}.b")
        spec = PipelineSpec(pipeline=s, tenant="acme", sinks=(), source=SourceSpec(
            kind="postgres", conn_id="x", tables=tuple(t if "." in t else f"{s}.{t}" for t in tables),
            slot=f"{s}_{plugin[0]}{len(tables)}{publication is not None:d}", publication=publication))
        src = PostgresSource(spec, postgres.admin)
        try:
            assert src.replication_slot.ensure() is not None
            assert slot_plugin(admin, spec.source.slot) == [(plugin,)], (tables, publication)
            own = q(admin, f"SELECT count(*) FROM pg_publication WHERE pubname = 'tidegate_{s}'")
            assert own == [(1 if (plugin, publication) == ("pgoutput", None) else 0,)]
        finally:
            src.replication_slot.drop()  # the server's slots are shared by the tests running at once
            src.close()


def test_a_slot_of_the_other_plugin_is_named_with_the_setting(postgres, admin, scratch):
    s = scratch
    q(admin, f"SELECT pg_create_logical_replication_slot('{s}_w', 'wal2json')")
    src = source(postgres, s, f"{s}_w", ["a"], plugin="pgoutput", publication=f"{s}_pub")
    try:
        with pytest.raises(SourceSettingError) as e:
            src.replication_slot.check()
        assert f"source.plugin is pgoutput but replication slot '{s}_w'" in str(e.value)
        assert "was created with wal2json" in str(e.value)
        assert any(p.code == "slot" and "source.plugin is pgoutput" in p.message and p.severity == "error"
                   for p in src.preflight())
    finally:
        src.close()
    left_out = source(postgres, s, f"{s}_w", ["a"])  # without source.plugin the slot's plugin is read
    try:
        start = left_out.head()
        q(admin, f"INSERT INTO {s}.a VALUES (1, 'x')")
        got = [e.after["id"] for e in left_out.read(start, left_out.head()) if isinstance(e, ChangeEvent)]
        assert got == [1]
    finally:
        left_out.close()


def test_preflight_and_reads_check_the_named_publication(postgres, admin, scratch):
    s = scratch
    src = source(postgres, s, f"{s}_p", ["a", "b"], plugin="pgoutput", publication=f"{s}_pub")
    try:
        missing = [p for p in src.preflight() if p.code == "publication"]
        assert [p.severity for p in missing] == ["error"] and "does not exist" in missing[0].message
        with pytest.raises(SourceSettingError, match=r"\(source.publication\) does not exist"):
            src.replication_slot.ensure()  # a named publication is never created
        q(admin, f"SELECT pg_create_logical_replication_slot('{s}_p', 'pgoutput')",
          f"INSERT INTO {s}.a VALUES (0, 'before the publication')",
          f"CREATE PUBLICATION {s}_pub FOR TABLE {s}.a WITH (publish = 'insert, update')")
        problems = [p for p in src.preflight() if p.code == "publication"]
        assert [p.severity for p in problems] == ["error", "warning"]
        assert f"does not publish {s}.b" in problems[0].message and f"ADD TABLE {s}.b" in problems[0].message
        assert "does not publish delete, truncate" in problems[1].message
        # The slot is older than the publication: pgoutput cannot decode a change before it.
        start = src.head()
        q(admin, f"INSERT INTO {s}.a VALUES (1, 'x')")
        with pytest.raises(SourceSettingError, match="must exist from before the slot's start") as e:
            list(src.read(start, src.head()))
        assert f"pg_drop_replication_slot('{s}_p')" in str(e.value)
        # A dropped pgoutput slot halts the pipeline as a wal2json one does.
        src.replication_slot.drop()
        with pytest.raises(SlotMissingError):
            src.check_retention(start, first_run=False)
    finally:
        src.close()


def test_a_pgoutput_slot_is_read_in_the_runs_process(postgres, wal):
    """Its compiled rows cost less in the run's process than shipped from a reader process
    (docs/performance.md): a run reads it in-process, and `tidegate run` starts no reader
    process early for a spec that names pgoutput or a publication. A wal2json slot still goes
    to a reader process."""
    import multiprocessing

    from tidegate.reader_process import ReaderProcess
    from tidegate.segments import Slice
    from tidegate.sources.postgres import KIND

    s, slots, pub, heads = wal
    src = source(postgres, s, slots[1], (), plugin="pgoutput", publication=pub)
    before = set(multiprocessing.active_children())
    try:
        assert KIND.light_reads(src)
        with ReaderProcess(min_bytes=0) as reader:
            got = list(reader.read_log(src, Slice(heads[0], heads[-1])))
            assert set(multiprocessing.active_children()) == before
        assert_same(list(src.read(heads[0], heads[-1])), got)
    finally:
        src.close()
    w = source(postgres, s, slots[0], ())
    try:
        assert not KIND.light_reads(w)
    finally:
        w.close()
    named = [SourceSpec(kind="postgres", conn_id="c", plugin="pgoutput"),
             SourceSpec(kind="postgres", conn_id="c", publication="p")]
    assert [KIND.may_read_in_child(x) for x in named] == [False, False]
    assert KIND.may_read_in_child(SourceSpec(kind="postgres", conn_id="c"))
