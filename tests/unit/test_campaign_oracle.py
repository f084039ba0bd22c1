"""The campaign oracle's rule for snapshot rows (tests/campaign/oracle.py): an ``op: "r"`` row
must hold the key's state where it stands among the key's changes as the sink holds them, and the
changes without the snapshot rows must be the key's history exactly once, in commit order; and
its rule for dead letters (``POISON=dlq``); how it reads Debezium's records (``ENVELOPE=debezium``);
and its rule for the control channel, and where it finds a Delta sink's."""

from __future__ import annotations

import collections
import json
from pathlib import Path

from tidegate.sinks.delta import ledger

from tests.campaign.debezium_oracle import (
    change_id,
    check_tombstones,
    transactions_at_least_once,
    transactions_exactly_once,
)
from tests.campaign.generator import HUGE_BODY
from tests.campaign.oracle import (
    SinkVerdict,
    check_changes,
    check_control,
    check_dead_letters,
    check_stream_order,
    delta_control,
    same_snapshot_rows,
    snapshot_rows_misplaced,
)

KEY = ("items", (("id", 1),))
HISTORY = [("c", 10), ("u", 11), ("u", 12), ("d", None), ("c", 20)]


def envelopes(ops: list[tuple]) -> list[tuple[str, dict]]:
    """(dedup id, envelope) of key 1 of ``items``; a snapshot row's id names its state."""
    out = []
    for n, (op, v) in enumerate(ops):
        ident = f"r{v}" if op == "r" else f"e{n}"
        out.append((ident, {"op": op, "after": None if v is None else {"id": 1, "v": v},
                            "key": {"id": 1}, "source": {"table": "items"}}))
    return out


def test_a_snapshot_row_between_the_changes_it_follows_passes():
    for at in range(1, 6):
        state = [None, 10, 11, 12, None, 20][at]
        if state is None:
            continue
        have = HISTORY[:at] + [("r", state)] + HISTORY[at:]
        assert snapshot_rows_misplaced(HISTORY, have, ordered=True) == 0, have
        v, _ = check_changes("kafka", envelopes(have), {KEY: HISTORY}, len(HISTORY))
        assert v.ok and v.snapshot_rows == 1, v.problems()


def test_a_snapshot_row_older_than_the_changes_before_it_is_out_of_place():
    """A state the key had, delivered after a later state: not commit order."""
    have = HISTORY[:3] + [("r", 11)] + HISTORY[3:]
    assert snapshot_rows_misplaced(HISTORY, have, ordered=True) == 1
    v, _ = check_changes("kafka", envelopes(have), {KEY: HISTORY}, len(HISTORY))
    assert not v.ok and v.wrong_snapshot_rows == 1


def test_a_snapshot_row_of_a_deleted_key_is_out_of_place():
    have = HISTORY[:4] + [("r", 12)] + HISTORY[4:]
    assert snapshot_rows_misplaced(HISTORY, have, ordered=True) == 1


def test_a_snapshot_row_before_the_key_exists_is_out_of_place():
    assert snapshot_rows_misplaced(HISTORY, [("r", 10)] + HISTORY, ordered=True) == 1


def test_unordered_sinks_accept_any_state_the_key_had_and_no_other():
    have = [("r", 20), *HISTORY, ("r", 11)]
    assert snapshot_rows_misplaced(HISTORY, have, ordered=False) == 0
    assert snapshot_rows_misplaced(HISTORY, [*HISTORY, ("r", 13)], ordered=False) == 1


def test_a_repeated_snapshot_row_is_a_duplicate_and_changes_are_still_checked():
    have = HISTORY[:2] + [("r", 11), ("r", 11)] + HISTORY[2:]
    v, _ = check_changes("kafka", envelopes(have), {KEY: HISTORY}, len(HISTORY))
    assert v.duplicates == 1 and v.wrong_snapshot_rows == 0
    lost = HISTORY[:2] + [("r", 11)] + HISTORY[3:]
    v, _ = check_changes("kafka", envelopes(lost), {KEY: HISTORY}, len(HISTORY))
    assert v.lost == 1 and v.snapshot_rows == 1


def test_a_sink_that_lacks_snapshot_rows_other_sinks_got_fails():
    """Campaign seed 5781: Kafka, NATS and Redis had the resnapshot's rows, the Delta changelog
    none; each alone passes (a key's row may be left to the log), together they cannot."""
    have = HISTORY[:2] + [("r", 11)] + HISTORY[2:]
    kafka, _ = check_changes("kafka", envelopes(have), {KEY: HISTORY}, len(HISTORY))
    delta, _ = check_changes("delta_log", envelopes(HISTORY), {KEY: HISTORY}, len(HISTORY), ordered=False)
    assert kafka.ok and delta.ok
    same_snapshot_rows([(kafka, {"r11"}), (delta, set())])
    assert kafka.ok and not delta.ok and delta.missing_snapshot_rows == 1


def test_a_rewound_sink_may_hold_what_follows_the_restored_position_once_more_and_must_where_it_held_it():
    """Changes 1..6; the sink rewound from its checkpoint at 4 to 2. Changes 3 and 4 (held when
    rewound) must come twice; 5 and 6 may; 1 and 2 only once."""
    from tidegate.positions import position_to_json
    from tidegate.sources.mysql.position import BinlogPosition

    from tests.campaign.oracle import SinkVerdict, check_redelivery

    def items(counts: dict[int, int]) -> list[tuple[str, dict]]:
        env = {n: {"op": "c", "key": {"id": n},
                   "source": {"table": "items", "position": position_to_json(BinlogPosition("b.000001", n))}}
               for n in counts}
        return [(f"e{n}", env[n]) for n, c in counts.items() for _ in range(c)]

    rewinds = [(BinlogPosition("b.000001", 2), BinlogPosition("b.000001", 4))]
    for counts, every_send_stored, dup, again, missing in [
        ({1: 1, 2: 1, 3: 2, 4: 2, 5: 1, 6: 2}, True, 0, 3, 0),
        ({1: 2, 2: 1, 3: 2, 4: 2, 5: 1, 6: 1}, True, 1, 2, 0),  # 1 lay before the restored position
        ({1: 1, 2: 1, 3: 1, 4: 2, 5: 3, 6: 1}, True, 1, 2, 1),  # 3 not sent again; 5 three times
        ({1: 1, 2: 1, 3: 1, 4: 1, 5: 1, 6: 1}, False, 0, 0, 0),  # NATS: re-sends within the window
    ]:
        v = SinkVerdict("s", 6)
        v.duplicates = sum(counts.values()) - 6  # as check_changes counts them
        check_redelivery(v, items(counts), rewinds, every_send_stored)
        assert (v.duplicates, v.redelivered, v.not_redelivered) == (dup, again, missing), counts
        assert v.ok == (dup == 0 and missing == 0)


def test_a_postgres_change_stands_where_its_transaction_commits():
    """The checkpoint is the end of the last commit record, where the next transaction's first
    change starts: that change (own LSN equal to the restored checkpoint, commit after it) may
    come again after the rewind (REWINDS=random seed 5839)."""
    from tidegate.positions import position_from_json

    from tests.campaign.oracle import SinkVerdict, check_redelivery

    at = position_from_json({"kind": "postgres", "lsn": "0/6084AE0"})
    held = position_from_json({"kind": "postgres", "lsn": "0/6086308"})
    position = {"lsn": "0/6084AE0", "commit_lsn": "0/6085440", "xid": 3431}
    env = {"op": "c", "key": {"id": 1}, "source": {"table": "items", "position": position}}
    v = SinkVerdict("nats", 1, duplicates=1)
    check_redelivery(v, [("e", env), ("e", env)], [(at, held)], every_send_stored=True)
    assert (v.duplicates, v.redelivered, v.not_redelivered) == (0, 1, 0) and v.ok


def test_a_rewound_sink_resends_a_keys_changes_in_order_and_leaves_none_out():
    from tests.campaign.oracle import SinkVerdict, check_resent_in_order

    def items(ids: str) -> list[tuple[str, dict]]:
        return [(i, {"op": "u", "key": {"id": 1}, "source": {"table": "items"}}) for i in ids]

    for sent, ok in [("abcd", True), ("abcbcd", True), ("abcdbcd", True), ("abbcbcdd", True),
                     ("abcdbd", False),  # the re-send from b left c out
                     ("abcbe", False)]:  # ... and went on to e before c and d came again
        v = SinkVerdict("kafka", 5)
        check_resent_in_order(v, items(sent))
        assert (v.out_of_order == 0) == ok, sent


def test_a_zombies_stale_resend_may_stop_early_where_nothing_fences_it():
    """Seed 6254: a woken zombie's idempotent producer sent a and b again after e, then the
    run that took over went on with f. Allowed only with an unfenced zombie; a gap is not."""
    from tests.campaign.oracle import SinkVerdict, check_resent_in_order

    def items(ids: str) -> list[tuple[str, dict]]:
        return [(i, {"op": "u", "key": {"id": 1}, "source": {"table": "items"}}) for i in ids]

    for sent, zombie, ok, stale in [("abcdeabf", True, True, 1), ("abcdeabf", False, False, 0),
                                    ("abcdeabcdef", True, True, 0),
                                    ("abcdeacf", True, False, 0)]:  # the stale re-send left b out
        v = SinkVerdict("kafka", 6)
        check_resent_in_order(v, items(sent), zombie=zombie)
        assert (v.out_of_order == 0, v.stale) == (ok, stale), sent


def letter(ident: str, op: str, size: int = HUGE_BODY + 100) -> tuple[str, dict]:
    event = '{"id":"x","idempotency_key":"' + ident + '","op":"' + op + '","before":{"body":"nnnn'
    return ident, {"idempotency_key": ident, "event": event, "event_size": size,
                   "error": "MSG_SIZE_TOO_LARGE"}


def test_dead_letters_hold_each_change_of_the_huge_rows_once_by_op():
    huge = {("notes", (("id", 7),)), ("notes", (("id", 9),))}
    expected = {("notes", (("id", 7),)): [("c", 1), ("u", 2)],
                ("notes", (("id", 9),)): [("c", 5), ("d", None)], ("items", (("id", 1),)): [("c", 3)]}
    good = [letter("a", "c"), letter("b", "u"), letter("c", "c"), letter("d", "d"), letter("s", "r")]
    v = SinkVerdict("kafka", 5)
    assert check_dead_letters(v, good, expected, huge, rewound=False) == {"s"}
    assert v.ok and v.received == 5
    # a change of a huge row missing, one sent twice, one small event dead-lettered
    v = SinkVerdict("kafka", 5)
    check_dead_letters(v, [*good[:3], good[0], letter("e", "c", size=900)], expected, huge, rewound=False)
    assert (v.lost, v.duplicates, v.unexpected) == (1, 1, 2) and not v.ok
    # a rewound sink may hold a dead letter again: its rewinds judge that, not the ops
    v = SinkVerdict("kafka", 5)
    check_dead_letters(v, [*good, good[1]], expected, huge, rewound=True)
    assert v.ok
    # at least once: a change dead-lettered again under another key (re-read from the other
    # server of a GTID pair, seed 7704) is a repeat; one of a huge row missing is still lost
    v = SinkVerdict("kafka", 5)
    check_dead_letters(v, [*good, letter("a2", "c")], expected, huge, rewound=False, at_least_once=True)
    assert v.ok
    check_dead_letters(v, good[1:], expected, huge, rewound=False, at_least_once=True)
    assert v.lost == 1 and not v.ok


def test_every_debezium_delete_is_followed_at_once_by_its_tombstone_and_nothing_else_is():
    def rec(op: str) -> bytes:
        return json.dumps({"op": op}).encode()

    good = [(0, b"1", rec("c"), []), (0, b"1", rec("d"), []), (0, b"1", None, []), (1, b"2", rec("d"), []),
            (1, b"2", None, [])]
    problems: list[str] = []
    check_tombstones(problems, "t", good)
    assert problems == []
    # a delete whose tombstone is missing (last of its partition, or followed by another key's
    # record), and a tombstone after something else
    check_tombstones(problems, "t", [(0, b"1", rec("d"), []), (1, b"2", rec("c"), [])])
    check_tombstones(problems, "t", [(0, b"1", rec("d"), []), (0, b"2", None, [])])
    check_tombstones(problems, "t", [(0, b"1", rec("u"), []), (0, b"1", None, [])])
    no_tombstone = "a delete (record 0) without its tombstone"
    stray = "a tombstone (record 1) after no delete of its key"
    assert [p.split(": ", 1)[1] for p in problems] == [no_tombstone, no_tombstone, stray, stray]
    # a dead-lettered delete's tombstone (the idempotent producer's), of its key only
    problems = []
    dead = {("notes", (("id", 5),))}
    five, six = b'{"id": 5}', b'{"id": 6}'
    check_tombstones(problems, "p.notes", [(0, five, rec("u"), []), (0, five, None, [])], dead)
    assert problems == []
    check_tombstones(problems, "p.notes", [(0, six, rec("u"), []), (0, six, None, [])], dead)
    assert [p.split(": ", 1)[1] for p in problems] == [stray]


def test_a_debezium_change_is_known_by_its_transaction_and_a_snapshot_row_by_its_key():
    change = {"op": "u", "key": {"id": 1}, "source": {"table": "items"},
              "transaction": {"id": "571:23456", "total_order": 3}}
    row = {**change, "op": "r", "transaction": None}
    assert change_id(change) == "571:23456|3" and change_id(row) == 'r|items|{"id": 1}'


def _end(counts: dict[str, int]) -> dict:
    return {"status": "END", "event_count": sum(counts.values()),
            "data_collections": [{"data_collection": f"db.{t}", "event_count": n} for t, n in counts.items()]}


def test_debezium_transaction_records_once_or_at_least_once():
    held = collections.defaultdict(collections.Counter, {"7": collections.Counter(items=2, notes=1)})
    once = collections.Counter({("BEGIN", "7"): 1, ("END", "7"): 1})
    twice = collections.Counter({("BEGIN", "7"): 2, ("END", "7"): 2})
    right = _end({"items": 2, "notes": 1})
    # exactly once: one of each, counting what the data topics hold
    assert transactions_exactly_once(held, once, {"7": [right]}) == []
    assert transactions_exactly_once(held, twice, {"7": [right, right]}) != []
    # at least once: a re-send repeats both, each END counting the same
    assert transactions_at_least_once(held, twice, {"7": [right, right]}) == []
    assert transactions_at_least_once(held, twice, {"7": [right, _end({"items": 1, "notes": 1})]}) != []
    no_end = collections.Counter({("BEGIN", "7"): 2})
    assert transactions_at_least_once(held, no_end, {}) != []
    # a dead-lettered notes change may be counted (the END was out before the refusal), never
    # one of another table, and a transaction of dead letters only may have its records
    counted = _end({"items": 2, "notes": 2})
    assert transactions_at_least_once(held, once, {"7": [counted]}, "notes") == []
    assert transactions_at_least_once(held, once, {"7": [counted]}) != []
    assert transactions_at_least_once(held, once, {"7": [_end({"items": 3, "notes": 1})]}, "notes") != []
    dead_only = collections.Counter({("BEGIN", "8"): 1, ("END", "8"): 1})
    only = {"8": [_end({"notes": 1})]}
    assert transactions_at_least_once(held, dead_only + once, {**only, "7": [right]}, "notes") == []
    assert transactions_at_least_once(held, dead_only + once, {**only, "7": [right]}) != []


def test_the_oracles_envelope_form_of_edge_values_is_the_documented_one():
    """TYPES=edges: the source's values as the driver reads them, in the form docs/operations.md
    gives per type (decimals plain, PostgreSQL's fractions without trailing zeros, MariaDB's
    TIME past 24 h and negative, BIT as digits, SET as a list, non-finite doubles null)."""
    import datetime as dt
    from decimal import Decimal

    from tests.campaign.type_edges import envelope_row, envelope_value

    assert envelope_value("mysql", Decimal("0E-30")) == "0." + "0" * 30
    assert envelope_value("postgres", Decimal("1E-20")) == "0.00000000000000000001"
    assert envelope_value("postgres", Decimal("NaN")) is None
    assert [envelope_value("postgres", x) for x in (float("nan"), float("-inf"), -0.0)] == [None, None, 0.0]
    at = dt.datetime(2023, 5, 21, 3, 57, 24, 263080)
    assert envelope_value("postgres", at) == "2023-05-21T03:57:24.26308"
    assert envelope_value("mysql", at) == "2023-05-21T03:57:24.263080"
    at = dt.datetime(2026, 3, 29, 2, 30, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=45)))
    assert envelope_value("postgres", at) == "2026-03-28T20:45:00+00:00"
    assert envelope_value("mysql", -dt.timedelta(hours=838, minutes=59, seconds=59)) == "-838:59:59"
    assert envelope_value("mysql", dt.timedelta(seconds=-1, microseconds=500000)) == "-00:00:00.500000"
    assert envelope_value("postgres", memoryview(b"\x00\xff")) == "AP8="
    row = envelope_row("mysql", {"id": 1, "bt": b"\x7f", "st": "x,z", "ts": dt.datetime(1970, 1, 1, 0, 0, 1)})
    assert row == {"id": 1, "bt": "1111111", "st": ["x", "z"], "ts": "1970-01-01T00:00:01+00:00"}
    assert envelope_row("mysql", {"st": ""})["st"] == []


def control(kind: str, event_id: str, **fields) -> dict:
    return {"type": kind, "idempotency_key": f"default|p|__control|{kind}|{event_id}", **fields}


def alter(position: str, table: str, col: str) -> dict:
    return control("schema_change", f"{position}:s.{table}", table=table,
                   ddl=f"ALTER TABLE s.{table} ADD COLUMN {col} INT NULL")


def test_the_control_channel_holds_each_ddl_and_each_failover_once():
    ddl = ["items.c1", "pairs.c2"]
    fine = [alter("bin.1:400", "items", "c1"), control("failover", "incident-3"),
            alter("bin.2:900", "pairs", "c2")]
    v = SinkVerdict("nats", 0)
    check_control(v, fine, ddl, mariadb=True, failovers=1, repeats_allowed=False)
    assert (v.control, v.control_wrong) == (3, 0) and v.ok
    # the DDL read again from the other server of a GTID pair: another id, the same DDL
    again = fine + [alter("replica-bin.1:77", "items", "c1")]
    v = SinkVerdict("nats", 0)
    check_control(v, again, ddl, mariadb=True, failovers=1, repeats_allowed=False)
    assert v.control_wrong == 1 and not v.ok and "came 2 times" in v.examples[0]
    # at least once: a repeat is allowed; a DDL missing, or a failover message, is not
    v = SinkVerdict("kafka", 0)
    check_control(v, [fine[1], fine[2], fine[2]], ddl, mariadb=True, failovers=2, repeats_allowed=True)
    assert v.control_wrong == 3  # no message for items.c1, one schema change short, one failover short
    # PostgreSQL: a schema change shows with the table's next row, known by its id
    v = SinkVerdict("redis", 0)
    check_control(v, [alter("lsn/1", "items", "c1")] * 2, ddl, mariadb=False, failovers=0,
                  repeats_allowed=False)
    assert v.control_wrong == 1


def test_one_nats_stream_holds_changes_and_schema_changes_in_gtid_order():
    def row(gtid: str, n: int, table: str = "items") -> tuple[str, dict]:
        return f"p.{table}", {"op": "c", "idempotency_key": f"k{gtid}:{n}", "source": {"tx_id": gtid}}

    ddl = ("p.__control", {**alter("bin.1:400", "pairs", "c1"), "position": {"gtid": "0-1-12"}})
    snapshot = ("p.items", {"op": "r", "idempotency_key": "r1", "source": {"tx_id": "snapshot:a"}})
    subjects = {"p.items", "p.pairs"}
    fine = [row("0-1-10", 1), row("0-1-10", 2, "pairs"), ddl, snapshot, row("0-1-13", 1),
            row("0-1-10", 1), ddl]  # repeats (a zombie's, a rewind's) stand nowhere
    v = SinkVerdict("nats", 0)
    check_stream_order(v, fine, subjects, "p.__control")
    assert v.out_of_order == 0
    # a later transaction's change stored before an earlier one's, in another table
    v = SinkVerdict("nats", 0)
    check_stream_order(v, [row("0-1-13", 1), ddl, row("0-1-10", 1, "pairs")], subjects, "p.__control")
    assert v.out_of_order == 2 and "stream order" in v.examples[0]


def test_a_delta_sinks_control_messages_are_read_from_its_checkpoint_tables_commits(tmp_path: Path):
    """The commits' userMetadata as the sink writes it (ledger.commit_metadata): the claim's holds
    none, another sink's are not this one's, and each sub-batch's come in commit order."""
    ddl, failover = alter("bin.1:400", "items", "c1"), control("failover", "incident-3")

    def commit(sink: str, controls: list[dict] | None, claim: bool = False) -> str:
        meta = ledger.commit_metadata(app=f"app-{sink}", pipeline="p", sink=sink, epoch=2, extends=4,
                                      covers=None, controls=controls, claim=claim)
        return json.dumps({"commitInfo": {"operation": "WRITE", "userMetadata": meta}}) + "\n" + (
            json.dumps({"add": {"path": "part-0.parquet"}}) + "\n")

    log = tmp_path / "_delta_log"
    log.mkdir()
    for n, text in enumerate([json.dumps({"protocol": {"minReaderVersion": 1}}) + "\n",
                              commit("delta_merge", None, claim=True), commit("delta_merge", [ddl]),
                              commit("delta_log", [failover]), commit("delta_merge", [failover])]):
        (log / f"{n:020d}.json").write_text(text)
    assert delta_control(tmp_path, "delta_merge") == [ddl, failover]
    assert delta_control(tmp_path, "delta_log") == [failover]
    assert delta_control(tmp_path / "missing", "delta_merge") == []
