"""The campaign oracle's rule for snapshot rows (tests/campaign/oracle.py): an ``op: "r"`` row
must hold the key's state where it stands among the key's changes as the sink holds them, and the
changes without the snapshot rows must be the key's history exactly once, in commit order."""

from __future__ import annotations

from tests.campaign.oracle import check_changes, same_snapshot_rows, snapshot_rows_misplaced

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
