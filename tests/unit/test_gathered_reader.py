"""The delivery task's side of a gathered run (tidegate/spark/gathered.py), without Spark: the
parts' rows, as the sort hands them over, become the plan's segment reads in plan order (a
chunk's upper bound taken off its first message, a slice's note off its last), on generated plans;
a run that planned again reads its own plan and lets the gathered rows go."""

from __future__ import annotations

import random

import pytest
from tidegate.events import PositionMark
from tidegate.positions import SnapshotPosition
from tidegate.reading import SegmentRead
from tidegate.segments import Chunk, Slice, SnapshotEnd
from tidegate.sources.mysql.position import BinlogPosition
from tidegate.spark.gathered import NOTE, GatheredReader, _packed, _part_batches, gathered_parts, parts_of
from tidegate.spec import PipelineSpec, SourceSpec


def pos(n: int) -> BinlogPosition:
    return BinlogPosition("bin.000001", n)


def generated(seed: int) -> tuple[list, list[list[PositionMark]], list[list[tuple]]]:
    """A plan (chunks, their end, slices), each part's items and the messages its task yields."""
    rnd = random.Random(seed)
    chunks = [Chunk(SnapshotPosition("s1", c, pos(4))) for c in range(1, rnd.randint(0, 4) + 1)]
    cuts = sorted(rnd.sample(range(10, 10_000), rnd.randint(1, 6)))
    slices = [Slice(pos(a), pos(b)) for a, b in zip([4, *cuts], cuts, strict=False)]
    plan = [*chunks, *([SnapshotEnd("s1")] if chunks else []), *slices]
    items, messages = [], []
    for n, part in enumerate(parts_of(plan)):
        marks = [PositionMark(pos(n * 100_000 + i)) for i in range(rnd.choice([0, 1, 5, 2001, 4500]))]
        packed = list(_packed(marks, [0]))
        chunk = isinstance(part, Chunk)
        items.append(marks)
        messages.append([("upper", pos(n)), *packed] if chunk else [*packed, (NOTE, f"slice {n}")])
    return plan, items, messages


class Fallback:
    def __init__(self):
        self.asked = None

    def __call__(self, run, source, segments):
        self.asked = list(segments)
        yield SegmentRead(segments[0], ["own"])


class Run:
    pipeline = "p"


def batches(messages: list[list[tuple]]):
    for index, part in enumerate(messages):
        yield from _part_batches(index, part)


@pytest.mark.parametrize("seed", range(12))
def test_gathered_rows_become_the_plan_reads_in_plan_order(seed):
    plan, items, messages = generated(seed)
    reader = GatheredReader(batches(messages), plan, parts_of(plan), Fallback())
    reads, got = [], []
    for read in reader(Run(), None, plan):  # its items taken before the next, as SnapshotItems.stream does
        reads.append(read)
        got.append([m.position for m in read.items])
    chunks = [s for s in plan if isinstance(s, Chunk)]
    slices = [s for s in plan if isinstance(s, Slice)]
    assert [r.segment for r in reads] == [*chunks, *([SnapshotEnd("s1")] if chunks else []),
                                          Slice(slices[0].start, slices[-1].end)]
    for n in range(len(chunks)):
        assert reads[n].upper == pos(n)
        assert got[n] == [m.position for m in items[n]]
    assert got[-1] == [m.position for part in items[len(chunks):] for m in part]


def test_a_run_that_planned_again_reads_its_own_plan_and_drains_the_gathered_rows():
    plan, _, messages = generated(3)
    consumed = []

    def counted():
        for b in batches(messages):
            consumed.append(b)
            yield b

    fallback = Fallback()
    reader = GatheredReader(counted(), plan, parts_of(plan), fallback)
    other = [Slice(pos(1), pos(50))]
    assert [r.items for r in reader(Run(), None, other)] == [["own"]]
    assert fallback.asked == other
    assert len(consumed) == sum(len(m) for m in messages)


class LeasedSource:
    lease_epoch = 7


@pytest.mark.parametrize("seed", range(6))
def test_a_log_held_under_the_lease_is_no_part_and_is_read_in_the_delivery_task(seed):
    """A PostgreSQL slot's log (SourceKind.log_read_under_lease) is read by the delivery task,
    which holds the run's lease, after the gathered chunks: never by a task of its own."""
    plan, items, messages = generated(seed)
    chunks = [s for s in plan if isinstance(s, Chunk)]
    slices = [s for s in plan if isinstance(s, Slice)]
    assert parts_of(plan, slices=False) == chunks
    fallback = Fallback()
    reader = GatheredReader(batches(messages[:len(chunks)]), plan, chunks, fallback)
    reads = []
    for read in reader(Run(), LeasedSource(), plan):
        reads.append((read.segment, [getattr(m, "position", m) for m in read.items]))
    assert [seg for seg, _ in reads] == [*chunks, *([SnapshotEnd("s1")] if chunks else []), slices[0]]
    for n in range(len(chunks)):
        assert reads[n][1] == [m.position for m in items[n]]
    assert fallback.asked == slices and reads[-1][1] == ["own"]


def test_which_kinds_log_slices_are_parts():
    plan, _, _ = generated(5)
    chunks = [s for s in plan if isinstance(s, Chunk)]

    def spec(kind):
        return PipelineSpec(pipeline="p", source=SourceSpec(kind, "c"), sinks=())

    assert gathered_parts(spec("mysql"), plan) == parts_of(plan) != chunks
    assert gathered_parts(spec("postgres"), plan) == chunks
