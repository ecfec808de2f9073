"""The CPU worker: real transcription of spoken sentences (espeak-ng), every container and
response format, streaming, words, every bad input, and the queue."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.audio import SENTENCES, convert, speak, tone_wav, wer
from tests.standins import Running, start
from transcription_worker import metrics
from transcription_worker.engine import Lane, Transcriber
from transcription_worker.main import default_model
from transcription_worker.server import WorkerConfig, create_app

NAMES = ["whisper-tiny.en", "whisper-1"]
MAX_WER = 0.25  # tiny.en gets ~0-5% on these sentences; margin for codecs and noise


@pytest.fixture(scope="module")
def transcriber() -> Transcriber:
    return Transcriber(default_model(), threads=2)


@pytest.fixture(scope="module")
def worker(transcriber: Transcriber) -> Iterator[Running]:
    cfg = WorkerConfig(
        served_names=NAMES,
        model_path="tiny.en",
        max_upload_bytes=8 * 1024 * 1024,
        max_duration_s=60,
    )
    running = start(create_app(cfg, Lane(transcriber, max_queue=1)))
    yield running
    running.stop()


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("speech")
    return {s: speak(s, d) for s in SENTENCES}


def post(worker: Running, path: Path | None = None, data: bytes | None = None, fields: dict[str, Any] | None = None,
         endpoint: str = "transcriptions", timeout: float = 60) -> httpx.Response:  # fmt: skip
    content = data if data is not None else (path.read_bytes() if path else None)
    files = (
        {"file": (path.name if path else "a.wav", content)}
        if content is not None
        else {"x": (None, "1")}
    )
    return httpx.post(
        f"{worker.url}/v1/audio/{endpoint}",
        data=fields or {"model": "whisper-1"},
        files=files,
        timeout=timeout,
    )


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "ogg", "webm", "m4a"])
def test_every_container_transcribes_accurately(
    worker: Running, clips: dict[str, Path], fmt: str
) -> None:
    errors = []
    for sentence, wav in clips.items():
        r = post(worker, convert(wav, fmt))
        assert r.status_code == 200, r.text
        errors.append(wer(sentence, r.json()["text"]))
    assert max(errors) <= MAX_WER, errors
    assert sum(errors) / len(errors) <= 0.1, errors


def test_json_text_srt_vtt_and_verbose_json(worker: Running, clips: dict[str, Path]) -> None:
    sentence, wav = next(iter(clips.items()))
    js = post(worker, wav).json()
    assert wer(sentence, js["text"]) <= MAX_WER
    assert js["usage"]["type"] == "duration" and js["usage"]["seconds"] >= 1

    text = post(worker, wav, fields={"response_format": "text"})
    assert text.headers["content-type"].startswith("text/plain")
    assert text.text == js["text"].strip() + "\n"

    srt = post(worker, wav, fields={"response_format": "srt"}).text
    assert srt.startswith("1\n00:00:0") and " --> " in srt.splitlines()[1]
    assert wer(sentence, " ".join(srt.splitlines()[2:])) <= MAX_WER

    vtt = post(worker, wav, fields={"response_format": "vtt"})
    assert vtt.text.startswith("WEBVTT\n\n00:00:0")

    v = post(worker, wav, fields={"response_format": "verbose_json"}).json()
    assert v["language"] == "en" and v["task"] == "transcribe"
    assert 1.0 < v["duration"] < 10
    assert v["segments"] and all(s["start"] <= s["end"] for s in v["segments"])
    assert "words" not in v


def test_word_timestamps(worker: Running, clips: dict[str, Path]) -> None:
    sentence, wav = next(iter(clips.items()))
    v = post(
        worker, wav, fields={"response_format": "verbose_json", "timestamp_granularities[]": "word"}
    ).json()
    words = v["words"]
    assert wer(sentence, " ".join(w["word"] for w in words)) <= MAX_WER
    starts = [w["start"] for w in words]
    assert starts == sorted(starts)
    assert all(w["start"] <= w["end"] <= v["duration"] + 0.5 for w in words)


def test_stream_sends_vllm_chunks_then_done(worker: Running, clips: dict[str, Path]) -> None:
    sentence, wav = next(iter(clips.items()))
    with httpx.stream("POST", f"{worker.url}/v1/audio/transcriptions",
                      data={"model": "whisper-1", "stream": "true", "stream_include_usage": "true"},
                      files={"file": ("a.wav", wav.read_bytes())}, timeout=60) as r:  # fmt: skip
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "transcription.chunk" and c["model"] == "whisper-1" for c in chunks)
    text = "".join(ch["delta"]["content"] for c in chunks for ch in c["choices"])
    assert wer(sentence, text) <= MAX_WER
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["total_tokens"] > 0


def test_aliases_models_health_and_metrics(worker: Running, clips: dict[str, Path]) -> None:
    wav = next(iter(clips.values()))
    assert post(worker, wav, fields={"model": "whisper-tiny.en"}).status_code == 200
    models = httpx.get(f"{worker.url}/v1/models").json()
    assert [m["id"] for m in models["data"]] == NAMES
    assert httpx.get(f"{worker.url}/health").status_code == 200
    text = httpx.get(f"{worker.url}/metrics").text
    for family in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                   "vllm:e2e_request_latency_seconds", "vllm:request_success_total"):  # fmt: skip
        assert f"# TYPE {family.removesuffix('_total')}" in text, family
    assert 'vllm:request_success_total{finished_reason="stop",model_name="whisper-tiny.en"}' in text


BAD = [
    ({"model": "whisper-1"}, None, 400, "the `file` part is missing"),
    ({"model": "whisper-1"}, b"", 400, "Invalid or corrupted audio data"),
    ({"model": "whisper-1"}, b"RIFF" + bytes(range(256)) * 20, 400, "Invalid or corrupted audio data"),
    ({"model": "nope"}, "wav", 404, "The model `nope` does not exist. Valid aliases: whisper-tiny.en, whisper-1."),
    ({"model": "whisper-1", "temperature": "hot"}, "wav", 400, "temperature must be a number between 0 and 1, got 'hot'"),
    ({"model": "whisper-1", "temperature": "3"}, "wav", 400, "temperature must be a number between 0 and 1, got '3'"),
    ({"model": "whisper-1", "language": "de"}, "wav", 400, "this model is English-only"),
    ({"model": "whisper-1", "response_format": "docx"}, "wav", 400, "response_format must be one of"),
    ({"model": "whisper-1", "stream": "true", "response_format": "srt"}, "wav", 400, "stream=true is supported with response_format json or text, not srt"),
    ({"model": "whisper-1"}, b"RIFF" + b"\x00" * (9 * 1024 * 1024), 413, "File too large: the upload limit is 8388608 bytes"),
    ({"model": "whisper-1", "stream": "maybe"}, "wav", 400, "stream must be true or false"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "data", "status", "message"), BAD, ids=[m[:30] for *_, m in BAD]
)
def test_bad_input_then_normal_service(worker: Running, clips: dict[str, Path], fields: dict[str, str],
                                       data: bytes | str | None, status: int, message: str) -> None:  # fmt: skip
    sentence, wav = next(iter(clips.items()))
    if data == "wav":
        data = wav.read_bytes()
    r = post(worker, None, data=data, fields=fields)  # type: ignore[arg-type]
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert message in err["message"]
    # OpenAI's error shape, as the gateway answers (the same code writes both).
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert wer(sentence, post(worker, wav).json()["text"]) <= MAX_WER


def test_audio_over_the_duration_limit(worker: Running) -> None:
    r = post(worker, None, data=tone_wav(61))
    assert r.status_code == 400
    assert "the audio is 61 s long; the limit is 60 s" in r.json()["error"]["message"]


def test_full_queue_answers_503_and_loses_nothing_accepted(
    worker: Running, clips: dict[str, Path]
) -> None:
    wav = next(iter(clips.values())).read_bytes()
    long_clip = tone_wav(20)  # keeps the lane busy for a while
    with concurrent.futures.ThreadPoolExecutor(6) as ex:
        futures = [ex.submit(post, worker, None, long_clip if i == 0 else wav) for i in range(6)]
        results = [f.result() for f in futures]
    codes = sorted(r.status_code for r in results)
    # One running, one waiting (max_queue=1): the rest are refused, never dropped.
    assert codes.count(200) >= 2 and set(codes) <= {200, 503}
    refused = [r for r in results if r.status_code == 503]
    assert refused and all(r.headers["retry-after"] == "2" for r in refused)
    assert all("busy" in r.json()["error"]["message"] for r in refused)


def test_a_disconnected_client_is_dropped_from_the_queue(
    worker: Running, clips: dict[str, Path]
) -> None:
    before = metrics.CANCELLED._value.get()
    wav = next(iter(clips.values())).read_bytes()
    with concurrent.futures.ThreadPoolExecutor(2) as ex:
        busy = ex.submit(post, worker, None, tone_wav(20))
        time.sleep(0.5)
        with pytest.raises(httpx.ReadTimeout):
            post(worker, None, data=wav, timeout=0.8)
        assert busy.result().status_code == 200
    deadline = time.monotonic() + 5
    while metrics.CANCELLED._value.get() == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metrics.CANCELLED._value.get() == before + 1
