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
  transaction, in all and per table.
"""

from __future__ import annotations

import collections
import json
from typing import Any

from confluent_kafka.admin import AdminClient

from tests.campaign.generator import TABLES
from tests.integration.sink_readers import kafka_records


def partitions_of(bootstrap: str, topic: str) -> int:
    """How many partitions ``topic`` has (0: it does not exist)."""
    found = AdminClient({"bootstrap.servers": bootstrap}).list_topics(topic, timeout=10).topics.get(topic)
    return 0 if found is None or found.error is not None else len(found.partitions)


def read_debezium_sink(pipe: Any, problems: list[str]) -> list[tuple[str, dict]]:
    """(id, change) of every change record of the sink's table topics, in sink order (partition
    by partition, each in offset order); what is wrong with the tombstones goes to ``problems``."""
    items = []
    for t in TABLES:
        topic = f"{pipe.name}.{t}"
        records = kafka_records(pipe.bootstrap, topic, partitions_of(pipe.bootstrap, topic))
        check_tombstones(problems, topic, records)
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


def check_tombstones(problems: list[str], topic: str, records: list[tuple]) -> None:
    """Each delete followed at once by its tombstone in its partition, and nothing else by one."""
    waiting = None  # (partition, key, offset index) of a delete whose tombstone comes next
    for i, (p, key, value, _) in enumerate(records):
        if waiting is not None:
            if value is None and (p, key) == waiting[:2]:
                waiting = None
                continue
            problems.append(f"{topic}[{waiting[0]}]: a delete (record {waiting[2]}) without its tombstone")
            waiting = None
        if value is None:
            problems.append(f"{topic}[{p}]: a tombstone (record {i}) after no delete of its key")
        elif json.loads(value)["op"] == "d":
            waiting = (p, key, i)
    if waiting is not None:
        problems.append(f"{topic}[{waiting[0]}]: a delete (record {waiting[2]}) without its tombstone")


def check_transactions(problems: list[str], pipe: Any, unique: list[dict], postgres: bool) -> None:
    """The transaction topic's BEGIN and END records against the changes the data topics hold
    (``unique``: each once); what is wrong goes to ``problems``."""
    def group(tx_id: str) -> str:  # PostgreSQL: xid:lsn, the LSN differing between BEGIN and END
        return tx_id.partition(":")[0] if postgres else tx_id

    held: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for change in unique:
        if change["op"] != "r" and change["transaction"]:
            held[group(change["transaction"]["id"])][change["source"]["table"]] += 1
    topic = f"{pipe.name}.transaction"
    marks: collections.Counter = collections.Counter()
    ends: dict[str, dict] = {}
    for _, _, value, _ in kafka_records(pipe.bootstrap, topic, partitions_of(pipe.bootstrap, topic)):
        rec = json.loads(value)
        marks[(rec["status"], group(rec["id"]))] += 1
        if rec["status"] == "END":
            ends[group(rec["id"])] = rec
    for g in sorted(set(held) | {g for _, g in marks}):
        begins, end = marks[("BEGIN", g)], ends.get(g)
        if begins != 1 or marks[("END", g)] != 1:
            problems.append(f"transaction {g}: {begins} BEGIN and {marks[('END', g)]} END records, "
                         f"{sum(held[g].values())} changes in the data topics")
            continue
        counts = {dc["data_collection"].rpartition(".")[2]: dc["event_count"]
                  for dc in end["data_collections"] or []}
        if end["event_count"] != sum(held[g].values()) or counts != dict(held[g]):
            problems.append(f"transaction {g}: END counts {end['event_count']} {counts}, the data topics "
                         f"hold {dict(held[g])}")
