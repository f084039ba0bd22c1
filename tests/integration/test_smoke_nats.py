"""JetStream stores a message once when the same Nats-Msg-Id is published twice in the window."""

from __future__ import annotations

import asyncio
import uuid

import nats
import pytest
from nats.js.api import StreamConfig

pytestmark = pytest.mark.integration


def test_same_msg_id_twice_is_reported_duplicate_and_stored_once(nats_service):
    c = nats_service.cdc

    async def scenario():
        nc = await nats.connect(f"nats://127.0.0.1:{c.port}", user=c.login, password=c.password)
        js = nc.jetstream()
        name = "SMOKE_" + uuid.uuid4().hex[:8].upper()
        await js.add_stream(StreamConfig(name=name, subjects=[f"{name}.>"], duplicate_window=120.0))
        try:
            headers = {"Nats-Msg-Id": "tenant|db.t|tx1|ev1"}
            first = await js.publish(f"{name}.orders", b'{"n":1}', headers=headers)
            second = await js.publish(f"{name}.orders", b'{"n":1}', headers=headers)
            info = await js.stream_info(name)
            msg = await js.get_msg(name, first.seq)
            return first, second, info.state.messages, msg.data
        finally:
            await js.delete_stream(name)
            await nc.close()

    first, second, stored, data = asyncio.run(scenario())
    assert not first.duplicate
    assert second.duplicate is True
    assert second.seq == first.seq
    assert stored == 1
    assert data == b'{"n":1}'
