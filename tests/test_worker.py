"""The faster-whisper worker: real transcription of spoken sentences (espeak-ng), every
container and response format, streaming, words, every bad input, the queue, batching of
concurrent requests and of long audio's windows, and the GPU start-up check."""

from __future__ import annotations

import concurrent.futures
import itertools
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ctranslate2
import httpx
import pytest

from testbed.kube import wait_for
from testkit import prom
from testkit.audio import SENTENCES, convert, speak, tone_wav, wer
from testkit.frontend import PATIENCE, wait_until
from testkit.standins import Running, start
from transcription_api.errors import APIError
from transcription_api.params import parse_request
from transcription_frontend.audio import encode
from transcription_worker import metrics
from transcription_worker.batcher import Lane
from transcription_worker.main import default_model
from transcription_worker.server import WorkerConfig, create_app, options
from transcription_worker.transcriber import Transcriber

NAMES = ["whisper-tiny.en", "whisper-1"]
SEED = 0  # of the sampling in the temperature fallback
MAX_WER = 0.25  # tiny.en gets ~0-5% on these sentences; margin for codecs and noise


@pytest.fixture(scope="module")
def transcriber() -> Transcriber:
    # The temperature fallback samples. CTranslate2 seeds each of its threads' generators
    # once, at the thread's first sample, from this seed (else from the system's entropy):
    # set before the model's threads exist. Unseeded, one run in many drew a loop at every
    # temperature ("Who? Who? Who? ...", the repetition test).
    ctranslate2.set_random_seed(SEED)
    return Transcriber(default_model(), threads=2)


@pytest.fixture(scope="module")
def worker(transcriber: Transcriber) -> Iterator[Running]:
    cfg = WorkerConfig(
        served_names=NAMES,
        model_path="tiny.en",
        max_upload_bytes=8 * 1024 * 1024,
        max_duration_s=60,
    )
    # Room for 2 requests in a batch and 1 waiting: the rest are refused.
    running = start(create_app(cfg, Lane(transcriber, max_queue=1, max_batch_size=2)))
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


def test_the_worker_exports_what_it_decodes_a_second_while_busy(
    worker: Running, clips: dict[str, Path]
) -> None:
    """audio_seconds_total over busy_seconds_total: the rate a replica decodes at, for
    Prometheus (the frontend measures the same for every engine, for the autoscaler)."""
    wav = next(iter(clips.values()))
    audio, busy = metrics.AUDIO_SECONDS._value.get(), metrics.BUSY_SECONDS._value.get()
    started = time.monotonic()
    assert post(worker, wav).status_code == 200
    wall = time.monotonic() - started
    audio = metrics.AUDIO_SECONDS._value.get() - audio
    busy = metrics.BUSY_SECONDS._value.get() - busy
    assert 0 < busy < wall  # the model's time, not the upload's or the decoding of the file
    assert audio > 0 and audio / busy > 1  # tiny.en: faster than real time
    assert (
        "# TYPE transcription_worker_busy_seconds_total counter"
        in httpx.get(f"{worker.url}/metrics").text
    )


BAD = [
    ({"model": "whisper-1"}, None, 400, "the `file` part is missing"),
    ({"model": "whisper-1"}, b"", 400, "Invalid or corrupted audio data"),
    ({"model": "whisper-1"}, b"RIFF" + bytes(range(256)) * 20, 400, "Invalid or corrupted audio data"),
    ({"model": "nope"}, "wav", 404, "The model `nope` does not exist. Valid aliases: whisper-tiny.en, whisper-1."),
    ({"model": "whisper-1", "temperature": "hot"}, "wav", 400, "temperature must be a number between 0 and 1, got 'hot'"),
    ({"model": "whisper-1", "temperature": "3"}, "wav", 400, "temperature must be a number between 0 and 1, got '3'"),
    ({"model": "whisper-1", "language": "de"}, "wav", 400, "this model is English-only"),
    ({"model": "whisper-1", "languages[]": ["en", "de"]}, "wav", 400, "this model is English-only; language 'de'"),
    ({"model": "whisper-1", "languages[]": ["xx", "yy"]}, "wav", 400, "this model is English-only; language 'xx'"),
    ({"model": "whisper-1", "response_format": "docx"}, "wav", 400, "response_format must be one of"),
    ({"model": "whisper-1", "stream": "true", "response_format": "srt"}, "wav", 400, "stream=true is supported with response_format json or text, not srt"),
    ({"model": "whisper-1"}, b"RIFF" + b"\x00" * (9 * 1024 * 1024), 413, "File too large: the upload limit is 8388608 bytes"),
    ({"model": "whisper-1", "stream": "maybe"}, "wav", 400, "stream must be true or false"),
    ({"model": "whisper-1", "include[]": "tokens"}, "wav", 400, "include[] takes logprobs, not tokens"),
    ({"model": "whisper-1", "include[]": "logprobs", "response_format": "verbose_json"}, "wav", 400, "include[]=logprobs needs response_format=json"),
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


def test_languages_are_named_in_the_answer(worker: Running, clips: dict[str, Path]) -> None:
    sentence, wav = next(iter(clips.items()))
    r = post(worker, wav, fields={"model": "whisper-1", "languages[]": "en"})
    assert r.status_code == 200, r.text
    assert r.json()["languages"] == [{"code": "en"}] and wer(sentence, r.json()["text"]) <= MAX_WER
    assert "languages" not in post(worker, wav).json()  # unasked, answers are as they were


def test_several_languages_restrict_a_multilingual_models_detection() -> None:
    request = parse_request([("languages[]", "de"), ("languages[]", "fr")])
    assert options(request, "transcribe", multilingual=True).languages == ("de", "fr")
    one = options(parse_request([("languages[]", "de")]), "transcribe", multilingual=True)
    assert (one.language, one.languages) == ("de", ())
    with pytest.raises(APIError, match="Unsupported language: 'xx'"):
        options(parse_request([("languages[]", "de"), ("languages[]", "xx")]), "transcribe", True)


def test_logprobs_are_the_transcripts_tokens(worker: Running, clips: dict[str, Path]) -> None:
    sentence, wav = next(iter(clips.items()))
    r = post(worker, wav, fields={"model": "whisper-1", "include[]": "logprobs"})
    assert r.status_code == 200, r.text
    body = r.json()
    logprobs = body["logprobs"]
    assert len(logprobs) >= len(sentence.split()), logprobs
    assert "".join(lp["token"] for lp in logprobs).strip() == body["text"].strip()
    for lp in logprobs:
        assert set(lp) == {"token", "logprob", "bytes"} and lp["bytes"] == list(
            lp["token"].encode()
        )
        assert -30 < lp["logprob"] <= 0
    # tiny.en is sure of a sentence it gets right: the mean token probability is high.
    assert sum(lp["logprob"] for lp in logprobs) / len(logprobs) > -0.5, logprobs
    # Unasked, answers are as they were; the text is the same either way.
    plain = post(worker, wav).json()
    assert "logprobs" not in plain and plain["text"] == body["text"]


def test_a_streams_chunks_carry_their_tokens_logprobs(
    worker: Running, clips: dict[str, Path]
) -> None:
    _, wav = next(iter(clips.items()))
    r = post(worker, wav, fields={"model": "whisper-1", "include[]": "logprobs", "stream": "true"})
    chunks = [json.loads(line[6:]) for line in r.text.splitlines()
              if line.startswith("data: {")]  # fmt: skip
    texts = [c for c in chunks if c["choices"] and c["choices"][0]["delta"]["content"]]
    assert texts and all(c["choices"][0]["logprobs"] for c in texts), chunks
    for c in texts:
        choice = c["choices"][0]
        assert "".join(lp["token"] for lp in choice["logprobs"]) == choice["delta"]["content"]


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
    # Two in a batch, one waiting (max_queue=1): the rest are refused, never dropped.
    assert codes.count(200) >= 3 and set(codes) <= {200, 503}
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
        wait_until(lambda: running(worker) >= 1, what="the long request decoding")
        with pytest.raises(httpx.ReadTimeout):
            post(worker, None, data=wav, timeout=0.8)
        assert busy.result().status_code == 200
    wait_until(lambda: metrics.CANCELLED._value.get() != before, what="the cancellation counted")
    assert metrics.CANCELLED._value.get() == before + 1


def running(worker: Running) -> float:
    """Requests the worker is decoding now, as its metrics say."""
    samples, _ = prom.parse(httpx.get(f"{worker.url}/metrics", timeout=30).text)
    return sum(s.value for s in samples if s.name == "vllm:num_requests_running")


# --------------------------------------------------------------------------- batching


def concatenated(
    clips: dict[str, Path], gap_s: float, lead_s: float = 0.0, times: int = 1
) -> tuple[str, bytes]:
    """The sentences one after another with `gap_s` of silence between them (and `lead_s`
    before the first), `times` over: (reference text, 16 kHz WAV)."""
    import wave

    silence = lambda s: b"\x00\x00" * int(16000 * s)  # noqa: E731
    frames, words = [silence(lead_s)], []
    for _ in range(times):
        for sentence, path in clips.items():
            with wave.open(str(path)) as w:
                frames += [w.readframes(w.getnframes()), silence(gap_s)]
            words.append(sentence)
    return " ".join(words), encode.wav(frames, 16000)


@pytest.fixture(scope="module")
def batching(transcriber: Transcriber) -> Iterator[tuple[Running, Lane]]:
    lane = Lane(transcriber, max_queue=8, max_batch_size=8)
    running = start(create_app(WorkerConfig(served_names=NAMES, model_path="tiny.en"), lane))
    yield running, lane
    running.stop()


def test_concurrent_requests_are_decoded_in_one_batch_with_the_text_of_sequential_decoding(
    batching: tuple[Running, Lane], clips: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests that arrive while a batch runs are decoded together in the next, and each
    gets the text faster-whisper itself gives it alone (same beam, same fallback)."""
    worker, lane = batching
    step, running, release = lane.transcriber.step, threading.Event(), threading.Event()
    batches: list[set[int]] = []  # the windows (ids) of each batch decoded

    def gated_step(batch: list[Any]) -> None:
        """The first batch (the tone's) waits until every sentence is queued behind it."""
        running.set()
        assert release.wait(60), "the test never released the first batch"
        batches.append({id(w) for w in batch})
        step(batch)

    monkeypatch.setattr(lane.transcriber, "step", gated_step)
    with concurrent.futures.ThreadPoolExecutor(5) as ex:
        busy = ex.submit(post, worker, None, tone_wav(20))
        assert running.wait(60), "the tone's batch never began"
        futures = {s: ex.submit(post, worker, wav) for s, wav in clips.items()}
        queued = wait_for(lambda: queued_windows(lane, len(clips) + 1), 60, 0.05, "the queue")
        release.set()
        texts = {s: f.result().json()["text"] for s, f in futures.items()}
        assert busy.result().status_code == 200
    # Every sentence's first window is in the first batch that holds any of them, however
    # many fallback rounds (sampled, so of varying length) the tone needs.
    first = next(b for b in batches if b & queued)
    assert queued <= first, f"the sentences were split: {[len(b & queued) for b in batches]}"
    alone = {}
    for sentence, wav in clips.items():
        segments, _ = transcriber_model(lane).transcribe(
            str(wav), language="en", beam_size=5, condition_on_previous_text=False
        )
        alone[sentence] = "".join(s.text for s in segments)
    assert texts == alone
    assert all(wer(s, t) <= MAX_WER for s, t in texts.items())


def queued_windows(lane: Lane, jobs: int) -> set[int] | None:
    """The windows (ids) of the admitted requests after the first, once `jobs` requests are
    admitted and cut into windows; else None."""
    if len(lane.jobs) < jobs or any(j.windows is None for j in lane.jobs):
        return None
    return {id(w) for j in lane.jobs[1:] for w in j.windows or []}


def transcriber_model(lane: Lane) -> Any:
    return lane.transcriber.model


def test_long_audio_is_cut_into_windows_that_are_decoded_together(
    batching: tuple[Running, Lane], clips: dict[str, Path]
) -> None:
    worker, lane = batching
    # About 90 s: 3 or 4 windows, each with the 4 sentences at most once (Whisper takes text
    # repeated within one window for a repetition loop, and rightly falls back).
    reference, audio = concatenated(clips, gap_s=4, times=3)
    before = lane.largest_batch
    lane.largest_batch = 0
    r = post(worker, None, data=audio,
             fields={"model": "whisper-1", "response_format": "verbose_json", "timestamp_granularities[]": "word"})  # fmt: skip
    largest, lane.largest_batch = lane.largest_batch, max(before, lane.largest_batch)
    assert r.status_code == 200, r.text
    v = r.json()
    assert 80 < v["duration"] < 100
    assert largest >= 3  # the windows went through the model together
    assert wer(reference, v["text"]) <= 0.1
    starts = [s["start"] for s in v["segments"]]
    assert starts == sorted(starts) and v["segments"][-1]["end"] > v["duration"] - 5
    assert [s["id"] for s in v["segments"]] == list(range(len(v["segments"])))
    words = v["words"]
    assert wer(reference, " ".join(w["word"] for w in words)) <= 0.1
    assert all(a["start"] <= b["start"] for a, b in itertools.pairwise(words))
    assert all(0 <= w["start"] <= w["end"] <= v["duration"] + 0.5 for w in words)


def test_a_long_stream_sends_text_window_by_window(
    batching: tuple[Running, Lane], clips: dict[str, Path]
) -> None:
    worker, _ = batching
    reference, audio = concatenated(clips, gap_s=4, times=3)
    with httpx.stream("POST", f"{worker.url}/v1/audio/transcriptions",
                      data={"model": "whisper-1", "stream": "true"},
                      files={"file": ("a.wav", audio)}, timeout=120) as r:  # fmt: skip
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    chunks = [json.loads(e) for e in events[:-1]]
    deltas = [
        ch["delta"]["content"] for c in chunks for ch in c["choices"] if ch["delta"]["content"]
    ]
    assert len(deltas) >= 3 and wer(reference, "".join(deltas)) <= 0.1


def test_a_repetition_loop_is_broken_by_the_temperature_fallback(
    batching: tuple[Running, Lane], tmp_path: Path
) -> None:
    """At temperature 0 (OpenAI: raise the temperature while the text looks wrong), a
    sentence that sends beam search into a loop ("The 6-6-6-6-...") comes back readable.
    Several decodes, one per temperature tried: on the slower machine class, beside the
    other suites, more than the default 60 s (it timed out there)."""
    worker, _ = batching
    sentence = "The sixth sick sheikh's sixth sheep is sick."
    text = post(
        worker,
        speak(sentence, tmp_path),
        fields={"model": "whisper-1", "temperature": "0"},
        timeout=240,
    ).json()["text"]
    assert len(text.split()) <= 3 * len(sentence.split()), text


def test_vad_filter_leaves_silence_out_and_keeps_the_times(
    transcriber: Transcriber, clips: dict[str, Path]
) -> None:
    vad = Transcriber(default_model(), threads=2, vad_filter=True)
    lane = Lane(vad, max_queue=2)
    running = start(create_app(WorkerConfig(served_names=NAMES, model_path="tiny.en"), lane))
    try:
        reference, audio = concatenated(clips, gap_s=4, lead_s=6)  # one window of speech
        v = post(running, None, data=audio,
                 fields={"model": "whisper-1", "response_format": "verbose_json", "timestamp_granularities[]": "word"},
                 timeout=120).json()  # fmt: skip
    finally:
        running.stop()
    assert wer(reference, v["text"]) <= MAX_WER  # speech glued together reads a little worse
    assert v["words"][0]["start"] >= 5.5  # the 6 s of silence before are left out, not lost
    assert v["segments"][0]["start"] >= 5.5
    # The last word is put back where it was spoken: before the final 4 s of silence.
    assert v["duration"] - 6 < v["words"][-1]["end"] < v["duration"] - 3
    assert all(a["start"] <= b["start"] for a, b in zip(v["words"], v["words"][1:], strict=False))


def run_lane(lane: Lane, jobs: list[Any], cancel_after_first: bool = False) -> list[list[Any]]:
    """Submit `jobs` to `lane` at once; collect each one's segments."""
    import asyncio

    async def main() -> list[list[Any]]:
        lane.start()

        async def collect(job: Any) -> list[Any]:
            lane.submit(job)
            out = []
            while True:
                kind, value = await job.events.get()
                if kind == "segment":
                    out.append(value)
                    if cancel_after_first:
                        job.cancelled.set()
                        await asyncio.sleep(3)  # time for more batches, if any were coming
                        return out
                elif kind in ("done", "error"):
                    return out

        try:
            return await asyncio.gather(*[collect(j) for j in jobs])
        finally:
            await lane.stop()

    return asyncio.run(main())


def test_a_sequential_lane_decodes_one_request_at_a_time(
    transcriber: Transcriber, clips: dict[str, Path]
) -> None:
    from transcription_worker.batcher import Job
    from transcription_worker.transcriber import Options, decode

    lane = Lane(transcriber, max_queue=8, sequential=True)
    audio = [decode(p.open("rb")) for p in clips.values()]
    results = run_lane(lane, [Job(a, Options()) for a in audio])
    assert (lane.batches, lane.largest_batch) == (len(audio), 1)
    texts = ["".join(s.text for s in r) for r in results]
    assert all(wer(s, t) <= MAX_WER for s, t in zip(clips, texts, strict=True))


def test_a_cancelled_request_gets_no_more_windows_decoded(
    transcriber: Transcriber, clips: dict[str, Path]
) -> None:
    import io

    from transcription_worker.batcher import Job
    from transcription_worker.transcriber import Options, decode

    _, audio = concatenated(clips, gap_s=1.5, times=6)  # about 110 s: 4 windows
    lane = Lane(transcriber, max_queue=1, max_batch_size=1, sequential=True)
    job = Job(decode(io.BytesIO(audio)), Options())
    run_lane(lane, [job], cancel_after_first=True)
    assert job.windows is not None and len(job.windows) >= 4
    assert lane.batches <= 2 and not lane.jobs  # dropped, not decoded to the end


def test_a_worker_given_a_gpu_it_cannot_use_fails_its_startup_probe_with_the_reason(
    tmp_path: Path,
) -> None:
    """No GPU here: a pool with `gpus: 1` must not come up on the CPU. /health (the startup
    probe) answers 503 with the reason, and so does every request."""
    import os
    import socket
    import subprocess
    import sys

    from transcription_api.worker import SETTINGS_ENV, WorkerSettings

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = WorkerSettings(engine="faster-whisper", mode="continuous", model=default_model(),
                              served_names=NAMES, port=port, gpus=1, compute_type="float16")  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "transcription_worker.main", "--host", "127.0.0.1"],
        env={**os.environ, SETTINGS_ENV: settings.to_env()},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except httpx.TransportError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
        assert health.status_code == 503
        message = health.json()["error"]["message"]
        assert "was given 1 GPU(s) but CTranslate2 sees 0 CUDA device(s)" in message
        assert "will not decode on the CPU instead" in message
        r = httpx.post(f"http://127.0.0.1:{port}/v1/audio/transcriptions",
                       data={"model": "whisper-1"}, files={"file": ("a.wav", tone_wav(1))})  # fmt: skip
        assert r.status_code == 503 and r.json()["error"]["message"] == message
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=PATIENCE)
    assert "CTranslate2 sees 0 CUDA device(s)" in out  # and the log says it too


def test_a_model_directory_without_weights_says_so(tmp_path: Path) -> None:
    """Source image, pvc or oci with a wrong spec.model.path: the container's last words (what
    status shows for CrashLoopBackOff) name the path, what is there instead and the field, not
    a hub traceback."""
    from transcription_worker import main

    (tmp_path / "tiny.en").mkdir()
    (tmp_path / "README.md").write_text("weights are in tiny.en/")
    check = ("Check spec.model.path (for source 'pvc', that the claim holds the weights there; "
             "for source 'oci', that the image holds them there)")  # fmt: skip
    for path, found in [
        (tmp_path / "not-there", f"it does not exist; {tmp_path} holds README.md, tiny.en/"),
        (tmp_path, "it holds README.md, tiny.en/"),
        (tmp_path / "tiny.en", "it holds nothing"),
    ]:
        with pytest.raises(SystemExit) as e:
            main.main(["--model", str(path)])
        assert str(e.value) == (
            f"error: model directory {path} has no model.bin (CTranslate2 Whisper weights), "
            f"nor a subdirectory ctranslate2/ holding them: {found}. {check}"
        )


def test_a_directory_of_several_engines_formats_gives_faster_whisper_its_own(
    tmp_path: Path,
) -> None:
    """One image for a faster-whisper pool and a vLLM pool (localmodel): the worker reads
    `ctranslate2/` where the directory has one, and the vLLM launcher `transformers/`."""
    from transcription_worker import main
    from transcription_worker.localmodel import CTRANSLATE2, TRANSFORMERS, in_format

    (tmp_path / CTRANSLATE2).mkdir()
    (tmp_path / TRANSFORMERS).mkdir()
    assert in_format(str(tmp_path), CTRANSLATE2) == str(tmp_path / CTRANSLATE2)
    assert in_format(str(tmp_path), TRANSFORMERS) == str(tmp_path / TRANSFORMERS)
    assert in_format(str(tmp_path / CTRANSLATE2), CTRANSLATE2) == str(tmp_path / CTRANSLATE2)
    assert in_format("openai/whisper-tiny.en", CTRANSLATE2) == "openai/whisper-tiny.en"
    with pytest.raises(SystemExit) as e:
        main.main(["--model", str(tmp_path)])
    assert str(e.value).startswith(
        f"error: model directory {tmp_path / CTRANSLATE2} has no model.bin (CTranslate2 "
        "Whisper weights), nor a subdirectory ctranslate2/ holding them: it holds nothing."
    ), e.value
