"""Run a command on this machine made slower: each CPU `factor` times slower, as on a
slower machine of the same number of cores. How long a cold `make test` takes on the slower
machine class (where Kubernetes' build took about 900 s, 2.2-2.3 times this machine's) can
then be measured here rather than projected.

On each CPU a busy loop, pinned to it, runs in its own cgroup (v1 `cpu` controller) whose
CFS bandwidth lets it have `1 - 1/factor` of every 10 ms and whose weight gives it that
share before anything else. What is left to every other process on that CPU, the command's
and the test bed's (its daemons, its pods' cgroups) alike, is `1/factor` of the CPU: a
single-threaded task runs `factor` times slower, and the machine as a whole does `1/factor`
of its work per second. Before the command, the same loop of Python is timed with and
without the slowdown, and the ratio is printed, so that the factor is checked, not assumed.
Memory, disk and network stay this machine's. The loops' own CPU time counts as busy in
/proc/stat (`make test`'s closing report included).

    python -m toolchain.slower FACTOR -- COMMAND...

Root only (it writes cgroups). Only the standard library is used.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

CPU_CGROUPS = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 10_000  # short, so that the slowdown is smooth at a test's time scale
WEIGHT = 262_144  # cgroup v1's highest cpu.shares: the loop gets its share first
PROBE_LOOPS = 10_000_000


def hog_quota_us(factor: float, period_us: int = PERIOD_US) -> int:
    """The CPU time per period one CPU's busy loop takes, so that what it leaves is
    `1/factor` of the CPU."""
    if factor < 1:
        raise ValueError(f"a slowdown factor is at least 1, not {factor}")
    return round(period_us * (1 - 1 / factor))


def probe() -> float:
    """Seconds a fixed loop of Python takes: one thread's speed."""
    start = time.perf_counter()
    n = 0
    for i in range(PROBE_LOOPS):
        n += i & 7
    return time.perf_counter() - start


def _hog(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        pass


def start_hogs(factor: float, cpus: list[int]) -> list[tuple[subprocess.Popen[bytes], Path]]:
    """One pinned busy loop per CPU, each in its own bandwidth-limited cgroup."""
    quota = hog_quota_us(factor)
    hogs = []
    for cpu in cpus:
        group = CPU_CGROUPS / f"toolchain-slower-{cpu}"
        group.mkdir(exist_ok=True)
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
        (group / "cpu.shares").write_text(str(WEIGHT))
        proc = subprocess.Popen(
            [sys.executable, "-c", f"from toolchain.slower import _hog; _hog({cpu})"],
            cwd=Path(__file__).resolve().parent.parent,
        )
        (group / "tasks").write_text(str(proc.pid))
        hogs.append((proc, group))
    return hogs


def stop_hogs(hogs: list[tuple[subprocess.Popen[bytes], Path]]) -> None:
    for proc, _ in hogs:
        proc.kill()
        proc.wait()
    for _, group in hogs:
        group.rmdir()


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        sys.exit("usage: python -m toolchain.slower FACTOR -- COMMAND...")
    try:
        factor = float(argv[0])
        hog_quota_us(factor)
    except ValueError as e:
        sys.exit(f"toolchain.slower: {e}")
    if not (CPU_CGROUPS / "cpu.cfs_quota_us").exists():
        sys.exit(f"toolchain.slower: no cgroup v1 cpu controller at {CPU_CGROUPS} (run as root)")
    cpus = sorted(os.sched_getaffinity(0))
    alone = min(probe() for _ in range(3))
    hogs = start_hogs(factor, cpus)
    try:
        time.sleep(0.5)
        slowed = min(probe() for _ in range(3))
        print(f"[slower] {len(cpus)} CPUs, each {factor:g} times slower: a loop of Python took "
              f"{slowed:.2f} s against {alone:.2f} s ({slowed / alone:.2f} times)",
              flush=True)  # fmt: skip
        proc = subprocess.Popen(argv[2:])
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()
    finally:
        stop_hogs(hogs)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
