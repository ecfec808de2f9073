"""The e2e suite's two lanes (`testbed.lanes`): which modules run where, what each lane's
operators watch, and the lock that lets a fault of the whole test bed run alone."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from testbed import lanes
from transcription_operator.scope import Scope


@pytest.fixture(autouse=True)
def locks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lanes, "LOCKS", tmp_path / "lanes")


def test_every_e2e_module_runs_in_exactly_one_lane() -> None:
    node, api = set(lanes.NODE_LANE), set(lanes.api_lane())
    assert all((lanes.E2E.parent / m).is_file() for m in node)
    assert not node & api
    assert node | api == {f"e2e/{p.name}" for p in lanes.E2E.glob("test_*.py")}
    assert "e2e/test_operator.py" in api and "e2e/test_vllm_node.py" in node


def test_each_lanes_operators_watch_only_that_lanes_namespaces() -> None:
    node, api = lanes.lane_env("node"), lanes.lane_env("api")
    name = f"{node['TESTBED_NAMESPACE_PREFIX']}s-1234abcd"  # as `create_namespace` makes one
    node_scope = Scope.of(node["WATCH_NAMESPACES"].split(","))
    api_scope = Scope.of(api["WATCH_NAMESPACES"].split(","))
    assert node_scope.admits(name) and not api_scope.admits(name)
    assert api_scope.admits("t-1234abcd") and not node_scope.admits("t-1234abcd")
    assert "TESTBED_NAMESPACE_PREFIX" not in api and api["E2E_LANE"] == "api"


def in_thread(hold: object, log: list[str], name: str, seconds: float) -> threading.Thread:
    def run() -> None:
        with hold:  # type: ignore[attr-defined]
            log.append(f"{name} in")
            time.sleep(seconds)
            log.append(f"{name} out")

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_fault_waits_for_the_test_in_progress_and_the_next_test_waits_for_it() -> None:
    log: list[str] = []
    first = in_thread(lanes.shared(), log, "test", 0.5)
    time.sleep(0.1)
    fault = in_thread(lanes.exclusive(), log, "fault", 0.5)
    time.sleep(0.1)
    second = in_thread(lanes.shared(), log, "next test", 0.1)  # not ahead of the fault
    for t in (first, fault, second):
        t.join(5)
    assert log == ["test in", "test out", "fault in", "fault out", "next test in", "next test out"]


def test_the_other_lanes_tests_hold_the_shared_side_together() -> None:
    log: list[str] = []
    a = in_thread(lanes.shared(), log, "a", 0.3)
    time.sleep(0.05)
    b = in_thread(lanes.shared(), log, "b", 0.1)
    a.join(5)
    b.join(5)
    assert log[:2] == ["a in", "b in"]
