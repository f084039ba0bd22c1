"""Redis runs XADD and SET in one MULTI/EXEC and keeps them across a restart (AOF)."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest
import redis

from tests.conftest import SERVICES

pytestmark = pytest.mark.integration


def test_xadd_and_set_in_multi_exec_survive_a_restart(redis_service):
    url = f"redis://{redis_service.cdc.login}:{redis_service.cdc.password}@127.0.0.1:{redis_service.port}/0"
    stream, ckpt = "smoke:" + uuid.uuid4().hex[:8], "smoke-ckpt:" + uuid.uuid4().hex[:8]
    r = redis.Redis.from_url(url)
    pipe = r.pipeline(transaction=True)
    pipe.xadd(stream, {"event": '{"id":1}', "idempotency_key": "k1"})
    pipe.xadd(stream, {"event": '{"id":2}', "idempotency_key": "k2"})
    pipe.set(ckpt, '{"lsn":"0/10"}')
    ids_a, ids_b, ok = pipe.execute()
    assert ok is True
    r.close()

    for cmd in ("down", "up"):
        subprocess.run([sys.executable, str(SERVICES), cmd, "redis"], check=True, capture_output=True)

    r = redis.Redis.from_url(url)
    entries = r.xrange(stream)
    assert [(i, f[b"idempotency_key"]) for i, f in entries] == [(ids_a, b"k1"), (ids_b, b"k2")]
    assert r.get(ckpt) == b'{"lsn":"0/10"}'
    r.close()
