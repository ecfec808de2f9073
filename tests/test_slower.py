"""toolchain.slower: the busy loops' share of each CPU, and its refusals."""

from __future__ import annotations

import os
import sys
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


ROOT_AND_CGROUPS = pytest.mark.skipif(
    not (slower.CPU_CGROUPS / "cpu.rt_runtime_us").exists() or os.geteuid() != 0,
    reason="needs root and cgroup v1's cpu controller with real-time group scheduling",
)


@ROOT_AND_CGROUPS
def test_the_command_runs_beside_the_loops_cgroups_and_none_is_left(tmp_path: Path) -> None:
    """The command sees each CPU's loop in the run's cgroup with its share; its exit status
    is the run's; afterwards no loop and no cgroup of it is left."""
    if slower.running():
        pytest.skip("this run is itself slowed: a second slowdown has no room (tested below)")
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
    try:
        with pytest.raises(SystemExit) as e:
            slower.main(["2", "--", "true"])
        names = ", ".join(g.name for g in sorted([*on_before, other]))
        assert str(e.value) == (
            f"toolchain.slower: another slowdown is on ({names}): its loops hold the CPUs' "
            "real-time share; run this one once it has ended"
        )
    finally:
        other.rmdir()
    assert slower.running() == on_before
