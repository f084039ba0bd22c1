"""tidegate's `envelope: debezium` against Debezium itself on generated backlogs
(tests/compat/generator.py; docs/compat.md, "Generated backlogs").

Per source, the tables and workloads of COMPAT_SEEDS make one backlog, captured by Debezium's own
connector and by a tidegate pipeline, schemas off and on, and compared as tests/compat's fixed
backlog is (harness.compare: every record, key, value field and header, only the declared
differences forgiven; then ExtractNewRecordState's rows). A failure names the seed, the table and
its statements. ``TIDEGATE_COMPAT_SEEDS=1,2,...`` (or ``make compat SEEDS=N``) compares others.
"""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
from tidegate import runner
from tidegate.parts import Parts
from tidegate.run import RunContext
from tidegate.store import open_store

from tests.compat import backlogs, generator, harness
from tests.compat.test_debezium_compat import (
    MARIADB_SERVER_ID,
    TIDEGATE_PUBLICATION,
    TIDEGATE_SLOT,
    _tables_of,
    _tidegate_slot,
    compare_outputs,
    kafka_jsonl,
    pipeline_spec,
)

pytestmark = pytest.mark.integration

COMPAT_SEEDS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
# Fewer compared change records than this means the backlog or a capture came out short.
MIN_RECORDS = 1000


def seeds() -> list[int]:
    raw = os.environ.get("TIDEGATE_COMPAT_SEEDS")
    return [int(s) for s in raw.split(",")] if raw else COMPAT_SEEDS


def reproduction(backlog: generator.Backlog, source: str, report: str, limit: int = 3) -> str:
    """The statements of the first tables the report names: a failure's minimal reproduction."""
    tables = list(dict.fromkeys(re.findall(r"\bg\d+_\d+\b", report)))[:limit]
    out = []
    for table in tables:
        seed = table[1:].split("_")[0]
        statements = ";\n".join(backlog.statements_of(source, table))
        out.append(f"-- seed {seed}, table {table}:\n{statements};")
    return "\n".join(out)


def _compare(source: str, backlog: generator.Backlog, work: Path, debezium: Path, pipeline: str,
             bootstrap: str) -> int:
    tables = _tables_of(debezium)
    off = kafka_jsonl(bootstrap, pipeline, work / "tidegate.schemas-off.jsonl", tables)
    on = kafka_jsonl(bootstrap, f"{pipeline}_on", work / "tidegate.schemas-on.jsonl", tables)
    try:
        return compare_outputs(source, work, debezium, off, on)
    except AssertionError as e:
        raise AssertionError(f"seeds {backlog.seeds}: {e}\n\nreproduction:\n"
                             f"{reproduction(backlog, source, str(e))}") from None


def test_generated_mariadb_matches_debezium(mysql, kafka, kafka_bootstrap, tmp_path):
    backlog = generator.backlog(["mariadb"], seeds())
    pipeline = f"gen_{uuid.uuid4().hex[:6]}"
    source = (f"{{kind: mysql, conn_id: src, tables: [{backlogs.MARIADB_DB}.*],"
              f" server_id: {MARIADB_SERVER_ID}, start: head}}")
    spec = pipeline_spec(tmp_path, pipeline, source, "db", "mariadb", harness.VARIANTS["mariadb"]["options"])
    conns = {"src": mysql.cdc, "kafka": kafka.cdc}
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin_kwargs = mysql.mysql_kwargs(admin=True)
    admin_kwargs.pop("database", None)
    try:
        debezium, _ = harness.mariadb_backlog(
            admin_kwargs, lambda: runner.prepare_bounds(RunContext(spec, parts=Parts(conns.__getitem__),
                                                                   store=store)),
            tmp_path / "debezium", pipeline, backlog=backlog, variant=False)
        runner.run_pipeline(RunContext(spec, run_id="r1", parts=Parts(conns.__getitem__), store=store))
    finally:
        harness.mariadb_teardown(admin_kwargs)
        store.close()
    compared = _compare("mariadb", backlog, tmp_path, debezium, pipeline, kafka_bootstrap)
    assert compared >= MIN_RECORDS, f"only {compared} of Debezium's change records were compared"


def test_generated_postgres_matches_debezium(postgres, kafka, kafka_bootstrap, tmp_path):
    backlog = generator.backlog(["postgres"], seeds())
    pipeline = f"gen_{uuid.uuid4().hex[:6]}"
    source = (f"{{kind: postgres, conn_id: src, slot: {TIDEGATE_SLOT}, plugin: pgoutput,"
              f" publication: {TIDEGATE_PUBLICATION}, tables: [{backlogs.POSTGRES_SCHEMA}.*], start: head}}")
    spec = pipeline_spec(tmp_path, pipeline, source, "schema", "postgresql",
                         harness.VARIANTS["postgres"]["options"])
    conns = {"src": postgres.admin, "kafka": kafka.cdc}
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    try:
        harness.postgres_setup(postgres.admin_dsn, backlog)
        _tidegate_slot(postgres.admin_dsn, create=True, backlog=backlog)
        runner.prepare_bounds(RunContext(spec, parts=Parts(conns.__getitem__), store=store))
        harness.postgres_backlog(postgres.admin_dsn, backlog)
        capture = harness.Capture("postgres", harness.postgres_properties(postgres.admin, pipeline),
                                  tmp_path / "debezium", probe=False)
        try:
            runner.run_pipeline(RunContext(spec, run_id="r1", parts=Parts(conns.__getitem__), store=store))
        finally:
            debezium = capture.finish()
    finally:
        _tidegate_slot(postgres.admin_dsn, create=False)
        harness.postgres_teardown(postgres.admin_dsn)
        store.close()
    compared = _compare("postgres", backlog, tmp_path, debezium, pipeline, kafka_bootstrap)
    assert compared >= MIN_RECORDS, f"only {compared} of Debezium's change records were compared"
