"""The oracle's reading of a Kafka sink in Debezium's envelope (``ENVELOPE=debezium``; the sink
writes tombstones and transaction metadata, docs/operations.md, "envelope: debezium").

Debezium's records carry no tidegate idempotency key. A change record is known by its
transaction block (the transaction's id and the change's order in it, both fixed by the source
log, so a record sent twice has the same ones) and a snapshot row by its table and key (a
schedule re-loads each table once at most). Each change is handed to the oracle's checks as
tidegate's envelope would be (op, before, after, key, source.table). Beside them:

- in each partition, every delete is followed at once by its tombstone (its key, a null value),
  and no tombstone follows anything else;
- on the transaction topic, one BEGIN and one END per source transaction the data topics hold
  changes of (on PostgreSQL Debezium names them by the xid and an LSN: the BEGIN by its first
  change's, the END by where the commit ended), and none for any other; each END's
  ``event_count`` and ``data_collections`` are the changes the data topics hold of its
  transaction, in all and per table. With the idempotent producer (at least once) a re-send
  repeats them: one of each at least, every END counting those changes
  (:func:`transactions_at_least_once`).
"""

from __future__ import annotations

import collections
import json
from typing import Any

from confluent_kafka.admin import AdminClient

from tests.campaign.generator import TABLES, Key, key_of
from tests.integration.sink_readers import kafka_records


def partitions_of(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has (0: it does not exist)."""
    found = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics.get(topic)
    return 0 if found is None or found.error is not None else len(found.partitions)


def read_debezium_sink(pipe: Any, problems: list[str], dead_lettered: set[Key]) -> list[tuple[str, dict]]:
    """(id, change) of every change record of the sink's table topics, in sink order (partition
    by partition, each in offset order); what is wrong with the tombstones goes to ``problems``.
    ``dead_lettered``: the keys whose changes the sink dead-letters."""
    items = []
    for t in TABLES:
        topic = f"{pipe.name}.{t}"
        records = kafka_records(pipe.bootstrap, topic, partitions_of(pipe.bootstrap, topic))
        # With the idempotent producer a dead-lettered delete's tombstone is out with the records
        # around it before the broker refuses the delete (docs/architecture.md, "Poison events")
        check_tombstones(problems, topic, records, set() if pipe.sched.kafka_exactly_once else dead_lettered)
        for _, key, value, _ in records:
            if value is None:
                continue
            rec = json.loads(value)
            change = {"op": rec["op"], "before": rec["before"], "after": rec["after"],
                      "key": json.loads(key), "source": {"table": rec["source"]["table"]},
                      "transaction": rec["transaction"]}
            items.append((change_id(change), change))
    return items


def change_id(change: dict) -> str:
    if change["op"] == "r":
        return f"r|{change['source']['table']}|{json.dumps(change['key'], sort_keys=True)}"
    tx = change["transaction"] or {}  # a change without its block has no id: it counts as unexpected
    return f"{tx.get('id')}|{tx.get('total_order')}"


def check_tombstones(problems: list[str], topic: str, records: list[tuple], stray_ok: set[Key] = frozenset()
                     ) -> None:
    """Each delete followed at once by its tombstone in its partition, and nothing else by one
    (``stray_ok``: the keys whose tombstone may follow something else)."""
    table = topic.rpartition(".")[2]
    waiting = None  # (partition, key, offset index) of a delete whose tombstone comes next
    for i, (p, key, value, _) in enumerate(records):
        if waiting is not None:
            if value is None and (p, key) == waiting[:2]:
                waiting = None
                continue
            problems.append(f"{topic}[{waiting[0]}]: a delete (record {waiting[2]}) without its tombstone")
            waiting = None
        if value is None:
            if not stray_ok or key_of(table, json.loads(key)) not in stray_ok:
                problems.append(f"{topic}[{p}]: a tombstone (record {i}) after no delete of its key")
        elif json.loads(value)["op"] == "d":
            waiting = (p, key, i)
    if waiting is not None:
        problems.append(f"{topic}[{waiting[0]}]: a delete (record {waiting[2]}) without its tombstone")


def _group(tx_id: str, postgres: bool) -> str:
    """A transaction's records' common name: on PostgreSQL Debezium names them xid:lsn, the LSN
    differing between BEGIN and END."""
    return tx_id.partition(":")[0] if postgres else tx_id


def _held(unique: list[dict], postgres: bool) -> dict[str, collections.Counter]:
    """Per transaction, the changes the data topics hold of it, per table."""
    held: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for change in unique:
        if change["op"] != "r" and change["transaction"]:
            held[_group(change["transaction"]["id"], postgres)][change["source"]["table"]] += 1
    return held


def _marks(pipe: Any, postgres: bool) -> tuple[collections.Counter, dict[str, list[dict]]]:
    """The transaction topic: how many (status, transaction) records, and each transaction's ENDs."""
    topic = f"{pipe.name}.transaction"
    marks: collections.Counter = collections.Counter()
    ends: dict[str, list[dict]] = collections.defaultdict(list)
    for _, _, value, _ in kafka_records(pipe.bootstrap, topic, partitions_of(pipe.bootstrap, topic)):
        rec = json.loads(value)
        marks[(rec["status"], _group(rec["id"], postgres))] += 1
        if rec["status"] == "END":
            ends[_group(rec["id"], postgres)].append(rec)
    return marks, ends


def _end_counts(end: dict) -> dict[str, int]:
    """An END's count per table."""
    return {dc["data_collection"].rpartition(".")[2]: dc["event_count"]
            for dc in end["data_collections"] or []}


def check_transactions(problems: list[str], pipe: Any, unique: list[dict], postgres: bool,
                       at_least_once: bool = False, dead_lettered_in: str | None = None) -> None:
    """The transaction topic's BEGIN and END records against the changes the data topics hold
    (``unique``: each once); what is wrong goes to ``problems``. ``at_least_once``: the
    idempotent producer's (:func:`transactions_at_least_once`)."""
    marks, ends = _marks(pipe, postgres)
    judge = transactions_at_least_once if at_least_once else transactions_exactly_once
    problems += judge(_held(unique, postgres), marks, ends, dead_lettered_in)


def transactions_exactly_once(held: dict[str, collections.Counter], marks: collections.Counter,
                              ends: dict[str, list[dict]], dead_lettered_in: str | None = None) -> list[str]:
    """One BEGIN and one END per transaction the data topics hold changes of, the END counting
    them (a dead-lettered change is left out of its transaction's records)."""
    problems = []
    for g in sorted(set(held) | {g for _, g in marks}):
        begins = marks[("BEGIN", g)]
        if begins != 1 or marks[("END", g)] != 1:
            problems.append(f"transaction {g}: {begins} BEGIN and {marks[('END', g)]} END records, "
                            f"{sum(held[g].values())} changes in the data topics")
            continue
        end = ends[g][0]
        counts = _end_counts(end)
        if end["event_count"] != sum(held[g].values()) or counts != dict(held[g]):
            problems.append(f"transaction {g}: END counts {end['event_count']} {counts}, the data topics "
                            f"hold {dict(held[g])}")
    return problems


def transactions_at_least_once(held: dict[str, collections.Counter], marks: collections.Counter,
                               ends: dict[str, list[dict]], dead_lettered_in: str | None = None) -> list[str]:
    """A re-send repeats a transaction's BEGIN and END: each transaction the data topics hold
    changes of has one of each at least, and every END counts those changes. With dead letters
    in table ``dead_lettered_in``, an idempotent producer's END is out before the broker refuses a
    change, so it may count that table's dead-lettered changes too (never fewer than the data
    topics hold), and a transaction whose changes were all dead-lettered may have its BEGIN and
    END (docs/architecture.md, "Poison events and dead letters")."""
    problems = []
    for g in sorted(set(held) | {g for _, g in marks}):
        begins, own = marks[("BEGIN", g)], ends.get(g, [])
        if (not held[g] and dead_lettered_in is None) or not begins or not own:
            problems.append(f"transaction {g}: {begins} BEGIN and {len(own)} END records, "
                            f"{sum(held[g].values())} changes in the data topics")
            continue
        for end in own:
            counts = _end_counts(end)
            short = {t for t, n in held[g].items() if counts.get(t, 0) < n}
            extra = {t for t, n in counts.items() if n > held[g].get(t, 0) and t != dead_lettered_in}
            if short or extra or end["event_count"] != sum(counts.values()):
                problems.append(f"transaction {g}: an END counts {end['event_count']} {counts}, the data "
                                f"topics hold {dict(held[g])}")
                break
    return problems
