"""Reading back what a stream holds after the sink's last commit marker: the ``Nats-Msg-Id`` of
every message an attempt stored without the marker that would have proved it, so a retry (of
this run or the next) does not publish them again (the sink module's docstring).

A log event's ``Nats-Msg-Id`` ends in its ``event_id``, its position in the log of the server it
was read from: after a GTID failover, the new server's copy of a change a killed run stored has
another id. Its transaction (the GTID) and its place there (``total_order``, header
``Tidegate-Tx-Order``) are the same on both servers, so what was stored is also known by
:func:`replay_id`: the id without its event id, with that place instead."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from .client import Client

log = logging.getLogger("tidegate.sinks.nats.sink")

TX_ORDER_HEADER = "Tidegate-Tx-Order"  # a log event's total_order, on its message


def replay_id(msg_id: str, tx_order: str) -> str:
    """A change's identity on every server of a GTID pair: its ``Nats-Msg-Id``
    (``...|{db}.{table}|{tx_id}|{event_id}``) with the event id (a log position, which never holds
    ``|``) replaced by the change's place in its transaction. Unique within one server too: a
    transaction's changes each have their own place."""
    return f"{msg_id.rpartition('|')[0]}|#{tx_order}"


async def stored_ids(client: Client, stream: str, filters: list[str], after_seq: int,
                     markers: str) -> set[str]:
    """The Nats-Msg-Ids of the messages on ``filters`` with a stream sequence after
    ``after_seq``, and the :func:`replay_id` of those that carry their place in a transaction;
    subjects starting with ``markers`` (checkpoint subjects) are not data."""
    ids: set[str] = set()
    for subject in filters:
        for msg_subject, headers in await _headers_after(client, stream, subject, after_seq):
            msg_id = headers.get("Nats-Msg-Id")
            if msg_id and not msg_subject.startswith(markers):
                ids.add(msg_id)
                if TX_ORDER_HEADER in headers:
                    ids.add(replay_id(msg_id, headers[TX_ORDER_HEADER]))
    return ids


async def _headers_after(client: Client, stream: str, subject: str, seq: int) -> list[tuple[str, dict]]:
    """(subject, headers) of every message on ``subject`` (a filter) after stream sequence
    ``seq``, through an ephemeral headers-only push consumer (about twice as fast as fetching
    from a pull consumer with nats-py)."""
    out: list[tuple[str, dict]] = []
    progress = asyncio.Event()
    wait_s = client.publish_timeout_s

    async def take(m: Any) -> None:
        out.append((m.subject, m.headers or {}))
        progress.set()

    inbox = client.nc.new_inbox()
    # Headers only: ~200 bytes a message, so no sub-batch's worth can make this a slow consumer.
    sub = await client.nc.subscribe(inbox, cb=take, pending_msgs_limit=1 << 22, pending_bytes_limit=1 << 31)
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=seq + 1,
                            ack_policy=AckPolicy.NONE, headers_only=True, filter_subject=subject,
                            deliver_subject=inbox, inactive_threshold=max(30.0, wait_s * 3))
    info = None
    try:
        info = await client.js.add_consumer(stream, config)
        total = info.delivered.consumer_seq + info.num_pending  # delivered already + still to come
        while len(out) < total:
            progress.clear()
            try:
                await asyncio.wait_for(progress.wait(), wait_s)
            except TimeoutError:
                raise TimeoutError(f"reading back {subject!r} after sequence {seq}: {len(out)} of "
                                   f"{total} messages within {wait_s:g}s") from None
    finally:
        await sub.unsubscribe()
        if info is not None:
            try:
                await client.js.delete_consumer(stream, info.name)
            except Exception:  # noqa: BLE001, S110 - an ephemeral consumer goes away by itself
                pass
    return out


__all__ = ["TX_ORDER_HEADER", "replay_id", "stored_ids"]
