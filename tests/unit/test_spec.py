"""Spec validation: every broken spec gives one clear line naming file, field and what is allowed."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tidegate.catalog import scan
from tidegate.errors import SpecError
from tidegate.spec import load_spec, validate_file

ROOT = Path(__file__).resolve().parents[2]
TIDEGATE = [sys.executable, "-m", "tidegate.cli"]
if (ROOT / ".venv" / "bin" / "tidegate").exists():
    TIDEGATE = [str(ROOT / ".venv" / "bin" / "tidegate")]

GOOD = """\
pipeline: orders
source:
  kind: mysql
  conn_id: orders_db
  tables: [shop.orders]
batch:
  commit_policy: required
sinks:
  - id: events
    kind: kafka
    conn_id: kafka_default
    topic: "{pipeline}.{schema}.{table}"
  - id: cache
    kind: redis
    conn_id: redis_default
    stream: "{pipeline}:{table}"
    required: false
"""

# (name, text replacement applied to GOOD, expected field path, expected words)
BROKEN = [
    ("unknown_top", ("pipeline: orders", "pipeline: orders\ncolour: blue"), "colour", "unknown field"),
    ("unknown_sink_field", ("    topic:", "    subject: x\n    topic:"), "sinks[0].subject",
     "unknown field"),
    ("bad_pipeline_id", ("pipeline: orders", "pipeline: Orders-1"), "pipeline", "[a-z0-9_]+"),
    ("bad_sink_id", ("id: events", "id: 'ev ents'"), "sinks[0].id", "[a-z0-9_-]+"),
    ("bad_table", ("[shop.orders]", "[\"shop.orders; drop table x\"]"), "source.tables[0]",
     "schema.table"),
    ("dup_sink", ("id: cache", "id: events"), "sinks[1].id", "duplicate sink id"),
    ("quorum_missing", ("commit_policy: required", "commit_policy: quorum"), "batch.quorum",
     "missing"),
    ("quorum_range", ("commit_policy: required", "commit_policy: quorum\n  quorum: 3"),
     "batch.quorum", "1..2"),
    ("required_none", ("    topic:", "    required: false\n    topic:"), "batch.commit_policy",
     "no sink has required: true"),
    ("missing_conn", ("  conn_id: orders_db\n", ""), "source.conn_id", "missing"),
    ("missing_sink_conn", ("    conn_id: kafka_default\n", ""), "sinks[0].conn_id", "missing"),
    ("placeholder", ("{pipeline}.{schema}.{table}", "{pipeline}.{database}.{table}"), "sinks[0].topic",
     "unknown placeholder {database}"),
    ("bad_start", ("  tables:", "  start: latest\n  tables:"), "source.start", "head | earliest"),
    ("bad_kind", ("kind: redis", "kind: kinesis"), "sinks[1].kind", "kafka | nats | redis"),
    ("bad_bool", ("required: false", "required: maybe"), "sinks[1].required", "true, false"),
    ("bad_yaml", ("sinks:", "sinks: [\n"), "line", "not valid YAML"),
    ("nats_no_subject", ("kind: redis\n    conn_id: redis_default\n    stream: \"{pipeline}:{table}\"",
                         "kind: nats\n    conn_id: nats_default\n    stream: CDC"), "sinks[1].subject",
     "missing"),
    ("slot_on_mysql", ("  tables:", "  slot: s1\n  tables:"), "source.slot", "only for postgres"),
    ("dup_key", ("pipeline: orders", "pipeline: orders\npipeline: other"), "line", "duplicate key"),
]


def _write(tmp_path, name, text):
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    return p


def test_good_spec_loads(tmp_path):
    spec = load_spec(_write(tmp_path, "orders", GOOD))
    assert spec.pipeline == "orders" and spec.dag_id == "cdc_orders"
    assert [s.id for s in spec.sinks] == ["events", "cache"]
    assert spec.sink("cache").required is False and spec.tenant == "default"
    assert spec.batch.max_events == 50_000 and spec.source.start == "head"


@pytest.mark.parametrize("name,repl,field,words", BROKEN, ids=[b[0] for b in BROKEN])
def test_broken_spec_one_clear_line(tmp_path, name, repl, field, words):
    assert repl[0] in GOOD, name
    path = _write(tmp_path, name, GOOD.replace(repl[0], repl[1], 1))
    problems = validate_file(path)
    assert len(problems) == 1, problems
    line = problems[0]
    assert line.startswith(f"{path}: {field}"), line
    assert words in line, line
    with pytest.raises(SpecError):
        load_spec(path)


def test_cli_validate_broken_specs_exit_1(tmp_path):
    paths = []
    for name, repl, _field, _words in BROKEN:
        paths.append(_write(tmp_path, name, GOOD.replace(repl[0], repl[1], 1)))
    for p in paths:
        r = subprocess.run([*TIDEGATE, "validate", str(p)], capture_output=True, text=True)
        assert r.returncode == 1, (p, r.stdout, r.stderr)
        lines = r.stdout.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(str(p) + ": "), r.stdout
        assert "Traceback" not in r.stderr


def test_cli_validate_examples_exit_0():
    r = subprocess.run([*TIDEGATE, "validate"], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == ""


def test_example_specs_validate():
    catalog = scan(ROOT / "include" / "pipelines")
    assert catalog.problems == []
    specs = catalog.specs
    assert {"shop_mysql", "shop_postgres"} <= {s.pipeline for s in specs}
    pg = next(s for s in specs if s.pipeline == "shop_postgres")
    assert pg.source.slot == "tidegate_shop_postgres"


def test_several_problems_one_line_each(tmp_path):
    text = textwrap.dedent("""\
        pipeline: x
        extra: 1
        source: {kind: oracle}
        sinks: []
    """)
    problems = validate_file(_write(tmp_path, "multi", text))
    assert len(problems) == 4, problems  # extra, source.kind, source.conn_id, sinks
    assert all(p.count("\n") == 0 for p in problems)


def test_duplicate_pipeline_names_across_files(tmp_path):
    _write(tmp_path, "a", GOOD)
    _write(tmp_path, "b", GOOD)
    catalog = scan(tmp_path)
    assert [s.pipeline for s in catalog.specs] == ["x"] or len(catalog.specs) == 1
    [problem] = catalog.problems
    assert "b.yaml: pipeline:" in problem and "already defined" in problem


def test_env_pipelines_dir(tmp_path, monkeypatch):
    _write(tmp_path, "orders", GOOD)
    monkeypatch.setenv("TIDEGATE_PIPELINES_DIR", str(tmp_path))
    assert [s.pipeline for s in scan().specs] == ["orders"]


def test_yaml_keys_and_defaults(tmp_path):
    text = GOOD.replace("    stream: \"{pipeline}:{table}\"",
                        "    stream: \"{pipeline}:{table}\"\n    maxlen: 1000") + textwrap.dedent("""\
          - id: bus
            kind: nats
            conn_id: nats_default
            stream: CDC
            subject: "{pipeline}.{table}"
            duplicate_window: 30
        spark:
          conn_id: spark_default
          conf: {spark.executor.memory: 1g}
          packages: [org.example:x:1.0]
    """)
    spec = load_spec(_write(tmp_path, "orders", text))
    assert spec.sink("bus").duplicate_window_s == 30.0 and spec.sink("cache").maxlen == 1000
    assert spec.spark.conf == {"spark.executor.memory": "1g"}


def _replication_spec(name: str, source: str) -> str:
    return textwrap.dedent(f"""
        pipeline: {name}
        source: {source}
        sinks:
          - {{id: bus, kind: nats, conn_id: cdc_nats, stream: S, subject: "{{pipeline}}.{{table}}"}}
    """)


def test_validate_refuses_two_pipelines_sharing_a_server_id_or_a_slot_on_one_connection(tmp_path):
    """Two readers with one MySQL server_id cut each other off; two pipelines on one slot lose
    each other's changes: the later file is refused, naming the field, the other pipeline and
    the fix; the same id on another connection is fine."""
    mysql = "{kind: mysql, conn_id: shard_a, server_id: 48001}"
    _write(tmp_path, "a1", _replication_spec("a1", mysql))
    _write(tmp_path, "a2", _replication_spec("a2", mysql))
    _write(tmp_path, "a3", _replication_spec("a3", "{kind: mysql, conn_id: shard_b, server_id: 48001}"))
    _write(tmp_path, "p1", _replication_spec("p1", "{kind: postgres, conn_id: pg, slot: shared}"))
    _write(tmp_path, "p2", _replication_spec("p2", "{kind: postgres, conn_id: pg, slot: shared}"))
    _write(tmp_path, "p3", _replication_spec("p3", "{kind: postgres, conn_id: pg}"))  # tidegate_p3
    cat = scan(tmp_path)
    assert sorted(s.pipeline for s in cat.specs) == ["a1", "a3", "p1", "p3"]
    [mine, slot] = cat.problems
    assert mine.startswith(f"{tmp_path / 'a2.yaml'}: source.server_id: 48001 on connection 'shard_a' is "
                           f"already used by pipeline 'a1'")
    assert mine.endswith("Set a distinct source.server_id")
    assert slot.startswith(f"{tmp_path / 'p2.yaml'}: source.slot: 'shared' on connection 'pg'")
    env = {**os.environ, "TIDEGATE_PIPELINES_DIR": str(tmp_path)}
    r = subprocess.run([*TIDEGATE, "validate"], capture_output=True, text=True, env=env)
    assert r.returncode == 1 and r.stdout.splitlines() == cat.problems
