"""NATS JetStream sink against the real server: dedup by Nats-Msg-Id, the duplicate-window
preflight, the position header, and error classes."""

from __future__ import annotations

import asyncio
import logging
import uuid

import nats
import pytest
from test_sink_support import all_events, make_batches, pipeline_spec, unique
from tidegate.connections import Connection
from tidegate.errors import ErrorClass, FatalSinkError, NonRetryableSinkError, RetryableSinkError
from tidegate.sinks import make_sink
from tidegate.sinks.nats.preflight import check_duplicate_window
from tidegate.sinks.nats.sink import NatsSink
from tidegate.sinks.nats.spec import NatsSinkSpec

pytestmark = pytest.mark.integration


def nspec(stream: str, window: float = 120.0, max_in_flight: int = 64) -> NatsSinkSpec:
    return NatsSinkSpec(id="bus", kind="nats", conn_id="cdc_nats", stream=stream,
                    subject="{pipeline}.{schema}.{table}", duplicate_window_s=window,
                    max_in_flight=max_in_flight)


async def _js_call(conn: Connection, fn):
    nc = await nats.connect(f"nats://{conn.host}:{conn.port}", user=conn.login, password=conn.password)
    try:
        return await fn(nc.jetstream())
    finally:
        await nc.close()


def js_call(conn: Connection, fn):
    return asyncio.run(_js_call(conn, fn))


@pytest.fixture()
def stream(nats_service):
    name = "TG_" + uuid.uuid4().hex[:10].upper()
    yield name

    async def drop(js):
        try:
            await js.delete_stream(name)
        except Exception:  # noqa: BLE001 - the test may not have created it
            pass

    js_call(nats_service.cdc, drop)


def stored(conn: Connection, stream: str, markers: bool = False) -> list | None:
    """Every message of the stream in order (the sinks' commit markers only when ``markers``);
    None when the stream does not exist."""
    async def fetch(js):
        try:
            info = await js.stream_info(stream)
        except nats.js.errors.NotFoundError:
            return None
        return [await js.get_msg(stream, seq) for seq in range(info.state.first_seq, info.state.last_seq + 1)
                if info.state.messages]

    msgs = js_call(conn, fetch)
    if msgs is None:
        return None
    return [m for m in msgs if (".__checkpoint." in m.subject) == markers]


def test_same_sub_batch_twice_is_stored_once_and_duplicates_are_counted(nats_service, stream, caplog):
    name = unique("ndup")
    spec = nspec(stream, window=100.0)
    sink = make_sink(pipeline_spec(name, spec, schedule="*/1 * * * *"), spec, nats_service.cdc)
    batches = make_batches(name, 6, 50, 3)
    try:
        sink.open()
        assert sink.committed_checkpoint() is None
        sink.deliver(batches[0])
        assert sink.duplicates == 0
        with caplog.at_level(logging.INFO, logger="tidegate.sinks.nats"):
            assert sink.deliver(batches[0]) == batches[0].end_position  # again: a retried sub-batch
        assert sink.duplicates == batches[0].event_count
        assert f"{batches[0].event_count} of {batches[0].event_count} messages" in caplog.text
        sink.deliver(batches[1])
        assert sink.duplicates == batches[0].event_count
        assert sink.committed_checkpoint().position == batches[1].end_position
    finally:
        sink.close()
    msgs = stored(nats_service.cdc, stream)
    events = all_events(batches)
    assert [m.headers["Nats-Msg-Id"] for m in msgs] == [e.idempotency_key for e in events]
    assert [m.data for m in msgs] == [e.value for e in events]
    assert {m.subject for m in msgs} == {f"{name}.shop.orders"}
    info = js_call(nats_service.cdc, lambda js: js.stream_info(stream))
    assert info.config.duplicate_window == 100.0
    assert info.config.subjects == [f"{name}.*.*", f"{name}.__control", f"{name}.__dlq"]
    # A new sink (the next run) finds the position on the last message.
    fresh = make_sink(pipeline_spec(name, spec), spec, nats_service.cdc)
    try:
        assert fresh.committed_checkpoint().position == batches[1].end_position
    finally:
        fresh.close()


def test_preflight_refuses_a_duplicate_window_shorter_than_interval_plus_retry_budget(nats_service, stream):
    name = unique("npre")
    spec = nspec(stream, window=60.0)
    sink = make_sink(pipeline_spec(name, spec, schedule="*/5 * * * *"), spec, nats_service.cdc)
    try:
        with pytest.raises(NonRetryableSinkError) as err:
            sink.open()  # a 60 s window for a schedule that runs every 300 s
        msg = str(err.value)
        assert stored(nats_service.cdc, stream) is None  # the stream was not created
        assert "duplicate_window 60s" in msg and "schedule interval 300s" in msg
        assert f"retry budget {sink.retry_budget_s():g}s" in msg
        assert sink.classify(err.value) is ErrorClass.NON_RETRYABLE
        sink.preflight(20.0)  # a 20 s interval plus the budget fits in the window
        with pytest.raises(NonRetryableSinkError, match=r"45s .* 20s"):
            sink.preflight(45.0, retry_budget=20.0)
    finally:
        sink.close()
    with pytest.raises(NonRetryableSinkError, match="duplicate_window 10s .* interval 60s .* budget 5s"):
        check_duplicate_window(10, 60, 5, stream="S")


def test_committed_position_ignores_other_pipelines_on_the_same_stream(nats_service, stream):
    a, b = unique("na"), unique("nb")
    spec = NatsSinkSpec(id="bus", kind="nats", conn_id="cdc_nats", stream=stream,
                        subject="tg.{pipeline}.{table}")
    sa = make_sink(pipeline_spec(a, spec), spec, nats_service.cdc)
    sb = make_sink(pipeline_spec(b, spec), spec, nats_service.cdc)
    ba, bb = make_batches(a, 2, 3, 1), make_batches(b, 1, 3, 1, first_tx=7)
    try:
        # a creates the stream for subjects tg.<a>.* only; b's subjects are not captured
        sa.deliver(ba[0])
        with pytest.raises(NonRetryableSinkError, match="does not capture"):
            sb.open()
    finally:
        sb.close()
    # the operator widens the stream to tg.> (keeping the pipeline channels a created)
    kept = [s for s in js_call(nats_service.cdc, lambda js: js.stream_info(stream)).config.subjects
            if s.startswith(a + ".")]
    js_call(nats_service.cdc, lambda js: js.update_stream(
        nats.js.api.StreamConfig(name=stream, subjects=["tg.>", *kept], duplicate_window=120.0)))
    sb = make_sink(pipeline_spec(b, spec), spec, nats_service.cdc)
    try:
        sb.deliver(bb[0])
        sa.deliver(ba[1])
        assert sb.committed_checkpoint().position == bb[0].end_position
        assert sa.committed_checkpoint().position == ba[1].end_position
    finally:
        sa.close()
        sb.close()


def test_wrong_password_is_non_retryable_and_the_message_has_no_secret(nats_service, stream):
    name = unique("nauth")
    c = nats_service.cdc
    bad = Connection("cdc_nats", "nats", host=c.host, port=c.port, login=c.login,
                     password="Wr0ng-" + uuid.uuid4().hex)
    spec = nspec(stream)
    sink = NatsSink(pipeline_spec(name, spec), spec, bad)
    try:
        with pytest.raises(NonRetryableSinkError) as err:
            sink.deliver(make_batches(name, 1, 2, 1)[0])
    finally:
        sink.close()
    assert sink.classify(err.value) is ErrorClass.NON_RETRYABLE
    msg = str(err.value)
    assert "authentication failed" in msg and "Authorization Violation" in msg and "cdc_nats" in msg
    assert bad.password not in msg and c.password not in msg


def test_oversized_message_is_non_retryable_and_nothing_is_published(nats_service, stream):
    name = unique("nbig")
    spec = nspec(stream)
    sink = make_sink(pipeline_spec(name, spec), spec, nats_service.cdc)
    big = make_batches(name, 1, 3, 1, pad=2 * 1024 * 1024)[0]  # server max_payload is 1 MiB
    try:
        with pytest.raises(NonRetryableSinkError) as err:
            sink.deliver(big)
    finally:
        sink.close()
    assert "max_payload" in str(err.value) and "nothing of the sub-batch was delivered" in str(err.value)
    assert stored(nats_service.cdc, stream) == []


def test_server_unreachable_is_retryable():
    name = unique("ndown")
    spec = nspec("TG_DOWN")
    sink = NatsSink(pipeline_spec(name, spec), spec,
                    Connection("down", "nats", host="127.0.0.1", port=1, login="u", password="pw-secret-1",
                               extra={"connect_timeout": 1, "max_reconnect_attempts": 0}))
    try:
        with pytest.raises(RetryableSinkError) as err:
            sink.open()
    finally:
        sink.close()
    assert sink.classify(err.value) is ErrorClass.RETRYABLE
    assert "pw-secret-1" not in str(err.value)


def test_a_writer_of_an_older_epoch_is_fenced_and_writes_nothing(nats_service, stream):
    """Two writers of one sink, as a zombie run and the run that took its lease: once the newer
    epoch has claimed the checkpoint subject, the older one's delivery is refused (fatal,
    "fenced") before it publishes anything; the committed position stays the newer run's."""
    name = unique("nfence")
    spec = nspec(stream)
    batches = make_batches(name, 3, 4, 1)
    old, new, older = (make_sink(pipeline_spec(name, spec), spec, nats_service.cdc) for _ in range(3))
    old.epoch, new.epoch, older.epoch = 4, 5, 3
    try:
        old.deliver(batches[0], 0)
        new.open()
        assert new.committed_checkpoint() == old.committed_checkpoint()  # the claim carries it forward
        with pytest.raises(FatalSinkError, match="fenced: a newer run \\(lease epoch 5\\)") as err:
            old.deliver(batches[1], 1)
        assert old.classify(err.value) is ErrorClass.FATAL
        assert [m.headers["Nats-Msg-Id"] for m in stored(nats_service.cdc, stream)] == [
            e.idempotency_key for e in batches[0].events]
        new.deliver(batches[1], 1)
        new.deliver(batches[2], 2)
        with pytest.raises(FatalSinkError, match="fenced"):
            older.open()
        assert new.committed_checkpoint().position == batches[2].end_position
    finally:
        for s in (old, new, older):
            s.close()
    assert [m.headers["Nats-Msg-Id"] for m in stored(nats_service.cdc, stream)] == [
        e.idempotency_key for e in all_events(batches)]
    markers = stored(nats_service.cdc, stream, markers=True)
    assert [m.headers["Tidegate-Epoch"] for m in markers] == ["4", "4", "5", "5", "5"]  # claim, commit...
