"""Source and sink kinds are packages found through tidegate.kinds: the core never names one."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tidegate import kinds
from tidegate.sinks import make_sink
from tidegate.sources import make_source
from tidegate.spec import SINK_KINDS, SOURCE_KINDS, PipelineSpec, SinkSpec, SourceSpec

ROOT = Path(__file__).resolve().parents[2]
CORE = sorted((ROOT / "include" / "tidegate").glob("*.py")) + sorted((ROOT / "plugins").rglob("*.py"))
# The registry names the kinds; positions.py recognizes position JSON written before it carried its
# kind (the one legacy place). Nothing else in the core may.
ALLOWED = {"kinds.py": None, "positions.py": "_LEGACY_KIND_BY_KEY = "}


def test_core_never_switches_on_a_kind_name():
    names = "|".join(re.escape(k) for k in (*kinds.SOURCES, *kinds.SINKS))
    literal = re.compile(rf"""["']({names})["']""")
    kind_import = re.compile(r"(from|import) +(tidegate|\.+)\.?(sources|sinks)\.(" + names + r")\b")
    offences = []
    for path in CORE:
        if path.name in ALLOWED and ALLOWED[path.name] is None:
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if ALLOWED.get(path.name) and code.startswith(ALLOWED[path.name]):
                continue
            if literal.search(code) or kind_import.search(code):
                offences.append(f"{path.relative_to(ROOT)}:{no}: {line.strip()}")
    assert offences == [], "ask tidegate.kinds (or the kind object) instead:\n" + "\n".join(offences)


def test_the_registry_lists_every_kind_package_and_the_spec_takes_its_kinds_from_it():
    assert SOURCE_KINDS == tuple(kinds.SOURCES) and SINK_KINDS == tuple(kinds.SINKS)
    for name in SOURCE_KINDS:
        kind = kinds.source_kind(name)
        assert kind.name == name and kind.position_type().kind == name
    for name in SINK_KINDS:
        kind = kinds.sink_kind(name)
        assert kind.name == name and issubclass(kind.spec_type, SinkSpec)
    with pytest.raises(ValueError, match="unknown kind 'oracle'; allowed: mysql, postgres"):
        kinds.source_kind("oracle")


def test_unknown_kinds_are_refused_by_name():
    spec = PipelineSpec(pipeline="p", source=SourceSpec("oracle", "db"), sinks=())
    with pytest.raises(ValueError, match="source: unknown kind 'oracle'"):
        make_source(spec, None)
    with pytest.raises(ValueError, match="sink 'x': unknown kind 's3'; allowed: kafka, nats, redis"):
        make_sink(spec, SinkSpec(id="x", kind="s3", conn_id="c"), None)


def _loaded_after(statements: str, libraries: tuple[str, ...] = ()) -> list[str]:
    """The tidegate modules (and ``libraries``) a fresh interpreter holds after ``statements``."""
    probe = (f"import json, sys; {statements}; print(json.dumps(sorted(m for m in sys.modules "
             f"if m.startswith('tidegate') or m.split('.')[0] in {libraries!r})))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(ROOT / "include"), "PATH": ""})
    return json.loads(out.stdout)


def test_no_sink_package_imports_the_debezium_envelope():
    """The Kafka kind names the envelope's encoder and the parser of its fields; the sinks'
    own modules (every kind's spec and sink) import nothing of ``tidegate.debezium``."""
    loaded = _loaded_after("from tidegate import kinds; import importlib; "
                           "[importlib.import_module(m) for k in kinds.SINKS for m in "
                           "(kinds.sink_kind(k).sink.partition(':')[0], 'tidegate.sinks.' + k + '.spec')]")
    assert "tidegate.sinks.kafka.sink" in loaded and "tidegate.sinks.delta.sink" in loaded
    assert [m for m in loaded if m.startswith("tidegate.debezium")] == []


def test_loading_specs_imports_no_client_library_and_no_source_or_sink_code():
    loaded = _loaded_after("from tidegate.catalog import scan; scan()",
                           ("confluent_kafka", "nats", "redis", "psycopg2", "pymysql", "pymysqlreplication"))
    heavy = [m for m in loaded if not m.startswith("tidegate")
             or m.rsplit(".", 1)[-1] in ("base", "sink", "source", "position")]
    assert heavy == [], heavy
    assert "tidegate.sinks.kafka.spec" in loaded and "tidegate.sources.postgres.spec" in loaded
