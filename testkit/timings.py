"""A pytest plugin (`-p testkit.timings`, in pyproject's addopts): each test module's time
(set-up, call and tear-down of its tests, session fixtures included where they start) is
recorded for `make test`'s closing report of where the time went (`toolchain.steps`)."""

from __future__ import annotations

from collections import defaultdict

import pytest

from toolchain import steps

_seconds: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _seconds[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: its reports reach the controller, which records them
    for module, seconds in sorted(_seconds.items(), key=lambda m: -m[1]):
        steps.record(module, seconds, "ran", kind="suite")
