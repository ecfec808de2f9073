"""Transcriptions through the gateway to `transformers serve` pools, over real HTTP, against
the stand-in replaying its recorded answers: what the gateway does so that its limits
(no aliases, a strict field list, soundfile's containers, 30 s of audio, a bare-text stream)
never reach the client as a 422, a bare 500 or a silently cut transcript."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from testkit.audio import convert, speak, tone_wav
from testkit.frontend import PRIMARY, SERVED, Frontend, error, pool
from testkit.standins import (
    TRANSFORMERS,
    TRANSFORMERS_WHISPER,
    VLLM,
    Behaviour,
    Running,
    recording,
    serve,
    vllm_app,
)
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import ChunkingSpec
from transcription_api.routes import PoolRoute, RouteTable
from transcription_frontend.adapters import adapter

WORKER_MODEL = TRANSFORMERS_WHISPER

pytestmark = pytest.mark.standin("transformers")
TEXT = json.loads(recording(TRANSFORMERS, "json")[2])["text"]
VLLM_TEXT = json.loads(recording(VLLM, "json")[2])["text"]
WAV = tone_wav(0.5)


def transformers_pool(url: str) -> PoolRoute:
    p = pool("batch", [url], engine=Engine.TRANSFORMERS, mode=Mode.CONTINUOUS)
    return p.model_copy(update={"worker_model": WORKER_MODEL})


@pytest.fixture
def vllm() -> Iterator[tuple[Running, Behaviour]]:
    b = Behaviour()
    with serve(vllm_app(SERVED, b)) as running:
        yield running, b


@pytest.fixture
def alone(worker: tuple[Running, Behaviour]) -> Iterator[Frontend]:
    """A deployment whose only pool is transformers."""
    fe = Frontend(RouteTable(model=PRIMARY, aliases=["whisper-1"],
                             pools=[transformers_pool(worker[0].url)]))  # fmt: skip
    yield fe
    fe.running.stop()


@pytest.fixture
def with_fallback(
    worker: tuple[Running, Behaviour], vllm: tuple[Running, Behaviour]
) -> Iterator[Frontend]:
    """transformers first (continuous), and a sequential vLLM pool that takes the rest."""
    table = RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[
        transformers_pool(worker[0].url),
        pool("seq", [vllm[0].url], engine=Engine.VLLM, mode=Mode.SEQUENTIAL)])  # fmt: skip
    fe = Frontend(table)
    yield fe
    fe.running.stop()


def transcribe(fe: Frontend, audio: bytes = WAV) -> str:
    return fe.client.audio.transcriptions.create(model="whisper-1", file=("a", audio)).text


# --------------------------------------------------------------------------- model and fields


def test_the_worker_gets_its_own_model_name_and_only_fields_it_accepts(
    alone: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    r = alone.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), language="en", prompt="Hi.", temperature=0.2,
    )  # fmt: skip
    assert r.text == TEXT
    fields = worker[1].seen[-1].fields
    assert sorted(fields) == sorted([
        ("model", WORKER_MODEL), ("language", "en"), ("prompt", "Hi."), ("temperature", "0.2")])  # fmt: skip
    # An array field goes without the SDK's `[]` (`include[]` is a 422 for transformers).
    assert adapter(alone.router.catalog.pools[0]).field_name("include[]") == "include"


def test_a_field_transformers_refuses_is_a_400_naming_it(
    alone: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    """Not its `422 {"detail": "Unexpected fields ..."}`: the gateway says it first."""
    r = alone.post({"model": "whisper-1", "seed": "3", "top_p": "0.5"})
    assert r.status_code == 400
    e = error(r)
    assert e["message"].startswith(
        "the transformers engine of pool batch does not accept the field(s) `seed`, `top_p`; "
        "remove them (it accepts: chunking_strategy, include, keywords,"
    )
    assert (e["param"], e["code"]) == ("seed", "unsupported_field")
    assert worker[1].seen == []
    assert transcribe(alone) == TEXT


def test_a_field_transformers_refuses_goes_to_a_pool_that_takes_it(
    with_fallback: Frontend, worker: tuple[Running, Behaviour], vllm: tuple[Running, Behaviour]
) -> None:
    r = with_fallback.post({"model": "whisper-1", "seed": "3"})
    assert r.status_code == 200 and r.json()["text"] == VLLM_TEXT
    assert ("seed", "3") in vllm[1].seen[-1].fields and worker[1].seen == []
    assert transcribe(with_fallback) == TEXT  # the rest still goes to transformers


# --------------------------------------------------------------------------- audio


def test_empty_files_never_reach_it(alone: Frontend, worker: tuple[Running, Behaviour]) -> None:
    r = alone.post({"model": "whisper-1"}, file=b"")
    assert r.status_code == 400 and error(r)["code"] == "empty_file"
    assert worker[1].seen == []


@pytest.mark.parametrize(
    ("fmt", "described"), [("m4a", "MP4/M4A (AAC)"), ("webm", "WebM/Matroska")]
)
def test_containers_it_cannot_decode_are_a_400_naming_them(
    alone: Frontend, worker: tuple[Running, Behaviour], tmp_path: Path, fmt: str, described: str
) -> None:
    """transformers (soundfile) answers them with a bare 500 (`m4a`)."""
    data = convert(speak("hello", tmp_path), fmt).read_bytes()
    with pytest.raises(openai.BadRequestError) as e:
        transcribe(alone, data)
    assert e.value.body["message"] == (  # type: ignore[index]
        f"the audio is {described}, which the transformers engine of pool batch cannot "
        "decode (it reads aiff, au, caf, flac, mp3, ogg, wav); convert it, e.g. "
        "`ffmpeg -i in.m4a out.flac`"
    )
    assert e.value.body["code"] == "unsupported_audio_format"  # type: ignore[index]
    assert worker[1].seen == []
    assert transcribe(alone) == TEXT


@pytest.mark.parametrize("fmt", ["wav", "flac", "mp3", "ogg"])
def test_containers_it_decodes_go_to_it(
    alone: Frontend, worker: tuple[Running, Behaviour], tmp_path: Path, fmt: str
) -> None:
    assert transcribe(alone, convert(speak("hello", tmp_path), fmt).read_bytes()) == TEXT
    assert len(worker[1].seen) == 1


def test_containers_it_cannot_decode_go_to_a_pool_that_can(
    with_fallback: Frontend, worker: tuple[Running, Behaviour], vllm: tuple[Running, Behaviour],
    tmp_path: Path,
) -> None:  # fmt: skip
    webm = convert(speak("hello", tmp_path), "webm").read_bytes()
    assert transcribe(with_fallback, webm) == VLLM_TEXT
    assert worker[1].seen == [] and len(vllm[1].seen) == 1


def test_audio_over_30_seconds_is_a_400_naming_the_limit_without_chunking(
    worker: tuple[Running, Behaviour],
) -> None:
    """transformers would transcribe the first 30 s and drop the rest, silently
    (`long_audio`): with chunking off, such audio is refused by name."""
    fe = Frontend(RouteTable(model=PRIMARY, aliases=["whisper-1"],
                             pools=[transformers_pool(worker[0].url)]),
                  chunking=ChunkingSpec(enabled=False))  # fmt: skip
    try:
        r = fe.post({"model": "whisper-1"}, file=tone_wav(45))
        assert r.status_code == 400
        e = error(r)
        assert e["message"] == (
            "the audio is 45.0 s long and the transformers engine of pool batch transcribes at "
            "most 30 s (it would silently drop the rest): split the audio into pieces of 30 s or "
            "less"
        )
        assert (e["param"], e["code"]) == ("file", "audio_too_long")
        assert worker[1].seen == []
        assert transcribe(fe, tone_wav(30)) == TEXT  # 30 s exactly is whole
    finally:
        fe.running.stop()


def test_audio_over_30_seconds_is_chunked_for_transformers(
    alone: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    """With chunking (the default), audio longer than transformers takes whole is cut into
    pieces it takes: nothing is dropped."""
    r = alone.post({"model": "whisper-1"}, file=tone_wav(45))
    assert r.status_code == 200, r.text
    assert len(worker[1].seen) == 2 and all(s.file_name == "chunk.flac" for s in worker[1].seen)
    assert r.json()["text"] == f"{TEXT.strip()} {TEXT.strip()}"


def test_audio_over_30_seconds_goes_to_a_pool_that_takes_it(
    with_fallback: Frontend, worker: tuple[Running, Behaviour], vllm: tuple[Running, Behaviour],
    tmp_path: Path,
) -> None:  # fmt: skip
    long = tmp_path / "long.wav"
    long.write_bytes(tone_wav(31))
    for fmt in ("wav", "flac", "mp3", "ogg"):
        assert transcribe(with_fallback, convert(long, fmt).read_bytes()) == VLLM_TEXT, fmt
    assert worker[1].seen == [] and len(vllm[1].seen) == 4


# --------------------------------------------------------------------------- streams


def test_the_raw_text_stream_loses_one_space_per_event_no_more(alone: Frontend) -> None:
    """`data:  The` is the delta " The": the space after `data:` is the field's, the next
    one the word's."""
    events = list(alone.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), stream=True))  # fmt: skip
    deltas = [e.delta for e in events if e.type == "transcript.text.delta"]
    assert deltas[:5] == [" The", " quick", " round", "f", "oc"]
    assert events[-1].text == TEXT  # type: ignore[union-attr]


def test_an_error_event_mid_stream_is_an_error_not_text(
    alone: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    """transformers reports a failure as `data: {"error": "<message>"}` in its bare-text
    stream: the client gets OpenAI's error event, not that JSON as transcript text."""
    worker[1].fail_stream_after = 2
    raw = alone.post({"model": "whisper-1", "stream": "true"})
    events = [json.loads(e.removeprefix("data: ")) for e in raw.text.split("\n\n") if e]
    assert [e["type"] for e in events] == ["transcript.text.delta"] * 2 + ["error"]
    assert events[-1]["error"]["message"].startswith(
        "the transformers worker of pool batch failed to process the request (mid-stream: "
        "CUDA out of memory. Tried to allocate 2.00 GiB)"
    )
    stream = alone.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), stream=True)  # fmt: skip
    with pytest.raises(openai.APIError, match="CUDA out of memory"):
        list(stream)
    worker[1].fail_stream_after = None
    assert transcribe(alone) == TEXT
