"""The e2e suite in two lanes at once on one test bed: ``python -m testbed.lanes [PYTEST ARGS]``.

One lane runs the modules whose pods run on the real node (vLLM, the faults under load,
the chart's operator from its image); the other the modules whose operator runs as a local
process against simulated pods. Most of either lane's time is waiting (pods, leases, a quiet
minute, a paused API server), so together they take little more than the longer one.

What keeps them apart:
- **Namespaces.** The node lane's namespaces begin with ``n-`` (`testbed.kube`'s
  `create_namespace` reads ``TESTBED_NAMESPACE_PREFIX``). Every operator watches its own
  lane's only: the local operators through ``WATCH_NAMESPACES`` (``n-*`` in the node lane,
  ``!n-*`` in the other), the node lane's in-cluster operators by name.
- **Faults of the whole test bed** (the API server restarted or paused, the node's kubelet
  or containerd restarted, the node filled): tests marked ``exclusive`` hold `exclusive()`,
  while each test of the other lane holds `shared()`; so such a fault waits for the other
  lane's test in progress to end, and the other lane waits for it.

The other lane runs at the lower priority of `make test`'s steps beside the e2e suite: with
both lanes at the same, the node lane's vLLM module took 524 s instead of 253.

The test bed is started once, before the lanes (unless one is up), and stopped after both,
failing when a process of it is left behind, as the session fixture does with one lane.
The node lane's output is shown as it comes; the other lane's once the node lane ends.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from testbed import cluster, realnode
from toolchain import CACHE, say
from toolchain.steps import BESIDE_NICE

PREFIX = "n-"
# Slowest first: the faults under load hold the other lane off at times, so they come while
# it has the most left to do.
NODE_LANE = (
    "e2e/test_scaling.py",
    "e2e/test_vllm_node.py",
    "e2e/test_realnode.py",
    "e2e/test_oci_weights.py",
    "e2e/test_transformers_node.py",
    "e2e/test_monitoring.py",
    "e2e/test_diarization_node.py",
    "e2e/test_testbed.py",
)
E2E = Path(__file__).resolve().parent.parent / "e2e"
LOCKS = CACHE / "lanes"


def api_lane() -> list[str]:
    """Every other e2e module: a new module runs beside the node lane unless listed there."""
    node = {Path(m).name for m in NODE_LANE}
    return [f"e2e/{p.name}" for p in sorted(E2E.glob("test_*.py")) if p.name not in node]


def _lock(name: str) -> int:
    LOCKS.mkdir(parents=True, exist_ok=True)
    return os.open(LOCKS / name, os.O_RDWR | os.O_CREAT, 0o644)


@contextlib.contextmanager
def shared() -> Iterator[None]:
    """Held by each test of the lane that does not fault the test bed. It passes the gate
    first, so that a fault waiting for the lock is not overtaken by the next test."""
    gate, lock = _lock("gate"), _lock("lock")
    try:
        fcntl.flock(gate, fcntl.LOCK_SH)
        fcntl.flock(lock, fcntl.LOCK_SH)
        fcntl.flock(gate, fcntl.LOCK_UN)
        yield
    finally:
        os.close(lock)  # closing releases its locks
        os.close(gate)


@contextlib.contextmanager
def exclusive() -> Iterator[None]:
    """Held by a test that faults the whole test bed: once the other lane's test ends."""
    gate, lock = _lock("gate"), _lock("lock")
    try:
        fcntl.flock(gate, fcntl.LOCK_EX)
        start = time.monotonic()
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (waited := time.monotonic() - start) > 1:
            print(f"\n[lanes] waited {waited:.0f} s for the other lane's test to end", flush=True)
        yield
    finally:
        os.close(lock)
        os.close(gate)


def lane_env(lane: str) -> dict[str, str]:
    env = {**os.environ, "E2E_LANE": lane}
    if lane == "node":
        env |= {"TESTBED_NAMESPACE_PREFIX": PREFIX, "WATCH_NAMESPACES": f"{PREFIX}*"}
    else:
        env |= {"WATCH_NAMESPACES": f"!{PREFIX}*"}
    return env


def main(args: list[str]) -> int:
    stop = not cluster.is_up() and not os.environ.get("TESTBED_KEEP")
    cluster.up()
    log = LOCKS / "api.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    pytest = [sys.executable, "-m", "pytest", "-m", "e2e", *args]
    api_modules = api_lane()
    say(f"e2e in two lanes: {len(NODE_LANE)} modules on the real node, {len(api_modules)} "
        f"beside them (their output, in {log}, follows)")  # fmt: skip
    try:
        with log.open("wb") as out:
            # At the beside steps' lower priority: the node lane is the longer one, and its
            # vLLM slowed to twice its time when both lanes had the same.
            api = subprocess.Popen(["nice", "-n", str(BESIDE_NICE), *pytest, *api_modules],
                                   env=lane_env("api"), stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
            start = time.monotonic()
            node_rc = subprocess.run([*pytest, *NODE_LANE], env=lane_env("node")).returncode
            node_s = time.monotonic() - start
            api_rc = api.wait()
            api_s = time.monotonic() - start
        print(f"\n==> the other lane ({' '.join(m.removeprefix('e2e/') for m in api_modules)}), "
              f"exit status {api_rc}:", flush=True)  # fmt: skip
        sys.stdout.buffer.write(log.read_bytes())
        print(f"\n[lanes] the node lane took {node_s:.0f} s, the other {api_s:.0f} s", flush=True)
    finally:
        if stop:
            cluster.down()  # a process of it left running: SystemExit, naming it
    if stop and (left := realnode.leftovers(CACHE)):
        print(f"the test bed left processes behind: {left}", file=sys.stderr)
        return 1
    return node_rc or api_rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
