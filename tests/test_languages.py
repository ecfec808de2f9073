"""`languages[]` (issue 22 item 5): one language acts as `language`; several restrict
language detection to them, on pools that can (faster-whisper); the answer names the
language in `languages`; a code the model cannot produce is a 400."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest

from testkit.frontend import PRIMARY, WAV, Frontend, assert_still_serving, error, pool
from testkit.standins import Behaviour, Running
from transcription_api.capabilities import Capability, Engine, request_needs
from transcription_api.errors import APIError
from transcription_api.params import parse_request
from transcription_api.routes import RouteTable
from transcription_worker.transcriber import likeliest

# --------------------------------------------------------------------------- parsing


def test_one_language_is_the_audios_language() -> None:
    r = parse_request([("languages[]", "DE")])
    assert (r.language, r.languages) == ("de", ["de"])
    r = parse_request([("language", "de"), ("languages[]", "de"), ("languages[]", "de")])
    assert (r.language, r.languages) == ("de", ["de"])  # the same code twice is one


def test_several_languages_are_the_detection_set_in_order() -> None:
    r = parse_request([("languages[]", "fr"), ("languages", "de"), ("languages[]", "fr")])
    assert (r.language, r.languages) == (None, ["fr", "de"])


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ([("languages[]", "german")], "languages[]", "ISO-639-1"),
        ([("languages[]", "")], "languages[]", "ISO-639-1"),
        ([("language", "en"), ("languages[]", "de")], "language", "disagree"),
        ([("language", "en"), ("languages[]", "de"), ("languages[]", "fr")], "language", "either"),
    ],
)
def test_bad_languages_are_400s_naming_the_field(
    fields: list[tuple[str, str]], param: str, says: str
) -> None:
    with pytest.raises(APIError) as e:
        parse_request(fields)
    assert e.value.status == 400 and e.value.param == param and says in e.value.message


def test_several_languages_need_restricted_detection() -> None:
    T = Capability.TRANSCRIPTIONS
    assert request_needs(T, languages=1) == {T}
    assert request_needs(T, languages=2) == {T, Capability.RESTRICTED_LANGUAGE_DETECTION}


def test_the_likeliest_allowed_language_wins() -> None:
    detected = [("<|en|>", 0.7), ("<|de|>", 0.2), ("<|fr|>", 0.1)]
    assert likeliest(detected, ()) == "en"
    assert likeliest(detected, ("fr", "de")) == "de"
    assert likeliest(detected, ("sw",)) == "sw"  # not among the detected: the one allowed


# --------------------------------------------------------------------------- the gateway


def test_one_language_reaches_vllm_as_language_and_the_answer_names_it(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    c = frontend.client.audio.transcriptions
    out = c.create(model="whisper-1", file=("a.wav", WAV), extra_body={"languages": ["de"]})
    assert out.languages is not None and [lang.code for lang in out.languages] == ["de"]
    fields = worker[1].seen[-1].fields
    assert ("language", "de") in fields and not any(k.startswith("languages") for k, _ in fields)
    events = list(c.create(model="whisper-1", file=("a.wav", WAV), stream=True,
                           extra_body={"languages": ["de"]}))  # fmt: skip
    done = events[-1]
    assert done.type == "transcript.text.done" and done.languages is not None
    assert [lang.code for lang in done.languages] == ["de"]
    # Without languages[], answers are as they were.
    assert c.create(model="whisper-1", file=("a.wav", WAV)).languages is None


def test_several_languages_on_vllm_alone_are_a_400_naming_the_capability(
    frontend: Frontend, worker: tuple[Running, Behaviour]
) -> None:
    seen = len(worker[1].seen)
    r = frontend.post([("model", "whisper-1"), ("languages[]", "de"), ("languages[]", "fr")])
    assert r.status_code == 400
    assert "restricted_language_detection" in error(r)["message"]
    assert len(worker[1].seen) == seen
    assert_still_serving(frontend)


def test_several_languages_go_to_the_pool_that_restricts_detection(
    with_faster_whisper: tuple[Frontend, Behaviour],
) -> None:
    fe, behaviour = with_faster_whisper
    before = fe.metric("transcription_frontend_requests_total", pool="fw")
    r = fe.post([("model", "whisper-1"), ("languages[]", "de"), ("languages[]", "fr")])
    assert r.status_code == 200, r.text
    assert fe.metric("transcription_frontend_requests_total", pool="fw") == before + 1
    # The engine gets the set as sent.
    assert [v for k, v in behaviour.seen[-1].fields if k == "languages[]"] == ["de", "fr"]


@pytest.fixture
def english_only(worker: tuple[Running, Behaviour]) -> Iterator[Frontend]:
    """tiny.en on faster-whisper (which restricts detection: several languages reach it)."""
    p = pool("en", [worker[0].url], engine=Engine.FASTER_WHISPER)
    p = p.model_copy(update={"english_only": True})
    fe = Frontend(RouteTable(model=PRIMARY, aliases=["whisper-1"], pools=[p]))
    yield fe
    fe.running.stop()


@pytest.mark.parametrize("languages", [["de"], ["en", "de"]])
def test_a_language_an_english_only_model_cannot_produce_is_a_400(
    english_only: Frontend, languages: list[str]
) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        english_only.client.audio.transcriptions.create(
            model="whisper-1", file=("a.wav", WAV), extra_body={"languages": languages}
        )
    body = e.value.body
    assert isinstance(body, dict) and body["param"] == "languages[]", body
    assert "English-only" in body["message"] and "`de`" in body["message"], body
    out = english_only.client.audio.transcriptions.create(
        model="whisper-1", file=("a.wav", WAV), extra_body={"languages": ["en"]}
    )
    assert out.languages is not None and out.languages[0].code == "en"
