"""The oracle: the source is the truth. Per sink, after a schedule:

- every change exactly once by idempotency key (no entry twice on NATS and Redis streams, Kafka
  through a read_committed consumer, the changelog table on Delta);
- per key, the changes in commit order (the workload's model knows each key's history);
- the replay per key (the merged table on Delta) equal to the source table's rows;
- a snapshot row (``op: "r"``, a resnapshot's) holds the key's state where it stands in the
  key's sequence: the state the changes before it left (docs/architecture.md, "Snapshots": the
  states a sink receives for a key are a subsequence of its history in commit order); and every
  sink gets the same snapshot rows (a chunk's first read is kept for all of them), so a row one
  sink lacks was lost there, not left to the log;
- the store's checkpoints never moved back within one lineage (a rewind starts a new one);
- a rewound sink (``REWINDS=random``): a change after the restored position may come once more
  per such rewind, and one the sink held when rewound comes again, in order, where the sink
  stores every send (Kafka, Redis; NATS keeps one copy of a re-send within its duplicate window);
  a rewound Delta sink (``REWINDS=any``) writes nothing again: its tables hold every change once,
  as if it had not been rewound (docs/operations.md, "Replays and rewinds").
- rows too large for Kafka and NATS (``POISON=dlq``): those sinks hold none of their changes;
  their dead-letter destination holds each change of them once (by idempotency key; as the
  rewinds allow, on a rewound sink), the same changes by op as the workload made, and each
  snapshot row of them; every other change as above (docs/architecture.md, "Poison events").
- a Kafka sink in Debezium's envelope (``ENVELOPE=debezium``): its change records as above (by
  transaction id and order; a snapshot row by its key), the same snapshot rows as the other
  sinks (the huge rows' left out), every delete followed at once by its tombstone in its
  partition and no other tombstone, and on the transaction topic one BEGIN and one END per
  source transaction it wrote changes of, whose counts (in all, per table) are the changes the
  data topics hold of it (docs/operations.md, "envelope: debezium").
- a Kafka sink with the idempotent producer (``KAFKA=idempotent``, at least once): as above, but a
  change may come more than once, each repeat a re-send in order (per key, the change after the
  one before it, or an earlier one where a re-send starts). With ``ENVELOPE=debezium`` too: at
  least one BEGIN and END per transaction held, each END counting at least what is held (more only
  in a table with dead letters), and a dead-lettered delete's tombstone allowed without it.
- the pipeline's control channel on a message sink (docs/architecture.md, "Control messages":
  under the sink's guarantee): on MariaDB one ``schema_change`` message per column the workload
  added, known by its DDL (the same text and GTID on either server of a GTID pair, where its id
  differs); on PostgreSQL (a schema change shows when the table's next row does) none twice by
  id; one ``failover`` message per failover incident; nothing twice. Repeats are allowed where
  the sink's data may repeat (at least once, a rewound sink). A Kafka sink in Debezium's envelope
  too (it sends the control messages on the same channel). A Delta sink keeps them in the
  ``userMetadata`` of its commits: those of its checkpoint table (one commit per sub-batch, the
  sub-batch's control messages in it) are judged the same way.
- one NATS stream holds every table's changes and the control messages in one order: on
  MariaDB, that of their transactions' GTIDs, each message where it first came (the source order
  across sub-batches, not only per key).
- values at the edges of their types (``TYPES=edges``): the replayed rows equal the source's in the
  envelope's form, as docs/operations.md states it per type (type_edges.envelope_row); a merged
  Delta table's too, arrays as their JSON text. A sink in Debezium's envelope is judged on the
  other columns (the compat suite compares its types with Debezium's own records).
"""

from __future__ import annotations

import collections
import functools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tidegate.positions import position_from_json
from tidegate.spec import load_spec

from tests.campaign import type_edges
from tests.campaign.debezium_oracle import check_transactions, read_debezium_sink
from tests.campaign.generator import HUGE_BODY, KEY_COLUMNS, TABLES, Key, key_of
from tests.integration.sink_readers import header_texts, kafka_changes, redis_events, stored_messages


@dataclass
class SinkVerdict:
    sink: str
    events: int  # the changes the workload committed
    received: int = 0
    duplicates: int = 0
    lost: int = 0
    unexpected: int = 0
    out_of_order: int = 0  # keys whose changes arrived all, in another order
    wrong_rows: int = 0  # keys whose replayed row differs from the source's
    backwards: int = 0  # checkpoint versions that moved back
    snapshot_rows: int = 0  # op "r" rows received (without repeats)
    wrong_snapshot_rows: int = 0  # "r" rows whose state is not the key's state where they stand
    missing_snapshot_rows: int = 0  # "r" rows another sink of the pipeline got and this one did not
    # duplicates within a limit the docs state (README, "Guarantees"): reported, not a failure
    known: int = 0
    redelivered: int = 0  # repeats a rewind asked for (not duplicates)
    not_redelivered: int = 0  # changes a rewind should have delivered again and did not
    dead_letters: int = 0  # records in the sink's dead-letter destination (POISON=dlq)
    dead_letters_past_16mib: int = 0  # of them, events past the Kafka client's own limit (dlq_mixed)
    # ENVELOPE=debezium: tombstones and transaction records out of place (missing, repeated,
    # miscounted)
    misshapen: int = 0
    # at least once, a zombie in the schedule: keys whose stale re-send stopped early (allowed)
    stale: int = 0
    control: int = 0  # control messages received (without repeats)
    control_wrong: int = 0  # control messages twice, missing or unlooked-for
    examples: list[str] = field(default_factory=list)
    repeat_examples: list[str] = field(default_factory=list)  # the first duplicates

    @property
    def ok(self) -> bool:
        return not (self.duplicates - self.known or self.lost or self.unexpected or self.out_of_order
                    or self.wrong_rows or self.backwards or self.wrong_snapshot_rows
                    or self.missing_snapshot_rows or self.not_redelivered or self.misshapen
                    or self.control_wrong)

    def problems(self) -> str:
        parts = [f"{n} {what}" for what, n in (
            ("duplicates", self.duplicates), ("lost", self.lost), ("unexpected", self.unexpected),
            ("keys out of order", self.out_of_order), ("rows unlike the source", self.wrong_rows),
            ("snapshot rows out of place", self.wrong_snapshot_rows),
            ("snapshot rows other sinks got", self.missing_snapshot_rows),
            ("changes a rewind did not deliver again", self.not_redelivered),
            ("Debezium tombstones or transaction records out of place", self.misshapen),
            ("control messages twice, missing or unlooked-for", self.control_wrong),
            ("checkpoint moves back", self.backwards)) if n]
        # the repeats a guarantee allows are no example of what failed
        shown = self.examples + (self.repeat_examples if self.duplicates > self.known else [])
        return f"{self.sink}: " + ", ".join(parts) + (f" (e.g. {shown[:3]})" if shown else "")


NATS_MAX_IN_FLIGHT = 1000  # the NATS sink's default max_in_flight (the campaign's specs keep it)


def envelope_key(env: dict) -> Key:
    return key_of(env["source"]["table"], env["key"])


def check_changes(sink: str, items: list[tuple[str, dict]], expected: dict[Key, list[tuple]],
                  changes: int, ordered: bool = True) -> tuple[SinkVerdict, list[dict]]:
    """Exactly once and per-key order of (id, envelope) in sink order, and each snapshot row
    where its state belongs (``ordered`` False, a Delta changelog: a state the key had); returns
    the verdict and the envelopes without repeats (for the replay)."""
    v = SinkVerdict(sink, changes, received=len(items))
    seen: set[str] = set()
    unique = []
    for ident, env in items:
        if ident in seen:
            v.duplicates += 1
            if len(v.repeat_examples) < 3:
                v.repeat_examples.append(f"duplicate {ident}")
            continue
        seen.add(ident)
        unique.append(env)
    got: dict[Key, list[tuple]] = collections.defaultdict(list)
    for env in unique:
        got[envelope_key(env)].append((env["op"], (env["after"] or {}).get("v")))
    for k in set(expected) | set(got):
        want, have = expected.get(k, []), got.get(k, [])
        rows = sum(1 for op, _ in have if op == "r")
        if rows:
            v.snapshot_rows += rows
            misplaced = snapshot_rows_misplaced(want, have, ordered)
            v.wrong_snapshot_rows += misplaced
            if misplaced and len(v.examples) < 3:
                v.examples.append(f"{k}: snapshot row out of place: want {want} got {have}")
            have = [x for x in have if x[0] != "r"]
        if want == have:
            continue
        missing = collections.Counter(want) - collections.Counter(have)
        extra = collections.Counter(have) - collections.Counter(want)
        v.lost += sum(missing.values())
        v.unexpected += sum(extra.values())
        if not missing and not extra:
            v.out_of_order += 1
        if len(v.examples) < 3:
            v.examples.append(f"{k}: want {want} got {have}")
    return v, unique


def transaction_position(position: dict):
    """Where a change stands against checkpoints: its transaction's position. A checkpoint is a
    transaction boundary, and which transactions follow one is decided by their commit: on
    PostgreSQL by the commit LSN. A PostgreSQL checkpoint is the end of the last commit record,
    which is where the next transaction's first change starts: that change's own LSN equals
    the checkpoint (seeds 5832, 5835, 5839, 5841 of REWINDS=random, before this). A MariaDB row
    event lies inside its transaction's span."""
    if "commit_lsn" in position:
        return position_from_json({"kind": "postgres", "lsn": position["commit_lsn"]})
    return position_from_json(position)


def check_redelivery(v: SinkVerdict, items: list[tuple[str, dict]], rewinds: list[tuple],
                     every_send_stored: bool, unfenced_zombie: bool = False) -> None:
    """A rewound sink's repeats. ``rewinds``: (position restored, the sink's checkpoint when
    rewound). A change after a restored position may come once more per such rewind (counted as
    redelivered, not as duplicates); with ``every_send_stored``, one at or before the checkpoint
    then must have come again."""
    counts = collections.Counter(ident for ident, _ in items)
    first = {}
    for ident, env in items:
        first.setdefault(ident, env)
    excess = 0
    v.repeat_examples = []  # judged here instead
    for ident, n in counts.items():
        env = first[ident]
        if env["op"] == "r":  # a snapshot row: its position is the snapshot's, not the log's
            later, held = rewinds, 0
        else:
            pos = transaction_position(env["source"]["position"])
            later = [(at, ck) for at, ck in rewinds if pos > at]
            held = sum(1 for _, ck in later if pos <= ck)
        most, least = 1 + len(later), 1 + (held if every_send_stored else 0)
        excess += max(0, n - most)
        if n > most and len(v.examples) < 3:
            v.examples.append(f"{ident} at {env['source']['position']} came {n} times; rewinds "
                              f"{[(str(at), str(ck)) for at, ck in rewinds]} allow {most}")
        v.redelivered += min(n, most) - 1
        if n < least:
            v.not_redelivered += 1
            if len(v.examples) < 3:
                v.examples.append(f"{ident} came {n} time(s), rewinds asked for {least}")
    v.duplicates = excess
    if every_send_stored:
        check_resent_in_order(v, items, zombie=unfenced_zombie)


def check_resent_in_order(v: SinkVerdict, items: list[tuple[str, dict]], zombie: bool = False) -> None:
    """Per key, in sink order with the repeats: a rewind re-sends a key's changes from some
    earlier one on, in order and none left out. So each change is the next one of the key's
    history (as its first sends give it) after the one before it, or an earlier one (where a
    re-send starts): a jump forward is a re-send that skipped a change or sent it out of order.
    Not for NATS, which drops the re-sends that fall within its duplicate window.

    ``zombie`` (an unfenced sink, a schedule with a zombie run): a re-send may also stop early, the
    next change being the first never sent before. That is the stated window of an idempotent
    producer: a run stopped while it produced sends, when woken, what it held, after the newer
    changes of the run that took over (docs/architecture.md, "Fencing"); counted as ``stale``."""
    per_key: dict[Key, list[str]] = collections.defaultdict(list)
    for ident, env in items:
        if env["op"] != "r":
            per_key[envelope_key(env)].append(ident)
    for k, idents in per_key.items():
        order: dict[str, int] = {}
        for ident in idents:
            order.setdefault(ident, len(order))
        at = frontier = -1
        for ident in idents:
            if order[ident] > at + 1:
                if zombie and order[ident] == frontier + 1:
                    v.stale += 1
                else:
                    v.out_of_order += 1
                    v.examples.append(f"{k}: a re-send skips from change {at} to {order[ident]}")
                    break
            at = order[ident]
            frontier = max(frontier, at)


def snapshot_rows_misplaced(history: list[tuple], have: list[tuple], ordered: bool) -> int:
    """The "r" entries of ``have`` (a key's (op, v) as the sink holds them) whose v is not the
    key's state where they stand: after the entries before them (``ordered``), or, where the sink
    keeps no order, any state the key's ``history`` passed through. The key is absent before its
    first change (every schedule's pipeline is placed before the workload writes)."""
    if not ordered:
        states = {x for op, x in history if op != "d"}
        return sum(1 for op, x in have if op == "r" and x not in states)
    state, wrong = None, 0
    for op, x in have:
        if op == "r":
            wrong += x is None or x != state
        else:
            state = None if op == "d" else x
    return wrong


def replay(envelopes: list[dict]) -> dict[Key, dict]:
    rows: dict[Key, dict] = {}
    for env in envelopes:
        k = envelope_key(env)
        if env["op"] == "d":
            rows.pop(k, None)
        else:
            rows[k] = env["after"]
    return rows


def compare_rows(v: SinkVerdict, got: dict[Key, dict], source: dict[Key, dict]) -> None:
    for k in set(got) | set(source):
        a, b = got.get(k), source.get(k)
        if a is None or b is None:
            v.wrong_rows += 1
            if len(v.examples) < 3:
                v.examples.append(f"{k}: sink {trim(a)} source {trim(b)}")
        elif any(a.get(c) != b[c] for c in b):
            v.wrong_rows += 1
            if len(v.examples) < 3:  # the columns that differ, whole
                v.examples.append(f"{k}: " + ", ".join(f"{c} sink {a.get(c)!r} source {b[c]!r}"
                                                       for c in b if a.get(c) != b[c]))


def merged_form(row: dict) -> dict:
    """A row in the envelope's form as a merged Delta table holds it: an array (a SET, a
    PostgreSQL array) as its compact JSON text (docs/operations.md, "Delta Lake sink")."""
    return {c: json.dumps(x, separators=(",", ":"), ensure_ascii=False) if isinstance(x, list) else x
            for c, x in row.items()}


def trim(row: dict | None) -> str:
    return "absent" if row is None else json.dumps({c: (x[:12] if isinstance(x, str) else x)
                                                    for c, x in row.items()}, default=str)


def check_history(v: SinkVerdict, history: list) -> None:
    """Within one lineage (reset by anything that is not a delivery's write: a rewind), the
    positions of the writes never go back."""
    last = None
    for h in sorted(history, key=lambda h: h.version):
        if h.kind != "write":
            last = None
            continue
        try:
            back = last is not None and h.position < last.position
        except Exception as exc:  # noqa: BLE001 - positions of two identities: a finding too
            back, detail = True, str(exc)
        else:
            detail = f"v{h.version} {h.position} after v{last.version} {last.position}" if back else ""
        if back:
            v.backwards += 1
            v.examples.append(detail)
        last = h


POISONED_SINKS = ("kafka", "nats")  # the sinks a HUGE_BODY row is poison to (POISON=dlq)
OP_IN_EVENT = re.compile(rb'"op":"([cudr])"')  # in a dead letter's first 64 KiB of the event


def check_dead_letters(v: SinkVerdict, letters: list[tuple[str, dict]], expected: dict[Key, list[tuple]],
                       huge: set[Key], rewound: bool, at_least_once: bool = False) -> set[str]:
    """A sink's dead letters against the changes of the ``huge`` keys: each once (``rewound``: as
    often as the sink's rewinds allow, not judged here), too large, and as many of each op as the
    workload made; returns the idempotency keys of the snapshot rows among them. ``at_least_once``
    (an idempotent Kafka producer): at least as many of each op, since a change re-sent after a
    failover was read from the other server of the GTID pair, under another idempotency key
    (docs/architecture.md, after the idempotency key's definition: seed 7704)."""
    counts = collections.Counter(ident for ident, _ in letters)
    if not rewound:
        v.duplicates += sum(n - 1 for n in counts.values())
    ops: collections.Counter = collections.Counter()
    rows = set()
    for ident, record in {ident: rec for ident, rec in letters}.items():
        found = OP_IN_EVENT.search(record["event"].encode())
        op = found.group(1).decode() if found else "?"
        if op == "r":
            rows.add(ident)
        else:
            ops[op] += 1
        if record.get("event_size", 0) < HUGE_BODY:
            v.unexpected += 1  # an event the sink could have taken was dead-lettered
            if len(v.examples) < 3:
                v.examples.append(f"dead letter {ident} of {record.get('event_size')} bytes: "
                                  f"{record['error'][:80]}")
    want = collections.Counter(op for k in huge for op, _ in expected.get(k, ()))
    v.lost += sum((want - ops).values())
    extra = sum((ops - want).values())
    v.unexpected += 0 if at_least_once else extra
    if (want - ops or extra and not at_least_once) and len(v.examples) < 3:
        v.examples.append(f"dead letters by op {dict(ops)}, the huge rows' changes {dict(want)}")
    v.received += len(letters)
    v.dead_letters = len(letters)
    v.dead_letters_past_16mib = sum(record.get("event_size", 0) > 1 << 24 for _, record in letters)
    return rows


def read_dead_letters(sink: str, pipe, nats: NatsStream) -> list[tuple[str, dict]]:
    """(idempotency key, dead-letter record) of a Kafka or NATS sink's DLQ, in sink order."""
    if sink == "kafka":
        return [(r["idempotency_key"], r) for r in kafka_changes(pipe.bootstrap, f"{pipe.name}.__dlq")]
    return [(r["idempotency_key"], r) for r, _ in nats.subject(f"{pipe.name}.__dlq")]


def control_identity(msg: dict, mariadb: bool) -> tuple:
    """What one control message stands for: a MariaDB schema change its DDL and table (read from
    either server of a GTID pair, its id is a position in that server's log); anything else its
    idempotency key (an incident's or a snapshot's id, or a PostgreSQL LSN: one server)."""
    if mariadb and msg["type"] == "schema_change":
        return "schema_change", msg["ddl"], msg["table"]
    return msg["type"], msg["idempotency_key"]


def check_control(v: SinkVerdict, messages: list[dict], ddl: list[str], mariadb: bool,
                  failovers: int, repeats_allowed: bool) -> None:
    """A message sink's control channel against the workload's DDL (``table.column`` added) and
    the failover incidents the store recorded (see the module docstring)."""
    counts = collections.Counter(control_identity(m, mariadb) for m in messages)
    v.control = len(counts)
    wrong = [] if repeats_allowed else [f"control message {what} came {n} times"
                                        for what, n in counts.items() if n > 1]
    if mariadb:
        changes = [what for what in counts if what[0] == "schema_change"]
        for added in ddl:
            table, col = added.split(".")
            found = [w for w in changes if w[2] == table and f"ADD COLUMN {col} " in w[1]]
            if len(found) != 1:
                wrong.append(f"{len(found)} schema_change messages for {added}")
        if len(changes) != len(ddl):
            wrong.append(f"{len(changes)} schema changes for the workload's {len(ddl)} DDL statements")
    got = sum(1 for what in counts if what[0] == "failover")
    if got != failovers:
        wrong.append(f"{got} failover messages for {failovers} failover incidents")
    v.control_wrong = len(wrong)
    v.examples += wrong[:max(1, 3 - len(v.examples))]


GTID = re.compile(r"^\d+-\d+-(\d+)$")  # a MariaDB GTID: domain-server-sequence


def check_stream_order(v: SinkVerdict, stream: list[tuple[str, dict]], data_subjects: set[str],
                       control_subject: str) -> None:
    """(subject, payload) of one NATS stream in stream order: the first copy of each change and
    schema change follows its transaction's GTID order (MariaDB's sequence numbers, one domain);
    snapshot rows and other control messages stand nowhere in it."""
    seen: set = set()
    last = None
    for subject, msg in stream:
        if subject in data_subjects and msg["op"] != "r":
            ident, gtid = msg["idempotency_key"], msg["source"]["tx_id"]
        elif subject == control_subject and msg["type"] == "schema_change":
            ident, gtid = control_identity(msg, True), msg["position"].get("gtid") or ""
        else:
            continue
        found = GTID.match(gtid)
        if ident in seen or not found:
            continue
        seen.add(ident)
        seq = int(found.group(1))
        if last is not None and seq < last[0]:
            v.out_of_order += 1
            if len(v.examples) < 3:
                v.examples.append(f"stream order: {ident} of {gtid} after one of sequence {last[0]} "
                                  f"({last[1]})")
        last = max(last or (seq, ident), (seq, ident))


def read_control(sink: str, pipe, nats: NatsStream) -> list[dict]:
    """Every control message of a sink, in sink order (a Delta sink's: see delta_control)."""
    if sink.startswith("delta"):
        return delta_control(delta_checkpoint_table(pipe, sink), sink)
    if sink == "kafka":
        return kafka_changes(pipe.bootstrap, f"{pipe.name}.__control")
    if sink == "nats":
        return [m for m, _ in nats.subject(f"{pipe.name}.__control")]
    return [json.loads(e) for e in redis_events(pipe.redis, f"{pipe.name}:__control")]


# --------------------------------------------------------------------------- reading the sinks


class NatsStream:
    """A pipeline's NATS stream (commit markers left out), read once, on first use, for every
    check that asks: a read fetches each message of the stream, whatever subject it wants."""

    def __init__(self, pipe):
        self.pipe = pipe

    @functools.cached_property
    def messages(self) -> list:
        return stored_messages(self.pipe.nats, self.pipe.name.upper())

    def subject(self, subject: str) -> list[tuple[dict, dict]]:
        """(JSON payload, headers) of every message of ``subject``, in stream order."""
        return [(json.loads(m.data), header_texts(m.headers)) for m in self.messages if m.subject == subject]

    def in_order(self) -> list[tuple[str, dict]]:
        """(subject, JSON payload) of every message, in stream order."""
        return [(m.subject, json.loads(m.data)) for m in self.messages]


def read_stream_sink(sink: str, pipe, nats: NatsStream) -> list[tuple[str, dict]]:
    """(dedup id, envelope) of every data message of a Kafka / NATS / Redis sink, in sink order."""
    out = []
    for t in TABLES:
        if sink == "kafka":
            out += [(e["idempotency_key"], e) for e in kafka_changes(pipe.bootstrap, f"{pipe.name}.{t}")]
        elif sink == "nats":
            out += [(h["Nats-Msg-Id"], e) for e, h in nats.subject(f"{pipe.name}.{t}")]
        else:
            out += [(e["idempotency_key"], e) for e in map(json.loads, redis_events(pipe.redis,
                                                                                    f"{pipe.name}:{t}"))]
    return out


def delta_actions(table: Path) -> Iterator[dict]:
    """The actions of a Delta table's JSON commits, oldest commit first (none without a log)."""
    for commit in sorted((table / "_delta_log").glob("*.json")):
        # one action per line; not splitlines(): a value in the stats may hold U+2028
        for line in filter(None, commit.read_text().split("\n")):
            yield json.loads(line)


def delta_rows(table: Path) -> list[dict]:
    """The rows of a Delta table as a reader of its log sees them: the data files its JSON commits
    add and do not remove, read with pyarrow (no Spark needed to check)."""
    import pyarrow.parquet as pq

    live: dict[str, dict] = {}
    for action in delta_actions(table):
        if "add" in action:
            assert not action["add"].get("deletionVector"), f"{table}: deletion vectors are not read here"
            live[action["add"]["path"]] = action["add"]
        elif "remove" in action:
            live.pop(action["remove"]["path"], None)
    rows = []
    for path in live:
        from urllib.parse import unquote

        rows += pq.read_table(table / unquote(path)).to_pylist()
    return rows


def delta_control(table: Path, sink: str) -> list[dict]:
    """The control messages a Delta sink recorded in the ``userMetadata`` of the commits of its
    checkpoint table (``table``), oldest commit first: a sub-batch's commit to that table
    carries the sub-batch's (tidegate.sinks.delta.ledger.commit_metadata)."""
    out: list[dict] = []
    for action in delta_actions(table):
        meta = action.get("commitInfo", {}).get("userMetadata")
        meta = json.loads(meta) if meta else {}
        if meta.get("tidegate", {}).get("sink") == sink:
            out += meta.get("control", [])
    return out


def delta_checkpoint_table(pipe, sink: str) -> Path:
    """Where the pipeline's spec puts a Delta sink's checkpoint table (the sink's own rule)."""
    spec = load_spec(pipe.dir / "pipelines" / f"{pipe.name}.yaml")
    return Path(next(s for s in spec.sinks if s.id == sink).checkpoint_table_path(pipe.name))


def read_delta_changelog(pipe) -> list[tuple[str, dict]]:
    out = []
    for t in TABLES:
        for r in delta_rows(pipe.lake / pipe.name / "log" / pipe.schema / t):
            key = json.loads(r["key"]) if isinstance(r["key"], str) else r["key"]
            out.append((r["idempotency_key"], {"op": r["op"], "after": r["after"], "key": key,
                                               "source": {"table": t}}))
    return out


def read_delta_merged(pipe) -> dict[Key, dict]:
    return {key_of(t, r): r for t in TABLES
            for r in delta_rows(pipe.lake / pipe.name / "merged" / pipe.schema / t)}


def same_snapshot_rows(found: list[tuple[SinkVerdict, set]]) -> None:
    """Every sink got the snapshot rows any sink got (by idempotency key, or by key)."""
    every = set().union(*(ids for _, ids in found))
    for v, ids in found:
        v.missing_snapshot_rows += len(every - ids)
        if v.missing_snapshot_rows and len(v.examples) < 3:
            v.examples.append(f"lacks snapshot rows {sorted(every - ids)[:3]}")


def read_sink(sink: str, pipe, problems: list[str], poisoned: set[Key], nats: NatsStream
              ) -> list[tuple[str, dict]]:
    if sink == "delta_log":
        return read_delta_changelog(pipe)
    if sink == "kafka" and pipe.sched.envelope == "debezium":
        return read_debezium_sink(pipe, problems, poisoned)
    return read_stream_sink(sink, pipe, nats)


def snapshot_keys(items: list[tuple[str, dict]], poisoned: set[Key]) -> set[Key]:
    """The keys of the snapshot rows among ``items``, the huge rows' left out."""
    return {k for k in (envelope_key(env) for _, env in items if env["op"] == "r") if k not in poisoned}


def source_truth(pipe, work) -> tuple[dict[Key, dict], dict[Key, dict]]:
    """The source's rows in the envelope's form, and (TYPES=edges) the same without the typed
    columns: a sink in Debezium's envelope writes those in Debezium's types, which the compat
    suite compares with Debezium's own records."""
    rows = work.source_rows()
    if pipe.sched.types != "edges":
        return rows, rows
    kind = pipe.sched.source
    typed = set(type_edges.typed_names(kind))
    rows = {k: type_edges.envelope_row(kind, r) if k[0] == "items" else r for k, r in rows.items()}
    return rows, {k: {c: x for c, x in r.items() if c not in typed} for k, r in rows.items()}


def verdicts(pipe, work, history: dict[str, list]) -> list[SinkVerdict]:
    source, untyped = source_truth(pipe, work)
    out = []
    snapshot_ids: list[tuple[SinkVerdict, set[str]]] = []
    # A Debezium record has no idempotency key: its snapshot rows are compared with the others'
    # by key, those of huge rows left out (their dead letters are counted by op)
    snapshot_by_key: list[tuple[SinkVerdict, set[Key]]] = []
    debezium = pipe.sched.envelope == "debezium"
    zombie = any(step.fault == "zombie" for step in pipe.sched.steps)
    nats = NatsStream(pipe)
    for sink in pipe.sinks:
        rewinds = [(at, ck) for s, at, ck in pipe.rewound if s == sink]
        unfenced = sink == "kafka" and not pipe.sched.kafka_exactly_once  # nothing refuses a zombie
        if sink == "delta_merge":
            v = SinkVerdict(sink, work.changes)
            merged = read_delta_merged(pipe)
            v.received = len(merged)
            compare_rows(v, merged, {k: merged_form(r) for k, r in source.items()})
        else:
            problems: list[str] = []
            poisoned = work.huge if pipe.sched.poison and sink in POISONED_SINKS else set()
            items = read_sink(sink, pipe, problems, poisoned, nats)
            expected = {k: h for k, h in work.expected.items() if k not in poisoned}
            v, unique = check_changes(sink, items, expected, work.changes, ordered=sink != "delta_log")
            if rewinds and sink != "delta_log":  # a rewound Delta sink writes nothing again
                check_redelivery(v, items, rewinds, every_send_stored=sink != "nats",
                                 unfenced_zombie=zombie and unfenced)
            rows = {ident for ident, env in items if env["op"] == "r"}
            truth = untyped if debezium and sink == "kafka" else source
            if poisoned:
                rows |= check_dead_letters(v, read_dead_letters(sink, pipe, nats), work.expected, poisoned,
                                           rewound=bool(rewinds), at_least_once=unfenced)
                truth = {k: r for k, r in truth.items() if k not in poisoned}
            if debezium and sink == "kafka":
                check_transactions(problems, pipe, unique, pipe.sched.source == "postgres",
                                   at_least_once=not pipe.sched.kafka_exactly_once,
                                   dead_lettered_in="notes" if poisoned else None)
                v.misshapen = len(problems)
                v.examples += problems[:max(1, 3 - len(v.examples))]  # one at least: it is the finding
            else:
                snapshot_ids.append((v, rows))
            if debezium:
                snapshot_by_key.append((v, snapshot_keys(items, work.huge)))
            if sink == "nats" and zombie:
                # The stated limit: a zombie stalled past the duplicate window sends, when it
                # resumes, what its client had buffered (at most max_in_flight messages), before
                # it can check its claim. More than that, or without a zombie, is a failure.
                v.known = min(v.duplicates, NATS_MAX_IN_FLIGHT)
            if sink == "kafka" and not pipe.sched.kafka_exactly_once:
                # At least once (README, "Guarantees"): a change may come again, as a re-send
                # does, per key in order from where the re-send starts (checked with the rewinds')
                if not rewinds:
                    check_resent_in_order(v, items, zombie=zombie and unfenced)
                v.known = v.duplicates
            if sink == "nats" and pipe.sched.source == "mysql":
                check_stream_order(v, nats.in_order(),
                                   {f"{pipe.name}.{t}" for t in TABLES}, f"{pipe.name}.__control")
            if sink != "delta_log":  # the changelog's rows carry no order: the merged table checks it
                compare_rows(v, replay(unique), truth)
            else:
                v.out_of_order = 0
        # every sink's control channel; Debezium's envelope too (the same channel)
        check_control(v, read_control(sink, pipe, nats), work.ddl, pipe.sched.source == "mysql",
                      pipe.failovers_recorded(), bool(rewinds) or unfenced or sink in pipe.named_rewinds)
        check_history(v, history.get(sink, []))
        out.append(v)
    same_snapshot_rows(snapshot_ids)
    same_snapshot_rows(snapshot_by_key)
    return out


__all__ = ["KEY_COLUMNS", "SinkVerdict", "verdicts"]
