"""testkit.host.free_port: a port a server can still bind when told to, on a busy machine."""

from __future__ import annotations

import itertools
import random
import socket
from pathlib import Path

import pytest

from testkit import host


def test_free_ports_lie_below_the_ephemeral_range_and_are_bindable() -> None:
    low, high = host.ephemeral_range()
    assert 1024 <= low <= high
    ports = [host.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports), "a port handed out twice"
    for port in ports:
        assert 20000 <= port < min(low, 30000)  # below NodePorts and the ephemeral range
        with socket.socket() as s:
            s.bind(("0.0.0.0", port))  # still free: nothing took it


def test_a_port_in_use_is_never_handed_out(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        # Then ports from 23456 up: another test's server may hold one of them.
        picks = itertools.chain([busy, busy], itertools.count(23456))
        monkeypatch.setattr(random, "randrange", lambda a, b: next(picks))
        monkeypatch.setattr(host, "_handed_out", set())
        port = host.free_port()
        assert port != busy and 23456 <= port < 30000
        assert next(picks) == port + 1  # the busy port was tried twice, then the first free


def test_the_ephemeral_range_unreadable_is_linux_default(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(host, "EPHEMERAL", tmp_path / "missing")
    assert host.ephemeral_range() == (32768, 60999)
    (tmp_path / "garbled").write_text("not numbers\n")
    monkeypatch.setattr(host, "EPHEMERAL", tmp_path / "garbled")
    assert host.ephemeral_range() == (32768, 60999)


def test_no_free_port_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(host, "_handed_out", set(range(20000, 30000)))
    monkeypatch.setattr(host, "ephemeral_range", lambda: (32768, 60999))
    with pytest.raises(RuntimeError, match="no free TCP port found in 20000-29999"):
        host.free_port()
