"""Reading back what a stream holds after the sink's last commit marker: the ``Nats-Msg-Id`` of
every message an attempt stored without the marker that would have proved it, so a retry (of
this run or the next) does not publish them again (the sink module's docstring).

A log event's ``Nats-Msg-Id`` ends in its ``event_id``, its position in the log of the server it
was read from: after a GTID failover, the new server's copy of a change a killed run stored has
another id, but the same transaction (the GTID) and place in it (``total_order``). The ids tell
which stored messages share a transaction with a message about to be published
(:func:`tx_prefix`); only then is what the stream holds there fetched whole (once) and
compared by :func:`change_of`, so a publish pays nothing for this, and a recovery on the same
server nothing more than before. A ``schema_change`` control message's id ends in the DDL's
position the same way; its copy is known by the DDL's GTID (in its ``position``) and table."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import orjson
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from .client import Client

log = logging.getLogger("tidegate.sinks.nats.sink")
T = TypeVar("T")


def tx_prefix(msg_id: str) -> str:
    """A data message's ``Nats-Msg-Id`` (``{tenant}|{pipeline}|{db}.{table}|{tx_id}|{event_id}``)
    without its event id: equal for the changes of one table in one transaction, whichever
    server they were read from. (An event id that holds ``|``, a snapshot row's key, cuts it
    elsewhere, the same way on every copy; :func:`change_of` decides.)"""
    return msg_id.rpartition("|")[0]


def change_of(payload: bytes) -> tuple | None:
    """A message's identity on every server of a GTID pair: for a log event, (its idempotency
    key without the event id, its ``total_order``); for a ``schema_change`` control message,
    (its idempotency key without the event id, the DDL's GTID, its table). None for a snapshot
    row (its id names no server), a schema change read without GTIDs, and anything else (a dead
    letter, another control message: their ids are the same on every server, or name none)."""
    try:
        msg = orjson.loads(payload)
        if msg.get("type") == "schema_change":
            gtid = msg["position"].get("gtid")
            return (tx_prefix(msg["idempotency_key"]), gtid, msg["db"], msg["table"]) if gtid else None
        if msg["source"]["snapshot"] != "false":
            return None
        return tx_prefix(msg["idempotency_key"]), int(msg["transaction"]["total_order"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return None


async def stored_ids(client: Client, stream: str, filters: list[str], after_seq: int,
                     markers: str) -> set[str]:
    """The Nats-Msg-Ids of the messages on ``filters`` with a stream sequence after
    ``after_seq``; subjects starting with ``markers`` (checkpoint subjects) are not data."""
    ids: set[str] = set()
    for subject in filters:
        for msg_subject, msg_id in await _each_after(client, stream, subject, after_seq, _subject_and_id):
            if msg_id and not msg_subject.startswith(markers):
                ids.add(msg_id)
    return ids


async def stored_changes(client: Client, stream: str, filters: list[str], after_seq: int
                         ) -> set[tuple]:
    """:func:`change_of` of every message on ``filters`` after ``after_seq``, fetched whole: once
    per run, when a change may have been stored from the other server of a GTID pair."""
    changes: set[tuple] = set()
    for subject in filters:
        changes.update(await _each_after(client, stream, subject, after_seq, _change, headers_only=False))
    changes.discard(None)
    return changes


def _subject_and_id(m: Any) -> tuple[str, str | None]:
    return m.subject, (m.headers or {}).get("Nats-Msg-Id")


def _change(m: Any) -> tuple | None:
    return change_of(m.data)


class Stored:
    """What the stream holds after the sink's last commit marker, as far as publishing asks:
    :meth:`holds` a message by its id or, while a stored message of its table and transaction
    matched no id (a copy read from the other server), by :func:`change_of`. What a killed run
    on the same server stored is matched by id before any other message of its transactions (a
    prefix of the sub-batch), so nothing is fetched for it."""

    def __init__(self, fetch: Callable[[int], Awaitable[set[tuple]]]):
        self.ids: set[str] = set()
        self._fetch = fetch  # the changes stored after a stream sequence (stored_changes)
        self._after_seq: int | None = None  # where the earliest read-back of the run started
        self._unmatched: dict[str, set[str]] = {}  # tx_prefix -> stored ids no message matched yet
        self._changes: set[tuple] | None = None  # fetched once, when first needed

    def __bool__(self) -> bool:
        return bool(self.ids)

    def add(self, ids: set[str], after_seq: int) -> None:
        """The ids a read-back from ``after_seq`` found."""
        self.ids |= ids
        self._after_seq = after_seq if self._after_seq is None else min(self._after_seq, after_seq)
        for msg_id in ids:
            self._unmatched.setdefault(tx_prefix(msg_id), set()).add(msg_id)

    def forget(self, msg_ids: list[str]) -> None:
        """Messages delivered since (skipped): later sub-batches do not hold them."""
        self.ids.difference_update(msg_ids)

    async def holds(self, msg_id: str, payload: bytes) -> bool:
        unmatched = self._unmatched.get(tx_prefix(msg_id))
        if msg_id in self.ids:
            if unmatched:
                unmatched.discard(msg_id)
            return True
        if not unmatched:  # nothing of its table and transaction, or all of it this server's
            return False
        if self._changes is None:
            self._changes = await self._fetch(self._after_seq or 0)
        change = change_of(payload)
        return change is not None and change in self._changes


async def _each_after(client: Client, stream: str, subject: str, seq: int, keep: Callable[[Any], T],
                      headers_only: bool = True) -> list[T]:
    """``keep(message)`` of every message on ``subject`` (a filter) after stream sequence
    ``seq``, through an ephemeral push consumer (about twice as fast as fetching from a pull
    consumer with nats-py); headers only unless asked (``keep`` then holds what it needs of a
    message, not the message)."""
    out: list[T] = []
    progress = asyncio.Event()
    wait_s = client.publish_timeout_s

    async def take(m: Any) -> None:
        out.append(keep(m))
        progress.set()

    inbox = client.nc.new_inbox()
    # Headers only: ~200 bytes a message, so no sub-batch's worth can make this a slow consumer.
    # Whole (after a failover): the client buffers up to 2 GiB; keep() parses as they come.
    sub = await client.nc.subscribe(inbox, cb=take, pending_msgs_limit=1 << 22, pending_bytes_limit=1 << 31)
    config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=seq + 1,
                            ack_policy=AckPolicy.NONE, headers_only=headers_only, filter_subject=subject,
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


__all__ = ["Stored", "change_of", "stored_changes", "stored_ids", "tx_prefix"]
