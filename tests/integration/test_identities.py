"""Identities that two pipelines or two tenants cannot share, against the real servers.

- Two pipelines capture the same MariaDB table into one NATS stream: their events have the same
  log coordinates (``db.table``, transaction id, event id), as two shards provisioned alike
  do. The pipeline is part of the idempotency key, so JetStream stores both pipelines' messages
  instead of dropping the second as duplicates of the first.
- Two tenants (two deployments) with a pipeline of the same name share one Kafka cluster and
  one Redis: their transactional ids and sink-side checkpoint keys differ, so neither fences
  the other or reads the other's records.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import textwrap
import uuid

import nats
import pymysql
import pytest
from test_sink_support import make_batches, pipeline_spec, unique
from tidegate import bounds_step
from tidegate.parts import Parts
from tidegate.run import RunContext
from tidegate.sinks import make_sink
from tidegate.sinks.kafka.spec import KafkaSinkSpec
from tidegate.sinks.redis.spec import RedisSinkSpec
from tidegate.spec import load_spec
from tidegate.store import open_store

from tests.integration.sink_readers import kafka_changes, nats_ids, redis_ids
from tests.runs import whole_run

pytestmark = pytest.mark.integration


def _create_stream(conn, name: str, subjects: list[str]) -> None:
    async def go():
        nc = await nats.connect(f"nats://127.0.0.1:{conn.port}", user=conn.login, password=conn.password)
        try:
            await nc.jetstream().add_stream(name=name, subjects=subjects, duplicate_window=120.0)
        finally:
            await nc.close()

    asyncio.run(go())


def test_two_pipelines_of_one_table_into_one_nats_stream_keep_every_message(mysql, nats_service, tmp_path):
    tag = uuid.uuid4().hex[:6]
    db, stream = f"ids_{tag}", f"IDS_{tag.upper()}"
    names = [f"ids_{tag}_a", f"ids_{tag}_b"]
    _create_stream(nats_service.cdc, stream, [f"{n}.>" for n in names])
    specs = []
    for n, server_id in zip(names, (48401, 48402), strict=True):
        path = tmp_path / f"{n}.yaml"
        path.write_text(textwrap.dedent(f"""
            pipeline: {n}
            source: {{kind: mysql, conn_id: src, tables: [{db}.t], server_id: {server_id}, start: head}}
            sinks:
              - {{id: bus, kind: nats, conn_id: nats, stream: {stream}, subject: "{{pipeline}}.{{table}}"}}
        """))
        specs.append(load_spec(str(path)))
    conns = {"src": mysql.cdc, "nats": nats_service.cdc}.__getitem__
    store = open_store(f"sqlite:///{tmp_path / 'store.sqlite'}")
    admin = pymysql.connect(**mysql.mysql_kwargs(autocommit=True))
    try:
        with admin.cursor() as c:
            c.execute(f"CREATE DATABASE {db}")
            c.execute(f"CREATE TABLE {db}.t (id INT PRIMARY KEY, v VARCHAR(8))")
            for spec in specs:
                bounds_step.prepare_bounds(RunContext(spec, parts=Parts(conns),
                                                 store=store))  # both placed at one head
            for i in range(1, 6):
                c.execute(f"INSERT INTO {db}.t VALUES ({i}, 'x')")
            c.execute(f"UPDATE {db}.t SET v = 'y' WHERE id = 2")
        reports = [whole_run(RunContext(spec, run_id="r1", parts=Parts(conns),
                                        store=store)) for spec in specs]
        assert [r["sinks"][0]["duplicates"] for r in reports] == [0, 0]
        ids = [i for i in nats_ids(nats_service.cdc, stream) if "|__control|" not in i]
        per_pipeline = collections.Counter(i.split("|")[1] for i in ids)
        assert per_pipeline == {names[0]: 6, names[1]: 6}
        assert len(set(ids)) == 12
        # the same change, told apart only by the pipeline
        assert {i.split("|", 2)[2] for i in ids if names[0] in i} == {i.split("|", 2)[2] for i in ids
                                                                       if names[1] in i}
    finally:
        with admin.cursor() as c:
            c.execute(f"DROP DATABASE IF EXISTS {db}")
        admin.close()
        store.close()


def test_two_tenants_with_one_pipeline_name_share_kafka_and_redis_without_fencing_each_other(
        kafka, kafka_bootstrap, redis_service):
    name = unique("tenants")
    batches = make_batches(name, 2, 3, 1)
    sinks = {}
    for tenant, epoch in (("north", 7), ("south", 2)):  # two stores: their epochs are unrelated
        for spec, conn in ((KafkaSinkSpec(id="events", kind="kafka", conn_id="cdc_kafka",
                                          topic=f"t_{name}_{tenant}.{{table}}", exactly_once=True,
                                          checkpoint_topic=f"_tidegate_ckpt_{name}"), kafka.cdc),
                           (RedisSinkSpec(id="cache", kind="redis", conn_id="cdc_redis",
                                          stream=f"{name}:{tenant}:{{table}}"), redis_service.cdc)):
            sink = make_sink(dataclasses.replace(pipeline_spec(name, spec), tenant=tenant), spec, conn)
            sink.epoch = epoch
            sinks[tenant, spec.kind] = sink
    try:
        for sink in sinks.values():
            sink.open()  # both tenants' producers and claims are live at once
        for b in batches:
            for sink in sinks.values():
                sink.deliver(b, 0)
        for sink in sinks.values():
            assert sink.committed_checkpoint().position == batches[-1].end_position
        assert sinks["north", "kafka"].transactional_id != sinks["south", "kafka"].transactional_id
    finally:
        for sink in sinks.values():
            sink.close()
    want = [e.idempotency_key for b in batches for e in b.events]
    for tenant in ("north", "south"):
        got = kafka_changes(kafka_bootstrap, f"t_{name}_{tenant}.orders")
        assert sorted(ch["idempotency_key"] for ch in got) == sorted(want)
        assert redis_ids(redis_service.cdc, f"{name}:{tenant}:orders") == want
