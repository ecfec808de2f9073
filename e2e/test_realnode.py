"""What the operator deploys, running for real on the test bed's real node.

The chart installs the operator from its image (built here from operator/Dockerfile); it
runs in the cluster under its ServiceAccount and turns samples/cpu-faster-whisper.yaml into
worker and frontend pods built from the project's Dockerfiles, in a namespace that enforces
PodSecurity `restricted`. Real probes make them Ready; the official OpenAI client
transcribes espeak-ng speech through the frontend's Service (ClusterIP, through kube-proxy,
and `kubectl port-forward`); the containers are checked against what the operator's pure
`build()` says they should run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

import testbed.cluster
from testbed import images
from testbed.kube import SAMPLES, wait_for, wait_ready
from testbed.kubectl import Kubectl
from testbed.netpol import ALLOWED, LISTEN_PORT, REFUSED, matrix, mismatches, probe, start_probes
from testbed.operators import deployed_on_the_real_node
from testkit.audio import SENTENCES, wer
from testkit.longaudio import long_recording
from testkit.otlp import Collector, tree
from testkit.realtime import conversation, pcm, transcribe_turns, transcripts
from testkit.scrape import pods_metric
from testkit.transcripts import billed, client, report, transcribe, transcribe_all
from transcription_api.v1alpha1 import TranscriptionDeployment
from transcription_operator.children import build
from transcription_operator.config import OperatorConfig

NAME = "whisper-cpu"
POOL = "cpu"
RELEASE = "realnode-operator"
REFS = images.refs()
# The sample asks for 1 CPU per worker; the real node has 2 cores in all, and this suite
# scales the pool to 2 replicas next to the frontend and the operator.
WORKER_CPU = "500m"


@dataclass
class Stack:
    kubectl: Kubectl
    namespace: str
    system_namespace: str
    release: str

    def pods(self, component: str) -> list[dict[str, Any]]:
        return self.kubectl.pods(self.namespace, NAME, component)

    def service_url(self) -> str:
        return self.kubectl.service_url(self.namespace, NAME)


def resource() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(json.dumps(SAMPLES["cpu-faster-whisper"]))
    doc["spec"]["pools"][0]["resources"]["cpu"] = WORKER_CPU
    return doc


@pytest.fixture(scope="module")
def stack(kubectl: Kubectl, cluster: Path, real_node: str, crd_installed: None) -> Iterator[Stack]:
    # Real pods: the worker loads Whisper before its startup probe passes.
    with deployed_on_the_real_node(kubectl, cluster, resource(), "r", RELEASE, timeout=300) as (
        ns, system_ns, release,
    ):  # fmt: skip
        yield Stack(kubectl, ns, system_ns, release)


def test_operator_runs_in_the_cluster_from_its_image(stack: Stack, real_node: str) -> None:
    pods = stack.kubectl.json(
        "get", "pods", "-n", stack.system_namespace, "-l", "app.kubernetes.io/name=transcription-operator"
    )["items"]  # fmt: skip
    # The chart's default: a leader and a hot standby (one real node: both on it).
    assert len(pods) == 2
    for pod in pods:
        assert pod["spec"]["nodeName"] == real_node
        # The chart's ServiceAccount (named after the chart's fullname).
        assert pod["spec"]["serviceAccountName"] == f"{stack.release}-transcription-operator"
        status = pod["status"]["containerStatuses"][0]
        assert status["ready"] and status["image"].endswith(REFS["operator"].split("/", 1)[1])
    # The leader is the pod the Lease names (identity: the pod's name, from the downward API).
    lease = stack.kubectl.json(
        "get", "lease", f"{stack.release}-transcription-operator", "-n", stack.system_namespace
    )
    names = {p["metadata"]["name"] for p in pods}
    leader = lease["spec"]["holderIdentity"]
    assert leader in names
    [standby] = names - {leader}
    # It reconciled the sample under its own ServiceAccount: the children carry its field
    # manager, and the status it wrote says Ready for the current generation.
    td = stack.kubectl.json("get", "tdeploy", NAME, "-n", stack.namespace)
    assert td["status"]["observedGeneration"] == td["metadata"]["generation"]
    for name in names:
        logs = stack.kubectl("logs", "-n", stack.system_namespace, name)
        assert f"watching {stack.namespace}" in logs
        assert "forbidden" not in logs.lower()
        assert ("became the leader" in logs) == (name == leader), name
    standby_logs = stack.kubectl("logs", "-n", stack.system_namespace, standby)
    assert f"is held by {leader}: standing by" in standby_logs


def test_worker_and_frontend_pods_run_on_the_real_node(stack: Stack, real_node: str) -> None:
    for component in ("worker", "frontend"):
        pods = stack.pods(component)
        assert pods, component
        for pod in pods:
            assert pod["spec"]["nodeName"] == real_node
            assert pod["status"]["phase"] == "Running"
            assert all(c["ready"] for c in pod["status"]["containerStatuses"])
            # An IP from the test bed's pod network, not a KWOK-invented one.
            assert pod["status"]["podIP"].startswith("10.244.")


def container_spec(stack: Stack, pod: dict[str, Any]) -> dict[str, Any]:
    """The OCI runtime spec containerd runs the pod's first container with."""
    cid = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    info = testbed.cluster.node().ctr("containers", "info", cid)
    assert info is not None
    spec: dict[str, Any] = json.loads(info)["Spec"]
    return spec


def test_containers_run_exactly_what_the_operator_generated(stack: Stack) -> None:
    td = TranscriptionDeployment.model_validate(
        stack.kubectl.json("get", "tdeploy", NAME, "-n", stack.namespace)
    )
    cfg = OperatorConfig(images={**OperatorConfig().images, "frontend": REFS["frontend"],
                                 "faster-whisper": REFS["worker-cpu"]}, pull_policy="Never")  # fmt: skip
    wanted = {m["metadata"]["name"]: m for m in build(td, cfg)}
    image_entrypoints = {"worker": ["transcription-worker"], "frontend": ["transcription-frontend"]}
    for component, name in (("worker", f"{NAME}-{POOL}"), ("frontend", f"{NAME}-frontend")):
        container = wanted[name]["spec"]["template"]["spec"]["containers"][0]
        for pod in stack.pods(component):
            spec = container_spec(stack, pod)
            # image: what containerd resolved, the reference the operator wrote
            status = pod["status"]["containerStatuses"][0]
            assert status["image"].split("/", 1)[1] == container["image"].split("/", 1)[1]
            # command and arguments: the image's entrypoint + the operator's args
            args = spec["process"]["args"]
            assert Path(args[0]).name == image_entrypoints[component][0], args
            assert args[1:] == container.get("args", []), args
            # environment: every variable the operator set, with its value
            env = dict(e.split("=", 1) for e in spec["process"]["env"])
            for var in container.get("env", []):
                if "value" in var:
                    assert env.get(var["name"]) == var["value"], var["name"]
                else:  # valueFrom: resolved by the kubelet
                    assert var["name"] in env, var["name"]
            # volumes: every mount the operator asked for, at its path, read-only where asked
            mounts = {m["destination"]: m for m in spec["mounts"]}
            for vm in container.get("volumeMounts", []):
                assert vm["mountPath"] in mounts, vm
                if vm.get("readOnly"):
                    assert "ro" in mounts[vm["mountPath"]]["options"], vm
    # The route table the frontend reads is the one the operator generated.
    frontend = stack.pods("frontend")[0]
    mounted = stack.kubectl("exec", "-n", stack.namespace, frontend["metadata"]["name"], "--",
                            "cat", "/etc/transcription/routes.json")  # fmt: skip
    generated = wanted[f"{NAME}-routes"]["data"]["routes.json"]
    assert json.loads(mounted) == json.loads(generated)
    # The worker's settings, as the launcher reads them.
    worker = stack.pods("worker")[0]
    settings = stack.kubectl("exec", "-n", stack.namespace, worker["metadata"]["name"], "--",
                             "printenv", "TRANSCRIPTION_WORKER_SETTINGS")  # fmt: skip
    expected = next(
        e["value"]
        for e in wanted[f"{NAME}-{POOL}"]["spec"]["template"]["spec"]["containers"][0]["env"]
        if e["name"] == "TRANSCRIPTION_WORKER_SETTINGS"
    )
    assert json.loads(settings) == json.loads(expected)


def test_openai_client_transcribes_through_the_cluster_ip(
    stack: Stack, speech: dict[str, Path]
) -> None:
    """Client -> Service ClusterIP (kube-proxy's rules) -> frontend pod -> worker pod."""
    report("ClusterIP", transcribe_all(stack.service_url(), speech))


@pytest.fixture
def port_forward(stack: Stack) -> Iterator[str]:
    proc = subprocess.Popen(
        [stack.kubectl.binary, "--kubeconfig", str(stack.kubectl.kubeconfig), "port-forward",
         "-n", stack.namespace, f"service/{NAME}", ":80"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert match, (
            f"kubectl port-forward said {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
        )  # type: ignore[union-attr]
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_openai_client_transcribes_through_port_forward(
    port_forward: str, speech: dict[str, Path]
) -> None:
    """Client -> kubectl port-forward (API server -> kubelet -> containerd) -> frontend pod."""
    report("port-forward", transcribe_all(port_forward, speech))


WORKER_REQUESTS = "transcription_frontend_worker_requests_total"


def frontend_metrics(stack: Stack, name: str, *keys: str) -> dict[tuple[str, ...], float]:
    """One counter summed over the frontend pods, by the values of the labels `keys`."""
    return pods_metric(stack.pods("frontend"), name, *keys)


def test_the_seconds_of_audio_are_the_usage_and_are_metered(
    stack: Stack, speech: dict[str, Path]
) -> None:
    """The faster-whisper worker's json, verbose_json and stream all report the audio's
    seconds, and the frontends count them per model (no API keys here: key="none")."""
    metric = "transcription_frontend_audio_seconds_total"
    before = sum(frontend_metrics(stack, metric).values())
    c = client(stack.service_url())
    wavs = list(speech.values())[:2]
    for wav in wavs:
        for fmt in ("json", "verbose_json"):
            transcribe(c, wav, fmt)  # each checks its usage
    after = frontend_metrics(stack, metric, "model", "key")
    model = resource()["spec"]["model"]["name"]
    assert after and set(after) == {(model, "none")}, after
    assert sum(after.values()) - before == 2 * sum(billed(w) for w in wavs), after


def test_languages_name_the_audios_language_and_refuse_what_tiny_en_cannot_produce(
    stack: Stack, speech: dict[str, Path]
) -> None:
    c = client(stack.service_url())
    sentence, wav = next(iter(speech.items()))
    with wav.open("rb") as f:
        out = c.audio.transcriptions.create(
            model="whisper-1", file=f, extra_body={"languages": ["en"]}
        )
    assert out.languages is not None and [lang.code for lang in out.languages] == ["en"]
    assert wer(sentence, out.text) <= 0.25, out.text
    for languages in (["de"], ["en", "de"]):
        with wav.open("rb") as f, pytest.raises(openai.BadRequestError) as e:
            c.audio.transcriptions.create(
                model="whisper-1", file=f, extra_body={"languages": languages}
            )
        assert "English-only" in str(e.value) and "de" in str(e.value), e.value


def test_keywords_reach_the_worker_and_are_recognised(
    stack: Stack, speech: dict[str, Path]
) -> None:
    c = client(stack.service_url())
    for sentence, wav in speech.items():
        keywords = [w for w in sentence.rstrip(".").split() if len(w) > 6][:2]
        with wav.open("rb") as f:
            out = c.audio.transcriptions.create(
                model="whisper-1", file=f, extra_body={"keywords": keywords}
            )
        assert wer(sentence, out.text) <= 0.25, (keywords, out.text)
        assert all(k.lower() in out.text.lower() for k in keywords), (keywords, out.text)


def test_logprobs_are_the_transcripts_tokens(stack: Stack, speech: dict[str, Path]) -> None:
    c = client(stack.service_url())
    sentence, wav = next(iter(speech.items()))
    with wav.open("rb") as f:
        out = c.audio.transcriptions.create(model="whisper-1", file=f, include=["logprobs"])
    assert out.logprobs, out
    assert "".join(lp.token or "" for lp in out.logprobs).strip() == out.text.strip()
    assert all(lp.logprob is not None and lp.logprob <= 0 for lp in out.logprobs)
    assert wer(sentence, out.text) <= 0.25, out.text
    with wav.open("rb") as f:
        events = list(c.audio.transcriptions.create(
            model="whisper-1", file=f, include=["logprobs"], stream=True))  # fmt: skip
    done = events[-1]
    assert done.type == "transcript.text.done" and done.logprobs, done
    assert "".join(lp.token or "" for lp in done.logprobs) == done.text


def test_scaling_the_pool_spreads_requests_over_both_pods(
    stack: Stack, speech: dict[str, Path]
) -> None:
    doc = resource()
    doc["spec"]["pools"][0]["replicas"] = 2
    stack.kubectl.apply(doc, stack.namespace)
    wait_ready(stack.kubectl, stack.namespace, NAME, timeout=300)

    def two_ready() -> list[dict[str, Any]] | None:
        pods = stack.pods("worker")
        statuses = [c for p in pods for c in p["status"].get("containerStatuses", [])]
        return pods if len(pods) == 2 and all(c["ready"] for c in statuses) else None

    pods = wait_for(two_ready, timeout=120, what="two ready worker pods")
    names = {p["metadata"]["name"] for p in pods}
    before = frontend_metrics(stack, WORKER_REQUESTS, "worker")
    url = stack.service_url()
    sentence, wav = next(iter(speech.items()))
    audio = wav.read_bytes()

    def one(_: int) -> str:
        r = httpx.post(f"{url}/v1/audio/transcriptions", timeout=120,
                       data={"model": "whisper-1"}, files={"file": ("a.wav", audio, "audio/wav")})  # fmt: skip
        r.raise_for_status()
        return str(r.json()["text"])

    # Time for the frontend to see the second endpoint in the EndpointSlice.
    time.sleep(2)
    with ThreadPoolExecutor(4) as pool:
        texts = list(pool.map(one, range(8)))
    assert all(wer(sentence, t) <= 0.25 for t in texts), texts
    after = frontend_metrics(stack, WORKER_REQUESTS, "worker")
    # The metric's `worker` label is the pod's name (the EndpointSlice's targetRef).
    served = {pod: v - before.get((pod,), 0.0) for (pod,), v in after.items()}
    print(f"\nrequests per worker pod: {served}")
    assert {pod for pod, n in served.items() if n > 0} == names, (served, names)


def test_realtime_sessions_transcribe_through_the_service(stack: Stack, tmp_path: Path) -> None:
    """OpenAI's realtime client on the frontend's Service (a WebSocket through kube-proxy):
    server VAD finds two turns in speech with pauses, and a manual commit is one turn;
    faster-whisper transcribes each."""
    texts = SENTENCES[:2]
    audio = conversation(texts, tmp_path)
    events = asyncio.run(transcribe_turns(stack.service_url(), audio, 2))
    got = transcripts(events)
    print(f"\nrealtime (server VAD) through the Service: {got}")
    assert len(got) == 2 and all(wer(t, g) <= 0.25 for t, g in zip(texts, got, strict=True)), got
    events = asyncio.run(transcribe_turns(stack.service_url(), pcm(texts[0], tmp_path), 1,
                                          vad=False))  # fmt: skip
    (got_one,) = transcripts(events)
    assert wer(texts[0], got_one) <= 0.25, got_one
    turns = frontend_metrics(stack, "transcription_frontend_realtime_turns_total", "outcome")
    assert turns.get(("completed",), 0) >= 3, turns


def test_long_audio_is_chunked_through_the_service(stack: Stack, tmp_path: Path) -> None:
    """A minute of speech with pauses and OpenAI's `chunking_strategy`, through the
    Service: cut on silence by the frontend, each chunk a request to the pool's worker,
    one answer stitched in every format the SDK asks for."""
    recording = long_recording(tmp_path, 60, sentences=SENTENCES, pause_range=(0.6, 1.2))
    c = client(stack.service_url())
    before = sum(frontend_metrics(stack, "transcription_frontend_chunked_requests_total").values())
    with recording.wav.open("rb") as f:
        verbose = c.audio.transcriptions.create(
            model="whisper-1", file=f, chunking_strategy="auto", response_format="verbose_json"
        )
    print(f"\nchunked through the Service: WER {wer(recording.text, verbose.text):.3f}")
    assert wer(recording.text, verbose.text) <= 0.15, verbose.text
    assert abs(verbose.duration - recording.seconds) < 0.5
    assert verbose.segments and verbose.segments[-1].end <= recording.seconds + 0.01
    with recording.wav.open("rb") as f:
        srt = str(c.audio.transcriptions.create(model="whisper-1", file=f,
                                                chunking_strategy="auto", response_format="srt"))  # fmt: skip
    numbers = [int(n) for n in re.findall(r"^(\d+)\n\d\d:", srt, re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 2, srt
    after = sum(frontend_metrics(stack, "transcription_frontend_chunked_requests_total").values())
    assert after - before == 2


def test_a_trace_follows_a_request_from_the_frontend_into_the_worker(
    stack: Stack, speech: dict[str, Path]
) -> None:
    """spec.tracing on the real pods (issue 24): the frontends export their spans over
    OTLP/HTTP to a collector on this machine; a client's traceparent is continued, and the
    worker pod receives the `worker` span's traceparent (it logs it). Last in the module:
    it rolls the frontends."""
    collector = Collector("0.0.0.0", advertise=testbed.realnode.NODE_IP)
    try:
        # The suite's own resource (one worker: room on the 2-core node for the frontends'
        # surge pods, where a test before may have left two), with tracing on.
        doc = resource()
        doc["spec"]["tracing"] = {"endpoint": collector.url}
        stack.kubectl.apply(doc, stack.namespace)

        def traced() -> bool:  # every frontend pod, those terminating too (they may serve)
            pods = stack.kubectl.json("get", "pods", "-n", stack.namespace, "-l",
                                      "app.kubernetes.io/component=frontend")["items"]  # fmt: skip
            return bool(pods) and all(
                any(c.get("ready") for c in p["status"].get("containerStatuses", []))
                and any(e.get("name") == "OTEL_EXPORTER_OTLP_ENDPOINT" and e.get("value") == collector.url
                        for c in p["spec"]["containers"] for e in c.get("env", []))
                for p in pods
            )  # fmt: skip

        wait_for(traced, timeout=300, interval=2, what="frontends rolled with tracing on")
        trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
        parent = "00f067aa0ba902b7"
        c = client(stack.service_url())
        with next(iter(speech.values())).open("rb") as f:
            c.audio.transcriptions.create(model="whisper-1", file=f,
                                          extra_headers={"traceparent": f"00-{trace_id}-{parent}-01"})  # fmt: skip
        try:
            wait_for(lambda: collector.named("worker") and collector.trace(trace_id),
                     timeout=60, interval=1, what="the request's spans exported")  # fmt: skip
        except AssertionError as e:
            pod = stack.pods("frontend")[0]["metadata"]["name"]
            reach = stack.kubectl.run("exec", "-n", stack.namespace, pod, "--", "python", "-c",
                                      f"import urllib.request as u; print(u.urlopen('{collector.url}/', timeout=5).status)",
                                      check=False)  # fmt: skip
            logs = stack.kubectl.run("logs", "-n", stack.namespace, pod, check=False)
            raise AssertionError(
                f"{e}; {collector.requests} exports received; from {pod}: "
                f"{reach.stdout}{reach.stderr}; its log: {logs.stdout[-3000:]}"
            ) from e
        spans = collector.trace(trace_id)
        print(f"\none trace from the test bed, frontend to worker:\n{tree(spans)}")
        (root,) = [s for s in spans if s.parent_id == parent]
        assert root.kind == "server" and root.service, root
        names = {s.name for s in spans}
        assert {"receive", "parse", "route", "forward", "worker"} <= names, names
        (worker,) = [s for s in spans if s.name == "worker"]
        assert worker.attributes.get("transcription.pool") == POOL, worker.attributes
        logs = "".join(stack.kubectl("logs", "-n", stack.namespace, p["metadata"]["name"])
                       for p in stack.pods("worker"))  # fmt: skip
        assert f"traceparent=00-{trace_id}-{worker.span_id}-01" in logs, logs[-2000:]
    finally:
        collector.stop()


def _accept_until_closed(server: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while True:
            server.accept()[0].close()


def test_network_policies_are_enforced_on_the_real_node(stack: Stack) -> None:
    """kube-router enforces what the operator writes: only the deployment's frontend (and
    metrics scrapers) reach the workers, only its peers and KEDA reach the frontend's
    internal ports, clients reach its public port, and DNS and the API server stay
    reachable (ingress). The worker reaches DNS and nothing else: not a pod of another
    namespace or an address outside (the API server: see below); the frontend reaches its
    workers, its peers, DNS and the API server, and neither that pod nor that address
    (egress). Every source is a real pod on the real node (or this machine itself)."""
    kubectl, ns = stack.kubectl, stack.namespace
    worker, frontend = stack.pods("worker")[0], stack.pods("frontend")[0]
    w, f = worker["status"]["podIP"], frontend["status"]["podIP"]
    outside = socket.create_server(("0.0.0.0", 0))  # an address no policy admits: the node's
    threading.Thread(target=_accept_until_closed, args=(outside,), daemon=True).start()
    outside_target = f"{worker['status']['hostIP']}:{outside.getsockname()[1]}"
    columns = {
        f"{w}:8000": "worker :8000",
        f"{f}:8080": "frontend :8080",
        f"{f}:9090": "frontend :9090 scaler",
        f"{f}:9091": "frontend :9091 peers",
        "kubernetes.default.svc.cluster.local:443": "API server",
        f"dns:{NAME}.{ns}.svc.cluster.local": "DNS",
    }
    targets = list(columns)
    other = f"netpol-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", other)
    sources = {
        f"pod in {ns}, unlabelled": (ns, "probe-plain", {"app": "probe"}),
        "pod in another namespace": (other, "probe-plain", {"app": "probe"}),
        "prometheus pod, another ns": (other, "probe-prometheus",
                                       {"app.kubernetes.io/name": "prometheus"}),
        "KEDA operator pod, another ns": (other, "probe-keda", {"app": "keda-operator"}),
    }  # fmt: skip
    results: dict[str, dict[str, str]] = {}
    try:
        start_probes(kubectl, {f"{name}": (namespace, labels) for namespace, name, labels
                               in sources.values() if namespace == ns})  # fmt: skip
        start_probes(kubectl, {name: (namespace, labels) for namespace, name, labels
                               in sources.values() if namespace == other})  # fmt: skip
        # A new pod is admitted once kube-router has seen its address (a sync after the
        # pod's event): how long that takes, seen from the pod.
        started = time.monotonic()
        wait_for(lambda: probe(kubectl, other, "probe-prometheus", targets[:1])[targets[0]]
                 == ALLOWED, timeout=60, interval=0.5, what="the new prometheus pod admitted")  # fmt: skip
        print(f"\na new pod was admitted {time.monotonic() - started:.1f} s after it ran")
        other_pod = kubectl.json("get", "pod", "probe-plain", "-n", other)["status"]["podIP"]
        egress = {f"{other_pod}:{LISTEN_PORT}": "pod, another ns", outside_target: "outside"}
        columns |= egress
        everything = [*targets, *egress]
        results["frontend pod"] = probe(kubectl, ns, frontend["metadata"]["name"], everything)
        results["worker pod"] = probe(kubectl, ns, worker["metadata"]["name"], everything,
                                      container="engine")  # fmt: skip
        for source, (namespace, name, _) in sources.items():
            results[source] = probe(kubectl, namespace, name, everything)
        here: dict[str, str] = {}
        for target in targets[:4]:
            host, port = target.rsplit(":", 1)
            try:
                socket.create_connection((host, int(port)), timeout=3).close()
                here[target] = ALLOWED
            except OSError as e:
                here[target] = f"refused {type(e).__name__}"
        results["this machine (the node)"] = here
    finally:
        outside.close()
        kubectl.run("delete", "pod", "probe-plain", "-n", ns, "--wait=false", check=False)
        kubectl("delete", "namespace", other, "--wait=false")
    print(f"\nNetworkPolicy matrix on the real node (kube-router):\n{matrix(results, columns)}")
    a, r = ALLOWED, REFUSED
    unpoliced = dict.fromkeys(egress, a)  # probe pods have no egress policy
    stranger = dict(zip(targets, (r, a, r, r, a, a), strict=True)) | unpoliced
    expected = {
        "frontend pod": dict.fromkeys(targets, a) | dict.fromkeys(egress, r),
        # The worker: DNS only (its own port, and the frontend's public one, are not egress
        # it needs). The API server through its Service is the exception of this test bed:
        # kube-router lets pods reach the service range whenever the packet ends on the node
        # itself (its INPUT chain's "allow traffic to primary cluster IP range"), and here the
        # API server runs on the node. Where it runs elsewhere, the policy holds (FORWARD).
        "worker pod": dict(zip(targets[1:], (r, r, r, a, a), strict=True))
        | dict.fromkeys(egress, r),
        f"pod in {ns}, unlabelled": stranger,
        "pod in another namespace": stranger,
        "prometheus pod, another ns": dict(zip(targets, (a, a, r, r, a, a), strict=True))
        | unpoliced,
        "KEDA operator pod, another ns": dict(zip(targets, (r, a, a, a, a, a), strict=True))
        | unpoliced,
        "this machine (the node)": dict.fromkeys(targets[:4], a),
    }
    assert not mismatches(results, expected), mismatches(results, expected)

    # The operator, in the cluster, still reaches the API server: it renews its lease.
    def renewed() -> str:
        leases = kubectl.json("get", "leases", "-n", stack.system_namespace)["items"]
        return str([lease["spec"].get("renewTime") for lease in leases])

    first = renewed()
    wait_for(lambda: renewed() != first, timeout=60, what="the operator to renew its lease")
