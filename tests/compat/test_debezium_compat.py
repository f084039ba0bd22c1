"""tidegate's `envelope: debezium` against Debezium itself, on the same backlog (docs/compat.md).

Per source, one backlog (tests/compat/backlogs.py) is captured by Debezium's own connector
(embedded, tests/compat/debezium-capture) and by a tidegate pipeline delivering to Kafka with
`envelope: debezium`, once with schemas off and once with schemas on (the JsonConverter's
{schema, payload} form). The two outputs are joined by source position (MariaDB binlog file,
position and row; PostgreSQL LSN and Debezium's sequence) and compared field by field after
removing only harness.IGNORED_FIELDS / IGNORED_HEADERS; the failure lists every differing field of
every event. Then Debezium's ExtractNewRecordState runs over both sides' records and must give
the same rows. A second Debezium capture runs alongside with the modes of harness.VARIANTS
(decimal/time modes, TRUNCATE skipped as by default), compared with two more tidegate sinks
with the same settings over the variant's tables.
"""

from __future__ import annotations

import json
import textwrap
import time
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psycopg2
import pytest
from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
from tidegate import bounds_step
from tidegate.parts import Parts
from tidegate.run import RunContext
from tidegate.spec import load_spec
from tidegate.store import open_store

from tests.compat import backlogs, harness
from tests.runs import whole_run

pytestmark = pytest.mark.integration

TIDEGATE_SLOT = "tidegate_compat_tg"
TIDEGATE_PUBLICATION = "tidegate_compat_tg"
MARIADB_SERVER_ID = 48778


def pipeline_spec(tmp_path: Path, pipeline: str, source: str, container: str, connector: str,
                  variant: str) -> object:
    """Two Kafka sinks with Debezium's envelope, schemas off and schemas on, one partition per
    topic (Debezium's order per table is the order compared). The settings are Debezium's
    defaults but for the two the harness gives Debezium too: TRUNCATE is not skipped, and the
    connector kind (MariaDB's, not MySQL's) is named. Two more with the modes variant's
    settings (``variant``: harness.VARIANTS' options), TRUNCATE skipped as by default."""
    path = tmp_path / f"{pipeline}.yaml"
    sink = ("{{id: {id}, kind: kafka, conn_id: kafka, topic: \"{topic}\", partitions: 1, exactly_once: true,"
            " envelope: debezium, debezium: {{schemas: {schemas}, {options},"
            " connector: {connector}}}}}")
    sinks = [sink.format(id=sink_id, topic=f"{{pipeline}}{suffix}.{{{container}}}.{{table}}", schemas=schemas,
                         options=options, connector=connector)
             for sink_id, suffix, schemas, options in (
                 ("plain", "", "false", "skipped_operations: none"),
                 ("schemas", "_on", "true", "skipped_operations: none"),
                 ("modes", "_modes", "false", variant), ("modes_on", "_modes_on", "true", variant))]
    return write_spec(path, pipeline, source, sinks)


def write_spec(path: Path, pipeline: str, source: str, sinks: list[str]) -> object:
    """A pipeline spec of the source and the sinks (flow mappings), written and loaded."""
    listed = "\n".join(f"          - {s}" for s in sinks)
    path.write_text(textwrap.dedent(f"""
        pipeline: {pipeline}
        source: {source}
        sinks:
{listed}
    """))
    return load_spec(str(path))


def kafka_jsonl(bootstrap: str, topic_prefix: str, out: Path, tables: Iterable[str] = (),
                only: Iterable[str] | None = None) -> Path:
    """Every committed record of the topics `topic_prefix.*` (of the db.tables ``only``, when
    given), topic by topic in offset order, as harness JSON lines (headers: their bytes as text,
    as Kafka Connect's default header converter writes them). The topics of ``tables`` are
    waited for: a topic the sink made a moment ago may be missing from the first metadata answers
    (under load, for many seconds). One read_committed consumer reads every partition at once."""
    wanted = {f"{topic_prefix}.{t}" for t in tables}
    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + 180
    while True:
        metadata = admin.list_topics(timeout=10).topics
        topics = sorted(t for t in metadata if t.startswith(topic_prefix + "."))
        if wanted <= set(topics):
            break
        # never compared as empty: a generated batch once lost a whole sink's records so
        assert time.monotonic() < deadline, f"topics not in the metadata: {sorted(wanted - set(topics))}"
        time.sleep(0.5)
    if only is not None:
        keep = set(only)
        topics = [t for t in topics if harness.table_of_topic(t) in keep]
    records = read_committed(bootstrap, {t: len(metadata[t].partitions) for t in topics}, nonempty=wanted)
    lines = [{"topic": topic, "key": _json(key), "value": _json(value),
              "headers": [{"key": k, "text": v.decode() if v is not None else None} for k, v in headers]}
             for topic in topics for key, value, headers in records[topic]]
    harness.write_jsonl(out, lines)
    return out


def read_committed(bootstrap: str, partitions: dict[str, int], nonempty: Iterable[str] = ()
                   ) -> dict[str, list[tuple]]:
    """(key, value, headers) of every committed record of the topics, per topic in offset
    order (one partition each here), each partition read to its end. A topic of ``nonempty``
    (one the other side has records of) that reads as empty is asked again, then named."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "compat-" + uuid.uuid4().hex,
                  "isolation.level": "read_committed", "enable.auto.commit": False,
                  "enable.partition.eof": True})
    out: dict[str, list[tuple]] = {t: [] for t in partitions}
    try:
        assigned = []
        for topic, n in partitions.items():
            for p in range(n):
                low, high = c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                if high > low:
                    assigned.append(TopicPartition(topic, p, low))
        # a generated batch once compared three topics of one sink as empty, on a loaded machine
        wanted = set(nonempty) & set(partitions)
        deadline = time.monotonic() + 30
        while empty := wanted - {tp.topic for tp in assigned}:
            assert time.monotonic() < deadline, \
                f"empty, though the other side wrote to them: {_offsets_of(bootstrap, sorted(empty))}"
            time.sleep(1)
            for topic in empty:
                low, high = c.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
                if high > low:
                    assigned.append(TopicPartition(topic, 0, low))
        c.assign(assigned)
        left = {(tp.topic, tp.partition) for tp in assigned}
        deadline = time.monotonic() + 60
        while left:
            assert time.monotonic() < deadline, f"not read to their end: {sorted(left)}"
            m = c.poll(1)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF and _at_high(c, m, assigned):
                    left.discard((m.topic(), m.partition()))
                continue
            out[m.topic()].append((m.key(), m.value(), list(m.headers() or [])))
    finally:
        c.close()
    return out


def _offsets_of(bootstrap: str, topics: list[str]) -> dict[str, tuple[int, int, int]]:
    """Per topic: low offset, last stable offset (read_committed) and high watermark: a last
    stable offset below the high watermark is a transaction still open."""
    out = {}
    for isolation in ("read_committed", "read_uncommitted"):
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "compat-" + uuid.uuid4().hex,
                      "isolation.level": isolation})
        try:
            for t in topics:
                low, high = c.get_watermark_offsets(TopicPartition(t, 0), timeout=10)
                out[t] = (low, high) if isolation == "read_committed" else (*out[t], high)
        finally:
            c.close()
    return out


def _at_high(c: Consumer, eof: Any, assigned: list[TopicPartition]) -> bool:
    """Whether a partition's end of file is its high watermark. A read_committed consumer stops
    at the last stable offset, before a transaction still open: that end is not the end (a
    generated snapshot comparison once read half its topics as empty, never again since)."""
    tp = TopicPartition(eof.topic(), eof.partition())
    high = c.get_watermark_offsets(tp, timeout=10, cached=False)[1]
    return eof.offset() >= high


def _json(b: bytes | None):
    """A record's key or value as JSON; bytes that are not JSON as their text (the comparison
    then names them)."""
    if b is None:
        return None
    try:
        return json.loads(b)
    except ValueError:
        return b.decode(errors="replace")


# Fewer change records than the backlog writes on either source would mean a capture that
# stopped early, and a comparison of nothing passes trivially.
BACKLOG_CHANGES = 30


def compare_outputs(source: str, work: Path, debezium_prefix: Path, tidegate_off: Path,
                    tidegate_on: Path, variant: tuple[Path, Path, Path] | None = None,
                    history: harness.SchemaHistory | None = None) -> int:
    """Fails naming every differing field; returns how many of Debezium's change records were
    compared (schemas off). ``variant``: Debezium's records prefix and tidegate's two files of
    the modes variant, compared over its tables; ``history``: the backlog's ALTERs (a generated
    backlog's)."""
    data = harness.data_records
    failures = []
    if variant is not None:
        tables = harness.VARIANTS[source]["tables"]
        v_prefix, v_off, v_on = variant
        for what, d, t in (("modes, schemas off", Path(f"{v_prefix}.schemas-off.jsonl"), v_off),
                           ("modes, schemas on", Path(f"{v_prefix}.schemas-on.jsonl"), v_on)):
            d_records = data(harness.read_jsonl(d), tables)
            if not d_records:
                failures.append(f"== {what}: Debezium wrote no record of {tables}")
            report = harness.compare(source, d_records, data(harness.read_jsonl(t), tables))
            if report:
                failures.append(f"== {what}: {len(report)} event(s) differ\n" + "\n".join(report))
    compared = len(data(harness.read_jsonl(Path(f"{debezium_prefix}.schemas-off.jsonl"))))
    for what, d, t in (("schemas off", Path(f"{debezium_prefix}.schemas-off.jsonl"), tidegate_off),
                       ("schemas on", Path(f"{debezium_prefix}.schemas-on.jsonl"), tidegate_on)):
        report = harness.compare(source, data(harness.read_jsonl(d)), data(harness.read_jsonl(t)), history)
        if report:
            failures.append(f"== {what}: {len(report)} event(s) differ\n" + "\n".join(report))
    # a consumer written for Debezium: its ExtractNewRecordState gives the same rows over both
    # (a record its JsonConverter refuses is a difference too, reported with the others)
    sides = (("debezium", Path(f"{debezium_prefix}.schemas-on.jsonl")), ("tidegate", tidegate_on))
    try:
        d_rows, t_rows = (harness.rows_of(harness.read_jsonl(harness.extract(
            source, on, work / f"{side}-extracted").with_suffix(".schemas-off.jsonl"))) for side, on in sides)
    except RuntimeError as e:
        failures.append(f"== ExtractNewRecordState: {e}")
    else:
        d_rows, t_rows = harness.forgive_declared_rows(source, d_rows, t_rows, history)
        if d_rows != t_rows:
            failures.append("== ExtractNewRecordState: different rows\n"
                            + harness.row_differences(d_rows, t_rows))
    assert not failures, f"{source}: tidegate's envelope: debezium is not Debezium's output " \
                         f"(work files in {work}):\n" + "\n".join(failures)
    return compared


def test_mariadb_matches_debezium(mysql, kafka, kafka_bootstrap, tmp_path):
    pipeline = f"compat_{uuid.uuid4().hex[:6]}"
    source = (f"{{kind: mysql, conn_id: src, tables: [{backlogs.MARIADB_DB}.*],"
              f" server_id: {MARIADB_SERVER_ID}, start: head}}")
    spec = pipeline_spec(tmp_path, pipeline, source, "db", "mariadb", harness.VARIANTS["mariadb"]["options"])
    conns = {"src": mysql.cdc, "kafka": kafka.cdc}
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin_kwargs = mysql.mysql_kwargs(admin=True)
    admin_kwargs.pop("database", None)
    try:
        debezium, debezium_modes = harness.mariadb_backlog(
            admin_kwargs, lambda: bounds_step.prepare_bounds(RunContext(spec, parts=Parts(conns.__getitem__),
                                                                   store=store)),
            tmp_path / "debezium", pipeline)
        whole_run(RunContext(spec, run_id="r1", parts=Parts(conns.__getitem__), store=store))
    finally:
        harness.mariadb_teardown(admin_kwargs)
        store.close()
    tables = _tables_of(debezium)
    compared = compare_outputs("mariadb", tmp_path, debezium,
                    kafka_jsonl(kafka_bootstrap, pipeline, tmp_path / "tidegate.schemas-off.jsonl", tables),
                    kafka_jsonl(kafka_bootstrap, f"{pipeline}_on", tmp_path / "tidegate.schemas-on.jsonl",
                                tables),
                    variant=_variant_files("mariadb", kafka_bootstrap, pipeline, tmp_path, debezium_modes))
    assert compared >= BACKLOG_CHANGES, f"only {compared} of Debezium's change records were compared"


def test_postgres_matches_debezium(postgres, kafka, kafka_bootstrap, tmp_path):
    pipeline = f"compat_{uuid.uuid4().hex[:6]}"
    source = (f"{{kind: postgres, conn_id: src, slot: {TIDEGATE_SLOT}, plugin: pgoutput,"
              f" publication: {TIDEGATE_PUBLICATION}, tables: [{backlogs.POSTGRES_SCHEMA}.*], start: head}}")
    spec = pipeline_spec(tmp_path, pipeline, source, "schema", "postgresql",
                         harness.VARIANTS["postgres"]["options"])
    # the admin login: the pipeline reads a schema the test made, through a slot it made
    conns = {"src": postgres.admin, "kafka": kafka.cdc}
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    try:
        harness.postgres_setup(postgres.admin_dsn)
        _tidegate_slot(postgres.admin_dsn, create=True)
        bounds_step.prepare_bounds(RunContext(spec, parts=Parts(conns.__getitem__), store=store))
        harness.postgres_backlog(postgres.admin_dsn)
        # Debezium reads its slot while tidegate runs
        properties = harness.postgres_properties(postgres.admin, pipeline)
        captures = [harness.Capture("postgres", properties, tmp_path / "debezium", probe=False),
                    harness.Capture("postgres", harness.variant_properties("postgres", properties),
                                    tmp_path / "debezium" / "modes", probe=False)]
        try:
            whole_run(RunContext(spec, run_id="r1", parts=Parts(conns.__getitem__), store=store))
        finally:
            debezium, debezium_modes = (capture.finish() for capture in captures)
    finally:
        _tidegate_slot(postgres.admin_dsn, create=False)
        harness.postgres_teardown(postgres.admin_dsn)
        store.close()
    tables = _tables_of(debezium)
    compared = compare_outputs("postgres", tmp_path, debezium,
                    kafka_jsonl(kafka_bootstrap, pipeline, tmp_path / "tidegate.schemas-off.jsonl", tables),
                    kafka_jsonl(kafka_bootstrap, f"{pipeline}_on", tmp_path / "tidegate.schemas-on.jsonl",
                                tables),
                    variant=_variant_files("postgres", kafka_bootstrap, pipeline, tmp_path, debezium_modes))
    assert compared >= BACKLOG_CHANGES, f"only {compared} of Debezium's change records were compared"


def _tables_of(debezium_prefix: Path, only: Iterable[str] | None = None) -> set[str]:
    """The db.table of every change topic Debezium wrote to (of the tables ``only``)."""
    records = harness.data_records(harness.read_jsonl(Path(f"{debezium_prefix}.schemas-off.jsonl")), only)
    return {harness.table_of_topic(r["topic"]) for r in records}


def _variant_files(source: str, bootstrap: str, pipeline: str, tmp_path: Path, debezium_modes: Path
                   ) -> tuple[Path, Path, Path]:
    tables = _tables_of(debezium_modes, harness.VARIANTS[source]["tables"])
    return (debezium_modes,
            kafka_jsonl(bootstrap, f"{pipeline}_modes", tmp_path / "tidegate-modes.schemas-off.jsonl",
                        tables, only=tables),
            kafka_jsonl(bootstrap, f"{pipeline}_modes_on", tmp_path / "tidegate-modes.schemas-on.jsonl",
                        tables, only=tables))


def _tidegate_slot(admin_dsn: str, *, create: bool, backlog=backlogs) -> None:
    admin = psycopg2.connect(admin_dsn)
    admin.autocommit = True
    try:
        with admin.cursor() as c:
            c.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                      " WHERE slot_name = %s", (TIDEGATE_SLOT,))
            c.execute(f"DROP PUBLICATION IF EXISTS {TIDEGATE_PUBLICATION}")
            if create:
                tables = ", ".join(f"{backlogs.POSTGRES_SCHEMA}.{t}" for t in backlog.POSTGRES_PUBLISHED)
                c.execute(f"CREATE PUBLICATION {TIDEGATE_PUBLICATION} FOR TABLE {tables}")
                c.execute("SELECT pg_create_logical_replication_slot(%s, 'pgoutput')", (TIDEGATE_SLOT,))
    finally:
        admin.close()
