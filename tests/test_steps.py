"""Where `make test`'s time goes (toolchain/steps.py): estimates from the last run or the
typical fresh machine, the run's record, and its report, also when a step fails."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from toolchain import steps


@pytest.fixture(autouse=True)
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, file in [("HERE", ""), ("RUN", "run.jsonl"), ("DONE", "last-run.jsonl"),
                       ("LAST", "last.json"), ("LOGS", "logs")]:  # fmt: skip
        monkeypatch.setattr(steps, name, tmp_path / file if file else tmp_path)
    return tmp_path


def test_an_estimate_comes_from_the_last_time_else_the_typical_machine() -> None:
    assert steps.estimate("go kubernetes") == "about 7 min (on a fresh 2-core machine)"
    assert steps.estimate("go never-built") == ""
    steps.record("go kubernetes", 300)  # no run began: the estimate only
    assert not steps.RUN.exists()
    assert steps.estimate("go kubernetes") == "about 5 min (last time)"
    assert steps.estimate("go kubernetes", 120) == "about 3 min left of 5 min (last time)"
    assert steps.estimate("go kubernetes", 400) == "longer than 5 min last time"
    assert steps.estimate("go etcd", 10) == "about 22 s left of 32 s (on a fresh 2-core machine)"


def test_cached_and_failed_steps_leave_the_estimate_alone() -> None:
    steps.record("go helm", 60)
    steps.record("go helm", 0, "cached")
    steps.record("go helm", 5, "failed (1)")
    assert json.loads(steps.LAST.read_text()) == {"go helm": 60}


def test_a_total_needs_every_step_known() -> None:
    assert steps.total(["go kubernetes", "go etcd"]) == "about 8 min in all"
    assert steps.total(["go keda", "go unknown"]) == ""
    assert steps.total([]) == ""


def test_a_run_reports_make_steps_in_order_then_builds_and_modules_slowest_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    steps.begin()
    assert steps.run("first", [sys.executable, "-c", "pass"]) == 0
    steps.record("image base", 0, "cached")
    steps.record("go kubernetes", 592)
    steps.record("image frontend", 138)
    steps.record("image frontend", 0, "cached")  # asked again later: found built
    steps.record("go helm", 0, "cached")
    steps.record("go helm", 0, "cached")
    for i in range(steps.SLOWEST + 3):
        steps.record(f"tests/test_{i:02}.py", i, "ran", kind="suite")
    steps.record("second", 7, "done", "make")
    steps.end()
    assert not steps.RUN.exists() and steps.DONE.exists()
    text = capsys.readouterr().out
    lines = [line.split()[0] for line in text.splitlines() if line.startswith("    ")]
    assert lines[:4] == ["first", "second", "go", "image"], text
    assert text.index("kubernetes") < text.index("frontend") < text.index("found cached")
    assert "  found cached: image base, go helm\n" in text  # each once; frontend was built
    assert text.count("frontend") == 1
    modules = [line for line in lines if line.startswith("tests/")]
    assert modules[0] == f"tests/test_{steps.SLOWEST + 2:02}.py"
    assert len(modules) == steps.SLOWEST
    assert "wall time from the start" in text
    assert steps.report() == text.rstrip("\n")  # the last run's, once it ended
    steps.record("tests/test_later.py", 1, "ran", kind="suite")  # after the end: not in it
    assert "test_later" not in steps.report()


def test_the_report_says_how_busy_the_cpus_were_over_the_run_and_each_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """From /proc/stat's CPU line (user nice system idle iowait irq softirq steal): idle and
    iowait are the idle time. The step's command itself moves the counters on: 280 of its
    370 ticks busy, 76 %; the run's 500 ticks, 300 busy, 60 %."""
    stat = tmp_path / "stat"
    monkeypatch.setattr(steps, "PROC_STAT", stat)
    hz = os.sysconf("SC_CLK_TCK")

    def at(*ticks: int) -> str:
        return "cpu " + " ".join(str(t) for t in ticks) + "\ncpu0 1 2 3\n"

    stat.write_text(at(100, 0, 0, 100, 0, 0, 0, 0))
    steps.begin()
    stat.write_text(at(120, 0, 0, 150, 0, 0, 0, 0))  # 20 of 70 busy between begin and the step
    step_end = at(300, 10, 80, 200, 40, 5, 5, 0)  # +280 busy, +90 idle (50 idle, 40 iowait)
    assert (
        steps.run("e2e", [sys.executable, "-c", f"open({str(stat)!r}, 'w').write({step_end!r})"])
        == 0
    )
    stat.write_text(at(300, 10, 80, 260, 40, 5, 5, 0))  # +60 idle after the step
    steps.end()
    text = capsys.readouterr().out
    assert "e2e" in text and "done  (CPUs 76% busy)" in text, text  # 280 of 370
    assert "the CPUs were busy 60% of it (idle 40%)" in text, text  # 300 of 500
    assert steps.cpu_times() == (400 / hz, 700 / hz)
    stat.write_text("cpu x\n")  # unreadable: no figure, and no failure
    assert steps.cpu_times() is None
    assert steps.busy_share(None, (1.0, 2.0)) is None
    assert steps.busy_share([1.0, 2.0], [1.0, 2.0]) is None  # no time between them


def test_a_failed_step_ends_the_run_with_its_report(capsys: pytest.CaptureFixture[str]) -> None:
    steps.begin()
    rc = steps.run("lint", [sys.executable, "-c", "raise SystemExit(3)"])
    assert rc == 3
    text = capsys.readouterr().out
    assert "lint" in text and "failed (3)" in text
    assert not steps.RUN.exists()


def test_another_runs_commands_neither_add_to_this_runs_record_nor_end_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A `make -n test` or a `pytest` in another checkout while `make test` runs: their
    steps and their end are theirs, and this run's record goes on."""
    monkeypatch.setenv(steps.RUN_ENV, "this-run")
    steps.begin()
    steps.record("go etcd", 40)
    monkeypatch.setenv(steps.RUN_ENV, "another-run")
    steps.record("tests/test_elsewhere.py", 3, "ran", kind="suite")
    assert steps.run("a dry run's step", _py("raise SystemExit(141)")) == 141  # its end
    monkeypatch.delenv(steps.RUN_ENV)
    steps.record("go helm", 60)  # a command of no run: an estimate only
    assert json.loads(steps.LAST.read_text())["go helm"] == 60
    monkeypatch.setenv(steps.RUN_ENV, "this-run")
    assert steps.RUN.exists() and not steps.DONE.exists()
    assert [e["step"] for e in steps.steps().done] == ["go etcd"]
    steps.end()
    assert not steps.RUN.exists() and steps.DONE.exists()


def _py(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def test_steps_together_run_at_once_the_others_niced_their_output_after_the_first(
    here: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """The first step waits for a file the second makes: they run at the same time. The
    steps beside it run one after another, at the lower priority, their output printed
    after the first's; each is recorded, and the run goes on."""
    flag = here / "made-beside"
    steps.begin()
    wait = (f"import pathlib, time\nfor _ in range(300):\n    if pathlib.Path({str(flag)!r}).exists(): "
            "print('first saw it', flush=True); break\n    time.sleep(0.1)\nelse: raise SystemExit(9)")  # fmt: skip
    rc = steps.together(("e2e", _py(wait)), [
        ("maker", _py(f"import os, pathlib; pathlib.Path({str(flag)!r}).touch(); print('nice', os.nice(0))")),
        ("after", _py("print('second beside')")),
    ])  # fmt: skip
    assert rc == 0
    out = capfd.readouterr().out
    assert out.index("first saw it") < out.index("==> maker (beside the e2e), exit status 0:")
    assert f"nice {min(os.nice(0) + steps.BESIDE_NICE, 19)}" in out  # relative to this one's
    assert out.index("nice") < out.index("second beside")
    assert "[after, beside the e2e: done in" in out
    recorded = {
        e["step"]: e["state"] for e in map(json.loads, steps.RUN.read_text().splitlines()[1:])
    }
    assert recorded == {"e2e": "done", "maker (beside the e2e)": "done",
                        "after (beside the e2e)": "done"}  # fmt: skip


def test_a_failed_step_beside_fails_the_run_once_all_have_ended(
    capfd: pytest.CaptureFixture[str],
) -> None:
    steps.begin()
    rc = steps.together(("e2e", _py("print('first ran')")), [
        ("lint", _py("print('lint says no'); raise SystemExit(4)")),
        ("unit", _py("print('unit ran')")),
    ])  # fmt: skip
    assert rc == 4
    out = capfd.readouterr().out
    assert "first ran" in out and "lint says no" in out and "unit ran" in out
    assert "[lint, beside the e2e: failed (4) in" in out
    assert (
        "lint (beside the e2e)" in out
        and "failed (4)" in out.split("Where this run's time went")[1]
    )
    assert not steps.RUN.exists()  # the run ended, its record printed


def test_the_command_line_refuses_what_it_does_not_know(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert steps.main(["run", "x"]) == 2
    assert steps.main(["record", "x"]) == 2
    assert steps.main(["together", "e2e", "--"]) == 2  # no command
    assert steps.main(["together", "e2e", "--", "true", "::", "lint", "true"]) == 2  # no --
    assert "python -m toolchain.steps begin" in capsys.readouterr().err
    assert steps.main(["record", "environment .venv", "12"]) == 0
    assert json.loads(steps.LAST.read_text()) == {"environment .venv": 12}


def test_an_image_rebuilt_on_its_cached_layers_is_estimated_apart_from_a_full_build() -> None:
    """A change to the source rebuilds the frontend in seconds on its earlier build's layers;
    its next full build (new dependencies, an emptied store) is still estimated in minutes."""
    from testbed import images

    full = images.step_name(images.FRONTEND, rebuild=False)
    rebuild = images.step_name(images.FRONTEND, rebuild=True)
    steps.record(full, 138)
    steps.record(rebuild, 6)
    assert steps.estimate(full) == "about 2 min (last time)"
    assert steps.estimate(rebuild) == "about 6 s (last time)"
    assert full == "image frontend"  # the typical fresh machine's figure still applies to it
