"""Redis Streams sink against the real server: MULTI/EXEC atomicity across a SIGKILL, the
sink-side checkpoint, MAXLEN only when configured, and error classes."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
import redis
from test_sink_support import all_events, make_batches, make_tx, pipeline_spec, seq_of, source_items, unique
from tidegate.batching import SubBatch
from tidegate.connections import Connection
from tidegate.coordinator import run_once
from tidegate.errors import (
    ErrorClass,
    FatalSinkError,
    NonRetryableSinkError,
    OperatorSinkError,
    RetryableSinkError,
)
from tidegate.sinks import make_sink
from tidegate.sinks.redis.sink import RedisSink
from tidegate.sinks.redis.spec import RedisSinkSpec
from tidegate.spec import BatchSpec
from tidegate.spill import SpilledEvents
from tidegate.store import open_store

pytestmark = pytest.mark.integration

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
N_TX, ROWS, MAX_EVENTS = 10, 4, 8  # 5 sub-batches of 8 events


def rspec(name: str, maxlen: int | None = None) -> RedisSinkSpec:
    return RedisSinkSpec(id="cache", kind="redis", conn_id="cdc_redis",
                         stream="s:{pipeline}:{schema}.{table}", maxlen=maxlen)


def new_sink(conn: Connection, name: str, **kw) -> RedisSink:
    spec = rspec(name, **kw)
    return make_sink(pipeline_spec(name, spec), spec, conn)


def client(conn: Connection) -> redis.Redis:
    return redis.Redis(host=conn.host, port=conn.port, username=conn.login, password=conn.password)


def stream_keys(r: redis.Redis, name: str) -> list[str]:
    return [f[b"idempotency_key"].decode() for _, f in r.xrange(f"s:{name}:shop.orders")]


def test_xadd_fields_checkpoint_in_same_multi_exec_and_no_trimming(redis_service):
    name = unique("rdeliver")
    sink = new_sink(redis_service.cdc, name)
    batches = make_batches(name, 6, 50, 2)  # 300 entries: more than one radix-tree node
    try:
        sink.open()
        assert sink.committed_checkpoint() is None
        for v, b in enumerate(batches):
            assert sink.deliver(b, v) == b.end_position
        assert sink.committed_checkpoint().position == batches[-1].end_position
    finally:
        sink.close()
    r = client(redis_service.cdc)
    entries = r.xrange(f"s:{name}:shop.orders")
    events = all_events(batches)
    assert len(entries) == len(events)
    for (_, fields), ev in zip(entries, events, strict=True):
        assert set(fields) == {b"event", b"idempotency_key"}
        assert fields[b"event"] == ev.value and fields[b"idempotency_key"] == ev.idempotency_key.encode()
    assert json.loads(r.get(f"tidegate:checkpoint:acme/{name}::sink::cache")) == {
        "position": batches[-1].end_position.to_json(), "extends": len(batches) - 1}
    r.close()


def test_maxlen_trims_only_when_configured(redis_service):
    name = unique("rmaxlen")
    sink = new_sink(redis_service.cdc, name, maxlen=50)
    try:
        for b in make_batches(name, 10, 60, 1):
            sink.deliver(b)
    finally:
        sink.close()
    r = client(redis_service.cdc)
    n = r.xlen(f"s:{name}:shop.orders")
    assert 50 <= n < 600
    r.close()


# --------------------------------------------------------------------------- kill (child process)

CHILD = r"""
import json, sys
sys.path[:0] = [{here!r}]
from test_sink_redis import child_main
child_main(json.loads(sys.argv[1]))
"""


def child_main(args: dict) -> None:
    """Deliver through the coordinator; on sub-batch ``kill_at`` send MULTI and every queued
    command but not EXEC, wait until Redis has answered QUEUED to each, announce ``KILLME``."""
    from tidegate.connections import get_connection

    name, at = args["name"], args["kill_at"]

    class HangInsideMulti(RedisSink):
        calls = 0

        def _execute(self, pipe):
            HangInsideMulti.calls += 1
            if HangInsideMulti.calls != at:
                return super()._execute(pipe)
            conn = self._client.connection_pool.get_connection()
            cmds = [("MULTI",)] + [args for args, _ in pipe.command_stack]
            conn.send_packed_command(conn.pack_commands(cmds))
            replies = [conn.read_response() for _ in cmds]
            assert replies[0] in (b"OK", "OK") and all(r in (b"QUEUED", "QUEUED") for r in replies[1:])
            print(f"KILLME {len(replies) - 1}", flush=True)
            time.sleep(600)

    spec = rspec(name)
    sink = HangInsideMulti(pipeline_spec(name, spec), spec, get_connection("cdc_redis"))
    store = open_store(args["store"])
    batches = make_batches(name, N_TX, ROWS, 1)
    run_once(store, name, "child", [sink], BatchSpec(max_events=MAX_EVENTS),
             lambda start: source_items(batches, start))
    print("DONE", flush=True)


@pytest.mark.chaos
def test_kill_inside_multi_leaves_no_half_sub_batch_and_rerun_writes_each_key_once(redis_service, tmp_path):
    name = unique("rkill")
    url = f"sqlite:///{tmp_path}/ck.sqlite"
    args = {"name": name, "kill_at": 3, "store": url}
    proc = subprocess.Popen([sys.executable, "-c", CHILD.format(here=str(HERE)), json.dumps(args)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().split()
        assert line[:1] == ["KILLME"], f"child did not reach the kill point (rc={proc.poll()})"
        assert int(line[1]) == MAX_EVENTS + 2  # the XADDs, the checkpoint and fence SETs: queued
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    batches = make_batches(name, N_TX, ROWS, 2)
    r = client(redis_service.cdc)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the server notices the closed connection and drops the MULTI
        if not any(c.get("name") == f"tidegate-{name}-cache" for c in r.client_list()):
            break
        time.sleep(0.05)
    seen = stream_keys(r, name)
    assert seen == [e.idempotency_key for e in all_events(batches[:2])], "a half sub-batch is visible"
    sink = new_sink(redis_service.cdc, name)
    assert sink.committed_checkpoint().position == batches[1].end_position
    store = open_store(url)
    try:
        report = run_once(store, name, "rerun", [sink], BatchSpec(max_events=MAX_EVENTS),
                          lambda start: source_items(make_batches(name, N_TX, ROWS, 1), start))
        assert store.checkpoints.get(name, "cache").position == batches[-1].end_position
    finally:
        store.close()
    assert report.sinks["cache"].start == batches[1].end_position
    keys = stream_keys(r, name)
    events = all_events(batches)
    assert Counter(keys) == Counter(e.idempotency_key for e in events)  # each exactly once
    seqs = [seq_of(f[b"event"])[1] for _, f in r.xrange(f"s:{name}:shop.orders")]
    assert seqs == sorted(seqs)  # source order
    r.close()


# --------------------------------------------------------------------------- errors


def test_wrong_password_is_non_retryable_and_the_message_has_no_secret(redis_service):
    name = unique("rauth")
    c = redis_service.cdc
    bad = Connection("cdc_redis", "redis", host=c.host, port=c.port, login=c.login,
                     password="Wr0ng-" + uuid.uuid4().hex)
    spec = rspec(name)
    sink = RedisSink(pipeline_spec(name, spec), spec, bad)
    with pytest.raises(NonRetryableSinkError) as err:
        sink.deliver(make_batches(name, 1, 2, 1)[0])
    assert sink.classify(err.value) is ErrorClass.NON_RETRYABLE
    msg = str(err.value)
    assert "authentication failed" in msg and "cdc_redis" in msg
    assert bad.password not in msg and c.password not in msg


def test_noperm_is_non_retryable_and_nothing_is_written(redis_service):
    name = unique("rnoperm")
    user, pw = f"tg_noperm_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    r = client(redis_service.cdc)
    r.acl_setuser(user, enabled=True, passwords=[f"+{pw}"], keys=["*"],
                  commands=["+ping", "+get", "+type", "+multi", "+exec", "+set", "+hello", "+client"])
    try:
        c = redis_service.cdc
        conn = Connection("limited", "redis", host=c.host, port=c.port, login=user, password=pw)
        spec = rspec(name)
        sink = RedisSink(pipeline_spec(name, spec), spec, conn)
        with pytest.raises(NonRetryableSinkError) as err:
            sink.deliver(make_batches(name, 1, 3, 1)[0])
        sink.close()
        assert "lacks a permission" in str(err.value) and "NOPERM" in str(err.value).upper()
        assert pw not in str(err.value)
        assert r.xlen(f"s:{name}:shop.orders") == 0
        assert r.get(f"tidegate:checkpoint:acme/{name}::sink::cache") is None  # the SET was discarded too
    finally:
        r.acl_deluser(user)
        r.close()


def test_a_user_whose_patterns_leave_out_the_control_and_dlq_streams_delivers_rows(redis_service):
    """The ACL of docs/operations.md, its key patterns covering the tables' streams and the
    checkpoint only: every sub-batch's check WATCHes and types the keys it may write, the control
    stream and the DLQ among them, and one outside the patterns is skipped (nothing goes there)."""
    name = unique("rpatterns")
    user, pw = f"tg_patterns_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    r = client(redis_service.cdc)
    r.acl_setuser(user, enabled=True, passwords=[f"+{pw}"], keys=[f"s:{name}:*", "tidegate:*"],
                  commands=["-@all", "+ping", "+client|setname", "+type", "+xtrim", "+xadd", "+get", "+set",
                            "+watch", "+unwatch", "+multi", "+exec", "+discard", "+hello"])
    batches = make_batches(name, 4, 3, 2)
    try:
        c = redis_service.cdc
        spec = rspec(name)
        sink = RedisSink(pipeline_spec(name, spec), spec,
                         Connection("limited", "redis", host=c.host, port=c.port, login=user, password=pw))
        try:
            for v, b in enumerate(batches):
                sink.deliver(b, v)
        finally:
            sink.close()
        assert stream_keys(r, name) == [e.idempotency_key for e in all_events(batches)]
        assert json.loads(r.get(f"tidegate:checkpoint:acme/{name}::sink::cache"))["extends"] == 1
    finally:
        r.acl_deluser(user)
        r.close()


def test_a_server_that_evicts_any_key_when_full_is_refused_before_anything_is_written(redis_service):
    """maxmemory with an allkeys-* policy could drop the sink's streams or its record: the sink
    refuses to open, naming the setting and the fix; a volatile-* policy (only keys with a TTL,
    the sink sets none) and noeviction are taken."""
    name = unique("revict")
    r = client(redis_service.cdc)
    was = r.config_get("maxmemory*")
    batch = make_batches(name, 1, 3, 1)[0]
    try:
        r.config_set("maxmemory", str(1 << 30))
        for policy, refused in (("allkeys-lru", True), ("allkeys-random", True), ("volatile-lru", False),
                                ("noeviction", False)):
            r.config_set("maxmemory-policy", policy)
            sink = new_sink(redis_service.cdc, name)
            try:
                if refused:
                    with pytest.raises(OperatorSinkError) as err:  # a run failed by it is not retried
                        sink.deliver(batch, 0)
                    assert f"maxmemory-policy {policy}" in str(err.value), err.value
                    assert "Set maxmemory-policy to noeviction" in str(err.value)
                    assert r.xlen(f"s:{name}:shop.orders") == 0 and not r.exists(
                        f"tidegate:checkpoint:acme/{name}::sink::cache")
                else:
                    assert sink.deliver(batch, 0) == batch.end_position
            finally:
                sink.close()
        assert stream_keys(r, name) == [e.idempotency_key for e in batch.events] * 2
    finally:
        r.config_set("maxmemory-policy", was["maxmemory-policy"])
        r.config_set("maxmemory", was["maxmemory"])
        r.close()


def test_connection_refused_is_retryable():
    name = unique("rdown")
    spec = rspec(name)
    sink = RedisSink(pipeline_spec(name, spec), spec,
                     Connection("down", "redis", host="127.0.0.1", port=1, password="pw-secret-1"))
    with pytest.raises(RetryableSinkError) as err:
        sink.deliver(make_batches(name, 1, 2, 1)[0])
    assert sink.classify(err.value) is ErrorClass.RETRYABLE
    assert "pw-secret-1" not in str(err.value)


def test_a_key_of_another_type_is_refused_before_anything_is_written(redis_service):
    name = unique("rtype")
    r = client(redis_service.cdc)
    r.set(f"s:{name}:shop.orders", "not a stream")
    sink = new_sink(redis_service.cdc, name)
    try:
        with pytest.raises(NonRetryableSinkError) as err:
            sink.deliver(make_batches(name, 1, 2, 1)[0])
    finally:
        sink.close()
    assert "not a stream" in str(err.value)
    assert r.get(f"tidegate:checkpoint:acme/{name}::sink::cache") is None
    r.close()


@pytest.mark.parametrize("spilled", [False, True], ids=["whole", "frames"])
def test_a_stream_replaced_by_another_type_during_a_run_leaves_the_next_sub_batch_unwritten(
        redis_service, spilled):
    """A stream the sink wrote in one sub-batch is deleted and set as a string by someone else
    before the next. Inside MULTI/EXEC the XADD to it fails alone (WRONGTYPE) while the rest,
    the checkpoint included, is applied: the sink-side record would say the sub-batch is there
    and the next run would skip it, the failed changes lost. The sink finds the key again
    before each sub-batch: nothing of that sub-batch is written, the record does not move, and
    once the key is a stream again the sub-batch is delivered whole."""
    name = unique("rretype")
    txs = [make_tx(name, n, 3, table=t) for n, t in enumerate(("orders", "orders", "items", "orders"), 1)]
    first, second = SubBatch(1, tuple(txs[:2])), SubBatch(2, tuple(txs[2:]))
    r = client(redis_service.cdc)
    sink = new_sink(redis_service.cdc, name)
    ckpt = f"tidegate:checkpoint:acme/{name}::sink::cache"
    try:
        sink.deliver(first, 0)
        orders = f"s:{name}:shop.orders"
        r.delete(orders)
        r.set(orders, "not a stream")  # between two sub-batches of the run: another client
        if spilled:  # on disk, read back a frame at a time (a transaction past the limits)
            second = SubBatch(2, tuple(dataclasses.replace(tx, events=SpilledEvents(list(tx.events)).seal())
                                       for tx in second.transactions))
        with pytest.raises(NonRetryableSinkError, match="not a stream"):
            sink.deliver(second, 1)
        assert r.xlen(f"s:{name}:shop.items") == 0  # nothing of the sub-batch, in any stream
        assert sink.committed_checkpoint().position == first.end_position
        assert json.loads(r.get(ckpt))["extends"] == 0
        r.delete(orders)  # the operator removes the stray key: the run's retry delivers it all
        sink.deliver(second, 1)
        assert [e.idempotency_key for e in second.events if e.table == "orders"] == stream_keys(r, name)
        assert r.xlen(f"s:{name}:shop.items") == 3
        assert sink.committed_checkpoint().position == second.end_position
    finally:
        sink.close()
        r.close()


def test_a_writer_of_an_older_epoch_is_fenced_and_writes_nothing(redis_service):
    """Two writers of one sink, as a zombie run and the run that took its lease: once the newer
    epoch has claimed the sink, the older one's delivery is refused whole (fatal, "fenced") and
    neither its entries nor its checkpoint reach Redis; an even older writer cannot open."""
    name = unique("rfence")
    batches = make_batches(name, 3, 4, 1)
    old, new, older = (new_sink(redis_service.cdc, name) for _ in range(3))
    old.epoch, new.epoch, older.epoch = 4, 5, 3
    r = client(redis_service.cdc)
    try:
        old.open()
        old.deliver(batches[0], 0)
        new.open()  # the newer run claims the sink
        with pytest.raises(FatalSinkError, match="fenced: a newer run \\(lease epoch 5\\)") as err:
            old.deliver(batches[1], 1)
        assert old.classify(err.value) is ErrorClass.FATAL
        assert stream_keys(r, name) == [e.idempotency_key for e in batches[0].events]
        assert old.committed_checkpoint().position == batches[0].end_position
        new.deliver(batches[1], 1)
        new.deliver(batches[2], 2)
        with pytest.raises(FatalSinkError, match="fenced"):
            older.open()
    finally:
        for s in (old, new, older):
            s.close()
    assert stream_keys(r, name) == [e.idempotency_key for e in all_events(batches)]
    assert r.get(f"tidegate:fence:acme/{name}::sink::cache") == b"5"
    r.close()


class ReplyCuttingProxy:
    """A TCP relay to Redis that, once armed, forwards the next MULTI...EXEC to the server and
    then closes the client's connection without passing on any reply: the transaction ran, the
    writer never hears so (a network cut at the worst moment)."""

    def __init__(self, port: int):
        import socket
        import threading
        self.target = port
        self.armed = threading.Event()
        self.cuts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        import socket
        import threading
        while True:
            try:
                client_sock, _ = self.listener.accept()
            except OSError:
                return
            server_sock = socket.create_connection(("127.0.0.1", self.target))
            cut = threading.Event()
            threading.Thread(target=self._up, args=(client_sock, server_sock, cut), daemon=True).start()
            threading.Thread(target=self._down, args=(server_sock, client_sock, cut), daemon=True).start()

    def _up(self, src, dst, cut) -> None:
        while data := self._recv(src):
            if self.armed.is_set() and b"EXEC\r\n" in data:
                self.armed.clear()
                cut.set()  # from here on the replies are dropped
                self.cuts += 1
                dst.sendall(data)
                time.sleep(0.5)  # the server runs the transaction and answers into the void
                for s in (src, dst):
                    s.close()
                return
            dst.sendall(data)

    def _down(self, src, dst, cut) -> None:
        while (data := self._recv(src)) and not cut.is_set():
            dst.sendall(data)

    @staticmethod
    def _recv(sock) -> bytes:
        try:
            return sock.recv(65536)
        except OSError:
            return b""

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize("epoch", [None, 7], ids=["unfenced", "fenced"])
def test_an_exec_whose_reply_is_lost_is_not_stored_twice(redis_service, epoch):
    """The connection breaks after Redis ran a sub-batch's MULTI/EXEC and before the reply: the
    delivery fails retryable, and its retry finds the sub-batch in the sink-side checkpoint and
    writes nothing again (redis-py resends nothing by itself; under a fence, its WatchError for a
    lost connection is not taken for a moved fence)."""
    import dataclasses
    proxy = ReplyCuttingProxy(redis_service.cdc.port)
    name = unique("rcut")
    spec = rspec(name)
    sink = make_sink(pipeline_spec(name, spec), spec, dataclasses.replace(redis_service.cdc, port=proxy.port))
    sink.epoch = epoch
    batches = make_batches(name, 3, 4, 1)
    r = client(redis_service.cdc)
    try:
        sink.open()
        sink.deliver(batches[0], 0)
        proxy.armed.set()
        with pytest.raises(RetryableSinkError):
            sink.deliver(batches[1], 1)
        assert proxy.cuts == 1
        # the transaction ran: its entries and checkpoint are in Redis
        assert stream_keys(r, name) == [e.idempotency_key for e in all_events(batches[:2])]
        assert sink.deliver(batches[1], 1) == batches[1].end_position  # the retry
        sink.deliver(batches[2], 2)
    finally:
        sink.close()
        proxy.close()
    assert stream_keys(r, name) == [e.idempotency_key for e in all_events(batches)]
    r.close()
