"""English-only Whisper models (`*.en`) through the frontend: another language is a clear
400 before any worker is busy; vLLM, which cannot detect the language of such a model (a
500 `AssertionError`), is told English when the client named none."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from testkit.frontend import PRIMARY, Frontend, pool
from testkit.resources import make_td
from testkit.standins import Behaviour, Running
from transcription_api.capabilities import Engine, Mode
from transcription_api.routes import RouteTable, is_english_only
from transcription_operator.children import build
from transcription_operator.config import OperatorConfig


@pytest.fixture
def english(worker: tuple[Running, Behaviour]) -> Iterator[Frontend]:
    batch = pool("batch", [worker[0].url]).model_copy(update={"english_only": True})
    fe = Frontend(RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[batch]))
    yield fe
    fe.running.stop()


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (("openai/whisper-tiny.en", None), True),
        (("whisper-1", "/models/whisper-small.en/"), True),
        (("distil-whisper/distil-small.EN", None), True),
        (("openai/whisper-large-v3", None), False),
        (("openai/whisper-small", "/models/english"), False),
    ],
)
def test_english_only_models_are_known_by_whispers_naming(
    names: tuple[str, str | None], expected: bool
) -> None:
    assert is_english_only(*names) is expected


def test_the_operator_marks_every_pool_of_an_english_only_model() -> None:
    td = make_td(
        {"model": {"name": "openai/whisper-tiny.en"}, "traffic": {"features": ["word_timestamps"]}}
    )
    [cm] = [
        m
        for m in build(td, OperatorConfig())
        if m["kind"] == "ConfigMap" and "routes.json" in m.get("data", {})
    ]
    table = RouteTable.model_validate_json(cm["data"]["routes.json"])
    assert len(table.pools) == 2 and all(p.english_only for p in table.pools)
    td = make_td({"model": {"name": "openai/whisper-small"}})
    [cm] = [
        m
        for m in build(td, OperatorConfig())
        if m["kind"] == "ConfigMap" and "routes.json" in m.get("data", {})
    ]
    assert not any(
        p.english_only for p in RouteTable.model_validate_json(cm["data"]["routes.json"]).pools
    )


def test_vllm_is_told_english_when_the_client_names_no_language(
    english: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    assert english.post({"model": "whisper-1"}).status_code == 200
    assert dict(worker[1].seen[-1].fields)["language"] == "en"
    assert english.post({"model": "whisper-1", "language": "en"}).status_code == 200
    assert [v for k, v in worker[1].seen[-1].fields if k == "language"] == ["en"]


@pytest.mark.parametrize("language", ["de", "fr", "zz"])
def test_another_language_is_a_clear_400_and_serving_goes_on(
    english: Frontend, worker: tuple[Running, Behaviour], language: str
) -> None:
    seen = len(worker[1].seen)
    r = english.post({"model": "whisper-1", "language": language})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "language" and "English-only" in err["message"], err
    assert f"not `{language}`" in err["message"]
    assert len(worker[1].seen) == seen  # no worker was asked
    assert english.post({"model": "whisper-1"}).status_code == 200


def test_a_multilingual_model_is_left_to_detect_the_language(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    assert frontend.post({"model": "whisper-1"}).status_code == 200
    assert "language" not in dict(worker[1].seen[-1].fields)
    assert frontend.post({"model": "whisper-1", "language": "de"}).status_code == 200


def test_engines_that_know_english_only_models_are_not_told(
    worker: tuple[Running, Behaviour],
) -> None:
    """faster-whisper reads the model's own tokenizer (and transformers refuses a language
    for an English-only model): only vLLM is told."""
    fw = pool("fw", [worker[0].url], Engine.FASTER_WHISPER, Mode.SEQUENTIAL)
    fe = Frontend(RouteTable(model=PRIMARY, pools=[fw.model_copy(update={"english_only": True})]))
    try:
        assert fe.post({"model": PRIMARY}).status_code == 200
        assert "language" not in dict(worker[1].seen[-1].fields)
    finally:
        fe.running.stop()
