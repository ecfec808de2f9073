"""Nothing phones home (issue 37): the gateway's process and the faster-whisper worker's,
started with the environment the operator gives their pods (TELEMETRY_OFF), go through every
feature that loads a library with telemetry (transcription, realtime with server VAD, long
audio cut by VAD; the worker's VAD filter) while what they look up or would fetch is
observed (testkit.egress): nothing but loopback. And the observers catch the old behaviour:
without `ORT_DISABLE_TELEMETRY`, onnxruntime's telemetry request shows up within seconds."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from testkit.audio import SENTENCES, require_tools
from testkit.egress import Watch
from testkit.host import free_port
from testkit.longaudio import long_recording
from testkit.processes import frontend, start, stop
from testkit.realtime import conversation, transcribe_turns
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import ChunkingSpec
from transcription_api.routes import PoolRoute, RouteTable
from transcription_api.telemetry import HUB_OFFLINE, TELEMETRY_OFF

NAMES = ["whisper-tiny.en", "whisper-1"]
ONNX_TELEMETRY_HOST = "mobile.events.data.microsoft.com"
# onnxruntime sends its first event about 5 s after its first session: watch this long after.
SETTLE_SECONDS = 10.0
# onnxruntime sends no telemetry where one of these says it runs under CI (its own list, read
# off libonnxruntime's strings; `CI` is the one `.ci/run`'s caller sets): every process this
# module starts runs without them, so that a pass means the variables the pods get kept it quiet.
CI_VARIABLES = ("CI", "TF_BUILD", "GITHUB_ACTIONS", "GITLAB_CI", "CIRCLECI", "TRAVIS", "JENKINS_URL",
                "CODEBUILD_BUILD_ID", "BUILDKITE", "TEAMCITY_VERSION", "APPVEYOR",
                "BITBUCKET_BUILD_NUMBER")  # fmt: skip
# Long audio: cut by the gateway's VAD from this length on, into chunks this long at most.
CHUNKING = ChunkingSpec(threshold_seconds=10, max_chunk_seconds=10)


@pytest.fixture(scope="module", autouse=True)
def outside_ci() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as m:
        for name in CI_VARIABLES:
            m.delenv(name, raising=False)
        yield


@pytest.fixture(scope="module")
def watch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Watch]:
    w = Watch(tmp_path_factory.mktemp("telemetry"))
    yield w
    w.close()


@pytest.fixture(scope="module")
def worker(watch: Watch, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, int]]:
    """The faster-whisper worker as its pod runs it: VAD filter on, telemetry off."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("worker") / "worker.log"
    args = [sys.executable, "-m", "transcription_worker.main", "--host", "127.0.0.1",
            "--port", str(port), "--vad-filter", "--threads", "2", "--beam-size", "1"]  # fmt: skip
    proc = start(args, log, f"{url}/health", env={**watch.env, **TELEMETRY_OFF, **HUB_OFFLINE})
    yield url, proc.pid
    stop(proc)


def table(worker: tuple[str, int]) -> RouteTable:
    return RouteTable(model=NAMES[0], aliases=NAMES[1:], pools=[
        PoolRoute(name="cpu", engine=Engine.FASTER_WHISPER, mode=Mode.SEQUENTIAL, service="c",
                  endpoints=[worker[0]]),
    ])  # fmt: skip


def transcribe(url: str, wav: Path) -> str:
    r = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1"},
                   files={"file": (wav.name, wav.read_bytes())}, timeout=300)  # fmt: skip
    assert r.status_code == 200, r.text
    return str(r.json()["text"])


def test_the_gateway_and_the_worker_look_up_nothing_but_loopback(
    watch: Watch, worker: tuple[str, int], tmp_path: Path
) -> None:
    require_tools()
    env = {**watch.env, **TELEMETRY_OFF, **HUB_OFFLINE}
    url, proc = frontend(table(worker), tmp_path, env=env, chunking=CHUNKING)
    try:
        short = long_recording(tmp_path, 4, sentences=SENTENCES[:1], name="short")
        assert "transcribe" in transcribe(url, short.wav).lower()
        long = long_recording(tmp_path, 25, sentences=SENTENCES, name="long")  # chunked
        assert len(transcribe(url, long.wav).split()) > 20
        speech = conversation(SENTENCES[:2], tmp_path)
        events = asyncio.run(transcribe_turns(url, speech, turns=2))  # server VAD
        done = [
            e for e in events if e.type == "conversation.item.input_audio_transcription.completed"
        ]
        assert len(done) == 2, [e.type for e in events]
        time.sleep(SETTLE_SECONDS)  # onnxruntime's telemetry would have left by now
        assert httpx.get(f"{url}/ready").status_code == 200
    finally:
        stop(proc)
    assert {proc.pid, worker[1]} <= watch.watched()  # the lookup wrapper was in place
    assert watch.outside() == []


def test_the_observers_see_a_lookup_and_onnxruntimes_telemetry_when_it_is_on(
    watch: Watch, worker: tuple[str, int], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The negative control: a name looked up through Python's `socket` is logged, and the
    gateway without `ORT_DISABLE_TELEMETRY` (its other variables set) sends onnxruntime's
    telemetry within seconds of its first VAD session."""
    probe = "telemetry-probe.invalid"
    code = f"import socket\ntry:\n    socket.getaddrinfo({probe!r}, 443)\nexcept OSError:\n    pass"
    subprocess.run([sys.executable, "-c", code], env=watch.env, check=True)
    assert probe in watch.lookups()
    monkeypatch.delenv("ORT_DISABLE_TELEMETRY", raising=False)
    env = {**watch.env, **{k: v for k, v in TELEMETRY_OFF.items() if k != "ORT_DISABLE_TELEMETRY"}}
    url, proc = frontend(table(worker), tmp_path, env=env, chunking=CHUNKING)
    try:
        long = long_recording(tmp_path, 12, sentences=SENTENCES, name="long")  # the VAD cuts
        transcribe(url, long.wav)
        deadline = time.monotonic() + 3 * SETTLE_SECONDS
        while not any(ONNX_TELEMETRY_HOST in r for r in watch.sink.requests):
            assert time.monotonic() < deadline, watch.sink.requests
            time.sleep(0.2)
    finally:
        stop(proc)
