"""The demo's pipelines (scripts/demo): the MariaDB example with a Delta Lake sink added inside
its `sinks:` block. The example once gained a `spark:` block at its end, the demo appended the
sink after it, and `make demo` stopped at "DAG cdc_shop_mysql did not appear"."""

from __future__ import annotations

from pathlib import Path

from tidegate.spec import load_spec_text

from tests.scripts import script_module

ROOT = Path(__file__).resolve().parents[2]


def demo_module():
    return script_module("demo")


def test_the_lake_sink_goes_inside_the_sinks_block_of_the_example():
    demo = demo_module()
    example = (ROOT / "include" / "pipelines" / "shop_mysql.yaml").read_text(encoding="utf-8")
    before = load_spec_text(example)
    after = load_spec_text(demo.with_sink(example, demo.DELTA_SINK))
    assert [s.id for s in after.sinks] == [*(s.id for s in before.sinks), "lake"]
    assert after.sinks[-1].kind == "delta" and after.spark == before.spark


def test_a_sink_block_last_in_the_file_takes_the_sink_at_its_end():
    text = "pipeline: p\nsource: {kind: mysql, conn_id: c, tables: [db.t], server_id: 5}\nsinks:\n" \
           "  - {id: k, kind: kafka, conn_id: kafka, topic: t}\n\n"
    demo = demo_module()
    assert [s.id for s in load_spec_text(demo.with_sink(text, demo.DELTA_SINK)).sinks] == ["k", "lake"]
