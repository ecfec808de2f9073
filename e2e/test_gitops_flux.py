"""A real GitOps loop: Flux applies a TranscriptionDeployment from Git and reads its health.

Flux's source-controller and kustomize-controller run next to the test bed as host
processes (the test bed's GitOps module, built from the pinned flux tool); a Git server in this process
(`git http-backend` behind a local HTTP server) serves a repository this test commits
to. A GitRepository follows it, and a Kustomization applies it with ``wait: true``: its
health check is kstatus on every object it applied, which for the TranscriptionDeployment
means the operator's ``status.observedGeneration`` and its Reconciling, Stalled and Ready
conditions (operator/transcription_operator/status.py). The operator runs as a local
process; the pods run on the test bed's real node.

(a) The sample CPU service (one replica) and its namespace: the Kustomization is in
    progress (Ready Unknown, Reconciling True) while the resource is not Ready, and Ready
    only once the resource is Ready (its Ready condition turned True first).
(b) A doomed spec -- translations declared for the English-only whisper-tiny.en: the
    operator's EnglishOnlyModel finding, Stalled=True with the operator's message. kstatus
    reads Failed and kustomize-controller fails the health check at once (fail-fast):
    Ready False, HealthCheckFailed, naming the resource as Failed.
(c) A stuck rollout -- a worker asking for more CPU than any node has, with a 30 s
    progressDeadlineSeconds: progressing (the resource Reconciling, Unschedulable) until
    the Deployment passes its deadline, then failed (ProgressDeadlineExceeded).

A TranscriptionGateway in front of the sample reads the same way: Ready only once the
gateway is, and failed at once when it selects nothing (Stalled, NoDeployments).

The Kustomization's conditions at each stage are printed (`pytest -s`).
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

import testbed.cluster
import toolchain
from testbed import gitops, images
from testbed.kube import SAMPLES, condition, create_namespace, td_get, wait_for
from testbed.kubectl import Kubectl
from testbed.operators import OperatorProcess
from transcription_api.findings import translation_message

NAME = "whisper-cpu"
MODEL = "whisper-tiny.en"
DEADLINE = 20  # the stuck rollout's progressDeadlineSeconds
REPO = "fleet"
KUSTOMIZATION = "whisper"


@pytest.fixture(scope="module")
def flux(
    cluster: Path, real_node: str, operator: OperatorProcess,
    shown: Callable[[], AbstractContextManager[None]],
) -> Iterator[gitops.Flux]:  # fmt: skip
    """The controllers, for this module; stopped (their objects and CRDs removed) before the
    operator, which must finalize what the Kustomization prunes. Their build (under `make
    test`, beside the suite's first modules) is waited for in view."""
    with shown():
        toolchain.build((toolchain.FLUX,))
    with testbed.cluster.flux() as running:
        yield running


@pytest.fixture(scope="module")
def git_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[gitops.GitServer]:
    with gitops.GitServer(tmp_path_factory.mktemp("git") / "repos") as server:
        yield server


def resource(namespace: str, **spec: Any) -> dict[str, Any]:
    """The CPU sample with the images the real node holds, sized for its 2 cores."""
    doc: dict[str, Any] = copy.deepcopy(SAMPLES["cpu-faster-whisper"])
    refs = images.refs()
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["pools"][0]["resources"]["cpu"] = "500m"
    doc["spec"]["frontend"]["resources"] = {"cpu": "100m", "memory": "256Mi"}
    doc["spec"]["images"] = {"fasterWhisper": refs["worker-cpu"], "frontend": refs["frontend"],
                             "pullPolicy": "IfNotPresent"}  # fmt: skip
    doc["spec"].update(spec)
    return doc


def tree(namespace: str, td: dict[str, Any]) -> dict[str, str]:
    """The repository's files: a kustomization of the namespace and the resource."""
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": ["namespace.yaml", "whisper.yaml"]}  # fmt: skip
    return {
        "apps/kustomization.yaml": yaml.safe_dump(kustomization),
        "apps/namespace.yaml": yaml.safe_dump(ns),
        "apps/whisper.yaml": yaml.safe_dump(td),
    }


def flux_objects(namespace: str, url: str) -> list[dict[str, Any]]:
    """A GitRepository of the test bed's repository and a Kustomization that waits for
    every object it applies. Long intervals: each revision is asked for (the test requests
    a reconciliation after each commit), and a failed health check is not retried while the
    test reads it."""
    meta = {"namespace": namespace}
    return [
        {"apiVersion": "source.toolkit.fluxcd.io/v1", "kind": "GitRepository",
         "metadata": {"name": REPO, **meta},
         "spec": {"url": url, "ref": {"branch": gitops.BRANCH}, "interval": "10m",
                  "timeout": "30s"}},
        {"apiVersion": "kustomize.toolkit.fluxcd.io/v1", "kind": "Kustomization",
         "metadata": {"name": KUSTOMIZATION, **meta},
         "spec": {"sourceRef": {"kind": "GitRepository", "name": REPO}, "path": "./apps",
                  "interval": "10m", "prune": True, "wait": True, "timeout": "5m"}},
    ]  # fmt: skip


@dataclass(frozen=True)
class Seen:
    """One look at the Kustomization and, just after, at the resource."""

    at: float  # seconds since the stage began
    revision: str  # the Kustomization's lastAttemptedRevision
    ready: dict[str, Any]  # the Kustomization's Ready condition
    reconciling: str  # its Reconciling condition's status ("" when absent)
    td: dict[str, Any]  # the resource

    @property
    def td_ready(self) -> bool:
        """Ready, rolled out, and for the current generation (e2e's wait_ready)."""
        current = (self.td.get("status") or {}).get("observedGeneration") == self.td[
            "metadata"
        ].get("generation")
        done = [condition(self.td, t).get("status") for t in ("Ready", "Progressing", "Degraded")]
        return current and done == ["True", "False", "False"]


class Watch:
    """Looks at the Kustomization and the resource once a second, printing every change of
    the Kustomization's conditions."""

    def __init__(self, kubectl: Kubectl, flux_ns: str, ns: str, flux: gitops.Flux) -> None:
        self.kubectl, self.flux_ns, self.ns, self.flux = kubectl, flux_ns, ns, flux
        self.last = ""

    def kustomization(self) -> dict[str, Any]:
        result: dict[str, Any] = self.kubectl.json(
            "get", "kustomization", KUSTOMIZATION, "-n", self.flux_ns
        )
        return result

    def conditions(self) -> list[dict[str, Any]]:
        return list((self.kustomization().get("status") or {}).get("conditions", []))

    def look(self, start: float) -> Seen:
        ks = self.kustomization()
        proc = self.kubectl.run("get", "tdeploy", NAME, "-n", self.ns, "-o", "json", check=False)
        td = json.loads(proc.stdout) if proc.returncode == 0 else {"metadata": {}}
        st = ks.get("status") or {}
        shown = json.dumps([{k: c.get(k) for k in ("type", "status", "reason", "message")}
                            for c in st.get("conditions", [])])  # fmt: skip
        if shown != self.last:
            self.last = shown
            print(f"[flux +{time.monotonic() - start:5.1f}s] Kustomization: {shown}")
        return Seen(
            at=time.monotonic() - start,
            revision=str(st.get("lastAttemptedRevision", "")),
            ready=condition(ks, "Ready"),
            reconciling=condition(ks, "Reconciling").get("status", ""),
            td=td,
        )

    def until(self, done: Any, timeout: float, what: str) -> list[Seen]:
        start = time.monotonic()
        seen: list[Seen] = []
        while True:
            s = self.look(start)
            seen.append(s)
            if done(s):
                return seen
            if s.at > timeout:
                raise AssertionError(
                    f"timed out after {timeout:.0f}s waiting for {what}; the Kustomization's "
                    f"conditions: {self.last}\nthe resource's: "
                    f"{json.dumps((s.td.get('status') or {}).get('conditions'))}\n"
                    f"{self.flux.logs()}"
                )
            time.sleep(1)


def at(revision: str, sha: str) -> bool:
    """Whether a Flux revision ('main@sha1:<sha>') names the commit."""
    return revision.endswith(f":{sha}")


def reconcile_now(kubectl: Kubectl, flux_ns: str) -> None:
    """What `flux reconcile source git` does: the requested-at annotation."""
    stamp = datetime.now(UTC).isoformat()
    kubectl("annotate", "--overwrite", "gitrepository", REPO, "-n", flux_ns,
            f"reconcile.fluxcd.io/requestedAt={stamp}")  # fmt: skip


def parse_time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def test_flux_reads_the_resources_health_through_kstatus(
    kubectl: Kubectl, flux: gitops.Flux, git_server: gitops.GitServer
) -> None:
    flux_ns = create_namespace(kubectl, "flux", simulated=True)
    ns = f"gitops-{flux_ns.rsplit('-', 1)[1]}"
    repo = git_server.repository(REPO)
    watch = Watch(kubectl, flux_ns, ns, flux)
    try:
        # ----------------------------------------------------------------- (a) Ready
        sha = repo.commit(tree(ns, resource(ns)), "whisper-cpu, one replica")
        for obj in flux_objects(flux_ns, git_server.url(REPO)):
            kubectl.apply(obj)
        print(f"\n[flux] (a) {sha[:12]}: the sample, 1 replica")
        seen = watch.until(
            lambda s: at(s.revision, sha) and s.ready.get("status") in ("True", "False"),
            timeout=360, what="the Kustomization to finish its first revision",
        )  # fmt: skip
        final = seen[-1]
        assert final.ready["status"] == "True", (final.ready, flux.logs())
        assert final.ready["reason"] == "ReconciliationSucceeded"
        assert final.ready["message"] == f"Applied revision: {gitops.BRANCH}@sha1:{sha}"
        assert final.td_ready, final.td.get("status")
        # In progress while the resource was not Ready ...
        waiting = [s for s in seen if s.reconciling == "True" and not s.td_ready
                   and s.ready.get("status") == "Unknown"]  # fmt: skip
        assert waiting, "the Kustomization was never seen in progress while the resource was not"
        assert waiting[-1].ready["reason"] == "Progressing"
        # ... and Ready only after the resource: never Ready=True with the resource not, and
        # the resource's Ready turned True no later than the Kustomization's (API server
        # timestamps, to the second). kstatus takes a resource without status for Current
        # (Flux passed one 36 ms after applying it): the CRD's default status
        # (observedGeneration 0) keeps it InProgress until the operator's first status.
        early = [s for s in seen if s.ready.get("status") == "True" and not s.td_ready]
        assert not early, f"Flux reported Ready before the resource was: {early[0]}"
        td_ready_at = parse_time(condition(final.td, "Ready")["lastTransitionTime"])
        ks_ready_at = parse_time(final.ready["lastTransitionTime"])
        assert td_ready_at <= ks_ready_at, (td_ready_at, ks_ready_at)
        print(f"[flux] (a) Ready after {final.at:.0f}s; resource Ready at {td_ready_at:%T}, "
              f"Kustomization at {ks_ready_at:%T}")  # fmt: skip

        # ----------------------------------------------------------------- (b) doomed
        doomed = resource(ns)
        doomed["spec"]["traffic"]["endpoints"] = ["transcriptions", "translations"]
        sha = repo.commit(tree(ns, doomed), "translations on an English-only model")
        reconcile_now(kubectl, flux_ns)
        print(f"\n[flux] (b) {sha[:12]}: translations declared for {MODEL}")
        seen = watch.until(
            lambda s: at(s.revision, sha) and s.ready.get("status") == "False",
            timeout=120, what="the Kustomization to fail the doomed revision",
        )  # fmt: skip
        final = seen[-1]
        td = td_get(kubectl, ns, NAME)
        stalled = condition(td, "Stalled")
        assert (stalled["status"], stalled["reason"]) == ("True", "EnglishOnlyModel")
        assert stalled["message"] == translation_message(MODEL)
        assert final.ready["reason"] == "HealthCheckFailed"
        message = final.ready["message"]
        # kustomize-controller (fluxcd/pkg/ssa) names the resource and kstatus' verdict; the
        # resource's own words are in its Stalled condition, where kstatus read them.
        assert f"TranscriptionDeployment/{ns}/{NAME} status: 'Failed'" in message, message
        assert final.at < 60, f"not failed fast: {final.at:.0f}s"
        print(f"[flux] (b) failed after {final.at:.0f}s: {message!r}; the resource's Stalled: "
              f"{stalled['message']!r}; Flux's message quotes it: "
              f"{translation_message(MODEL) in message}")  # fmt: skip

        # ----------------------------------------------------------------- (c) stuck
        stuck = resource(ns)
        pool = stuck["spec"]["pools"][0]
        pool["resources"]["cpu"] = "64"  # no node has it: the real node has 2 cores
        pool["progressDeadlineSeconds"] = DEADLINE
        sha = repo.commit(tree(ns, stuck), f"64 CPUs per worker, {DEADLINE}s deadline")
        reconcile_now(kubectl, flux_ns)
        print(f"\n[flux] (c) {sha[:12]}: a worker no node can hold, {DEADLINE}s deadline")
        seen = watch.until(
            lambda s: at(s.revision, sha) and s.ready.get("status") == "False",
            timeout=DEADLINE + 180, what="the Kustomization to fail the stuck rollout",
        )  # fmt: skip
        final = seen[-1]
        progressing = [
            s for s in seen
            if at(s.revision, sha) and s.reconciling == "True"
            and s.ready.get("status") == "Unknown"
            and condition(s.td, "Reconciling").get("reason") == "Unschedulable"
        ]  # fmt: skip
        assert progressing, "the stuck rollout was never seen in progress"
        assert final.at >= DEADLINE, f"failed after {final.at:.0f}s, before the deadline"
        td = td_get(kubectl, ns, NAME)
        stalled = condition(td, "Stalled")
        assert (stalled["status"], stalled["reason"]) == ("True", "ProgressDeadlineExceeded")
        assert stalled["message"].startswith(
            f"rollout stuck past its progressDeadlineSeconds ({DEADLINE}s): pool cpu 0/1 ready "
            "on the new spec, 1 old replica serving"
        ), stalled["message"]
        # The old replica serves on: the resource stays Ready, as a Deployment stays
        # Available; kstatus reads Stalled first.
        assert condition(td, "Ready")["status"] == "True"
        assert final.ready["reason"] == "HealthCheckFailed"
        message = final.ready["message"]
        assert f"TranscriptionDeployment/{ns}/{NAME} status: 'Failed'" in message, message
        print(f"[flux] (c) progressing for {progressing[-1].at:.0f}s, failed after "
              f"{final.at:.0f}s: {message!r}; the resource's Stalled: {stalled['message']!r}")  # fmt: skip
    finally:
        # Pruned with the Kustomization (the namespace and the resource; the operator
        # still runs to finalize it); the GitRepository with its namespace.
        kubectl.run("delete", "kustomization", KUSTOMIZATION, "-n", flux_ns, "--timeout=120s",
                    check=False)  # fmt: skip
        kubectl.run("delete", "namespace", flux_ns, "--wait=false", check=False)
        kubectl.run("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
        print(f"[flux] requests to the Git server: {len(git_server.requests)}")


GATEWAY = "speech"


def gateway_tree(namespace: str, selector: dict[str, Any]) -> dict[str, str]:
    """The namespace, the CPU sample without a frontend of its own, and a TranscriptionGateway
    in front of it (`selector`: whom the gateway selects)."""
    td = resource(namespace, frontend={"enabled": False})
    td["metadata"]["labels"] = {"transcription.dev/gateway": GATEWAY}
    gw = {
        "apiVersion": "transcription.dev/v1alpha1", "kind": "TranscriptionGateway",
        "metadata": {"name": GATEWAY, "namespace": namespace},
        "spec": {"selector": selector,
                 "frontend": {"replicas": 1, "resources": {"cpu": "100m", "memory": "256Mi"}},
                 "images": {"frontend": images.refs()["frontend"], "pullPolicy": "IfNotPresent"}},
    }  # fmt: skip
    files = tree(namespace, td)
    files["apps/gateway.yaml"] = yaml.safe_dump(gw)
    kustomization = yaml.safe_load(files["apps/kustomization.yaml"])
    kustomization["resources"].append("gateway.yaml")
    files["apps/kustomization.yaml"] = yaml.safe_dump(kustomization)
    return files


def test_flux_reads_a_gateways_health_through_kstatus(
    kubectl: Kubectl, flux: gitops.Flux, git_server: gitops.GitServer
) -> None:
    """A gateway in front of the sample (which has no frontend of its own): the
    Kustomization is Ready only once the gateway is (and the gateway only once the
    deployment is); a gateway that selects nothing is Stalled, which fails the health check
    at once, naming the gateway."""
    flux_ns = create_namespace(kubectl, "flux", simulated=True)
    ns = f"gitops-{flux_ns.rsplit('-', 1)[1]}"
    repo = git_server.repository(REPO)
    watch = Watch(kubectl, flux_ns, ns, flux)

    def gateway() -> dict[str, Any]:
        proc = kubectl.run("get", "tgw", GATEWAY, "-n", ns, "-o", "json", check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else {"metadata": {}}

    try:
        selected = {"matchLabels": {"transcription.dev/gateway": GATEWAY}}
        sha = repo.commit(gateway_tree(ns, selected), "the sample behind a gateway")
        for obj in flux_objects(flux_ns, git_server.url(REPO)):
            kubectl.apply(obj)
        seen = watch.until(
            lambda s: at(s.revision, sha) and s.ready.get("status") in ("True", "False"),
            timeout=360, what="the Kustomization to finish the gateway's revision",
        )  # fmt: skip
        final = seen[-1]
        assert final.ready["status"] == "True", (final.ready, flux.logs())
        gw = gateway()
        assert condition(gw, "Ready")["status"] == "True", gw.get("status")
        assert gw["status"]["observedGeneration"] == gw["metadata"]["generation"]
        gw_ready_at = parse_time(condition(gw, "Ready")["lastTransitionTime"])
        assert gw_ready_at <= parse_time(final.ready["lastTransitionTime"])
        assert [g["name"] for g in final.td["status"]["gateways"]] == [GATEWAY]

        sha = repo.commit(gateway_tree(ns, {"matchLabels": {"team": "nobody"}}), "selects nothing")
        reconcile_now(kubectl, flux_ns)
        seen = watch.until(
            lambda s: at(s.revision, sha) and s.ready.get("status") == "False",
            timeout=120, what="the Kustomization to fail the gateway that selects nothing",
        )  # fmt: skip

        # The deployment's reconcile may have reached kstatus first: wait for the gateway's.
        def stalled() -> tuple[str | None, str | None]:
            c = condition(gateway(), "Stalled")
            return c.get("status"), c.get("reason")

        wait_for(lambda: stalled() == ("True", "NoDeployments"), timeout=60,
                 what="the gateway to be Stalled (NoDeployments)")  # fmt: skip
        wait_for(
            lambda: condition(td_get(kubectl, ns, NAME), "Stalled").get("reason") == "NotRouted",
            timeout=60, what="the deployment nothing routes any more to be Stalled (NotRouted)",
        )  # fmt: skip
        # Flux fails at the first stalled object it reads: the gateway that selects nothing, or
        # the deployment nothing routes now (which of the two reaches kstatus first is a race).
        message = seen[-1].ready["message"]
        named = re.findall(r"(\w+)/" + ns + r"/([\w-]+) status: 'Failed'", message)
        assert named and set(named) <= {("TranscriptionGateway", GATEWAY),
                                        ("TranscriptionDeployment", NAME)}, message  # fmt: skip
    finally:
        kubectl.run("delete", "kustomization", KUSTOMIZATION, "-n", flux_ns, "--timeout=120s",
                    check=False)  # fmt: skip
        kubectl.run("delete", "namespace", flux_ns, "--wait=false", check=False)
        kubectl.run("delete", "namespace", ns, "--wait=false", "--ignore-not-found", check=False)
