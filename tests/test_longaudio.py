"""Long audio through the gateway: cut on silence, chunks fanned out over the pool's
endpoints, one answer stitched, in every format; through the official SDK, with the real
CPU worker (faster-whisper, tiny.en) or the vLLM stand-in behind the pool."""

from __future__ import annotations

import json
import re
import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

from testkit.audio import SENTENCES, convert, wer
from testkit.frontend import PRIMARY, Frontend, chat_pool, pool
from testkit.longaudio import Recording, damaged, long_recording
from testkit.standins import VLLM, Behaviour, Running, Seen, serve, vllm_app, vllm_process
from testkit.standins import recording as recorded
from transcription_api.capabilities import Capability, Engine, Mode
from transcription_api.frontend import ChunkingSpec
from transcription_api.routes import RouteTable
from transcription_frontend.longaudio.fanout import (
    PREVIOUS_WORDS,
    _whisper_only,
    chained_prompt,
    runs,
)
from transcription_frontend.routing import NoPool

CHUNKS = "transcription_frontend_chunked_requests_total"


@pytest.fixture(scope="module")
def recording(tmp_path_factory: pytest.TempPathFactory) -> Recording:
    """About 75 s of the easy sentences with pauses: three chunks or more."""
    d = tmp_path_factory.mktemp("long")
    return long_recording(d, 75, sentences=SENTENCES, pause_range=(0.6, 1.4), seed=3)


@pytest.fixture
def real(cpu_worker: Running) -> Iterator[Frontend]:
    """Two endpoints of one faster-whisper pool (the same worker twice: the routing is
    what is under test), audio over 60 s chunked without a field."""
    fw = pool("fw", [cpu_worker.url, cpu_worker.url.replace("127.0.0.1", "localhost")],
              engine=Engine.FASTER_WHISPER, mode=Mode.CONTINUOUS)  # fmt: skip
    table = RouteTable(model="whisper-tiny.en", aliases=["whisper-1"], pools=[fw])
    fe = Frontend(table, chunking=ChunkingSpec(threshold_seconds=60), max_audio_seconds=3600)
    yield fe
    fe.running.stop()


def sdk(fe: Frontend) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{fe.url}/v1", api_key="none", max_retries=0, timeout=300)


def test_chunking_auto_stitches_every_format_in_order(real: Frontend, recording: Recording) -> None:
    c = sdk(real)
    chunked = real.metric(CHUNKS)  # the metrics are the process's: counted from here
    served = real.metric("transcription_frontend_requests_total", pool="fw", status="200")
    with recording.wav.open("rb") as f:
        verbose = c.audio.transcriptions.create(model="whisper-1", file=f, chunking_strategy="auto",
                                                response_format="verbose_json",
                                                timestamp_granularities=["word", "segment"])  # fmt: skip
    print(f"\nchunked WER {wer(recording.text, verbose.text):.3f}: {verbose.text[:120]}...")
    assert wer(recording.text, verbose.text) <= 0.1
    assert abs(verbose.duration - recording.seconds) < 0.5
    assert verbose.segments and [s.id for s in verbose.segments] == list(
        range(len(verbose.segments))
    )
    starts = [s.start for s in verbose.segments]
    assert starts == sorted(starts) and verbose.segments[-1].end <= recording.seconds + 0.01
    assert verbose.segments[-1].end > recording.sentences[-1].start
    assert verbose.words and [w.start for w in verbose.words] == sorted(
        w.start for w in verbose.words
    )
    # every sentence's words once, in order: nothing lost or repeated at the cuts
    assert len(verbose.words) == pytest.approx(len(recording.text.split()), abs=3)
    assert real.metric(CHUNKS) == chunked + 1
    assert (
        real.metric("transcription_frontend_requests_total", pool="fw", status="200") >= served + 3
    )

    with recording.wav.open("rb") as f:
        srt = c.audio.transcriptions.create(model="whisper-1", file=f, chunking_strategy="auto",
                                            response_format="srt")  # fmt: skip
    numbers = [int(n) for n in re.findall(r"^(\d+)\n\d\d:", str(srt), re.M)]
    assert numbers == list(range(1, len(numbers) + 1)) and len(numbers) >= 3, srt
    with recording.wav.open("rb") as f:
        vtt = c.audio.transcriptions.create(model="whisper-1", file=f, chunking_strategy="auto",
                                            response_format="vtt")  # fmt: skip
    assert str(vtt).startswith("WEBVTT") and str(vtt).count(" --> ") == len(numbers)
    with recording.wav.open("rb") as f:
        text = c.audio.transcriptions.create(model="whisper-1", file=f, chunking_strategy="auto",
                                             response_format="text")  # fmt: skip
    assert wer(recording.text, str(text)) <= 0.1
    with recording.wav.open("rb") as f:
        plain = c.audio.transcriptions.create(model="whisper-1", file=f)  # no field: over 60 s
    assert wer(recording.text, plain.text) <= 0.1
    assert plain.usage is not None and plain.usage.type == "duration"
    assert plain.usage.seconds == pytest.approx(recording.seconds, abs=1)
    assert real.metric(CHUNKS) == chunked + 5


def test_server_vad_chunking_and_a_stream_in_order(real: Frontend, recording: Recording) -> None:
    c = sdk(real)
    with recording.wav.open("rb") as f:
        events = list(c.audio.transcriptions.create(
            model="whisper-1", file=f, stream=True,
            chunking_strategy={"type": "server_vad", "silence_duration_ms": 300, "threshold": 0.5},
        ))  # fmt: skip
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    done = events[-1]
    assert done.type == "transcript.text.done" and len(deltas) >= 3
    assert "".join(deltas) == done.text and wer(recording.text, done.text) <= 0.1
    assert done.usage is not None and done.usage.type == "duration"


def test_bad_chunking_and_long_audio_get_clear_errors(
    real: Frontend, recording: Recording, tmp_path: Path
) -> None:
    c = sdk(real)
    for strategy, param in (
        ({"type": "client_vad"}, "chunking_strategy[type]"),
        ({"type": "server_vad", "threshold": 2}, "chunking_strategy[threshold]"),
        (
            {"type": "server_vad", "silence_duration_ms": -1},
            "chunking_strategy[silence_duration_ms]",
        ),
    ):
        with recording.wav.open("rb") as f, pytest.raises(openai.BadRequestError) as e:
            c.audio.transcriptions.create(model="whisper-1", file=f, chunking_strategy=strategy)  # type: ignore[arg-type]
        assert isinstance(e.value.body, dict) and e.value.body["param"] == param, e.value.body
    broken = damaged(convert(recording.wav, "mp3"), tmp_path / "broken.mp3", at=0.5)
    with broken.open("rb") as f, pytest.raises(openai.BadRequestError) as e:
        c.audio.transcriptions.create(model="whisper-1", file=f, chunking_strategy="auto")
    assert isinstance(e.value.body, dict) and e.value.body["param"] == "file"
    seconds = float(re.findall(r"after ([\d.]+) s", e.value.body["message"])[0])
    assert abs(seconds - recording.seconds / 2) < 3, e.value.body
    # still serving
    with recording.wav.open("rb") as f:
        assert c.audio.transcriptions.create(model="whisper-1", file=f).text


def test_longer_than_max_audio_seconds_is_a_413_naming_it(
    cpu_worker: Running, recording: Recording
) -> None:
    fw = pool("fw", [cpu_worker.url], engine=Engine.FASTER_WHISPER)
    fe = Frontend(RouteTable(model="whisper-tiny.en", aliases=["whisper-1"], pools=[fw]),
                  max_audio_seconds=30)  # fmt: skip
    try:
        with recording.wav.open("rb") as f, pytest.raises(openai.APIStatusError) as e:
            sdk(fe).audio.transcriptions.create(model="whisper-1", file=f)
        assert e.value.status_code == 413 and "maxAudioSeconds" in str(e.value.body)
    finally:
        fe.running.stop()


# ---- the fan-out: over every endpoint, retried, cancelled, failing by chunk


@pytest.fixture
def standins() -> Iterator[tuple[Frontend, Behaviour, Behaviour]]:
    a, b = Behaviour(delay=0.5), Behaviour(delay=0.5)
    with (
        serve(vllm_app([PRIMARY, "whisper-1"], a)) as wa,
        serve(vllm_app([PRIMARY, "whisper-1"], b)) as wb,
    ):
        table = RouteTable(
            model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [wa.url, wb.url])]
        )
        fe = Frontend(table, chunking=ChunkingSpec(max_parallel_chunks=4))
        yield fe, a, b
        fe.running.stop()


def test_chunks_run_on_both_endpoints_at_once(
    standins: tuple[Frontend, Behaviour, Behaviour], recording: Recording
) -> None:
    fe, a, b = standins
    r = fe.post(
        {"model": "whisper-1", "chunking_strategy": "auto"}, recording.wav.read_bytes(), timeout=120
    )
    assert r.status_code == 200, r.text
    chunks = len(a.seen) + len(b.seen)
    assert chunks >= 3 and a.seen and b.seen, (len(a.seen), len(b.seen))
    # at once, not one after the other: three or more chunks over two endpoints at once put
    # two on one of them (one after the other, each would hold one at a time)
    assert max(a.max_in_flight, b.max_in_flight) >= 2, (a.max_in_flight, b.max_in_flight)
    assert all(s.file_name == "chunk.flac" for s in a.seen + b.seen)
    assert not any(k.startswith("chunking_strategy") for s in a.seen + b.seen for k, _ in s.fields)


def test_a_failing_endpoint_is_retried_and_a_chunk_that_fails_for_good_is_named(
    standins: tuple[Frontend, Behaviour, Behaviour], recording: Recording
) -> None:
    fe, a, b = standins
    retries = fe.metric("transcription_frontend_retries_total", pool="batch")
    a.status = 503  # refuses: each of its chunks is retried on b
    r = fe.post(
        {"model": "whisper-1", "chunking_strategy": "auto"}, recording.wav.read_bytes(), timeout=120
    )
    assert r.status_code == 200, r.text
    assert fe.metric("transcription_frontend_retries_total", pool="batch") >= retries + 1
    a.status = b.status = 500
    r = fe.post(
        {"model": "whisper-1", "chunking_strategy": "auto"}, recording.wav.read_bytes(), timeout=120
    )
    assert r.status_code == 502, r.text  # the worker's 500, as the gateway answers it
    assert re.match(
        r"chunk \d+ of \d+ \([\d.]+-[\d.]+ s\) failed: ", r.json()["error"]["message"]
    ), r.text


def test_a_worker_killed_mid_fan_out_has_its_chunks_retried_and_the_answer_whole(
    recording: Recording,
) -> None:
    """One of the pool's two workers is SIGKILLed while it holds chunks: each of its chunks
    fails before an answer, is retried on the other, and the answer has every chunk."""
    b = Behaviour(delay=0.5)
    with vllm_process([PRIMARY, "whisper-1"], delay=1.0) as (doomed, proc), \
            serve(vllm_app([PRIMARY, "whisper-1"], b)) as wb:  # fmt: skip
        fe = Frontend(RouteTable(model=PRIMARY, aliases=["whisper-1"],
                                 pools=[pool("batch", [doomed, wb.url])]),
                      chunking=ChunkingSpec(max_parallel_chunks=4))  # fmt: skip
        try:
            retries = fe.metric("transcription_frontend_retries_total", pool="batch")
            before = fe.metric("transcription_frontend_chunks_per_request_sum")  # in-process
            body = {"model": "whisper-1", "chunking_strategy": "auto"}
            with ThreadPoolExecutor(1) as ex:
                answer = ex.submit(fe.post, body, recording.wav.read_bytes(), timeout=120)
                deadline = time.monotonic() + 30
                while not b.seen and time.monotonic() < deadline:  # chunks are out on both
                    time.sleep(0.02)
                assert b.seen, "no chunk reached the surviving worker"
                proc.send_signal(signal.SIGKILL)
                r = answer.result()
            assert r.status_code == 200, r.text
            assert fe.metric("transcription_frontend_retries_total", pool="batch") > retries
            chunks = fe.metric("transcription_frontend_chunks_per_request_sum") - before
            one = json.loads(recorded(VLLM, "json")[2])["text"].split()
            assert len(r.json()["text"].split()) == chunks * len(one), (chunks, r.json())
        finally:
            fe.running.stop()


def test_a_client_that_disconnects_cancels_every_chunk(
    standins: tuple[Frontend, Behaviour, Behaviour], recording: Recording
) -> None:
    fe, a, b = standins
    a.hold = b.hold = True
    fe.hang_up({"model": "whisper-1", "chunking_strategy": "auto"},
               reached=lambda: a.in_flight + b.in_flight >= 2, file=recording.wav.read_bytes())  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (a.in_flight or b.in_flight):
        time.sleep(0.1)
    assert a.in_flight == b.in_flight == 0
    assert a.cancelled + b.cancelled >= 2, (a.cancelled, b.cancelled)


def test_the_stitched_json_is_one_answer(standins: tuple[Frontend, Behaviour, Behaviour],
                                         recording: Recording) -> None:  # fmt: skip
    fe, _, _ = standins
    r = fe.post(
        {"model": "whisper-1", "chunking_strategy": "auto"}, recording.wav.read_bytes(), timeout=120
    )
    body = r.json()
    assert set(body) == {"text", "usage"} and body["usage"]["type"] == "duration", body
    assert json.dumps(body)


@pytest.mark.parametrize("threshold", ["0", "1", "1.5", "x"])
def test_a_threshold_outside_0_to_1_is_a_400(
    standins: tuple[Frontend, Behaviour, Behaviour], recording: Recording, threshold: str
) -> None:
    fe, a, b = standins
    r = fe.post([("model", "whisper-1"), ("chunking_strategy[type]", "server_vad"),
                 ("chunking_strategy[threshold]", threshold)], recording.wav.read_bytes())  # fmt: skip
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "chunking_strategy[threshold]"
    assert not a.seen and not b.seen


# ---- each chunk prompted with the text of the one before it (spec.frontend.chunking.previousText)


def test_runs_split_the_chunks_into_consecutive_runs_as_equal_as_they_come() -> None:
    assert runs(24, 4) == [range(0, 6), range(6, 12), range(12, 18), range(18, 24)]
    assert runs(5, 2) == [range(0, 2), range(2, 5)]
    assert runs(3, 4) == [range(0, 1), range(1, 2), range(2, 3)]  # more slots than chunks
    assert runs(7, 1) == [range(0, 7)]
    assert runs(0, 4) == []
    for chunks, parallel in ((24, 4), (5, 2), (3, 4), (100, 7)):
        covered = [i for r in runs(chunks, parallel) for i in r]
        assert covered == list(range(chunks))


def test_the_text_before_follows_the_clients_prompt_and_is_cut_to_its_last_words() -> None:
    fields = [("model", "whisper-1"), ("prompt", "Kubernetes, vLLM.")]
    assert chained_prompt(fields, "one two") == [("model", "whisper-1"),
                                                 ("prompt", "Kubernetes, vLLM. one two")]  # fmt: skip
    assert chained_prompt([("model", "m")], "  one   two ") == [
        ("model", "m"),
        ("prompt", "one two"),
    ]
    assert chained_prompt(fields, "   ") == fields  # nothing before: the client's own prompt
    long = " ".join(f"w{i}" for i in range(PREVIOUS_WORDS + 50))
    (prompt,) = [v for k, v in chained_prompt([], long) if k == "prompt"]
    assert prompt.split() == long.split()[-PREVIOUS_WORDS:]


def test_only_whisper_pools_are_prompted_with_the_text_before() -> None:
    whisper = pool("w", ["http://127.0.0.1:1"])
    assert _whisper_only([whisper])
    assert not _whisper_only([whisper, chat_pool("http://127.0.0.1:2")])
    assert not _whisper_only(NoPool(frozenset({Capability.TRANSCRIPTIONS})))


def prompts(seen: list[Seen]) -> list[str | None]:
    return [dict(s.fields).get("prompt") for s in seen]


@pytest.mark.parametrize("previous_text", [True, False])
def test_one_run_prompts_each_chunk_with_the_answer_before_it(
    recording: Recording, previous_text: bool
) -> None:
    """max_parallel 1: one run, in order; with previous_text every chunk after the first
    carries the client's prompt and then the text the stand-in answered for the chunk
    before it; without, each only the client's prompt."""
    worker = Behaviour(delay=0.05)
    with serve(vllm_app([PRIMARY, "whisper-1"], worker)) as w:
        table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [w.url])])
        fe = Frontend(
            table, chunking=ChunkingSpec(max_parallel_chunks=1, previous_text=previous_text)
        )
        try:
            r = fe.post({"model": "whisper-1", "chunking_strategy": "auto", "prompt": "Glossary:"},
                        recording.wav.read_bytes(), timeout=120)  # fmt: skip
        finally:
            fe.running.stop()
    assert r.status_code == 200, r.text
    got = prompts(worker.seen)
    assert len(got) >= 3 and got[0] == "Glossary:", got
    answer = r.json()["text"].split()  # the stand-in answers every chunk with the same text
    n = len(got)
    one = " ".join(answer[: len(answer) // n])
    if previous_text:
        assert all(
            p is not None and p.startswith("Glossary: ") and p.endswith(one) for p in got[1:]
        ), got
    else:
        assert got == ["Glossary:"] * n, got


def test_a_long_files_audio_counts_once_as_its_chunks_wait_and_run(recording: Recording) -> None:
    """For autoscaling, the whole file counts until it is cut, then each chunk: queued until
    its turn, then in flight as a request of its own; never the file and its chunks twice."""
    worker = Behaviour(delay=0.7)
    with serve(vllm_app([PRIMARY, "whisper-1"], worker)) as w:
        table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[pool("batch", [w.url])])
        fe = Frontend(table, chunking=ChunkingSpec(max_parallel_chunks=1))
        seen: list[tuple[float, float]] = []  # (queued, in flight) as the request runs
        try:
            with ThreadPoolExecutor(1) as ex:
                answer = ex.submit(fe.post, {"model": "whisper-1", "chunking_strategy": "auto"},
                                   recording.wav.read_bytes(), timeout=120)  # fmt: skip
                while not answer.done():
                    audio = fe.gateway.load.local().pools["batch"].audio
                    assert audio.total <= recording.seconds + 1, audio  # never twice
                    seen.append((audio.queued, audio.in_flight))
                    time.sleep(0.05)
                assert answer.result().status_code == 200
            assert fe.gateway.load.local().pools["batch"].audio.total == 0
        finally:
            fe.running.stop()
    # While the first chunk ran, the others waited: together, the whole file.
    first = next((q, f) for q, f in seen if f > 0)
    assert first[0] > 0 and first[0] + first[1] == pytest.approx(recording.seconds, abs=0.5)
    assert len(worker.seen) >= 3
