"""The operator against the real API server, controllers, scheduler and KWOK nodes."""

from __future__ import annotations

import copy
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

import testbed.cluster
from testbed.kube import SAMPLES, condition, td_get, wait_for, wait_ready
from testbed.kubectl import Kubectl
from testbed.operators import OperatorProcess
from transcription_api.v1alpha1 import TranscriptionDeployment
from transcription_operator.children import build
from transcription_operator.config import OperatorConfig
from transcription_operator.kinds import CHILDREN

GPU_NODES = {n["name"] for n in testbed.cluster.NODES if n["gpus"]}
CPU_NODES = {n["name"] for n in testbed.cluster.NODES if not n["gpus"]}
# The quiet window spans two of the operator's resyncs (every resource reconciled again from
# its cache): the periodic work is in it, not only the absence of events.
RESYNC = 5.0
QUIET_SECONDS = float(os.environ.get("QUIET_SECONDS", "12"))

pytestmark = pytest.mark.usefixtures("operator")


def served_child_kinds(kubectl: Kubectl) -> str:
    """The children's kinds this cluster serves (KEDA's ScaledObject only where KEDA runs:
    the test bed's add-ons come with its real node)."""
    served = set(kubectl("api-resources", "-o", "name").split())
    return ",".join(
        k.plural for k in CHILDREN if not k.optional or f"{k.plural}.{k.group}" in served
    )


def children(kubectl: Kubectl, ns: str, name: str) -> dict[tuple[str, str], dict[str, Any]]:
    kinds = served_child_kinds(kubectl)
    items = kubectl.json("get", kinds, "-n", ns, "-l", f"app.kubernetes.io/instance={name}")[
        "items"
    ]
    return {(i["kind"], i["metadata"]["name"]): i for i in items}


def versions(kubectl: Kubectl, ns: str, name: str) -> dict[tuple[str, str], str]:
    out = {k: v["metadata"]["resourceVersion"] for k, v in children(kubectl, ns, name).items()}
    out[("TranscriptionDeployment", name)] = td_get(kubectl, ns, name)["metadata"][
        "resourceVersion"
    ]
    return out


@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_sample_becomes_ready_with_every_child_owned(
    kubectl: Kubectl, namespace: str, sample: str
) -> None:
    doc = SAMPLES[sample]
    name = doc["metadata"]["name"]
    kubectl.apply(doc, namespace)
    td = wait_ready(kubectl, namespace, name)
    uid = td["metadata"]["uid"]

    kids = children(kubectl, namespace, name)
    kinds = {k for k, _ in kids}
    assert kinds >= {"Deployment", "Service", "ConfigMap", "ServiceAccount", "Role", "RoleBinding"}
    for (kind, child), obj in kids.items():
        refs = obj["metadata"]["ownerReferences"]
        assert [(r["uid"], r["controller"]) for r in refs] == [(uid, True)], f"{kind} {child}"

    # Worker pods of GPU pools land on GPU nodes; CPU pools on the CPU node.
    pods = kubectl.json("get", "pods", "-n", namespace, "-l", "app.kubernetes.io/component=worker")[
        "items"
    ]
    assert pods
    for pod in pods:
        gpus = pod["spec"]["containers"][0]["resources"].get("limits", {}).get("nvidia.com/gpu")
        assert pod["status"]["phase"] == "Running"
        assert pod["spec"]["nodeName"] in (GPU_NODES if gpus else CPU_NODES)

    status = td["status"]
    assert status["endpoint"] == f"http://{name}.{namespace}.svc.cluster.local/v1"
    assert status["models"][0] == doc["spec"]["model"]["name"]
    assert all(p["readyReplicas"] == p["replicas"] for p in status["pools"])
    # kopf keeps no bookkeeping in annotations (GitOps tools would see drift).
    annotations = td["metadata"].get("annotations") or {}
    assert not [a for a in annotations if "kopf" in a], annotations
    assert not td["metadata"].get("finalizers")


def test_printer_columns_show_readiness(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(SAMPLES["vllm-gpu"], namespace)
    wait_ready(kubectl, namespace, "whisper")
    out = kubectl("get", "tdeploy", "-n", namespace)
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "READY", "REASON", "ENGINE", "POOLS", "REPLICAS", "AGE"]
    assert row.split()[:6] == ["whisper", "True", "Ready", "vllm", "1/1", "2/2"]
    header, row = kubectl("get", "tdeploy", "-n", namespace, "-o", "wide").splitlines()[:2]
    assert header.split()[-4:] == ["MODEL", "ENDPOINT", "AGE", "MESSAGE"]
    assert f"http://whisper.{namespace}.svc.cluster.local/v1" in row.split()
    assert row.endswith("1 pool(s) and the frontend are ready")


def test_auto_split_adds_a_pool_with_condition_and_event(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(SAMPLES["auto-split"], namespace)
    td = wait_ready(kubectl, namespace, "whisper-split")
    c = condition(td, "AutoSplit")
    assert (c["status"], c["reason"]) == ("True", "SequentialPoolAdded")
    assert "auto-faster-whisper" in c["message"]
    assert "word_timestamps" in c["message"]
    auto = [p for p in td["status"]["pools"] if p["automatic"]]
    assert [(p["name"], p["engine"], p["mode"]) for p in auto] == [
        ("auto-faster-whisper", "faster-whisper", "sequential")
    ]
    assert ("Deployment", "whisper-split-auto-faster-whisper") in children(
        kubectl, namespace, "whisper-split"
    )
    events = kubectl.json(
        "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=whisper-split"
    )
    assert any(e["reason"] == "SequentialPoolAdded" for e in events["items"])


def test_updates_reach_children_and_removed_pools_are_pruned(
    kubectl: Kubectl, namespace: str
) -> None:
    doc = copy.deepcopy(SAMPLES["vllm-gpu"])
    doc["spec"]["pools"].append({"name": "extra", "replicas": 1, "resources": {"gpus": 1}})
    kubectl.apply(doc, namespace)
    wait_ready(kubectl, namespace, "whisper")
    assert ("Deployment", "whisper-extra") in children(kubectl, namespace, "whisper")

    doc["spec"]["pools"] = [doc["spec"]["pools"][0] | {"replicas": 3}]
    doc["spec"]["model"]["aliases"] = ["whisper-1", "large"]
    kubectl.apply(doc, namespace)
    td = wait_ready(kubectl, namespace, "whisper")
    kids = children(kubectl, namespace, "whisper")
    assert ("Deployment", "whisper-extra") not in kids
    assert ("Service", "whisper-extra") not in kids
    assert kids[("Deployment", "whisper-batch")]["spec"]["replicas"] == 3
    routes = kids[("ConfigMap", "whisper-routes")]["data"]["routes.json"]
    assert '"large"' in routes
    assert td["status"]["models"] == ["openai/whisper-large-v3-turbo", "whisper-1", "large"]


@pytest.mark.parametrize(
    ("kind", "suffix"), [("deployment", "-batch"), ("service", ""), ("configmap", "-routes")]
)
def test_deleted_or_edited_children_are_restored(
    kubectl: Kubectl, namespace: str, kind: str, suffix: str
) -> None:
    kubectl.apply(SAMPLES["vllm-gpu"], namespace)
    wait_ready(kubectl, namespace, "whisper")
    name = f"whisper{suffix}"
    old_uid = kubectl.json("get", kind, name, "-n", namespace)["metadata"]["uid"]
    kubectl("delete", kind, name, "-n", namespace)
    restored = wait_for(
        lambda: (o := kubectl.run("get", kind, name, "-n", namespace, "-o", "json", check=False)).returncode == 0
        and yaml.safe_load(o.stdout)["metadata"]["uid"] != old_uid,
        timeout=30, what=f"{kind} {name} to be recreated",
    )  # fmt: skip
    assert restored
    # Drift in a field the operator owns is reverted too.
    kubectl("scale", "deployment", "whisper-batch", "-n", namespace, "--replicas=5")
    wait_for(
        lambda: kubectl.json("get", "deployment", "whisper-batch", "-n", namespace)["spec"]["replicas"] == 2,
        timeout=30, what="replicas to be restored to 2",
    )  # fmt: skip


def test_deleting_the_resource_removes_every_child(kubectl: Kubectl, namespace: str) -> None:
    kubectl.apply(SAMPLES["auto-split"], namespace)
    wait_ready(kubectl, namespace, "whisper-split")
    kubectl("delete", "tdeploy", "whisper-split", "-n", namespace)
    wait_for(
        lambda: not children(kubectl, namespace, "whisper-split")
        and not kubectl.json("get", "pods", "-n", namespace)["items"],
        timeout=90, what="garbage collection of every child and pod",
    )  # fmt: skip


INVALID = [
    ({"pools": [{"name": "a"}, {"name": "a"}]}, "pool names must be unique"),
    ({"model": {"name": "m", "aliases": ["x", "x"]}}, "model.aliases must be unique"),
    ({"model": {"name": "m", "aliases": ["m"]}}, "model.aliases must not repeat model.name"),
    ({"model": {"name": "m", "source": "pvc"}}, "model.source 'pvc' needs model.claimName and model.path"),
    ({"pools": [{"name": "frontend"}]}, "pool names frontend, routes, scaler are reserved"),
    ({"model": {"name": "m", "family": "audio-lm"}}, "model.family audio-lm runs on engine transformers only"),
    ({"model": {"name": "m", "family": "audio-lm"}, "engine": "transformers", "pools": [{"name": "a", "engine": "vllm"}]},
     "model.family audio-lm runs on engine transformers only"),
    ({"engine": "whisper.cpp"}, 'spec.engine: Unsupported value: "whisper.cpp"'),
    ({"pools": [{"name": "Bad_Name"}]}, "spec.pools[0].name in body should match"),
    ({"pools": [{"name": "a", "replicas": -1}]}, "spec.pools[0].replicas in body should be greater than or equal to 0"),
    ({"frontend": {"maxUploadBytes": 10}}, "spec.frontend.maxUploadBytes in body should be greater than or equal to 1024"),
    ({"model": {"name": "m", "bogus": 1}}, 'unknown field "spec.model.bogus"'),
    ({"tracing": {"endpoint": "otel-collector:4318"}}, "tracing.endpoint must be the http:// or https:// base URL"),
    ({"tracing": {"endpoint": "http://o:4318", "samplingRatio": 2}}, "spec.tracing.samplingRatio in body should be less than or equal to 1"),
]  # fmt: skip


@pytest.mark.parametrize(("patch", "message"), INVALID, ids=[m for _, m in INVALID])
def test_invalid_resources_are_rejected_at_admission(
    kubectl: Kubectl, namespace: str, patch: dict[str, Any], message: str
) -> None:
    spec = {"model": {"name": "m"}} | patch
    doc = {"apiVersion": "transcription.dev/v1alpha1", "kind": "TranscriptionDeployment",
           "metadata": {"name": "bad"}, "spec": spec}  # fmt: skip
    proc = kubectl.run("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_name_too_long_is_rejected(kubectl: Kubectl, namespace: str) -> None:
    doc = copy.deepcopy(SAMPLES["vllm-gpu"])
    doc["metadata"]["name"] = "n" * 31
    proc = kubectl.run("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert "metadata.name must be at most 30 characters" in proc.stderr


def test_missing_secret_degrades_without_crashing(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    doc = copy.deepcopy(SAMPLES["vllm-gpu"])
    doc["spec"]["frontend"]["apiKeySecret"] = {"name": "api-keys", "key": "keys"}
    kubectl.apply(doc, namespace)

    def degraded() -> dict[str, Any] | None:
        c = condition(td_get(kubectl, namespace, "whisper"), "Degraded")
        return c if c.get("status") == "True" else None

    c = wait_for(degraded, timeout=30, what="Degraded")
    assert c["reason"] == "SecretNotFound"
    assert f"Secret {namespace}/api-keys does not exist" in c["message"]

    def warned() -> bool:
        events = kubectl.json(
            "get", "events", "-n", namespace, "--field-selector", "involvedObject.name=whisper"
        )
        return any(
            e["reason"] == "SecretNotFound" and e["type"] == "Warning" for e in events["items"]
        )

    # The reconcile posts its Events after the status it patched: wait for them too.
    wait_for(warned, timeout=30, what="a SecretNotFound Warning Event")
    # Fixing the spec heals it; the operator kept running.
    kubectl("create", "secret", "generic", "api-keys", "-n", namespace, "--from-literal=keys=k1")
    kubectl("annotate", "tdeploy", "whisper", "-n", namespace, "touch=1")  # any event re-checks now
    wait_for(lambda: condition(td_get(kubectl, namespace, "whisper"), "Degraded").get("status") == "False",
             timeout=90, what="Degraded to clear")  # fmt: skip
    assert operator.proc is not None
    assert operator.proc.poll() is None


def test_uncovered_traffic_is_degraded_naming_the_capability(
    kubectl: Kubectl, namespace: str
) -> None:
    doc = {"apiVersion": "transcription.dev/v1alpha1", "kind": "TranscriptionDeployment",
           "metadata": {"name": "chat"},
           "spec": {"model": {"name": "m"}, "engine": "transformers", "traffic": {"endpoints": ["chat"]}}}  # fmt: skip
    kubectl.apply(doc, namespace)
    c = wait_for(
        lambda: (x := condition(td_get(kubectl, namespace, "chat"), "Degraded")).get("status") == "True" and x,
        timeout=30, what="Degraded",
    )  # fmt: skip
    assert c["reason"] == "TrafficNotCovered"
    # A Whisper model cannot chat on any engine (transformers serve: a bare 500).
    assert "no pool can serve chat: missing chat" in c["message"]


def test_quiet_period_with_resyncs_makes_no_writes_and_restart_changes_nothing(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, cluster: Path, tmp_path: Path
) -> None:
    """Measured on an operator watching only this namespace (also the namespaced mode),
    so that other tests' namespaces being torn down do not count; it resyncs every
    RESYNC seconds, and the resyncs in the quiet window reconcile and write nothing."""
    operator.stop()
    args = ["--namespace", namespace, "--resync-period", f"{RESYNC:g}s"]
    first = OperatorProcess(cluster, tmp_path / "first.log", args)
    first.start()
    resyncs = 'transcription_operator_enqueued_total{by="resync"}'
    unchanged = 'transcription_operator_reconciles_total{result="unchanged"}'
    try:
        kubectl.apply(SAMPLES["auto-split"], namespace)
        wait_ready(kubectl, namespace, "whisper-split")
        time.sleep(3)  # let the last status write and its watch event settle
        before = versions(kubectl, namespace, "whisper-split")
        writes, m = first.writes(), first.metrics()
        assert writes > 0
        time.sleep(QUIET_SECONDS)
        after = first.metrics()
        assert first.writes() == writes, "the operator wrote during a quiet period"
        assert versions(kubectl, namespace, "whisper-split") == before
        assert after.get(resyncs, 0) - m.get(resyncs, 0) >= QUIET_SECONDS // RESYNC, after
        assert after.get(unchanged, 0) > m.get(unchanged, 0), "the resyncs reconciled nothing"
        first.stop()

        # A new operator process (a restart) converges without touching anything.
        second = OperatorProcess(cluster, tmp_path / "second.log", ["--namespace", namespace])
        second.start()
        try:
            wait_for(
                lambda: second.metrics().get('transcription_operator_reconciles_total{result="unchanged"}', 0) > 0,
                timeout=30, what="the restarted operator to reconcile",
            )  # fmt: skip
            time.sleep(3)
            assert versions(kubectl, namespace, "whisper-split") == before
            assert second.writes() == 0
        finally:
            second.stop()
    finally:
        first.stop()
        operator.start()


def test_namespaced_operator_ignores_other_namespaces(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, cluster: Path, tmp_path: Path
) -> None:
    operator.stop()
    scoped = OperatorProcess(cluster, tmp_path / "scoped.log", ["--namespace", "elsewhere"])
    scoped.start()
    try:
        kubectl.apply(SAMPLES["vllm-gpu"], namespace)
        time.sleep(5)
        assert not children(kubectl, namespace, "whisper")
        # Untouched: only the CRD's default status (observedGeneration 0, no conditions).
        assert td_get(kubectl, namespace, "whisper").get("status") == {"observedGeneration": 0}
    finally:
        scoped.stop()
        operator.start()
    wait_ready(kubectl, namespace, "whisper")


def test_operator_killed_mid_reconcile_converges_without_duplicates(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, cluster: Path, tmp_path: Path
) -> None:
    operator.stop()
    first = OperatorProcess(cluster, tmp_path / "killed.log", ["--namespace", namespace])
    first.start()
    # Kill it hard the moment its first child (a ServiceAccount: the first in apply order)
    # appears on a watch, long before its dozen children are all applied.
    watch = subprocess.Popen(
        [kubectl.binary, "--kubeconfig", str(kubectl.kubeconfig), "get", CHILDREN[0].plural,
         "-n", namespace, "-l", "app.kubernetes.io/instance=whisper-split", "--watch", "-o", "name"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        kubectl.apply(SAMPLES["auto-split"], namespace)
        assert watch.stdout is not None
        assert watch.stdout.readline().strip(), "the operator created no child"
        assert first.proc is not None
        first.proc.kill()
    finally:
        watch.kill()
        watch.wait()
    first.proc.wait()
    first.log.close()
    first.proc = None
    partial = children(kubectl, namespace, "whisper-split")
    second = OperatorProcess(cluster, tmp_path / "second.log", ["--namespace", namespace])
    second.start()
    try:
        wait_ready(kubectl, namespace, "whisper-split")
        kids = children(kubectl, namespace, "whisper-split")
        assert set(partial) <= set(kids)
        # Exactly the desired children, once each: names are deterministic, applies idempotent.
        td = TranscriptionDeployment.model_validate(td_get(kubectl, namespace, "whisper-split"))
        expected = {(m["kind"], m["metadata"]["name"]) for m in build(td, OperatorConfig())}
        # The kill left a partial state (else this test would show nothing)...
        assert partial and set(partial) < expected, sorted(partial)
        # ...which the second operator completed.
        assert set(kids) == expected
        rs = kubectl.json("get", "replicasets", "-n", namespace)["items"]
        assert len(rs) == 3  # one ReplicaSet per Deployment: no template churn
    finally:
        second.stop()
        operator.start()
