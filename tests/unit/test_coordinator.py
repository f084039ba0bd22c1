import itertools
import random

import pytest
from _tidegate_fakes import FakeSink, pos, stream
from tidegate.coordinator import Coordinator, lowest_start
from tidegate.errors import (
    CommitPolicyError,
    FatalRunError,
    FatalSinkError,
    NonRetryableSinkError,
    OperatorSinkError,
    RetryableSinkError,
    StaleEpochError,
)
from tidegate.positions import SnapshotPosition
from tidegate.sink_checkpoints import SinkCheckpoint
from tidegate.spec import BatchSpec
from tidegate.store.sqlite import SqliteStore


@pytest.fixture()
def store(tmp_path):
    s = SqliteStore(tmp_path / "ckpt.sqlite")
    s.migrate()
    yield s
    s.close()


def _coordinator(store, sinks, policy="required", quorum=None, max_events=2, run_id="r1", journal_id=None):
    epoch = store.leases.acquire("p", run_id)
    return Coordinator(store, "p", run_id, epoch, sinks,
                       BatchSpec(max_events=max_events, commit_policy=policy, quorum=quorum),
                       sleep=lambda s: None, journal_id=journal_id)


def _positions(store):
    return {sid: rec.position for sid, rec in store.checkpoints.current("p").items()}


# --------------------------------------------------------------------------- policy matrix

POLICIES = [("required", None), ("all", None), ("quorum", 1), ("quorum", 2), ("quorum", 3),
            ("quorum", 4)]
REQUIRED_STATES = ["ok", "one_failing", "all_failing"]
OPTIONAL_STATES = ["ok", "failing"]
FAIL_AT = [1, 2]  # the failing sinks fail from the 1st or from the 2nd sub-batch on


@pytest.mark.parametrize("policy,quorum,req_state,opt_state,fail_at", [
    (p, q, r, o, f)
    for (p, q), r, o, f in itertools.product(POLICIES, REQUIRED_STATES, OPTIONAL_STATES, FAIL_AT)
])
def test_commit_policy_matrix(store, policy, quorum, req_state, opt_state, fail_at):
    """Sinks r1, r2 (required) and o1, o2 (optional); 6 one-row transactions in 3 sub-batches.
    Exactly the acknowledging sinks move, and to the end of the last sub-batch that held."""
    failing = {"one_failing": {"r2"}, "all_failing": {"r1", "r2"}}.get(req_state, set())
    failing |= {"o1"} if opt_state == "failing" else set()
    sinks = [FakeSink(sid, required=sid.startswith("r"), fail_from_call=fail_at if sid in failing else None)
             for sid in ("r1", "r2", "o1", "o2")]
    co = _coordinator(store, sinks, policy, quorum)
    ok_sinks = {"r1", "r2", "o1", "o2"} - failing
    holds = {"required": {"r1", "r2"} <= ok_sinks, "all": not failing,
             "quorum": len(ok_sinks) >= (quorum or 0)}[policy]
    batch_ends = [pos(2), pos(4), pos(6)]  # 6 one-row transactions, 2 per sub-batch
    if holds:
        report = co.run(iter(stream([1] * 6)))
        expect = {sid: pos(6) for sid in ok_sinks}
        if fail_at == 2:  # the failing sinks got the first sub-batch, then stayed behind
            expect |= {sid: batch_ends[0] for sid in failing}
        assert _positions(store) == expect
        for sid in failing:
            assert report.sinks[sid].status == "failed"
            assert len(sinks[["r1", "r2", "o1", "o2"].index(sid)].batches) == fail_at - 1
    else:
        with pytest.raises(CommitPolicyError) as ei:
            co.run(iter(stream([1] * 6)))
        expect = {} if fail_at == 1 else {sid: batch_ends[0] for sid in ("r1", "r2", "o1", "o2")}
        assert _positions(store) == expect  # nothing moved for the failing sub-batch
        assert "commit policy" in str(ei.value) and "is down" in str(ei.value)
        assert not ei.value.fatal  # an error no rule knows: the scheduler's retries apply


@pytest.mark.parametrize("policy,quorum,r_fails,fatal", [
    ("all", None, None, True), ("quorum", 2, None, False), ("quorum", 3, None, True),
    ("required", None, "away", False), ("required", None, "unknown", False),
    ("required", None, "operator", True)])
def test_a_policy_failure_is_fatal_only_when_what_an_operator_must_clear_fails_it(
        store, policy, quorum, r_fails, fatal):
    """r (required) takes the sub-batch or fails as told, o (optional) fails on a server away, x
    (optional) on what only an operator clears. A scheduler's retry is refused only when the
    policy would fail even if every sink not awaiting an operator took the sub-batch."""
    errors = {"away": RetryableSinkError("r is away"), "unknown": NonRetryableSinkError("r said no"),
              "operator": OperatorSinkError("r lost changes")}
    sinks = [FakeSink("r", required=True, fail_from_call=1 if r_fails else None, error=errors.get(r_fails)),
             FakeSink("o", required=False, fail_from_call=1, error=RetryableSinkError("o is away")),
             FakeSink("x", required=False, fail_from_call=1, error=OperatorSinkError("x lost changes"))]
    with pytest.raises(CommitPolicyError) as ei:
        _coordinator(store, sinks, policy, quorum).run(iter(stream([1] * 2)))
    assert ei.value.fatal is fatal
    assert ("only an operator clears" in str(ei.value)) is fatal


def _holds_after_retry(policy: str, quorum: int | None, required: dict[str, bool], ok: set[str]) -> bool:
    """The oracle, written apart from the engine: whether the policy holds when the sinks in
    ``ok`` take the sub-batch."""
    if policy == "required":
        return all(sid in ok for sid, req in required.items() if req)
    if policy == "all":
        return ok == set(required)
    return len(ok) >= min(quorum, len(required))


@pytest.mark.parametrize("seed", range(150))
def test_generated_policies_fail_fast_exactly_when_no_retry_can_make_them_hold(store, seed):
    """A drawn policy over 1-4 sinks, each taking the sub-batch or failing on a server away, an
    error no rule knows, or what only an operator clears: the run's error is fatal exactly when no
    set of the sinks not awaiting an operator coming back makes the policy hold."""
    rng = random.Random(seed)
    ids = [f"s{i}" for i in range(rng.randint(1, 4))]
    required = {sid: rng.random() < 0.5 for sid in ids}
    policy = rng.choice(["required", "all", "quorum"])
    quorum = rng.randint(1, len(ids)) if policy == "quorum" else None
    fates = {sid: rng.choice(["ok", "away", "unknown", "operator"]) for sid in ids}
    errors = {"away": RetryableSinkError, "unknown": NonRetryableSinkError, "operator": OperatorSinkError}
    sinks = [FakeSink(sid, required=required[sid], fail_from_call=None if fates[sid] == "ok" else 1,
                      error=errors[fates[sid]](f"{sid}: {fates[sid]}") if fates[sid] != "ok" else None)
             for sid in ids]
    ok = {sid for sid in ids if fates[sid] == "ok"}
    if _holds_after_retry(policy, quorum, required, ok):
        _coordinator(store, sinks, policy, quorum).run(iter(stream([1] * 2)))
        return
    with pytest.raises(CommitPolicyError) as ei:
        _coordinator(store, sinks, policy, quorum).run(iter(stream([1] * 2)))
    maybe = [sid for sid in ids if fates[sid] in ("away", "unknown")]
    saved = any(_holds_after_retry(policy, quorum, required, ok | set(back))
                for n in range(len(maybe) + 1) for back in itertools.combinations(maybe, n))
    assert ei.value.fatal is not saved, (policy, quorum, required, fates)


# --------------------------------------------------------------------------- replay


def test_replay_ahead_sink_gets_nothing_it_has(store):
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write("p", "b", pos(3), run_id="r0", epoch=epoch)  # store says b has 1..3
    a, b = FakeSink("a"), FakeSink("b")
    c = FakeSink("c", committed=pos(5))  # c recorded 1..5 itself (crash before its first store write)
    co = _coordinator(store, [a, b, c], max_events=2)
    co.open()
    assert co.effective_positions() == {"a": None, "b": pos(3), "c": pos(5)}
    assert co.lowest_start() is None
    items = stream([1] * 8)
    co.run(iter(items))
    keys = [e.idempotency_key for e in items]
    assert a.delivered == keys
    assert b.delivered == keys[3:]
    assert c.delivered == keys[5:]
    # c was not even called for the sub-batches it has (txs 1-2, 3-4)
    assert [bt.end_position for bt in c.batches] == [pos(6), pos(8)]
    # b's checkpoint moved only forward; c's record was adopted by the store first
    assert [h.position for h in store.checkpoints.history("p", "b")] == [pos(3), pos(4), pos(6), pos(8)]
    assert [(h.position, h.kind) for h in store.checkpoints.history("p", "c")] == [
        (pos(5), "adopt"), (pos(6), "write"), (pos(8), "write")]
    # every delivery names the store version it extends: c's adoption was version 1, then 2, 3
    assert c.extends == [1, 2]


def test_lowest_start():
    assert lowest_start([pos(3), pos(1), pos(2)]) == pos(1)
    assert lowest_start([pos(3), None]) is None
    assert lowest_start([]) is None


def test_position_marks_advance_checkpoints_without_delivery(store):
    s = FakeSink("s")
    co = _coordinator(store, [s])
    co.run(iter(stream([0, 0, 0])))
    assert s.calls == 0 and s.attempts == 0
    assert _positions(store) == {"s": pos(3)}


# --------------------------------------------------------------------------- errors


def test_fatal_stops_the_run_at_once(store):
    good = FakeSink("good")
    bad = FakeSink("bad", required=False, fail_from_call=2, error=FatalSinkError("producer fenced"))
    co = _coordinator(store, [good, bad])
    with pytest.raises(FatalRunError, match="producer fenced"):
        co.run(iter(stream([1] * 6)))
    assert _positions(store) == {"good": pos(2), "bad": pos(2)}  # the fatal sub-batch moved nothing
    assert good.calls == 2  # good delivered sub-batch 2 concurrently, but no checkpoint for it
    assert bad.attempts == 2


def test_retryable_error_is_retried(store):
    s = FakeSink("s", fail_from_call=1, fail_times=2, error=RetryableSinkError("timeout"))
    co = _coordinator(store, [s])
    report = co.run(iter(stream([1, 1])))
    assert s.attempts == 3 and report.sinks["s"].status == "ok"
    assert _positions(store) == {"s": pos(2)}


def test_retries_exhausted_fails_sink(store):
    opt = FakeSink("o", required=False, fail_from_call=1, error=RetryableSinkError("timeout"))
    req = FakeSink("r")
    report = _coordinator(store, [req, opt]).run(iter(stream([1] * 4)))
    assert opt.attempts == 3  # 3 attempts on the first sub-batch, then no more sub-batches
    assert report.sinks["o"].status == "failed" and report.sinks["o"].error_class == "retryable"
    assert _positions(store) == {"r": pos(4)}


def test_stale_epoch_cannot_move_a_checkpoint(store):
    s = FakeSink("s")
    co = _coordinator(store, [s], run_id="zombie")
    store.leases.acquire("p", "newer-run")  # another run took the lease
    with pytest.raises(StaleEpochError):
        co.run(iter(stream([1, 1])))
    assert _positions(store) == {}


def test_report_and_journal(store):
    jid = store.runs.begin("p", "r1", interval_start="2026-01-01T00:00:00+00:00")
    s1, s2 = FakeSink("s1"), FakeSink("s2", required=False, fail_from_call=2)
    epoch = store.leases.acquire("p", "r1")
    co = Coordinator(store, "p", "r1", epoch, [s1, s2], BatchSpec(max_events=2), journal_id=jid,
                     sleep=lambda s: None)
    with co:
        report = co.run(iter(stream([1] * 4)))
    assert s1.closed and s2.closed
    assert report.sub_batches == 2 and report.events == 4
    assert report.sinks["s1"].events == 4 and report.sinks["s2"].events == 2
    j = store.runs.entries("p", "r1")[0]
    assert j.status == "success"
    assert j.sinks["s1"].end == pos(4) and j.sinks["s2"].end == pos(2)
    assert j.sinks["s2"].status == "failed"
    doc = report.to_json()
    assert doc["sinks"][0]["end"] == pos(4).to_json()


class JournalWatchingSink(FakeSink):
    """Reads the run's journal entry as each delivery begins: what a SIGKILL at that moment
    would leave behind."""

    def __init__(self, sink_id, store):
        super().__init__(sink_id)
        self.store, self.seen = store, []

    def deliver(self, batch, extends=None):
        entry = self.store.runs.entries("p", "r1")[0]
        self.seen.append({sid: (js.start, js.end) for sid, js in entry.sinks.items()})
        return super().deliver(batch, extends)


def test_the_journal_follows_every_checkpoint_move_before_the_run_ends(store):
    """A run killed mid-range never reaches its end; its journal entry already holds, per sink,
    the range up to the last checkpoint it wrote, so a clear of the run re-sends that part
    (the real-server kill: test_fault_matrix.py, section 7)."""
    sink = JournalWatchingSink("s1", store)
    with _coordinator(store, [sink], journal_id=store.runs.begin("p", "r1")) as co:
        co.run(iter(stream([1] * 6)))
    assert sink.seen == [{}, {"s1": (None, pos(2))}, {"s1": (None, pos(4))}]
    assert store.runs.entries("p", "r1")[0].sinks["s1"].end == pos(6)


def test_split_transaction_moves_checkpoints_only_at_boundaries(store):
    s = FakeSink("s")
    epoch = store.leases.acquire("p", "r1")
    co = Coordinator(store, "p", "r1", epoch, [s],
                     BatchSpec(max_events=2, respect_source_tx=False), sleep=lambda x: None)
    items = stream([1, 5, 1])
    co.run(iter(items))
    assert s.delivered == [e.idempotency_key for e in items]
    assert max(len(list(b.events)) for b in s.batches) <= 2  # the 5-row transaction was split
    # parts of tx 2 moved nothing; its remainder shares a sub-batch with tx 3
    assert [h.position for h in store.checkpoints.history("p", "s")] == [pos(1), pos(3)]


# --------------------------------------------------------------------------- sink-side records


def test_record_of_an_older_version_does_not_undo_a_rewind(store):
    """A rewind is a new version: the sink's record of the pre-rewind version is ignored and
    everything after the restored position is delivered again."""
    epoch = store.leases.acquire("p", "r0")
    for n in (2, 4, 6):
        store.checkpoints.write("p", "k", pos(n), run_id="r0", epoch=epoch)  # versions 1, 2, 3
    store.checkpoints.rewind("p", "k", 1, reason="consumer lost data", who="op")  # v4 = pos(2)
    k = FakeSink("k", committed=SinkCheckpoint(pos(6), 2))  # the sink's record extends v2
    items = stream([1] * 6)
    _coordinator(store, [k], max_events=2).run(iter(items))
    assert k.delivered == [e.idempotency_key for e in items][2:]  # txs 3..6 again
    assert k.extends == [4, 5]


def test_record_extending_the_current_version_is_adopted_once(store):
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write("p", "k", pos(2), run_id="r0", epoch=epoch)  # v1
    k = FakeSink("k", committed=SinkCheckpoint(pos(4), 1))  # committed 3..4, store write lost
    items = stream([1] * 6)
    _coordinator(store, [k], max_events=2).run(iter(items))
    assert k.delivered == [e.idempotency_key for e in items][4:]
    assert [(h.version, h.position, h.kind) for h in store.checkpoints.history("p", "k")] == [
        (1, pos(2), "write"), (2, pos(4), "adopt"), (3, pos(6), "write")]


def test_record_from_another_server_is_never_adopted(store):
    """After a failover translation (a new version on server 2), a record the sink wrote on
    server 1 cannot move it, even if its version number were to match."""
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write("p", "k", pos(1, server_id=2), run_id="r0", epoch=epoch)  # v1
    k = FakeSink("k", committed=SinkCheckpoint(pos(9, server_id=1), 1))
    co = _coordinator(store, [k])
    co.open()
    assert co.effective_positions() == {"k": pos(1, server_id=2)}


def test_a_sink_that_lost_its_record_is_named_and_gets_what_follows_the_store(store, caplog):
    """The store says sink k received up to pos(2), but k holds no record of its own (its server
    restarted empty): a warning names it and the rewind, and k gets only what follows pos(2)."""
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write("p", "k", pos(2), run_id="r0", epoch=epoch)
    k = FakeSink("k")  # keeps records (it answers committed_checkpoint), has none now
    items = stream([1] * 4)
    _coordinator(store, [k]).run(iter(items))
    assert k.delivered == [e.idempotency_key for e in items][2:]
    assert "sink k keeps no checkpoint record of its own, yet the store says it received" in caplog.text
    assert "tidegate checkpoints rewind p k --to-version N" in caplog.text


def test_an_older_record_of_a_sink_called_only_for_events_names_nothing_lost(store, caplog):
    """A sink the coordinator does not call for a sub-batch of positions only (every kind but
    Redis) has a record that lags the store's versions legitimately: it is not told as a loss."""
    epoch = store.leases.acquire("p", "r0")
    for at in (2, 4, 6):
        store.checkpoints.write("p", "k", pos(at), run_id="r0", epoch=epoch)
    k = FakeSink("k", committed=SinkCheckpoint(pos(4), 1))
    items = stream([1] * 8)
    report = _coordinator(store, [k]).run(iter(items))
    assert k.delivered == [e.idempotency_key for e in items][6:]
    assert report.sinks["k"].lost is None and "lost" not in caplog.text


class RecordTracksData(FakeSink):
    """As Redis: the record goes only with the data beside it, set by every delivery."""

    record_tracks_data = True

    def deliver(self, batch, extends=None):
        end = super().deliver(batch, extends)
        self.committed = SinkCheckpoint(end, extends)
        return end


def test_a_sink_whose_record_goes_with_its_data_is_called_for_positions_only_and_stays_exact(store):
    """Such a sink is called for a sub-batch of positions only, so its record follows every
    version of its store checkpoint: the next run finds it exact, with nothing lost. (Another
    sink, not called for it, has a record one delivery behind.)"""
    k, other = RecordTracksData("k"), FakeSink("o")
    _coordinator(store, [k, other], max_events=2).run(iter(stream([1, 1, 0, 0])))
    assert [b.event_count for b in k.batches] == [2, 0] and [b.event_count for b in other.batches] == [2]
    current = store.checkpoints.get("p", "k")
    assert (current.version, current.position) == (2, pos(4)) and k.committed == SinkCheckpoint(pos(4), 1)
    items = stream([1, 1, 0, 0, 1])
    report = _coordinator(store, [k], run_id="r2").run(iter(items))
    assert report.sinks["k"].lost is None and k.delivered[-1] == items[-1].idempotency_key


def test_such_a_sink_is_not_called_for_a_tail_past_a_replays_range_or_behind_where_it_is(store):
    """A replay of (pos(2), pos(4)] over a stream that goes on to pos(8): the sink whose record
    follows its versions is called for its range only, never for the positioned tail of a
    sub-batch past the range (its record would jump over changes it never got: found by
    test_commit_policy_live.py, Redis skipping 3,950 changes after a cleared run); and a sink
    whose adopted record is ahead is not called for the tail behind it (its record would move
    back)."""
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write("p", "k", pos(6), run_id="r0", epoch=epoch)  # v1
    k = RecordTracksData("k", committed=SinkCheckpoint(pos(6), 0))
    co = Coordinator(store, "p", "r1", store.leases.acquire("p", "r1"), [k], BatchSpec(max_events=2),
                     sleep=lambda s: None, starts={"k": pos(2)}, ends={"k": pos(4)})
    co.run(iter(stream([1, 1, 1, 1, 0, 1, 0, 1])))
    assert [b.end_position for b in k.batches] == [pos(4)] and k.committed == SinkCheckpoint(pos(4), 1)
    ahead = RecordTracksData("k", committed=SinkCheckpoint(pos(8), 1))  # committed, store write lost
    _coordinator(store, [ahead], run_id="r2").run(iter(stream([1, 1, 1, 1, 0, 0, 0, 0, 1])))
    assert [b.end_position for b in ahead.batches] == [pos(9)]


def test_a_missing_record_names_the_version_before_the_sinks_first_delivery(store):
    """A record gone: what the sink holds is unknown, so the rewind named is the one that delivers
    all it was sent (the version before its first delivery: here its placement at the head)."""
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write_many("p", {"k": pos(1)}, run_id="r0", epoch=epoch, kind="head")  # v1
    for at in (2, 4):
        store.checkpoints.write("p", "k", pos(at), run_id="r0", epoch=epoch)  # v2, v3
    co = _coordinator(store, [RecordTracksData("k")])
    with pytest.raises(CommitPolicyError):
        co.run(iter(stream([1] * 6)))
    assert "assumes it lost all it was sent" in co.report.sinks["k"].lost
    assert "again, tidegate checkpoints rewind p k --to-version 1 --reason" in co.report.sinks["k"].lost


@pytest.mark.parametrize("record", [None, SinkCheckpoint(pos(4), 1)], ids=["missing", "older"])
def test_a_sink_whose_record_goes_with_its_data_fails_when_it_lost_changes(store, record):
    """Such a sink that lost changes (its record missing, or older than the store's delivered
    version) gets nothing and fails, naming both rewinds: the one that delivers the missing
    changes again (version 2, which the older record extends the delivery of; N when the record
    is gone), and the current version's (go on without them); its checkpoint stays."""
    epoch = store.leases.acquire("p", "r0")
    for at in (2, 4, 6):
        store.checkpoints.write("p", "k", pos(at), run_id="r0", epoch=epoch)
    k = RecordTracksData("k", committed=record)
    co = _coordinator(store, [k])
    with pytest.raises(CommitPolicyError) as ei:
        co.run(iter(stream([1] * 8)))
    assert ei.value.fatal  # a retry would fail the same way until an operator chooses
    assert k.delivered == [] and k.calls == 0
    assert [h.version for h in store.checkpoints.history("p", "k")] == [1, 2, 3]
    rep = co.report.sinks["k"]
    assert rep.status == "failed" and rep.error_class == "non_retryable"
    assert rep.error == (
        f"OperatorSinkError: pipeline 'p': sink k lost changes it had acknowledged, or holds no record "
        f"of them; nothing is delivered to it until an operator runs `tidegate checkpoints rewind p k "
        f"--to-version {'N' if record is None else 2} --reason ...` (delivers them again) or `tidegate "
        f"checkpoints rewind p k --to-version 3 --reason ...` (goes on without them); the log and the run "
        f"report's 'lost' say what it holds")
    target = "N" if record is None else "2"
    assert rep.lost.endswith(
        f"Nothing is delivered to it until an operator chooses: to deliver the missing changes again, "
        f"tidegate checkpoints rewind p k --to-version {target} --reason ...; to go on without them, "
        f"tidegate checkpoints rewind p k --to-version 3 --reason ...")


@pytest.mark.parametrize("record", [SinkCheckpoint(pos(6), 2), SinkCheckpoint(pos(8), 3)],
                         ids=["the-last-delivery", "ahead-adopted"])
def test_a_record_of_the_last_delivery_or_after_it_names_nothing_lost(store, caplog, record):
    epoch = store.leases.acquire("p", "r0")
    for at in (2, 4, 6):
        store.checkpoints.write("p", "k", pos(at), run_id="r0", epoch=epoch)
    report = _coordinator(store, [RecordTracksData("k", committed=record)]).run(iter(stream([1] * 10)))
    assert report.sinks["k"].lost is None and "lost" not in caplog.text


@pytest.mark.parametrize(("rewind_to", "record", "lost_target"), [
    (1, SinkCheckpoint(pos(6), 3), None),  # a rewind of a sink that holds more: nothing lost
    (1, SinkCheckpoint(pos(2), 1), None),  # at the restored position: nothing lost
    (3, SinkCheckpoint(pos(2), 1), 2),  # holds less than the rewind restored: it lost pos(2)..pos(6)
    (3, None, 1),  # a record gone: the version before the first delivery is named
    (0, None, False),  # gone, after a rewind to before the first delivery (seed 9704): nothing owed
], ids=["holds-more", "holds-it", "holds-less", "holds-no-record", "holds-nothing-owed-nothing"])
def test_after_a_rewind_the_sink_must_hold_what_it_restored(store, rewind_to, record, lost_target):
    """A rewind binds the sink, but a sink whose record goes with its data must still hold what
    the rewind restored: one that holds less lost changes the rewind does not deliver again (an
    operator who rewound before a run told the loss); the run fails naming the version to go
    back to. (Here the rewinds are to versions before the current one.)"""
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write_many("p", {"k": pos(1)}, run_id="r0", epoch=epoch, kind="head")  # v1
    for at in (2, 4, 6, 8):
        store.checkpoints.write("p", "k", pos(at), run_id="r0", epoch=epoch)  # v2..v5
    store.checkpoints.rewind("p", "k", rewind_to + 1, reason="again", who="test")  # v6
    co = _coordinator(store, [RecordTracksData("k", committed=record)])
    if lost_target is False or (record is not None and lost_target is None):
        co.run(iter(stream([1] * 10)))
        assert co.report.sinks["k"].lost is None
        return
    with pytest.raises(CommitPolicyError):
        co.run(iter(stream([1] * 10)))
    lost = co.report.sinks["k"].lost
    assert f"holds what a rewind to version {rewind_to + 1} restored, up to" in lost
    assert f"again, tidegate checkpoints rewind p k --to-version {lost_target} " in lost


def test_a_lost_range_that_holds_a_snapshots_rows_says_a_rewind_does_not_bring_them_back(store):
    """The versions between what the record holds and the store's checkpoint include a snapshot's
    positions: the run says so, and that a completed snapshot's rows need a resnapshot."""
    epoch = store.leases.acquire("p", "r0")
    store.checkpoints.write("p", "k", pos(2), run_id="r0", epoch=epoch)  # v1
    store.checkpoints.write("p", "k", SnapshotPosition("snap-1", 1, pos(3)), run_id="r0", epoch=epoch)  # v2
    store.checkpoints.write("p", "k", pos(4), run_id="r0", epoch=epoch)  # v3
    co = _coordinator(store, [RecordTracksData("k", committed=SinkCheckpoint(pos(2), 0))])
    with pytest.raises(CommitPolicyError):
        co.run(iter(stream([1] * 6)))
    lost = co.report.sinks["k"].lost
    assert "the lost range holds rows of snapshot snap-1: if it has completed, no rewind" in lost
    assert "again, tidegate checkpoints rewind p k --to-version 1 " in lost


def test_a_rewind_to_the_version_it_replaces_goes_on_without_what_the_sink_lost(store):
    """The choice the failing run names to go on without the lost changes: a rewind to the
    current version moves nothing, and the runs after it deliver what follows it."""
    epoch = store.leases.acquire("p", "r0")
    for at in (2, 4, 6):
        store.checkpoints.write("p", "k", pos(at), run_id="r0", epoch=epoch)  # v1..v3
    store.checkpoints.rewind("p", "k", 3, reason="go on", who="test")  # v4, at pos(6)
    k = RecordTracksData("k", committed=SinkCheckpoint(pos(2), 0))  # it lost pos(2)..pos(6)
    items = stream([1] * 8)
    report = _coordinator(store, [k]).run(iter(items))
    assert report.sinks["k"].lost is None and k.delivered == [e.idempotency_key for e in items][6:]


def test_a_failed_open_closes_every_sink_it_opened(store):
    """__exit__ does not run when __enter__ raises: the coordinator closes its sinks itself (a
    Delta sink's Spark Connect session left open hung the process's exit; campaign seed 1198
    SINKS=delta: the checkpoint store killed while the sinks opened)."""
    a, b = FakeSink("a"), FakeSink("b")
    co = _coordinator(store, [a, b])
    store.close()  # the store goes away while the sinks open
    with pytest.raises(Exception):  # noqa: B017, PT011 - whatever the store raises
        with co:
            pass
    assert a.opened and b.opened and a.closed and b.closed


def test_report_counts_events_per_target_of_the_tables_each_sink_got(store):
    """Each sink's report counts the events it took per target (as the sink names a table's
    target) with the source tables behind it; a sink that failed counts only what it took."""
    from _tidegate_fakes import tx_events

    class NamedSink(FakeSink):
        def target_of(self, table):
            return f"{self.sink_id}/{table.schema}.{table.table}"

    items = tx_events(1, 2) + tx_events(2, 1, table="customers") + tx_events(3, 2, table="orders")
    ok, flaky = NamedSink("s1"), NamedSink("s2", required=False, fail_from_call=2)
    with _coordinator(store, [ok, flaky], max_events=3) as co:
        report = co.run(iter(items))
    assert report.sinks["s1"].targets == {"s1/shop.orders": {"events": 4, "tables": ["shop.orders"]},
                                          "s1/shop.customers": {"events": 1, "tables": ["shop.customers"]}}
    assert report.sinks["s2"].targets == {"s2/shop.orders": {"events": 2, "tables": ["shop.orders"]},
                                          "s2/shop.customers": {"events": 1, "tables": ["shop.customers"]}}
    assert report.to_json()["sinks"][0]["targets"] == report.sinks["s1"].targets
    # A sink kind that names no target per table (the base class): nothing counted.
    plain = FakeSink("s3")
    with _coordinator(store, [plain], run_id="r2") as co:
        assert co.run(iter(tx_events(4, 1))).sinks["s3"].targets == {}
