"""Run a command on this machine made slower: each CPU `factor` times slower, as on a
slower machine of the same number of cores. How long a cold `make test` takes on the slower
machine class (where Kubernetes' build took about 900 s, 2.2-2.3 times this machine's) can
then be measured here rather than projected.

On each CPU a busy loop, pinned to it, runs at a real-time priority (SCHED_FIFO) in a cgroup
(v1 `cpu` controller) whose real-time bandwidth lets it have `1 - 1/factor` of every 10 ms
on each CPU: it takes that share first, and exactly that. (CFS bandwidth and weight, tried
first, gave the loops less than their share: a loop of Python ran 1.3-1.7 times slower, not
2.29.) What is left to every other process on that CPU, the command's and the test bed's
(its daemons, its pods' cgroups) alike, is `1/factor` of the CPU: a
single-threaded task runs `factor` times slower, and the machine as a whole does `1/factor`
of its work per second. Before the command, summing a range is timed with and without the
slowdown, in one process and in one per CPU at once, and the ratios are printed, so that the
factor is checked, not assumed: at 2.29 they measured 2.36 with one process per CPU, and 2.12
with one alone, which the scheduler moves to whichever CPU's loop is idle for the moment.
Memory, disk and network stay this machine's. The loops' own CPU time counts as busy in
/proc/stat (`make test`'s closing report included).

    python -m toolchain.slower FACTOR -- COMMAND...

Root only (it writes cgroups). Only the standard library is used.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 10_000  # short, so that the slowdown is smooth at a test's time scale
PR_SET_PDEATHSIG = 1  # prctl(2)
PREFIX = "toolchain-slower-"  # each run's cgroup: this and its PID
PROBE_SUM = 30_000_000


def hog_quota_us(factor: float, period_us: int = PERIOD_US) -> int:
    """The CPU time per period one CPU's busy loop takes, so that what it leaves is
    `1/factor` of the CPU."""
    if factor < 1:
        raise ValueError(f"a slowdown factor is at least 1, not {factor}")
    return round(period_us * (1 - 1 / factor))


def probe(threads: int) -> float:
    """Seconds that `threads` processes, each summing the same range, take together."""
    code = f"sum(range({PROBE_SUM}))"
    start = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", code]) for _ in range(threads)]
    for proc in procs:
        proc.wait()
    return time.perf_counter() - start


def speeds(threads: int) -> tuple[float, float]:
    """The best of three probes, with one thread and with `threads` at once."""
    return min(probe(1) for _ in range(3)), min(probe(threads) for _ in range(3))


def _hog(cpu: int, parent: int) -> None:
    """Pinned to `cpu`; once its parent has put it in the group (a line on stdin), real-time.
    It dies with its parent, however that ends (a real-time loop left behind would keep the
    machine slow)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the line above
        return
    os.sched_setaffinity(0, {cpu})
    sys.stdin.readline()
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    while True:
        pass


def running() -> list[Path]:
    """The cgroups of the slowdowns on now. One with no task left is a killed run's, and is
    removed."""
    on = []
    for group in sorted(CPU_CGROUPS.glob(f"{PREFIX}*")):
        if (group / "tasks").read_text().split():
            on.append(group)
        else:
            with contextlib.suppress(OSError):
                group.rmdir()
    return on


def start_hogs(factor: float, cpus: list[int], group: Path) -> list[subprocess.Popen[bytes]]:
    """One pinned busy loop per CPU, in `group`, a new cgroup whose real-time bandwidth (per
    CPU) is the loops' share."""
    group.mkdir()
    try:
        (group / "cpu.rt_period_us").write_text(str(PERIOD_US))
        (group / "cpu.rt_runtime_us").write_text(str(hog_quota_us(factor)))
    except OSError as e:
        group.rmdir()
        sys.exit(f"toolchain.slower: the CPUs' real-time bandwidth has no room for the loops "
                 f"({e}); is something else running at a real-time priority?")  # fmt: skip
    hogs = []
    for cpu in cpus:
        proc = subprocess.Popen(
            [sys.executable, "-c", f"from toolchain.slower import _hog; _hog({cpu}, {os.getpid()})"],
            cwd=Path(__file__).resolve().parent.parent, stdin=subprocess.PIPE,
        )  # fmt: skip
        hogs.append(proc)
        (group / "tasks").write_text(str(proc.pid))
        assert proc.stdin is not None
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
    return hogs


def stop_hogs(hogs: list[subprocess.Popen[bytes]], group: Path) -> None:
    for proc in hogs:
        proc.kill()
        proc.wait(timeout=30)
    group.rmdir()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m toolchain.slower FACTOR -- COMMAND...")
    try:
        factor = float(argv[0])
        hog_quota_us(factor)
    except ValueError as e:
        sys.exit(f"toolchain.slower: {e}")
    if not (CPU_CGROUPS / "cpu.rt_runtime_us").exists():
        sys.exit(f"toolchain.slower: no cgroup v1 cpu controller with real-time group "
                 f"scheduling at {CPU_CGROUPS} (run as root)")  # fmt: skip
    if others := running():
        sys.exit(f"toolchain.slower: another slowdown is on ({', '.join(g.name for g in others)}): "
                 "its loops hold the CPUs' real-time share; run this one once it has ended")  # fmt: skip
    cpus = sorted(os.sched_getaffinity(0))
    alone = speeds(len(cpus))
    group = CPU_CGROUPS / f"{PREFIX}{os.getpid()}"
    hogs = start_hogs(factor, cpus, group)
    try:
        time.sleep(0.5)
        slowed = speeds(len(cpus))
        print(f"[slower] {len(cpus)} CPUs, each {factor:g} times slower; measured, summing a "
              f"range took {slowed[0] / alone[0]:.2f} times as long in one process "
              f"({slowed[0]:.2f} s against {alone[0]:.2f} s) and {slowed[1] / alone[1]:.2f} "
              f"times in {len(cpus)} at once ({slowed[1]:.2f} s against {alone[1]:.2f} s)",
              flush=True)  # fmt: skip
        proc = subprocess.Popen(argv[2:])
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()
    finally:
        stop_hogs(hogs, group)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
