"""Leader election on the real API server: two operator processes with `--leader-elect`
(the chart's default settings: lease 15 s, renew deadline 10 s, retry 2 s) share one Lease.

Exactly one reconciles; the standby's cache stays hot. A leader SIGKILLed while it creates
a new resource's children is replaced within the lease duration and the standby converges
to exactly what `build()` says, with one ReplicaSet per Deployment and no Event twice. A
SIGTERM hands over at once (the Lease is released). A frozen leader (SIGSTOP) is replaced,
and once it thaws it reconciles nothing: it knows by its own clock that its lease lapsed.

Takeover times are printed (`-s` not needed) and bounded by the protocol, not by a guess."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from testbed.kube import SAMPLES, td_get, wait_for, wait_ready
from testbed.kubectl import Kubectl
from testbed.operators import OperatorProcess
from transcription_api.v1alpha1 import TranscriptionDeployment
from transcription_operator.children import build
from transcription_operator.config import OperatorConfig
from transcription_operator.kinds import CHILDREN
from transcription_operator.leader import JITTER_FACTOR, LEASE_DURATION, RETRY_PERIOD

LEASE = "transcription-operator"
# A standby sees the leader's last renewal at its next attempt (at most a jittered retry
# period later), waits the lease out from there, and takes over at the next attempt.
TAKEOVER_MAX = LEASE_DURATION + JITTER_FACTOR * RETRY_PERIOD + RETRY_PERIOD + 3.0
# The leader renews every retry period: none takes over before its last renewal expired.
TAKEOVER_MIN = LEASE_DURATION - RETRY_PERIOD - 0.5
# Released: the standby takes it at its next attempt.
HANDOVER_MAX = (1 + JITTER_FACTOR) * RETRY_PERIOD + 3.0
SAMPLE = "auto-split"
NAME = SAMPLES[SAMPLE]["metadata"]["name"]

Measured = dict[str, float]


class Replica(OperatorProcess):
    @property
    def identity(self) -> str:
        assert self.proc is not None
        return f"{socket.gethostname()}_{self.proc.pid}"  # no POD_NAME outside a pod

    def sample(self, name: str) -> float:
        """A metric summed over its labels."""
        m = self.metrics()
        return sum(v for k, v in m.items() if k == name or k.startswith(name + "{"))

    def reconciles(self) -> float:
        return self.sample("transcription_operator_reconciles_total")


@pytest.fixture
def replicas(
    cluster: Path, crd_installed: None, namespace: str, tmp_path: Path
) -> Iterator[list[Replica]]:
    """Two operators for this test's namespace, with the Lease in it too."""
    args = ["--namespace", namespace, "--leader-elect",
            f"--leader-elect-resource-namespace={namespace}", f"--leader-elect-resource-name={LEASE}"]  # fmt: skip
    pair = [Replica(cluster, tmp_path / f"operator-{i}.log", args) for i in range(2)]
    try:
        for r in pair:
            r.start()
        yield pair
    finally:
        for r in pair:
            if r.proc is not None and r.proc.poll() is None:
                os.kill(r.proc.pid, signal.SIGCONT)  # a frozen one must hear SIGTERM
            r.stop()


def lease(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    out = kubectl.run("get", "lease", LEASE, "-n", namespace, "-o", "json", check=False)
    if out.returncode:
        return {}
    spec: dict[str, Any] = json.loads(out.stdout).get("spec") or {}
    return spec


def leader_of(kubectl: Kubectl, namespace: str, pair: list[Replica]) -> tuple[Replica, Replica]:
    """(leader, standby), once the Lease names one of them and it says it leads."""

    def elected() -> tuple[Replica, Replica] | None:
        holder = lease(kubectl, namespace).get("holderIdentity")
        for me, other in ((pair[0], pair[1]), (pair[1], pair[0])):
            if holder == me.identity and me.sample("transcription_operator_leader") == 1:
                return me, other
        return None

    result: tuple[Replica, Replica] = wait_for(
        elected, timeout=TAKEOVER_MAX + 10, interval=0.2, what="a leader"
    )
    return result


def wait_holder(kubectl: Kubectl, namespace: str, identity: str, since: float) -> float:
    """Seconds from `since` (monotonic) until the Lease names `identity`."""
    wait_for(
        lambda: lease(kubectl, namespace).get("holderIdentity") == identity,
        timeout=TAKEOVER_MAX + 15, interval=0.1, what=f"{identity} to hold the Lease",
    )  # fmt: skip
    return time.monotonic() - since


def report(capsys: pytest.CaptureFixture[str], what: str, seconds: float, bound: str) -> None:
    with capsys.disabled():
        print(f"\n[leader election] {what}: {seconds:.1f} s ({bound})")


def children(kubectl: Kubectl, namespace: str, name: str) -> set[tuple[str, str]]:
    """(kind, name) of the resource's children, of the kinds every cluster serves (the
    sample has no autoscaling: no KEDA ScaledObject, whose API may be missing)."""
    kinds = ",".join(k.plural for k in CHILDREN if not k.optional)
    items = kubectl.json("get", kinds, "-n", namespace, "-l", f"app.kubernetes.io/instance={name}")
    return {(i["kind"], i["metadata"]["name"]) for i in items["items"]}


def expected_children(kubectl: Kubectl, namespace: str) -> set[tuple[str, str]]:
    td = TranscriptionDeployment.model_validate(td_get(kubectl, namespace, NAME))
    return {(m["kind"], m["metadata"]["name"]) for m in build(td, OperatorConfig())}


def operator_events(kubectl: Kubectl, namespace: str) -> list[tuple[str, str]]:
    items = kubectl.json("get", "events", "-n", namespace)["items"]
    return [
        (e["reason"], e["message"])
        for e in items
        if e["involvedObject"]["kind"] == "TranscriptionDeployment"
        and (e.get("source") or {}).get("component") == "transcription-operator"
    ]


# --------------------------------------------------------------------------- tests


def test_exactly_one_replica_reconciles_and_the_standby_stays_hot(
    kubectl: Kubectl, namespace: str, replicas: list[Replica]
) -> None:
    leader, standby = leader_of(kubectl, namespace, replicas)
    spec = lease(kubectl, namespace)
    assert spec["leaseDurationSeconds"] == LEASE_DURATION
    assert spec["leaseTransitions"] == 0 and spec["acquireTime"] and spec["renewTime"]
    kubectl.apply(SAMPLES[SAMPLE], namespace)
    wait_ready(kubectl, namespace, NAME)
    assert leader.reconciles() > 0 and leader.writes() > 0
    assert standby.reconciles() == 0
    assert standby.writes() == 0  # not one write: no child, no status, no Event, no Lease
    assert standby.sample("transcription_operator_leader") == 0
    # The standby watched everything the leader made: its cache is as full as the leader's.
    managed = 'transcription_operator_managed_resources{kind="Deployment"}'
    wait_for(
        lambda: standby.metrics().get(managed) == leader.metrics().get(managed) == 3,
        timeout=10, what="the standby's cache to hold the 3 Deployments",
    )  # fmt: skip
    # The leader keeps renewing (every retry period) and the standby keeps standing by.
    renewed = lease(kubectl, namespace)["renewTime"]
    wait_for(
        lambda: lease(kubectl, namespace)["renewTime"] != renewed,
        timeout=RETRY_PERIOD * 3, what="a renewal",
    )  # fmt: skip
    assert lease(kubectl, namespace)["holderIdentity"] == leader.identity
    assert standby.reconciles() == 0
    assert f"is held by {leader.identity}: standing by" in standby.log_path.read_text()


def test_leader_killed_mid_rollout_is_replaced_within_the_lease_duration(
    kubectl: Kubectl, namespace: str, replicas: list[Replica], capsys: pytest.CaptureFixture[str]
) -> None:
    leader, standby = leader_of(kubectl, namespace, replicas)
    # Kill the leader the moment its first child (a ServiceAccount: first in apply order)
    # appears on a watch, long before its dozen children are all applied.
    watch = subprocess.Popen(
        [kubectl.binary, "--kubeconfig", str(kubectl.kubeconfig), "get", CHILDREN[0].plural,
         "-n", namespace, "-l", f"app.kubernetes.io/instance={NAME}", "--watch", "-o", "name"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        kubectl.apply(SAMPLES[SAMPLE], namespace)
        assert watch.stdout is not None
        assert watch.stdout.readline().strip(), "the leader created no child"
        assert leader.proc is not None
        leader.proc.kill()
        killed = time.monotonic()
    finally:
        watch.kill()
        watch.wait()
    leader.proc.wait()
    partial = children(kubectl, namespace, NAME)

    took = wait_holder(kubectl, namespace, standby.identity, since=killed)
    report(capsys, "takeover after SIGKILL of the leader", took,
           f"lease {LEASE_DURATION:g} s; allowed {TAKEOVER_MIN:.1f}-{TAKEOVER_MAX:.1f} s")  # fmt: skip
    assert TAKEOVER_MIN <= took <= TAKEOVER_MAX
    wait_ready(kubectl, namespace, NAME)
    converged = time.monotonic() - killed
    report(capsys, "SIGKILL to Ready", converged, "takeover + the rest of the rollout")

    expected = expected_children(kubectl, namespace)
    # The kill left a partial rollout (else this test would show nothing)...
    assert partial and partial < expected, sorted(partial)
    # ...which the new leader completed: exactly the desired children, once each.
    assert children(kubectl, namespace, NAME) == expected
    deployments = [k for k in expected if k[0] == "Deployment"]
    rs = kubectl.json("get", "replicasets", "-n", namespace)["items"]
    assert len(rs) == len(deployments) == 3  # one ReplicaSet per Deployment: no template churn
    events = operator_events(kubectl, namespace)
    assert [n for n in Counter(events).values() if n > 1] == [], events
    assert [r for r, _ in events].count("SequentialPoolAdded") == 1, events
    spec = lease(kubectl, namespace)
    assert spec["leaseTransitions"] == 1
    assert standby.sample("transcription_operator_leader") == 1
    assert "became the leader" in standby.log_path.read_text()


def test_graceful_stop_hands_the_lease_over_at_once(
    kubectl: Kubectl, namespace: str, replicas: list[Replica], capsys: pytest.CaptureFixture[str]
) -> None:
    leader, standby = leader_of(kubectl, namespace, replicas)
    kubectl.apply(SAMPLES[SAMPLE], namespace)
    wait_ready(kubectl, namespace, NAME)
    assert leader.proc is not None
    leader.proc.terminate()
    stopped = time.monotonic()
    took = wait_holder(kubectl, namespace, standby.identity, since=stopped)
    report(capsys, "takeover after SIGTERM (released)", took,
           f"allowed up to {HANDOVER_MAX:.1f} s, the lease being {LEASE_DURATION:g} s")  # fmt: skip
    assert took <= HANDOVER_MAX < LEASE_DURATION
    assert leader.proc.wait(timeout=30) == 0
    assert "released lease" in leader.log_path.read_text()
    assert lease(kubectl, namespace)["leaseTransitions"] == 1
    # The new leader reconciles what changes next; the standby had reconciled nothing.
    wait_for(lambda: standby.reconciles() > 0, timeout=10, what="the new leader to reconcile")
    kubectl("patch", "tdeploy", NAME, "-n", namespace, "--type=merge",
            "-p", '{"spec": {"frontend": {"replicas": 2}}}')  # fmt: skip
    wait_ready(kubectl, namespace, NAME)
    dep = kubectl.json("get", "deployment", f"{NAME}-frontend", "-n", namespace)
    assert dep["spec"]["replicas"] == 2


def test_a_frozen_leader_is_replaced_and_reconciles_nothing_once_thawed(
    kubectl: Kubectl, namespace: str, replicas: list[Replica], capsys: pytest.CaptureFixture[str]
) -> None:
    """The leader's process stops (SIGSTOP: a long GC pause, a stalled node) without
    losing its connections: the standby takes over; when the old leader resumes, its own
    clock says it has not renewed within the renew deadline, so it takes no key."""
    leader, standby = leader_of(kubectl, namespace, replicas)
    kubectl.apply(SAMPLES[SAMPLE], namespace)
    wait_ready(kubectl, namespace, NAME)
    assert leader.proc is not None
    time.sleep(1)  # the reconcile that made it Ready posts its Events after the status
    writes = leader.writes()
    os.kill(leader.proc.pid, signal.SIGSTOP)
    frozen = time.monotonic()
    took = wait_holder(kubectl, namespace, standby.identity, since=frozen)
    report(capsys, "takeover after SIGSTOP of the leader", took, f"lease {LEASE_DURATION:g} s")
    assert TAKEOVER_MIN <= took <= TAKEOVER_MAX
    kubectl("patch", "tdeploy", NAME, "-n", namespace, "--type=merge",
            "-p", '{"spec": {"frontend": {"replicas": 2}}}')  # fmt: skip
    wait_ready(kubectl, namespace, NAME)  # the new leader did it

    os.kill(leader.proc.pid, signal.SIGCONT)
    wait_for(lambda: leader.sample("transcription_operator_leader") == 0, timeout=10,
             what="the thawed leader to step down")  # fmt: skip
    # Another change: both see it, only the new leader reconciles it.
    reconciles = leader.reconciles()
    kubectl("patch", "tdeploy", NAME, "-n", namespace, "--type=merge",
            "-p", '{"spec": {"frontend": {"replicas": 1}}}')  # fmt: skip
    wait_ready(kubectl, namespace, NAME)
    assert (
        kubectl.json("get", "deployment", f"{NAME}-frontend", "-n", namespace)["spec"]["replicas"]
        == 1
    )
    time.sleep(2 * RETRY_PERIOD)
    assert leader.reconciles() == reconciles, "a replica without the lease reconciled"
    # Nothing written since it froze: not the change made meanwhile, not the Lease.
    assert leader.writes() == writes
    assert lease(kubectl, namespace)["holderIdentity"] == standby.identity
    log = leader.log_path.read_text()
    assert "lost lease" in log and f"is held by {standby.identity}: standing by" in log
