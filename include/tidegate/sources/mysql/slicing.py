"""Cutting one binlog file into slices at transaction boundaries, cheaply.

A run's range is read as slices in parallel Spark tasks (``MySqlSource.slices``): one per
binlog file, and a file range larger than the slice size cut further. A cut must be a
transaction boundary (the start of an event group: a GTID event, or a ``BEGIN`` query where
the server writes no GTID events), because a slice is read like a run's range: from a
boundary, to the first event at or after its end.

Finding one without reading the file through the replication protocol:
``SHOW BINLOG EVENTS IN 'f' FROM p LIMIT k, n`` makes the server walk k events from p and send
only the n after them, one short row per event (position, type, end, info). So:

1. jump: from the last cut ``p``, ask for the single event k events on, with k estimated from
   the average event size seen so far, until an event at or past ``p + slice_bytes`` is
   reached (usually one or two jumps; each costs the server a scan of the bytes it skips);
2. walk: from there, read event rows a page at a time up to the first boundary.

Each slice's GTID state at its start is the server's ``BINLOG_GTID_POS`` (MariaDB), which the
read asks for as it does for a slice at a file's start.
"""

from __future__ import annotations

from collections.abc import Callable

# SHOW BINLOG EVENTS columns: Log_name, Pos, Event_type, Server_id, End_log_pos, Info
_POS, _TYPE, _END, _INFO = 1, 2, 4, 5
_SAMPLE = 64  # events read to estimate the average event size
_PAGE = 1000  # event rows per page while walking to a boundary
_GTID_TYPES = ("Gtid", "Anonymous_Gtid")

Query = Callable[..., list[tuple]]


def cut_points(query: Query, file: str, frm: int, to: int, slice_bytes: int) -> list[int]:
    """Transaction boundaries of ``file`` strictly between ``frm`` and ``to`` (both event
    starts), about ``slice_bytes`` apart (at least that far), in order."""
    cuts: list[int] = []
    p = frm
    avg: float | None = None
    while to - p > slice_bytes:
        q, avg = _jump(query, file, p, p + slice_bytes, avg)
        if q is None or q >= to:
            break
        b = _next_boundary(query, file, q, to)
        if b is None:
            break
        cuts.append(b)
        p = b
    return cuts


def _events(query: Query, file: str, pos: int, skip: int, count: int) -> list[tuple]:
    return query(f"SHOW BINLOG EVENTS IN %s FROM {int(pos)} LIMIT {int(skip)}, {int(count)}", (file,))


def _jump(query: Query, file: str, p: int, target: int, avg: float | None) -> tuple[int | None, float | None]:
    """The start of an event at or after ``target``, reached from the event start ``p`` by
    skipping events; (None, avg) when the file ends before it."""
    if avg is None:
        rows = _events(query, file, p, 0, _SAMPLE)
        if not rows:
            return None, None
        for r in rows:
            if int(r[_POS]) >= target:
                return int(r[_POS]), None
        avg = max(1.0, (int(rows[-1][_END]) - p) / len(rows))
        p = int(rows[-1][_END])  # the next event's start
        if p >= target:
            return p, avg
    while p < target:
        k = max(1, int((target - p) / avg))
        rows = _events(query, file, p, k, 1)
        if not rows:
            return None, avg
        q = int(rows[0][_POS])
        avg = max(1.0, (q - p) / k)
        p = q
    return p, avg


def _next_boundary(query: Query, file: str, q: int, to: int) -> int | None:
    """The first transaction boundary at or after the event start ``q`` and before ``to``."""
    previous: str | None = None  # the event before the one looked at (None: not seen)
    while q < to:
        rows = _events(query, file, q, 0, _PAGE)
        if not rows:
            return None
        for r in rows:
            pos, etype = int(r[_POS]), str(r[_TYPE])
            if pos >= to:
                return None
            if etype in _GTID_TYPES:
                return pos
            # a BEGIN query starts a group unless a GTID event just before it already did
            # (unknown for the first event looked at: it is passed over)
            if etype == "Query" and str(r[_INFO]).strip().upper() == "BEGIN" and \
                    previous is not None and previous not in _GTID_TYPES:
                return pos
            previous = etype
        q = int(rows[-1][_END])
    return None
