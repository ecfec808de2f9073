"""toolchain.slower: the busy loops' share of each CPU, and its refusals."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from toolchain import slower


def test_the_loop_takes_what_leaves_one_factor_th_of_each_cpu() -> None:
    assert slower.hog_quota_us(1) == 0
    assert slower.hog_quota_us(2) == 5_000
    assert slower.hog_quota_us(2.29, period_us=100_000) == 56_332
    assert slower.PERIOD_US - slower.hog_quota_us(4) == slower.PERIOD_US // 4


def test_a_factor_below_one_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"a slowdown factor is at least 1, not 0\.5"):
        slower.hog_quota_us(0.5)


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["2"], "usage: python -m toolchain.slower FACTOR -- COMMAND..."),
        (["2", "true"], "usage: python -m toolchain.slower FACTOR -- COMMAND..."),
        (["fast", "--", "true"], "toolchain.slower: could not convert string to float: 'fast'"),
        (["0.5", "--", "true"], "toolchain.slower: a slowdown factor is at least 1, not 0.5"),
    ],
)
def test_bad_arguments_stop_it_with_a_clear_error(argv: list[str], said: str) -> None:
    with pytest.raises(SystemExit) as e:
        slower.main(argv)
    assert str(e.value) == said


def _alive(pid: int) -> bool:
    """Running, not gone nor a zombie waiting for its new parent to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


ROOT_AND_CGROUPS = pytest.mark.skipif(
    not (slower.CPU_CGROUPS / "cpu.rt_runtime_us").exists() or os.geteuid() != 0,
    reason="needs root and cgroup v1's cpu controller with real-time group scheduling",
)


@ROOT_AND_CGROUPS
def test_the_command_runs_beside_the_loops_cgroups_and_none_is_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command sees each CPU's loop in the run's cgroup with its share; its exit status
    is the run's; afterwards no loop and no cgroup of it is left."""
    if slower.running():
        pytest.skip("this run is itself slowed: a second slowdown has no room (tested below)")
    # The factor's check, a short one: its 12 probes summed 30 million numbers each, about
    # 15 CPU-s of a unit run spent on a ratio this test does not read.
    monkeypatch.setattr(slower, "PROBE_SUM", 300_000)
    seen = tmp_path / "seen"
    script = (
        "import os, pathlib, sys; "
        f"g = pathlib.Path({str(slower.CPU_CGROUPS)!r}) / f'{slower.PREFIX}{{os.getppid()}}'; "
        f"pathlib.Path({str(seen)!r}).write_text((g / 'cpu.rt_runtime_us').read_text().strip() "
        "+ ' ' + str(len((g / 'tasks').read_text().split()))); sys.exit(3)"
    )
    assert slower.main(["2", "--", sys.executable, "-c", script]) == 3
    assert (
        seen.read_text() == f"5000 {len(os.sched_getaffinity(0))}"
    )  # half of 10 ms; a loop per CPU
    assert not slower.running()


@ROOT_AND_CGROUPS
def test_a_second_slowdown_while_one_is_on_is_refused_by_name() -> None:
    """Its loops would get no real-time share while the first's hold it (nor could they
    be stopped): it is refused before anything starts, naming the one that is on."""
    other = slower.CPU_CGROUPS / f"{slower.PREFIX}4194999"
    on_before = slower.running()
    other.mkdir()
    task = subprocess.Popen(["sleep", "60"])  # the other run's: a group with a task is on
    (other / "tasks").write_text(str(task.pid))
    try:
        with pytest.raises(SystemExit) as e:
            slower.main(["2", "--", "true"])
        names = ", ".join(g.name for g in sorted([*on_before, other]))
        assert str(e.value) == (
            f"toolchain.slower: another slowdown is on ({names}): its loops hold the CPUs' "
            "real-time share; run this one once it has ended"
        )
    finally:
        task.kill()
        task.wait()
        other.rmdir()
    assert slower.running() == on_before


@ROOT_AND_CGROUPS
def test_the_loops_die_with_the_run_however_it_ends() -> None:
    """The run SIGKILLed (no `finally` runs): its loops die with it, so none is left keeping
    the machine slow; its cgroup, empty, is removed by the next look at what is on."""
    if slower.running():
        pytest.skip("this run is itself slowed: a second slowdown has no room")
    run = subprocess.Popen([sys.executable, "-m", "toolchain.slower", "2", "--", "sleep", "60"],
                           cwd=Path(slower.__file__).resolve().parent.parent)  # fmt: skip
    group = slower.CPU_CGROUPS / f"{slower.PREFIX}{run.pid}"
    command: list[int] = []  # `sleep 60`, had it started (the run is killed before, in its check)
    try:
        deadline = time.monotonic() + 60
        while not (
            group.exists()
            and len((group / "tasks").read_text().split()) == len(os.sched_getaffinity(0))
        ):
            assert time.monotonic() < deadline, "the loops never started"
            time.sleep(0.1)
        loops = [int(t) for t in (group / "tasks").read_text().split()]
        children = Path(f"/proc/{run.pid}/task/{run.pid}/children").read_text().split()
        command = [int(c) for c in children if int(c) not in loops]
        run.kill()
        run.wait()
        deadline = time.monotonic() + 10
        while (group / "tasks").read_text().split():
            assert time.monotonic() < deadline, f"loops left: {loops}"
            time.sleep(0.1)
        assert not [pid for pid in loops if _alive(pid)]
        assert slower.running() == [] and not group.exists()  # the killed run's, removed
    finally:
        run.kill()
        run.wait()
        for pid in command:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if group.exists():
            group.rmdir()
