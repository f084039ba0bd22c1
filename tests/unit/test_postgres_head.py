"""PgServer.head(): the flushed WAL end, never a page boundary that may cut a commit record
(the server's answers are scripted here; tests/integration/test_postgres_reader.py reads
real WAL at such a bound)."""

from __future__ import annotations

from tidegate.connections import Connection
from tidegate.sources.postgres.connection import PgServer
from tidegate.sources.postgres.position import Lsn

BLOCK = 8192


class ScriptedServer(PgServer):
    """Answers the flush position from a script (the last answer repeats), and a short WAL
    writer delay (10 ms), so a page boundary settles after 2 * 10 ms + 50 ms."""

    def __init__(self, flushes: list[int]):
        super().__init__(Connection(conn_id="x", conn_type="postgres"))
        self.flushes = flushes
        self.asked = 0
        self._ident = ("1", 1)

    def query(self, sql, args=None):
        if "pg_settings" in sql:
            return [("wal_block_size", BLOCK), ("wal_writer_delay", 10)]
        assert "pg_current_wal_flush_lsn" in sql
        value = self.flushes[min(self.asked, len(self.flushes) - 1)]
        self.asked += 1
        return [(str(Lsn(value)),)]


def test_a_record_end_is_the_head_at_once():
    s = ScriptedServer([5 * BLOCK + 40])
    assert s.head().lsn.value == 5 * BLOCK + 40 and s.asked == 1


def test_a_page_boundary_that_moves_on_to_a_record_end_gives_the_record_end():
    s = ScriptedServer([5 * BLOCK, 5 * BLOCK, 5 * BLOCK + 24])
    assert s.head().lsn.value == 5 * BLOCK + 24


def test_a_page_boundary_that_holds_is_the_head():
    s = ScriptedServer([5 * BLOCK])
    # watched (asked again) before it was taken; how often depends on the machine's load: the
    # settling is timed (a test of 2026-12-03 under load saw fewer than the 4 it asked for)
    assert s.head().lsn.value == 5 * BLOCK and s.asked >= 2


def test_a_page_boundary_that_moves_page_by_page_is_watched_until_it_holds():
    s = ScriptedServer([5 * BLOCK] * 2 + [6 * BLOCK] * 3 + [7 * BLOCK])
    assert s.head().lsn.value == 7 * BLOCK and s.asked >= 6  # the script reaches 7 * BLOCK at the 6th
