"""This machine: a free local port, and its processes as /proc shows them (command
lines, CPU time, memory, whether alive).

Only the standard library is used: the test bed imports this before the virtual environment
exists.
"""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path

EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
FIRST, NODE_PORTS = 20000, 30000  # free_port's range: from FIRST to below NODE_PORTS
_handed_out: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The ports the kernel gives to outgoing connections and to bind(port 0)."""
    try:
        low, high = (int(v) for v in EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default
    return low, high


def free_port() -> int:
    """A TCP port that nothing listens on now and that this process has not handed out
    before: from 20000 up to Kubernetes' NodePort range (30000-32767, which the test bed's
    kube-proxy forwards on 127.0.0.1), or to the ephemeral range if that starts lower.
    Below 20000 lie the cluster's own ports (the kubelet's 10250, the scheduler's 10259,
    ...), which its components bind when they start.

    Not a port that bind(0) gives: that one is in the ephemeral range, which every outgoing
    connection on this machine (the API server's clients, kubectl, the in-process reads)
    also draws its local port from; one of them can take it before the server that was
    told to listen on it binds it (seen: an operator's "address already in use" after a
    quiet minute of a busy test bed)."""
    high = min(ephemeral_range()[0], NODE_PORTS)
    for _ in range(200):
        port = random.randrange(FIRST, high) if high > FIRST else 0
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        _handed_out.add(port)
        return port
    raise RuntimeError(
        f"no free TCP port found in {FIRST}-{high - 1}: is this machine out of ports?"
    )


def split_cmdline(raw: bytes) -> list[str]:
    """A `/proc/<pid>/cmdline` (NUL-separated arguments) as argv; undecodable: []."""
    try:
        return [a.decode() for a in raw.split(b"\0") if a]
    except UnicodeDecodeError:
        return []


def argv(pid: int) -> list[str]:
    """The command line of a process on this machine; [] when it is gone or unreadable."""
    try:
        return split_cmdline(Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return []


def pids() -> Iterator[int]:
    """Every process on this machine but this one."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            yield int(entry.name)


def stat_fields(pid: int) -> list[str]:
    """`/proc/<pid>/stat` after the command's name: [0] is the state (the file's third
    field), [7] the minor page faults, [9] the major ones, [11] and [12] the user and system
    CPU ticks; [] once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def cpu_seconds(pid: int) -> float:
    """The CPU time (user and system) a process has used; 0 once it is gone."""
    fields = stat_fields(pid)
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def page_faults(pid: int) -> int:
    """The page faults (minor and major) a process has taken, all its threads; 0 once it is
    gone."""
    fields = stat_fields(pid)
    return int(fields[7]) + int(fields[9]) if fields else 0


def status_kib(pid: int, key: str) -> int:
    """A memory figure of `/proc/<pid>/status` in KiB (VmRSS: resident now; VmHWM: its peak,
    which writing 5 to `/proc/<pid>/clear_refs` resets to VmRSS); 0 if absent."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


def alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie (one of another user's counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.split(")")[-1].split()[0] != "Z"
    except OSError:
        return False
