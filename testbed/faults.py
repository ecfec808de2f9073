"""The faults the suites inject into the running test bed: a container killed, one of the
real node's daemons restarted, the API server restarted or frozen.

Each acts on the processes of this machine (the test bed runs them all here) and returns
once the fault is done; what must hold through it (the load served, the status told) is
the caller's to measure (``testbed.scenarios``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import testbed.cluster
from testbed.kube import wait_for
from testkit import host

NODE_DAEMONS = ("kubelet", "containerd")


def container_pid(pod: dict[str, Any]) -> int:
    """The host PID of a pod's container process (its init, as containerd runs it)."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    out = testbed.cluster.node().ctr("tasks", "ls") or ""
    for line in out.splitlines()[1:]:
        task, pid, *_ = line.split()
        if task == cid:
            return int(pid)
    raise AssertionError(f"no running task for container {cid}")


def kill_container(pod: dict[str, Any]) -> None:
    """SIGKILL a pod's (first) container, as the kernel's OOM killer would."""
    os.kill(container_pid(pod), signal.SIGKILL)


def restart_node_daemon(name: str) -> None:
    """Stop the real node's kubelet or containerd (SIGTERM, as systemd would) and start it
    again with the same command line; the pods keep running (their containers belong to
    the shims)."""
    if name not in NODE_DAEMONS:
        raise ValueError(f"cannot restart {name!r}: one of {', '.join(NODE_DAEMONS)}")
    node = testbed.cluster.node()
    node.stop(name)
    node.start(name)


def _api_server() -> tuple[Path, Path]:
    """The cluster's directory and the API server's PID file in it (kwokctl's)."""
    cluster = testbed.cluster.cluster_dir()
    return cluster, cluster / "pids" / "kube-apiserver.pid"


def restart_api_server() -> float:
    """Stop the API server and start it again with the same command line, under kwokctl's
    PID file (so that `testbed down` stops the new process too); returns how long it was
    away."""
    cluster, pidfile = _api_server()
    pid = int(pidfile.read_text())
    cmdline = host.argv(pid)
    assert cmdline and Path(cmdline[0]).name == "kube-apiserver", f"{pidfile}: {cmdline}"
    start = time.monotonic()
    os.kill(pid, signal.SIGTERM)
    while Path(f"/proc/{pid}").exists():
        time.sleep(0.1)
    with (cluster / "logs" / "kube-apiserver.log").open("ab") as log:
        proc = subprocess.Popen(cmdline, cwd=cluster, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
    pidfile.write_text(str(proc.pid))
    wait_for(testbed.cluster.is_up, timeout=120, interval=0.5, what="the API server back")
    return time.monotonic() - start


@contextmanager
def api_server_frozen() -> Iterator[None]:
    """The API server stopped (SIGSTOP) for the block, then let go on (SIGCONT): unlike a
    restart, its connections stay open and hang."""
    pid = int(_api_server()[1].read_text())
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
