"""The gateway in front of the real CPU worker: real speech, every format, through the
OpenAI client; and the automatic split's routing with real and stand-in engines."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from testkit.audio import SENTENCES, speak, wer
from testkit.frontend import in_process
from testkit.standins import Behaviour, Running, serve, start, vllm_app
from transcription_api.capabilities import Engine, Mode
from transcription_api.routes import PoolRoute, RouteTable
from transcription_frontend.app import Gateway, create_app
from transcription_frontend.routing import Router
from transcription_worker.batcher import Lane
from transcription_worker.main import default_model
from transcription_worker.server import WorkerConfig
from transcription_worker.server import create_app as worker_app
from transcription_worker.transcriber import Transcriber

NAMES = ["whisper-tiny.en", "whisper-1"]


@pytest.fixture(scope="module")
def cpu_worker(transcriber: Transcriber) -> Iterator[Running]:
    lane = Lane(transcriber, max_queue=8)
    running = start(worker_app(WorkerConfig(served_names=NAMES, model_path="tiny.en"), lane))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def transcriber() -> Transcriber:
    return Transcriber(default_model(), threads=2)


class FailsAfterFirstSegment:
    """The real model, whose decoding breaks down after the first segment: its first batch
    step hands out one segment and leaves the window unfinished; the next step fails."""

    def __init__(self, real: Transcriber) -> None:
        self.real = real
        self.multilingual = real.multilingual
        self.decoding, self.workers, self.windows = real.decoding, real.workers, real.windows
        self.failing: set[int] = set()

    def step(self, batch: list[Any]) -> None:
        if any(id(w) in self.failing for w in batch):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        self.real.step(batch)
        for w in batch:
            w.segments, w.done = w.segments[:1], False
            self.failing.add(id(w))


@pytest.fixture(scope="module")
def failing_gateway(transcriber: Transcriber) -> Iterator[str]:
    lane = Lane(FailsAfterFirstSegment(transcriber), max_queue=8)  # type: ignore[arg-type]
    worker = start(worker_app(WorkerConfig(served_names=NAMES, model_path="tiny.en"), lane))
    table = RouteTable(model=NAMES[0], aliases=NAMES[1:], pools=[
        PoolRoute(name="cpu", engine=Engine.FASTER_WHISPER, mode=Mode.SEQUENTIAL, service="c", endpoints=[worker.url]),
    ])  # fmt: skip
    fe = start(create_app(Gateway(router=Router(table), settings=in_process())))
    yield fe.url
    fe.stop()
    worker.stop()


@pytest.fixture(scope="module")
def speech(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Path]:
    sentence = SENTENCES[1]
    return sentence, speak(sentence, tmp_path_factory.mktemp("speech"))


@pytest.fixture
def split(cpu_worker: Running) -> Iterator[openai.OpenAI]:
    """vLLM (stand-in) continuous pool + the automatic faster-whisper sequential pool."""
    with serve(vllm_app(NAMES, Behaviour(segments=True))) as vllm:
        table = RouteTable(model=NAMES[0], aliases=NAMES[1:], pools=[
            PoolRoute(name="batch", engine=Engine.VLLM, mode=Mode.CONTINUOUS, service="b", endpoints=[vllm.url]),
            PoolRoute(name="auto-faster-whisper", engine=Engine.FASTER_WHISPER, mode=Mode.SEQUENTIAL,
                      service="a", endpoints=[cpu_worker.url], automatic=True),
        ])  # fmt: skip
        fe = start(create_app(Gateway(router=Router(table), settings=in_process())))
        yield openai.OpenAI(base_url=f"{fe.url}/v1", api_key="none", max_retries=0)
        fe.stop()


@pytest.fixture
def cpu_only(cpu_worker: Running) -> Iterator[openai.OpenAI]:
    table = RouteTable(model=NAMES[0], aliases=NAMES[1:], pools=[
        PoolRoute(name="cpu", engine=Engine.FASTER_WHISPER, mode=Mode.SEQUENTIAL, service="c", endpoints=[cpu_worker.url]),
    ])  # fmt: skip
    fe = start(create_app(Gateway(router=Router(table), settings=in_process())))
    yield openai.OpenAI(base_url=f"{fe.url}/v1", api_key="none", max_retries=0)
    fe.stop()


def test_every_format_with_real_speech(cpu_only: openai.OpenAI, speech: tuple[str, Path]) -> None:
    sentence, wav = speech
    file = wav.read_bytes()
    create = cpu_only.audio.transcriptions.create
    assert wer(sentence, create(model="whisper-1", file=("s.wav", file)).text) <= 0.2
    assert (
        wer(sentence, create(model="whisper-1", file=("s.wav", file), response_format="text"))
        <= 0.2
    )
    srt = create(model="whisper-1", file=("s.wav", file), response_format="srt")
    assert srt.startswith("1\n00:00:00,000 --> ")
    vtt = create(model="whisper-1", file=("s.wav", file), response_format="vtt")
    assert vtt.startswith("WEBVTT")
    v = create(
        model="whisper-1",
        file=("s.wav", file),
        response_format="verbose_json",
        timestamp_granularities=["word", "segment"],
    )
    assert v.words and wer(sentence, " ".join(w.word for w in v.words)) <= 0.2
    assert v.segments and v.segments[0].start == 0.0


def test_stream_with_real_speech(cpu_only: openai.OpenAI, speech: tuple[str, Path]) -> None:
    sentence, wav = speech
    events = list(
        cpu_only.audio.transcriptions.create(
            model="whisper-1", file=("s.wav", wav.read_bytes()), stream=True
        )
    )
    assert events[-1].type == "transcript.text.done"
    assert wer(sentence, events[-1].text) <= 0.2
    assert "".join(e.delta for e in events if e.type == "transcript.text.delta") == events[-1].text


def test_split_routes_word_timestamps_to_the_sequential_pool(
    split: openai.OpenAI, speech: tuple[str, Path]
) -> None:
    sentence, wav = speech
    # Plain requests go to the continuous vLLM pool (the stand-in's recorded transcript)...
    plain = split.audio.transcriptions.create(model="whisper-1", file=("s.wav", wav.read_bytes()))
    assert plain.text.startswith(" The quick roundfoc")
    # ...word timestamps, which vLLM lacks, to the automatic faster-whisper pool.
    words = split.audio.transcriptions.create(model="whisper-1", file=("s.wav", wav.read_bytes()),
                                              response_format="verbose_json", timestamp_granularities=["word"])  # fmt: skip
    assert words.words and wer(sentence, words.text) <= 0.2


def test_a_worker_failing_after_its_first_segment_reaches_the_client_as_an_error(
    failing_gateway: str, speech: tuple[str, Path]
) -> None:
    """The first segment was sent as a delta; then the engine failed. The client must see
    an error -- never a `transcript.text.done` that passes the partial text off as done."""
    _, wav = speech
    with httpx.stream("POST", f"{failing_gateway}/v1/audio/transcriptions",
                      data={"model": "whisper-1", "stream": "true"},
                      files={"file": ("s.wav", wav.read_bytes())}, timeout=60) as r:  # fmt: skip
        assert r.status_code == 200
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln.startswith("data: ")]
    assert [e["type"] for e in events] == ["transcript.text.delta", "error"]
    assert events[0]["delta"].strip()
    err = events[-1]["error"]
    assert (err["type"], err["code"]) == ("server_error", "worker_error")
    assert err["message"].startswith(
        "the faster-whisper worker of pool cpu failed to process the request (mid-stream: transcription failed: CUDA error: an illegal memory access"
    )
    client = openai.OpenAI(base_url=f"{failing_gateway}/v1", api_key="none", max_retries=0)
    stream = client.audio.transcriptions.create(
        model="whisper-1", file=("s.wav", wav.read_bytes()), stream=True
    )
    with pytest.raises(openai.APIError, match="illegal memory access"):
        list(stream)
    # Without streaming, the same failure is a 502 naming the pool and the engine.
    r2 = httpx.post(f"{failing_gateway}/v1/audio/transcriptions", data={"model": "whisper-1"},
                    files={"file": ("s.wav", wav.read_bytes())}, timeout=60)  # fmt: skip
    assert r2.status_code == 502
    assert "faster-whisper worker of pool cpu failed" in r2.json()["error"]["message"]


def test_worker_and_gateway_answer_each_format_with_the_same_content_type(
    cpu_worker: Running, cpu_only: openai.OpenAI, speech: tuple[str, Path]
) -> None:
    """One renderer, one set of content types: vtt is text/plain from either.

    diarized_json needs the speaker stage, which neither this worker nor this gateway's
    pools run: both refuse it the same way (tests/test_diarized.py serves it).
    """
    from transcription_api.openai import ResponseFormat
    from transcription_api.render import CONTENT_TYPES

    _, wav = speech
    gateway = str(cpu_only.base_url).removesuffix("/v1/")
    for fmt in ResponseFormat:
        got = {}
        for url in (cpu_worker.url, gateway):
            r = httpx.post(f"{url}/v1/audio/transcriptions", data={"model": "whisper-1", "response_format": fmt.value},
                           files={"file": ("s.wav", wav.read_bytes())}, timeout=60)  # fmt: skip
            if fmt is ResponseFormat.DIARIZED_JSON:
                assert r.status_code == 400, r.text
                assert r.json()["error"]["code"] == "unsupported_capability", r.text
                assert "diarization" in r.json()["error"]["message"], r.text
                continue
            assert r.status_code == 200, r.text
            got[url] = r.headers["content-type"]
        if fmt is not ResponseFormat.DIARIZED_JSON:
            assert set(got.values()) == {CONTENT_TYPES[fmt]}, (fmt, got)
