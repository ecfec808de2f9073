"""`response_format=diarized_json` through the gateway with the official OpenAI client: a
real faster-whisper worker (Whisper tiny.en) that runs the speaker stage too (CAM++ ONNX,
Silero VAD), on a real two-voice espeak-ng conversation. The answer parses as the SDK's
`TranscriptionDiarized`; each segment's speaker is the one who said it; known speakers get
their names; a stream sends `transcript.text.segment` events, then `transcript.text.done`;
a deployment without the speaker stage answers a 400 naming the capability."""

from __future__ import annotations

import base64
import wave
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.audio import TranscriptionDiarized

from testkit import conversations, speaker_model
from testkit.conversations import Conversation
from testkit.frontend import assert_budget_released, in_process
from testkit.standins import Behaviour, Running, start, vllm_app
from transcription_api.capabilities import Engine, Mode
from transcription_api.frontend import FrontendLimits
from transcription_api.routes import PoolRoute, RouteTable
from transcription_frontend.app import Gateway, create_app
from transcription_frontend.routing import Router
from transcription_worker.batcher import Lane
from transcription_worker.main import default_model
from transcription_worker.server import WorkerConfig
from transcription_worker.server import create_app as worker_app
from transcription_worker.speakers.embedder import Embedder
from transcription_worker.speakers.pipeline import Diarizer
from transcription_worker.speakers.server import SpeakerService
from transcription_worker.transcriber import Transcriber

NAMES = ["whisper-tiny.en", "whisper-1"]


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Conversation:
    spec = conversations.specs("two", 1)[0]
    return conversations.conversation(spec, tmp_path_factory.mktemp("conversations"))


def routes(worker: Running, speakers: bool, *first: PoolRoute) -> RouteTable:
    """The worker's deployment: its faster-whisper pool, after the pools `first`."""
    return RouteTable(model=NAMES[0], aliases=NAMES[1:], pools=[
        *first,
        PoolRoute(name="cpu", engine=Engine.FASTER_WHISPER, mode=Mode.SEQUENTIAL, service="c",
                  endpoints=[worker.url], speakers=speakers),
    ])  # fmt: skip


def gateway(worker: Running, speakers: bool) -> Running:
    return start(
        create_app(Gateway(router=Router(routes(worker, speakers)), settings=in_process()))
    )


@pytest.fixture(scope="module")
def worker() -> Iterator[Running]:
    lane = Lane(Transcriber(default_model(), threads=2), max_queue=8)
    service = SpeakerService(Diarizer(Embedder(speaker_model.onnx_model())), 1 << 28)
    running = start(
        worker_app(WorkerConfig(served_names=NAMES, model_path="tiny.en"), lane, service)
    )
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(worker: Running) -> Iterator[openai.OpenAI]:
    fe = gateway(worker, speakers=True)
    yield openai.OpenAI(base_url=f"{fe.url}/v1", api_key="none", max_retries=0)
    fe.stop()


def test_who_said_what_comes_back_in_openais_diarized_shape(
    client: openai.OpenAI, two: Conversation
) -> None:
    with two.wav.open("rb") as f:
        answer = client.audio.transcriptions.create(
            model="whisper-1", file=f, response_format="diarized_json"
        )
    assert isinstance(answer, TranscriptionDiarized), type(answer)
    assert answer.task == "transcribe" and abs(answer.duration - two.duration) < 0.2
    assert {s.speaker for s in answer.segments} == {"A", "B"}, answer.segments
    assert answer.segments[0].speaker == "A"  # the first to speak is A
    first = two.turns[0].speaker
    other = next(t.speaker for t in two.turns if t.speaker != first)
    assert conversations.right_share(two, answer.segments, {"A": first, "B": other}) >= 0.9, (
        answer.segments
    )
    assert answer.usage is not None and answer.usage.type == "duration"
    # Segments are cut where the speaker changes: there are at least as many as turns.
    assert len(answer.segments) >= len(two.turns) - 1
    assert all(s.text and s.end >= s.start for s in answer.segments)


def data_url(path: Path) -> str:
    return "data:audio/wav;base64," + base64.b64encode(path.read_bytes()).decode()


def test_known_speakers_are_named_and_a_stream_sends_labelled_segments(
    client: openai.OpenAI, two: Conversation
) -> None:
    names = {"Ann": "S1", "Bob": "S2"}
    known = {"known_speaker_names": list(names),
             "known_speaker_references": [data_url(two.references[s]) for s in names.values()]}  # fmt: skip
    with two.wav.open("rb") as f:
        answer = client.audio.transcriptions.create(
            model="whisper-1", file=f, response_format="diarized_json", **known
        )
    assert isinstance(answer, TranscriptionDiarized)
    assert {s.speaker for s in answer.segments} == {"Ann", "Bob"}
    assert conversations.right_share(two, answer.segments, names) >= 0.9, answer.segments
    with two.wav.open("rb") as f:
        stream = client.audio.transcriptions.create(
            model="whisper-1", file=f, response_format="diarized_json", stream=True, **known
        )
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds == ["transcript.text.segment"] * (len(kinds) - 1) + ["transcript.text.done"]
    streamed = [(e.speaker, e.text) for e in events[:-1]]  # type: ignore[union-attr]
    assert streamed == [(s.speaker, s.text) for s in answer.segments]


def test_a_bad_reference_is_a_400_naming_it_and_serving_goes_on(
    client: openai.OpenAI, two: Conversation
) -> None:
    short = two.references["S1"].read_bytes()[: 44 + 16000]  # half a second
    with two.wav.open("rb") as f, pytest.raises(openai.BadRequestError) as e:
        client.audio.transcriptions.create(
            model="whisper-1", file=f, response_format="diarized_json",
            known_speaker_names=["Ann"],
            known_speaker_references=["data:audio/wav;base64," + base64.b64encode(short).decode()],
        )  # fmt: skip
    body = e.value.body
    assert isinstance(body, dict) and body["param"] == "known_speaker_references[]", body
    assert "a reference must be 2-10 s" in body["message"], body
    with two.wav.open("rb") as f:
        ok = client.audio.transcriptions.create(model="whisper-1", file=f)
    assert ok.text


def test_a_deployment_without_the_speaker_stage_names_the_capability(
    worker: Running, two: Conversation
) -> None:
    fe = gateway(worker, speakers=False)
    try:
        plain = openai.OpenAI(base_url=f"{fe.url}/v1", api_key="none", max_retries=0)
        with two.wav.open("rb") as f, pytest.raises(openai.BadRequestError) as e:
            plain.audio.transcriptions.create(
                model="whisper-1", file=f, response_format="diarized_json"
            )
        body = e.value.body
        assert isinstance(body, dict) and body["code"] == "unsupported_capability", body
        assert "missing capability diarization" in body["message"], body
    finally:
        fe.stop()


def test_a_vllm_pool_keeps_the_transcript_and_the_speaker_pool_finds_who_spoke(
    worker: Running, two: Conversation
) -> None:
    """A continuous vLLM pool (the stand-in, with segments) beside a faster-whisper pool that
    runs the speaker stage: the transcript is vLLM's, asked in segments (vLLM has no word
    times), and each of its segments gets the speaker the real stage heard there."""
    vllm = Behaviour(segments=True)
    v = start(vllm_app(NAMES, vllm))
    batch = PoolRoute(name="batch", engine=Engine.VLLM, mode=Mode.CONTINUOUS, service="v",
                      endpoints=[v.url])  # fmt: skip
    fe = start(create_app(Gateway(router=Router(routes(worker, True, batch)),
                                  settings=in_process())))  # fmt: skip
    try:
        c = openai.OpenAI(base_url=f"{fe.url}/v1", api_key="none", max_retries=0)
        with two.wav.open("rb") as f:
            answer = c.audio.transcriptions.create(
                model="whisper-1", file=f, response_format="diarized_json"
            )
    finally:
        fe.stop()
        v.stop()
    assert vllm.seen, "the vLLM pool got no transcript to do"
    for seen in vllm.seen:
        assert dict(seen.fields)["response_format"] == "verbose_json", seen.fields
        asked = [v for k, v in seen.fields if k.startswith("timestamp_granularities")]
        assert asked == ["segment"], seen.fields
    assert isinstance(answer, TranscriptionDiarized)
    invented = {"The quick roundfoc stump over the lazy dog.",
                "Cuban eat separators reconcile denial to state into running workloads."}  # fmt: skip
    assert {s.text for s in answer.segments} <= invented, answer.segments
    # The stand-in's first segment (0-3.2 s) is the first voice's turn, its second (3.2-6.8 s)
    # mostly the second's.
    assert [s.speaker for s in answer.segments[:2]] == ["A", "B"], answer.segments


def test_known_speaker_references_count_in_the_gateways_memory_budget(
    worker: Running, two: Conversation, tmp_path: Path
) -> None:
    """References are held in memory until the answer: three of 9.5 s (1.2 MB as data URLs)
    pass a 1 MiB bufferedBodyBytes, a 503 naming them; nothing stays counted, and one
    reference then goes through."""
    with wave.open(str(two.references["S1"])) as w:
        params, frames = w.getparams(), w.readframes(w.getnframes())
    need = int(9.5 * params.framerate) * params.sampwidth * params.nchannels
    clip = tmp_path / "long-reference.wav"
    with wave.open(str(clip), "wb") as w:
        w.setparams(params)
        w.writeframes((frames * (need // len(frames) + 1))[:need])
    limits = FrontendLimits(buffered_body_bytes=1024**2)
    gw = Gateway(router=Router(routes(worker, True)), settings=in_process(limits=limits))
    fe = start(create_app(gw))
    try:
        c = openai.OpenAI(base_url=f"{fe.url}/v1", api_key="none", max_retries=0)
        with two.wav.open("rb") as f, pytest.raises(openai.InternalServerError) as e:
            c.audio.transcriptions.create(
                model="whisper-1", file=f, response_format="diarized_json",
                known_speaker_names=["Ann", "Bob", "Cy"],
                known_speaker_references=[data_url(clip)] * 3,
            )  # fmt: skip
        body = e.value.body
        assert e.value.status_code == 503, body
        assert isinstance(body, dict) and body["code"] == "memory_budget_exceeded", body
        assert "known speaker references" in body["message"], body
        assert_budget_released(gw)
        with two.wav.open("rb") as f:
            answer = c.audio.transcriptions.create(
                model="whisper-1", file=f, response_format="diarized_json",
                known_speaker_names=["Ann"], known_speaker_references=[data_url(clip)],
            )  # fmt: skip
        assert isinstance(answer, TranscriptionDiarized)
        assert "Ann" in {s.speaker for s in answer.segments}, answer.segments
        assert_budget_released(gw)
    finally:
        fe.stop()
