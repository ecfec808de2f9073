"""This machine: a free local port, and its processes as /proc shows them (command
lines, CPU time, memory, whether alive).

Only the standard library is used: the test bed imports this before the virtual environment
exists.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
