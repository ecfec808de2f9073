"""The demo (`make demo`): the whole path, on this machine, with real transcription.

1. brings up the local test bed: a real control plane, KWOK's simulated GPU nodes and one
   real node (kubelet, containerd, runc, kube-proxy), and builds the project's images,
2. installs the Helm chart: CRD, RBAC and the operator, which runs in the cluster from its
   image under the chart's ServiceAccount,
3. applies samples/cpu-faster-whisper.yaml in a namespace that enforces PodSecurity
   `restricted`; the operator creates the worker and frontend pods, which run on the real
   node and become Ready through their real probes,
4. transcribes a sentence spoken by espeak-ng with the OpenAI Python client through the
   frontend's Service (ClusterIP -> frontend pod -> worker pod), and prints the transcript,
   the resource's status and a few metrics.

`python -m testbed.demo down` (`make demo-down`) stops everything it started. The demo
needs no autoscaler: KEDA (the longest build after Kubernetes) is built and installed only
with `DEMO_SCALING=1` (`make demo SCALING=1`), or later by the first suite that needs it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from typing import Any

import yaml

import testbed.cluster
import toolchain
from testbed import images
from testbed.cluster import kubectl
from testbed.kube import ROOT

STATE = toolchain.CACHE / "demo"
NAMESPACE, SYSTEM_NS, RELEASE = "speech", "transcription-system", "transcription-operator"
SAMPLE = ROOT / "samples" / "cpu-faster-whisper.yaml"
SENTENCE = "Please send me the report before the end of the week."
STEPS = 4


def step(n: int, msg: str) -> None:
    print(f"\n\033[1m[{n}/{STEPS}] {msg}\033[0m", flush=True)


def wait_ready(name: str, timeout: float = 180) -> dict[str, Any]:
    deadline, last = time.monotonic() + timeout, ""
    while time.monotonic() < deadline:
        td = json.loads(kubectl("get", "tdeploy", name, "-n", NAMESPACE, "-o", "json"))
        conds = {c["type"]: c for c in (td.get("status") or {}).get("conditions", [])}
        ready = conds.get("Ready", {})
        line = (
            f"    Ready={ready.get('status', '?')} ({ready.get('reason', 'waiting for the operator')}) "
            f"{ready.get('message', '')}"
        )
        if line != last:
            print(line, flush=True)
            last = line
        if ready.get("status") == "True":
            return dict(td)
        time.sleep(1)
    raise SystemExit(
        f"{name} was not Ready after {timeout:.0f}s: kubectl describe tdeploy -n {NAMESPACE} {name}"
    )


def metric_lines(url: str, prefixes: tuple[str, ...]) -> list[str]:
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return [
        line
        for line in text.splitlines()
        if line.startswith(prefixes) and not line.endswith(" 0.0")
    ]


def namespace(name: str) -> None:
    kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))  # fmt: skip


def _adopt() -> list[str]:
    """On a test bed the e2e suite used, the CRD and the cluster's admission policy exist
    already, applied without Helm: use them instead of failing to adopt them."""
    out: list[str] = []
    for kind, name, value in (
        ("crd", "transcriptiondeployments.transcription.dev", "crds.install"),
        ("validatingadmissionpolicy", "transcriptiondeployments-warnings.transcription.dev",
         "admissionPolicy.enabled"),
    ):  # fmt: skip
        obj = kubectl("get", kind, name, "-o", "json", check=False)
        labels = (json.loads(obj)["metadata"].get("labels") or {}) if obj else {}
        if obj and labels.get("app.kubernetes.io/managed-by") != "Helm":
            out += ["--set", f"{value}=false"]
    return out


def up() -> int:
    scaling = os.environ.get("DEMO_SCALING") == "1"
    step(1, "local Kubernetes test bed with a real node (the first run compiles binaries and "
            "builds images: about 20 minutes on 2 cores, then cached)"
            + ("" if scaling else "; without KEDA (make demo SCALING=1 adds it)"))  # fmt: skip
    testbed.cluster.up(scaling=scaling)
    refs = images.refs()

    step(2, "Helm chart: CRD, RBAC, and the operator running in the cluster from its image")
    namespace(SYSTEM_NS)
    repo, tag = refs["operator"].rsplit(":", 1)
    out = subprocess.run([str(toolchain.HELM.path("helm")), "upgrade", "--install", RELEASE, str(ROOT / "charts" / RELEASE),
                          "-n", SYSTEM_NS, "--wait", "--timeout", "3m", "--kubeconfig", str(testbed.cluster.KUBECONFIG),
                          "--set", f"image.repository={repo}", "--set", f"image.tag={tag}",
                          "--set", "image.pullPolicy=Never",
                          "--set", f"defaultImages.frontend={refs['frontend']}",
                          "--set", f"defaultImages.fasterWhisper={refs['worker-cpu']}",
                          "--set", "defaultImages.pullPolicy=Never", *_adopt()],
                         capture_output=True, text=True)  # fmt: skip
    if out.returncode:
        raise SystemExit(f"helm install failed: {out.stderr}")
    print(kubectl("get", "pods", "-n", SYSTEM_NS, "-o", "wide"))

    step(3, f"apply {SAMPLE.relative_to(ROOT)} in namespace {NAMESPACE} (PodSecurity: restricted)")
    namespace(NAMESPACE)
    kubectl("apply", "-n", NAMESPACE, "-f", str(SAMPLE))
    name = yaml.safe_load(SAMPLE.read_text())["metadata"]["name"]
    wait_ready(name, timeout=600)
    print(kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide"))

    step(4, "transcribe with the OpenAI Python client: Service -> frontend pod -> worker pod")
    from openai import OpenAI

    from testkit.audio import speak, wer

    svc = json.loads(kubectl("get", "service", name, "-n", NAMESPACE, "-o", "json"))
    base = f"http://{svc['spec']['clusterIP']}:{svc['spec']['ports'][0]['port']}"
    wav = speak(SENTENCE, STATE / "audio")
    client = OpenAI(base_url=f"{base}/v1", api_key="demo", timeout=120)
    start = time.monotonic()
    with wav.open("rb") as f:
        result = client.audio.transcriptions.create(model="whisper-1", file=f)
    took = time.monotonic() - start
    print(f"    through:    Service {NAMESPACE}/{name} at {base} (ClusterIP, kube-proxy)")
    print(f"    spoken:     {SENTENCE}")
    print(f"    transcript: {result.text.strip()}")
    print(f"    word error rate {wer(SENTENCE, result.text):.0%}, {took:.2f}s")
    print(f"\n$ kubectl get tdeploy -n {NAMESPACE} -o wide")
    print(kubectl("get", "tdeploy", "-n", NAMESPACE, "-o", "wide"))
    pods = json.loads(kubectl("get", "pods", "-n", NAMESPACE, "-o", "json"))["items"]
    ips = {
        p["metadata"]["labels"].get("app.kubernetes.io/component"): p["status"].get("podIP")
        for p in pods
    }
    print("metrics:")
    for line in metric_lines(f"http://{ips['frontend']}:8080/metrics",
                             ("transcription_frontend_requests_total", "transcription_frontend_worker_requests_total")):  # fmt: skip
        print(f"    frontend pod {line}")
    for line in metric_lines(f"http://{ips['worker']}:8000/metrics",
                             ("vllm:e2e_request_latency_seconds_sum", "vllm:request_success_total")):  # fmt: skip
        print(f"    worker pod   {line}")
    print(f"\nStill running on the test bed: KUBECONFIG={testbed.cluster.KUBECONFIG}\n"
          f"Try: curl {base}/v1/audio/transcriptions -F model=whisper-1 -F response_format=srt -F file=@{wav}\n"
          f"Stop everything: make demo-down")  # fmt: skip
    return 0


def down() -> int:
    testbed.cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(down() if sys.argv[1:] == ["down"] else up())
