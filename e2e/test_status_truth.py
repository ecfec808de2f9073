"""Status tells the truth, and admission refuses what can never run -- on the test bed.

- The real scheduler refuses a pool no node can hold: status carries its message (Ready's
  reason and message, the pool's notReady, the REASON column, an Event).
- A pool (or frontend) with no replicas is not Ready: NoCapacity.
- `AutoSplit` says Disabled when the split is off.
- The CRD refuses engine flags the operator manages; the chart's admission policy warns
  about translations on `.en` models and GPU counts that do not divide the heads, and
  status reports the same findings. Every message is checked as kubectl prints it.
- On the test bed's real node (kubelet + containerd) an image that cannot be pulled, a
  worker that crash-loops and one that runs out of memory are reported in the kubelet's
  words. Those tests skip, saying why, where the test bed runs without its real node
  (TESTBED_REAL_NODE=0, or a second cluster on a machine whose real node another owns).
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest
import yaml

from testbed import images
from testbed.kube import SAMPLES, condition, td_get, wait_for
from testbed.kubectl import Kubectl
from transcription_api.findings import POLICY_NAME, POLICY_PATH, findings
from transcription_api.v1alpha1 import TranscriptionDeploymentSpec

pytestmark = pytest.mark.usefixtures("operator")


def td(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "transcription.dev/v1alpha1", "kind": "TranscriptionDeployment",
            "metadata": {"name": name}, "spec": spec}  # fmt: skip


def wait_reason(
    kubectl: Kubectl, ns: str, name: str, reason: str, timeout: float = 60
) -> dict[str, Any]:
    """The resource once Ready's reason (for the current generation) is `reason`."""

    def check() -> dict[str, Any] | None:
        obj = td_get(kubectl, ns, name)
        st = obj.get("status") or {}
        current = st.get("observedGeneration") == obj["metadata"]["generation"]
        return obj if current and condition(obj, "Ready").get("reason") == reason else None

    def last() -> str:
        return json.dumps(condition(td_get(kubectl, ns, name), "Ready"))

    try:
        result: dict[str, Any] = wait_for(
            check, timeout=timeout, what=f"{ns}/{name} Ready reason {reason}"
        )
    except AssertionError as e:
        raise AssertionError(f"{e}; Ready is {last()}") from None
    # What a user sees (pytest -s shows it; the README's examples come from these lines).
    print(f"\n[status] {name}: Ready={reason}: {condition(result, 'Ready').get('message')}")
    return result


def events(kubectl: Kubectl, ns: str, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl.json(
        "get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return items


def get_row(kubectl: Kubectl, ns: str, name: str) -> dict[str, str]:
    """`kubectl get tdeploy` as a user sees it: header -> value."""
    out = kubectl("get", "tdeploy", name, "-n", ns).splitlines()
    return dict(zip(out[0].split(), out[1].split(), strict=True))


# --------------------------------------------------------------------------- not ready: why

GPU_POOL = {"name": "huge", "replicas": 1, "resources": {"gpus": 5}}  # 5 divides large's 20 heads


def test_a_pool_no_node_can_hold_says_what_the_scheduler_said(
    kubectl: Kubectl, namespace: str
) -> None:
    doc = copy.deepcopy(SAMPLES["vllm-gpu"])
    doc["spec"]["pools"] = [GPU_POOL]
    kubectl.apply(doc, namespace)
    obj = wait_reason(kubectl, namespace, "whisper", "Unschedulable")

    ready = condition(obj, "Ready")
    prefix = r"waiting for pool huge 0/1 ready, 1 pod Unschedulable: 0/\d nodes are available: "
    assert ready["status"] == "False" and re.match(prefix, ready["message"]), ready["message"]
    assert "Insufficient nvidia.com/gpu" in ready["message"]
    # Capacity may still come (an autoscaler): the rollout is in progress, not failed.
    assert condition(obj, "Progressing")["status"] == "True"
    assert condition(obj, "Degraded")["status"] == "False"
    pool = obj["status"]["pools"][0]
    assert pool["notReady"]["reason"] == "Unschedulable" and pool["notReady"]["pods"] == 1
    assert re.match(r"0/\d nodes are available: ", pool["notReady"]["message"])
    # The scheduler's own Event says the same thing: status quotes it word for word.
    pod = kubectl.json("get", "pods", "-n", namespace, "-l", "transcription.dev/pool=huge")[
        "items"
    ][0]
    scheduler = [
        e
        for e in events(kubectl, namespace, pod["metadata"]["name"])
        if e["reason"] == "FailedScheduling"
    ]
    assert scheduler and scheduler[-1]["message"] == pool["notReady"]["message"]

    row = get_row(kubectl, namespace, "whisper")
    assert (row["READY"], row["REASON"], row["POOLS"], row["REPLICAS"]) == (
        "False",
        "Unschedulable",
        "0/1",
        "0/1",
    )
    posted = [e for e in events(kubectl, namespace, "whisper") if e["reason"] == "Unschedulable"]
    assert [(e["type"], e["message"]) for e in posted] == [("Warning", f"pool huge: 1 pod Unschedulable: {pool['notReady']['message']}")]  # fmt: skip

    # Asking for what a node has makes it Ready, and says so.
    doc["spec"]["pools"][0]["resources"]["gpus"] = 2
    kubectl.apply(doc, namespace)
    obj = wait_reason(kubectl, namespace, "whisper", "Ready", timeout=90)
    assert "notReady" not in obj["status"]["pools"][0]
    wait_for(lambda: any(e["reason"] == "Ready" for e in events(kubectl, namespace, "whisper")),
             timeout=30, what="the Ready Event")  # fmt: skip


def test_no_replicas_is_not_ready_no_capacity(kubectl: Kubectl, namespace: str) -> None:
    doc = copy.deepcopy(SAMPLES["vllm-gpu"])
    doc["spec"]["pools"][0]["replicas"] = 0
    kubectl.apply(doc, namespace)
    wait_reason(kubectl, namespace, "whisper", "NoCapacity")
    message = (
        "no replica can serve transcriptions, translations: pool batch has 0 replicas; "
        "scale up spec.pools[].replicas"
    )
    # Once the frontend is up, that is all Ready has to say.
    wait_for(lambda: condition(td_get(kubectl, namespace, "whisper"), "Ready")["message"] == message,
             timeout=30, what="Ready's message to be only NoCapacity")  # fmt: skip
    obj = td_get(kubectl, namespace, "whisper")
    assert (condition(obj, "Degraded")["status"], condition(obj, "Stalled")["status"]) == (
        "True",
        "True",
    )
    row = get_row(kubectl, namespace, "whisper")
    assert (row["READY"], row["REASON"], row["POOLS"], row["REPLICAS"]) == (
        "False",
        "NoCapacity",
        "1/1",
        "0/0",
    )
    wait_for(lambda: [(e["type"], e["message"]) for e in events(kubectl, namespace, "whisper") if e["reason"] == "NoCapacity"]
             == [("Warning", message)], timeout=30, what="the NoCapacity Event")  # fmt: skip

    doc["spec"]["pools"][0]["replicas"] = 1
    kubectl.apply(doc, namespace)
    wait_reason(kubectl, namespace, "whisper", "Ready", timeout=90)
    assert get_row(kubectl, namespace, "whisper")["REPLICAS"] == "1/1"


def test_auto_split_disabled_is_reported_as_disabled(kubectl: Kubectl, namespace: str) -> None:
    # transformers serves no translations: with the split off, nothing covers them.
    spec = {"model": {"name": "m"}, "engine": "transformers", "autoSplit": {"enabled": False},
            "traffic": {"endpoints": ["transcriptions", "translations"]}}  # fmt: skip
    kubectl.apply(td("chat", spec), namespace)
    obj = wait_reason(kubectl, namespace, "chat", "TrafficNotCovered")
    c = condition(obj, "AutoSplit")
    assert (c["status"], c["reason"], c["message"]) == (
        "False", "Disabled",
        "spec.autoSplit.enabled is false; no declared pool serves translations (see Degraded)",
    )  # fmt: skip


def test_the_added_pool_says_what_it_requests(kubectl: Kubectl, namespace: str) -> None:
    doc = copy.deepcopy(SAMPLES["auto-split"])
    doc["spec"]["pools"][0] |= {
        "replicas": 1,
        "resources": {"gpus": 2, "cpu": "8", "memory": "32Gi"},
    }
    kubectl.apply(doc, namespace)
    obj = wait_reason(kubectl, namespace, "whisper-split", "Ready", timeout=90)
    message = (
        "added pool auto-faster-whisper (faster-whisper, sequential) for transcriptions, "
        "word_timestamps: 1 replica, each requesting 1 nvidia.com/gpu, 8 CPU, 32Gi memory"
    )
    assert condition(obj, "AutoSplit")["message"] == message
    auto = next(p for p in obj["status"]["pools"] if p["automatic"])
    assert auto["resources"] == {
        "gpus": 1,
        "cpu": "8",
        "memory": "32Gi",
        "gpuResourceName": "nvidia.com/gpu",
    }
    dep = kubectl.json("get", "deployment", "whisper-split-auto-faster-whisper", "-n", namespace)
    assert (
        dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]
        == "1"
    )
    posted = [
        e["message"]
        for e in events(kubectl, namespace, "whisper-split")
        if e["reason"] == "SequentialPoolAdded"
    ]
    assert posted == [message]


# --------------------------------------------------------------------------- admission

REFUSED = [
    (["--port=9000"], "engineArgs must not set --port: the operator sets it (workers listen on 8000); the port clients use is spec.frontend.service.port"),
    (["--tensor-parallel-size", "2"], "engineArgs must not set --tensor-parallel-size: it is derived from spec.pools[].resources.gpus"),
    (["--max_num_seqs=8"], "engineArgs must not set --max-num-seqs: it is derived from spec.pools[].mode (sequential sets 1)"),
    (["--served-model-name=x"], "engineArgs must not set --served-model-name: it is derived from spec.model.name and spec.model.aliases"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), REFUSED, ids=[a[0] for a, _ in REFUSED])
def test_managed_engine_flags_are_refused_naming_the_field(
    kubectl: Kubectl, namespace: str, args: list[str], message: str
) -> None:
    doc = td("bad", {"model": {"name": "m"}, "pools": [{"name": "a", "engineArgs": ["--enforce-eager", *args]}]})  # fmt: skip
    proc = kubectl.run("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc), check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip() == (
        f'The TranscriptionDeployment "bad" is invalid: spec.pools[0].engineArgs: Invalid value: {message}'
    ), proc.stderr
    # Nothing was created, and a fixed spec goes through.
    assert kubectl.run("get", "tdeploy", "bad", "-n", namespace, check=False).returncode != 0
    doc["spec"]["pools"][0]["engineArgs"] = ["--enforce-eager"]
    kubectl.apply(doc, namespace)


@pytest.fixture(scope="module")
def warn_policy(kubectl: Kubectl) -> Any:
    """The chart's ValidatingAdmissionPolicy (applied as the chart renders it)."""
    kubectl("apply", "-f", str(POLICY_PATH))
    # The API server compiles a new policy asynchronously; wait until it warns.
    probe = td("probe", {"model": {"name": "openai/whisper-tiny.en"}, "traffic": {"endpoints": ["translations"]}})  # fmt: skip
    wait_for(lambda: "Warning:" in kubectl.run("apply", "--dry-run=server", "-n", "default", "-f", "-",
                                                input=yaml.safe_dump(probe), check=False).stderr,
             timeout=60, what="the admission policy to take effect")  # fmt: skip
    yield
    kubectl.run("delete", "-f", str(POLICY_PATH), "--ignore-not-found", check=False)


WARNED = [
    ({"model": {"name": "openai/whisper-small.en"}, "traffic": {"endpoints": ["transcriptions", "translations"]}},
     "EnglishOnlyModel"),
    ({"model": {"name": "openai/whisper-large-v3"}, "pools": [{"name": "tp3", "resources": {"gpus": 3}}]},
     "GPUsDoNotDivideHeads"),
]  # fmt: skip


@pytest.mark.parametrize(("spec", "reason"), WARNED, ids=[r for _, r in WARNED])
def test_likely_mistakes_are_warned_at_apply_and_reported_in_status(
    kubectl: Kubectl, namespace: str, warn_policy: None, spec: dict[str, Any], reason: str
) -> None:
    [(expected_reason, message)] = findings(TranscriptionDeploymentSpec.model_validate(spec))
    assert expected_reason == reason
    proc = kubectl.run("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(td("w", spec)))
    assert proc.returncode == 0  # a warning, not a refusal
    assert proc.stderr.strip() == (
        f"Warning: Validation failed for ValidatingAdmissionPolicy '{POLICY_NAME}' with binding "
        f"'{POLICY_NAME}': {message}"
    ), proc.stderr
    # The operator reports the same finding: a policy can be absent.
    obj = wait_reason(kubectl, namespace, "w", reason)
    assert condition(obj, "Degraded")["message"] == message


def test_a_spec_without_findings_gets_no_warning(
    kubectl: Kubectl, namespace: str, warn_policy: None
) -> None:
    doc = copy.deepcopy(SAMPLES["vllm-gpu"])
    doc["spec"]["pools"][0]["resources"]["gpus"] = 2
    proc = kubectl.run("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(doc))
    assert proc.stderr.strip() == ""


# --------------------------------------------------------------------------- on a real node


def cpu_worker(node: str, worker: str, path: str, **pool: Any) -> dict[str, Any]:
    """A CPU pool pinned to the real node, with the images the node holds (it reaches no
    registry); one frontend replica, small, next to it."""
    return td("real", {
        "model": {"name": "whisper-tiny.en", "source": "image", "path": path},
        "engine": "faster-whisper",
        "pools": [{"name": "cpu", "replicas": 1, "nodeSelector": {"kubernetes.io/hostname": node}} | pool],
        "images": {"fasterWhisper": worker, "frontend": images.refs()["frontend"], "pullPolicy": "IfNotPresent"},
        "frontend": {"replicas": 1, "resources": {"cpu": "100m", "memory": "256Mi"}},
    })  # fmt: skip


def test_an_image_that_cannot_be_pulled(
    kubectl: Kubectl, real_namespace: str, real_node: str
) -> None:
    image = "registry.invalid/transcription/worker-cpu:0.0.0"
    kubectl.apply(cpu_worker(real_node, image, "/models/whisper-tiny.en"), real_namespace)
    obj = wait_reason(kubectl, real_namespace, "real", "ImagePullBackOff", timeout=120)
    nr = obj["status"]["pools"][0]["notReady"]
    assert nr["message"].startswith(f'container engine cannot pull image "{image}": '), nr
    assert len(nr["message"]) > len(f'container engine cannot pull image "{image}": '), (
        nr
    )  # the runtime's error
    assert condition(obj, "Degraded")["reason"] == "ImagePullBackOff"
    assert get_row(kubectl, real_namespace, "real")["REASON"] == "ImagePullBackOff"
    # The reconcile posts its Events after the status it patched: wait for them too.
    wait_for(lambda: [e["type"] for e in events(kubectl, real_namespace, "real")
                      if e["reason"] == "ImagePullBackOff"] == ["Warning"],
             timeout=30, what="one ImagePullBackOff Warning Event")  # fmt: skip


def test_a_worker_that_crash_loops_shows_its_last_words(
    kubectl: Kubectl, real_namespace: str, real_node: str
) -> None:
    # A model directory the image does not have: the worker exits with an error.
    kubectl.apply(
        cpu_worker(real_node, images.refs()["worker-cpu"], "/models/not-there"), real_namespace
    )
    obj = wait_reason(kubectl, real_namespace, "real", "CrashLoopBackOff", timeout=180)
    nr = obj["status"]["pools"][0]["notReady"]
    assert nr["message"].startswith("container engine keeps exiting (exit code "), nr
    assert "): " in nr["message"], nr  # the end of its log (FallbackToLogsOnError)
    assert condition(obj, "Degraded")["reason"] == "CrashLoopBackOff"


def test_a_worker_killed_for_memory_says_oomkilled(
    kubectl: Kubectl, real_namespace: str, real_node: str
) -> None:
    worker = images.refs()["worker-cpu"]
    kubectl.apply(cpu_worker(real_node, worker, "/models/whisper-tiny.en", resources={"memory": "48Mi"}), real_namespace)  # fmt: skip
    obj = wait_reason(kubectl, real_namespace, "real", "OOMKilled", timeout=180)
    nr = obj["status"]["pools"][0]["notReady"]
    assert (
        nr["message"]
        == "container engine was killed for using more memory than its limit (48Mi); raise resources.memory"
    )


def test_a_frontend_whose_key_file_has_no_key_says_so_in_status(
    kubectl: Kubectl, real_namespace: str, real_node: str
) -> None:
    """The frontend fails closed on a key Secret without a key (not ready); its readiness
    probe says only "statuscode: 503", so the frontend posts a Warning Event about its pod,
    and the status names the cause in the frontend's words."""
    kubectl.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "keys"},
                   "stringData": {"keys": "# keys go here, one a line\n"}}, real_namespace)  # fmt: skip
    doc = cpu_worker(real_node, images.refs()["worker-cpu"], "/models/whisper-tiny.en")
    doc["spec"]["frontend"]["apiKeySecret"] = {"name": "keys", "key": "keys"}
    kubectl.apply(doc, real_namespace)
    obj = wait_reason(kubectl, real_namespace, "real", "APIKeysUnavailable", timeout=180)
    nr = obj["status"]["frontend"]["notReady"]
    assert nr["reason"] == "APIKeysUnavailable" and "has no key" in nr["message"], nr
    assert condition(obj, "Degraded")["reason"] == "APIKeysUnavailable"
