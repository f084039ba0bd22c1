"""The deadline for blocking database calls (tidegate.watchdog) and the settings that use it."""

from __future__ import annotations

import socket
import threading
import time

import pytest
from tidegate.errors import SourceError
from tidegate.sources.timeouts import READ_TIMEOUT_ENV, read_timeout_s
from tidegate.store import StoreError, open_store
from tidegate.watchdog import Watchdog


def test_a_call_blocked_on_a_silent_peer_ends_when_the_deadline_passes():
    """A peer that accepts and never answers (a stopped server's kernel does that): the
    blocked recv returns once the watchdog severs the socket."""
    client, silent_peer = socket.socketpair()
    try:
        start = time.monotonic()
        with Watchdog(client, 0.2) as dog:
            assert client.recv(1) == b""
        assert dog.fired and 0.15 < time.monotonic() - start < 5
    finally:
        client.close()
        silent_peer.close()


def test_a_call_that_ends_in_time_is_left_alone():
    client, peer = socket.socketpair()
    try:
        threading.Timer(0.05, peer.sendall, args=(b"x",)).start()
        with Watchdog(client, 2.0) as dog:
            assert client.recv(1) == b"x"
        time.sleep(0.05)
        assert not dog.fired
        peer.sendall(b"y")
        assert client.recv(1) == b"y"  # the socket still works
    finally:
        client.close()
        peer.close()


@pytest.mark.parametrize("value", ["abc", "0", "-3"])
def test_bad_timeouts_are_errors_naming_the_setting(monkeypatch, value):
    monkeypatch.setenv("TIDEGATE_STORE_TIMEOUT_S", value)
    with pytest.raises(StoreError, match=f"TIDEGATE_STORE_TIMEOUT_S={value!r} is not a positive number"):
        open_store("postgresql://nobody@127.0.0.1:1/none")  # refused before any connection
    monkeypatch.setenv(READ_TIMEOUT_ENV, value)
    with pytest.raises(SourceError, match=f"{READ_TIMEOUT_ENV}={value!r}"):
        read_timeout_s()


def test_the_source_read_timeout_defaults_to_300_s(monkeypatch):
    monkeypatch.delenv(READ_TIMEOUT_ENV, raising=False)
    assert read_timeout_s() == 300.0
    monkeypatch.setenv(READ_TIMEOUT_ENV, "2.5")
    assert read_timeout_s() == 2.5
