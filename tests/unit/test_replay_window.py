"""``source.replay_retention``: the spec field, and how far release may move the log with it
(against a real SQLite checkpoint store; the server side is in
tests/integration/test_replay_window_postgres.py)."""

from __future__ import annotations

import datetime as dt
import textwrap

import pytest
from tidegate.errors import SpecError
from tidegate.run import RunContext
from tidegate.runner import replay_hold
from tidegate.sources.postgres.position import Lsn, PgPosition
from tidegate.spec import load_spec
from tidegate.store import open_store


def spec_with(tmp_path, retention, kind: str = "postgres"):
    value = "" if retention is None else f", replay_retention: {retention}"
    path = tmp_path / "p.yaml"
    path.write_text(textwrap.dedent(f"""
        pipeline: p
        source: {{kind: {kind}, conn_id: src{value}}}
        sinks:
          - {{id: a, kind: redis, conn_id: r, stream: s}}
          - {{id: b, kind: redis, conn_id: r, stream: s2}}
    """))
    return load_spec(path)


@pytest.mark.parametrize("value,seconds", [(None, 0), ("0", 0), (0, 0), ("90m", 5400), ("24h", 86400),
                                           ("3600s", 3600), ("7d", 604800)])
def test_replay_retention_is_a_duration(tmp_path, value, seconds):
    assert spec_with(tmp_path, value).source.replay_retention_s == seconds


@pytest.mark.parametrize("value,words", [("soon", "bad value 'soon'"), (24, "a number needs a unit"),
                                         ("-1h", "bad value '-1h'"), ("1.5h", "bad value '1.5h'")])
def test_a_bad_replay_retention_names_the_file_the_field_and_the_fix(tmp_path, value, words):
    with pytest.raises(SpecError) as e:
        spec_with(tmp_path, value)
    (line,) = e.value.problems
    assert line.startswith(f"{tmp_path / 'p.yaml'}: source.replay_retention: ") and words in line
    assert "allowed: a duration such as 24h, 90m" in line


def test_replay_retention_on_mysql_points_at_the_binlog_expiry(tmp_path):
    with pytest.raises(SpecError, match="only for postgres sources.*binlog_expire_logs_seconds"):
        spec_with(tmp_path, "24h", kind="mysql")


def lsn(n: int, system_id: str = "7") -> PgPosition:
    return PgPosition(Lsn(n), system_id, 1)


def test_release_holds_the_lowest_checkpoint_of_the_window(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 's.sqlite'}")
    epoch = store.leases.acquire("p", "r")
    store.checkpoints.write_many("p", {"a": lsn(100, "old")}, run_id="r", epoch=epoch)  # before a failover
    for n in (1000, 2000, 3000):
        store.checkpoints.write_many("p", {"a": lsn(n), "b": lsn(n + 500)}, run_id="r", epoch=epoch)
    now = dt.datetime.now(dt.UTC)
    unwindowed = RunContext(spec_with(tmp_path, None), store=store)
    assert replay_hold(unwindowed, lsn(3000), now) == lsn(3000)  # no window
    windowed = RunContext(spec_with(tmp_path, "1h"), store=store)
    # Every version is younger than an hour: the oldest of this server's log is held.
    assert replay_hold(windowed, lsn(3000), now) == lsn(1000)
    # Two hours on, the window holds only the versions current then: the checkpoints themselves.
    assert replay_hold(windowed, lsn(3000), now + dt.timedelta(hours=2)) == lsn(3000)
    store.close()
